/*
 * The program of ddheap-prof's timeline tests (test_timeline.py): a heap
 * with a known history, which prints its own truth.
 *
 *   prof-timeline TRUTH_FILE PERIOD_MS keep|free|none
 *
 * Phases start just after the multiples of PERIOD_MS on CLOCK_MONOTONIC
 * (the instants of ddheap-prof's --every snapshots, and the clock of its
 * events) and normally finish well before the next one, so that the
 * snapshots see the states after whole phases. Phase by phase:
 *
 *   0      site_cache fills 256 blocks of 8 KiB, kept to the end;
 *   1..4   site_peak adds 512 blocks of 8 KiB each phase (the peak: 16 MiB
 *          from it after phase 4), after site_leak's burst;
 *   5, 6   site_peak frees half of its blocks each (free before the leak's
 *          burst, so the peak stays the end of phase 4);
 *   6      site_short: 200 batches of 16 blocks of 4 KiB, each freed
 *          2^17.5 ns after it was born;
 *   7, 8   site_medium: 15 batches of 16 blocks of 4 KiB, each freed
 *          2^23.5 ns after it was born;
 *   every phase: site_leak allocates 64 blocks of 8 KiB, frees 48 of them
 *          after 2^20.5 ns and keeps 16 (a slow leak).
 *
 * At the end, "keep" exits with the cache and the leak live; "free" frees
 * them first (a program that frees everything); "none" allocates nothing.
 *
 * The truth: "phase K START_NS END_NS", "state K SITE LIVE ALLOCATED"
 * (block counts after phase K), "size SITE BYTES", "peak K" (the phase
 * after which the heap was highest), "life SITE BUCKET COUNT" (blocks
 * freed with a lifetime in [2^BUCKET, 2^(BUCKET+1)) ns, as measured here),
 * "at NS SITE LIVE ALLOCATED" (block counts at each multiple NS of the
 * period during the run, from the calls that returned before it) and
 * "across NS SITE +1|-1" (a call running across NS: on a busy machine
 * a phase can outlast its period; then the state is known but for it).
 */
#define _POSIX_C_SOURCE 200809L
#include <dd_example_libc.h>
#include <ddheap.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { CACHE, PEAK, LEAK, SHORT, MEDIUM, NSITES };
static const char *const site_names[NSITES] = {"site_cache", "site_peak", "site_leak",
                                               "site_short", "site_medium"};
static const size_t site_size[NSITES] = {8192, 8192, 8192, 4096, 4096};
static unsigned long live[NSITES], allocated[NSITES];
static unsigned long life[NSITES][64];

/* Every alloc and free, with the clock read just before and just after
 * it: ddheap-prof stamps its event in between, so the state at any
 * instant is known but for the one call running across it. */
struct op {
    uint64_t before, after;
    int site, delta;
};
static struct op ops[32768];
static unsigned nops;

static uint64_t now_ns(void);

static void record(int site, int delta, uint64_t before)
{
    if (nops == sizeof ops / sizeof ops[0])
        exit(4);
    ops[nops++] = (struct op){before, now_ns(), site, delta};
}

struct block {
    void *p;
    uint64_t born;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static unsigned bucket(uint64_t ns)
{
    return ns < 2 ? 0 : 63u - (unsigned)__builtin_clzll(ns);
}

/* Each site allocates through its own function, so its stack names it. */
#define SITE_ALLOC(name, site)                                                                     \
    __attribute__((noinline)) static void name(struct block *b)                                    \
    {                                                                                              \
        uint64_t before = now_ns();                                                                \
        b->p = dd_example_malloc(site_size[site]);                                                 \
        record(site, 1, before);                                                                   \
        if (b->p == NULL)                                                                          \
            exit(3);                                                                               \
        memset(b->p, 1, 64);                                                                       \
        b->born = now_ns();                                                                        \
        live[site]++;                                                                              \
        allocated[site]++;                                                                         \
        __asm__ volatile("" ::: "memory");                                                         \
    }
SITE_ALLOC(site_cache, CACHE)
SITE_ALLOC(site_peak, PEAK)
SITE_ALLOC(site_leak, LEAK)
SITE_ALLOC(site_short, SHORT)
SITE_ALLOC(site_medium, MEDIUM)

static void release(int site, struct block *b)
{
    uint64_t before = now_ns();
    life[site][bucket(before - b->born)]++;
    dd_example_free(b->p);
    record(site, -1, before);
    live[site]--;
}

static void spin_until(uint64_t t)
{
    while (now_ns() < t) {
    }
}

/* Batches of 16 blocks, each freed `lifetime_ns` after it was born. */
static void batches(int site, void (*alloc)(struct block *), unsigned n, uint64_t lifetime_ns)
{
    struct block b[16];
    for (unsigned i = 0; i < n; i++) {
        for (unsigned k = 0; k < 16; k++)
            alloc(&b[k]);
        for (unsigned k = 0; k < 16; k++) {
            spin_until(b[k].born + lifetime_ns);
            release(site, &b[k]);
        }
    }
}

static struct block cache[256], peak[4 * 512], leaked[64 * 16];
static unsigned nleaked;

static void leak_burst(void)
{
    struct block b[64];
    for (unsigned k = 0; k < 64; k++)
        site_leak(&b[k]);
    for (unsigned k = 0; k < 64; k++) {
        if (k % 4 == 0) {
            leaked[nleaked++] = b[k];
        } else {
            spin_until(b[k].born + 1482910); /* 2^20.5 ns */
            release(LEAK, &b[k]);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    FILE *truth = fopen(argv[1], "w");
    uint64_t period = strtoull(argv[2], NULL, 10) * 1000000u;
    int keep = strcmp(argv[3], "keep") == 0;
    if (truth == NULL || period == 0)
        return 2;
    for (int s = 0; s < NSITES; s++)
        fprintf(truth, "size %s %zu\n", site_names[s], site_size[s]);
    if (strcmp(argv[3], "none") == 0)
        return fclose(truth) == 0 ? 0 : 1;
    /* The first boundary at least 100 ms away: ddheap-prof is attached. */
    uint64_t boundary = (now_ns() + 100000000u) / period * period + period;
    for (int phase = 0; phase <= 9; phase++) {
        while (now_ns() < boundary + 5000000u) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        uint64_t start = now_ns();
        if (phase == 5 || phase == 6)
            for (unsigned i = (unsigned)(phase - 5) * 1024; i < (unsigned)(phase - 4) * 1024; i++)
                release(PEAK, &peak[i]);
        if (phase == 0)
            for (unsigned i = 0; i < 256; i++)
                site_cache(&cache[i]);
        leak_burst();
        if (phase >= 1 && phase <= 4)
            for (unsigned i = 0; i < 512; i++)
                site_peak(&peak[(phase - 1) * 512 + i]);
        if (phase == 6)
            batches(SHORT, site_short, 200, 185364); /* 2^17.5 ns */
        if (phase == 7 || phase == 8)
            batches(MEDIUM, site_medium, 15, 11863283); /* 2^23.5 ns */
        uint64_t end = now_ns();
        fprintf(truth, "phase %d %llu %llu\n", phase, (unsigned long long)start,
                (unsigned long long)end);
        for (int s = 0; s < NSITES; s++)
            fprintf(truth, "state %d %s %lu %lu\n", phase, site_names[s], live[s], allocated[s]);
        /* The next phase after the next instant, even if this one ran
         * late: two phases never share an interval. */
        boundary = (now_ns() / period + 1) * period;
    }
    fprintf(truth, "peak 4\n");
    if (!keep) {
        for (unsigned i = 0; i < 256; i++)
            release(CACHE, &cache[i]);
        for (unsigned i = 0; i < nleaked; i++)
            release(LEAK, &leaked[i]);
        fprintf(truth, "phase 10 %llu %llu\n", (unsigned long long)now_ns(),
                (unsigned long long)now_ns());
        for (int s = 0; s < NSITES; s++)
            fprintf(truth, "state 10 %s %lu %lu\n", site_names[s], live[s], allocated[s]);
    }
    /* The state at each snapshot instant of the run (the multiples of the
     * period): the calls done before it, and any running across it. */
    uint64_t first = ops[0].before / period * period + period;
    fprintf(truth, "end %llu\n", (unsigned long long)ops[nops - 1].after);
    for (uint64_t at = first; nops && at <= ops[nops - 1].after + period; at += period) {
        long at_live[NSITES] = {0}, at_alloc[NSITES] = {0};
        for (unsigned i = 0; i < nops; i++) {
            if (ops[i].after < at) {
                at_live[ops[i].site] += ops[i].delta;
                at_alloc[ops[i].site] += ops[i].delta > 0;
            } else if (ops[i].before < at) {
                fprintf(truth, "across %llu %s %d\n", (unsigned long long)at,
                        site_names[ops[i].site], ops[i].delta);
            }
        }
        for (int s = 0; s < NSITES; s++)
            fprintf(truth, "at %llu %s %ld %ld\n", (unsigned long long)at, site_names[s],
                    at_live[s], at_alloc[s]);
    }
    for (int s = 0; s < NSITES; s++)
        for (unsigned k = 0; k < 64; k++)
            if (life[s][k])
                fprintf(truth, "life %s %u %lu\n", site_names[s], k, life[s][k]);
    fclose(truth);
    return 0;
}

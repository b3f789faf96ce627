/*
 * W3 of bench/peers: a program that knows its own heap profile. Three
 * allocation sites, each a function of its own (`site_small`, `site_large`,
 * `site_leak`, called from `loop_small`, ... so that a stack missing its
 * first caller still names the site), interleaved in one loop so that every
 * site allocates throughout the run:
 *
 *   small  blocks of 16..512 bytes, freed at once: much allocated, none live
 *   large  blocks of 256 KiB, 512 KiB or 1 MiB, all kept: allocated = live
 *   leak   1 KiB blocks, one in 16 never freed: a slow leak
 *
 * Sizes are exact size classes of jemalloc (and of glibc and tcmalloc), so
 * a profiler that reports the usable size instead of the requested one
 * reports the same bytes. At the end it prints the truth, one line per site:
 *
 *   site small alloc_bytes 123 live_bytes 0 allocs 4567 live_allocs 0
 *
 * and, with --hold, stops itself (SIGSTOP) before returning, so that a
 * profiler which reads the process's memory maps when it reports (bcc's
 * memleak) can symbolise its stacks; the driver sends SIGCONT.
 *
 *   peers_sites [--scale N] [--hold]     (N: thousands of loop steps, default 200)
 */
#define _GNU_SOURCE /* raise, SIGSTOP under -std=c11 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct site_truth {
    const char *name;
    unsigned long long alloc_bytes, live_bytes, allocs, live_allocs;
};

enum { SMALL, LARGE, LEAK, NSITES };
static struct site_truth truth[NSITES] = {{"small", 0, 0, 0, 0}, {"large", 0, 0, 0, 0}, {"leak", 0, 0, 0, 0}};

/* The pointer escapes, so the compiler cannot pair malloc with free and
 * drop both. */
static void *escape(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
    return p;
}

static void *counted(int site, size_t size)
{
    void *p = escape(malloc(size));
    if (p == NULL) {
        fprintf(stderr, "peers_sites: malloc(%zu) failed\n", size);
        exit(1);
    }
    truth[site].alloc_bytes += size;
    truth[site].live_bytes += size;
    truth[site].allocs++;
    truth[site].live_allocs++;
    return p;
}

static void uncounted_free(int site, void *p, size_t size)
{
    truth[site].live_bytes -= size;
    truth[site].live_allocs--;
    free(p);
}

/* Knuth's MMIX linear congruential generator, high bits: the same
 * sequence of sizes in every run, under every profiler. */
static uint64_t rng = 1;
static uint64_t next_random(void)
{
    rng = rng * 6364136223846793005u + 1442695040888963407u;
    return rng >> 33;
}

__attribute__((noinline)) static void site_small(void)
{
    static const size_t sizes[] = {16, 32, 48, 64, 96, 128, 192, 256, 384, 512};
    size_t size = sizes[next_random() % (sizeof sizes / sizeof sizes[0])];
    void *p = counted(SMALL, size);
    memset(p, 1, 16);
    uncounted_free(SMALL, p, size);
}

__attribute__((noinline)) static void *site_large(void)
{
    static const size_t sizes[] = {256 << 10, 512 << 10, 1 << 20};
    size_t size = sizes[next_random() % 3];
    void *p = counted(LARGE, size);
    memset(p, 1, 4096); /* touch one page: RSS stays a function of the tool, not of the truth */
    return p;
}

__attribute__((noinline)) static void *site_leak(unsigned long step)
{
    enum { SIZE = 1024 };
    void *p = counted(LEAK, SIZE);
    memset(p, 2, 64);
    if (step % 16 != 0) {
        uncounted_free(LEAK, p, SIZE);
        return NULL;
    }
    return p;
}

/* One caller per site: a profiler whose stack walk misses the frame that
 * called malloc (a probe at a function's first instruction) still sees
 * which site it was. */
__attribute__((noinline)) static void loop_small(void)
{
    for (int i = 0; i < 4; i++)
        site_small();
}

__attribute__((noinline)) static void *loop_large(void) { return site_large(); }
__attribute__((noinline)) static void *loop_leak(unsigned long step) { return site_leak(step); }

int main(int argc, char **argv)
{
    unsigned long scale = 200;
    int hold = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc)
            scale = strtoul(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--hold") == 0)
            hold = 1;
        else {
            fprintf(stderr, "usage: peers_sites [--scale THOUSANDS] [--hold]\n");
            return 2;
        }
    }
    unsigned long steps = scale * 1000;
    /* Large blocks are kept: one per 1024 steps, about 110 MB at the
     * default scale, allocated as the run goes. */
    size_t kept_cap = steps / 1024 + 1, leak_cap = steps / 16 + 1, nkept = 0, nleaked = 0;
    void **kept = calloc(kept_cap, sizeof *kept), **leaked = calloc(leak_cap, sizeof *leaked);
    if (kept == NULL || leaked == NULL)
        return 1;
    for (unsigned long step = 0; step < steps; step++) {
        loop_small();
        if (step % 1024 == 1023)
            kept[nkept++] = loop_large();
        void *p = loop_leak(step);
        if (p != NULL)
            leaked[nleaked++] = p;
    }
    for (int s = 0; s < NSITES; s++)
        printf("site %s alloc_bytes %llu live_bytes %llu allocs %llu live_allocs %llu\n",
               truth[s].name, truth[s].alloc_bytes, truth[s].live_bytes, truth[s].allocs,
               truth[s].live_allocs);
    fflush(stdout);
    if (hold)
        raise(SIGSTOP);
    /* The kept blocks stay live until exit: profilers that write their
     * profile at exit see them live. */
    escape(kept);
    escape(leaked);
    return 0;
}

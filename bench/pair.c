/*
 * Per-operation cost of ddheap next to the bare allocator, in one process.
 *
 * A "config" is (wrapper copy pie|pic, allocator libc|noop, threads 1|2,
 * size, mode). Each config runs `n` alloc+free pairs per thread (or `n/10`
 * realloc chains 16 -> 32 -> ... -> 4096 then free) in fresh threads, so
 * every thread starts with ddheap's zero state exactly as a new thread
 * does. Repetitions are interleaved over all configs (rep 1 of every
 * config, then rep 2, ...) so that machine noise hits bare and ddheap
 * alike; the median and minimum over repetitions are printed.
 *
 * Modes:
 *   bare       the wrapper without ddheap
 *   off        ddheap, no tracer attached
 *   unsampled  tracer simulated (dd_heap_simulate_tracer), interval 2^62
 *              bytes, so the countdown never runs out: the unsampled path
 *              with the tracer gate open, no sampled block live
 *   live       the same with one sampled block live in the process (as is
 *              almost always the case under a real tracer), so every free
 *              takes the header test: page rule, 16-byte read, keyed check
 *   sampled    tracer simulated, interval 1: every allocation sampled,
 *              probes fire into the void
 *   after      as off, in a process where blocks were sampled before (a
 *              tracer came and went): a shared library's free gate is open
 *   spread     (--spread) as unsampled, with 4000 sampled blocks of 256 KiB
 *              live (glibc maps each: about 1 GiB of address space): the
 *              heap of a traced program, for the marking-scheme comparison
 *              (bench/run --marking)
 *
 * Under --callgrind, bare and off of every config run first, before any
 * block is marked in the process, so that off is the never-traced state
 * in both copies; the timed runs interleave all modes (a shared library's
 * gate is then open from the second repetition on: one instruction more
 * on each free, below the timing noise).
 *   traced     (--traced) a real tracer attached by bench/run, interval 1
 *
 * With --callgrind each config is measured once, between
 * CALLGRIND_ZERO_STATS and CALLGRIND_DUMP_STATS_AT(label); bench/run
 * divides the dump's instruction total by the number of operations.
 * Loop, call and barrier overheads are the same for bare and ddheap, so
 * they cancel in the difference bench/run prints.
 *
 * --probes times a direct call of ddheap's real alloc-probe function and of
 * the two bench-only probes (probes.c), traced or not.
 */
#define _GNU_SOURCE /* pthread barriers, usleep: not in strict C11 */
#include "bench.h"

#include <ddheap/testing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

/* ddheap's alloc-probe function (src/probes.c). Hidden, but reachable from
 * this executable because libddheap.a is linked in statically. */
void *ddheap_fire_alloc(uintptr_t ptr, uint64_t size, uint64_t weight);

#define MAX_THREADS 2
#define MAX_LIST 8
#define UNSAMPLED_INTERVAL (UINT64_C(1) << 62)

enum mode {
    MODE_BARE,
    MODE_OFF,
    MODE_UNSAMPLED,
    MODE_LIVE,
    MODE_SAMPLED,
    MODE_AFTER,
    MODE_TRACED,
    MODE_SPREAD
};
static const char *const mode_names[] = {"bare",  "off",    "unsampled", "live",
                                         "sampled", "after", "traced",   "spread"};

#define SPREAD_BLOCKS 4000
#define SPREAD_SIZE (256u * 1024)

#if DDHEAP_MARK_SHADOW
/* src/mark_shadow.c: resident bytes of the shadow tables and summary
 * (hidden, reachable here as ddheap_fire_alloc is). */
size_t ddheap_shadow_metadata_bytes(size_t *mapped);
#endif

/* Whether a mode can run before anything was ever marked in the process:
 * in a shared library the free path's first test is the copy's free gate,
 * which the first marked block opens for good (coldpath.h). */
static bool never_marked_mode(enum mode m)
{
    return m == MODE_BARE || m == MODE_OFF;
}

enum op { OP_PAIR, OP_REALLOC };

struct config {
    const struct dd_bench_api *api;
    const char *alloc_name;
    int threads;
    size_t size;
    enum mode mode;
    enum op op;
    double ns[64]; /* per repetition: ns per operation, mean over threads */
};

struct job {
    const struct dd_bench_api *api;
    const struct dd_bench_family *fam;
    struct config *cfg;
    pthread_barrier_t *barrier;
    long n;
    int index;
    int callgrind;
    const char *label;
    double ns;
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void escape(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

static void run_ops(const struct dd_bench_family *fam, enum op op, size_t size, long n)
{
    if (op == OP_PAIR) {
        for (long i = 0; i < n; i++) {
            void *p = fam->alloc(size);
            escape(p);
            fam->release(p);
        }
        return;
    }
    for (long i = 0; i < n; i++) {
        void *p = fam->alloc(16);
        for (size_t s = 32; s <= 4096; s *= 2) {
            escape(p);
            p = fam->resize(p, s);
        }
        escape(p);
        fam->release(p);
    }
}

static void *worker(void *arg)
{
    struct job *j = arg;
    enum mode mode = j->cfg->mode;
    void *kept = NULL;
    if (mode == MODE_LIVE && j->index == 0) {
        /* One sampled block (glibc, through the same ddheap copy) that
         * stays live across the measurement. */
        j->api->set_interval(1);
        kept = j->api->dd_libc.alloc(64);
    }
    static void *spread[SPREAD_BLOCKS];
    if (mode == MODE_SPREAD && j->index == 0) {
        j->api->set_interval(1);
        for (int i = 0; i < SPREAD_BLOCKS; i++)
            spread[i] = j->api->dd_libc.alloc(SPREAD_SIZE);
#if DDHEAP_MARK_SHADOW
        size_t mapped = 0, resident = ddheap_shadow_metadata_bytes(&mapped);
        printf("SHADOWMEM blocks=%d resident=%zu mapped=%zu\n", SPREAD_BLOCKS, resident, mapped);
#endif
    }
    if (mode == MODE_UNSAMPLED || mode == MODE_LIVE || mode == MODE_SPREAD)
        j->api->set_interval(UNSAMPLED_INTERVAL);
    else if (mode == MODE_SAMPLED || mode == MODE_TRACED)
        j->api->set_interval(1);
    /* Warm-up: first-use initialisation (ddheap's thread state, malloc's
     * tcache) stays out of the measurement. */
    run_ops(j->fam, j->cfg->op, j->cfg->size, 64);

    pthread_barrier_wait(j->barrier);
    if (j->callgrind && j->index == 0)
        CALLGRIND_ZERO_STATS;
    pthread_barrier_wait(j->barrier);
    double t0 = now_ns();
    run_ops(j->fam, j->cfg->op, j->cfg->size, j->n);
    double t1 = now_ns();
    pthread_barrier_wait(j->barrier);
    if (j->callgrind && j->index == 0)
        CALLGRIND_DUMP_STATS_AT(j->label);
    if (kept)
        j->api->dd_libc.release(kept);
    if (mode == MODE_SPREAD && j->index == 0)
        for (int i = 0; i < SPREAD_BLOCKS; i++)
            j->api->dd_libc.release(spread[i]);
    j->ns = (t1 - t0) / (double)j->n;
    return NULL;
}

static const struct dd_bench_family *family_of(const struct config *c)
{
    bool noop = strcmp(c->alloc_name, "noop") == 0;
    if (c->mode == MODE_BARE)
        return noop ? &c->api->bare_noop : &c->api->bare_libc;
    return noop ? &c->api->dd_noop : &c->api->dd_libc;
}

static void label_of(const struct config *c, long n, char *buf, size_t len)
{
    snprintf(buf, len, "op=%s variant=%s alloc=%s threads=%d size=%zu mode=%s ops=%ld",
             c->op == OP_PAIR ? "pair" : "realloc", c->api->variant, c->alloc_name, c->threads,
             c->size, mode_names[c->mode], n * c->threads);
}

static double run_config(struct config *c, long n, int callgrind)
{
    pthread_t tid[MAX_THREADS];
    struct job jobs[MAX_THREADS];
    pthread_barrier_t barrier;
    char label[200];
    label_of(c, n, label, sizeof label);
    pthread_barrier_init(&barrier, NULL, (unsigned)c->threads);
    bool simulated = c->mode == MODE_UNSAMPLED || c->mode == MODE_LIVE ||
                     c->mode == MODE_SAMPLED || c->mode == MODE_SPREAD;
    if (simulated)
        c->api->simulate_tracer(true);
    for (int t = 0; t < c->threads; t++) {
        jobs[t] = (struct job){c->api, family_of(c), c, &barrier, n, t, callgrind, label, 0};
        if (pthread_create(&tid[t], NULL, worker, &jobs[t]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    double sum = 0;
    for (int t = 0; t < c->threads; t++) {
        pthread_join(tid[t], NULL);
        sum += jobs[t].ns;
    }
    if (simulated)
        c->api->simulate_tracer(false);
    pthread_barrier_destroy(&barrier);
    /* Every block was freed: a marked block left behind would make every
     * later free in the process read headers and skew later configs. */
    if (ddheap_test_live_marked() != 0) {
        char label2[200];
        label_of(c, n, label2, sizeof label2);
        fprintf(stderr, "dd_bench_pair: %llu marked blocks still live after %s\n",
                (unsigned long long)ddheap_test_live_marked(), label2);
        exit(1);
    }
    return sum / c->threads;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_of(const double *v, int n, double *min)
{
    double s[64];
    memcpy(s, v, sizeof *v * (size_t)n);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    *min = s[0];
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* --- probe-hit timing --- */

typedef void (*probe_fn)(uint64_t, uint64_t, uint64_t);

static void call_ddheap_probe(uint64_t a, uint64_t b, uint64_t c)
{
    ddheap_fire_alloc((uintptr_t)a, b, c);
}

static double time_probe(probe_fn fn, long n)
{
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        fn((uint64_t)i, 64, 4096);
    return (now_ns() - t0) / (double)n;
}

static long site_offsets[MAX_LIST];
static int nsite_offsets;

static void run_probes(long n, int reps, int traced)
{
    static const struct {
        const char *name;
        probe_fn fn;
    } probes[] = {
        {"usual", dd_bench_probe_usual},
        {"nop5", dd_bench_probe_nop5},
        {"ddheap", call_ddheap_probe},
    };
    double ns[3][64];
    for (int r = 0; r < reps; r++)
        for (int p = 0; p < 3; p++)
            ns[p][r] = time_probe(probes[p].fn, n);
    for (int p = 0; p < 3; p++) {
        double min, med = median_of(ns[p], reps, &min);
        printf("PROBE probe=%s traced=%d med=%.2f min=%.2f\n", probes[p].name, traced, med, min);
    }
    /* What the kernel made of each probe site: 0x90 / 0x0f untraced (the
     * nops), 0xcc an int3 breakpoint, 0xe8 a call into the optimised-uprobe
     * trampoline. A process reads its own text as the kernel patched it.
     * Where each site sits in its function comes from --site-offsets
     * (bench/run reads it off the .note.stapsdt locations). */
    static const struct {
        const char *name;
        uintptr_t site;
    } sites[] = {
        {"usual", (uintptr_t)dd_bench_probe_usual},
        {"nop5", (uintptr_t)dd_bench_probe_nop5},
        {"ddheap", (uintptr_t)ddheap_fire_alloc},
    };
    for (int p = 0; p < 3 && p < nsite_offsets; p++)
        printf("PROBESITE probe=%s traced=%d byte=0x%02x\n", sites[p].name, traced,
               *(const volatile unsigned char *)(sites[p].site + (uintptr_t)site_offsets[p]));
}

/* --- command line --- */

static int parse_list(const char *text, long *out)
{
    int k = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && k < MAX_LIST;
         tok = strtok_r(NULL, ",", &save))
        out[k++] = strtol(tok, NULL, 10);
    return k;
}

static void usage(void)
{
    fprintf(stderr, "usage: dd_bench_pair [--n N] [--reps R] [--threads 1,2] [--sizes 16,64,256,4096]\n"
                    "                     [--variants pie,pic] [--allocs libc,noop] [--no-realloc]\n"
                    "                     [--callgrind] [--traced] [--probes] [--spread]\n"
                    "                     [--site-offsets usual,nop5,ddheap]\n");
    exit(2);
}

static bool wait_for_tracer(bool pie, bool pic)
{
    for (int i = 0; i < 600; i++) {
        bool ok = (!pie || dd_bench_api_pie.attached()) && (!pic || dd_bench_api_pic.attached()) &&
                  __atomic_load_n(&dd_bench_usual_semaphore, __ATOMIC_RELAXED) &&
                  __atomic_load_n(&dd_bench_nop5_semaphore, __ATOMIC_RELAXED);
        if (ok)
            return true;
        usleep(50000);
    }
    return false;
}

int main(int argc, char **argv)
{
    long n = 200000, threads[MAX_LIST] = {1, 2}, sizes[MAX_LIST] = {16, 64, 256, 4096};
    int reps = 7, nthreads = 2, nsizes = 4, callgrind = 0, traced = 0, probes = 0, realloc_too = 1;
    int spread = 0;
    bool pie = true, pic = true, libc = true, noop = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--callgrind"))
            callgrind = 1;
        else if (!strcmp(a, "--traced"))
            traced = 1;
        else if (!strcmp(a, "--probes"))
            probes = 1;
        else if (!strcmp(a, "--no-realloc"))
            realloc_too = 0;
        else if (!strcmp(a, "--spread"))
            spread = 1;
        else if (v && !strcmp(a, "--n"))
            n = strtol(argv[++i], NULL, 10);
        else if (v && !strcmp(a, "--reps"))
            reps = (int)strtol(argv[++i], NULL, 10);
        else if (v && !strcmp(a, "--threads"))
            nthreads = parse_list(argv[++i], threads);
        else if (v && !strcmp(a, "--sizes"))
            nsizes = parse_list(argv[++i], sizes);
        else if (v && !strcmp(a, "--site-offsets"))
            nsite_offsets = parse_list(argv[++i], site_offsets);
        else if (v && !strcmp(a, "--variants")) {
            pie = strstr(v, "pie") != NULL;
            pic = strstr(v, "pic") != NULL;
            i++;
        } else if (v && !strcmp(a, "--allocs")) {
            libc = strstr(v, "libc") != NULL;
            noop = strstr(v, "noop") != NULL;
            i++;
        } else
            usage();
    }
    if (n <= 0 || reps <= 0 || reps > 64)
        usage();
    if (callgrind)
        reps = 1;
    if (traced) {
        fprintf(stderr, "dd_bench_pair: pid %d waiting for a tracer\n", (int)getpid());
        if (!wait_for_tracer(pie, pic)) {
            fprintf(stderr, "dd_bench_pair: no tracer attached after 30 s\n");
            return 1;
        }
    }

    static struct config cfgs[512];
    int ncfg = 0;
    const struct dd_bench_api *apis[2];
    int napis = 0;
    if (pie)
        apis[napis++] = &dd_bench_api_pie;
    if (pic)
        apis[napis++] = &dd_bench_api_pic;
    const char *allocs[2];
    int nallocs = 0;
    if (libc)
        allocs[nallocs++] = "libc";
    if (noop)
        allocs[nallocs++] = "noop";
    enum mode untraced_modes[] = {MODE_BARE,    MODE_OFF,   MODE_UNSAMPLED, MODE_LIVE,
                                  MODE_SAMPLED, MODE_AFTER, MODE_SPREAD};
    enum mode traced_modes[] = {MODE_BARE, MODE_TRACED};
    const enum mode *modes = traced ? traced_modes : untraced_modes;
    int nmodes = traced ? 2 : spread ? 7 : 6;

    for (int a = 0; a < napis; a++)
        for (int k = 0; k < nallocs; k++)
            for (int t = 0; t < nthreads; t++) {
                for (int s = 0; s < nsizes; s++)
                    for (int m = 0; m < nmodes; m++)
                        cfgs[ncfg++] = (struct config){apis[a], allocs[k], (int)threads[t],
                                                       (size_t)sizes[s], modes[m], OP_PAIR, {0}};
                if (realloc_too && !traced)
                    for (int m = 0; m < nmodes; m++)
                        cfgs[ncfg++] = (struct config){apis[a], allocs[k], (int)threads[t], 4096,
                                                       modes[m], OP_REALLOC, {0}};
            }

    for (int phase = callgrind ? 0 : 1; phase < 2; phase++)
        for (int r = 0; r < reps; r++)
            for (int c = 0; c < ncfg; c++) {
                if (phase == 0 && !never_marked_mode(cfgs[c].mode))
                    continue; /* callgrind, first pass: nothing marked yet */
                if (phase == 1 && callgrind && never_marked_mode(cfgs[c].mode))
                    continue; /* measured in the first pass */
                long ops = cfgs[c].op == OP_PAIR ? n : n / 10;
                cfgs[c].ns[r] = run_config(&cfgs[c], ops > 0 ? ops : 1, callgrind);
            }

    if (!callgrind)
        for (int c = 0; c < ncfg; c++) {
            char label[200];
            double min, med = median_of(cfgs[c].ns, reps, &min);
            label_of(&cfgs[c], cfgs[c].op == OP_PAIR ? n : n / 10, label, sizeof label);
            printf("TIME %s med=%.2f min=%.2f\n", label, med, min);
        }
    if (probes)
        run_probes(n, reps, traced);
    return 0;
}

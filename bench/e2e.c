/*
 * End-to-end workload: `count` allocations of random sizes 16..4096 bytes
 * (uniform, a fixed xorshift sequence so every mode allocates exactly the
 * same bytes), freed FIFO through a window of `window` live blocks, through
 * the executable's (-fPIE) wrapper over glibc malloc: bare or ddheap.
 *
 * Prints one line: wall and CPU time of the loop, the true number of bytes
 * requested, which bench/run compares with the weight sum a tracer
 * collected, and the effective sampling interval at the end (the rate
 * limit may have raised it). With --wait-tracer it first waits (up to 30 s) until a tracer
 * has attached to ddheap's alloc probe, so attaching is never timed.
 *
 * For bench/run-interpose's instruction counts of libddheap_preload.so
 * traced (bare mode, the library preloaded), two options set the state a
 * tracer leaves, with no tracer (callgrind cannot run under uprobes):
 *   --preload-semaphore ADDR  adds one to the 16-bit USDT semaphore at
 *       ADDR (its address in the file, from the probe's stapsdt note) in
 *       the object that defines the process's malloc: what a tracer
 *       attaching to that probe does;
 *   --live-marks K  marks K blocks of 256 KiB (glibc maps each, away from
 *       the loop's heap) through this executable's own ddheap copy, kept
 *       live through the loop: the process-wide shadow count and every
 *       copy's free gate are then open, as in a program a tracer has
 *       sampled (needs a -Dmarking=shadow build: both copies share the
 *       scheme's state).
 */
#define _GNU_SOURCE /* pthread barriers, usleep, dladdr: not in strict C11 */
#include "bench.h"

#include <ddheap.h>

#include <dlfcn.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* User + system CPU time of this process. On a shared 2-core machine the
 * wall time includes whatever else ran; the CPU time counts only this
 * process's own work, the kernel's uprobe handling for its probe hits
 * included (that runs in this process's context). */
static double cpu_ns(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ((double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec) * 1e9 +
           ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) * 1e3;
}

/* What a tracer does when it attaches to a probe whose semaphore is at
 * `address` (in the file) of the object that defines malloc. */
static int open_preload_semaphore(uintptr_t address)
{
    Dl_info info;
    void *bound = dlsym(RTLD_DEFAULT, "malloc");
    if (bound == NULL || dladdr(bound, &info) == 0 || info.dli_fbase == NULL)
        return -1;
    unsigned short *semaphore = (unsigned short *)((char *)info.dli_fbase + address);
    __atomic_add_fetch(semaphore, 1, __ATOMIC_RELAXED);
    return 0;
}

#define LIVE_MARK_BYTES (256u * 1024u)

/* K blocks sampled by this executable's copy (interval 1 while they are
 * made, then detached again); NULL if the copy cannot mark shadow bits. */
static void **make_live_marks(long k)
{
#if !DDHEAP_MARK_SHADOW
    (void)k;
    fprintf(stderr, "dd_bench_e2e: --live-marks needs a -Dmarking=shadow build\n");
    return NULL;
#else
    void **blocks = calloc((size_t)k, sizeof *blocks);
    if (blocks == NULL)
        return NULL;
    const struct dd_bench_api *api = &dd_bench_api_pie;
    api->set_interval(1);
    api->simulate_tracer(true);
    for (long i = 0; i < k; i++)
        blocks[i] = api->dd_libc.alloc(LIVE_MARK_BYTES);
    api->simulate_tracer(false);
    return blocks;
#endif
}

int main(int argc, char **argv)
{
    long count = 50000000, window = 1000;
    uint64_t seed = 0x9e3779b97f4a7c15u;
    int wait_tracer = 0;
    long live_marks = 0;
    uintptr_t preload_semaphore = 0;
    const char *mode = "bare";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--wait-tracer"))
            wait_tracer = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--mode"))
            mode = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--count"))
            count = strtol(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--window"))
            window = strtol(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--live-marks"))
            live_marks = strtol(argv[++i], NULL, 10);
        else if (i + 1 < argc && !strcmp(argv[i], "--preload-semaphore"))
            preload_semaphore = (uintptr_t)strtoull(argv[++i], NULL, 0);
        else if (i + 1 < argc && !strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 10) | 1;
        else {
            fprintf(stderr, "usage: dd_bench_e2e [--mode bare|ddheap] [--count N] [--window W] "
                            "[--seed S] [--wait-tracer] [--preload-semaphore ADDR] [--live-marks K]\n");
            return 2;
        }
    }
    const struct dd_bench_family *fam =
        strcmp(mode, "ddheap") == 0 ? &dd_bench_api_pie.dd_libc : &dd_bench_api_pie.bare_libc;
    if (count <= 0 || window <= 0)
        return 2;
    if (wait_tracer) {
        int i = 0;
        while (!dd_bench_api_pie.attached() && i++ < 600)
            usleep(50000);
        if (!dd_bench_api_pie.attached()) {
            fprintf(stderr, "dd_bench_e2e: no tracer attached after 30 s\n");
            return 1;
        }
    }

    if (preload_semaphore != 0 && open_preload_semaphore(preload_semaphore) != 0) {
        fprintf(stderr, "dd_bench_e2e: no object defines malloc\n");
        return 1;
    }
    void **marked = live_marks > 0 ? make_live_marks(live_marks) : NULL;
    if (live_marks > 0 && marked == NULL)
        return 1;

    /* The ring lives on the system allocator's side of the fence: calloc
     * directly, before timing, so it is not part of the workload. */
    void **ring = calloc((size_t)window, sizeof *ring);
    if (!ring)
        return 1;
    uint64_t x = seed, bytes = 0;
    double c0 = cpu_ns();
    double t0 = now_ns();
    for (long i = 0; i < count; i++) {
        /* xorshift64: cheap, and identical in every mode */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t size = 16 + (size_t)(x % 4081);
        long slot = i % window;
        if (ring[slot])
            fam->release(ring[slot]);
        ring[slot] = fam->alloc(size);
        bytes += size;
    }
    for (long i = 0; i < window; i++)
        if (ring[i])
            fam->release(ring[i]);
    double t1 = now_ns();
    double c1 = cpu_ns();
    free(ring);
    for (long i = 0; i < live_marks; i++)
        dd_bench_api_pie.dd_libc.release(marked[i]);
    free(marked);
    /* The interval the rate limit had raised the mean to at the end (the
     * configured one when it never did, or with no tracer). */
    printf("E2E mode=%s count=%ld window=%ld ns=%.0f cpu_ns=%.0f bytes=%llu effective=%llu\n", mode,
           count, window, t1 - t0, c1 - c0, (unsigned long long)bytes,
           (unsigned long long)dd_get_effective_sampling_interval());
    return 0;
}

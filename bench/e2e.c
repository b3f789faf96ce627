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
 */
#define _GNU_SOURCE /* pthread barriers, usleep: not in strict C11 */
#include "bench.h"

#include <ddheap.h>

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

int main(int argc, char **argv)
{
    long count = 50000000, window = 1000;
    uint64_t seed = 0x9e3779b97f4a7c15u;
    int wait_tracer = 0;
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
        else if (i + 1 < argc && !strcmp(argv[i], "--seed"))
            seed = strtoull(argv[++i], NULL, 10) | 1;
        else {
            fprintf(stderr, "usage: dd_bench_e2e [--mode bare|ddheap] [--count N] [--window W] "
                            "[--seed S] [--wait-tracer]\n");
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
    /* The interval the rate limit had raised the mean to at the end (the
     * configured one when it never did, or with no tracer). */
    printf("E2E mode=%s count=%ld window=%ld ns=%.0f cpu_ns=%.0f bytes=%llu effective=%llu\n", mode,
           count, window, t1 - t0, c1 - c0, (unsigned long long)bytes,
           (unsigned long long)dd_get_effective_sampling_interval());
    return 0;
}

/*
 * What the benchmark drivers (pair.c, e2e.c) share with the allocator
 * wrappers (wrap.c) and the bench-only probes (probes.c).
 *
 * wrap.c is compiled twice, the two ways a user compiles ddheap's inlined
 * fast path: into the executable (-fPIE, exported as dd_bench_api_pie) and
 * into a shared library (-fPIC, dd_bench_api_pic). Each copy links its own
 * libddheap.a, so each has its own probes, semaphores and configuration;
 * the drivers therefore reach ddheap only through the table of the copy
 * they measure.
 */
#ifndef DD_BENCH_H
#define DD_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One malloc/free/realloc triple. */
struct dd_bench_family {
    const char *name;
    void *(*alloc)(size_t size);
    void (*release)(void *ptr);
    void *(*resize)(void *ptr, size_t size);
};

/* One compiled copy of the wrappers and the ddheap copy they are bound to.
 * bare_*: the real allocator alone; dd_*: the same wired through ddheap.
 * noop: an allocator that always hands out the same static buffer and
 * frees nothing, so that only ddheap's own cost remains. */
struct dd_bench_api {
    const char *variant;
    struct dd_bench_family bare_libc, dd_libc, bare_noop, dd_noop;
    void (*simulate_tracer)(bool attached);
    void (*set_interval)(uint64_t bytes);
    bool (*attached)(void);
};

extern const struct dd_bench_api dd_bench_api_pie;
extern const struct dd_bench_api dd_bench_api_pic;

/* probes.c: the same 3-argument probe built the usual way (sys/sdt.h's
 * 1-byte nop, as ddheap has it) and with a 5-byte nop, which a kernel that
 * optimises uprobes turns into a call (src/probes.c says why ddheap does
 * not use it), for the probe-hit comparison. */
extern unsigned short dd_bench_usual_semaphore;
extern unsigned short dd_bench_nop5_semaphore;
void dd_bench_probe_usual(uint64_t a, uint64_t b, uint64_t c);
void dd_bench_probe_nop5(uint64_t a, uint64_t b, uint64_t c);

#endif /* DD_BENCH_H */

/*
 * Test hooks: make sampling repeatable and observe the probe stream from
 * inside the process. Meant for ddheap's own tests and for users testing
 * their allocator wiring; none of this is needed in production, and none
 * of it costs anything when unused (the hooks are read on the cold path).
 *
 *     #include <ddheap/testing.h>
 *
 *     static void record(const dd_probe_event_t *ev, void *ctx) { ... }
 *
 *     dd_heap_simulate_tracer(true);          // sample as if attached
 *     dd_set_default_sampling_interval(1);    // every allocation, exactly
 *     ddheap_test_seed_thread(42);            // repeatable countdowns
 *     ddheap_test_set_probe_hook(record, ctx);
 */
#ifndef DDHEAP_TESTING_H
#define DDHEAP_TESTING_H

#include <ddheap.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dd_probe_kind {
    DD_PROBE_ALLOC = 1,   /* ptr, size, weight */
    DD_PROBE_FREE = 2,    /* ptr */
    DD_PROBE_REALLOC = 3, /* ptr (old), new_ptr, size (new), weight */
} dd_probe_kind_t;

typedef struct dd_probe_event {
    dd_probe_kind_t kind;
    uintptr_t ptr;
    uintptr_t new_ptr;
    uint64_t size;
    uint64_t weight;
} dd_probe_event_t;

typedef void (*dd_probe_hook_fn)(const dd_probe_event_t *event, void *ctx);

/* Calls `hook` (from the thread that fires it, in firing order) for every
 * probe fired from now on, whether or not a tracer is attached; NULL stops
 * it. The hook must not allocate through the wrapped allocator. */
DDHEAP_API void ddheap_test_set_probe_hook(dd_probe_hook_fn hook, void *ctx);

/* Reseeds the calling thread's generator and redraws its countdown with the
 * current default interval: the same seed gives the same sample points. */
DDHEAP_API void ddheap_test_seed_thread(uint64_t seed);

/* Draws one countdown of mean `mean` from the calling thread's generator,
 * exactly as the sampler does (for tests of the distribution). */
DDHEAP_API uint64_t ddheap_test_draw_gap(uint64_t mean);

/* The weight the sampler reports for a sampled block of `size` bytes drawn
 * with interval `mean`: size / (1 - exp(-size/mean)), or size when mean is 1. */
DDHEAP_API uint64_t ddheap_test_weight(uint64_t size, uint64_t mean);

/* The mean interval the calling thread's running countdown was drawn with,
 * i.e. the R that the next sampled block's weight will use (0 before the
 * thread's first allocation, UINT64_MAX while sampling is disabled). */
DDHEAP_API uint64_t ddheap_test_thread_mean(void);

/* Forgets that the environment was read, so the next cold-path entry reads
 * DD_HEAP_SAMPLING_* and DD_HEAP_SAMPLES_PER_SECOND again (and this thread
 * re-initialises); a limit set through the API is forgotten too. */
DDHEAP_API void ddheap_test_reload_config(void);

/* Number of marked blocks live in the process (all copies of ddheap). */
DDHEAP_API uint64_t ddheap_test_live_marked(void);

/* aarch64 pointer tagging: forgets whether the calling thread enabled
 * tagged addresses, so its next sampling opportunity asks the kernel again;
 * with `fail` that request behaves as if prctl had failed (the thread then
 * reports DD_HEAP_THREAD_SAMPLING_NO_TAGGED_ADDR and never samples). A
 * thread that was refused waits with a full countdown: reseed it
 * (ddheap_test_seed_thread) to reach a sampling opportunity again. No
 * effect in builds that mark with headers. */
DDHEAP_API void ddheap_test_fail_tagging(bool fail);

#ifdef __cplusplus
}
#endif

#endif /* DDHEAP_TESTING_H */

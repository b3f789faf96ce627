/*
 * A shared library with its own copy of ddheap, for the tests about
 * several copies in one process: built from this one source with the
 * archive each test needs (tests/meson.build, ddheap_plugin_kwargs), and
 * loaded linked, or by dlopen under a second name. Its version script
 * (ddheap_plugin.map) exports the ddheap_plugin_* functions and the two
 * process-wide objects, ddheap_shared_v3 and ddheap_rate_v1, as ddheap.pc
 * tells any program with several copies to; everything else stays local,
 * so the executable's dd_* API never interposes this copy's.
 *
 *   test_free_gate.c      its free gate (ddheap/coldpath.h), tested by its
 *                         inlined free path before anything else
 *   test_mixed_schemes.c  built against the shadow archive, loaded into a
 *                         program whose own copy marks with headers
 *   test_rate_copies.c    its rate-limit API and a burst of samples, which
 *                         must see the one process-wide limit
 *   prof: dlopen_main.c   -DDDHEAP_PLUGIN_EXAMPLE_LIBC: allocates through
 *                         the example libc wrapper from a call site of its
 *                         own, for ddheap-prof to find after a dlopen
 */
#include "ddheap_plugin.h"

#include <ddheap.h>

#include <stdlib.h>
#include <string.h>

/* libc's malloc wired through this copy, as a user's wrapper would be. */
void *ddheap_plugin_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

void ddheap_plugin_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

/* This copy's free gate (bit 0: open). */
uint8_t ddheap_plugin_gate(void)
{
    return __atomic_load_n(&ddheap__free_gate, __ATOMIC_RELAXED);
}

/* This copy's simulated tracer (sampling every allocation) and probe hook. */
void ddheap_plugin_trace(bool on, dd_probe_hook_fn hook)
{
    dd_heap_simulate_tracer(on);
    dd_set_default_sampling_interval(on ? 1 : 0);
    ddheap_test_set_probe_hook(hook, NULL);
}

/* Blocks marked in the process, as this copy counts them. */
uint64_t ddheap_plugin_live(void)
{
    return ddheap_test_live_marked();
}

uint64_t ddheap_plugin_limit(void)
{
    return dd_get_max_samples_per_second();
}

void ddheap_plugin_set_limit(uint64_t samples_per_second)
{
    dd_set_max_samples_per_second(samples_per_second);
}

void ddheap_plugin_set_interval(uint64_t bytes)
{
    dd_set_default_sampling_interval(bytes);
}

uint64_t ddheap_plugin_effective(void)
{
    return dd_get_effective_sampling_interval();
}

/* Allocates `blocks` blocks of 16 KiB through this copy with the tracer
 * simulated (this copy's own semaphore); returns the samples taken. The
 * blocks are one static buffer: only the sampling decisions matter. */
uint64_t ddheap_plugin_sample_burst(uint64_t blocks)
{
    static unsigned char buffer[16384 + 4096] __attribute__((aligned(64)));
    uint64_t samples = 0;
    dd_heap_simulate_tracer(true);
    for (uint64_t i = 0; i < blocks; i++) {
        dd_alloc_req_t req = dd_allocation_requested(16384, 0);
        void *user = dd_allocation_created(buffer, req);
        samples += req.weight != 0;
        dd_allocation_freed(user, 0, 0);
    }
    dd_heap_simulate_tracer(false);
    return samples;
}

#ifdef DDHEAP_PLUGIN_EXAMPLE_LIBC
#include <dd_example_libc.h>

/* Kept blocks are chained through their first word. */
__attribute__((noinline)) static void *site_plugin_blocks(unsigned count)
{
    void *kept = NULL;
    for (unsigned i = 0; i < count; i++) {
        void **block = dd_example_malloc(1000);
        if (block == NULL)
            return kept;
        memset(block, 0x5a, 1000);
        *block = kept;
        kept = block;
        char *scratch = dd_example_malloc(500);
        if (scratch != NULL) {
            memset(scratch, 0xa5, 500);
            dd_example_free(scratch);
        }
    }
    return kept;
}

void *ddheap_plugin_work(unsigned count)
{
    void *kept = site_plugin_blocks(count);
    __asm__ volatile("" ::: "memory"); /* keep the site's call from becoming a tail call */
    return kept;
}
#endif

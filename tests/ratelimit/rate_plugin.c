/*
 * A shared library with its own copy of libddheap.a, for test_rate_copies.c:
 * the rate limit's state must be one per process (ddheap_rate_v2), so this
 * copy's API must see the limit the executable's copy set, and its
 * threads must draw with the interval the other copy's samples raised.
 * Everything but these functions and the two shared objects stays local
 * (rate_plugin.map), so the executable's dd_* API never interposes ours.
 */
#include <ddheap.h>
#include <ddheap/testing.h>
#include <stdint.h>

uint64_t rate_plugin_limit(void);
void rate_plugin_set_limit(uint64_t samples_per_second);
void rate_plugin_set_interval(uint64_t bytes);
uint64_t rate_plugin_effective(void);
uint64_t rate_plugin_sample_burst(uint64_t blocks);

static unsigned char buffer[16384 + 4096] __attribute__((aligned(64)));

uint64_t rate_plugin_limit(void)
{
    return dd_get_max_samples_per_second();
}

void rate_plugin_set_limit(uint64_t samples_per_second)
{
    dd_set_max_samples_per_second(samples_per_second);
}

void rate_plugin_set_interval(uint64_t bytes)
{
    dd_set_default_sampling_interval(bytes);
}

uint64_t rate_plugin_effective(void)
{
    return dd_get_effective_sampling_interval();
}

/* Allocates `blocks` blocks of 16 KiB through this copy with the tracer
 * simulated (this copy's own semaphore); returns the samples taken. */
uint64_t rate_plugin_sample_burst(uint64_t blocks)
{
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

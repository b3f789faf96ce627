/*
 * A libc wrapper with its own copy of the shadow-marking archive, built
 * against ddheap_shadow_dep as the libc interposer is: loaded into a
 * program whose own copy marks with headers (test_mixed_schemes.c).
 */
#include <ddheap.h>
#include <ddheap/testing.h>
#include <stdint.h>
#include <stdlib.h>

#if !DDHEAP_MARK_SHADOW
#error "shadow_plugin must be built against ddheap_shadow_dep"
#endif

void *shadow_plugin_malloc(size_t size);
void shadow_plugin_free(void *ptr);
void shadow_plugin_trace(bool on, dd_probe_hook_fn hook);
uint64_t shadow_plugin_live(void);

void *shadow_plugin_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

void shadow_plugin_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

/* This copy's simulated tracer (sampling every allocation) and probe hook. */
void shadow_plugin_trace(bool on, dd_probe_hook_fn hook)
{
    dd_heap_simulate_tracer(on);
    dd_set_default_sampling_interval(on ? 1 : 0);
    ddheap_test_set_probe_hook(hook, NULL);
}

/* Shadow marks live in the process (any shadow copy). */
uint64_t shadow_plugin_live(void)
{
    return ddheap_test_live_marked();
}

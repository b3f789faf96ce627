/*
 * The build options as a user sees them (ddheap/config.h): with
 * live_heap=false nothing is marked, allocations are reported at the raw
 * pointer, frees are pure passthrough and no free probe ever fires; with
 * live_heap=true (the default) both happen. Runs in every build; the native
 * CI stage also builds with -Dlive_heap=false -Dproviders=otel_memory and
 * runs suite 'options' there.
 */
#include "internal.h"
#include "recording_alloc.h"
#include "test_main.h"

static void test_alloc_free_by_option(void **state)
{
    (void)state;
    tracer_on(1);
    dd_alloc_req_t req = dd_allocation_requested(100, 0);
    assert_int_equal(req.weight, 100);
    void *raw = ra_alloc(req.size, 0);
    void *user = dd_allocation_created(raw, req);
    assert_int_equal(rec.allocs, 1);
    assert_int_equal(rec.ev[0].ptr, (uintptr_t)user);
    dd_alloc_freed_t f = dd_allocation_freed(user, 100, 0);
    assert_ptr_equal(f.ptr, raw);
    assert_int_equal(f.size, req.size);
#if DDHEAP_LIVE_HEAP
    assert_int_equal(rec.frees, 1);
#else
    assert_int_equal(req.size, 100); /* nothing added */
    assert_ptr_equal(user, raw);    /* nothing marked */
    assert_int_equal(rec.frees, 0); /* no free probe */
    assert_int_equal(ddheap_test_live_marked(), 0);
#endif
    ra_free(f.ptr, f.size);
    tracer_off();
}

static void test_realloc_by_option(void **state)
{
    (void)state;
    tracer_on(1);
    char *p = w_malloc(10);
    memcpy(p, "0123456789", 10);
    p = w_realloc(p, 1000);
    assert_memory_equal(p, "0123456789", 10);
    assert_int_equal(rec.allocs, 2);
    assert_int_equal(rec.frees, DDHEAP_LIVE_HEAP ? 1 : 0);
    w_free_sized(p, 1000, 0);
    assert_int_equal(rec.frees, DDHEAP_LIVE_HEAP ? 2 : 0);
    assert_int_equal(ra.live, 0);
    tracer_off();
}

/* Either provider's alloc semaphore opens the gate; the simulated tracer
 * stands for the ddheap provider's. */
static void test_gate_is_either_semaphore(void **state)
{
    (void)state;
    assert_int_equal(ddheap__tracer_gate, 0);
    dd_heap_simulate_tracer(true);
    assert_int_not_equal(ddheap__tracer_gate, 0);
    dd_heap_simulate_tracer(false);
    unsigned short *halves = (unsigned short *)&ddheap__tracer_gate;
    halves[1] = 1; /* as a tracer attached to otel_memory:alloc would */
    assert_true(dd_heap_profiler_attached());
    dd_set_default_sampling_interval(1);
    assert_int_equal(dd_allocation_requested(5, 0).weight, 5);
    halves[1] = 0;
    assert_false(dd_heap_profiler_attached());
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_alloc_free_by_option),
    cmocka_unit_test(test_realloc_by_option),
    cmocka_unit_test(test_gate_is_either_semaphore))

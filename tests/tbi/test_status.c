/*
 * dd_heap_thread_sampling_status() and ddheap_test_fail_tagging() in every
 * build, whatever the marking scheme and options: header builds (and builds
 * without live-heap tracking, which mark nothing) always sample and ignore
 * the tagging hook; aarch64 TBI builds stop sampling on a refused thread.
 * The TBI behaviour in depth is in test_tbi.c; this file pins down that the
 * query and the hook exist and agree with what the sampler does in every
 * build the CI makes (native, options, aarch64 in both schemes).
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <pthread.h>
#include <stdlib.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

/* Only a TBI build that marks blocks can be refused by the kernel. */
#define TAGGING_MATTERS (DDHEAP_MARK_TBI && DDHEAP_LIVE_HEAP)

/* Whether a non-empty allocation of the calling thread would be sampled at
 * R = 1 (every allocation); nothing is allocated. */
static bool samples_now(void)
{
    return dd_allocation_requested(64, 0).weight != 0;
}

static void test_ready_and_disabled(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    assert_true(samples_now());
    assert_int_equal(dd_heap_thread_sampling_status(), DD_HEAP_THREAD_SAMPLING_READY);

    assert_int_equal(setenv("DD_HEAP_SAMPLING_ENABLED", "off", 1), 0);
    ddheap_test_reload_config();
    assert_int_equal(dd_heap_thread_sampling_status(), DD_HEAP_THREAD_SAMPLING_DISABLED);
    assert_false(samples_now());

    assert_int_equal(setenv("DD_HEAP_SAMPLING_ENABLED", "1", 1), 0);
    ddheap_test_reload_config();
    dd_set_default_sampling_interval(1);
    assert_int_equal(dd_heap_thread_sampling_status(), DD_HEAP_THREAD_SAMPLING_READY);
    assert_true(samples_now());
    dd_heap_simulate_tracer(false);
}

struct hook_result {
    int status_before, status_after;
    bool sampled;
};

/* On a fresh thread: ask for a failing prctl, then reach a sampling
 * opportunity. */
static void *failing_thread(void *arg)
{
    struct hook_result *r = arg;
    ddheap_test_fail_tagging(true);
    r->status_before = dd_heap_thread_sampling_status();
    r->sampled = samples_now();
    r->status_after = dd_heap_thread_sampling_status();
    return NULL;
}

static void test_fail_tagging_hook(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    struct hook_result r = {-1, -1, false};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, failing_thread, &r), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
#if TAGGING_MATTERS
    assert_int_equal(r.status_before, DD_HEAP_THREAD_SAMPLING_PENDING);
    assert_false(r.sampled);
    assert_int_equal(r.status_after, DD_HEAP_THREAD_SAMPLING_NO_TAGGED_ADDR);
#else
    /* Nothing to refuse: the hook changes nothing. */
    assert_int_equal(r.status_before, DD_HEAP_THREAD_SAMPLING_READY);
    assert_true(r.sampled);
    assert_int_equal(r.status_after, DD_HEAP_THREAD_SAMPLING_READY);
#endif
    dd_heap_simulate_tracer(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ready_and_disabled),
        cmocka_unit_test(test_fail_tagging_hook),
    };
    return cmocka_run_group_tests_name("status", tests, NULL, NULL);
}

/*
 * sampler.c: the Poisson sampler and its weights (docs/design.md, "Sampling").
 *
 * Statistical bounds, derived: a block of S bytes is sampled with
 * p = 1 - e^(-S/R) and then weighs S/p, else 0. Over N such blocks the sum
 * W of weights has E[W] = N S and Var[W] = N S^2 (1-p)/p. Each test asserts
 * |W - N S| <= 5 sd (+ the rounding of each weight to a whole byte, at most
 * 1/2 per sample). With a fixed seed a run is repeatable; 5 sd means a
 * correct sampler fails one seed in ~1.7 million, a biased one fails fast.
 *
 * DDHEAP_TEST_SCALE (0 < scale <= 1) shrinks the iteration counts for slow
 * runners (valgrind, qemu); the bounds are recomputed from the counts
 * actually used, never widened by hand.
 */
#include "internal.h"
#include "mark.h"
#include "recording_alloc.h"
#include "test_main.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>

static double test_scale(void)
{
    const char *s = getenv("DDHEAP_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 && v <= 1 ? v : 1.0;
}

static uint64_t scaled(uint64_t n)
{
    uint64_t v = (uint64_t)((double)n * test_scale());
    return v ? v : 1;
}

/* Sum of the weights the sampler gives N blocks of S bytes at interval R. */
static void check_weight_sum(uint64_t size, uint64_t interval, uint64_t target_samples,
                             uint64_t max_blocks)
{
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(interval);
    ddheap_test_seed_thread(size * 31 + interval);

    double p = -expm1(-(double)size / (double)interval);
    uint64_t n = (uint64_t)ceil((double)target_samples / p);
    if (n > max_blocks)
        n = max_blocks;
    n = scaled(n);

    uint64_t samples = 0;
    double sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        dd_alloc_req_t req = dd_allocation_requested(size, 0);
        if (req.weight) {
            samples++;
            sum += (double)req.weight;
        }
    }
    double truth = (double)n * (double)size;
    double sd = sqrt((double)n * (double)size * (double)size * (1 - p) / p);
    double bound = 5 * sd + 0.5 * (double)samples + 1;
    print_message("S=%8llu R=%6llu: %9llu blocks, %6llu samples (expected %.0f), weights/truth = %.4f "
                  "(bound +-%.4f)\n",
                  (unsigned long long)size, (unsigned long long)interval, (unsigned long long)n,
                  (unsigned long long)samples, (double)n * p, sum / truth, bound / truth);
    if (fabs(sum - truth) > bound)
        fail_msg("sum of weights %.0f vs true bytes %.0f: off by %.0f, bound %.0f", sum, truth,
                 fabs(sum - truth), bound);
    /* One event per block, however many sample points it spans. */
    assert_true(samples <= n);
    dd_heap_simulate_tracer(false);
}

static const uint64_t sizes[] = {8, 100, 4096, 65536, UINT64_C(1) << 20, UINT64_C(8) << 20};

static void test_weights_unbiased_at_4k(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        check_weight_sum(sizes[i], 4096, 20000, 4000000);
}

static void test_weights_unbiased_at_default(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        check_weight_sum(sizes[i], DDHEAP_DEFAULT_INTERVAL, 20000, 4000000);
}

/* Blocks much larger than R are always sampled, once, with weight = size. */
static void test_large_blocks_weigh_their_size(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(4096);
    for (int i = 0; i < 1000; i++) {
        dd_alloc_req_t req = dd_allocation_requested(UINT64_C(8) << 20, 0);
        assert_int_equal(req.weight, UINT64_C(8) << 20);
    }
    dd_heap_simulate_tracer(false);
}

/* Gaps are Exp(R): mean R (sd R/sqrt(n)) and P(gap < R) = 1 - 1/e
 * (binomial sd sqrt(q(1-q)/n)); a uniform or fixed gap fails the second. */
static void test_gap_distribution(void **state)
{
    (void)state;
    const uint64_t r = 65536;
    uint64_t n = scaled(200000);
    ddheap_test_seed_thread(7);
    double sum = 0;
    uint64_t below = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t g = ddheap_test_draw_gap(r);
        sum += (double)g;
        below += g < r;
    }
    double mean = sum / (double)n;
    double q = 1 - exp(-1.0);
    print_message("mean gap %.1f (R = %llu), P(gap < R) = %.4f (expected %.4f)\n", mean,
                  (unsigned long long)r, (double)below / (double)n, q);
    assert_true(fabs(mean - (double)r) <= 5 * (double)r / sqrt((double)n) + 1);
    assert_true(fabs((double)below / (double)n - q) <= 5 * sqrt(q * (1 - q) / (double)n));
}

/* R = 1: every non-empty allocation, weight = size exactly; size 0 never. */
static void test_interval_one_samples_everything(void **state)
{
    (void)state;
    tracer_on(1);
    for (size_t size = 0; size < 5000; size++) {
        dd_alloc_req_t req = dd_allocation_requested(size, 0);
        assert_int_equal(req.weight, size);
        if (size)
            assert_int_equal(req.size, size + ddheap_mark_extra(0));
        void *p = dd_allocation_created(ra_alloc(req.size, req.alignment), req);
        w_free(p);
    }
    assert_int_equal(rec.allocs, 4999);
    assert_int_equal(rec.frees, 4999);
    assert_int_equal(ra.live, 0);
    tracer_off();
}

/* No tracer: nothing is sampled, marked or reported, whatever the sizes. */
static void test_no_tracer_no_sampling(void **state)
{
    (void)state;
    ra_reset();
    rec_start();
    dd_set_default_sampling_interval(1);
    assert_false(dd_heap_profiler_attached());
    for (size_t i = 0; i < 10000; i++) {
        dd_alloc_req_t req = dd_allocation_requested(i * 97 % 70000, 0);
        assert_int_equal(req.weight, 0);
        assert_int_equal(req.size, req.user_size);
        void *p = dd_allocation_created(ra_alloc(req.size, 0), req);
        assert_int_equal(ddheap_test_live_marked(), 0);
        w_free(p);
    }
    assert_int_equal(rec.n, 0);
    ddheap_test_set_probe_hook(NULL, NULL);
}

/* The simulated tracer nests like real attaches and never goes below 0. */
static void test_simulated_tracer_counts(void **state)
{
    (void)state;
    assert_false(dd_heap_profiler_attached());
    dd_heap_simulate_tracer(true);
    dd_heap_simulate_tracer(true);
    dd_heap_simulate_tracer(false);
    assert_true(dd_heap_profiler_attached());
    dd_heap_simulate_tracer(false);
    assert_false(dd_heap_profiler_attached());
    dd_heap_simulate_tracer(false);
    assert_false(dd_heap_profiler_attached());
}

/* DD_HEAP_SAMPLING_ENABLED=0: attached or not, nothing is sampled. */
static void test_disabled_by_environment(void **state)
{
    (void)state;
    setenv("DD_HEAP_SAMPLING_ENABLED", "0", 1);
    ddheap_test_reload_config();
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    for (size_t i = 1; i < 10000; i++)
        assert_int_equal(dd_allocation_requested(i, 0).weight, 0);
    dd_heap_simulate_tracer(false);
    unsetenv("DD_HEAP_SAMPLING_ENABLED");
    ddheap_test_reload_config();
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    assert_int_equal(dd_allocation_requested(10, 0).weight, 10);
    dd_heap_simulate_tracer(false);
}

/* A new interval applies to the calling thread at once. */
static void test_interval_change_is_immediate(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(UINT64_C(1) << 40);
    assert_int_equal(dd_allocation_requested(64, 0).weight, 0);
    dd_set_default_sampling_interval(1);
    assert_int_equal(dd_allocation_requested(64, 0).weight, 64);
    dd_heap_simulate_tracer(false);
}

/* The same seed gives the same sample points. */
static void test_seed_repeats(void **state)
{
    (void)state;
    static uint64_t first[4096], second[4096];
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(4096);
    uint64_t *runs[] = {first, second};
    for (int run = 0; run < 2; run++) {
        ddheap_test_seed_thread(1234);
        size_t k = 0;
        for (uint64_t i = 0; i < 200000 && k < 4096; i++) {
            dd_alloc_req_t req = dd_allocation_requested(16 + i % 200, 0);
            if (req.weight)
                runs[run][k++] = i;
        }
        assert_true(k > 1000);
    }
    assert_memory_equal(first, second, sizeof first);
    dd_heap_simulate_tracer(false);
}

/* errno survives every cold path. */
static void test_errno_preserved(void **state)
{
    (void)state;
    tracer_on(1);
    errno = 4242;
    dd_alloc_req_t req = dd_allocation_requested(100, 0);
    assert_int_equal(errno, 4242);
    void *p = dd_allocation_created(ra_alloc(req.size, 0), req);
    assert_int_equal(errno, 4242);
    dd_alloc_freed_t f = dd_allocation_freed(p, 0, 0);
    assert_int_equal(errno, 4242);
    ra_free(f.ptr, 0);
    void *q = w_malloc(10);
    errno = 4343;
    q = w_realloc(q, 5000);
    assert_int_equal(errno, 4343);
    w_free(q);
    assert_int_equal(ra.live, 0);
    tracer_off();
}

/* A probe hook is foreign code: whatever it does to errno stays inside. */
static void clobbering_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ev;
    (void)ctx;
    errno = EIO;
}

static void test_errno_survives_the_hook(void **state)
{
    (void)state;
    tracer_on(1);
    ddheap_test_set_probe_hook(clobbering_hook, NULL);
    errno = 4242;
    void *p = w_malloc(100); /* alloc probe */
    assert_int_equal(errno, 4242);
    p = w_realloc(p, 9000); /* free, alloc and realloc probes */
    assert_int_equal(errno, 4242);
    w_free(p); /* free probe */
    assert_int_equal(errno, 4242);
    assert_int_equal(ra.live, 0);
    tracer_off();
}

/* An allocation made while the thread is inside the cold path (a signal
 * handler, say) passes through unsampled. */
static void test_reentry_passes_through(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    ddheap__thread_state.busy = 1;
    dd_alloc_req_t inner = dd_allocation_requested(100, 0);
    ddheap__thread_state.busy = 0;
    assert_int_equal(inner.weight, 0);
    assert_int_equal(inner.size, 100);
    assert_int_equal(dd_allocation_requested(100, 0).weight, 100);
    dd_heap_simulate_tracer(false);
}

/* Sampled allocation that failed: NULL back, nothing reported or marked. */
static void test_failed_allocation_reports_nothing(void **state)
{
    (void)state;
    tracer_on(1);
    ra_set_fail(true);
    assert_null(w_malloc(100));
    assert_null(w_alloc(100, 8192));
    assert_int_equal(rec.n, 0);
    tracer_done();
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_weights_unbiased_at_4k),
    cmocka_unit_test(test_weights_unbiased_at_default),
    cmocka_unit_test(test_large_blocks_weigh_their_size),
    cmocka_unit_test(test_gap_distribution),
    cmocka_unit_test(test_interval_one_samples_everything),
    cmocka_unit_test(test_no_tracer_no_sampling),
    cmocka_unit_test(test_simulated_tracer_counts),
    cmocka_unit_test(test_disabled_by_environment),
    cmocka_unit_test(test_interval_change_is_immediate),
    cmocka_unit_test(test_seed_repeats),
    cmocka_unit_test(test_errno_preserved),
    cmocka_unit_test(test_errno_survives_the_hook),
    cmocka_unit_test(test_reentry_passes_through),
    cmocka_unit_test(test_failed_allocation_reports_nothing))

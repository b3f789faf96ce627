/*
 * The sampling-rate limit's configuration and API (suite 'unit', so it
 * also runs under the sanitizers, valgrind and qemu): the variable's
 * values, good and bad; the API against the environment; R = 1 never
 * limited; a burst beyond the bucket raising the effective interval, a short
 * program within it keeping the configured one; and the API called from
 * several threads at once while others allocate. The limit's behaviour
 * over time is tested in test_rate_steps.c.
 */
#include "internal.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "child.h"
#include "test_main.h"

#define BLOCK 16384u

static unsigned char block_buffer[BLOCK + 4096] __attribute__((aligned(64)));

/* One block through the hooks over a static buffer; returns its weight. */
static uint64_t one_block(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    void *user = dd_allocation_created(block_buffer, req);
    dd_alloc_freed_t f = dd_allocation_freed(user, 0, 0);
    assert_ptr_equal(f.ptr, block_buffer);
    return req.weight;
}

static void test_parse_rate(void **state)
{
    (void)state;
    struct {
        const char *text;
        uint64_t value;
    } good[] = {{"0", 0}, {"1", 1}, {"3000", 3000}, {"007", 7},
                {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        uint64_t v = 77;
        assert_true(ddheap_parse_rate(good[i].text, &v));
        assert_int_equal(v, good[i].value);
    }
    const char *bad[] = {"", "-1", "+5", " 5", "5 ", "1k", "1.5", "0x10", "abc", "1e3",
                         "18446744073709551616", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t v = 77;
        if (ddheap_parse_rate(bad[i], &v))
            fail_msg("accepted DD_HEAP_SAMPLES_PER_SECOND=\"%s\"", bad[i]);
        assert_int_equal(v, 77);
    }
}

/* The child of limit_from_environment: writes its limit on stdout. */
static int report_limit(void *value)
{
    if (value)
        setenv("DD_HEAP_SAMPLES_PER_SECOND", value, 1);
    else
        unsetenv("DD_HEAP_SAMPLES_PER_SECOND");
    /* Forked: the word as this test's process left it, cleared for this
     * reading alone. */
    __atomic_store_n(&ddheap_shared_v3.status, 0, __ATOMIC_RELAXED);
    ddheap_test_reload_config();
    uint64_t report[2] = {dd_get_max_samples_per_second(),
                          __atomic_load_n(&ddheap_shared_v3.status, __ATOMIC_RELAXED)};
    return write(1, report, sizeof report) == sizeof report ? 0 : 1;
}

/* In a child: the variable set to `value` (NULL: unset), the environment
 * read again; returns the limit the process ends up with. A bad value sets
 * its bit of the process-wide status word (a complaint); anything else
 * there, or anything written on stderr, is an "other line": nothing inside
 * a profiled process writes on its streams. */
static uint64_t limit_from_environment(const char *value, int *complaints, int *other_lines)
{
    static struct child_output child;
    run_child(report_limit, (void *)value, &child);
    assert_true(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0);
    uint64_t report[2];
    memcpy(report, child.out, sizeof report);
    *complaints = (report[1] & DDHEAP__STATUS_BAD_RATE) != 0;
    *other_lines = child.err[0] != '\0' || (report[1] & ~(uint64_t)DDHEAP__STATUS_BAD_RATE) != 0;
    return report[0];
}

static void test_environment_values(void **state)
{
    (void)state;
    struct {
        const char *value;
        uint64_t limit;
        int complaints;
    } cases[] = {
        {NULL, DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 0},
        {"0", 0, 0},
        {"250", 250, 0},
        {"18446744073709551615", UINT64_MAX, 0},
        {"", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
        {"-1", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
        {"2k", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
        {"1.5", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
        {" 100", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
        {"none", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
        {"18446744073709551616", DDHEAP_DEFAULT_SAMPLES_PER_SECOND, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int complaints, others;
        uint64_t limit = limit_from_environment(cases[i].value, &complaints, &others);
        print_message("DD_HEAP_SAMPLES_PER_SECOND=%s%s%s: limit %llu, %d complaint(s)\n",
                      cases[i].value ? "\"" : "", cases[i].value ? cases[i].value : "(unset)",
                      cases[i].value ? "\"" : "", (unsigned long long)limit, complaints);
        assert_int_equal(limit, cases[i].limit);
        assert_int_equal(complaints, cases[i].complaints);
        assert_int_equal(others, 0);
    }
}

static void test_api_over_environment(void **state)
{
    (void)state;
    setenv("DD_HEAP_SAMPLES_PER_SECOND", "500", 1);
    ddheap_test_reload_config();
    assert_int_equal(dd_get_max_samples_per_second(), 500);
    dd_set_max_samples_per_second(700);
    assert_int_equal(dd_get_max_samples_per_second(), 700);
    dd_set_max_samples_per_second(0);
    assert_int_equal(dd_get_max_samples_per_second(), 0);
    dd_set_default_sampling_interval(8192);
    assert_int_equal(dd_get_effective_sampling_interval(), 8192);
    unsetenv("DD_HEAP_SAMPLES_PER_SECOND");
    ddheap_test_reload_config();
    assert_int_equal(dd_get_max_samples_per_second(), DDHEAP_DEFAULT_SAMPLES_PER_SECOND);
    setenv("DD_HEAP_SAMPLES_PER_SECOND", "0", 1); /* as the other tests run */
    ddheap_test_reload_config();
}

/* R = 1 asks for every allocation: a limit of 10 a second changes nothing. */
static void test_exact_mode_is_never_limited(void **state)
{
    (void)state;
    dd_set_default_sampling_interval(1);
    dd_set_max_samples_per_second(10);
    dd_heap_simulate_tracer(true);
    for (int i = 0; i < 20000; i++)
        assert_int_equal(one_block(100), 100);
    assert_int_equal(dd_get_effective_sampling_interval(), 1);
    dd_heap_simulate_tracer(false);
    dd_set_max_samples_per_second(0);
}

/* Sampling as fast as a thread can (every 16 KiB block holds a sample
 * point about 98% of the time at 4 KiB) against a limit of 1000 a second:
 * the burst of 1000 samples (plus 1000 a second of running time) is spent
 * within the 4000 blocks at any speed this runs at, and the interval is
 * raised to what the last window (25 samples, its quota) measured. */
static void test_burst_raises_the_interval(void **state)
{
    (void)state;
    dd_set_default_sampling_interval(4096);
    dd_set_max_samples_per_second(1000);
    assert_int_equal(dd_get_effective_sampling_interval(), 4096);
    dd_heap_simulate_tracer(true);
    ddheap_test_seed_thread(14);
    uint64_t samples = 0;
    for (int i = 0; i < 4000 && dd_get_effective_sampling_interval() == 4096; i++)
        samples += one_block(BLOCK) != 0;
    dd_heap_simulate_tracer(false);
    uint64_t effective = dd_get_effective_sampling_interval();
    print_message("effective interval %llu after %llu samples\n", (unsigned long long)effective,
                  (unsigned long long)samples);
    assert_true(effective > 4096);
    assert_true(ddheap_rate_windows() >= 1);
    dd_set_max_samples_per_second(0); /* no limit: back to the configured interval at once */
    assert_int_equal(dd_get_effective_sampling_interval(), 4096);
}

/* A program shorter than a second samples as at the fixed interval: 6000
 * blocks of 16 KiB at 64 KiB, each sampled with p = 1 - e^(-1/4) = 0.221,
 * as fast as a thread can, against the default limit of 3000 a second.
 * The sample count is Binomial(6000, p): mean 1327, sd 32.2, so within
 * 5 sd it stays below 1488, under the bucket's 3000 however fast (or slow)
 * this runs: the limit must never raise the interval here, and every
 * sample must be drawn with the configured one. The count within 5 sd of
 * its mean and the weights within 5 sd of the bytes check what the
 * program gets: the fixed interval's sampling, unbiased. (Before the
 * burst, the first window's quota of 75 samples raised the interval: about
 * a quarter of the samples.) */
static void test_short_program_keeps_the_interval(void **state)
{
    (void)state;
    enum { BLOCKS = 6000 };
    const uint64_t interval = 65536;
    dd_set_default_sampling_interval(interval);
    dd_set_max_samples_per_second(DDHEAP_DEFAULT_SAMPLES_PER_SECOND); /* a full bucket */
    dd_heap_simulate_tracer(true);
    ddheap_test_seed_thread(23);
    uint64_t samples = 0, off_interval = 0;
    double weight = 0;
    for (int i = 0; i < BLOCKS; i++) {
        uint64_t w = one_block(BLOCK);
        if (w) {
            samples++;
            weight += (double)w;
            off_interval += ddheap_test_thread_mean() != interval;
        }
    }
    dd_heap_simulate_tracer(false);
    double p = ddheap_one_minus_exp_neg((double)BLOCK / (double)interval);
    double expected = BLOCKS * p, sd = sqrt(BLOCKS * p * (1 - p));
    double bytes = (double)BLOCKS * BLOCK;
    double weight_sd = sqrt(BLOCKS * (double)BLOCK * BLOCK * (1 - p) / p);
    print_message("%llu samples (expected %.0f, sd %.1f), weights/bytes %.4f (%.2f sd), "
                  "%llu drawn with another interval, effective interval %llu\n",
                  (unsigned long long)samples, expected, sd, weight / bytes,
                  fabs(weight - bytes) / weight_sd, (unsigned long long)off_interval,
                  (unsigned long long)dd_get_effective_sampling_interval());
    assert_true(fabs((double)samples - expected) <= 5 * sd);
    assert_true(fabs(weight - bytes) <= 5 * weight_sd + 0.5 * (double)samples);
    assert_int_equal(off_interval, 0);
    assert_int_equal(dd_get_effective_sampling_interval(), interval);
    dd_set_max_samples_per_second(0);
}

/* --- the API from several threads at once --- */

static int stop_threads;
static uint64_t hook_allocs;

static void count_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_ALLOC)
        __atomic_add_fetch(&hook_allocs, 1, __ATOMIC_RELAXED);
}

struct allocator_result {
    uint64_t samples;
    uint64_t light; /* weights below the block's size: impossible */
};

static void *allocator(void *arg)
{
    struct allocator_result *res = arg;
    unsigned char *buffer = aligned_alloc(64, 2 * BLOCK);
    size_t size = 64;
    while (!__atomic_load_n(&stop_threads, __ATOMIC_RELAXED)) {
        size = size * 5 % (BLOCK - 1) + 1;
        dd_alloc_req_t req = dd_allocation_requested(size, 0);
        void *user = dd_allocation_created(buffer, req);
        if (req.weight) {
            res->samples++;
            res->light += req.weight < size;
        }
        if (dd_allocation_freed(user, size, 0).ptr != buffer)
            abort();
    }
    free(buffer);
    return NULL;
}

static void *configurer(void *arg)
{
    static const uint64_t limits[] = {0, 1, 100, 5000, UINT64_MAX};
    static const uint64_t intervals[] = {4096, 65536, 1, 0};
    uintptr_t which = (uintptr_t)arg;
    for (unsigned i = 0; !__atomic_load_n(&stop_threads, __ATOMIC_RELAXED); i++) {
        if (which == 0) {
            dd_set_max_samples_per_second(limits[i % 5]);
            (void)dd_get_max_samples_per_second();
        } else {
            dd_set_default_sampling_interval(intervals[i % 4]);
            (void)dd_get_effective_sampling_interval();
        }
        if (i % 64 == 0)
            usleep(100);
    }
    return NULL;
}

static void test_api_from_threads(void **state)
{
    (void)state;
    pthread_t alloc_tids[2], config_tids[2];
    struct allocator_result results[2] = {{0, 0}, {0, 0}};
    hook_allocs = 0;
    stop_threads = 0;
    ddheap_test_set_probe_hook(count_hook, NULL);
    dd_heap_simulate_tracer(true);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&alloc_tids[i], NULL, allocator, &results[i]), 0);
    for (uintptr_t i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&config_tids[i], NULL, configurer, (void *)i), 0);
    usleep(300000);
    __atomic_store_n(&stop_threads, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++) {
        pthread_join(alloc_tids[i], NULL);
        pthread_join(config_tids[i], NULL);
    }
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);
    uint64_t samples = results[0].samples + results[1].samples;
    print_message("%llu samples while the limit and the interval kept changing\n",
                  (unsigned long long)samples);
    assert_true(samples > 0);
    assert_int_equal(results[0].light + results[1].light, 0);
    assert_int_equal(hook_allocs, samples); /* every sample reported, once */
    assert_int_equal(ddheap_test_live_marked(), 0);
    /* Whatever the race left, the last calls decide. */
    dd_set_max_samples_per_second(1234);
    dd_set_default_sampling_interval(8192);
    assert_int_equal(dd_get_max_samples_per_second(), 1234);
    assert_int_equal(dd_get_default_sampling_interval(), 8192);
    assert_true(dd_get_effective_sampling_interval() >= 8192);
    dd_set_max_samples_per_second(0);
    assert_int_equal(dd_get_effective_sampling_interval(), 8192);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_parse_rate),
    cmocka_unit_test(test_environment_values),
    cmocka_unit_test(test_api_over_environment),
    cmocka_unit_test(test_exact_mode_is_never_limited),
    cmocka_unit_test(test_burst_raises_the_interval),
    cmocka_unit_test(test_short_program_keeps_the_interval),
    cmocka_unit_test(test_api_from_threads))

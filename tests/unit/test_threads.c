/*
 * Per-thread state and fork (docs/design.md, "Per-thread state and
 * fork"): four threads allocating at once
 * keep independent countdowns (each, seeded alike, picks exactly the sample
 * points a lone thread picks), blocks sampled on one thread are released
 * correctly on another, and a block sampled before fork frees correctly in
 * both parent and child.
 */
#include "internal.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "test_main.h"

#define OPS 200000
#define MAX_SAMPLES 8192
#define THREADS 4

struct run {
    uint32_t picks[MAX_SAMPLES];
    size_t n;
};

/* The allocation sequence every thread replays; only requested() matters
 * for the countdown, so no memory is touched. */
static void replay(struct run *r)
{
    ddheap_test_seed_thread(99);
    r->n = 0;
    for (uint32_t i = 0; i < OPS; i++) {
        dd_alloc_req_t req = dd_allocation_requested(8 + (i * 2654435761u) % 3000, 0);
        if (req.weight && r->n < MAX_SAMPLES)
            r->picks[r->n++] = i;
    }
}

static void *thread_main(void *arg)
{
    replay(arg);
    return NULL;
}

static void test_independent_countdowns(void **state)
{
    (void)state;
    static struct run alone, each[THREADS];
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(8192);
    replay(&alone);
    assert_true(alone.n > 1000);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, thread_main, &each[i]), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(each[i].n, alone.n);
        assert_memory_equal(each[i].picks, alone.picks, alone.n * sizeof alone.picks[0]);
    }
    dd_heap_simulate_tracer(false);
}

/* --- cross-thread frees, with the real libc allocator underneath --- */

static void *wrap_malloc(size_t n)
{
    dd_alloc_req_t req = dd_allocation_requested(n, 0);
    return dd_allocation_created(malloc(req.size), req);
}

static void wrap_free(void *p)
{
    free(dd_allocation_freed(p, 0, 0).ptr);
}

#define HANDOFF 20000
static char *handoff[HANDOFF];

static void *producer(void *arg)
{
    (void)arg;
    for (int i = 0; i < HANDOFF; i++) {
        handoff[i] = wrap_malloc(16 + i % 500);
        memset(handoff[i], i & 0xff, 16);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    (void)arg;
    for (int i = 0; i < HANDOFF; i++) {
        for (int k = 0; k < 16; k++)
            assert_int_equal((unsigned char)handoff[i][k], i & 0xff);
        wrap_free(handoff[i]);
    }
    return NULL;
}

static void test_free_on_another_thread(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(512);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, producer, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(ddheap_test_live_marked() > 100);
    assert_int_equal(pthread_create(&t, NULL, consumer, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(ddheap_test_live_marked(), 0);
    dd_heap_simulate_tracer(false);
}

static void test_fork_keeps_sampled_blocks(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    char *before = wrap_malloc(200);
    memset(before, 0x77, 200);
    assert_int_equal(ddheap_test_live_marked(), 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* child: the block is still recognised, its raw pointer recovered
         * (glibc would abort on a wrong one), and sampling goes on */
        int ok = before[199] == 0x77 && ddheap_test_live_marked() == 1;
        wrap_free(before);
        ok = ok && ddheap_test_live_marked() == 0;
        char *after = wrap_malloc(10);
        ok = ok && ddheap_test_live_marked() == 1;
        wrap_free(after);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(ddheap_test_live_marked(), 1);
    wrap_free(before);
    assert_int_equal(ddheap_test_live_marked(), 0);
    dd_heap_simulate_tracer(false);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_independent_countdowns),
    cmocka_unit_test(test_free_on_another_thread),
    cmocka_unit_test(test_fork_keeps_sampled_blocks))

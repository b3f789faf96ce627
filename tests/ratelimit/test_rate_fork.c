/*
 * The rate limit across fork (issue 19): a child forked at any moment
 * keeps a working limit. Two threads sample under the limit through the
 * public hooks (simulated tracer) while the main thread forks:
 *
 *  - at random moments, 0 to 2 ms apart;
 *  - exactly while a sampling thread holds a window's claim (between
 *    closing a window and opening the next, src/rate.c): the closing hook
 *    parks that thread until the fork is done, so the child inherits a
 *    claim whose closer does not exist in it. Before claims named their
 *    process, such a child's limit stayed frozen for good.
 *
 * Each child then samples alone and checks that its limit works: it takes
 * samples, a window closes in it (its own measurement), and its effective
 * interval ends up raised above the configured one. Its blocks are of 64 MiB (only their size goes
 * through the hooks; the memory behind them is one small buffer), so that
 * even at the interval the parent's limit had raised, most of them are
 * sampled: far beyond the burst (2000 samples plus 2000 a second) and
 * every window's quota (50). None of this depends on speed: the child
 * stops as soon as all three hold, and fails only if they do not after
 * 200 000 blocks.
 */
#include "internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#define LIMIT 2000u
#define INTERVAL 4096u
#define BLOCK 16384u
#define CHILD_BLOCKS 200000u
#define CHILD_BLOCK (UINT64_C(64) << 20)
#define RANDOM_FORKS 60
#define CLAIMED_FORKS 20

static unsigned char child_buffer[4096] __attribute__((aligned(64)));

/* Child exit codes. */
enum { CHILD_OK = 0, CHILD_NO_SAMPLES = 1, CHILD_NO_WINDOWS = 2, CHILD_NOT_LIMITED = 3 };

static int child_checks_its_limit(void)
{
    uint64_t windows_at_fork = ddheap_rate_windows();
    uint64_t samples = 0;
    for (unsigned i = 0; i < CHILD_BLOCKS; i++) {
        dd_alloc_req_t req = dd_allocation_requested(CHILD_BLOCK, 0);
        void *user = dd_allocation_created(child_buffer, req);
        samples += req.weight != 0;
        (void)dd_allocation_freed(user, 0, 0);
        if (samples > 0 && ddheap_rate_windows() > windows_at_fork &&
            dd_get_effective_sampling_interval() > INTERVAL)
            return CHILD_OK;
    }
    if (samples == 0)
        return CHILD_NO_SAMPLES;
    if (ddheap_rate_windows() == windows_at_fork)
        return CHILD_NO_WINDOWS; /* the controller is frozen */
    return CHILD_NOT_LIMITED;
}

/* --- the parent's sampling threads and the closing hook --- */

static int stop_threads;
static int want_claimed_fork; /* main: fork at the next claim */
static int claim_held;        /* hook: a thread holds a claim and waits */
static int fork_done;         /* main: the fork happened, let it go */

static void park_while_forking(void)
{
    int expected = 1;
    if (!__atomic_compare_exchange_n(&want_claimed_fork, &expected, 0, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_RELAXED))
        return;
    __atomic_store_n(&claim_held, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&fork_done, __ATOMIC_ACQUIRE))
        sched_yield();
    __atomic_store_n(&fork_done, 0, __ATOMIC_RELAXED);
}

static void *sampler(void *arg)
{
    (void)arg;
    unsigned char *buffer = aligned_alloc(64, 2 * BLOCK);
    while (!__atomic_load_n(&stop_threads, __ATOMIC_RELAXED)) {
        dd_alloc_req_t req = dd_allocation_requested(BLOCK, 0);
        void *user = dd_allocation_created(buffer, req);
        if (dd_allocation_freed(user, 0, 0).ptr != buffer)
            abort();
    }
    free(buffer);
    return NULL;
}

/* Forks a child that checks its limit and exits with what it found. */
static pid_t fork_and_check(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(child_checks_its_limit());
    return pid;
}

static int wait_child(pid_t pid)
{
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_children_keep_a_working_limit(void **state)
{
    (void)state;
    static const char *const what[] = {"ok", "took no sample", "closed no window (frozen)",
                                       "was never limited"};
    dd_set_default_sampling_interval(INTERVAL);
    dd_set_max_samples_per_second(LIMIT);
    dd_heap_simulate_tracer(true);
    ddheap_rate_set_closing_hook(park_while_forking);
    pthread_t threads[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, sampler, NULL), 0);
    int failed[2] = {0, 0};
    unsigned seed = 19;
    for (int round = 0; round < RANDOM_FORKS + CLAIMED_FORKS; round++) {
        int claimed = round >= RANDOM_FORKS;
        if (claimed) {
            __atomic_store_n(&want_claimed_fork, 1, __ATOMIC_RELEASE);
            while (!__atomic_load_n(&claim_held, __ATOMIC_ACQUIRE))
                sched_yield();
        } else {
            usleep((useconds_t)(rand_r(&seed) % 2000));
        }
        pid_t pid = fork_and_check();
        if (claimed) {
            __atomic_store_n(&claim_held, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&fork_done, 1, __ATOMIC_RELEASE);
        }
        int code = wait_child(pid);
        if (code != CHILD_OK) {
            failed[claimed]++;
            print_message("fork %d (%s): the child %s\n", round,
                          claimed ? "while a window's claim was held" : "at a random moment",
                          code < 4 ? what[code] : "failed");
        }
    }
    __atomic_store_n(&stop_threads, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 2; i++)
        pthread_join(threads[i], NULL);
    ddheap_rate_set_closing_hook(NULL);
    dd_heap_simulate_tracer(false);
    print_message("%d of %d random forks and %d of %d forks inside a claim failed\n", failed[0],
                  RANDOM_FORKS, failed[1], CLAIMED_FORKS);
    assert_int_equal(failed[0], 0);
    assert_int_equal(failed[1], 0);
    dd_set_max_samples_per_second(0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_children_keep_a_working_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

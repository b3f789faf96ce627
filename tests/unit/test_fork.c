/*
 * sampler.c at fork: each child draws a fresh countdown from a freshly
 * seeded generator (docs/design.md, "Many processes").
 *
 * One parent forks CHILDREN children; each requests the same pattern of
 * blocks and reports the sum of the weights it was given. Bounds, derived
 * (docs/design.md, "Sampling"): a block of S bytes is sampled with
 * p = 1 - e^(-S/R) and then weighs S/p, so one child's sum has mean
 * sum(S) and variance sum(S^2 (1-p)/p) over its blocks. Independent
 * children add their variances: the total over all children must be
 * within 5 sd of CHILDREN times the truth (+ the rounding of each weight,
 * 1/2 per sample). Children in lockstep (one copy of the parent's
 * countdown each) all report the same sum, and their total errs by
 * CHILDREN times one child's error, sqrt(CHILDREN) times the bound's sd:
 * the first check below refuses identical children outright.
 *
 * Both ways a child is reseeded are run: from its pid and the clock (a
 * parent that never fixed its seed) and from the fork's number alone (a
 * test fixed the parent's seed: repeatable runs).
 */
#include "internal.h"
#include "test_main.h"

#include <math.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CHILDREN = 100, ROUNDS = 40 };
#define INTERVAL UINT64_C(262144)

static const uint64_t pattern[] = {24, 100, 700, 4096, 30000, 200000};
#define PATTERN_LEN (sizeof pattern / sizeof *pattern)

struct child_result {
    double weights;
    uint64_t samples;
};

/* The child's side: the pattern, ROUNDS times; its sum to the pipe. */
static _Noreturn void child_run(int out)
{
    struct child_result r = {0, 0};
    for (int round = 0; round < ROUNDS; round++)
        for (size_t i = 0; i < PATTERN_LEN; i++) {
            dd_alloc_req_t req = dd_allocation_requested(pattern[i], 0);
            if (req.weight) {
                r.weights += (double)req.weight;
                r.samples++;
            }
        }
    /* One write under PIPE_BUF: atomic, whatever the siblings do. */
    _exit(write(out, &r, sizeof r) == (ssize_t)sizeof r ? 0 : 1);
}

static void check_children(const char *how)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pids[CHILDREN];
    for (int i = 0; i < CHILDREN; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            close(fds[0]);
            child_run(fds[1]);
        }
        /* The parent allocates nothing between forks: every child starts
         * from the very same parent state. */
    }
    close(fds[1]);
    struct child_result got[CHILDREN];
    for (int i = 0; i < CHILDREN; i++)
        assert_int_equal(read(fds[0], &got[i], sizeof got[i]), (ssize_t)sizeof got[i]);
    close(fds[0]);
    for (int i = 0; i < CHILDREN; i++) {
        int status;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }

    double truth = 0, variance = 0, total = 0;
    uint64_t samples = 0;
    for (size_t i = 0; i < PATTERN_LEN; i++) {
        double s = (double)pattern[i], p = -expm1(-s / (double)INTERVAL);
        truth += ROUNDS * s;
        variance += ROUNDS * s * s * (1 - p) / p;
    }
    int distinct = 0;
    for (int i = 0; i < CHILDREN; i++) {
        total += got[i].weights;
        samples += got[i].samples;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = got[j].weights == got[i].weights;
        distinct += !seen;
    }
    double sum_truth = CHILDREN * truth, sd = sqrt(CHILDREN * variance);
    double bound = 5 * sd + 0.5 * (double)samples + 1;
    print_message("%s: %d distinct estimates of %d children; total/truth = %.4f (bound +-%.4f), "
                  "%llu samples\n",
                  how, distinct, CHILDREN, total / sum_truth, bound / sum_truth,
                  (unsigned long long)samples);
    /* Independent children: a tie needs two equal sums of weights drawn
     * from ~40 samples each; dozens of distinct values are expected. */
    if (distinct < 2)
        fail_msg("every child reported the same estimate (%.0f bytes): they sample in lockstep",
                 got[0].weights);
    if (fabs(total - sum_truth) > bound)
        fail_msg("children's total %.0f vs true bytes %.0f: off by %.0f, bound %.0f", total,
                 sum_truth, fabs(total - sum_truth), bound);
}

/* Before any fixed seed: children reseed from their pid and the clock. */
static void test_children_reseed_from_pid_and_clock(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(INTERVAL);
    check_children("seeded by pid and clock");
    dd_heap_simulate_tracer(false);
}

/* A fixed seed in the parent: children reseed from the fork's number. */
static void test_children_of_a_fixed_seed(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(INTERVAL);
    ddheap_test_seed_thread(2026);
    check_children("fixed parent seed");
    dd_heap_simulate_tracer(false);
}

/* Order matters: the first case must run before any fixed seed. */
DDHEAP_TEST_MAIN(cmocka_unit_test(test_children_reseed_from_pid_and_clock),
                 cmocka_unit_test(test_children_of_a_fixed_seed))

/*
 * A workload that steps its allocation rate in wall-clock time, for the
 * tests of the sampling-rate limit (src/rate.c): `threads` threads
 * allocate and free blocks of one size through the public hooks, paced to
 * a total rate of blocks per second that changes at each step, and keep,
 * per step, the ground truth the checks need:
 *
 *  - the true bytes and the sum of the weights the sampler gave;
 *  - the variance of that sum, Var = sum of S^2 (1-p)/p with
 *    p = 1 - e^(-S/R) and R the mean each block's own countdown was drawn
 *    with (read with ddheap_test_thread_mean() after every sample, which
 *    is the only moment it changes);
 *  - the samples whose weight is not the one for the R their countdown was
 *    drawn with (ddheap_test_weight(S, R)): there must be none;
 *  - for the part of the step after its first second ("measured"): the
 *    blocks allocated there (the achieved allocation rate, from which the
 *    expected sample rate is derived: a loaded machine allocates less,
 *    and expects fewer samples) and the samples whose block was drawn with
 *    an interval other than the configured one.
 *
 * Steps are separated by a pause of 2 ms in which no thread allocates, so
 * that a tracer's time stamps attribute every sample to its step.
 *
 * Pacing never catches up a debt: a thread that was descheduled resumes
 * at the step's rate from where it is, so a stall does not become a burst.
 */
#ifndef DDHEAP_TEST_RATE_STEPS_H
#define DDHEAP_TEST_RATE_STEPS_H

#include <stdint.h>
#include <stddef.h>

#define RS_MAX_STEPS 8
#define RS_MAX_THREADS 8
#define RS_MEASURE_AFTER_NS UINT64_C(1000000000) /* the issue: "after the first second" */

struct rs_step {
    double seconds;
    double blocks_per_second; /* all threads together */
};

struct rs_totals {
    uint64_t blocks;
    uint64_t samples;
    double bytes;
    double weight;
    double variance;
    uint64_t measured_blocks;
    uint64_t measured_samples;
    uint64_t measured_off_interval; /* measured samples drawn with R != the configured interval */
    uint64_t weight_mismatch; /* samples whose weight is not S/p for their own countdown's R */
};

struct rs_run {
    /* input */
    int threads;
    size_t block;
    uint64_t interval; /* the configured interval (set by the caller) */
    const struct rs_step *steps;
    int nsteps;
    /* output */
    uint64_t start_ns[RS_MAX_STEPS]; /* CLOCK_MONOTONIC */
    uint64_t end_ns[RS_MAX_STEPS];   /* every thread has stopped; 2 ms pass before the next */
    uint64_t effective_at_1s[RS_MAX_STEPS]; /* dd_get_effective_sampling_interval() 1 s in */
    uint64_t effective_at_end[RS_MAX_STEPS];
    struct rs_totals step[RS_MAX_STEPS];
};

uint64_t rs_now_ns(void);

/* Runs every step on `threads` fresh threads; returns 0, or -1 if a thread
 * could not be started. */
int rs_run(struct rs_run *run);

/* Variance of one block's weight: S^2 (1-p)/p, p = 1 - e^(-S/R). */
double rs_block_variance(double size, double mean);

#endif

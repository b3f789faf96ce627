/*
 * The stepped-rate workload of rate_steps.h as a program for a real
 * tracer (test_rate_tracer.py attaches bpftrace to it):
 *
 *     rate_workload THREADS LIMIT INTERVAL BLOCK
 *
 * Prints the weight of one block at the configured interval and its pid,
 * waits (up to 30 s) until a tracer is attached to the alloc probe and then
 * for a line on stdin (the tracer is ready), runs the steps (x100 up and
 * down, as in test_rate_steps.c)
 * with the limit and interval set through the API, prints one line of
 * ground truth per step, then waits for a line on stdin before exiting so
 * that the tracer is stopped while the process still lives.
 */
#include "rate_steps.h"

#include <ddheap.h>
#include <ddheap/testing.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: rate_workload THREADS LIMIT INTERVAL BLOCK\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    uint64_t limit = strtoull(argv[2], NULL, 10);
    uint64_t interval = strtoull(argv[3], NULL, 10);
    size_t block = (size_t)strtoull(argv[4], NULL, 10);
    double p = -expm1(-(double)block / (double)interval);
    double low = (double)limit / 4.0 / p, high = 100 * low;
    const struct rs_step steps[] = {{1.2, low}, {1.7, high}, {1.7, low}, {1.7, high}, {1.7, low}};
    struct rs_run run = {.threads = threads, .block = block, .interval = interval, .steps = steps,
                         .nsteps = (int)(sizeof steps / sizeof *steps)};

    dd_set_default_sampling_interval(interval);
    dd_set_max_samples_per_second(limit);
    /* What every sample drawn with the configured interval weighs: the
     * tracer counts the samples that weigh anything else. */
    printf("rate-workload: weight_at_interval=%llu\n",
           (unsigned long long)ddheap_test_weight(block, interval));
    printf("rate-workload: pid=%d\n", (int)getpid());
    fflush(stdout);
    for (int i = 0; i < 600 && !dd_heap_profiler_attached(); i++)
        usleep(50000);
    if (!dd_heap_profiler_attached()) {
        fprintf(stderr, "rate_workload: no tracer attached after 30 s\n");
        return 1;
    }
    printf("rate-workload: attached\n");
    fflush(stdout);
    /* The semaphore rises when the first probe is attached, before the
     * others are (docs/probes.md): the test says "go" once bpftrace has
     * run BEGIN, i.e. once every probe is in place. */
    char go[64];
    if (fgets(go, sizeof go, stdin) == NULL)
        return 1;
    if (rs_run(&run) != 0)
        return 1;
    for (int s = 0; s < run.nsteps; s++) {
        const struct rs_totals *t = &run.step[s];
        printf("step %d asked %.0f start %llu end %llu blocks %llu samples %llu bytes %.0f "
               "weight %.0f variance %.6e measured_blocks %llu measured_samples %llu "
               "measured_off %llu mismatch %llu effective_1s %llu effective_end %llu\n",
               s, steps[s].blocks_per_second, (unsigned long long)run.start_ns[s],
               (unsigned long long)run.end_ns[s], (unsigned long long)t->blocks,
               (unsigned long long)t->samples, t->bytes, t->weight, t->variance,
               (unsigned long long)t->measured_blocks, (unsigned long long)t->measured_samples,
               (unsigned long long)t->measured_off_interval,
               (unsigned long long)t->weight_mismatch,
               (unsigned long long)run.effective_at_1s[s],
               (unsigned long long)run.effective_at_end[s]);
    }
    printf("rate-workload: done\n");
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL)
        return 0;
    return 0;
}

/*
 * The stepped-rate workload of rate_steps.h. Each block goes through
 * dd_allocation_requested / created / freed exactly as a wrapper would,
 * over a per-thread buffer that stands in for the real allocator (each
 * block is freed before the next is made, so one buffer is enough).
 */
#include "rate_steps.h"

#include <ddheap.h>
#include <ddheap/testing.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t rs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t when_ns)
{
    struct timespec ts = {(time_t)(when_ns / 1000000000u), (long)(when_ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

double rs_block_variance(double size, double mean)
{
    if (mean <= 1)
        return 0; /* every block, weight = size */
    double p = -expm1(-size / mean);
    return size * size * (1 - p) / p;
}

struct worker {
    struct rs_run *run;
    int *current_step; /* shared, written by the coordinator */
    struct rs_totals step[RS_MAX_STEPS];
    unsigned char *buffer;
    pthread_t tid;
};

/* The blocks a thread allocated since its interval last changed, with that
 * interval: their variance is added in one go. */
struct segment {
    uint64_t blocks;
    uint64_t mean;
};

static void close_segment(struct segment *seg, struct rs_totals *acc, double size)
{
    acc->variance += (double)seg->blocks * rs_block_variance(size, (double)seg->mean);
    seg->blocks = 0;
}

static void one_block(struct worker *w, struct rs_totals *acc, struct segment *seg, int measured)
{
    size_t size = w->run->block;
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    void *user = dd_allocation_created(w->buffer, req);
    acc->blocks++;
    acc->bytes += (double)size;
    seg->blocks++;
    acc->measured_blocks += (uint64_t)measured;
    if (req.weight) {
        acc->samples++;
        acc->weight += (double)req.weight;
        acc->weight_mismatch += req.weight != ddheap_test_weight(size, seg->mean);
        if (measured) {
            acc->measured_samples++;
            acc->measured_off_interval += seg->mean != w->run->interval;
        }
        close_segment(seg, acc, (double)size); /* this block was drawn with seg->mean */
        seg->mean = ddheap_test_thread_mean();
    }
    dd_alloc_freed_t f = dd_allocation_freed(user, size, 0);
    if (f.ptr != w->buffer)
        abort(); /* the hooks handed back another block: nothing below would mean anything */
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct rs_run *run = w->run;
    struct segment seg = {0, 0};
    int step = -1;
    uint64_t due = 0, measured_from = 0;
    double per_thread = 0;
    /* The first block initialises the thread; from then on its mean is known. */
    for (;;) {
        int now_step = __atomic_load_n(w->current_step, __ATOMIC_ACQUIRE);
        if (now_step >= run->nsteps)
            break;
        if (now_step != step) {
            if (step >= 0)
                close_segment(&seg, &w->step[step], (double)run->block);
            step = now_step;
            per_thread = run->steps[step].blocks_per_second / run->threads;
            due = rs_now_ns();
            measured_from = run->start_ns[step] + RS_MEASURE_AFTER_NS;
            if (seg.mean == 0) {
                /* A fresh seed for every thread of every run: runs in one
                 * process must not repeat each other's sample points. */
                static uint64_t seeds;
                uint64_t n = __atomic_add_fetch(&seeds, 1, __ATOMIC_RELAXED);
                ddheap_test_seed_thread(n * UINT64_C(0x9e3779b97f4a7c15) + rs_now_ns());
                seg.mean = ddheap_test_thread_mean();
            }
        }
        /* About a millisecond's worth of blocks between two looks at the clock. */
        long chunk = (long)(per_thread / 1000.0);
        if (chunk < 1)
            chunk = 1;
        if (chunk > 4096)
            chunk = 4096;
        uint64_t now = rs_now_ns();
        int measured = now >= measured_from;
        struct rs_totals *acc = &w->step[step];
        for (long i = 0; i < chunk; i++)
            one_block(w, acc, &seg, measured);
        due += (uint64_t)((double)chunk / per_thread * 1e9);
        now = rs_now_ns();
        if (due > now)
            sleep_until(due);
        else if (now - due > UINT64_C(2000000))
            due = now; /* behind by more than 2 ms: drop the debt, never burst */
    }
    if (step >= 0)
        close_segment(&seg, &w->step[step], (double)run->block);
    return NULL;
}

int rs_run(struct rs_run *run)
{
    static int current_step;
    struct worker workers[RS_MAX_THREADS];
    int n = run->threads;
    if (n < 1 || n > RS_MAX_THREADS || run->nsteps < 1 || run->nsteps > RS_MAX_STEPS)
        return -1;
    memset(workers, 0, sizeof workers);
    memset(run->step, 0, sizeof run->step);
    __atomic_store_n(&current_step, 0, __ATOMIC_RELEASE);
    run->start_ns[0] = rs_now_ns();
    int started = 0;
    for (int i = 0; i < n; i++) {
        workers[i].run = run;
        workers[i].current_step = &current_step;
        workers[i].buffer = aligned_alloc(64, (run->block + 4096 + 63) / 64 * 64);
        if (workers[i].buffer == NULL ||
            pthread_create(&workers[i].tid, NULL, worker_main, &workers[i]) != 0)
            break;
        started++;
    }
    for (int s = 0; s < run->nsteps && started == n; s++) {
        if (s > 0) {
            run->start_ns[s] = rs_now_ns();
            __atomic_store_n(&current_step, s, __ATOMIC_RELEASE);
        }
        uint64_t end = run->start_ns[s] + (uint64_t)(run->steps[s].seconds * 1e9);
        uint64_t one_second = run->start_ns[s] + RS_MEASURE_AFTER_NS;
        if (one_second < end) {
            sleep_until(one_second);
            run->effective_at_1s[s] = dd_get_effective_sampling_interval();
        }
        sleep_until(end);
        run->effective_at_end[s] = dd_get_effective_sampling_interval();
    }
    run->start_ns[run->nsteps] = rs_now_ns();
    __atomic_store_n(&current_step, run->nsteps, __ATOMIC_RELEASE);
    for (int i = 0; i < started; i++)
        pthread_join(workers[i].tid, NULL);
    for (int i = 0; i < n; i++) {
        free(workers[i].buffer);
        for (int s = 0; s < run->nsteps; s++) {
            struct rs_totals *to = &run->step[s], *from = &workers[i].step[s];
            to->blocks += from->blocks;
            to->samples += from->samples;
            to->bytes += from->bytes;
            to->weight += from->weight;
            to->variance += from->variance;
            to->measured_blocks += from->measured_blocks;
            to->measured_samples += from->measured_samples;
            to->measured_off_interval += from->measured_off_interval;
            to->weight_mismatch += from->weight_mismatch;
        }
    }
    return started == n ? 0 : -1;
}

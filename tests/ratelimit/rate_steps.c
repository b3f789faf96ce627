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

/* The shared phase: 2 s while step s runs, 2 s + 1 in the pause after it.
 * Workers look at it before every block, so no block of one step is made
 * after the coordinator has ended it. */
static int phase;
static int parked;

static void wait_while_paused(int paused_phase)
{
    __atomic_add_fetch(&parked, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(&phase, __ATOMIC_ACQUIRE) == paused_phase) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct rs_run *run = w->run;
    struct segment seg = {0, 0};
    int step = -1;
    uint64_t due = 0, measured_from = 0;
    double per_thread = 0;
    for (;;) {
        int now_phase = __atomic_load_n(&phase, __ATOMIC_ACQUIRE);
        if (now_phase & 1) {
            wait_while_paused(now_phase);
            continue;
        }
        int now_step = now_phase / 2;
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
        long made = 0;
        while (made < chunk && __atomic_load_n(&phase, __ATOMIC_RELAXED) == now_phase) {
            one_block(w, acc, &seg, measured);
            made++;
        }
        due += (uint64_t)((double)made / per_thread * 1e9);
        now = rs_now_ns();
        if (due > now && made == chunk)
            sleep_until(due);
        else if (now > due && now - due > UINT64_C(2000000))
            due = now; /* behind by more than 2 ms: drop the debt, never burst */
    }
    if (step >= 0)
        close_segment(&seg, &w->step[step], (double)run->block);
    return NULL;
}

/* Ends the running step: every worker parked, then a pause of 2 ms, so
 * that a tracer's time stamps tell the steps apart with no overlap. */
static void end_step(struct rs_run *run, int s)
{
    __atomic_store_n(&parked, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&phase, 2 * s + 1, __ATOMIC_RELEASE);
    uint64_t give_up = rs_now_ns() + UINT64_C(1000000000);
    while (__atomic_load_n(&parked, __ATOMIC_ACQUIRE) < run->threads && rs_now_ns() < give_up) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    run->end_ns[s] = rs_now_ns();
    sleep_until(run->end_ns[s] + UINT64_C(2000000));
}

int rs_run(struct rs_run *run)
{
    struct worker workers[RS_MAX_THREADS];
    int n = run->threads;
    if (n < 1 || n > RS_MAX_THREADS || run->nsteps < 1 || run->nsteps > RS_MAX_STEPS)
        return -1;
    memset(workers, 0, sizeof workers);
    memset(run->step, 0, sizeof run->step);
    run->start_ns[0] = rs_now_ns();
    __atomic_store_n(&phase, 0, __ATOMIC_RELEASE);
    int started = 0;
    for (int i = 0; i < n; i++) {
        workers[i].run = run;
        workers[i].buffer = aligned_alloc(64, (run->block + 4096 + 63) / 64 * 64);
        if (workers[i].buffer == NULL ||
            pthread_create(&workers[i].tid, NULL, worker_main, &workers[i]) != 0)
            break;
        started++;
    }
    for (int s = 0; s < run->nsteps && started == n; s++) {
        if (s > 0) {
            run->start_ns[s] = rs_now_ns();
            __atomic_store_n(&phase, 2 * s, __ATOMIC_RELEASE);
        }
        uint64_t end = run->start_ns[s] + (uint64_t)(run->steps[s].seconds * 1e9);
        uint64_t one_second = run->start_ns[s] + RS_MEASURE_AFTER_NS;
        if (one_second < end) {
            sleep_until(one_second);
            run->effective_at_1s[s] = dd_get_effective_sampling_interval();
        }
        sleep_until(end);
        run->effective_at_end[s] = dd_get_effective_sampling_interval();
        end_step(run, s);
    }
    __atomic_store_n(&phase, 2 * run->nsteps, __ATOMIC_RELEASE);
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

/*
 * The process-wide sampling-rate limit (DESIGN §10, docs/performance.md
 * "Rate limit"): one budget of samples per second for every thread and
 * every copy of ddheap in the process.
 *
 * How it works. Every sample taken by the Poisson sampler reports its
 * weight here. The weights are the sampler's own unbiased estimate of the
 * bytes allocated, whatever interval each countdown was drawn with, so
 * summing them over a window and dividing by its length estimates the
 * process's allocation rate B in bytes per second. At a mean interval M a
 * stream of blocks small against M is sampled B/M times a second, so the
 * interval that meets a limit of L samples per second is B/L. That is the
 * "needed mean" published at the end of each window; a thread draws its
 * next countdown with max(configured interval, needed mean) (sampler.c).
 * The estimate does not depend on the interval in force, so there is no
 * feedback loop to oscillate: each window measures demand afresh. Blocks
 * larger than M are sampled less often than B/M says, so the limit is met
 * from below.
 *
 * Windows. A window closes at the first sample after WINDOW_NS, or as soon
 * as it holds a quota of L/QUOTA_DIVISOR samples. The quota is what keeps a
 * sudden rise of the allocation rate from flooding the tracer: at any rate,
 * the burst before the interval is raised is one quota (plus one sample per
 * thread, whose countdown was already drawn), 1/40 of a second's budget. A
 * window closed by its quota measured the time K samples took; (K-1)/T is
 * the unbiased rate estimate for that (Gamma) time, hence the correction.
 *
 * Several copies. The state is one STB_GNU_UNIQUE object, ddheap_rate_v1,
 * bound by the dynamic linker to one definition in the process, as
 * ddheap_shared_v3 is (src/shared.c). The needed mean is in bytes, so each
 * copy applies it to its own configured interval.
 *
 * Hazards: this runs inside someone's malloc, on the sampled path only. No
 * lock (atomics only; a lost race only moves a sample to the next window),
 * no allocation, no libm; the clock is the vDSO's CLOCK_MONOTONIC, bound
 * in ddheap_process_init before any allocation can need it; errno is kept.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime in strict C11 */
#include "internal.h"

#include <errno.h>
#include <time.h>

#define WINDOW_NS UINT64_C(100000000) /* 100 ms */
#define QUOTA_DIVISOR 40              /* a window's quota: 1/40 of a second's samples */
#define QUOTA_MIN 4
#define MAX_NEEDED_MEAN (UINT64_C(1) << 58) /* draw_countdown's range */

/* Limit origin: the API wins over the environment, whichever comes first. */
enum { LIMIT_UNSET = 0, LIMIT_FROM_ENV = 1, LIMIT_FROM_API = 2 };

struct ddheap__rate {
    /* Written by every sample while a limit is set. */
    uint64_t window_start_ns; /* 0: no window open yet */
    uint64_t window_samples;
    uint64_t window_weight; /* saturating sum of the window's weights */
    uint64_t line0_pad[5];
    /* Read by every sample, written at the end of a window or by the API. */
    uint64_t limit;       /* samples per second; 0: no limit */
    uint64_t limit_from;  /* LIMIT_* */
    uint64_t needed_mean; /* bytes; 0 while the limit does not bind */
    uint64_t windows;     /* windows closed since the limit was set */
    uint64_t line1_pad[4];
};

#define DDHEAP_RATE_SIZE 128 /* sizeof(struct ddheap__rate) */
#define DDHEAP_STR2(x) #x
#define DDHEAP_STR(x) DDHEAP_STR2(x)

_Static_assert(sizeof(struct ddheap__rate) == DDHEAP_RATE_SIZE,
               "update DDHEAP_RATE_SIZE (and the _v suffix if the layout changed)");

/* Defined in assembly, as ddheap_shared_v3 is, to get the unique binding
 * (and no sanitizer instrumentation symbols outside ddheap's namespace). */
__asm__(".pushsection .bss.ddheap_rate_v1,\"aw\",%nobits\n"
        ".globl ddheap_rate_v1\n"
        ".type ddheap_rate_v1, %gnu_unique_object\n"
        ".size ddheap_rate_v1, " DDHEAP_STR(DDHEAP_RATE_SIZE) "\n"
        ".balign 64\n"
        "ddheap_rate_v1:\n"
        ".zero " DDHEAP_STR(DDHEAP_RATE_SIZE) "\n"
        ".popsection\n");

extern struct ddheap__rate ddheap_rate_v1 __attribute__((visibility("default")));

static uint64_t monotonic_ns(void)
{
    int saved_errno = errno;
    struct timespec ts;
    uint64_t ns = 0;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0)
        ns = (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
    errno = saved_errno;
    return ns;
}

void ddheap_rate_process_init(void)
{
    (void)monotonic_ns(); /* binds clock_gettime */
}

static void reset_window(struct ddheap__rate *r)
{
    __atomic_store_n(&r->needed_mean, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->window_samples, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->window_weight, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->windows, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->window_start_ns, 0, __ATOMIC_RELEASE);
}

void ddheap_rate_set_limit(uint64_t samples_per_second, bool from_api)
{
    struct ddheap__rate *r = &ddheap_rate_v1;
    if (from_api) {
        __atomic_store_n(&r->limit_from, LIMIT_FROM_API, __ATOMIC_RELAXED);
    } else {
        /* The environment is the same for every copy: the first one to
         * read it sets the limit, unless the API already did. */
        uint64_t unset = LIMIT_UNSET;
        if (!__atomic_compare_exchange_n(&r->limit_from, &unset, LIMIT_FROM_ENV, false,
                                         __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return;
    }
    __atomic_store_n(&r->limit, samples_per_second, __ATOMIC_RELAXED);
    reset_window(r);
}

void ddheap_rate_forget_limit(void)
{
    __atomic_store_n(&ddheap_rate_v1.limit_from, LIMIT_UNSET, __ATOMIC_RELAXED);
}

uint64_t ddheap_rate_limit(void)
{
    return __atomic_load_n(&ddheap_rate_v1.limit, __ATOMIC_RELAXED);
}

uint64_t ddheap_rate_needed_mean(void)
{
    if (__atomic_load_n(&ddheap_rate_v1.limit, __ATOMIC_RELAXED) == 0)
        return 0;
    return __atomic_load_n(&ddheap_rate_v1.needed_mean, __ATOMIC_RELAXED);
}

uint64_t ddheap_rate_windows(void)
{
    return __atomic_load_n(&ddheap_rate_v1.windows, __ATOMIC_RELAXED);
}

static void add_saturating(uint64_t *sum, uint64_t value)
{
    uint64_t now = __atomic_load_n(sum, __ATOMIC_RELAXED);
    uint64_t next;
    do {
        next = now > UINT64_MAX - value ? UINT64_MAX : now + value;
    } while (!__atomic_compare_exchange_n(sum, &now, next, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
}

static uint64_t window_quota(uint64_t limit)
{
    uint64_t quota = limit / QUOTA_DIVISOR;
    return quota < QUOTA_MIN ? QUOTA_MIN : quota;
}

/* window_start_ns while a closer swaps the counters out: nobody else may
 * close (or open) a window then. Without it, a sample counted between the
 * closer's claim and its swap could find the old window's count in the new
 * one, close that after a microsecond, and publish a mean 10^5 times too
 * large: a blackout of every thread's sampling for seconds. */
#define WINDOW_CLOSING UINT64_MAX

/* The window that began `elapsed` ns ago ends now; this thread won the
 * right to close it (window_start_ns reads WINDOW_CLOSING). */
static uint64_t close_window(struct ddheap__rate *r, uint64_t limit, uint64_t quota,
                             uint64_t elapsed)
{
    uint64_t samples = __atomic_exchange_n(&r->window_samples, 0, __ATOMIC_RELAXED);
    uint64_t weight = __atomic_exchange_n(&r->window_weight, 0, __ATOMIC_RELAXED);
    double bytes = (double)weight;
    if (samples >= quota && elapsed < WINDOW_NS)
        bytes *= (double)(samples - 1) / (double)samples; /* closed by its quota */
    double seconds = (double)(elapsed < 1000 ? 1000 : elapsed) * 1e-9;
    double needed = bytes / seconds / (double)limit;
    uint64_t mean = needed >= (double)MAX_NEEDED_MEAN ? MAX_NEEDED_MEAN : (uint64_t)needed;
    __atomic_store_n(&r->needed_mean, mean, __ATOMIC_RELAXED);
    __atomic_add_fetch(&r->windows, 1, __ATOMIC_RELAXED);
    return mean;
}

uint64_t ddheap_rate_record(uint64_t weight)
{
    struct ddheap__rate *r = &ddheap_rate_v1;
    uint64_t limit = __atomic_load_n(&r->limit, __ATOMIC_RELAXED);
    if (limit == 0)
        return 0;
    uint64_t now = monotonic_ns();
    uint64_t start = __atomic_load_n(&r->window_start_ns, __ATOMIC_ACQUIRE);
    if (start == WINDOW_CLOSING) { /* counted in the window being closed, or the next */
        __atomic_add_fetch(&r->window_samples, 1, __ATOMIC_RELAXED);
        add_saturating(&r->window_weight, weight);
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    }
    if (start == 0) { /* the first sample under this limit opens the first window */
        if (__atomic_compare_exchange_n(&r->window_start_ns, &start, now, false,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return 0;
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    }
    uint64_t samples = __atomic_add_fetch(&r->window_samples, 1, __ATOMIC_RELAXED);
    add_saturating(&r->window_weight, weight);
    uint64_t elapsed = now > start ? now - start : 0;
    uint64_t quota = window_quota(limit);
    if (samples < quota && elapsed < WINDOW_NS)
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    /* One thread closes the window: the one that claims its start. A sample
     * another thread counts meanwhile lands in either window. The next
     * window opens once the counters are swapped out. */
    if (!__atomic_compare_exchange_n(&r->window_start_ns, &start, WINDOW_CLOSING, false,
                                     __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    uint64_t mean = close_window(r, limit, quota, elapsed);
    uint64_t opened = WINDOW_CLOSING; /* unless the API reset the window meanwhile */
    __atomic_compare_exchange_n(&r->window_start_ns, &opened, now ? now : 1, false,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    return mean;
}

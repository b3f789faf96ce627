/*
 * The process-wide sampling-rate limit (docs/design.md, docs/performance.md
 * "Rate limit"): one budget of samples per second for every thread and
 * every copy of ddheap in the process, with a burst of one second's worth.
 *
 * How it works. Every sample taken by the Poisson sampler reports its
 * weight here. The weights are the sampler's own unbiased estimate of the
 * bytes allocated, whatever interval each countdown was drawn with, so
 * summing them over a window and dividing by its length estimates the
 * process's allocation rate B in bytes per second. At a mean interval M a
 * stream of blocks small against M is sampled B/M times a second, so the
 * interval that meets a limit of L samples per second is B/L: the
 * "measured mean" of each window. The estimate does not depend on the
 * interval in force, so there is no feedback loop to oscillate: each
 * window measures demand afresh. Blocks larger than M are sampled less
 * often than B/M says, so the limit is met from below.
 *
 * The burst. The measured mean is published as the "needed mean" only
 * while the process is limited; a thread draws its next countdown with
 * max(configured interval, needed mean) (sampler.c). Limited is decided by
 * a token bucket of L samples (one second's worth) refilled at L a second:
 * a process becomes limited at the sample that empties the bucket, and
 * stops being limited when the bucket is full again. So a program that
 * takes fewer than L (1 + its duration in seconds) samples is never limited
 * and samples at the configured interval throughout; over any time T the
 * process takes about L (T + 1) samples at most (the estimate, not the
 * bucket, holds the rate at L once limited). The bucket is one word, the
 * time at which it would be full again (generic cell rate algorithm,
 * "theoretical arrival time"): each sample moves it 1/L s forward, at
 * most one second past now.
 *
 * Windows. A window closes at the first sample after WINDOW_NS, or as soon
 * as it holds a quota of L/QUOTA_DIVISOR samples. The quota is what makes
 * the measured mean follow a sudden rise within 1/40 of a second's budget.
 * A window closed by its quota measured the time K samples took; (K-1)/T
 * is the unbiased rate estimate for that (Gamma) time, hence the
 * correction.
 *
 * Fork. The one state in flight is a window being closed: its start word
 * holds a claim while the closer swaps the counters out. The claim names
 * the process and the time it was made (claim_word), so a child forked
 * meanwhile, in which the closing thread does not exist, sees a claim that
 * is not its own and reopens the window at its next sample. A claim older
 * than a second is taken over as well (a child in a new pid namespace may
 * have its parent's pid); a closer that was merely stalled that long then
 * publishes nothing. The bucket and the published means are single words:
 * nothing else can be caught half-written.
 *
 * Several copies. The state is one STB_GNU_UNIQUE object, ddheap_rate_v2,
 * bound by the dynamic linker to one definition in the process, as
 * ddheap_shared_v3 is (src/shared.c). The needed mean is in bytes, so each
 * copy applies it to its own configured interval.
 *
 * Hazards: this runs inside someone's malloc, on the sampled path only. No
 * lock (atomics only; a lost race only moves a sample to the next window),
 * no allocation, no libm; the clock is the vDSO's CLOCK_MONOTONIC and
 * getpid is a plain system call, both bound in ddheap_process_init before
 * any allocation can need them; errno is kept.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime in strict C11 */
#include "internal.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

#define WINDOW_NS UINT64_C(100000000) /* 100 ms */
#define QUOTA_DIVISOR 40              /* a window's quota: 1/40 of a second's samples */
#define QUOTA_MIN 4
#define MAX_NEEDED_MEAN (UINT64_C(1) << 58) /* draw_countdown's range */
#define NS_PER_S UINT64_C(1000000000)
#define BURST_NS NS_PER_S /* the bucket holds one second's worth of samples */

/* Limit origin: the API wins over the environment, whichever comes first. */
enum { LIMIT_UNSET = 0, LIMIT_FROM_ENV = 1, LIMIT_FROM_API = 2 };

struct ddheap__rate {
    /* Written by every sample while a limit is set. */
    uint64_t window_start_ns; /* 0: no window open yet; a claim_word while closing */
    uint64_t window_samples;
    uint64_t window_weight; /* saturating sum of the window's weights */
    uint64_t bucket_full_ns; /* token bucket: when it is full again (<= now: full) */
    uint64_t line0_pad[4];
    /* Read by every sample, written at the end of a window, when the
     * bucket empties or fills, or by the API. */
    uint64_t limit;         /* samples per second; 0: no limit */
    uint64_t limit_from;    /* LIMIT_* */
    uint64_t needed_mean;   /* bytes: measured_mean while limited, else 0 */
    uint64_t windows;       /* windows closed since the limit was set */
    uint64_t measured_mean; /* B/L as the last window closed measured it */
    uint64_t limited;       /* 1 from the sample that emptied the bucket until it is full */
    uint64_t line1_pad[2];
};

#define DDHEAP_RATE_SIZE 128 /* sizeof(struct ddheap__rate) */
#define DDHEAP_STR2(x) #x
#define DDHEAP_STR(x) DDHEAP_STR2(x)

_Static_assert(sizeof(struct ddheap__rate) == DDHEAP_RATE_SIZE,
               "update DDHEAP_RATE_SIZE (and the _v suffix if the layout changed)");

/* Defined in assembly, as ddheap_shared_v3 is, to get the unique binding
 * (and no sanitizer instrumentation symbols outside ddheap's namespace).
 * v2: the burst's bucket and the claim that names its process (v1 had a
 * claim a forked child could not tell from its own). */
__asm__(".pushsection .bss.ddheap_rate_v2,\"aw\",%nobits\n"
        ".globl ddheap_rate_v2\n"
        ".type ddheap_rate_v2, %gnu_unique_object\n"
        ".size ddheap_rate_v2, " DDHEAP_STR(DDHEAP_RATE_SIZE) "\n"
        ".balign 64\n"
        "ddheap_rate_v2:\n"
        ".zero " DDHEAP_STR(DDHEAP_RATE_SIZE) "\n"
        ".popsection\n");

extern struct ddheap__rate ddheap_rate_v2 __attribute__((visibility("default")));

/* A test hook (ddheap_rate_set_closing_hook); static, so that no global
 * variable of the archive gets a sanitizer's ODR symbol beside it. */
static void (*closing_hook)(void);

void ddheap_rate_set_closing_hook(void (*hook)(void))
{
    __atomic_store_n(&closing_hook, hook, __ATOMIC_RELEASE);
}

static uint64_t monotonic_ns(void)
{
    int saved_errno = errno;
    struct timespec ts;
    uint64_t ns = 0;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) == 0)
        ns = (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
    errno = saved_errno;
    return ns;
}

void ddheap_rate_process_init(void)
{
    (void)monotonic_ns(); /* binds clock_gettime */
    (void)getpid();       /* binds getpid (claims, below) */
}

static void reset_window(struct ddheap__rate *r)
{
    __atomic_store_n(&r->limited, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->needed_mean, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->measured_mean, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->bucket_full_ns, 0, __ATOMIC_RELAXED); /* full */
    __atomic_store_n(&r->window_samples, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->window_weight, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->windows, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->window_start_ns, 0, __ATOMIC_RELEASE);
}
void ddheap_rate_set_limit(uint64_t samples_per_second, bool from_api)
{
    struct ddheap__rate *r = &ddheap_rate_v2;
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
    __atomic_store_n(&ddheap_rate_v2.limit_from, LIMIT_UNSET, __ATOMIC_RELAXED);
}

uint64_t ddheap_rate_limit(void)
{
    return __atomic_load_n(&ddheap_rate_v2.limit, __ATOMIC_RELAXED);
}

uint64_t ddheap_rate_needed_mean(void)
{
    if (__atomic_load_n(&ddheap_rate_v2.limit, __ATOMIC_RELAXED) == 0)
        return 0;
    return __atomic_load_n(&ddheap_rate_v2.needed_mean, __ATOMIC_RELAXED);
}

uint64_t ddheap_rate_windows(void)
{
    return __atomic_load_n(&ddheap_rate_v2.windows, __ATOMIC_RELAXED);
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
 * large: a blackout of every thread's sampling for seconds.
 *
 * A claim is CLAIM_BIT | pid << CLAIM_PID_SHIFT | the time it was made in
 * units of 2^20 ns (about a millisecond) modulo 2^CLAIM_PID_SHIFT (36
 * years); a start time is below 2^63 ns (292 years of CLOCK_MONOTONIC),
 * so the two never meet. Linux pids are below 2^22 (PID_MAX_LIMIT), so
 * the pid fits the 23 bits left. */
#define CLAIM_BIT (UINT64_C(1) << 63)
#define CLAIM_PID_SHIFT 40
#define CLAIM_TIME_SHIFT 20
#define CLAIM_TIME_MASK ((UINT64_C(1) << CLAIM_PID_SHIFT) - 1)
#define CLAIM_STALE_UNITS (NS_PER_S >> CLAIM_TIME_SHIFT) /* about a second */

static uint64_t claim_word(uint64_t now)
{
    uint64_t pid = (uint64_t)getpid() & ((UINT64_C(1) << (63 - CLAIM_PID_SHIFT)) - 1);
    return CLAIM_BIT | pid << CLAIM_PID_SHIFT | ((now >> CLAIM_TIME_SHIFT) & CLAIM_TIME_MASK);
}

/* Whether a claim can no longer be finished by its closer: it was made in
 * another process (this is a child forked while it was held) or more than
 * a second ago. */
static bool claim_is_stale(uint64_t claim, uint64_t now)
{
    uint64_t mine = claim_word(now);
    if ((claim ^ mine) >> CLAIM_PID_SHIFT)
        return true;
    uint64_t age = (mine - claim) & CLAIM_TIME_MASK;
    return age > CLAIM_STALE_UNITS && age < CLAIM_TIME_MASK / 2;
}

/* The window that began `elapsed` ns ago ends now; this thread won the
 * right to close it (window_start_ns holds its `claim`). It publishes
 * only if the claim is still its own: a closer stalled for over a second
 * may find that another thread took over (claim_is_stale) and opened a
 * window since, whose counts it has just swapped out with its own; its
 * estimate would mix the two over the old window's length. */
static void close_window(struct ddheap__rate *r, uint64_t limit, uint64_t quota,
                         uint64_t elapsed, uint64_t claim)
{
    uint64_t samples = __atomic_exchange_n(&r->window_samples, 0, __ATOMIC_RELAXED);
    uint64_t weight = __atomic_exchange_n(&r->window_weight, 0, __ATOMIC_RELAXED);
    double bytes = (double)weight;
    if (samples >= quota && elapsed < WINDOW_NS)
        bytes *= (double)(samples - 1) / (double)samples; /* closed by its quota */
    double seconds = (double)(elapsed < 1000 ? 1000 : elapsed) * 1e-9;
    double needed = bytes / seconds / (double)limit;
    uint64_t mean = needed >= (double)MAX_NEEDED_MEAN ? MAX_NEEDED_MEAN : (uint64_t)needed;
    if (__atomic_load_n(&r->window_start_ns, __ATOMIC_RELAXED) != claim)
        return;
    __atomic_store_n(&r->measured_mean, mean, __ATOMIC_RELAXED);
    if (__atomic_load_n(&r->limited, __ATOMIC_RELAXED))
        __atomic_store_n(&r->needed_mean, mean, __ATOMIC_RELAXED);
    __atomic_add_fetch(&r->windows, 1, __ATOMIC_RELAXED);
}

/* Takes one sample's token from the bucket. Returns -1 when that emptied
 * it (or it was empty), 1 when it was full before, else 0. An empty
 * bucket stays at empty: no debt beyond it, so a process limited for a
 * long time is not kept limited for as long once its rate falls. */
static int take_token(struct ddheap__rate *r, uint64_t limit, uint64_t now)
{
    uint64_t cost = NS_PER_S / limit; /* 0 above 10^9 a second: never empties */
    uint64_t full_at = __atomic_load_n(&r->bucket_full_ns, __ATOMIC_RELAXED);
    for (;;) {
        int state = full_at <= now ? 1 : 0;
        uint64_t next = (state ? now : full_at) + cost;
        if (next - now > BURST_NS) {
            next = now + BURST_NS;
            state = -1;
        }
        if (__atomic_compare_exchange_n(&r->bucket_full_ns, &full_at, next, true,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return state;
    }
}

/* Limited from the sample that empties the bucket (the measured mean is
 * published at once) to the one that finds it full again. Two threads
 * crossing over publish in either order; the next window close or bucket
 * change sets it right. */
static void follow_bucket(struct ddheap__rate *r, int state)
{
    uint64_t limited = __atomic_load_n(&r->limited, __ATOMIC_RELAXED);
    if (state < 0 && !limited) {
        __atomic_store_n(&r->limited, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&r->needed_mean, __atomic_load_n(&r->measured_mean, __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
    } else if (state > 0 && limited) {
        __atomic_store_n(&r->limited, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&r->needed_mean, 0, __ATOMIC_RELAXED);
    }
}

/* Counts a sample in whichever window is open (or being closed); returns
 * the window's count with it. */
static uint64_t count_sample(struct ddheap__rate *r, uint64_t weight)
{
    uint64_t samples = __atomic_add_fetch(&r->window_samples, 1, __ATOMIC_RELAXED);
    add_saturating(&r->window_weight, weight);
    return samples;
}

uint64_t ddheap_rate_record(uint64_t weight)
{
    struct ddheap__rate *r = &ddheap_rate_v2;
    uint64_t limit = __atomic_load_n(&r->limit, __ATOMIC_RELAXED);
    if (limit == 0)
        return 0;
    uint64_t now = monotonic_ns();
    follow_bucket(r, take_token(r, limit, now));
    uint64_t start = __atomic_load_n(&r->window_start_ns, __ATOMIC_ACQUIRE);
    if (start & CLAIM_BIT) {
        if (!claim_is_stale(start, now)) { /* counted in the window being closed, or the next */
            (void)count_sample(r, weight);
            return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
        }
        /* The closer is gone (a fork copied its claim, without it): this
         * sample opens the next window, as the first sample does. */
        if (__atomic_compare_exchange_n(&r->window_start_ns, &start, now ? now : 1, false,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            __atomic_store_n(&r->window_samples, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&r->window_weight, 0, __ATOMIC_RELAXED);
        }
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    }
    if (start == 0) { /* the first sample under this limit opens the first window */
        __atomic_compare_exchange_n(&r->window_start_ns, &start, now ? now : 1, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    }
    uint64_t samples = count_sample(r, weight);
    uint64_t elapsed = now > start ? now - start : 0;
    uint64_t quota = window_quota(limit);
    if (samples < quota && elapsed < WINDOW_NS)
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    /* One thread closes the window: the one that claims its start. A sample
     * another thread counts meanwhile lands in either window. The next
     * window opens once the counters are swapped out. */
    uint64_t claim = claim_word(now);
    if (!__atomic_compare_exchange_n(&r->window_start_ns, &start, claim, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
    void (*hook)(void) = __atomic_load_n(&closing_hook, __ATOMIC_ACQUIRE);
    if (hook)
        hook(); /* tests: a fork while the claim is held */
    close_window(r, limit, quota, elapsed, claim);
    uint64_t opened = claim; /* unless the API reset the window, or a child took over */
    __atomic_compare_exchange_n(&r->window_start_ns, &opened, now ? now : 1, false,
                                __ATOMIC_RELEASE, __ATOMIC_RELAXED);
    return __atomic_load_n(&r->needed_mean, __ATOMIC_RELAXED);
}

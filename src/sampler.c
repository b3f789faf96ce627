/*
 * The cold path of one allocation, top to bottom: the fast path saw the
 * thread's countdown run out inside a block (ddheap__sample_request), the
 * real allocation happened, the block is marked and reported
 * (ddheap__sample_created); later the free path recognised the mark
 * (ddheap__release).
 *
 * Sampling math (docs/design.md, "Sampling"). Each thread runs a Poisson process over the
 * bytes it allocates: the countdown to the next sample point is drawn from
 * Exp(R). The process is memoryless, so whatever came before, a block of
 * S bytes contains at least one point with probability p = 1 - e^(-S/R).
 * Such a block is sampled once (however many points it spans) with weight
 * S/p, so E[weight] = p * S/p = S: summed weights estimate allocated bytes
 * without bias, and Var = S^2 (1-p)/p, which vanishes for S >> R. After a
 * sampled block the next countdown is drawn afresh from the block's end,
 * which memorylessness makes exact. The R a countdown was drawn with is
 * stored beside it, so a change of interval never mixes two R's in one
 * weight. Countdowns are whole bytes, floor(X): floor(X) < S exactly when
 * X < S for whole S, so the integer countdown keeps p exact.
 *
 * R = 1 is not the Poisson process at R = 1 (which would sample a 1-byte
 * block with p = 0.63 and weight 1.58): it samples every non-empty block
 * with weight = size, for exact tests and small leak hunts.
 *
 * Hazards: the cold path runs inside someone's malloc. It allocates
 * nothing, takes no lock, calls no libm, keeps errno, and a reentrant call
 * on the same thread (a signal handler that allocates) passes through
 * unsampled.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, getpid, pthread_atfork in strict C11 */
#include "internal.h"
#include "mark.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

__thread struct ddheap__thread ddheap__thread_state __attribute__((tls_model(DDHEAP__TLS_MODEL)));

/* Process configuration. `interval` and `epoch` change at run time through
 * the API; a thread adopts them when its epoch differs from the global one. */
static struct {
    uint64_t interval;
    uint32_t epoch;
    uint8_t enabled;
    uint8_t state; /* 0: environment not read yet, 1: read */
    uint8_t interval_from_api;
} config = {.epoch = 1}; /* a new thread's epoch, 0, never matches it */

static uint64_t thread_counter;

/* Mixed into the seed of every thread this process starts; drawn anew in
 * each forked child (fresh_draw_in_child), so that the threads siblings
 * start are not seeded alike. 0 in the first process. */
static uint64_t process_salt;

static void read_config_once(void)
{
    if (__atomic_load_n(&config.state, __ATOMIC_ACQUIRE))
        return;
    struct ddheap_config env = ddheap_read_environment();
    __atomic_store_n(&config.enabled, env.enabled, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&config.interval_from_api, __ATOMIC_RELAXED))
        __atomic_store_n(&config.interval, env.interval, __ATOMIC_RELAXED);
    ddheap_rate_set_limit(env.samples_per_second, false); /* unless the API set it */
    /* Binds clock_gettime here, with getenv: no sample can be taken before
     * the configuration is read, so the controller never calls it unbound
     * (the constructor normally gets here before any allocation). */
    ddheap_rate_process_init();
    __atomic_add_fetch(&config.epoch, 1, __ATOMIC_RELEASE);
    __atomic_store_n(&config.state, 1, __ATOMIC_RELEASE);
}

void ddheap_process_init(void)
{
    int saved = errno; /* binds __errno_location */
    (void)ddheap_process_secret(0); /* binds getauxval; keys wait for the first mark */
#if !DDHEAP_MARK_TBI
    ddheap_register_free_gate();
#endif
    read_config_once();   /* binds getenv, write, clock_gettime, getpid */
#if DDHEAP_MARK_TBI && DDHEAP_LIVE_HEAP
    ddheap_tbi_process_init(__atomic_load_n(&config.enabled, __ATOMIC_RELAXED)); /* binds prctl */
#endif
#if DDHEAP_MARK_SHADOW && DDHEAP_LIVE_HEAP
    ddheap_shadow_process_init(); /* binds mmap, munmap */
#endif
    errno = saved;
}

static void register_fork_handlers(void);

/* Before main, for everything loaded at start-up; dlopen'ed copies run it
 * at load. An allocation that comes earlier still initialises on demand. */
__attribute__((constructor)) static void ddheap_constructor(void)
{
    ddheap_process_init();
    register_fork_handlers();
}

/* splitmix64: a 64-bit state walked by a Weyl sequence and hashed; every
 * state is valid and the output passes BigCrush. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t next_random(struct ddheap__thread *t)
{
    return mix64(t->rng += UINT64_C(0x9e3779b97f4a7c15));
}

static uint64_t draw_countdown(struct ddheap__thread *t, uint64_t mean)
{
    if (mean <= 1)
        return 0;
    double gap = ddheap_exponential(next_random(t)) * (double)mean;
    /* Exp(1) <= 36.8 here (53-bit uniforms), so only a mean above 2^58
     * could overflow the gap: clamp. */
    return gap >= 0x1p64 ? UINT64_MAX : (uint64_t)gap;
}

static uint64_t weight_of(uint64_t size, uint64_t mean)
{
    if (mean <= 1)
        return size;
    double p = ddheap_one_minus_exp_neg((double)size / (double)mean);
    double w = (double)size / p + 0.5;
    if (w >= 0x1p64)
        return UINT64_MAX;
    uint64_t weight = (uint64_t)w;
    return weight < size ? size : weight; /* S/p >= S; guards rounding */
}

/* The mean the next countdown is drawn with: the configured interval, or
 * the larger one the rate limit needs (src/rate.c). R = 1, the exact mode,
 * is never limited: whoever asks for every allocation gets every one. */
static uint64_t effective_interval(void)
{
    uint64_t interval = __atomic_load_n(&config.interval, __ATOMIC_RELAXED);
    if (interval <= 1)
        return interval;
    uint64_t needed = ddheap_rate_needed_mean();
    return needed > interval ? needed : interval;
}

/* Takes the current interval (and, on first use, a seed). A fresh
 * countdown starts a fresh Poisson process, unbiased from here on. Out of
 * line, as is sample_point(): a sampled allocation's common path then needs
 * no saved registers. */
__attribute__((noinline)) static void adopt_config(struct ddheap__thread *t)
{
    read_config_once();
    uint32_t epoch = __atomic_load_n(&config.epoch, __ATOMIC_ACQUIRE);
    if (t->mean == 0) {
        uint64_t n = __atomic_add_fetch(&thread_counter, 1, __ATOMIC_RELAXED);
        t->rng = ddheap_process_secret(3) ^ ((uintptr_t)t * UINT64_C(0x9e3779b97f4a7c15)) ^
                 (n << 32) ^ __atomic_load_n(&process_salt, __ATOMIC_RELAXED);
    }
    t->epoch = epoch;
    if (!__atomic_load_n(&config.enabled, __ATOMIC_RELAXED)) {
        t->mean = UINT64_MAX; /* non-zero: initialised */
        t->countdown = UINT64_MAX;
        return;
    }
    t->mean = effective_interval();
    t->countdown = draw_countdown(t, t->mean);
}

/*
 * Fork (docs/design.md, "Many processes"). The child's one thread is a
 * copy of the forking thread: the same countdown and the same generator
 * state, so siblings would take the same sample points and the error of a
 * sum over them would not shrink with their number. The child draws a
 * fresh countdown from a freshly seeded generator instead. Memorylessness
 * makes that exact: the bytes after a fresh draw start a new Poisson
 * process, whatever the old countdown had left, so every weight (computed
 * with the mean stored beside the countdown, kept) stays unbiased.
 *
 * The new seed mixes the parent's state, the number of the fork in the
 * parent, and, unless a test fixed the thread's seed (then a run must be
 * repeatable, and the fork number alone tells siblings apart), the
 * child's pid and the monotonic clock: AT_RANDOM, the process secret and
 * the thread's address are all inherited, so only these differ.
 *
 * Each copy of the library in a process has its own thread state and
 * registers its own handlers, from its constructor: pthread_atfork may
 * allocate, so never from inside malloc. The child handler runs after
 * fork returns in the child, outside any allocator call unless fork was
 * called from a signal handler that interrupted one: it then rewrites the
 * countdown the interrupted fast path is about to store, which costs at
 * most one sample's independence, never a wrong weight (the mean stays).
 * It takes no lock and allocates nothing; clock_gettime and getpid were
 * bound by ddheap_process_init.
 */
static uint64_t forks_started;

static void count_fork(void)
{
    __atomic_add_fetch(&forks_started, 1, __ATOMIC_RELAXED);
}

static void fresh_draw_in_child(void)
{
    int saved_errno = errno;
    struct ddheap__thread *t = &ddheap__thread_state;
    uint64_t entropy = mix64(__atomic_load_n(&forks_started, __ATOMIC_RELAXED) *
                             UINT64_C(0x9e3779b97f4a7c15));
    if (!t->seed_fixed) {
        struct timespec ts = {0, 0};
        (void)clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t now = (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
        entropy ^= mix64(((uint64_t)getpid() << 32) ^ now);
    }
    __atomic_store_n(&process_salt, mix64(process_salt ^ entropy), __ATOMIC_RELAXED);
    if (t->mean != 0) { /* the thread had a generator: reseed it */
        t->rng = mix64(t->rng ^ entropy);
        if (t->mean != UINT64_MAX) /* not parked (sampling disabled) */
            t->countdown = draw_countdown(t, t->mean);
    }
    errno = saved_errno;
}

static void register_fork_handlers(void)
{
    /* Fails only for lack of memory: children then sample like their
     * parent, as before. */
    (void)pthread_atfork(count_fork, NULL, fresh_draw_in_child);
}

/* A sample point fell inside a block of `size` bytes, with R > 1: its
 * weight, and the next countdown. The floating-point part of sampling.
 *
 * The weight uses the mean this countdown was drawn with; the next one is
 * drawn with the mean in force now (the rate limit may have changed it),
 * and that mean is stored beside it for the next weight. A Poisson process
 * may change its rate at any sample point: memorylessness makes the block
 * after it start a fresh process, so every weight stays unbiased. */
__attribute__((noinline)) static uint64_t sample_point(struct ddheap__thread *t, uint64_t size)
{
    uint64_t weight = weight_of(size, t->mean);
    uint64_t interval = __atomic_load_n(&config.interval, __ATOMIC_RELAXED);
    uint64_t mean = interval;
    if (interval > 1 && ddheap_rate_limit() != 0) {
        uint64_t needed = ddheap_rate_record(weight);
        mean = needed > interval ? needed : interval;
    }
    t->mean = mean;
    t->countdown = draw_countdown(t, mean);
    return weight;
}

static dd_alloc_req_t pass_through(size_t size, size_t alignment)
{
    dd_alloc_req_t out = {size, size, alignment, 0};
    return out;
}

/* A sampled block's request grows by the bytes its mark needs; a block
 * that cannot be marked (an alignment beyond what sampling covers, or a
 * size that would overflow) passes through unsampled. */
static inline dd_alloc_req_t with_mark_room(size_t size, size_t alignment, uint64_t weight)
{
    dd_alloc_req_t out = {size, size, alignment, weight};
#if DDHEAP_LIVE_HEAP
    size_t extra = ddheap_mark_extra(alignment);
    if (extra == SIZE_MAX || __builtin_add_overflow(size, extra, &out.size))
        return pass_through(size, alignment);
#else
    (void)alignment;
#endif
    return out;
}

static inline bool config_current(const struct ddheap__thread *t)
{
    /* A new thread (epoch 0) never matches: config.epoch starts at 1 and
     * only grows (it would take 2^32 changes of the interval to wrap). */
    return t->epoch == __atomic_load_n(&config.epoch, __ATOMIC_RELAXED);
}

/* A sample point fell inside the block and R > 1: the weight and the next
 * countdown need floating point (sample_point), under the reentry guard. */
__attribute__((noinline)) static dd_alloc_req_t
request_at_sample_point(struct ddheap__thread *t, size_t size, size_t alignment)
{
    if (!__atomic_load_n(&config.enabled, __ATOMIC_RELAXED)) {
        /* Disabled with a current epoch: adopt_config parked the countdown,
         * so only a countdown run down from the maximum gets here. Park it
         * again. (mean is the maximum then, so R = 1's path is never it.) */
        t->countdown = UINT64_MAX;
        return pass_through(size, alignment);
    }
    t->busy++;
    uint64_t weight = sample_point(t, size);
    t->busy--;
    return with_mark_room(size, alignment, weight);
}

/* Whether the thread can mark without asking anything first (pointer tags:
 * once the kernel said yes; the other schemes: always). */
static inline bool thread_marks_already(const struct ddheap__thread *t)
{
#if DDHEAP_LIVE_HEAP && DDHEAP_MARK_TBI
    return t->tagging == DDHEAP_TAGGING_ON;
#else
    (void)t;
    return true;
#endif
}

/* Whether the thread can mark blocks; a thread that cannot never samples
 * (its countdown is parked at the maximum). */
static inline bool thread_can_mark(struct ddheap__thread *t)
{
#if DDHEAP_LIVE_HEAP && DDHEAP_MARK_TBI
    if (DDHEAP__LIKELY(thread_marks_already(t)))
        return true;
    t->busy++;
    int saved_errno = errno; /* a thread's first readiness check calls prctl */
    bool ready = ddheap_mark_thread_ready(t);
    errno = saved_errno;
    t->busy--;
    return ready;
#elif DDHEAP_LIVE_HEAP
    return ddheap_mark_thread_ready(t); /* header scheme: always */
#else
    (void)t;
    return true;
#endif
}

/* A sample point falls inside the block, and the thread's configuration
 * is current. */
static inline dd_alloc_req_t sampled_block(struct ddheap__thread *t, size_t size,
                                           size_t alignment)
{
    if (!thread_can_mark(t)) {
        t->countdown = UINT64_MAX;
        return pass_through(size, alignment);
    }
    if (t->mean > 1)
        return request_at_sample_point(t, size, alignment);
    /* R = 1: every non-empty block, weight = size; the countdown stays 0 */
    return with_mark_room(size, alignment, size);
}

/* The thread has not adopted the current configuration (first use, or the
 * interval changed): adopt it, which draws a fresh countdown, and decide
 * again whether the block holds a sample point. Adopting may read the
 * environment (getenv, write): errno is kept here, where it can change,
 * and the reentry guard held. With sampling disabled the countdown is
 * parked at the maximum, so the block passes here. */
__attribute__((noinline)) static dd_alloc_req_t
request_with_new_config(struct ddheap__thread *t, size_t size, size_t alignment)
{
    t->busy++;
    int saved_errno = errno;
    adopt_config(t);
    errno = saved_errno;
    t->busy--;
    if (t->countdown >= size) { /* no sample point inside this block */
        t->countdown -= size;
        return pass_through(size, alignment);
    }
    return sampled_block(t, size, alignment);
}

/* src/ is built with frame pointers so that a tracer's stack walk at a
 * probe gets through ddheap's frames; no probe fires while the request is
 * on the stack, so it can do without (GCC; clang has no such attribute).
 * Never on a function that calls a probe function other than by a tail
 * call: its caller would vanish from the stack (src/probes.c). */
#if defined(__clang__)
#define DDHEAP_FRAMELESS
#else
#define DDHEAP_FRAMELESS __attribute__((optimize("omit-frame-pointer")))
#endif
/* For a function that reaches the probes by tail calls only: those are
 * tail calls in an optimising build alone. At -O0 GCC calls and returns,
 * and the frameless caller's own caller (the allocation site, when its
 * wrapper jumped here) would vanish from the stack (test tracer-stacks). */
#if defined(__OPTIMIZE__)
#define DDHEAP_FRAMELESS_TAIL DDHEAP_FRAMELESS
#else
#define DDHEAP_FRAMELESS_TAIL
#endif

/* Every case ddheap__sample_request does not decide inline: a reentered
 * call (a signal handler), a configuration to adopt, R > 1's floating
 * point, a thread that has yet to ask whether it can mark. One function
 * for all of them, reached by a tail call: the inline part then saves no
 * register and sets up no frame. */
__attribute__((noinline)) static void request_the_long_way(dd_alloc_req_t *out,
                                                          struct ddheap__thread *t, size_t size,
                                                          size_t alignment)
{
    if (t->busy) /* reentered (signal handler): pass through */
        *out = pass_through(size, alignment);
    else if (!config_current(t))
        *out = request_with_new_config(t, size, alignment);
    else
        *out = sampled_block(t, size, alignment);
}

/*
 * The fast path saw the countdown run out inside a block of `size` bytes,
 * and left it at 0: this is the only way in, so the block holds a sample
 * point unless the thread is new or the interval changed (its countdown
 * was then drawn for another configuration, or never). Decides the block
 * into *out, and leaves the countdown set for the next one.
 *
 * Inline here: R = 1 with a current configuration (every block sampled,
 * weight = size, the countdown stays 0), which calls nothing; everything
 * else goes to request_the_long_way, by a tail call.
 */
DDHEAP_FRAMELESS void ddheap__sample_request(dd_alloc_req_t *out, size_t size, size_t alignment)
{
    struct ddheap__thread *t = &ddheap__thread_state;
    if (DDHEAP__LIKELY(!t->busy && config_current(t) && t->mean <= 1 && thread_marks_already(t))) {
        *out = with_mark_room(size, alignment, size);
        return;
    }
    request_the_long_way(out, t, size, alignment);
}

#if DDHEAP_LIVE_HEAP
/* A sampled block that the quick mark declined: keys not derived yet, a
 * page-start user pointer (the table), or a request that cannot carry a
 * header. Marking keeps errno itself (it may have to derive the keys). */
__attribute__((noinline)) static void *created_the_long_way(void *raw, size_t user_size,
                                                            uint64_t weight, size_t extra)
{
    if (raw == NULL) /* the real allocation failed (shadow: seen only here) */
        return NULL;
    void *user = ddheap_mark_at(raw, (uint32_t)extra, extra, true);
    if (user == NULL) {
        /* Cannot happen with a sane table size (docs/alignment.md); the
         * block then lives on unsampled with its slack unused. */
        return raw;
    }
    ddheap_mark_keep_report(user, user_size, weight);
    return ddheap_fire_alloc((uintptr_t)user, user_size, weight);
}
#endif

/* The real allocation of a sampled request returned `raw`: mark it and
 * report it. Ends in tail calls only (the probe function hands back the
 * user pointer), so it needs no saved registers. */
DDHEAP_FRAMELESS_TAIL void *ddheap__sample_created(void *raw, size_t user_size, uint64_t weight,
                                                   size_t extra)
{
#if DDHEAP_LIVE_HEAP && DDHEAP_MARK_SHADOW
    /* The quick mark refuses NULL itself, in the test of the address it
     * makes anyway (mark_shadow.h): the long way then returns it. */
    extra = 0; /* the scheme never asks for room; a register freed for marking */
#else
    if (raw == NULL) /* the real allocation failed: nothing to report */
        return NULL;
#endif
#if DDHEAP_LIVE_HEAP
    void *user = ddheap_mark_fresh(raw, extra);
    if (DDHEAP__UNLIKELY(user == NULL))
        return created_the_long_way(raw, user_size, weight, extra);
    ddheap_mark_keep_report(user, user_size, weight); /* for a realloc that fails */
#else
    void *user = raw;
    (void)extra;
#endif
    return ddheap_fire_alloc((uintptr_t)user, user_size, weight); /* keeps errno */
}

#if DDHEAP_LIVE_HEAP
/* What the real free gets for a marked block: its raw pointer and, for a
 * sized free, the size the real allocator was asked for. Report first:
 * once the real free runs, the address may be handed out (and reported)
 * again by another thread. The probe function hands both back. */
static inline dd_alloc_freed_t release_marked(void *user, size_t size, const struct ddheap_mark *m)
{
    size_t real_size = size ? size + m->extra : 0;
    if (m->reported)
        return ddheap_fire_free((uintptr_t)user, m->raw, real_size); /* keeps errno */
    dd_alloc_freed_t out = {m->raw, real_size};
    return out;
}

/* A page-start pointer: its mark, if any, is in the table. */
__attribute__((noinline)) static dd_alloc_freed_t release_the_long_way(void *user, size_t size)
{
    dd_alloc_freed_t out = {user, size};
    struct ddheap_mark m;
    if (!ddheap_unmark(user, &m))
        return out;
    return release_marked(user, size, &m);
}
#endif

/* The fast path found a mark (or a filter match) before `user`. Unmarking
 * touches only memory and atomics; like created, this ends in tail calls. */
DDHEAP_FRAMELESS_TAIL dd_alloc_freed_t ddheap__release(void *user, size_t size)
{
    dd_alloc_freed_t out = {user, size};
#if DDHEAP_LIVE_HEAP
    struct ddheap_mark m;
    int unmarked = ddheap_unmark_quick(user, &m);
    if (DDHEAP__UNLIKELY(unmarked < 0))
        return release_the_long_way(user, size);
    if (unmarked) {
        size_t real_size = size ? size + m.extra : 0;
        if (m.reported) /* a tail call: GCC splits the struct of any other shape */
            return ddheap_fire_free((uintptr_t)user, m.raw, real_size);
        out.ptr = m.raw;
        out.size = real_size;
    }
#endif
    return out;
}

void dd_set_default_sampling_interval(uint64_t bytes)
{
    read_config_once();
    __atomic_store_n(&config.interval_from_api, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&config.interval, bytes ? bytes : DDHEAP_DEFAULT_INTERVAL, __ATOMIC_RELAXED);
    __atomic_add_fetch(&config.epoch, 1, __ATOMIC_RELEASE);
    adopt_config(&ddheap__thread_state);
}

uint64_t dd_get_default_sampling_interval(void)
{
    read_config_once();
    return __atomic_load_n(&config.interval, __ATOMIC_RELAXED);
}

uint64_t dd_get_effective_sampling_interval(void)
{
    read_config_once();
    return effective_interval();
}

void dd_set_max_samples_per_second(uint64_t samples_per_second)
{
    read_config_once(); /* a later environment read must not override this */
    ddheap_rate_set_limit(samples_per_second, true);
}

uint64_t dd_get_max_samples_per_second(void)
{
    read_config_once();
    return ddheap_rate_limit();
}

int dd_heap_thread_sampling_status(void)
{
    read_config_once();
    if (!__atomic_load_n(&config.enabled, __ATOMIC_RELAXED))
        return DD_HEAP_THREAD_SAMPLING_DISABLED;
#if DDHEAP_LIVE_HEAP
    return ddheap_mark_thread_status(&ddheap__thread_state);
#else
    return DD_HEAP_THREAD_SAMPLING_READY; /* nothing is marked: nothing to refuse */
#endif
}

#if !DDHEAP_MARK_TBI
/* Header and shadow marking need nothing from the kernel per thread
 * (mark_tbi.c has the scheme that does): every thread may sample, and
 * there is no tagging to fail. */
int ddheap_mark_thread_status(const struct ddheap__thread *t)
{
    (void)t;
    return DD_HEAP_THREAD_SAMPLING_READY;
}

void ddheap_test_fail_tagging(bool fail)
{
    (void)fail;
}
#endif

/* --- test hooks (ddheap/testing.h) --- */

void ddheap_test_seed_thread(uint64_t seed)
{
    struct ddheap__thread *t = &ddheap__thread_state;
    adopt_config(t);
    t->rng = seed;
    t->seed_fixed = 1;
    if (__atomic_load_n(&config.enabled, __ATOMIC_RELAXED))
        t->countdown = draw_countdown(t, t->mean);
}

uint64_t ddheap_test_draw_gap(uint64_t mean)
{
    struct ddheap__thread *t = &ddheap__thread_state;
    if (t->mean == 0)
        adopt_config(t);
    return draw_countdown(t, mean);
}

uint64_t ddheap_test_weight(uint64_t size, uint64_t mean)
{
    return weight_of(size, mean);
}

uint64_t ddheap_test_thread_mean(void)
{
    return ddheap__thread_state.mean;
}

void ddheap_test_reload_config(void)
{
    __atomic_store_n(&config.interval_from_api, 0, __ATOMIC_RELAXED);
    ddheap_rate_forget_limit();
    __atomic_store_n(&config.state, 0, __ATOMIC_RELEASE);
    read_config_once();
    adopt_config(&ddheap__thread_state);
}

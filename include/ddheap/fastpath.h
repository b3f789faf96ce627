/*
 * The inlined fast path, compiled into the caller's allocator. Its whole
 * cost, per call, is:
 *
 *   requested, no tracer:   one load (the semaphore word), one branch
 *   requested, tracer:      + a thread-local subtract and a branch
 *   created:                one test of req.weight (folded by the compiler
 *                           into the branches above when it can see both)
 *   freed, nothing marked:  one load (live_marked; in a shared library
 *                           this copy's free gate), one branch
 *   freed, something live:  + the page test and the keyed filter on the
 *                           header's first word (header scheme) / one
 *                           compare (aarch64 TBI) / a shift and a test of
 *                           one summary byte (shadow scheme)
 *   realloc prepare/commit: the tests of an allocation and of a free, unless
 *                           the old block is marked or the new one sampled
 *
 * Everything else lives in the cold path (src/). Include <ddheap.h>.
 */
#ifndef DDHEAP_FASTPATH_H
#define DDHEAP_FASTPATH_H

#include <ddheap.h>
#include <ddheap/coldpath.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Top byte of a sampled pointer when DDHEAP_MARK_TBI. */
#define DDHEAP__TAG 0xddu

static inline uint64_t ddheap__load_relaxed(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

/* "Is this word non-zero", as the two tests every pair pays with no tracer
 * attached. On x86-64 it is written as one compare-with-memory and one
 * branch: GCC never folds a load (atomic or plain) into `cmp $0, mem` here,
 * it emits mov + test + jne, one instruction more on each side of every
 * pair (bench/: +6 instructions per pair instead of +4). An aligned 4- or
 * 8-byte read is single-copy atomic on x86-64, as the relaxed atomic load
 * it replaces; asm goto is volatile, so the word is read at every call. */
#if defined(__x86_64__)
static inline int ddheap__nonzero8(const uint8_t *byte)
{
    __asm__ goto("cmpb $0, %0\n\tjne %l[nonzero]" : : "m"(*byte) : "cc" : nonzero);
    return 0;
nonzero:
    return 1;
}

static inline int ddheap__nonzero32(const uint32_t *word)
{
    __asm__ goto("cmpl $0, %0\n\tjne %l[nonzero]" : : "m"(*word) : "cc" : nonzero);
    return 0;
nonzero:
    return 1;
}

static inline int ddheap__nonzero64(const uint64_t *word)
{
    __asm__ goto("cmpq $0, %0\n\tjne %l[nonzero]" : : "m"(*word) : "cc" : nonzero);
    return 0;
nonzero:
    return 1;
}
#else
static inline int ddheap__nonzero8(const uint8_t *byte)
{
    return __atomic_load_n(byte, __ATOMIC_RELAXED) != 0;
}

static inline int ddheap__nonzero32(const uint32_t *word)
{
    return __atomic_load_n(word, __ATOMIC_RELAXED) != 0;
}

static inline int ddheap__nonzero64(const uint64_t *word)
{
    return __atomic_load_n(word, __ATOMIC_RELAXED) != 0;
}
#endif

/* Whether the first word of a header could stand before `user`: it is
 * (user ^ key_filter). The caller has made sure `user` is not in the first
 * 16 bytes of a page, so the read stays within the page `user` points into
 * and never faults. A match sends the free to the cold path, which reads
 * the keys with acquire ordering and verifies the keyed tag in the meta
 * word (src/mark_header.c) before trusting anything: this test only has to
 * be rare for bytes that are not a header, and it is: the word must equal
 * the address XOR a secret. For an unsampled block the bytes read belong to
 * the allocator or to a neighbouring object, which may be freed or being
 * written by another thread: address and thread sanitizers are told not to
 * check the read (the word is compared, never used; a torn or stale value
 * can only fail the test, or send a free to the cold path that refuses it). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DDHEAP__NO_SANITIZE_PEEK __attribute__((no_sanitize_address, no_sanitize_thread))
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DDHEAP__NO_SANITIZE_PEEK __attribute__((no_sanitize("address", "thread")))
#endif
#endif
#ifndef DDHEAP__NO_SANITIZE_PEEK
#define DDHEAP__NO_SANITIZE_PEEK
#endif

DDHEAP__NO_SANITIZE_PEEK
static inline int ddheap__header_filter_matches(uintptr_t user)
{
#if defined(__x86_64__)
    /* As for the countdown: jump away in the common case (no match). The
     * header word is the memory operand (a may_alias type: it is read
     * whatever the bytes are), so the key's address is not shared with the
     * live_marked test and that test stays one instruction on every free. */
    typedef uint64_t __attribute__((may_alias)) any_word;
    uint64_t expected = ddheap_shared_v3.key_filter ^ (uint64_t)user;
    __asm__ goto("cmpq %1, %0\n\tjne %l[differs]"
                 :
                 : "m"(*(const any_word *)(user - DDHEAP__HEADER)), "r"(expected)
                 : "cc"
                 : differs);
    return 1;
differs:
    return 0;
#else
    uint64_t word;
    __builtin_memcpy(&word, (const char *)user - DDHEAP__HEADER, sizeof word);
    return (word ^ (uint64_t)user) == ddheap_shared_v3.key_filter;
#endif
}

/* Counts an allocation of `size` bytes down the thread's countdown and
 * returns 0, or returns 1 when the next sample point falls inside the block
 * (countdown < size). The countdown is then left at 0, which tells the cold
 * path exactly that, whatever the subtraction left behind: on x86-64 the
 * common case is one subtract from thread-local memory and one branch on
 * its borrow (GCC otherwise loads, subtracts, branches and stores: two
 * instructions more on every traced allocation), so a borrow briefly
 * leaves a wrapped value. A signal handler that allocates in that window
 * sees a huge countdown and passes unsampled; had the value been restored
 * by adding `size` back, the handler's bytes would have stayed subtracted
 * from a wrapped value and stopped the thread sampling for good. The
 * "memory" clobber, not an output operand, tells the compiler the
 * countdown changed: GCC 12 drops the label's code when an asm goto has a
 * "+m" output. */
#if defined(__x86_64__)
static inline int ddheap__countdown_borrows(uint64_t size)
{
    /* The jump is taken in the common case, straight to the caller's
     * continuation; jumping on the borrow instead made GCC jump back from
     * the fall-through, one instruction more. */
    __asm__ goto("subq %1, %0\n\tjae %l[enough]"
                 :
                 : "m"(ddheap__thread_state.countdown), "r"(size)
                 : "cc", "memory"
                 : enough);
    ddheap__thread_state.countdown = 0;
    return 1;
enough:
    return 0;
}
#else
static inline int ddheap__countdown_borrows(uint64_t size)
{
    uint64_t left;
    if (DDHEAP__UNLIKELY(__builtin_sub_overflow(ddheap__thread_state.countdown, size, &left))) {
        ddheap__thread_state.countdown = 0; /* as on x86-64 */
        return 1;
    }
    ddheap__thread_state.countdown = left;
    return 0;
}
#endif

/*
 * Call before the real allocation. Hand the real allocator req.size and
 * req.alignment. `alignment` 0 means the allocator's default.
 */
static inline dd_alloc_req_t dd_allocation_requested(size_t size, size_t alignment)
{
    dd_alloc_req_t req = {size, size, alignment, 0};
    if (DDHEAP__UNLIKELY(ddheap__nonzero32(&ddheap__tracer_gate)) &&
        DDHEAP__UNLIKELY(ddheap__countdown_borrows((uint64_t)size))) {
        dd_alloc_req_t sampled;
        ddheap__sample_request(&sampled, size, alignment);
        return sampled;
    }
    return req;
}

/*
 * Call with what the real allocator returned for `req` (NULL included);
 * returns the pointer to hand to the application.
 */
static inline void *dd_allocation_created(void *raw, dd_alloc_req_t req)
{
    if (DDHEAP__UNLIKELY(req.weight != 0)) {
#if DDHEAP_LIVE_HEAP && DDHEAP_MARK_SHADOW
        /* The shadow scheme never asks for room (req.size == req.user_size):
         * a constant, so the caller keeps one value fewer across its real
         * allocation (bench/: 4 instructions per sampled pair with glibc). */
        return ddheap__sample_created(raw, req.user_size, req.weight, 0);
#else
        return ddheap__sample_created(raw, req.user_size, req.weight, req.size - req.user_size);
#endif
    }
    return raw;
}

#if DDHEAP_LIVE_HEAP && !DDHEAP_MARK_TBI
/* Whether no block this copy must recognise can be live: `count` is the
 * scheme's process-wide count of marked blocks. In a shared library this
 * copy's own gate (coldpath.h) is read first: one compare instead of a GOT
 * load and a compare. */
static inline int ddheap__none_marked(const uint64_t *count)
{
#if defined(__PIC__) && !defined(__PIE__)
    if (DDHEAP__LIKELY(!ddheap__nonzero8(&ddheap__free_gate)))
        return 1;
#endif
    return !ddheap__nonzero64(count);
}
#endif

/* Whether `ptr` may be a marked block, i.e. whether its free or realloc
 * must go through the cold path. Exact for pointer tags; for headers and
 * the shadow summary a match is verified there. With nothing marked in the process: one
 * compare and one branch. */
static inline int ddheap__may_be_marked(void *ptr)
{
#if !DDHEAP_LIVE_HEAP
    (void)ptr;
    return 0;
#elif DDHEAP_MARK_TBI
    return ((uintptr_t)ptr >> 56) == DDHEAP__TAG;
#elif DDHEAP_MARK_SHADOW
    if (DDHEAP__LIKELY(ddheap__none_marked(&ddheap_shared_v3.shadow_live)))
        return 0;
    /* The summary: a zero counter for the address's bits 12..31 means no
     * bit is set for any address there (src/mark_shadow.h). The 32-bit
     * shift is the mask. Reads only ddheap's own memory. In an executable
     * the summary's address is hidden from the optimiser: GCC would
     * otherwise compute the shared object's address once for both tests,
     * and the first one, paid by every free, would take two instructions
     * instead of one. (In a shared library both come from one GOT load.) */
    const uint8_t *summary = ddheap_shared_v3.shadow_summary;
#if !(defined(__PIC__) && !defined(__PIE__))
    __asm__("" : "+r"(summary));
#endif
    return ddheap__nonzero8(&summary[(uint32_t)(uintptr_t)ptr >> 12]);
#else
    if (DDHEAP__LIKELY(ddheap__none_marked(&ddheap_shared_v3.live_marked)))
        return 0;
    uintptr_t user = (uintptr_t)ptr;
    /* Page rule: a marked block never has a header-marked user pointer in
     * the first 16 bytes of a page; those are looked up instead. */
    if ((user & (DDHEAP__PAGE - 1)) >= DDHEAP__HEADER)
        return ddheap__header_filter_matches(user);
    return ptr != NULL && ddheap__load_relaxed(&ddheap_shared_v3.table_live) != 0;
#endif
}

/*
 * Call before the real free with the application's pointer and, when the
 * caller knows them, the size and alignment it was allocated with (0 when
 * unknown). Free the returned ptr; for a sized free, pass the returned size.
 */
static inline dd_alloc_freed_t dd_allocation_freed(void *ptr, size_t size, size_t alignment)
{
    dd_alloc_freed_t out = {ptr, size};
    (void)alignment;
    if (DDHEAP__UNLIKELY(ddheap__may_be_marked(ptr)))
        return ddheap__release(ptr, size);
    return out;
}

/*
 * realloc, in two halves around the caller's own realloc (docs/realloc.md):
 *
 *     dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
 *     void *raw = real_realloc(prep.raw_ptr, prep.raw_size);
 *     return dd_allocation_realloc_commit(ptr, raw, prep);
 *
 * realloc(NULL, n) allocates n; size 0 on a live block frees it (glibc's
 * realloc(p, 0)). Prepare reports a reported old block freed, before the
 * real realloc; commit reports it again if the real realloc fails. Unless the old block is
 * marked or the new one is sampled, both halves stay inline: the same
 * checks as an allocation and a free.
 */
static inline dd_realloc_prep_t dd_allocation_realloc_prepare(void *old_user, size_t new_size)
{
    if (DDHEAP__LIKELY(!ddheap__may_be_marked(old_user))) {
        dd_realloc_prep_t prep = {old_user, new_size, new_size, 0, 0, 0, 0, 0, 0, 0};
        if (DDHEAP__LIKELY(!ddheap__nonzero32(&ddheap__tracer_gate)))
            return prep; /* nothing to sample, nothing to unmark */
        /* the new block counts as an allocation of new_size */
        if (DDHEAP__LIKELY(!ddheap__countdown_borrows((uint64_t)new_size)))
            return prep; /* not sampled either */
    }
    return ddheap__realloc_prepare(old_user, new_size);
}

static inline void *dd_allocation_realloc_commit(void *old_user, void *new_raw,
                                                 dd_realloc_prep_t prep)
{
    if (DDHEAP__LIKELY(prep.flags == 0 && prep.weight == 0))
        return new_raw; /* neither block is marked or reported */
    return ddheap__realloc_commit(old_user, new_raw, prep);
}

#ifdef __cplusplus
}
#endif

#endif /* DDHEAP_FASTPATH_H */

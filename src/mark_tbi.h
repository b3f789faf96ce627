/*
 * Pointer-tag marking (aarch64 with -Dmarking=tbi): the scheme's
 * operations on a sampled pair's path, inline (see mark_header.h for why).
 * What tagging needs from the kernel, and why, is in mark_tbi.c. Included
 * by mark.h only.
 */
#ifndef DDHEAP_MARK_TBI_H
#define DDHEAP_MARK_TBI_H

/* struct ddheap__thread.tagging. Zero-initialised TLS reads UNTRIED. */
enum ddheap_tagging {
    DDHEAP_TAGGING_UNTRIED = 0,
    DDHEAP_TAGGING_FAIL_NEXT = 1, /* test hook: the next request fails */
    DDHEAP_TAGGING_ON = 2,
    DDHEAP_TAGGING_REFUSED = 3, /* the kernel said no */
    DDHEAP_TAGGING_MTE = 4,     /* MTE checks on: our tag would fault */
};

#define DDHEAP_TAG_SHIFT 56
#define DDHEAP_ADDRESS_MASK ((UINT64_C(1) << DDHEAP_TAG_SHIFT) - 1)

/* mark_tbi.c: asks the kernel once per thread (prctl). */
bool ddheap_tbi_thread_ready_slow(struct ddheap__thread *t);

static inline bool ddheap_mark_thread_ready(struct ddheap__thread *t)
{
    if (DDHEAP__LIKELY(t->tagging == DDHEAP_TAGGING_ON))
        return true;
    return ddheap_tbi_thread_ready_slow(t);
}

/* Same alignment rule as the header scheme, so that which blocks can be
 * sampled does not depend on the marking scheme; the tag itself needs no
 * room at any alignment. */
static inline size_t ddheap_mark_extra(size_t alignment)
{
    if (alignment != 0 &&
        ((alignment & (alignment - 1)) != 0 || alignment > DDHEAP_MAX_SAMPLED_ALIGNMENT))
        return SIZE_MAX;
    return 0;
}

/* A tag carries one bit of information: "sampled and reported". It has no
 * room for an offset or extra bytes (mark_extra never asks for any), and
 * the top byte must be ours to set. */
static inline void *ddheap_tbi_tag(void *raw, uint32_t offset, size_t extra, bool reported)
{
    uint64_t address = (uintptr_t)raw;
    if (offset != 0 || extra != 0 || !reported || (address >> DDHEAP_TAG_SHIFT) != 0)
        return NULL;
    ddheap_count_marked(1);
    return (void *)(uintptr_t)(address | ((uint64_t)DDHEAP__TAG << DDHEAP_TAG_SHIFT));
}

static inline void *ddheap_mark_fresh(void *raw, size_t extra)
{
    return ddheap_tbi_tag(raw, 0, extra, true);
}

static inline bool ddheap_tbi_lookup(void *user, struct ddheap_mark *out)
{
    uint64_t address = (uintptr_t)user;
    if ((address >> DDHEAP_TAG_SHIFT) != DDHEAP__TAG)
        return false;
    out->raw = (void *)(uintptr_t)(address & DDHEAP_ADDRESS_MASK);
    out->extra = 0;
    out->offset = 0;
    out->reported = true;
    return true;
}

/* The tag lives in the pointer the application holds, so there is nothing
 * to erase: once the raw block is freed, whatever reuses the address gets
 * an untagged pointer from the real allocator. Never needs the long way. */
static inline int ddheap_unmark_quick(void *user, struct ddheap_mark *out)
{
    if (!ddheap_tbi_lookup(user, out))
        return 0;
    ddheap_count_marked(-1);
    return 1;
}

#endif /* DDHEAP_MARK_TBI_H */

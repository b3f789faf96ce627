/*
 * The cold half of realloc (the inline half is in ddheap/fastpath.h:
 * with no tracer and an unmarked old block nothing here runs).
 *
 * realloc in two halves around the caller's real realloc (docs/realloc.md).
 *
 * The returned block is a new allocation of new_size for sampling (the
 * countdown advances by new_size), whatever the old block was. The old
 * block, if reported, is reported freed once the real realloc succeeded.
 *
 * Layout. The real realloc copies the raw block from its start, so the
 * user's bytes keep their offset from raw. When the new block's user
 * pointer must sit at another offset (unmarked -> marked, or an old block
 * aligned beyond 16 bytes), commit moves new_size bytes inside the new raw
 * block; the request is made large enough, new_size + max(old, new
 * offset), that both source and destination lie inside it. Moved bytes
 * past the old block's end are indeterminate, as realloc allows.
 *
 * A marked old block whose mark carries bytes (a header's offset or extra)
 * always yields a marked new block, reported or not: its request carries
 * extra bytes that a sized free must get back, and only a mark remembers
 * them. A mark that carries nothing (a pointer tag, a page-aligned table
 * entry) is simply dropped when the new block is not sampled.
 *
 * The old mark is removed in prepare, before the real realloc can free or
 * copy the old block: a stale header left in freed memory could later be
 * taken for a live one. If the real realloc fails, commit restores it, so
 * the old block is exactly as before.
 *
 * free(old) can only be reported in commit (a failed realloc reports
 * nothing), so between the real realloc and commit the old address is free
 * but not yet reported free. A signal handler on this thread that
 * allocates in that window could be handed the same address and report it
 * allocated first. While a reported block is in flight, prepare therefore
 * holds the thread's reentry guard until commit: allocations made in the
 * window on this thread pass through unsampled, as inside the cold path.
 * Other threads are not held (docs/realloc.md, "Known limit").
 */
#include "internal.h"
#include "mark.h"

#include <errno.h>

enum {
    OLD_MARKED = 1u << 0,
    OLD_REPORTED = 1u << 1,
    NEW_MARKED = 1u << 2,
    IS_FREE = 1u << 3, /* new_size 0 on a live block: glibc's realloc(p, 0) frees */
    HOLDS_GUARD = 1u << 4, /* this thread's reentry guard is held until commit */
};

/* memmove, ours: the cold path calls no lazily bound libc function. */
static void move_bytes(unsigned char *dst, const unsigned char *src, size_t n)
{
    if (dst == src || n == 0)
        return;
    if (dst < src) {
        for (; n >= 8; n -= 8, dst += 8, src += 8) {
            uint64_t w;
            __builtin_memcpy(&w, src, 8);
            __builtin_memcpy(dst, &w, 8);
        }
        while (n--)
            *dst++ = *src++;
    } else {
        dst += n;
        src += n;
        for (; n >= 8; n -= 8) {
            uint64_t w;
            dst -= 8;
            src -= 8;
            __builtin_memcpy(&w, src, 8);
            __builtin_memcpy(dst, &w, 8);
        }
        while (n--)
            *--dst = *--src;
    }
}

static bool old_block_mark(void *old_user, struct ddheap_mark *m)
{
#if DDHEAP_LIVE_HEAP
    return ddheap_unmark(old_user, m);
#else
    (void)old_user;
    (void)m;
    return false;
#endif
}

dd_realloc_prep_t ddheap__realloc_prepare(void *old_user, size_t new_size)
{
    dd_realloc_prep_t prep = {0};
    struct ddheap_mark old;
    int saved_errno = errno;

    prep.new_size = new_size;
    prep.raw_ptr = old_user;
    if (old_user && old_block_mark(old_user, &old)) {
        prep.flags |= OLD_MARKED | (old.reported ? OLD_REPORTED : 0);
        prep.raw_ptr = old.raw;
        prep.old_offset = old.offset;
        prep.old_extra = (uint32_t)old.extra;
    }

    if (old_user && new_size == 0) {
        prep.flags |= IS_FREE;
        prep.raw_size = 0;
        if (prep.flags & OLD_REPORTED) /* before the memory can be reused */
            ddheap_fire_free((uintptr_t)old_user, NULL, 0);
        errno = saved_errno;
        return prep;
    }

    dd_alloc_req_t req = dd_allocation_requested(new_size, 0);
    prep.weight = req.weight;
    if (prep.flags & OLD_REPORTED) { /* after the sampling decision, which needs the guard free */
        ddheap__thread_state.busy++;
        prep.flags |= HOLDS_GUARD;
    }
    prep.raw_size = new_size;
#if DDHEAP_LIVE_HEAP
    bool old_mark_carries_bytes = (prep.flags & OLD_MARKED) && (prep.old_offset || prep.old_extra);
    if (req.weight || old_mark_carries_bytes) {
        size_t new_offset = ddheap_mark_extra(0);
        size_t room = new_offset > prep.old_offset ? new_offset : prep.old_offset;
        prep.flags |= NEW_MARKED;
        prep.new_offset = (uint32_t)new_offset;
        /* An impossible size makes the real realloc fail, which restores. */
        prep.raw_size = new_size > SIZE_MAX - room ? SIZE_MAX : new_size + room;
    }
#endif
    errno = saved_errno;
    return prep;
}

static void release_guard(const dd_realloc_prep_t *prep)
{
    if (prep->flags & HOLDS_GUARD)
        ddheap__thread_state.busy--;
}

/* The real realloc failed: the old block is as it was, so is its mark. */
static void restore_old_mark(const dd_realloc_prep_t *prep)
{
    if (prep->flags & OLD_MARKED)
        ddheap_mark_at(prep->raw_ptr, prep->old_offset, prep->old_extra,
                       (prep->flags & OLD_REPORTED) != 0);
}

void *ddheap__realloc_commit(void *old_user, void *new_raw, dd_realloc_prep_t prep)
{
    int saved_errno = errno;
    void *new_user = new_raw;

    if (prep.flags & IS_FREE) /* already reported; an allocator may return a fresh minimum block */
        return new_raw;
    if (new_raw == NULL) {
        restore_old_mark(&prep);
        release_guard(&prep);
        errno = saved_errno;
        return NULL;
    }

    if (prep.flags & OLD_REPORTED)
        ddheap_fire_free((uintptr_t)old_user, NULL, 0);
    release_guard(&prep); /* only now is the old address reported free */

    if (prep.flags & NEW_MARKED) {
        unsigned char *raw = new_raw;
        size_t extra = prep.raw_size - prep.new_size;
        move_bytes(raw + prep.new_offset, raw + prep.old_offset, prep.new_size);
        new_user = ddheap_mark_at(new_raw, prep.new_offset, extra, prep.weight != 0);
        if (new_user == NULL) {
            /* The page table is full (docs/alignment.md): hand out the block
             * unmarked, its bytes back at raw. */
            move_bytes(raw, raw + prep.new_offset, prep.new_size);
            new_user = new_raw;
            prep.weight = 0;
        }
    }
    if (prep.weight)
        ddheap_fire_alloc((uintptr_t)new_user, prep.new_size, prep.weight);
    if (prep.weight || (prep.flags & OLD_REPORTED))
        ddheap_fire_realloc((uintptr_t)old_user, (uintptr_t)new_user, prep.new_size, prep.weight);
    errno = saved_errno;
    return new_user;
}

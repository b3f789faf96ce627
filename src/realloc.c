/*
 * The cold half of realloc (the inline half is in ddheap/fastpath.h:
 * with no tracer and an unmarked old block nothing here runs).
 *
 * realloc in two halves around the caller's real realloc (docs/realloc.md).
 *
 * The returned block is a new allocation of new_size for sampling (the
 * countdown advances by new_size), whatever the old block was.
 *
 * Order of the reports. Prepare removes the old block's mark and reports
 * it freed before the real realloc runs: once that realloc has freed the
 * old block, any thread may be handed its address and report it allocated,
 * and a consumer keyed by address must already have seen the free. (When
 * free(old) came in commit, another thread's alloc(old) could come first,
 * and the late free then erased the newer block: docs/realloc.md.) If the
 * real realloc fails, the old block was never freed, so nobody else can
 * have its address: commit restores the mark and reports the block
 * allocated again with the size and weight it was first reported with,
 * which the marking scheme keeps beside the mark (mark.h,
 * ddheap_mark_keep_report), then realloc(old, 0, ...) to say the realloc
 * failed. A scheme that keeps no report (pointer tags) cannot report it
 * again; the block then stays marked and its later free is reported a
 * second time, a free without an alloc (docs/realloc.md says why).
 *
 * No reentry guard is held between prepare and commit: with free(old)
 * reported first, a signal handler that allocates in between (and may be
 * handed the old address) reports its block after that free, in order.
 *
 * Layout. The real realloc copies the raw block from its start, so the
 * user's bytes keep their offset from raw. When the new block's user
 * pointer must sit at another offset (unmarked -> marked, or an old block
 * aligned beyond 32 bytes), commit moves new_size bytes inside the new raw
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
 * taken for a live one.
 */
#include "internal.h"
#include "mark.h"

#include <errno.h>

enum {
    OLD_MARKED = 1u << 0,
    OLD_REPORTED = 1u << 1, /* and reported freed by prepare */
    NEW_MARKED = 1u << 2,
    IS_FREE = 1u << 3, /* new_size 0 on a live block: glibc's realloc(p, 0) frees */
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
    struct ddheap_mark old = {0}; /* size, weight: 0 unless the scheme kept them */
    int saved_errno = errno;

    prep.new_size = new_size;
    prep.raw_ptr = old_user;
    if (old_user && old_block_mark(old_user, &old)) {
        prep.flags |= OLD_MARKED | (old.reported ? OLD_REPORTED : 0);
        prep.raw_ptr = old.raw;
        prep.old_offset = old.offset;
        prep.old_extra = (uint32_t)old.extra;
        if (old.reported) {
            prep.old_size = old.size;
            prep.old_weight = old.weight;
        }
    }
    /* Before the real realloc can free the old block and anyone can be
     * handed its address (the top of this file). */
    if (prep.flags & OLD_REPORTED)
        ddheap_fire_free((uintptr_t)old_user, NULL, 0);

    if (old_user && new_size == 0) {
        prep.flags |= IS_FREE;
        prep.raw_size = 0;
        errno = saved_errno;
        return prep;
    }

    dd_alloc_req_t req = dd_allocation_requested(new_size, 0);
    prep.weight = req.weight;
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

/* The real realloc failed: the old block is as it was, so is its mark, and
 * it is reported allocated again as it was first reported, when the scheme
 * kept that (prepare reported it freed). Then the realloc probe, new_ptr 0,
 * says the realloc failed. */
static void restore_old_block(void *old_user, const dd_realloc_prep_t *prep)
{
    if (!(prep->flags & OLD_MARKED))
        return;
    bool reported = (prep->flags & OLD_REPORTED) != 0;
#if DDHEAP_MARK_SHADOW
    /* Shadow bits keep no report, and a block without its bit is simply
     * unsampled: left unmarked, its later free is not reported either, so
     * the stream stays balanced (the live heap misses the block, as it does
     * with a tag, which cannot be taken back out of the application's
     * pointer). */
    if (reported) {
        ddheap_fire_realloc((uintptr_t)old_user, 0, prep->new_size, 0);
        return;
    }
#endif
    void *user = ddheap_mark_at(prep->raw_ptr, prep->old_offset, prep->old_extra, reported);
    if (!reported)
        return;
    if (user != NULL && prep->old_weight != 0) {
        ddheap_mark_keep_report(user, prep->old_size, prep->old_weight);
        ddheap_fire_alloc((uintptr_t)old_user, prep->old_size, prep->old_weight);
    }
    ddheap_fire_realloc((uintptr_t)old_user, 0, prep->new_size, 0);
}

void *ddheap__realloc_commit(void *old_user, void *new_raw, dd_realloc_prep_t prep)
{
    int saved_errno = errno;
    void *new_user = new_raw;

    if (prep.flags & IS_FREE) /* already reported; an allocator may return a fresh minimum block */
        return new_raw;
    if (new_raw == NULL) {
        restore_old_block(old_user, &prep);
        errno = saved_errno;
        return NULL;
    }

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
        } else if (prep.weight) {
            ddheap_mark_keep_report(new_user, prep.new_size, prep.weight);
        }
    }
    if (prep.weight)
        ddheap_fire_alloc((uintptr_t)new_user, prep.new_size, prep.weight);
    if (prep.weight || (prep.flags & OLD_REPORTED))
        ddheap_fire_realloc((uintptr_t)old_user, (uintptr_t)new_user, prep.new_size, prep.weight);
    errno = saved_errno;
    return new_user;
}

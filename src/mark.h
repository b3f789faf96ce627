/*
 * Marking: how a sampled block is told apart from every other block at
 * free time, and how its raw pointer and real size are recovered. Every
 * scheme meets this contract; sampler.c and realloc.c use nothing else.
 *
 *  - mark_extra(alignment) is decided before the real allocation: the
 *    bytes added to the request (0 for pointer tagging). The mark records
 *    it, so a sized free gets back exactly the size the allocator saw.
 *  - mark_at(raw, ...) turns the real allocation into the user pointer. It
 *    never writes outside the raw block, and either fully marks or leaves
 *    everything untouched.
 *  - lookup(user) answers "is this a marked block" without changing
 *    anything, cheaply when nothing is marked; unmark(user) makes the block
 *    unmarked again (header zeroed, table slot freed) and live_marked
 *    counts it down.
 *
 * Schemes (-Dmarking=): mark_header.h (16-byte keyed header before the
 * user pointer, plus mark_table.c for user pointers at a page start; the
 * x86-64 default), mark_tbi.h (aarch64 top-byte tag, the aarch64 default)
 * and mark_shadow.h (a process-wide bitmap beside the heap; pointers and
 * sizes untouched).
 */
#ifndef DDHEAP_MARK_H
#define DDHEAP_MARK_H

#include "internal.h"

/* 1 for the header scheme, the one that is neither of the others. */
#define DDHEAP_MARK_HEADER (!DDHEAP_MARK_TBI && !DDHEAP_MARK_SHADOW)

struct ddheap_mark {
    void *raw;       /* what the real allocator returned */
    size_t extra;    /* bytes added to the user's size in the real request */
    uint32_t offset; /* user - raw (in the untagged address space) */
    bool reported;   /* an alloc probe fired for this block */
};

/* Bytes to add to a request of this alignment (0 = the allocator's
 * default), or SIZE_MAX when a block of this alignment cannot be marked
 * (it then passes through unsampled). A fresh block's user pointer sits
 * this many bytes into the raw block. Inline, in the scheme's header:
 *     size_t ddheap_mark_extra(size_t alignment);
 *
 * Whether the calling thread can hand out marked blocks at all (aarch64
 * TBI: the kernel must accept tagged pointers from it). Called before every
 * sampling decision; a thread that cannot mark never samples. Inline:
 *     bool ddheap_mark_thread_ready(struct ddheap__thread *t);
 *
 * The quick mark and unmark of a sampled pair, inline so that its cold
 * path stays one function deep on each side (bench/: a call per operation
 * cost about 40 instructions per sampled pair). Each may decline, and the
 * caller then takes the general operation below:
 *     void *ddheap_mark_fresh(void *raw, size_t extra);
 *         mark_at(raw, extra, extra, reported) when it can be done
 *         quickly, else NULL with nothing written;
 *     int ddheap_unmark_quick(void *user, struct ddheap_mark *out);
 *         1: unmarked, as ddheap_unmark; 0: not marked; -1: take
 *         ddheap_unmark().
 */

/* Marks the block at `raw` whose user pointer is `offset` bytes in and
 * whose real request was `extra` bytes larger than the user's size; returns
 * the user pointer, or NULL when the block cannot be marked (then nothing
 * was written). */
void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported);
/* Whether `user` is a marked block, changing nothing. */
bool ddheap_mark_lookup(void *user, struct ddheap_mark *out);
/* Removes the mark of `user` (header zeroed, table slot freed, tag
 * forgotten) and returns what lookup would have; false if not marked. */
bool ddheap_unmark(void *user, struct ddheap_mark *out);

/* What ddheap_mark_thread_ready() decided (or will decide) for `t`, as an
 * enum dd_heap_thread_status; READY in schemes that need nothing per thread. */
int ddheap_mark_thread_status(const struct ddheap__thread *t);

#if DDHEAP_MARK_TBI
/* mark_tbi.c, from ddheap_process_init(): binds prctl before any cold path
 * needs it and, when sampling is enabled, turns tagged addresses on for the
 * loading thread, so the threads it creates later inherit them. */
void ddheap_tbi_process_init(bool sampling_enabled);
#endif

/* --- mark_table.c: marks for user pointers in the first 16 bytes of a page --- */
bool ddheap_table_insert(uintptr_t user, uint64_t meta);
bool ddheap_table_find(uintptr_t user, uint64_t *meta);
bool ddheap_table_remove(uintptr_t user, uint64_t *meta);

/* Every scheme counts its marks in a process-wide counter (the free path's
 * "nothing is marked" shortcut): live_marked for headers and tags,
 * shadow_live for the shadow scheme, so that copies of different schemes in
 * one process never make each other's frees look for marks they cannot
 * have made (the shadow free never reads a header, and the reverse). */
static inline void ddheap_count_marked(int delta)
{
#if DDHEAP_MARK_SHADOW
    uint64_t *counter = &ddheap_shared_v3.shadow_live;
#else
    uint64_t *counter = &ddheap_shared_v3.live_marked;
#endif
    __atomic_add_fetch(counter, (uint64_t)(int64_t)delta, __ATOMIC_RELAXED);
}

/* meta word of a table slot (mark_table.c):
 *   bits  0..31  offset: user pointer minus raw pointer
 *   bits 32..62  extra: bytes added to the user's size in the real request
 *   bit  63      reported: an alloc probe fired for this block, so its free
 *                must fire one (realloc may mark without reporting)
 * A header's meta word packs the same facts differently, with a keyed tag
 * (mark_header.c). */
#define DDHEAP_TABLE_META_REPORTED (UINT64_C(1) << 63)

static inline uint64_t ddheap_table_meta(uint32_t offset, size_t extra, bool reported)
{
    return (uint64_t)offset | ((uint64_t)extra << 32) | (reported ? DDHEAP_TABLE_META_REPORTED : 0);
}

static inline struct ddheap_mark ddheap_table_meta_decode(uintptr_t user, uint64_t meta)
{
    struct ddheap_mark m;
    m.offset = (uint32_t)meta;
    m.extra = (size_t)((meta & ~DDHEAP_TABLE_META_REPORTED) >> 32);
    m.reported = (meta & DDHEAP_TABLE_META_REPORTED) != 0;
    m.raw = (void *)(user - m.offset);
    return m;
}

#if DDHEAP_MARK_HEADER
/* The two words of a header for a block at `user` (mark_header.c), exposed
 * for tests that forge headers. Returns false when offset/extra cannot be
 * encoded (not multiples of 16 below a page, or offset below 16). */
bool ddheap_header_words(uintptr_t user, uint32_t offset, size_t extra, bool reported,
                         uint64_t words[2]);
#endif

#if DDHEAP_MARK_TBI
#include "mark_tbi.h"
#elif DDHEAP_MARK_SHADOW
#include "mark_shadow.h"
#else
#include "mark_header.h"
#endif

#endif /* DDHEAP_MARK_H */

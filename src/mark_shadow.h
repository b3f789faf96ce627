/*
 * Shadow marking (-Dmarking=shadow): the scheme's operations on a sampled
 * pair's path, inline (see mark_header.h for why), over the structure that
 * mark_shadow.c describes and maintains. Included by mark.h only.
 *
 * The block is left exactly as the allocator made it: no bytes added, no
 * offset, no tag. What says "a sampled block starts here" is one bit per
 * 8-byte-aligned address, kept in process-wide tables beside the heap:
 *
 *   word = span (bits 16..63) | one bit per 8-byte granule of the span (0..15)
 *   span = address >> 7 (128 bytes of address space per word)
 *
 * A word whose low 16 bits are all clear is free for any span, whatever its
 * tag says. Setting and clearing a bit is one compare-and-swap on the word
 * that holds both the bit and the span it belongs to, so a bit can never be
 * set or cleared on behalf of another span: words are reused the moment
 * they empty, with no reclaim step to race with.
 */
#ifndef DDHEAP_MARK_SHADOW_H
#define DDHEAP_MARK_SHADOW_H

#define DDHEAP_SHADOW_SPAN_SHIFT 7u
#define DDHEAP_SHADOW_SLOTS UINT64_C(0xffff)
#define DDHEAP_SHADOW_LINE_WORDS 8u
/* Level k of the tables has 2^(LEVEL0_LINES_SHIFT + k) lines of 8 words. */
#define DDHEAP_SHADOW_LEVEL0_LINES_SHIFT 11u

/* Same alignment rule as the other schemes, so that which blocks can be
 * sampled does not depend on the scheme; the mark needs no room at all. */
static inline size_t ddheap_mark_extra(size_t alignment)
{
    if (alignment != 0 &&
        ((alignment & (alignment - 1)) != 0 || alignment > DDHEAP_MAX_SAMPLED_ALIGNMENT))
        return SIZE_MAX;
    return 0;
}

static inline bool ddheap_mark_thread_ready(struct ddheap__thread *t)
{
    (void)t;
    return true; /* a bitmap needs nothing from the kernel per thread */
}

/* Whether a block at `address` can carry a mark: 8-byte aligned (one bit
 * per 8 bytes cannot tell apart two blocks that start in the same 8 bytes)
 * and below 2^55, so that its span fits the 48 bits of a word's tag (a
 * pointer whose top byte is set, say by HWASan, is never marked). */
static inline bool ddheap_shadow_markable(uintptr_t address)
{
    return address != 0 && (address & 7) == 0 && ((uint64_t)address >> 55) == 0;
}

static inline uint64_t ddheap_shadow_bit(uintptr_t address)
{
    return UINT64_C(1) << (((uint64_t)address >> 3) & 15);
}

/* The line of level k where words of `span` live (a multiplicative hash:
 * neighbouring spans land on different lines). */
static inline uint64_t *ddheap_shadow_line(uint64_t *level, unsigned k, uint64_t span)
{
    uint64_t h = span * UINT64_C(0x9e3779b97f4a7c15);
    return level + (h >> (64 - DDHEAP_SHADOW_LEVEL0_LINES_SHIFT - k)) * DDHEAP_SHADOW_LINE_WORDS;
}

static inline uint64_t *ddheap_shadow_level(unsigned k)
{
    return __atomic_load_n(&ddheap_shared_v3.shadow_levels[k], __ATOMIC_ACQUIRE);
}

/* The summary counter the inline free path tests for `address`
 * (ddheap/fastpath.h indexes it the same way). */
static inline uint8_t *ddheap_shadow_summary_of(uintptr_t address)
{
    return &ddheap_shared_v3.shadow_summary[(uint32_t)address >> 12];
}

/* Counters saturate at 255 and then stay there: an entry shared by that
 * many live marks (addresses 4 GiB apart share one, or a page of tiny blocks at
 * interval 1) keeps sending its frees to the walk, which stays exact. */
static inline void ddheap_shadow_summary_add(uintptr_t address)
{
    uint8_t *c = ddheap_shadow_summary_of(address);
    uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
    do {
        if (v == UINT8_MAX)
            return;
    } while (!__atomic_compare_exchange_n(c, &v, (uint8_t)(v + 1), true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
}

static inline void ddheap_shadow_summary_sub(uintptr_t address)
{
    uint8_t *c = ddheap_shadow_summary_of(address);
    uint8_t v = __atomic_load_n(c, __ATOMIC_RELAXED);
    do {
        if (v == UINT8_MAX || v == 0)
            return;
    } while (!__atomic_compare_exchange_n(c, &v, (uint8_t)(v - 1), true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
}

/* A mark is counted (live count, summary) before its bit is set, and
 * uncounted after its bit is cleared: whoever can see the bit sees the
 * counts that lead the free path to it. */
static inline void ddheap_shadow_count(uintptr_t address, int delta)
{
    if (delta > 0) {
        ddheap_count_marked(1);
        ddheap_shadow_summary_add(address);
    } else {
        ddheap_shadow_summary_sub(address);
        ddheap_count_marked(-1);
    }
}

static inline void ddheap_shadow_unmarked(void *user, struct ddheap_mark *out)
{
    ddheap_shadow_count((uintptr_t)user, -1);
    out->raw = user;
    out->extra = 0;
    out->offset = 0;
    out->reported = true;
}

/* The quick mark of a fresh block, when only the first table exists and
 * the block's line in it has room: a bit set with one compare-and-swap.
 * NULL, with nothing changed, for everything else (the first mark of the
 * process, a bit already set by a block freed behind ddheap's back, a full
 * line, a lost race): ddheap_mark_at() then does it the long way. */
static inline void *ddheap_mark_fresh(void *raw, size_t extra)
{
    uintptr_t address = (uintptr_t)raw;
    uint64_t *level0 = ddheap_shadow_level(0);
    (void)extra; /* always 0: mark_extra never asks for room */
    if (DDHEAP__UNLIKELY(level0 == NULL || !ddheap_shadow_markable(address) ||
                         ddheap_shadow_level(1) != NULL))
        return NULL;
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    uint64_t bit = ddheap_shadow_bit(address);
    uint64_t *line = ddheap_shadow_line(level0, 0, span);
    uint64_t *target = NULL, seen = 0;
    for (unsigned i = 0; i < DDHEAP_SHADOW_LINE_WORDS; i++) {
        uint64_t w = __atomic_load_n(&line[i], __ATOMIC_RELAXED);
        if ((w & DDHEAP_SHADOW_SLOTS) == 0) {
            if (target == NULL) {
                target = &line[i];
                seen = w;
            }
        } else if ((w >> 16) == span) {
            if (w & bit)
                return NULL; /* a stale mark: the long way reports it */
            if (target == NULL || (seen & DDHEAP_SHADOW_SLOTS) == 0) {
                target = &line[i]; /* a word of this span before an empty one */
                seen = w;
            }
        }
    }
    if (DDHEAP__UNLIKELY(target == NULL))
        return NULL;
    uint64_t next = (seen & DDHEAP_SHADOW_SLOTS) ? (seen | bit) : (span << 16 | bit);
    ddheap_shadow_count(address, 1);
    if (DDHEAP__UNLIKELY(!__atomic_compare_exchange_n(target, &seen, next, false, __ATOMIC_RELEASE,
                                                      __ATOMIC_RELAXED))) {
        ddheap_shadow_count(address, -1);
        return NULL;
    }
    return raw;
}

/* Clears the bit of `address` if a word of `line` holds it: the test and
 * the clear are one compare-and-swap on the word that also names the span. */
static inline bool ddheap_shadow_clear_in_line(uint64_t *line, uint64_t span, uint64_t bit)
{
    for (unsigned i = 0; i < DDHEAP_SHADOW_LINE_WORDS; i++) {
        uint64_t w = __atomic_load_n(&line[i], __ATOMIC_RELAXED);
        while ((w >> 16) == span && (w & bit)) {
            if (__atomic_compare_exchange_n(&line[i], &w, w & ~bit, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
                return true;
        }
    }
    return false;
}

/* The quick unmark, for a pointer whose summary counter was non-zero:
 * 1 when its bit was set (now clear, counted down), 0 when it was not,
 * -1 when more than the first table exists (ddheap_unmark() walks them). */
static inline int ddheap_unmark_quick(void *user, struct ddheap_mark *out)
{
    uintptr_t address = (uintptr_t)user;
    uint64_t *level0 = ddheap_shadow_level(0);
    if (level0 == NULL || !ddheap_shadow_markable(address))
        return 0;
    if (DDHEAP__UNLIKELY(ddheap_shadow_level(1) != NULL))
        return -1;
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    if (!ddheap_shadow_clear_in_line(ddheap_shadow_line(level0, 0, span), span,
                                     ddheap_shadow_bit(address)))
        return 0;
    ddheap_shadow_unmarked(user, out);
    return 1;
}

/* mark_shadow.c, from ddheap_process_init(): binds mmap and munmap, which
 * the cold path calls when it maps a table. */
void ddheap_shadow_process_init(void);

/* Metadata the scheme holds: bytes of tables mapped (*mapped, may be NULL)
 * and bytes of tables and summary resident in memory (the return value),
 * as mincore(2) sees them. For tests and benchmarks. */
size_t ddheap_shadow_metadata_bytes(size_t *mapped);
/* Number of tables mapped so far. */
unsigned ddheap_shadow_levels_mapped(void);

#endif /* DDHEAP_MARK_SHADOW_H */

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
 *
 * Tables are direct-mapped to buckets of two adjacent words (one cache
 * line), with a hash of their own per table. A span's bits live in a word
 * of its bucket in some table; a mark prefers the span's own word, then an
 * empty one, in the first table that has either. shadow_upper_live counts
 * the bits set beyond the first table (raised before such a bit is set,
 * lowered after it is cleared), so while it is zero every operation reads
 * two words: the quick paths below. Otherwise ddheap_mark_at() and
 * ddheap_unmark() look at every table.
 */
#ifndef DDHEAP_MARK_SHADOW_H
#define DDHEAP_MARK_SHADOW_H

#define DDHEAP_SHADOW_SPAN_SHIFT 7u
#define DDHEAP_SHADOW_SLOTS UINT64_C(0xffff)
/* Table k has 2^(LEVEL0_BUCKETS_SHIFT + k) buckets of 2 words (table 0:
 * 256 KiB of address space, written only where marks land). */
#define DDHEAP_SHADOW_BUCKET_WORDS 2u
#define DDHEAP_SHADOW_LEVEL0_BUCKETS_SHIFT 14u

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
 * per 8 bytes cannot tell apart two blocks that start in the same 8 bytes),
 * not NULL, and at most 2^54, so that its span fits the 48 bits of a word's
 * tag (a pointer whose top byte is set, say by HWASan, is never marked).
 * One subtraction folds the NULL test into the mask: 0 - 8 has every high
 * bit set, and address - 8 for an address in [8, 2^54] does not. */
static inline bool ddheap_shadow_markable(uintptr_t address)
{
    return (((uint64_t)address - 8) & UINT64_C(0xffc0000000000007)) == 0;
}

/* Whether a mark for `address` may exist, as the free side asks it: the
 * same alignment, below 2^55 (a superset of the markable addresses, whose
 * span still fits the tag), NULL included, which is never marked. One
 * instruction fewer than the test above. */
static inline bool ddheap_shadow_may_be_marked(uintptr_t address)
{
    return ((uint64_t)address & UINT64_C(0xff80000000000007)) == 0;
}

static inline uint64_t ddheap_shadow_bit(uintptr_t address)
{
    return UINT64_C(1) << (((uint64_t)address >> 3) & 15);
}

/* The bucket of `span` in table k: a multiplicative hash, with a
 * multiplier of its own per table, so that spans sharing a bucket in one
 * table rarely share it in the next. */
static inline uint64_t *ddheap_shadow_bucket(uint64_t *level, unsigned k, uint64_t span)
{
    uint64_t multiplier =
        UINT64_C(0x9e3779b97f4a7c15) ^ ((uint64_t)k * UINT64_C(0x5851f42d4c957f2e)); /* odd */
    return level + ((span * multiplier) >> (64 - DDHEAP_SHADOW_LEVEL0_BUCKETS_SHIFT - k)) *
                       DDHEAP_SHADOW_BUCKET_WORDS;
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
 * many live marks (addresses 4 GiB apart share one; so do the blocks of a
 * page of tiny blocks at interval 1) keeps sending its frees to the walk,
 * which stays exact.
 *
 * On x86-64 the loops are written out: GCC computed the counter's address
 * into a register of its own (two adds) instead of addressing it from the
 * shared object's base and the index, two instructions more on each side of
 * a sampled pair. The compare-and-swap takes the expected value in al, and
 * a lock-prefixed instruction orders at least as strongly as the relaxed
 * one of the C version. */
#if defined(__x86_64__)
static inline void ddheap_shadow_summary_add(uintptr_t address)
{
    uint32_t seen, next;
    __asm__ volatile("movzbl %2, %0\n\t"
                     "1:\n\t"
                     "cmpb $0xff, %b0\n\t"
                     "je 2f\n\t"
                     "leal 1(%q0), %k1\n\t"
                     "lock cmpxchgb %b1, %2\n\t"
                     "jne 1b\n"
                     "2:"
                     : "=&a"(seen), "=&q"(next), "+m"(*ddheap_shadow_summary_of(address))
                     :
                     : "cc");
}

static inline void ddheap_shadow_summary_sub(uintptr_t address)
{
    /* seen - 1 above 0xfd: seen was 0 (nothing to take) or 255 (sticky) */
    uint32_t seen, next;
    __asm__ volatile("movzbl %2, %0\n\t"
                     "1:\n\t"
                     "leal -1(%q0), %k1\n\t"
                     "cmpb $0xfd, %b1\n\t"
                     "ja 2f\n\t"
                     "lock cmpxchgb %b1, %2\n\t"
                     "jne 1b\n"
                     "2:"
                     : "=&a"(seen), "=&q"(next), "+m"(*ddheap_shadow_summary_of(address))
                     :
                     : "cc");
}
#else
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
#endif

/* A mark is counted (live count, summary) before its bit can be cleared,
 * and uncounted after its bit is cleared: whoever can clear the bit sees
 * the counts that lead the free path to it. The long way counts before it
 * sets the bit; the quick mark right after, before the block is handed
 * out (the only free that may clear a fresh bit is its own block's). */
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

/* What looking at buckets found for (span, bit). */
struct ddheap_shadow_slot {
    uint64_t *word; /* where to set the bit: the span's own word, else an empty one */
    uint64_t seen;  /* its value when read */
    bool own;       /* word is the span's own (holds other bits of the span) */
    bool stale;     /* the bit is set already */
};

/* Looks at one bucket, after those already looked at in `s`. Every word is
 * read: two marks racing for a span can each claim a word of the bucket,
 * and the bit may be in either. */
static inline void ddheap_shadow_look(uint64_t *bucket, uint64_t key, uint64_t bit,
                                      struct ddheap_shadow_slot *s)
{
    uint64_t mask = ~DDHEAP_SHADOW_SLOTS | bit;
    for (unsigned i = 0; i < DDHEAP_SHADOW_BUCKET_WORDS; i++) {
        uint64_t w = __atomic_load_n(&bucket[i], __ATOMIC_RELAXED);
        if ((w & mask) == (key | bit))
            s->stale = true;
        if ((w & DDHEAP_SHADOW_SLOTS) == 0) {
            if (s->word == NULL) {
                s->word = &bucket[i];
                s->seen = w;
            }
        } else if (!s->own && (w & ~DDHEAP_SHADOW_SLOTS) == key) {
            s->own = true;
            s->word = &bucket[i];
            s->seen = w;
        }
    }
}

/* One attempt at setting the bit where a look decided: true if set. */
static inline bool ddheap_shadow_try_set(const struct ddheap_shadow_slot *s, uint64_t key,
                                         uint64_t bit)
{
    uint64_t seen = s->seen;
    uint64_t next = (seen & DDHEAP_SHADOW_SLOTS) ? (seen | bit) : (key | bit);
    return __atomic_compare_exchange_n(s->word, &seen, next, false, __ATOMIC_RELEASE,
                                       __ATOMIC_RELAXED);
}

static inline bool ddheap_shadow_upper_empty(void)
{
    /* one compare with memory on x86-64 (ddheap/fastpath.h) */
    return !ddheap__nonzero64(&ddheap_shared_v3.shadow_upper_live);
}

/* The quick mark of a fresh block, while no bit is set beyond the first
 * table: the two words of its bucket read, one compare-and-swap. NULL, with
 * nothing changed, for everything else (the first mark of the process, a
 * bit already set by a block freed behind ddheap's back, a full bucket, a
 * lost race, the span's own word in the bucket's second word): then
 * ddheap_mark_at() does it the long way.
 *
 * Written for the instruction count of a sampled pair (bench/run
 * --marking): each test below is one compare on a value already in a
 * register. For a word w and the span's key, w ^ key is at most SLOTS
 * exactly when w carries the span's tag (its bits, if any, are the span's);
 * (w ^ key) - 1 < SLOTS when it carries the tag and at least one bit. */
static inline void *ddheap_mark_fresh(void *raw, size_t extra)
{
    uintptr_t address = (uintptr_t)raw;
    uint64_t *level0 = ddheap_shadow_level(0);
    (void)extra; /* always 0: mark_extra never asks for room */
    if (DDHEAP__UNLIKELY(level0 == NULL || !ddheap_shadow_markable(address) ||
                         !ddheap_shadow_upper_empty()))
        return NULL;
    if (address == 0) /* markable said so; tells the compiler, so that the */
        __builtin_unreachable(); /* caller needs no test of what we return */
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    uint64_t key = span << 16, bit = ddheap_shadow_bit(address);
    uint64_t *bucket = ddheap_shadow_bucket(level0, 0, span);
    uint64_t first = __atomic_load_n(&bucket[0], __ATOMIC_RELAXED);
    uint64_t second = __atomic_load_n(&bucket[1], __ATOMIC_RELAXED);
    uint64_t next;
    /* The span's bits in the second word (a race between two marks of the
     * span can leave them there): the bit may be set, or is to go there. */
    if (DDHEAP__UNLIKELY((second ^ key) - 1 < DDHEAP_SHADOW_SLOTS))
        return NULL;
    if ((first ^ key) <= DDHEAP_SHADOW_SLOTS) { /* the span's word, or one it emptied */
        if (DDHEAP__UNLIKELY(first & bit))
            return NULL; /* stale: ddheap_mark_at() reports the old block's free */
        next = first | bit;
    } else if (DDHEAP__LIKELY((first & DDHEAP_SHADOW_SLOTS) == 0)) { /* another span's, empty */
        next = key | bit;
    } else {
        return NULL; /* another span's bits: the long way tries the second word */
    }
    if (DDHEAP__UNLIKELY(!__atomic_compare_exchange_n(&bucket[0], &first, next, false,
                                                     __ATOMIC_RELEASE, __ATOMIC_RELAXED)))
        return NULL; /* lost a race for the word */
    /* Counted after the bit is set, unlike the long way, and still before
     * anyone can see it: the only free that may clear this bit is this
     * block's own, which comes after the pointer is returned, so after the
     * counts (ddheap_shadow_count). Counting after the last way out
     * leaves nothing to undo, and nothing to keep in a register for it. */
    ddheap_shadow_count(address, 1);
    return raw;
}

/* Clears the bit of (span, bit) if a word of `bucket` holds it: the test
 * and the clear are one compare-and-swap on the word that also names the
 * span, retried while only other bits of the word changed. */
static inline bool ddheap_shadow_clear_in(uint64_t *bucket, uint64_t key, uint64_t bit)
{
    for (unsigned i = 0; i < DDHEAP_SHADOW_BUCKET_WORDS; i++) {
        uint64_t w = __atomic_load_n(&bucket[i], __ATOMIC_RELAXED);
        /* the span's tag (w ^ key <= SLOTS) and the bit set; xor clears it */
        while ((w ^ key) <= DDHEAP_SHADOW_SLOTS && (w & bit) != 0) {
            if (__atomic_compare_exchange_n(&bucket[i], &w, w ^ bit, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
                return true;
        }
    }
    return false;
}

/* The quick unmark, for a pointer whose summary counter was non-zero:
 * 1 when its bit was set in the first table (now clear, counted down), 0
 * when it is set nowhere, -1 when bits beyond the first table exist and it
 * was not in the first (ddheap_unmark() looks at the others). */
static inline int ddheap_unmark_quick(void *user, struct ddheap_mark *out)
{
    uintptr_t address = (uintptr_t)user;
    uint64_t *level0 = ddheap_shadow_level(0);
    if (level0 == NULL || !ddheap_shadow_may_be_marked(address))
        return 0;
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    if (ddheap_shadow_clear_in(ddheap_shadow_bucket(level0, 0, span), span << 16,
                               ddheap_shadow_bit(address))) {
        ddheap_shadow_unmarked(user, out);
        return 1;
    }
    return ddheap_shadow_upper_empty() ? 0 : -1;
}

/* mark_shadow.c, from ddheap_process_init(): binds mmap and munmap, which
 * the cold path calls when it maps a table. */
void ddheap_shadow_process_init(void);

/* Metadata the scheme holds: bytes of tables mapped (*mapped, may be NULL)
 * and bytes of tables and summary in memory (the return value: pages the
 * process wrote, from /proc/self/pagemap; where that says nothing, pages
 * resident per mincore(2), an upper bound). For tests and benchmarks. */
size_t ddheap_shadow_metadata_bytes(size_t *mapped);
/* Number of tables mapped so far. */
unsigned ddheap_shadow_levels_mapped(void);

#endif /* DDHEAP_MARK_SHADOW_H */

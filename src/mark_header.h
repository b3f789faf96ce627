/*
 * Header marking (x86-64; aarch64 with -Dmarking=header): the
 * scheme's operations, inline, so that a sampled pair's cold path is one
 * function deep on each side (sampler.c; bench/: a call per operation cost
 * about 40 instructions per sampled pair). Included by mark.h only.
 *
 *   raw                                   user = raw + step
 *   | ...slack... | size | weight | filter | meta | user data (size bytes) |
 *                  <-- record ---> <--- header --->
 *
 * step = max(alignment, 32) for alignments below a page, so the request
 * grows by step bytes and the user pointer keeps the alignment the real
 * allocator gave raw.
 *
 * The record holds what the block's alloc probe reported, for the one
 * reader that needs it: a realloc that reported the old block freed before
 * the real realloc and must report it allocated again, exactly as before,
 * if the real realloc fails (realloc.c). It is read only once the header
 * has been verified, which proves offset >= 32, so it lies inside the raw
 * block; it is not keyed (a wrong record can only misreport that one
 * block) and not erased (without a header it means nothing).
 *
 * The two words, both keyed by the process secret (shared.c) and bound to
 * the block's own address:
 *
 *   filter = user ^ key_filter
 *   meta   = offset/16 (bits 0..7) | extra/16 (bits 8..15) | reported (bit 16)
 *          | tag (bits 17..63)
 *   tag    = top 47 bits of ((rot32((user ^ key_xor) * key_mul) ^ fields) * key_mul)
 *
 * The inline free path compares only the filter word (ddheap/fastpath.h:
 * load, XOR, compare, branch), so the frees of unsampled blocks pay four
 * instructions while something is live. The filter alone is not a proof: a
 * leaked header reveals key_filter. The cold path therefore verifies the
 * tag (ddheap_header_read, below), whose keys a header does not reveal,
 * before it trusts offset and extra. The tag binds address and fields after a
 * multiply and a rotation: were they simply XORed, a header copied from
 * block x to y with its fields adjusted by x ^ y would pass, the forgery
 * tests/fuzz/fuzz_forge.c looks for. Forging a header for another address
 * or other fields means guessing 47 bits.
 *
 * Page rule: a user pointer in the first 16 bytes of a page never carries a
 * readable header, so the free path can refuse such pointers without
 * reading (the 16 bytes before them may be on an unmapped page). Blocks
 * that land there, and every page-or-larger aligned block (which needs no
 * slack at all: user = raw), are recorded in the process-wide table
 * (mark_table.c) instead.
 */
#ifndef DDHEAP_MARK_HEADER_H
#define DDHEAP_MARK_HEADER_H

#include <errno.h>

static inline bool ddheap_on_page_start(uintptr_t user)
{
    return (user & (DDHEAP__PAGE - 1)) < DDHEAP__HEADER;
}

/* record + header: the smallest step (a multiple of every default
 * alignment, so it keeps them). */
#define DDHEAP_HEADER_STEP 32u

static inline size_t ddheap_mark_extra(size_t alignment)
{
    if (DDHEAP__LIKELY(alignment == 0))
        return DDHEAP_HEADER_STEP; /* the allocator's default */
    if (alignment <= DDHEAP_HEADER_STEP) {
        if ((alignment & (alignment - 1)) != 0)
            return SIZE_MAX; /* 3, 5, ...: not a power of two */
        return DDHEAP_HEADER_STEP; /* 1, 2, 4, 8, 16, 32 */
    }
    if ((alignment & (alignment - 1)) != 0 || alignment > DDHEAP_MAX_SAMPLED_ALIGNMENT)
        return SIZE_MAX;
    return alignment >= DDHEAP__PAGE ? 0 : alignment;
}

static inline bool ddheap_mark_thread_ready(struct ddheap__thread *t)
{
    (void)t;
    return true; /* headers need nothing from the kernel */
}

/* meta word: fields in bits 0..16, the keyed tag above them */
#define DDHEAP_HEADER_FIELD_MASK ((UINT64_C(1) << 17) - 1)
#define DDHEAP_HEADER_REPORTED (UINT64_C(1) << 16)

/* offset and extra are multiples of 16 below a page, and the offset
 * leaves room for record and header (mark_extra and realloc.c make them
 * so); anything else cannot be a header's. */
static inline bool ddheap_header_fields(uint32_t offset, size_t extra, bool reported,
                                        uint64_t *fields)
{
    if (offset < DDHEAP_HEADER_STEP || offset % 16 || extra % 16 || extra < offset ||
        extra >= DDHEAP__PAGE)
        return false;
    *fields = (uint64_t)(offset / 16) | (uint64_t)(extra / 16) << 8 |
              (reported ? DDHEAP_HEADER_REPORTED : 0);
    return true;
}

/* The keyed tag of a header at `user` with these fields (bits 17..63). */
static inline uint64_t ddheap_header_tag(uintptr_t user, uint64_t fields, uint64_t key_xor,
                                         uint64_t key_mul)
{
    uint64_t a = ((uint64_t)user ^ key_xor) * key_mul;
    a = (a >> 32 | a << 32) ^ fields;
    return (a * key_mul) & ~DDHEAP_HEADER_FIELD_MASK;
}

/* key_mul, or 0 while the keys are not derived yet. It is odd once set,
 * and stored last with release ordering (shared.c), so a non-zero value
 * read here with acquire ordering comes with the other two keys. */
static inline uint64_t ddheap_key_mul_if_ready(void)
{
    return __atomic_load_n(&ddheap_shared_v3.key_mul, __ATOMIC_ACQUIRE);
}

/* The two words of the header of a block at `user` (fields encoded). The
 * keys are read as atomics: threads that mark the process's first blocks
 * at once may each derive (and store) them, with the same values. */
static inline void ddheap_header_compute(uintptr_t user, uint64_t fields, uint64_t key_mul,
                                         uint64_t words[2])
{
    struct ddheap__shared *sh = &ddheap_shared_v3;
    words[0] = (uint64_t)user ^ __atomic_load_n(&sh->key_filter, __ATOMIC_RELAXED);
    words[1] = fields | ddheap_header_tag(user, fields,
                                          __atomic_load_n(&sh->key_xor, __ATOMIC_RELAXED), key_mul);
}

/* Writes the header of a block at `user` (fields already encoded). */
static inline void ddheap_header_write(uintptr_t user, uint64_t fields, uint64_t key_mul)
{
    uint64_t words[2];
    ddheap_header_compute(user, fields, key_mul, words);
    __builtin_memcpy((char *)user - DDHEAP__HEADER, words, sizeof words);
}

/* The quick mark of a fresh, reported block whose user pointer sits
 * `extra` bytes into it: a header, written inline. NULL, with nothing
 * written, when the block needs ddheap_mark_at() instead (keys not derived
 * yet, a user pointer at a page start, an extra no header can hold). */
static inline void *ddheap_mark_fresh(void *raw, size_t extra)
{
    uintptr_t user = (uintptr_t)raw + extra;
    uint64_t key_mul = ddheap_key_mul_if_ready();
    /* extra must be a multiple of 16 in [32, 2064], which covers what
     * mark_extra gives below a page and fits the 8-bit fields */
    if (DDHEAP__UNLIKELY(key_mul == 0 || ddheap_on_page_start(user) ||
                         ((extra - DDHEAP_HEADER_STEP) & ~(uint64_t)0x7f0) != 0))
        return NULL;
    ddheap_header_write(user, (extra / 16) * 0x101 | DDHEAP_HEADER_REPORTED, key_mul);
    ddheap_count_marked(1);
    return (void *)user;
}

/* Whether the 16 bytes before `user`, whose filter word matched, are a
 * header written for this very address; if so, what it says. The filter
 * proves nothing (its key is no secret) and was compared with a key read
 * without ordering; here the keys are read after key_mul with acquire
 * ordering, and the tag decides on its own. A forgery passes only by
 * guessing the 47-bit tag, and would be wrong whatever its fields say, so
 * the fields are taken as they are. */
DDHEAP__NO_SANITIZE_PEEK
static inline bool ddheap_header_read(uintptr_t user, struct ddheap_mark *out)
{
    uint64_t key_mul = ddheap_key_mul_if_ready();
    if (key_mul == 0)
        return false;
    uint64_t meta;
    __builtin_memcpy(&meta, (const char *)user - DDHEAP__HEADER + 8, sizeof meta);
    uint64_t fields = meta & DDHEAP_HEADER_FIELD_MASK;
    if ((meta & ~DDHEAP_HEADER_FIELD_MASK) !=
        ddheap_header_tag(user, fields, __atomic_load_n(&ddheap_shared_v3.key_xor, __ATOMIC_RELAXED),
                          key_mul))
        return false;
    out->offset = (uint32_t)(fields << 4) & 0xff0;
    out->extra = (size_t)(fields >> 4) & 0xff0;
    out->reported = (fields & DDHEAP_HEADER_REPORTED) != 0;
    out->raw = (void *)(user - out->offset);
    return true;
}

/* The quick unmark, for a pointer whose filter word matched (the fast path
 * tested it): 1 when `user` was a marked block (header verified and zeroed,
 * counted down), 0 when it is not one, -1 when the pointer needs
 * ddheap_unmark() instead (a page-start pointer: the table). */
static inline int ddheap_unmark_quick(void *ptr, struct ddheap_mark *out)
{
    uintptr_t user = (uintptr_t)ptr;
    if (DDHEAP__UNLIKELY(ddheap_on_page_start(user)))
        return -1;
    if (!ddheap_header_read(user, out))
        return 0;
    /* Zeroed so that a later unsampled block at this address is never
     * mistaken for this one. */
    __builtin_memset((char *)user - DDHEAP__HEADER, 0, DDHEAP__HEADER);
    ddheap_count_marked(-1);
    return 1;
}

/* The record of a reported block (see the top of this file): in the block
 * before its header, or in its table slot for a page-start pointer. */
#define DDHEAP_MARK_KEEPS_REPORT 1
#define DDHEAP_HEADER_RECORD 16u

static inline void ddheap_mark_keep_report(void *ptr, uint64_t size, uint64_t weight)
{
    uintptr_t user = (uintptr_t)ptr;
    if (DDHEAP__UNLIKELY(ddheap_on_page_start(user))) {
        ddheap_table_keep_report(user, size, weight);
        return;
    }
    uint64_t record[2] = {size, weight};
    __builtin_memcpy((char *)user - DDHEAP__HEADER - DDHEAP_HEADER_RECORD, record, sizeof record);
}

/* The record of a block whose header was just verified (offset >= 32). */
static inline void ddheap_header_recall(uintptr_t user, struct ddheap_mark *out)
{
    uint64_t record[2] = {0, 0};
    if (out->reported)
        __builtin_memcpy(record, (const char *)user - DDHEAP__HEADER - DDHEAP_HEADER_RECORD,
                         sizeof record);
    out->size = record[0];
    out->weight = record[1];
}

#endif /* DDHEAP_MARK_HEADER_H */

/*
 * Header marking (x86-64; aarch64 with -Darm64_marking=header).
 *
 *   raw                      user = raw + step
 *   |  ...slack...  | filter | meta |  user data (size bytes)  |
 *                    <--- 16 bytes -->
 *
 * step = max(alignment, 16) for alignments below a page, so the request
 * grows by step bytes and the user pointer keeps the alignment the real
 * allocator gave raw.
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
 * tag (lookup, below), whose keys a header does not reveal, before it
 * trusts offset and extra. The tag binds address and fields after a
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
#include "mark.h"

#include <ddheap/config.h>
#include <errno.h>

#if !DDHEAP_MARK_TBI

static bool power_of_two(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

static bool on_page_start(uintptr_t user)
{
    return (user & (DDHEAP__PAGE - 1)) < DDHEAP__HEADER;
}

size_t ddheap_mark_extra(size_t alignment)
{
    if (alignment == 0)
        return DDHEAP__HEADER;
    if (!power_of_two(alignment) || alignment > DDHEAP_MAX_SAMPLED_ALIGNMENT)
        return SIZE_MAX;
    if (alignment >= DDHEAP__PAGE)
        return 0;
    return alignment > DDHEAP__HEADER ? alignment : DDHEAP__HEADER;
}

static void count_marked(int delta)
{
    __atomic_add_fetch(&ddheap_shared_v2.live_marked, (uint64_t)(int64_t)delta, __ATOMIC_RELAXED);
}

#define FIELD_BITS 17
#define FIELD_MASK ((UINT64_C(1) << FIELD_BITS) - 1)
#define REPORTED_FIELD (UINT64_C(1) << 16)

/* offset and extra are multiples of 16 below a page (mark_extra and
 * realloc.c make them so); anything else cannot be a header's. */
static bool encode_fields(uint32_t offset, size_t extra, bool reported, uint64_t *fields)
{
    if (offset < DDHEAP__HEADER || offset % 16 || extra % 16 || extra < offset ||
        extra >= DDHEAP__PAGE)
        return false;
    *fields = (uint64_t)(offset / 16) | (uint64_t)(extra / 16) << 8 |
              (reported ? REPORTED_FIELD : 0);
    return true;
}

static uint64_t rot32(uint64_t x)
{
    return x >> 32 | x << 32;
}

/* The keyed tag of a header at `user` with these fields, in bits 17..63. */
static uint64_t header_tag(uintptr_t user, uint64_t fields, uint64_t key_xor, uint64_t key_mul)
{
    uint64_t a = rot32(((uint64_t)user ^ key_xor) * key_mul) ^ fields;
    return (a * key_mul) & ~FIELD_MASK;
}

bool ddheap_header_words(uintptr_t user, uint32_t offset, size_t extra, bool reported,
                         uint64_t words[2])
{
    const struct ddheap__shared *sh = &ddheap_shared_v2;
    uint64_t fields;
    if (!encode_fields(offset, extra, reported, &fields))
        return false;
    words[0] = (uint64_t)user ^ sh->key_filter;
    words[1] = fields | header_tag(user, fields, sh->key_xor, sh->key_mul);
    return true;
}

void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported)
{
    uintptr_t user = (uintptr_t)raw + offset;
    /* The keys are normally derived by the constructor; only an allocation
     * made before it pays the call (getauxval may set errno). */
    if (DDHEAP__UNLIKELY(!__atomic_load_n(&ddheap_shared_v2.keys_ready, __ATOMIC_ACQUIRE))) {
        int saved_errno = errno;
        ddheap_ensure_keys();
        errno = saved_errno;
    }
    if (on_page_start(user)) {
        if (!ddheap_table_insert(user, ddheap_table_meta(offset, extra, reported)))
            return NULL;
    } else {
        uint64_t words[2];
        if (!ddheap_header_words(user, offset, extra, reported, words))
            return NULL; /* no room for a header inside the block */
        __builtin_memcpy((char *)user - DDHEAP__HEADER, words, sizeof words);
    }
    count_marked(1);
    return (void *)user;
}

bool ddheap_mark_thread_ready(struct ddheap__thread *t)
{
    (void)t;
    return true;
}

int ddheap_mark_thread_status(const struct ddheap__thread *t)
{
    (void)t;
    return DD_HEAP_THREAD_SAMPLING_READY;
}

/* Headers need nothing from the kernel: there is no tagging to fail. */
void ddheap_test_fail_tagging(bool fail)
{
    (void)fail;
}

/* Whether the 16 bytes before `user` are a header written by mark_at for
 * this very address; if so, what it says. The fast path compared the
 * filter word with keys it read without ordering; here they are read after
 * keys_ready with acquire ordering, and the tag decides. */
DDHEAP__NO_SANITIZE_PEEK
static bool ddheap_header_read(uintptr_t user, struct ddheap_mark *out)
{
    const struct ddheap__shared *sh = &ddheap_shared_v2;
    if (!__atomic_load_n(&sh->keys_ready, __ATOMIC_ACQUIRE))
        return false;
    uint64_t words[2];
    __builtin_memcpy(words, (const char *)user - DDHEAP__HEADER, sizeof words);
    uint64_t fields = words[1] & FIELD_MASK;
    if ((words[0] ^ (uint64_t)user) != sh->key_filter ||
        (words[1] & ~FIELD_MASK) != header_tag(user, fields, sh->key_xor, sh->key_mul))
        return false;
    out->offset = (uint32_t)(fields & 0xff) * 16;
    out->extra = (size_t)((fields >> 8) & 0xff) * 16;
    out->reported = (fields & REPORTED_FIELD) != 0;
    out->raw = (void *)(user - out->offset);
    /* A tag is only ever computed over encodable fields; re-checked so that
     * a key collision can never yield an offset outside the block. */
    return out->offset >= DDHEAP__HEADER && out->offset <= out->extra;
}

bool ddheap_mark_lookup(void *ptr, struct ddheap_mark *out)
{
    uintptr_t user = (uintptr_t)ptr;
    if (ptr == NULL || __atomic_load_n(&ddheap_shared_v2.live_marked, __ATOMIC_RELAXED) == 0)
        return false;
    if (on_page_start(user)) {
        uint64_t meta;
        if (!ddheap_table_find(user, &meta))
            return false;
        *out = ddheap_table_meta_decode(user, meta);
        return true;
    }
    return ddheap_header_read(user, out);
}

bool ddheap_unmark(void *ptr, struct ddheap_mark *out)
{
    uintptr_t user = (uintptr_t)ptr;
    if (!ddheap_mark_lookup(ptr, out))
        return false;
    if (on_page_start(user)) {
        uint64_t meta;
        if (!ddheap_table_remove(user, &meta))
            return false; /* lost a race with another free of the same block */
    } else {
        /* Zeroed so that a later unsampled block at this address is never
         * mistaken for this one. */
        __builtin_memset((char *)user - DDHEAP__HEADER, 0, DDHEAP__HEADER);
    }
    count_marked(-1);
    return true;
}

#endif /* !DDHEAP_MARK_TBI */

/*
 * Header marking (x86-64; aarch64 with -Darm64_marking=header).
 *
 *   raw                      user = raw + step
 *   |  ...slack...  | check | meta |  user data (size bytes)  |
 *                    <-- 16 bytes -->
 *
 * step = max(alignment, 16) for alignments below a page, so the request
 * grows by step bytes and the user pointer keeps the alignment the real
 * allocator gave raw. meta holds the offset (step), the extra bytes (step)
 * and the reported bit; check = ddheap__check_word(user, meta) (fastpath.h),
 * keyed by the process secret, so neither forged nor copied bytes pass.
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
    __atomic_add_fetch(&ddheap_shared_v1.live_marked, (uint64_t)(int64_t)delta, __ATOMIC_RELAXED);
}

void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported)
{
    uintptr_t user = (uintptr_t)raw + offset;
    uint64_t meta = ddheap_meta(offset, extra, reported);
    /* The keys are normally derived by the constructor; only an allocation
     * made before it pays the call (getauxval may set errno). */
    if (DDHEAP__UNLIKELY(!__atomic_load_n(&ddheap_shared_v1.keys_ready, __ATOMIC_ACQUIRE))) {
        int saved_errno = errno;
        ddheap_ensure_keys();
        errno = saved_errno;
    }
    if (on_page_start(user)) {
        if (!ddheap_table_insert(user, meta))
            return NULL;
    } else {
        if (offset < DDHEAP__HEADER)
            return NULL; /* no room for a header inside the block */
        uint64_t check = ddheap__check_word(user, meta);
        __builtin_memcpy((char *)user - DDHEAP__HEADER, &check, sizeof check);
        __builtin_memcpy((char *)user - DDHEAP__HEADER + 8, &meta, sizeof meta);
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

/* A header that passed the keyed check also has to make sense; anything
 * else is treated as unmarked (the pointer goes to the real free as is). */
static bool plausible_header_meta(uint64_t meta)
{
    uint32_t offset = (uint32_t)meta;
    uint64_t extra = (meta & ~DDHEAP__META_REPORTED) >> 32;
    return offset >= DDHEAP__HEADER && offset % DDHEAP__HEADER == 0 && offset <= extra &&
           extra < DDHEAP__PAGE;
}

DDHEAP__NO_SANITIZE_PEEK
bool ddheap_mark_lookup(void *ptr, struct ddheap_mark *out)
{
    uintptr_t user = (uintptr_t)ptr;
    uint64_t meta;
    if (ptr == NULL || __atomic_load_n(&ddheap_shared_v1.live_marked, __ATOMIC_RELAXED) == 0)
        return false;
    if (on_page_start(user)) {
        if (!ddheap_table_find(user, &meta))
            return false;
    } else {
        /* The fast path may have read keys before they were visible to this
         * thread; re-check with acquire ordering before trusting a match. */
        if (!__atomic_load_n(&ddheap_shared_v1.keys_ready, __ATOMIC_ACQUIRE))
            return false;
        uint64_t check;
        __builtin_memcpy(&check, (const char *)user - DDHEAP__HEADER, sizeof check);
        __builtin_memcpy(&meta, (const char *)user - DDHEAP__HEADER + 8, sizeof meta);
        if (check != ddheap__check_word(user, meta) || !plausible_header_meta(meta))
            return false;
    }
    *out = ddheap_meta_decode(user, meta);
    return true;
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

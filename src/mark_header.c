/*
 * Header marking: the general operations of the contract (mark.h), for
 * every case the quick inline ones in mark_header.h leave out: keys not yet
 * derived, page-start pointers (the table), realloc's marks.
 */
#include "mark.h"

#include <errno.h>

#if DDHEAP_MARK_HEADER

bool ddheap_header_words(uintptr_t user, uint32_t offset, size_t extra, bool reported,
                         uint64_t words[2])
{
    uint64_t fields;
    if (!ddheap_header_fields(offset, extra, reported, &fields))
        return false;
    ddheap_header_compute(user, fields, ddheap_key_mul_if_ready(), words);
    return true;
}

void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported)
{
    uintptr_t user = (uintptr_t)raw + offset;
    /* The keys are normally derived by the constructor; only a block marked
     * before it pays the call (getauxval may set errno). */
    if (DDHEAP__UNLIKELY(ddheap_key_mul_if_ready() == 0)) {
        int saved_errno = errno;
        ddheap_ensure_keys();
        errno = saved_errno;
    }
    if (ddheap_on_page_start(user)) {
        if (!ddheap_table_insert(user, ddheap_table_meta(offset, extra, reported)))
            return NULL;
    } else {
        uint64_t fields;
        if (!ddheap_header_fields(offset, extra, reported, &fields))
            return NULL; /* no room for a header inside the block */
        ddheap_header_write(user, fields, ddheap_key_mul_if_ready());
    }
    ddheap_count_marked(1);
    return (void *)user;
}

bool ddheap_mark_lookup(void *ptr, struct ddheap_mark *out)
{
    uintptr_t user = (uintptr_t)ptr;
    if (ptr == NULL || __atomic_load_n(&ddheap_shared_v3.live_marked, __ATOMIC_RELAXED) == 0)
        return false;
    if (ddheap_on_page_start(user))
        return ddheap_table_find(user, out);
    if (!ddheap__header_filter_matches(user) || !ddheap_header_read(user, out))
        return false;
    ddheap_header_recall(user, out);
    return true;
}

bool ddheap_unmark(void *ptr, struct ddheap_mark *out)
{
    uintptr_t user = (uintptr_t)ptr;
    if (ptr == NULL || __atomic_load_n(&ddheap_shared_v3.live_marked, __ATOMIC_RELAXED) == 0)
        return false;
    if (!ddheap_on_page_start(user)) {
        if (!ddheap__header_filter_matches(user) || ddheap_unmark_quick(ptr, out) <= 0)
            return false;
        ddheap_header_recall(user, out); /* the header is zeroed, the record is not */
        return true;
    }
    if (!ddheap_table_remove(user, out))
        return false; /* not in the table, or lost a race with another free of it */
    ddheap_count_marked(-1);
    return true;
}

#endif /* DDHEAP_MARK_HEADER */

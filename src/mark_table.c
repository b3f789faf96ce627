/*
 * The process-wide table of marked blocks whose user pointer sits in the
 * first 16 bytes of a page (see mark_header.c). Lock-free open addressing
 * in ddheap_shared_v3.table, shared by every copy of the library.
 *
 * A pointer is looked for in a window of WINDOW slots from its hash; an
 * insert that finds its window full goes anywhere in the table and bumps
 * table_overflow, which makes lookups scan the whole table while such an
 * entry lives. Frees consult the table only while table_live != 0, and only
 * for page-start pointers.
 *
 * Slot protocol: 0 free, BUSY claimed, anything else a user pointer whose
 * meta is valid. Insert claims 0 -> BUSY, writes meta, publishes the
 * pointer (release). Remove claims pointer -> BUSY, reads meta, frees the
 * slot (release). Only the owner of a live block removes it, so a pointer
 * is never in two slots.
 */
#include "mark.h"

#define WINDOW 16u
#define BUSY UINTPTR_MAX

static size_t home_slot(uintptr_t user)
{
    uint64_t h = (uint64_t)(user >> 4) * UINT64_C(0x9e3779b97f4a7c15);
    return (size_t)(h >> 40) & (DDHEAP__TABLE_SLOTS - 1);
}

static size_t distance(size_t home, size_t slot)
{
    return (slot - home) & (DDHEAP__TABLE_SLOTS - 1);
}

static bool claim(struct ddheap__table_slot *s, uintptr_t user, uint64_t meta)
{
    uintptr_t expected = 0;
    if (!__atomic_compare_exchange_n(&s->user, &expected, BUSY, false, __ATOMIC_ACQUIRE,
                                     __ATOMIC_RELAXED))
        return false;
    __atomic_store_n(&s->meta, meta, __ATOMIC_RELAXED);
    __atomic_store_n(&s->user, user, __ATOMIC_RELEASE);
    return true;
}

bool ddheap_table_insert(uintptr_t user, uint64_t meta)
{
    struct ddheap__shared *sh = &ddheap_shared_v3;
    size_t home = home_slot(user);
    for (size_t i = 0; i < DDHEAP__TABLE_SLOTS; i++) {
        size_t at = (home + i) & (DDHEAP__TABLE_SLOTS - 1);
        if (i == WINDOW)
            __atomic_add_fetch(&sh->table_overflow, 1, __ATOMIC_RELAXED);
        if (claim(&sh->table[at], user, meta)) {
            __atomic_add_fetch(&sh->table_live, 1, __ATOMIC_RELAXED);
            return true;
        }
    }
    __atomic_sub_fetch(&sh->table_overflow, 1, __ATOMIC_RELAXED);
    return false;
}

static struct ddheap__table_slot *find_slot(uintptr_t user)
{
    struct ddheap__shared *sh = &ddheap_shared_v3;
    size_t home = home_slot(user);
    size_t span = __atomic_load_n(&sh->table_overflow, __ATOMIC_RELAXED) ? DDHEAP__TABLE_SLOTS : WINDOW;
    for (size_t i = 0; i < span; i++) {
        struct ddheap__table_slot *s = &sh->table[(home + i) & (DDHEAP__TABLE_SLOTS - 1)];
        if (__atomic_load_n(&s->user, __ATOMIC_ACQUIRE) == user)
            return s;
    }
    return NULL;
}

bool ddheap_table_find(uintptr_t user, uint64_t *meta)
{
    struct ddheap__table_slot *s = find_slot(user);
    if (!s)
        return false;
    *meta = __atomic_load_n(&s->meta, __ATOMIC_RELAXED);
    return true;
}

bool ddheap_table_remove(uintptr_t user, uint64_t *meta)
{
    struct ddheap__shared *sh = &ddheap_shared_v3;
    struct ddheap__table_slot *s = find_slot(user);
    uintptr_t expected = user;
    if (!s || !__atomic_compare_exchange_n(&s->user, &expected, BUSY, false, __ATOMIC_ACQUIRE,
                                           __ATOMIC_RELAXED))
        return false;
    *meta = __atomic_load_n(&s->meta, __ATOMIC_RELAXED);
    __atomic_store_n(&s->meta, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->user, 0, __ATOMIC_RELEASE);
    if (distance(home_slot(user), (size_t)(s - sh->table)) >= WINDOW)
        __atomic_sub_fetch(&sh->table_overflow, 1, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&sh->table_live, 1, __ATOMIC_RELAXED);
    return true;
}

/*
 * Shadow marking (-Dmarking=shadow): pointers and sizes pass through
 * unchanged, and "a sampled block starts at this address" is one bit beside
 * the heap. The general operations of the contract (mark.h); the quick ones,
 * and the layout of a word, are in mark_shadow.h.
 *
 * Structure, all of it in ddheap_shared_v3 (one per process, every copy of
 * the library sees the same bits) or mapped from it:
 *
 *  - tables of 64-bit words, table k holding 2^(14+k) buckets of two
 *    words (table 0: 256 KiB), each mapped with mmap the first time a mark
 *    finds no room in the tables before it, and installed with one
 *    compare-and-swap (the loser of a race unmaps its copy). A span has one
 *    bucket per table, chosen by a hash of its own per table. At most
 *    DDHEAP__SHADOW_LEVELS tables: a mark that finds no room anywhere
 *    leaves its block unsampled and counts it in shadow_overflow.
 *  - shadow_upper_live, the bits set beyond table 0: while it is zero, as
 *    it is unless table 0 ran out of room for some span, every operation
 *    reads one bucket (mark_shadow.h).
 *  - the summary: a saturating counter per residue of the address's bits
 *    12..31, raised before a bit is set and lowered after it is cleared.
 *    The inline free path reads only the live count and this byte; a zero
 *    sends the free straight to the real allocator.
 *
 * Why this shape (docs/design.md, "Shadow marking"): the bit and the span
 * it belongs to share one word, so set and test-and-clear are single
 * compare-and-swaps that can never touch another block's bit, and a word
 * is free again as soon as its bits are clear. Nothing has to be reclaimed,
 * so a heap that wanders across the address space reuses the same words,
 * and memory is bounded by the peak number of live sampled blocks, not by
 * how much address space they ever covered. A hash table of words also
 * costs about 8 bytes per live block where a radix tree would pay at least
 * a 64-byte leaf per touched page plus its pointers. Direct mapping keeps
 * a lookup at one bucket per table, and in the first table only while
 * nothing overflowed (4000 blocks spread over 1 GiB: a handful beyond it).
 *
 * Hazards: everything here may run inside a malloc, in a signal handler or
 * in a child just forked: lock-free atomics and mmap only, errno kept.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE, mincore, pread */
#include "mark.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#if DDHEAP_MARK_SHADOW

static size_t level_bytes(unsigned k)
{
    return ((size_t)1 << (DDHEAP_SHADOW_LEVEL0_BUCKETS_SHIFT + k)) * DDHEAP_SHADOW_BUCKET_WORDS *
           sizeof(uint64_t);
}

void ddheap_shadow_process_init(void)
{
    /* Both calls fail (length 0) without touching anything, but bind the
     * symbols now, so lazy binding never runs inside a cold path. */
    void *p = mmap(NULL, 0, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
        (void)munmap(p, 0);
    (void)munmap(NULL, 0);
}

/* Level k, mapping it if it does not exist yet; NULL if it cannot be. */
static uint64_t *install_level(unsigned k)
{
    uint64_t **slot = &ddheap_shared_v3.shadow_levels[k];
    uint64_t *current = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (current)
        return current;
    if (k == 0) {
        /* The first mark of the process, in any copy: open every copy's
         * free gate before any bit can be set (shared.c). Level 0 being
         * mapped is what the quick paths take as "the gates are open". */
        ddheap_ensure_keys();
    }
    size_t bytes = level_bytes(k);
    void *fresh = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fresh == MAP_FAILED)
        return NULL;
    uint64_t *expected = NULL;
    if (!__atomic_compare_exchange_n(slot, &expected, (uint64_t *)fresh, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        (void)munmap(fresh, bytes); /* another thread (or copy) won */
        return expected;
    }
    return (uint64_t *)fresh;
}

/* Looks at the span's bucket in every mapped table; *level_of gets the
 * table of the chosen word. */
static struct ddheap_shadow_slot scan_all(uint64_t span, uint64_t bit, unsigned *level_of)
{
    struct ddheap_shadow_slot s = {NULL, 0, false, false};
    for (unsigned k = 0; k < DDHEAP__SHADOW_LEVELS; k++) {
        uint64_t *level = ddheap_shadow_level(k);
        if (level == NULL)
            break;
        uint64_t *before = s.word;
        bool own_before = s.own;
        ddheap_shadow_look(ddheap_shadow_bucket(level, k, span), span << 16, bit, &s);
        if (s.word != before && (s.own || !own_before))
            *level_of = k;
    }
    return s;
}

static void count_upper(unsigned level, int delta)
{
    if (level > 0)
        __atomic_add_fetch(&ddheap_shared_v3.shadow_upper_live, (uint64_t)(int64_t)delta,
                           __ATOMIC_RELAXED);
}

/* Sets the bit of `address`. 1: set; 0: it was set already (a sampled
 * block at this address was freed without ddheap); -1: no room. */
static int set_bit(uintptr_t address)
{
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    uint64_t bit = ddheap_shadow_bit(address);
    for (;;) {
        unsigned level = 0;
        struct ddheap_shadow_slot s = scan_all(span, bit, &level);
        if (s.stale)
            return 0;
        if (s.word == NULL) {
            unsigned mapped = ddheap_shadow_levels_mapped();
            if (mapped < DDHEAP__SHADOW_LEVELS && install_level(mapped) != NULL)
                continue;
            __atomic_add_fetch(&ddheap_shared_v3.shadow_overflow, 1, __ATOMIC_RELAXED);
            return -1;
        }
        /* counted before the bit is set, as every count (mark_shadow.h) */
        ddheap_shadow_count(address, 1);
        count_upper(level, 1);
        if (ddheap_shadow_try_set(&s, span << 16, bit))
            return 1;
        count_upper(level, -1);
        ddheap_shadow_count(address, -1);
        /* the word changed under us: look again */
    }
}

void *ddheap_mark_at(void *raw, uint32_t offset, size_t extra, bool reported)
{
    uintptr_t address = (uintptr_t)raw;
    /* A bit says one thing, "sampled and reported": no room for an offset
     * or extra bytes (mark_extra never asks for any). */
    if (offset != 0 || extra != 0 || !reported || !ddheap_shadow_markable(address))
        return NULL;
    int saved_errno = errno;
    int outcome = -1;
    if (install_level(0) != NULL)
        outcome = set_bit(address);
    errno = saved_errno;
    if (outcome < 0)
        return NULL;
    if (outcome == 0) {
        /* The block that left this bit was freed behind ddheap's back (an
         * unhooked free, docs/probes.md): its free is reported now, before
         * the new block's alloc, so a consumer's stream stays balanced. The
         * bit stays set, now for the new block. */
        (void)ddheap_fire_free(address, raw, 0);
    }
    return raw;
}

/* Clears the bit of `address` in whichever mapped table holds it. */
static bool clear_bit(uintptr_t address)
{
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    uint64_t bit = ddheap_shadow_bit(address);
    for (unsigned k = 0; k < DDHEAP__SHADOW_LEVELS; k++) {
        uint64_t *level = ddheap_shadow_level(k);
        if (level == NULL)
            break;
        if (ddheap_shadow_clear_in(ddheap_shadow_bucket(level, k, span), span << 16, bit)) {
            count_upper(k, -1); /* after the clear */
            return true;
        }
    }
    return false;
}

bool ddheap_mark_lookup(void *user, struct ddheap_mark *out)
{
    uintptr_t address = (uintptr_t)user;
    if (!ddheap_shadow_may_be_marked(address))
        return false;
    uint64_t span = (uint64_t)address >> DDHEAP_SHADOW_SPAN_SHIFT;
    struct ddheap_shadow_slot s = {NULL, 0, false, false};
    for (unsigned k = 0; k < DDHEAP__SHADOW_LEVELS && !s.stale; k++) {
        uint64_t *level = ddheap_shadow_level(k);
        if (level == NULL)
            break;
        ddheap_shadow_look(ddheap_shadow_bucket(level, k, span), span << 16,
                           ddheap_shadow_bit(address), &s);
    }
    if (!s.stale)
        return false;
    out->raw = user;
    out->extra = 0;
    out->offset = 0;
    out->reported = true;
    return true;
}

bool ddheap_unmark(void *user, struct ddheap_mark *out)
{
    uintptr_t address = (uintptr_t)user;
    if (!ddheap_shadow_may_be_marked(address) || !clear_bit(address))
        return false;
    ddheap_shadow_unmarked(user, out);
    return true;
}

unsigned ddheap_shadow_levels_mapped(void)
{
    unsigned k = 0;
    while (k < DDHEAP__SHADOW_LEVELS && ddheap_shadow_level(k) != NULL)
        k++;
    return k;
}

/* Page-aligned bounds of [start, start + bytes), outward. */
static void page_bounds(const void *start, size_t bytes, size_t *page, uintptr_t *first,
                        uintptr_t *end)
{
    long page_size = sysconf(_SC_PAGESIZE);
    *page = page_size > 0 ? (size_t)page_size : DDHEAP__PAGE;
    *first = (uintptr_t)start & ~(uintptr_t)(*page - 1);
    *end = ((uintptr_t)start + bytes + *page - 1) & ~(uintptr_t)(*page - 1);
}

/* Bytes of memory that [start, start + bytes) holds: pages present and
 * private to the process (/proc/self/pagemap bits 63 and 56). A page only
 * ever read maps the kernel's shared zero page, which costs nothing and is
 * not counted. 0 if pagemap cannot be read. */
static size_t written_bytes(const void *start, size_t bytes)
{
    size_t page;
    uintptr_t first, end;
    page_bounds(start, bytes, &page, &first, &end);
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t resident = 0;
    uint64_t entries[512];
    for (uintptr_t at = first; at < end;) {
        size_t pages = (end - at) / page;
        if (pages > sizeof entries / sizeof *entries)
            pages = sizeof entries / sizeof *entries;
        ssize_t got = pread(fd, entries, pages * sizeof *entries,
                            (off_t)(at / page * sizeof *entries));
        if (got <= 0)
            break;
        pages = (size_t)got / sizeof *entries;
        for (size_t i = 0; i < pages; i++)
            if ((entries[i] >> 63 & 1) && (entries[i] >> 56 & 1))
                resident += page;
        at += pages * page;
    }
    close(fd);
    return resident;
}

/* Bytes of [start, start + bytes) mapped in memory, as mincore(2) says:
 * an upper bound of written_bytes (pages only read count too), for where
 * pagemap says nothing (qemu-user shows the host's view of it). */
static size_t resident_bytes(const void *start, size_t bytes)
{
    size_t page;
    uintptr_t first, end;
    page_bounds(start, bytes, &page, &first, &end);
    size_t resident = 0;
    unsigned char vec[256];
    for (uintptr_t at = first; at < end;) {
        size_t pages = (end - at) / page;
        if (pages > sizeof vec)
            pages = sizeof vec;
        if (mincore((void *)at, pages * page, vec) != 0)
            return resident;
        for (size_t i = 0; i < pages; i++)
            resident += (vec[i] & 1) ? page : 0;
        at += pages * page;
    }
    return resident;
}

size_t ddheap_shadow_metadata_bytes(size_t *mapped)
{
    size_t total_mapped = 0, written = 0, resident = 0;
    for (unsigned k = 0; k < DDHEAP__SHADOW_LEVELS; k++) {
        uint64_t *level = ddheap_shadow_level(k);
        if (level == NULL)
            break;
        total_mapped += level_bytes(k);
        written += written_bytes(level, level_bytes(k));
        resident += resident_bytes(level, level_bytes(k));
    }
    const uint8_t *summary = ddheap_shared_v3.shadow_summary;
    written += written_bytes(summary, sizeof ddheap_shared_v3.shadow_summary);
    resident += resident_bytes(summary, sizeof ddheap_shared_v3.shadow_summary);
    if (mapped)
        *mapped = total_mapped;
    return written ? written : resident;
}

#endif /* DDHEAP_MARK_SHADOW */

/*
 * A fake real allocator for the unit tests, wired to ddheap the way a user
 * would wire theirs, plus a recorder of the probe stream.
 *
 * The fake remembers every raw block it hands out (pointer, size it was
 * asked for, alignment), so tests can assert that the real free got back
 * exactly the pointer and, for sized frees, exactly the size it handed out,
 * and that nothing leaked. Its realloc can be told to fail, to move, or to
 * grow in place (every raw block has room to grow up to its capacity).
 */
#ifndef DDHEAP_TEST_FAKE_ALLOC_H
#define DDHEAP_TEST_FAKE_ALLOC_H

#include <ddheap.h>
#include <ddheap/testing.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define FAKE_MAX_BLOCKS 4096
#define FAKE_GROW_ROOM 4096 /* every raw block can grow in place by this much */

enum fake_realloc_mode { FAKE_REALLOC_MOVE, FAKE_REALLOC_IN_PLACE, FAKE_REALLOC_FAIL };

struct fake_block {
    void *raw;
    size_t size;      /* what the allocator was asked for */
    size_t alignment; /* 0 = default */
    void *storage;    /* what libc gave us */
};

static struct {
    struct fake_block blocks[FAKE_MAX_BLOCKS];
    size_t high; /* blocks[high..] were never used */
    size_t live;
    size_t allocs, frees, sized_frees;
    enum fake_realloc_mode realloc_mode;
    bool fail_alloc;
    size_t page_offset; /* place the next raw block at this offset in a page (+1: any) */
    void (*inside_realloc)(void); /* runs inside the real realloc, after the old block is gone */
} fake;

static inline struct fake_block *fake_find(void *raw)
{
    for (size_t i = 0; i < fake.high && raw != NULL; i++)
        if (fake.blocks[i].raw == raw)
            return &fake.blocks[i];
    return NULL;
}

static inline struct fake_block *fake_slot(void)
{
    for (size_t i = 0; i < FAKE_MAX_BLOCKS; i++) {
        if (fake.blocks[i].raw == NULL) {
            if (i >= fake.high)
                fake.high = i + 1;
            return &fake.blocks[i];
        }
    }
    fail_msg("fake allocator: more than %d live blocks", FAKE_MAX_BLOCKS);
    return NULL;
}

/* The raw allocation: aligned as asked (at least 16), optionally placed at
 * a chosen offset within a page so tests reach every header position. */
static inline void *fake_raw_alloc(size_t size, size_t alignment)
{
    if (fake.fail_alloc)
        return NULL;
    size_t align = alignment > 16 ? alignment : 16;
    size_t capacity = size + FAKE_GROW_ROOM;
    size_t pad = align + 4096;
    if (size > SIZE_MAX - FAKE_GROW_ROOM - pad)
        return NULL;
    char *storage = malloc(capacity + pad);
    if (!storage)
        return NULL;
    uintptr_t at = ((uintptr_t)storage + align - 1) & ~(uintptr_t)(align - 1);
    if (fake.page_offset) {
        uintptr_t want = (fake.page_offset - 1) & 4095;
        uintptr_t page = (at + 4095) & ~(uintptr_t)4095;
        if (want % (alignment ? alignment : 1) == 0)
            at = page + want;
    }
    struct fake_block *b = fake_slot();
    b->raw = (void *)at;
    b->size = size;
    b->alignment = alignment;
    b->storage = storage;
    fake.live++;
    fake.allocs++;
    return b->raw;
}

static inline void fake_raw_free(void *raw, size_t size)
{
    if (!raw)
        return;
    struct fake_block *b = fake_find(raw);
    assert_non_null(b); /* the real free got a pointer the allocator handed out */
    if (size) {
        assert_int_equal(size, b->size); /* sized free: exactly the size handed out */
        fake.sized_frees++;
    }
    free(b->storage);
    memset(b, 0, sizeof *b);
    fake.live--;
    fake.frees++;
}

static inline void *fake_raw_realloc(void *raw, size_t size)
{
    if (raw == NULL)
        return fake_raw_alloc(size, 0);
    if (size == 0) { /* glibc: realloc(p, 0) frees p */
        fake_raw_free(raw, 0);
        return NULL;
    }
    struct fake_block *b = fake_find(raw);
    assert_non_null(b);
    switch (fake.realloc_mode) {
    case FAKE_REALLOC_FAIL:
        return NULL;
    case FAKE_REALLOC_IN_PLACE:
        if (size <= b->size + FAKE_GROW_ROOM) {
            b->size = size;
            return raw;
        }
        return NULL;
    case FAKE_REALLOC_MOVE:
    default: {
        size_t old_size = b->size;
        void *fresh = fake_raw_alloc(size, 0);
        if (!fresh)
            return NULL;
        memcpy(fresh, raw, old_size < size ? old_size : size);
        fake_raw_free(raw, 0);
        if (fake.inside_realloc) /* e.g. a signal handler that allocates */
            fake.inside_realloc();
        return fresh;
    }
    }
}

static inline void fake_reset(void)
{
    for (size_t i = 0; i < fake.high; i++)
        if (fake.blocks[i].raw)
            free(fake.blocks[i].storage);
    memset(&fake, 0, sizeof fake);
}

/* --- the wiring under test, as a user writes it --- */

static inline void *t_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(fake_raw_alloc(req.size, req.alignment), req);
}

static inline void *t_aligned(size_t alignment, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    return dd_allocation_created(fake_raw_alloc(req.size, req.alignment), req);
}

static inline void t_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    fake_raw_free(f.ptr, 0);
}

static inline void t_free_sized(void *ptr, size_t size, size_t alignment)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, alignment);
    fake_raw_free(f.ptr, f.size);
}

static inline void *t_realloc(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    void *raw = fake_raw_realloc(prep.raw_ptr, prep.raw_size);
    return dd_allocation_realloc_commit(ptr, raw, prep);
}

/* --- probe recorder --- */

#define REC_MAX 65536

static struct {
    dd_probe_event_t ev[REC_MAX];
    size_t n;
    size_t allocs, frees, reallocs;
} rec;

static inline void rec_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (rec.n < REC_MAX)
        rec.ev[rec.n++] = *ev;
    rec.allocs += ev->kind == DD_PROBE_ALLOC;
    rec.frees += ev->kind == DD_PROBE_FREE;
    rec.reallocs += ev->kind == DD_PROBE_REALLOC;
}

static inline void rec_start(void)
{
    memset(&rec, 0, sizeof rec);
    ddheap_test_set_probe_hook(rec_hook, NULL);
}

/* Every test starts from: tracer simulated, the given interval, no hook
 * data, an empty fake allocator; and ends with nothing leaked. */
static inline void tracer_on(uint64_t interval)
{
    fake_reset();
    rec_start();
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(interval);
}

static inline void tracer_off(void)
{
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);
}

#endif /* DDHEAP_TEST_FAKE_ALLOC_H */

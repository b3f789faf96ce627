/*
 * libFuzzer target: the input is a program of allocation calls through an
 * allocator wired to ddheap, with arbitrary sizes (huge ones included),
 * alignments (not powers of two, up to 2^63), sampling intervals, tracer
 * attach/detach and failure injection in the real allocator. After every
 * call and at the end the invariants must hold, or the target aborts:
 *
 *  - the real allocator gets back exactly the raw pointers it handed out,
 *    with the sizes it was asked for (sized frees);
 *  - block contents survive (pattern checked before every free/realloc);
 *  - a request is never smaller than what the caller asked for;
 *  - every reported alloc has exactly one reported free, and no free is
 *    reported for a pointer not reported allocated;
 *  - nothing stays marked once every block is freed.
 *
 * Single-threaded and deterministic given the input (the thread's
 * generator is reseeded from the input), as libFuzzer wants.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include "fuzz_input.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 32
#define MAX_REAL (64u << 10)     /* the real allocator refuses more (as if out of memory) */
#define MAX_REAL_ALIGN (64u << 10) /* and larger alignments (2 MiB ones: tests/stress) */
#define LEDGER 256               /* power of two, > live raw blocks + reported pointers */

/* Sizes: mostly small, sometimes up to the real limit, sometimes at the
 * top of size_t where an enlarged request would overflow. */
static size_t take_size(struct input *in)
{
    uint8_t kind = (uint8_t)take(in, 1);
    switch (kind % 8) {
    case 0:
        return 0;
    case 1:
    case 2:
    case 3:
        return (size_t)take(in, 1);
    case 4:
    case 5:
        return (size_t)take(in, 2);
    case 6:
        return (size_t)take(in, 3) % (MAX_REAL + 1);
    default:
        return SIZE_MAX - (size_t)take(in, 2);
    }
}

static size_t take_alignment(struct input *in)
{
    uint8_t kind = (uint8_t)take(in, 1);
    if (kind < 200)
        return (size_t)1 << (kind % 24); /* 1 .. 8 MiB */
    if (kind < 230)
        return (size_t)take(in, 3); /* anything, powers of two or not */
    return (size_t)1 << (kind % 64);
}

/* --- the real allocator, with a ledger and failure injection --- */

struct entry {
    uintptr_t key;
    uint64_t val;
};

static struct entry raw_ledger[LEDGER], probe_ledger[LEDGER];
static unsigned fail_countdown; /* 0: never; n: the n-th next allocation fails */

static struct entry *ledger_find(struct entry *l, uintptr_t key, bool insert)
{
    size_t i = (size_t)((key * UINT64_C(0x9e3779b97f4a7c15)) >> 56) % LEDGER;
    for (size_t n = 0; n < LEDGER; n++, i = (i + 1) % LEDGER) {
        if (l[i].key == key)
            return &l[i];
        if (l[i].key == 0 && insert) {
            l[i].key = key;
            return &l[i];
        }
    }
    return NULL;
}

/* Removal by rebuilding the probe chain after the hole (small table). */
static void ledger_remove(struct entry *l, struct entry *e)
{
    e->key = 0;
    e->val = 0;
    size_t i = (size_t)(e - l);
    for (size_t n = 1; n < LEDGER; n++) {
        struct entry *next = &l[(i + n) % LEDGER];
        if (next->key == 0)
            break;
        struct entry moved = *next;
        next->key = 0;
        next->val = 0;
        struct entry *to = ledger_find(l, moved.key, true);
        CHECK(to != NULL);
        *to = moved;
    }
}

static size_t ledger_count(const struct entry *l)
{
    size_t n = 0;
    for (size_t i = 0; i < LEDGER; i++)
        n += l[i].key != 0;
    return n;
}

static bool inject_failure(void)
{
    return fail_countdown && --fail_countdown == 0;
}

static void *real_alloc(size_t size, size_t alignment, bool zero)
{
    if (inject_failure() || size > MAX_REAL || alignment > MAX_REAL_ALIGN ||
        (alignment & (alignment - 1))) {
        errno = ENOMEM;
        return NULL;
    }
    void *raw = NULL;
    if (alignment > 16) {
        if (posix_memalign(&raw, alignment, size ? size : 1) != 0)
            return NULL;
    } else {
        raw = malloc(size ? size : 1);
    }
    if (raw == NULL)
        return NULL;
    if (zero)
        memset(raw, 0, size);
    struct entry *e = ledger_find(raw_ledger, (uintptr_t)raw, true);
    CHECK(e != NULL && e->val == 0);
    e->val = size + 1; /* +1: a 0-byte block is still on the ledger */
    return raw;
}

static void real_free(void *raw, size_t size)
{
    if (raw == NULL)
        return;
    struct entry *e = ledger_find(raw_ledger, (uintptr_t)raw, false);
    CHECK(e != NULL); /* a pointer the real allocator handed out */
    CHECK(size == 0 || size == e->val - 1); /* the size it was asked for */
    ledger_remove(raw_ledger, e);
    free(raw);
}

static void *real_realloc(void *raw, size_t size)
{
    if (raw == NULL)
        return real_alloc(size, 0, false);
    if (size == 0) {
        real_free(raw, 0);
        return NULL;
    }
    struct entry *e = ledger_find(raw_ledger, (uintptr_t)raw, false);
    CHECK(e != NULL);
    if (inject_failure() || size > MAX_REAL) {
        errno = ENOMEM;
        return NULL;
    }
    void *moved = real_alloc(size, 0, false);
    if (moved == NULL)
        return NULL;
    e = ledger_find(raw_ledger, (uintptr_t)raw, false);
    memcpy(moved, raw, e->val - 1 < size ? e->val - 1 : size);
    real_free(raw, 0);
    return moved;
}

/* --- the probe stream --- */

static void hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_REALLOC)
        return;
    struct entry *e = ledger_find(probe_ledger, ev->ptr, ev->kind == DD_PROBE_ALLOC);
    if (ev->kind == DD_PROBE_ALLOC) {
        CHECK(e != NULL && e->val == 0); /* not reported twice */
        CHECK(ev->weight >= ev->size && ev->size > 0);
        e->val = 1;
    } else {
        CHECK(e != NULL && e->val == 1); /* a free follows its alloc */
        ledger_remove(probe_ledger, e);
    }
}

/* --- the wrapped allocator and the blocks it holds --- */

struct block {
    unsigned char *p;
    size_t size;
    size_t align;
    unsigned char seed;
};

static struct block slot[SLOTS];

/* The pattern: position-dependent bytes at both ends (a shifted copy shows
 * there), the seed in between (compared a word at a time: the fuzzer's
 * speed is what finds bugs). */
static unsigned char expected(const struct block *b, size_t i)
{
    if (i < 64)
        return (unsigned char)(b->seed + i * 7);
    if (i + 64 >= b->size)
        return (unsigned char)(b->seed ^ ((b->size - 1 - i) * 13));
    return b->seed;
}

static void fill(struct block *b)
{
    memset(b->p, b->seed, b->size);
    for (size_t i = 0; i < b->size && i < 64; i++)
        b->p[i] = expected(b, i);
    for (size_t i = b->size > 64 ? b->size - 64 : 0; i < b->size; i++)
        b->p[i] = expected(b, i);
}

/* The first n bytes at p hold what b's first n bytes held. */
static void check_kept(const struct block *b, const unsigned char *p, size_t n)
{
    size_t i = 0;
    uint64_t same = b->seed * UINT64_C(0x0101010101010101);
    while (i < n) {
        if (i >= 64 && i + 64 + 8 < b->size && i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            CHECK(w == same);
            i += 8;
        } else {
            CHECK(p[i] == expected(b, i));
            i++;
        }
    }
}

static void place(struct block *b, unsigned char *p, size_t size, size_t align, uint8_t seed)
{
    b->p = p;
    b->size = size;
    b->align = align;
    b->seed = seed;
    if (p)
        fill(b);
}

static void do_alloc(struct block *b, size_t size, size_t align, bool zero, uint8_t seed)
{
    int saved = errno = 12345;
    dd_alloc_req_t req = dd_allocation_requested(size, align);
    CHECK(errno == saved);
    CHECK(req.size >= size && req.user_size == size && req.alignment == align);
    CHECK(!DDHEAP_MARK_SHADOW || req.size == size); /* shadow: the request as asked */
    void *raw = real_alloc(req.size, req.alignment, zero);
    unsigned char *p = dd_allocation_created(raw, req);
    CHECK(!DDHEAP_MARK_SHADOW || p == raw);
    if (p == NULL)
        return;
    if (align > 1 && (align & (align - 1)) == 0)
        CHECK(((uintptr_t)p & (align - 1)) == 0);
    if (zero)
        for (size_t i = 0; i < size; i++)
            CHECK(p[i] == 0);
    place(b, p, size, align, seed);
}

static void do_free(struct block *b, bool sized)
{
    if (b->p == NULL) {
        dd_alloc_freed_t f = dd_allocation_freed(NULL, 0, 0);
        CHECK(f.ptr == NULL);
        return;
    }
    check_kept(b, b->p, b->size);
    dd_alloc_freed_t f = dd_allocation_freed(b->p, sized ? b->size : 0, sized ? b->align : 0);
    CHECK(!DDHEAP_MARK_SHADOW || (f.ptr == b->p && f.size == (sized ? b->size : 0)));
    real_free(f.ptr, sized ? f.size : 0);
    b->p = NULL;
}

static void do_realloc(struct block *b, size_t size, uint8_t seed)
{
    errno = 777;
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(b->p, size);
    CHECK(errno == 777);
    CHECK(prep.raw_size >= size || (b->p && size == 0));
    CHECK(!DDHEAP_MARK_SHADOW || (prep.raw_ptr == b->p && (prep.raw_size == size || size == 0)));
    void *raw = real_realloc(prep.raw_ptr, prep.raw_size);
    int after_real = errno;
    unsigned char *q = dd_allocation_realloc_commit(b->p, raw, prep);
    CHECK(errno == after_real);
    if (b->p && size == 0) { /* freed; whatever came back is a new minimum block */
        b->p = NULL;
        if (q)
            place(b, q, 0, 0, seed);
        return;
    }
    if (q == NULL) {
        if (b->p)
            check_kept(b, b->p, b->size); /* failed: the old block is untouched */
        return;
    }
    if (b->p)
        check_kept(b, q, b->size < size ? b->size : size);
    place(b, q, size, 0, seed);
}

static bool attached;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    ddheap_test_set_probe_hook(hook, NULL);
    dd_set_default_sampling_interval(1);
    ddheap_test_seed_thread(take(&in, 8));
    fail_countdown = 0;

    while (in.left) {
        uint8_t op = (uint8_t)take(&in, 1);
        struct block *b = &slot[op % SLOTS];
        switch ((op >> 5) & 7) {
        case 0: /* tracer, interval, failure injection */
            switch (op % 4) {
            case 0:
                attached = !attached;
                dd_heap_simulate_tracer(attached);
                break;
            case 1: {
                static const uint64_t intervals[] = {1, 2, 64, 4096, 1u << 19, UINT64_MAX};
                dd_set_default_sampling_interval(intervals[take(&in, 1) % 6]);
                break;
            }
            case 2:
                fail_countdown = (unsigned)take(&in, 1) % 8;
                break;
            default:
                dd_set_default_sampling_interval(take(&in, 4));
                break;
            }
            break;
        case 1:
        case 2:
            if (b->p == NULL)
                do_alloc(b, take_size(&in), 0, op & 1, (uint8_t)take(&in, 1));
            else
                do_free(b, op & 1);
            break;
        case 3:
            if (b->p == NULL) {
                size_t align = take_alignment(&in);
                do_alloc(b, take_size(&in), align, false, (uint8_t)take(&in, 1));
            } else {
                do_free(b, true);
            }
            break;
        case 4:
        case 5:
            do_realloc(b, take_size(&in), (uint8_t)take(&in, 1));
            break;
        case 6:
            do_free(b, op & 1);
            break;
        default:
            if (b->p)
                do_realloc(b, 0, 0);
            break;
        }
    }

    for (int i = 0; i < SLOTS; i++)
        do_free(&slot[i], i & 1);
    if (attached) {
        dd_heap_simulate_tracer(false);
        attached = false;
    }
    CHECK(ledger_count(raw_ledger) == 0);   /* every raw block came back */
    CHECK(ledger_count(probe_ledger) == 0); /* every reported alloc was freed */
    CHECK(ddheap_test_live_marked() == 0);
    return 0;
}

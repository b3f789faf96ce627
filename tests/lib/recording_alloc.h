/*
 * The "real allocator" the C tests wire ddheap to, and a recorder of the
 * probe stream: one header for tests/unit/ and tests/robust/ (static
 * functions: each test program gets its own copy).
 *
 * The allocator (ra_*) keeps a table of every raw block it handed out, so
 * a test can assert that the real free got back exactly a pointer it
 * handed out, with exactly the size it was asked for (sized frees), and
 * that nothing leaked. It can be told to fail (errno ENOMEM, as libc
 * would), to place the next block at a chosen offset in a page (so tests
 * reach every header position), and to realloc by moving, in place, or
 * not at all. Alignments of 64 KiB and more are served by mmap, so a
 * 64 MiB alignment costs address space, not memory, and does not depend on
 * what the libc (or valgrind's replacement of it) accepts. Other blocks
 * come from malloc or posix_memalign at exactly the size asked, so a
 * sanitizer or valgrind sees their true bounds, except where a test asked
 * for a page offset or for in-place reallocs (then each block has room to
 * grow).
 *
 * A mistake of the code under test (a pointer never handed out, a wrong
 * size) is counted and printed; with ra.fail_at_once set (tracer_on(), for
 * single-threaded cases) it also fails the case at once. robust_teardown()
 * checks the count. Thread-safe (one mutex), but not async-signal-safe:
 * test_reentry.c has its own lock-free pool for that.
 *
 * w_* wire the allocator to ddheap exactly as ddheap.h's usage comment
 * does. Each case starts with tracer_on(interval) or robust_setup() and
 * ends with tracer_off() or robust_teardown().
 */
#ifndef DDHEAP_TEST_RECORDING_ALLOC_H
#define DDHEAP_TEST_RECORDING_ALLOC_H

#include <ddheap.h>
#include <ddheap/testing.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* the checks assert with cmocka */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define RA_MAX_BLOCKS 4096
#define RA_MMAP_ALIGN (64u * 1024u) /* alignments from here on come from mmap */
#define RA_GROW_ROOM 4096           /* in-place mode: every block can grow by this much */
#define REC_MAX 65536

enum ra_realloc_mode { RA_REALLOC_MOVE, RA_REALLOC_IN_PLACE, RA_REALLOC_FAIL };

struct ra_block {
    void *raw;
    size_t size;      /* what the allocator was asked for */
    size_t alignment; /* 0: default */
    size_t capacity;  /* how far the block may grow in place */
    void *storage;    /* what malloc gave when raw lies inside it, else NULL */
    void *map;        /* mmap'ed blocks: the mapping, else NULL */
    size_t map_len;
};

static struct {
    pthread_mutex_t lock;
    struct ra_block blocks[RA_MAX_BLOCKS];
    size_t high; /* blocks[high..] were never used */
    size_t live;
    size_t handed_out, returned, sized_frees;
    size_t errors; /* a free of a pointer never handed out, or with the wrong size */
    bool fail;     /* every allocation fails while set */
    bool fail_at_once;
    enum ra_realloc_mode realloc_mode;
    size_t page_offset;           /* place the next block at this offset in a page (+1; 0: anywhere) */
    void (*inside_realloc)(void); /* runs inside the real realloc, after the old block is gone */
} ra = {.lock = PTHREAD_MUTEX_INITIALIZER};

static inline void ra__complain(const char *what, void *raw, size_t got, size_t want)
{
    fprintf(stderr, "recording_alloc: %s %p (%zu, allocated %zu)\n", what, raw, got, want);
    __atomic_add_fetch(&ra.errors, 1, __ATOMIC_RELAXED);
    if (ra.fail_at_once)
        fail_msg("recording_alloc: %s %p", what, raw);
}

/* Called with the lock held. */
static inline struct ra_block *ra__find(void *raw)
{
    for (size_t i = 0; i < ra.high && raw != NULL; i++)
        if (ra.blocks[i].raw == raw)
            return &ra.blocks[i];
    return NULL;
}

static inline bool ra__record(struct ra_block block)
{
    pthread_mutex_lock(&ra.lock);
    struct ra_block *b = NULL;
    for (size_t i = 0; i < RA_MAX_BLOCKS && b == NULL; i++)
        if (ra.blocks[i].raw == NULL) {
            b = &ra.blocks[i];
            if (i >= ra.high)
                ra.high = i + 1;
        }
    if (b != NULL) {
        *b = block;
        ra.live++;
        ra.handed_out++;
    }
    pthread_mutex_unlock(&ra.lock);
    if (b == NULL) /* a test bug, not a ddheap one: say so loudly and count it */
        ra__complain("more than RA_MAX_BLOCKS live blocks at", block.raw, 0, 0);
    return b != NULL;
}

static inline void ra__release(const struct ra_block *b)
{
    if (b->map)
        munmap(b->map, b->map_len);
    else
        free(b->storage ? b->storage : b->raw);
}

static inline void ra_set_fail(bool fail)
{
    __atomic_store_n(&ra.fail, fail, __ATOMIC_RELAXED);
}

/* Inside a malloc'ed area with room to grow, at ra.page_offset if set. */
static inline bool ra__placed(struct ra_block *b, size_t size, size_t alignment)
{
    size_t align = alignment > 16 ? alignment : 16;
    size_t pad = align + 4096;
    if (size > SIZE_MAX - RA_GROW_ROOM - pad)
        return false;
    char *storage = malloc(size + RA_GROW_ROOM + pad);
    if (storage == NULL)
        return false;
    uintptr_t at = ((uintptr_t)storage + align - 1) & ~(uintptr_t)(align - 1);
    if (ra.page_offset) {
        uintptr_t want = (ra.page_offset - 1) & 4095;
        uintptr_t page = (at + 4095) & ~(uintptr_t)4095;
        if (want % (alignment ? alignment : 1) == 0)
            at = page + want;
    }
    b->raw = (void *)at;
    b->storage = storage;
    b->capacity = size + RA_GROW_ROOM;
    return true;
}

/* The real allocation: `alignment` 0 means malloc's default. */
static inline void *ra_alloc(size_t size, size_t alignment)
{
    if (__atomic_load_n(&ra.fail, __ATOMIC_RELAXED)) {
        errno = ENOMEM;
        return NULL;
    }
    /* glibc refuses anything above PTRDIFF_MAX; so does this allocator, by
     * itself, so sanitizer runtimes never see an impossible request. */
    if (size > PTRDIFF_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    /* posix_memalign's answer to a bad alignment, given here: sanitizer
     * runtimes treat such a call as a bug of the caller and abort. */
    if (alignment & (alignment - 1)) {
        errno = EINVAL;
        return NULL;
    }
    struct ra_block b = {.size = size, .alignment = alignment, .capacity = size};
    if (alignment >= RA_MMAP_ALIGN) {
        if (alignment > SIZE_MAX / 4) {
            errno = ENOMEM;
            return NULL;
        }
        /* room to grow in place too: untouched pages cost nothing */
        b.map_len = size + alignment + RA_GROW_ROOM;
        b.map = mmap(NULL, b.map_len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (b.map == MAP_FAILED) {
            errno = ENOMEM;
            return NULL;
        }
        b.raw = (void *)(((uintptr_t)b.map + alignment - 1) & ~(uintptr_t)(alignment - 1));
        b.capacity = b.map_len - (size_t)((char *)b.raw - (char *)b.map);
    } else if (ra.page_offset || ra.realloc_mode == RA_REALLOC_IN_PLACE) {
        if (!ra__placed(&b, size, alignment)) {
            errno = ENOMEM;
            return NULL;
        }
    } else if (alignment > 16) {
        int rc = posix_memalign(&b.raw, alignment, size);
        if (rc != 0) {
            errno = rc;
            return NULL;
        }
    } else {
        b.raw = malloc(size);
        if (b.raw == NULL)
            return NULL;
    }
    if (!ra__record(b)) {
        ra__release(&b);
        return NULL;
    }
    return b.raw;
}

/* The real free. `size` 0: unsized; otherwise it must be what was asked. */
static inline void ra_free(void *raw, size_t size)
{
    if (raw == NULL)
        return;
    pthread_mutex_lock(&ra.lock);
    struct ra_block *b = ra__find(raw);
    struct ra_block copy = {0};
    if (b != NULL) {
        copy = *b;
        *b = (struct ra_block){0};
        ra.live--;
        ra.returned++;
        ra.sized_frees += size != 0;
    }
    pthread_mutex_unlock(&ra.lock);
    if (b == NULL)
        ra__complain("free of a pointer never handed out:", raw, size, 0);
    else if (size != 0 && size != copy.size)
        ra__complain("sized free with the wrong size:", raw, size, copy.size);
    if (copy.raw)
        ra__release(&copy);
}

/* The real realloc, in the mode ra.realloc_mode says. */
static inline void *ra_realloc(void *raw, size_t size)
{
    if (raw == NULL)
        return ra_alloc(size, 0);
    if (size == 0) { /* glibc's realloc(p, 0): frees, returns NULL */
        ra_free(raw, 0);
        return NULL;
    }
    if (__atomic_load_n(&ra.fail, __ATOMIC_RELAXED) || ra.realloc_mode == RA_REALLOC_FAIL ||
        size > PTRDIFF_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&ra.lock);
    struct ra_block *found = ra__find(raw), b = found ? *found : (struct ra_block){0};
    bool in_place = found && ra.realloc_mode == RA_REALLOC_IN_PLACE && size <= b.capacity;
    if (in_place)
        found->size = size;
    pthread_mutex_unlock(&ra.lock);
    if (found == NULL) {
        ra__complain("realloc of a pointer never handed out:", raw, size, 0);
        return NULL;
    }
    if (in_place)
        return raw;
    if (ra.realloc_mode == RA_REALLOC_IN_PLACE) {
        errno = ENOMEM;
        return NULL;
    }
    void *moved = ra_alloc(size, 0);
    if (moved == NULL)
        return NULL;
    memcpy(moved, raw, b.size < size ? b.size : size);
    ra_free(raw, 0);
    if (ra.inside_realloc) /* e.g. a signal handler that allocates */
        ra.inside_realloc();
    return moved;
}

static inline size_t ra_live(void)
{
    pthread_mutex_lock(&ra.lock);
    size_t n = ra.live;
    pthread_mutex_unlock(&ra.lock);
    return n;
}

static inline size_t ra_errors(void)
{
    return __atomic_load_n(&ra.errors, __ATOMIC_RELAXED);
}

/* Back to a fresh allocator: every block still out is given back to libc. */
static inline void ra_reset(void)
{
    pthread_mutex_lock(&ra.lock);
    for (size_t i = 0; i < ra.high; i++)
        if (ra.blocks[i].raw)
            ra__release(&ra.blocks[i]);
    memset(ra.blocks, 0, sizeof ra.blocks);
    ra.high = ra.live = ra.handed_out = ra.returned = ra.sized_frees = ra.errors = 0;
    ra.fail = ra.fail_at_once = false;
    ra.realloc_mode = RA_REALLOC_MOVE;
    ra.page_offset = 0;
    ra.inside_realloc = NULL;
    pthread_mutex_unlock(&ra.lock);
}

/* --- the allocator wired to ddheap, exactly as ddheap.h's usage comment --- */

static inline void *w_alloc(size_t size, size_t alignment)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    return dd_allocation_created(ra_alloc(req.size, req.alignment), req);
}

static inline void *w_malloc(size_t size)
{
    return w_alloc(size, 0);
}

static inline void w_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    ra_free(f.ptr, 0);
}

static inline void w_free_sized(void *ptr, size_t size, size_t alignment)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, alignment);
    ra_free(f.ptr, f.size);
}

static inline void *w_realloc(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    void *raw = ra_realloc(prep.raw_ptr, prep.raw_size);
    return dd_allocation_realloc_commit(ptr, raw, prep);
}

/* --- the probe stream --- */

static struct {
    pthread_mutex_t lock;
    dd_probe_event_t ev[REC_MAX];
    size_t n;
    size_t allocs, frees, reallocs;
    size_t dropped;
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The hook: allocates nothing (a fixed array), so it may run anywhere. */
static inline void rec_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&rec.lock);
    if (rec.n < REC_MAX)
        rec.ev[rec.n++] = *ev;
    else
        rec.dropped++;
    rec.allocs += ev->kind == DD_PROBE_ALLOC;
    rec.frees += ev->kind == DD_PROBE_FREE;
    rec.reallocs += ev->kind == DD_PROBE_REALLOC;
    pthread_mutex_unlock(&rec.lock);
}

static inline void rec_start(void)
{
    pthread_mutex_lock(&rec.lock);
    rec.n = rec.allocs = rec.frees = rec.reallocs = rec.dropped = 0;
    pthread_mutex_unlock(&rec.lock);
    ddheap_test_set_probe_hook(rec_hook, NULL);
}

static inline size_t rec_count(dd_probe_kind_t kind)
{
    size_t n = 0;
    pthread_mutex_lock(&rec.lock);
    for (size_t i = 0; i < rec.n; i++)
        n += rec.ev[i].kind == kind;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* Whether the alloc/free stream is balanced: each free follows an alloc of
 * the same pointer that no other free matched, and (when `closed`) every
 * alloc has its free. Returns a description of the first problem, or NULL. */
static inline const char *rec_unbalanced(bool closed)
{
    static char why[160];
    const char *problem = NULL;
    pthread_mutex_lock(&rec.lock);
    if (rec.dropped)
        problem = "recorder overflowed";
    for (size_t i = 0; i < rec.n && !problem; i++) {
        const dd_probe_event_t *e = &rec.ev[i];
        if (e->kind == DD_PROBE_ALLOC) {
            /* The next event on this pointer must be its free. */
            size_t j = i + 1;
            while (j < rec.n && !(rec.ev[j].ptr == e->ptr && rec.ev[j].kind != DD_PROBE_REALLOC))
                j++;
            if (j < rec.n && rec.ev[j].kind == DD_PROBE_ALLOC) {
                snprintf(why, sizeof why, "alloc %#lx reported twice without a free",
                         (unsigned long)e->ptr);
                problem = why;
            } else if (j == rec.n && closed) {
                snprintf(why, sizeof why, "alloc %#lx never freed", (unsigned long)e->ptr);
                problem = why;
            }
        } else if (e->kind == DD_PROBE_FREE) {
            size_t j = i;
            while (j-- > 0 && !(rec.ev[j].ptr == e->ptr && rec.ev[j].kind != DD_PROBE_REALLOC))
                ;
            if (j == (size_t)-1 || rec.ev[j].kind != DD_PROBE_ALLOC) {
                snprintf(why, sizeof why, "free %#lx without a live alloc", (unsigned long)e->ptr);
                problem = why;
            }
        }
    }
    pthread_mutex_unlock(&rec.lock);
    return problem;
}

/* --- how cases start and end --- */

/* The unit tests' single-threaded cases: a fresh allocator that fails the
 * case at its first complaint, a fresh recorder, the tracer simulated at
 * `interval`. */
static inline void tracer_on(uint64_t interval)
{
    ra_reset();
    ra.fail_at_once = true;
    rec_start();
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(interval);
}

static inline void tracer_off(void)
{
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);
}

/* The end of a case that must leave nothing behind: every raw block back,
 * no allocator complaint, no mark left in the process. */
static inline void tracer_done(void)
{
    assert_int_equal(ra_live(), 0);
    assert_int_equal(ra_errors(), 0);
    assert_int_equal(ddheap_test_live_marked(), 0);
    tracer_off();
}

/* Marked blocks live before the case began (other cases may keep some). */
static uint64_t robust_marked_before;

/* The robustness cases (cmocka setup): tracer simulated at interval 1
 * (every non-empty block sampled, where the most can go wrong), the real
 * allocator healthy, a fresh recorder. */
static inline int robust_setup(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    ra_set_fail(false);
    rec_start();
    robust_marked_before = ddheap_test_live_marked();
    return 0;
}

/* Whatever the case did, it must leave no trace: a balanced probe stream,
 * every raw block back, no allocator complaint, no mark left. */
static inline int robust_teardown(void **state)
{
    (void)state;
    ra_set_fail(false);
    tracer_off();
    const char *why = rec_unbalanced(true);
    if (why)
        fail_msg("probe stream: %s", why);
    assert_int_equal(ra_live(), 0);
    assert_int_equal(ra_errors(), 0);
    assert_int_equal(ddheap_test_live_marked(), robust_marked_before);
    return 0;
}

/* A robustness case in a cmocka list: set up and checked as above. */
#define ROBUST_CASE(test) cmocka_unit_test_setup_teardown(test, robust_setup, robust_teardown)

#endif /* DDHEAP_TEST_RECORDING_ALLOC_H */

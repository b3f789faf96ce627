/*
 * The "real allocator" the robustness tests wire ddheap to, plus a recorder
 * of the probe stream. Shared by the tests in tests/robust/ (header-only,
 * static functions: each test program gets its own copy).
 *
 * The allocator keeps a table of every raw block it handed out, so a test
 * can assert that the real free got back exactly a pointer it handed out,
 * with exactly the size it was asked for (sized frees), and that nothing
 * leaked. Failure injection makes it return NULL on demand (errno ENOMEM,
 * as libc would). Alignments of 64 KiB and more are served by mmap, so a
 * 64 MiB alignment costs address space, not memory, and does not depend
 * on what the libc (or valgrind's replacement of it) accepts.
 *
 * Thread-safe (one mutex), but not async-signal-safe: test_reentry.c has
 * its own lock-free pool for that.
 */
#ifndef DDHEAP_ROBUST_ALLOC_H
#define DDHEAP_ROBUST_ALLOC_H

#include <ddheap.h>
#include <ddheap/testing.h>

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* robust_setup/robust_teardown assert with cmocka */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define RA_MAX_BLOCKS 1024
#define RA_MMAP_ALIGN (64u * 1024u) /* alignments from here on come from mmap */
#define RA_MAX_EVENTS 8192

struct ra_block {
    void *raw;
    size_t size;      /* what the allocator was asked for */
    size_t alignment; /* 0: default */
    void *map;        /* mmap'ed blocks: the mapping, else NULL */
    size_t map_len;
};

static struct {
    pthread_mutex_t lock;
    struct ra_block blocks[RA_MAX_BLOCKS];
    size_t live;
    size_t handed_out, returned;
    size_t errors; /* a free of a pointer never handed out, or with the wrong size */
    bool fail;     /* every allocation fails while set */
} ra = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Called with the lock held. */
static inline struct ra_block *ra__find(void *raw)
{
    for (size_t i = 0; i < RA_MAX_BLOCKS; i++)
        if (raw != NULL && ra.blocks[i].raw == raw)
            return &ra.blocks[i];
    return NULL;
}

static inline void ra__record(void *raw, size_t size, size_t alignment, void *map, size_t map_len)
{
    pthread_mutex_lock(&ra.lock);
    struct ra_block *b = NULL;
    for (size_t i = 0; i < RA_MAX_BLOCKS && b == NULL; i++)
        if (ra.blocks[i].raw == NULL)
            b = &ra.blocks[i];
    if (b == NULL) {
        /* A test bug, not a ddheap one: say so loudly and count it. */
        fprintf(stderr, "robust_alloc: more than %d live blocks\n", RA_MAX_BLOCKS);
        ra.errors++;
    } else {
        *b = (struct ra_block){raw, size, alignment, map, map_len};
        ra.live++;
        ra.handed_out++;
    }
    pthread_mutex_unlock(&ra.lock);
}

static inline void ra_set_fail(bool fail)
{
    __atomic_store_n(&ra.fail, fail, __ATOMIC_RELAXED);
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
    void *raw = NULL, *map = NULL;
    size_t map_len = 0;
    if (alignment >= RA_MMAP_ALIGN) {
        if (alignment > SIZE_MAX / 4) {
            errno = ENOMEM;
            return NULL;
        }
        map_len = (size ? size : 1) + alignment;
        map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
        if (map == MAP_FAILED) {
            errno = ENOMEM;
            return NULL;
        }
        raw = (void *)(((uintptr_t)map + alignment - 1) & ~(uintptr_t)(alignment - 1));
    } else if (alignment > 16) {
        int rc = posix_memalign(&raw, alignment, size);
        if (rc != 0) {
            errno = rc;
            return NULL;
        }
    } else {
        raw = malloc(size);
        if (raw == NULL)
            return NULL;
    }
    ra__record(raw, size, alignment, map, map_len);
    return raw;
}

/* The real free. `size` 0: unsized; otherwise it must be what was asked. */
static inline void ra_free(void *raw, size_t size)
{
    if (raw == NULL)
        return;
    pthread_mutex_lock(&ra.lock);
    struct ra_block *b = ra__find(raw);
    struct ra_block copy = {0};
    if (b == NULL) {
        fprintf(stderr, "robust_alloc: free of %p, never handed out\n", raw);
        ra.errors++;
    } else {
        if (size != 0 && size != b->size) {
            fprintf(stderr, "robust_alloc: sized free of %p with %zu, allocated %zu\n", raw, size,
                    b->size);
            ra.errors++;
        }
        copy = *b;
        *b = (struct ra_block){0};
        ra.live--;
        ra.returned++;
    }
    pthread_mutex_unlock(&ra.lock);
    if (copy.map)
        munmap(copy.map, copy.map_len);
    else if (copy.raw)
        free(copy.raw);
}

/* The real realloc, on blocks of the default alignment only (as libc's). */
static inline void *ra_realloc(void *raw, size_t size)
{
    if (raw == NULL)
        return ra_alloc(size, 0);
    if (size == 0) { /* glibc's realloc(p, 0): frees, returns NULL */
        ra_free(raw, 0);
        return NULL;
    }
    if (__atomic_load_n(&ra.fail, __ATOMIC_RELAXED)) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&ra.lock);
    struct ra_block *found = ra__find(raw), b = found ? *found : (struct ra_block){0};
    pthread_mutex_unlock(&ra.lock);
    if (found == NULL || b.map != NULL) {
        fprintf(stderr, "robust_alloc: realloc of %p, not a malloc block\n", raw);
        __atomic_add_fetch(&ra.errors, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    if (size > PTRDIFF_MAX) {
        errno = ENOMEM;
        return NULL;
    }
    void *moved = malloc(size);
    if (moved == NULL)
        return NULL;
    memcpy(moved, raw, b.size < size ? b.size : size);
    ra__record(moved, size, 0, NULL, 0);
    ra_free(raw, 0);
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

/* --- the allocator wired to ddheap, exactly as ddheap.h's usage comment --- */

static inline void *w_alloc(size_t size, size_t alignment)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    return dd_allocation_created(ra_alloc(req.size, req.alignment), req);
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
    dd_probe_event_t events[RA_MAX_EVENTS];
    size_t n;
    size_t dropped;
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The hook: allocates nothing (a fixed array), so it may run anywhere. */
static inline void rec_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    pthread_mutex_lock(&rec.lock);
    if (rec.n < RA_MAX_EVENTS)
        rec.events[rec.n++] = *ev;
    else
        rec.dropped++;
    pthread_mutex_unlock(&rec.lock);
}

static inline void rec_start(void)
{
    pthread_mutex_lock(&rec.lock);
    rec.n = 0;
    rec.dropped = 0;
    pthread_mutex_unlock(&rec.lock);
    ddheap_test_set_probe_hook(rec_hook, NULL);
}

static inline size_t rec_count(dd_probe_kind_t kind)
{
    size_t n = 0;
    pthread_mutex_lock(&rec.lock);
    for (size_t i = 0; i < rec.n; i++)
        n += rec.events[i].kind == kind;
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
        const dd_probe_event_t *e = &rec.events[i];
        if (e->kind == DD_PROBE_ALLOC) {
            /* The next event on this pointer must be its free. */
            size_t j = i + 1;
            while (j < rec.n && !(rec.events[j].ptr == e->ptr && rec.events[j].kind != DD_PROBE_REALLOC))
                j++;
            if (j < rec.n && rec.events[j].kind == DD_PROBE_ALLOC) {
                snprintf(why, sizeof why, "alloc %#lx reported twice without a free",
                         (unsigned long)e->ptr);
                problem = why;
            } else if (j == rec.n && closed) {
                snprintf(why, sizeof why, "alloc %#lx never freed", (unsigned long)e->ptr);
                problem = why;
            }
        } else if (e->kind == DD_PROBE_FREE) {
            size_t j = i;
            while (j-- > 0 && !(rec.events[j].ptr == e->ptr && rec.events[j].kind != DD_PROBE_REALLOC))
                ;
            if (j == (size_t)-1 || rec.events[j].kind != DD_PROBE_ALLOC) {
                snprintf(why, sizeof why, "free %#lx without a live alloc", (unsigned long)e->ptr);
                problem = why;
            }
        }
    }
    pthread_mutex_unlock(&rec.lock);
    return problem;
}

/* --- every case starts and ends the same way --- */

/* Marked blocks live before the case began (other cases may keep some). */
static uint64_t robust_marked_before;

/* Tracer simulated at interval 1 (every non-empty block sampled, where
 * the most can go wrong), the real allocator healthy, a fresh recorder. */
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
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);
    const char *why = rec_unbalanced(true);
    if (why)
        fail_msg("probe stream: %s", why);
    assert_int_equal(ra_live(), 0);
    assert_int_equal(ra_errors(), 0);
    assert_int_equal(ddheap_test_live_marked(), robust_marked_before);
    return 0;
}

#endif /* DDHEAP_ROBUST_ALLOC_H */

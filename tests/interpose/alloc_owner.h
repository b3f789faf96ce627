/*
 * The allocator a test program is built for (DDHEAP_TEST_ALLOCATOR, see
 * alloc_workload.c), as the C and the C++ workloads ask it things: does it
 * own this block, what is its usable size, how many bytes does it say are
 * allocated, and some calls of its own API mixed with the standard ones.
 * Every function here exits(1) with a line on stderr on the first thing
 * that is not as it would be with the allocator alone.
 */
#ifndef DDHEAP_TEST_ALLOC_OWNER_H
#define DDHEAP_TEST_ALLOC_OWNER_H

#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if DDHEAP_TEST_ALLOCATOR == 1
#include <jemalloc/jemalloc.h>
#define ALLOCATOR_NAME "jemalloc"
#elif DDHEAP_TEST_ALLOCATOR == 2
#include <gperftools/malloc_extension_c.h>
#include <gperftools/tcmalloc.h>
#define ALLOCATOR_NAME "tcmalloc"
#elif DDHEAP_TEST_ALLOCATOR == 3
#define ALLOCATOR_NAME "mimalloc"
#else
#define ALLOCATOR_NAME "glibc"
#endif

static void fail(const char *what)
{
    fprintf(stderr, "alloc: FAILED: %s (allocator %s)\n", what, ALLOCATOR_NAME);
    exit(1);
}

#if DDHEAP_TEST_ALLOCATOR == 3
/* mimalloc is preloaded, not linked: its API is looked up at start. */
static void *(*mi_malloc_fn)(size_t);
static void (*mi_free_fn)(void *);
static size_t (*mi_usable_size_fn)(const void *);
static bool (*mi_is_in_heap_region_fn)(const void *);
static void (*mi_process_info_fn)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *,
                                  size_t *, size_t *);

static void *must_find(const char *name)
{
    void *sym = dlsym(RTLD_DEFAULT, name);
    if (sym == NULL)
        fail("mimalloc is not loaded (run with LD_PRELOAD=libmimalloc.so)");
    return sym;
}
#define FIND(var, name)                  \
    do {                                 \
        void *sym_ = must_find(name);    \
        memcpy(&var, &sym_, sizeof var); \
    } while (0)
#endif

static void allocator_setup(void)
{
#if DDHEAP_TEST_ALLOCATOR == 3
    FIND(mi_malloc_fn, "mi_malloc");
    FIND(mi_free_fn, "mi_free");
    FIND(mi_usable_size_fn, "mi_usable_size");
    FIND(mi_is_in_heap_region_fn, "mi_is_in_heap_region");
    FIND(mi_process_info_fn, "mi_process_info");
#endif
}

/* The allocator's own answer for a block, or 0 when it does not own it. */
static size_t allocator_usable_size(void *p)
{
#if DDHEAP_TEST_ALLOCATOR == 1
    unsigned arena;
    size_t len = sizeof arena;
    if (mallctl("arenas.lookup", &arena, &len, &p, sizeof p) != 0)
        return 0;
    return sallocx(p, 0);
#elif DDHEAP_TEST_ALLOCATOR == 2
    if (MallocExtension_GetOwnership(p) != MallocExtension_kOwned)
        return 0;
    return tc_malloc_size(p);
#elif DDHEAP_TEST_ALLOCATOR == 3
    if (!mi_is_in_heap_region_fn(p))
        return 0;
    return mi_usable_size_fn(p);
#else
    return malloc_usable_size(p);
#endif
}

static void *owned_block(void *p, size_t n, const char *what)
{
    char line[160];
    if (p == NULL) {
        snprintf(line, sizeof line, "%s returned NULL", what);
        fail(line);
    }
    size_t own = allocator_usable_size(p);
    size_t usable = malloc_usable_size(p);
    if (own < n) {
        snprintf(line, sizeof line, "%s: block %p not the allocator's (its size %zu)", what, p, own);
        fail(line);
    }
    if (usable != own) {
        snprintf(line, sizeof line, "%s: malloc_usable_size %zu, the allocator says %zu", what,
                 usable, own);
        fail(line);
    }
    return p;
}

/* jemalloc has no pvalloc: without ddheap a program's pvalloc is glibc's,
 * whose blocks jemalloc cannot free, so the programs do not call it then.
 * Under libddheap_preload.so it is built from jemalloc's own aligned
 * allocation: the test says so (DDHEAP_TEST_PVALLOC_FROM_SIBLINGS=1), and
 * the program checks the block is jemalloc's. */
static inline int pvalloc_is_the_allocators(void)
{
    const char *siblings = getenv("DDHEAP_TEST_PVALLOC_FROM_SIBLINGS");
    return DDHEAP_TEST_ALLOCATOR != 1 || (siblings != NULL && strcmp(siblings, "1") == 0);
}

/* Bytes the allocator says are in use (its own statistics). */
static uint64_t allocator_stat(void)
{
#if DDHEAP_TEST_ALLOCATOR == 1
    uint64_t epoch = 1;
    size_t len = sizeof epoch;
    mallctl("epoch", &epoch, &len, &epoch, len);
    size_t allocated = 0;
    len = sizeof allocated;
    if (mallctl("stats.allocated", &allocated, &len, NULL, 0) != 0)
        fail("mallctl stats.allocated");
    return allocated;
#elif DDHEAP_TEST_ALLOCATOR == 2
    size_t allocated = 0;
    if (!MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &allocated))
        fail("MallocExtension generic.current_allocated_bytes");
    return allocated;
#elif DDHEAP_TEST_ALLOCATOR == 3
    size_t elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults;
    mi_process_info_fn(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
    return commit;
#else
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
#endif
}

/* The allocator's own API, mixed with the standard family both ways. */
static void allocator_specific(unsigned round, void (*mix)(const void *, size_t))
{
    size_t n = 16 + (round * 131u) % 3000u;
#if DDHEAP_TEST_ALLOCATOR == 1
    void *a = owned_block(mallocx(n, 0), n, "mallocx");
    memset(a, 1, n);
    mix(a, n);
    free(a); /* a mallocx block through free */
    void *b = owned_block(malloc(n), n, "malloc");
    memset(b, 2, n);
    b = owned_block(rallocx(b, 2 * n, 0), 2 * n, "rallocx");
    mix(b, n);
    sdallocx(b, 2 * n, 0); /* a malloc block (reallocated) through sdallocx */
    void *c = owned_block(mallocx(n, MALLOCX_ALIGN(64) | MALLOCX_ZERO), n, "mallocx(align, zero)");
    c = owned_block(realloc(c, 3 * n), 3 * n, "realloc of a mallocx block");
    dallocx(c, 0);
#elif DDHEAP_TEST_ALLOCATOR == 2
    void *a = owned_block(tc_malloc(n), n, "tc_malloc");
    memset(a, 1, n);
    mix(a, n);
    free(a);
    void *b = owned_block(malloc(n), n, "malloc");
    memset(b, 2, n);
    b = owned_block(tc_realloc(b, 2 * n), 2 * n, "tc_realloc");
    mix(b, n);
    tc_free_sized(b, 2 * n);
    void *c = owned_block(tc_memalign(64, n), n, "tc_memalign");
    c = owned_block(realloc(c, 3 * n), 3 * n, "realloc of a tc_memalign block");
    tc_free(c);
#elif DDHEAP_TEST_ALLOCATOR == 3
    void *a = owned_block(mi_malloc_fn(n), n, "mi_malloc");
    memset(a, 1, n);
    mix(a, n);
    free(a);
    void *b = owned_block(malloc(n), n, "malloc");
    memset(b, 2, n);
    mix(b, n);
    mi_free_fn(b);
#else
    void *a = owned_block(malloc(n), n, "malloc");
    memset(a, 1, n);
    mix(a, n);
    free(a);
#endif
}

#endif /* DDHEAP_TEST_ALLOC_OWNER_H */

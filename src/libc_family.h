/*
 * glibc's malloc family wired to the ddheap hooks, once, for both ways of
 * reaching an unmodified program: the LD_PRELOAD library (src/preload/)
 * defines malloc & co. over these, and the in-process rewrite
 * (src/interpose.c) points GOT entries at functions built from them.
 *
 * Every wrapper forwards to glibc's own entry points, never to "the next
 * malloc" found at run time: glibc exports __libc_malloc, __libc_free,
 * __libc_calloc, __libc_realloc, __libc_memalign, __libc_valloc and
 * __libc_pvalloc for exactly this, so nothing here calls dlsym (which may
 * allocate) and nothing can loop back into a rewritten slot or a lazy PLT
 * stub. The functions glibc has no such name for are built from these:
 * posix_memalign and aligned_alloc over __libc_memalign, reallocarray over
 * realloc, with glibc 2.36's own argument checks and error conventions.
 *
 * Only the pointer-preserving (shadow) marking scheme may be used here
 * (docs/interpose.md): some blocks are always allocated or freed past
 * these wrappers (before they are in place, inside glibc, in objects never
 * rewritten), and only a scheme that hands the real allocator exactly the
 * user's pointer and size survives that. The wrappers are still written
 * the general way (req.size, f.ptr, prep.raw_ptr), which in that scheme are
 * the user's own values.
 */
#ifndef DDHEAP_LIBC_FAMILY_H
#define DDHEAP_LIBC_FAMILY_H

#include <ddheap.h>

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/auxv.h>

#if !DDHEAP_MARK_SHADOW
#error "the libc wrappers need the pointer-preserving scheme (-Dmarking=shadow)"
#endif

/* glibc's exported entry points (malloc/malloc.c); not in any header. */
extern void *__libc_malloc(size_t size);
extern void __libc_free(void *ptr);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);
extern void *__libc_pvalloc(size_t size);

/* The page size glibc's valloc and pvalloc align to, from the auxiliary
 * vector (no sysconf, which may read files, on the allocation path). */
static inline size_t ddheap_libc_page_size(void)
{
    return (size_t)getauxval(AT_PAGESZ);
}

static inline void *ddheap_libc_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(__libc_malloc(req.size), req);
}

static inline void ddheap_libc_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    __libc_free(f.ptr);
}

static inline void *ddheap_libc_calloc(size_t count, size_t size)
{
    size_t bytes;
    /* ddheap sees one block of count * size bytes: a product that wraps
     * must fail as glibc's calloc does, never become a small block. */
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    dd_alloc_req_t req = dd_allocation_requested(bytes, 0);
    return dd_allocation_created(__libc_calloc(1, req.size), req);
}

/* glibc's realloc(p, 0) frees p and returns NULL; prepare reports that
 * free and __libc_realloc performs it. */
static inline void *ddheap_libc_realloc(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    return dd_allocation_realloc_commit(ptr, __libc_realloc(prep.raw_ptr, prep.raw_size), prep);
}

static inline void *ddheap_libc_reallocarray(void *ptr, size_t count, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM; /* glibc: the block is left alone */
        return NULL;
    }
    return ddheap_libc_realloc(ptr, bytes);
}

/* memalign and aligned_alloc: glibc 2.36's aligned_alloc is an alias of
 * memalign (a non-power-of-two alignment is rounded up, any size goes), so
 * both are the same call here. ddheap samples power-of-two alignments only;
 * the rest pass through unsampled. */
static inline void *ddheap_libc_memalign(size_t alignment, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    return dd_allocation_created(__libc_memalign(req.alignment, req.size), req);
}

/* glibc's checks, in its order: EINVAL for an alignment that is not a
 * power-of-two multiple of sizeof(void *), else ENOMEM on failure, and *out
 * untouched unless the call succeeds. glibc's memalign sets errno on
 * failure; posix_memalign reports through its return value, so errno is
 * kept. */
static inline int ddheap_libc_posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment % sizeof(void *) != 0 || alignment == 0 ||
        (alignment & (alignment - 1)) != 0)
        return EINVAL;
    int saved = errno;
    void *block = ddheap_libc_memalign(alignment, size);
    errno = saved;
    if (block == NULL)
        return ENOMEM;
    *out = block;
    return 0;
}

static inline void *ddheap_libc_valloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, ddheap_libc_page_size());
    return dd_allocation_created(__libc_valloc(req.size), req);
}

/* pvalloc hands out whole pages: the block ddheap accounts is the rounded
 * size, which is what the program may use. A size that cannot be rounded
 * fails as in glibc. */
static inline void *ddheap_libc_pvalloc(size_t size)
{
    size_t page = ddheap_libc_page_size();
    if (size > SIZE_MAX - (page - 1)) {
        errno = ENOMEM;
        return NULL;
    }
    size_t rounded = (size + page - 1) & ~(page - 1);
    dd_alloc_req_t req = dd_allocation_requested(rounded, page);
    return dd_allocation_created(__libc_pvalloc(req.size), req);
}

#endif /* DDHEAP_LIBC_FAMILY_H */

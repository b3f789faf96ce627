/*
 * The malloc family wired to the ddheap hooks, once, for both ways of
 * reaching an unmodified program: the LD_PRELOAD library (src/preload/)
 * defines malloc & co. over these, and the in-process rewrite
 * (src/interpose.c) points GOT entries at functions built from them.
 * Which functions exist and which wrapper each uses: src/malloc_family.def.
 *
 * One wrapper per signature class, ddheap_family_<class>(via, args...):
 * the hooks around a call to `via`, the same entry point of the allocator
 * that serves the program (glibc, jemalloc, tcmalloc, mimalloc, the
 * program's own). The caller finds `via` once, outside any allocation
 * path: the preload library with dlsym(RTLD_NEXT), the rewrite from the
 * process's global scope. ddheap never picks an allocator: it passes each
 * call on to the one the program would have reached without it.
 *
 * Only the pointer-preserving (shadow) marking scheme may be used here
 * (docs/interpose.md): some blocks are always allocated or freed past
 * these wrappers (before they are in place, inside the allocator, through
 * its own API such as mallocx or tc_free, in objects never rewritten), and
 * only a scheme that hands the real allocator exactly the user's pointer
 * and size survives that. The wrappers are still written the general way
 * (req.size, f.ptr, prep.raw_ptr), which in that scheme are the user's own
 * values.
 *
 * Per class: DDHEAP_<class>_TYPE(name) declares a function of the class's
 * signature (a definition, or with typedef the type ddheap_<class>_fn),
 * DDHEAP_<class>_ARGS names its parameters in order, and
 * DDHEAP_<class>_RETURN(call) returns the call's value, or runs it for the
 * classes that return nothing.
 */
#ifndef DDHEAP_LIBC_FAMILY_H
#define DDHEAP_LIBC_FAMILY_H

#include <ddheap.h>

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/auxv.h>

#if !DDHEAP_MARK_SHADOW
#error "the libc wrappers need the pointer-preserving scheme (-Dmarking=shadow)"
#endif

#define DDHEAP_RETURN_VALUE(call) return call;
#define DDHEAP_RETURN_NOTHING(call) call;

#define DDHEAP_alloc_TYPE(name) void *name(size_t size)
#define DDHEAP_alloc_ARGS size
#define DDHEAP_alloc_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_calloc_TYPE(name) void *name(size_t count, size_t size)
#define DDHEAP_calloc_ARGS count, size
#define DDHEAP_calloc_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_realloc_TYPE(name) void *name(void *ptr, size_t size)
#define DDHEAP_realloc_ARGS ptr, size
#define DDHEAP_realloc_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_reallocarray_TYPE(name) void *name(void *ptr, size_t count, size_t size)
#define DDHEAP_reallocarray_ARGS ptr, count, size
#define DDHEAP_reallocarray_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_free_TYPE(name) void name(void *ptr)
#define DDHEAP_free_ARGS ptr
#define DDHEAP_free_RETURN DDHEAP_RETURN_NOTHING
#define DDHEAP_posix_memalign_TYPE(name) int name(void **out, size_t alignment, size_t size)
#define DDHEAP_posix_memalign_ARGS out, alignment, size
#define DDHEAP_posix_memalign_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_aligned_TYPE(name) void *name(size_t alignment, size_t size)
#define DDHEAP_aligned_ARGS alignment, size
#define DDHEAP_aligned_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_page_aligned_TYPE(name) void *name(size_t size)
#define DDHEAP_page_aligned_ARGS size
#define DDHEAP_page_aligned_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_whole_pages_TYPE(name) void *name(size_t size)
#define DDHEAP_whole_pages_ARGS size
#define DDHEAP_whole_pages_RETURN DDHEAP_RETURN_VALUE
#define DDHEAP_free_sized_TYPE(name) void name(void *ptr, size_t size)
#define DDHEAP_free_sized_ARGS ptr, size
#define DDHEAP_free_sized_RETURN DDHEAP_RETURN_NOTHING
#define DDHEAP_free_aligned_sized_TYPE(name) void name(void *ptr, size_t alignment, size_t size)
#define DDHEAP_free_aligned_sized_ARGS ptr, alignment, size
#define DDHEAP_free_aligned_sized_RETURN DDHEAP_RETURN_NOTHING

typedef DDHEAP_alloc_TYPE(ddheap_alloc_fn);
typedef DDHEAP_calloc_TYPE(ddheap_calloc_fn);
typedef DDHEAP_realloc_TYPE(ddheap_realloc_fn);
typedef DDHEAP_reallocarray_TYPE(ddheap_reallocarray_fn);
typedef DDHEAP_free_TYPE(ddheap_free_fn);
typedef DDHEAP_posix_memalign_TYPE(ddheap_posix_memalign_fn);
typedef DDHEAP_aligned_TYPE(ddheap_aligned_fn);
typedef DDHEAP_page_aligned_TYPE(ddheap_page_aligned_fn);
typedef DDHEAP_whole_pages_TYPE(ddheap_whole_pages_fn);
typedef DDHEAP_free_sized_TYPE(ddheap_free_sized_fn);
typedef DDHEAP_free_aligned_sized_TYPE(ddheap_free_aligned_sized_fn);

/* What each class's wrapper hands the call to: a function of the class's
 * own signature, except reallocarray's, which goes through a realloc. */
typedef ddheap_alloc_fn ddheap_alloc_via;
typedef ddheap_calloc_fn ddheap_calloc_via;
typedef ddheap_realloc_fn ddheap_realloc_via;
typedef ddheap_realloc_fn ddheap_reallocarray_via;
typedef ddheap_free_fn ddheap_free_via;
typedef ddheap_posix_memalign_fn ddheap_posix_memalign_via;
typedef ddheap_aligned_fn ddheap_aligned_via;
typedef ddheap_page_aligned_fn ddheap_page_aligned_via;
typedef ddheap_whole_pages_fn ddheap_whole_pages_via;
typedef ddheap_free_sized_fn ddheap_free_sized_via;
typedef ddheap_free_aligned_sized_fn ddheap_free_aligned_sized_via;

/* One pointer per entry of the family, named after it: where its wrapper
 * hands the call (the `via` of its line, as the caller found it). */
struct ddheap_family_targets {
#define DDHEAP_FAMILY(name, class, via) ddheap_##class##_via *name;
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
};

/* The page size the page_aligned and whole_pages classes align to, from
 * the auxiliary vector (no sysconf, which may read files, on the
 * allocation path). */
static inline size_t ddheap_family_page_size(void)
{
    return (size_t)getauxval(AT_PAGESZ);
}

static inline void *ddheap_family_alloc(ddheap_alloc_via *via, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(via(req.size), req);
}

static inline void ddheap_family_free(ddheap_free_via *via, void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    via(f.ptr);
}

/* count * size in *bytes; true (errno ENOMEM) if the product wraps, which
 * calloc and reallocarray must refuse as every allocator does rather than
 * turn into a small block. */
static inline bool ddheap_family_product_overflows(size_t count, size_t size, size_t *bytes)
{
    if (!__builtin_mul_overflow(count, size, bytes))
        return false;
    errno = ENOMEM;
    return true;
}

static inline void *ddheap_family_calloc(ddheap_calloc_via *via, size_t count, size_t size)
{
    size_t bytes; /* ddheap sees one block of count * size bytes */
    if (ddheap_family_product_overflows(count, size, &bytes))
        return NULL;
    dd_alloc_req_t req = dd_allocation_requested(bytes, 0);
    return dd_allocation_created(via(1, req.size), req);
}

/* realloc(p, 0) frees p in glibc and returns NULL (other allocators may
 * return a minimal block): prepare reports the free, the allocator does
 * what it does, commit reports whatever block came back. */
static inline void *ddheap_family_realloc(ddheap_realloc_via *via, void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    return dd_allocation_realloc_commit(ptr, via(prep.raw_ptr, prep.raw_size), prep);
}

/* glibc's reallocarray: ENOMEM on an overflowing product (the block left
 * alone), else realloc as the process binds it. `realloc_fn` carries the
 * hooks itself (it is ddheap's realloc, or the program's own): the hooks
 * do not run here, so nothing is reported twice. */
static inline void *ddheap_family_reallocarray(ddheap_reallocarray_via *realloc_fn, void *ptr,
                                               size_t count, size_t size)
{
    size_t bytes;
    if (ddheap_family_product_overflows(count, size, &bytes))
        return NULL;
    return realloc_fn(ptr, bytes);
}

/* memalign and aligned_alloc. ddheap samples power-of-two alignments only;
 * the rest pass through unsampled, and the allocator decides what such an
 * alignment means (glibc rounds it up, others fail). */
static inline void *ddheap_family_aligned(ddheap_aligned_via *via, size_t alignment, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    return dd_allocation_created(via(req.alignment, req.size), req);
}

/* The allocator checks the alignment and says EINVAL or ENOMEM; *out is
 * written only on success, as POSIX requires. */
static inline int ddheap_family_posix_memalign(ddheap_posix_memalign_via *via, void **out,
                                               size_t alignment, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    void *block = NULL;
    int rc = via(&block, req.alignment, req.size);
    void *user = dd_allocation_created(rc == 0 ? block : NULL, req);
    if (rc == 0)
        *out = user;
    return rc;
}

static inline void *ddheap_family_page_aligned(ddheap_page_aligned_via *via, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, ddheap_family_page_size());
    return dd_allocation_created(via(req.size), req);
}

/* whole_pages hands out whole pages: the block ddheap accounts is the rounded
 * size, which is what the program may use. A size that cannot be rounded
 * fails as in glibc. */
static inline void *ddheap_family_whole_pages(ddheap_whole_pages_via *via, size_t size)
{
    size_t page = ddheap_family_page_size();
    if (size > SIZE_MAX - (page - 1)) {
        errno = ENOMEM;
        return NULL;
    }
    size_t rounded = (size + page - 1) & ~(page - 1);
    dd_alloc_req_t req = dd_allocation_requested(rounded, page);
    return dd_allocation_created(via(req.size), req);
}

static inline void ddheap_family_free_sized(ddheap_free_sized_via *via, void *ptr, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, 0);
    via(f.ptr, size);
}

static inline void ddheap_family_free_aligned_sized(ddheap_free_aligned_sized_via *via, void *ptr,
                                                    size_t alignment, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, alignment);
    via(f.ptr, alignment, size);
}

#endif /* DDHEAP_LIBC_FAMILY_H */

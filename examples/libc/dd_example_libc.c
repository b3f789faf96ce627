/*
 * libc's malloc family wired to ddheap: the pattern is the same in every
 * function. Ask ddheap what to request, request exactly that from libc,
 * hand libc's result back to ddheap and return what it returns. On free,
 * ddheap turns the user pointer back into libc's pointer.
 *
 * glibc 2.36 has no free_sized, so the sized frees below cannot pass the
 * size on; they check it instead. ddheap promises that a sized free gets
 * back exactly the size the real allocator was asked for, and libc cannot
 * have handed out fewer usable bytes than it was asked for, so
 * malloc_usable_size(raw) < size proves the promise broken. The check is
 * cheap next to a free and turns silent heap corruption in an allocator
 * that does use the size (see examples/slab) into a loud abort here.
 */
#define _GNU_SOURCE /* malloc_usable_size */

#include "dd_example_libc.h"

#include <ddheap.h>

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int power_of_two(size_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

static void check_sized_free(void *raw, size_t size)
{
    if (raw != NULL && malloc_usable_size(raw) < size) {
        fprintf(stderr, "dd_example_libc: sized free of %zu bytes on a block of %zu usable bytes\n",
                size, malloc_usable_size(raw));
        abort();
    }
}

void *dd_example_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

void *dd_example_calloc(size_t count, size_t size)
{
    size_t bytes;
    /* ddheap sees one block of count * size bytes; an overflowing product
     * must fail like calloc does, not wrap to a small block. */
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    dd_alloc_req_t req = dd_allocation_requested(bytes, 0);
    /* calloc(1, req.size) zeroes the whole raw block, the user's bytes and
     * ddheap's slack before them alike (the header is written afterwards),
     * and keeps libc's fresh-mmap shortcut for large zeroed blocks. */
    return dd_allocation_created(calloc(1, req.size), req);
}

void *dd_example_realloc(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    void *raw;
    if (ptr != NULL && size == 0) {
        /* prepare has reported the free; release the block ourselves
         * rather than rely on glibc's realloc(p, 0) (C23 makes it
         * undefined). Like glibc, return NULL. */
        free(prep.raw_ptr);
        raw = NULL;
    } else {
        raw = realloc(prep.raw_ptr, prep.raw_size);
    }
    return dd_allocation_realloc_commit(ptr, raw, prep);
}

void dd_example_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

void dd_example_free_sized(void *ptr, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, 0);
    check_sized_free(f.ptr, f.size);
    free(f.ptr);
}

int dd_example_posix_memalign(void **out, size_t alignment, size_t size)
{
    if (!power_of_two(alignment) || alignment % sizeof(void *) != 0)
        return EINVAL;
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    void *raw = NULL;
    int err = posix_memalign(&raw, req.alignment, req.size);
    if (err != 0)
        raw = NULL; /* posix_memalign leaves *out unspecified on failure */
    void *user = dd_allocation_created(raw, req);
    if (user == NULL)
        return err != 0 ? err : ENOMEM;
    *out = user;
    return 0;
}

void *dd_example_aligned_alloc(size_t alignment, size_t size)
{
    /* glibc accepts any power of two and any size (C17 DR 460), and so do
     * we. C11 and the sanitizers' allocators want the size to be a multiple
     * of the alignment, and a sampled request is a few bytes larger than
     * `size`: round the request up. The block is only freed through libc's
     * free, which needs no size, so the extra bytes cost nothing else. */
    if (!power_of_two(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    size_t rounded = (req.size + (req.alignment - 1)) & ~(req.alignment - 1);
    if (rounded < req.size) { /* wrapped: no such block */
        errno = ENOMEM;
        return dd_allocation_created(NULL, req);
    }
    return dd_allocation_created(aligned_alloc(req.alignment, rounded), req);
}

void dd_example_free_aligned_sized(void *ptr, size_t alignment, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, alignment);
    check_sized_free(f.ptr, f.size);
    free(f.ptr);
}

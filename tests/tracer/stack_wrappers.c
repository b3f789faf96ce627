/*
 * Wrappers written the way people write them: each allocation ends in
 * `return dd_allocation_created(...)` or `return
 * dd_allocation_realloc_commit(...)`, which GCC and clang turn into a jump
 * into ddheap's cold path at -O2 (tests/tracer/meson.build builds this file
 * with -O2 and frame pointers, and without -fno-optimize-sibling-calls).
 * The wrapper's frame is then gone when a probe fires: a frame-pointer
 * walk can reach the caller only through frames that ddheap's own probe
 * functions set up.
 */
#include "stack_wrappers.h"

#include <ddheap.h>

#include <stdlib.h>

void *stack_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

void *stack_aligned_alloc(size_t alignment, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    /* aligned_alloc wants a multiple of the alignment; glibc does not care,
     * the sanitizers' allocators do. */
    size_t rounded = (req.size + (req.alignment - 1)) & ~(req.alignment - 1);
    return dd_allocation_created(aligned_alloc(req.alignment, rounded), req);
}

void *stack_realloc(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    return dd_allocation_realloc_commit(ptr, realloc(prep.raw_ptr, prep.raw_size), prep);
}

void stack_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

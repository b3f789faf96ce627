/*
 * An example allocator: libc's malloc family, wired to ddheap, under names
 * of its own. Copy it as the model for wrapping any malloc-style allocator.
 *
 * Every function behaves like its libc namesake (errno, NULL, EINVAL and
 * ENOMEM included); the only difference is that while a tracer is attached
 * some blocks are sampled and reported through ddheap's probes.
 *
 * A block must be released by this family (free, free_sized,
 * free_aligned_sized, realloc to 0), never by libc's free directly: a
 * sampled block's pointer is not the one libc handed out.
 */
#ifndef DD_EXAMPLE_LIBC_H
#define DD_EXAMPLE_LIBC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void *dd_example_malloc(size_t size);
void *dd_example_calloc(size_t count, size_t size);
void *dd_example_realloc(void *ptr, size_t size);
void dd_example_free(void *ptr);

/* C23's free_sized: `size` must be the size the block was requested with
 * (for calloc, count * size; for realloc, the last new size). */
void dd_example_free_sized(void *ptr, size_t size);

int dd_example_posix_memalign(void **out, size_t alignment, size_t size);
void *dd_example_aligned_alloc(size_t alignment, size_t size);

/* C23's free_aligned_sized, for blocks from dd_example_aligned_alloc or
 * dd_example_posix_memalign. */
void dd_example_free_aligned_sized(void *ptr, size_t alignment, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* DD_EXAMPLE_LIBC_H */

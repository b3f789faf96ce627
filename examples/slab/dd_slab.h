/*
 * An example size-class slab allocator wired to ddheap. Objects of one
 * class sit back to back in 64 KiB chunks with no per-object header, so the
 * 16 bytes before an object are the tail of its neighbour: user data. That
 * is the layout in which a fixed "sampled" magic could be forged by the
 * application; ddheap's keyed check word is what keeps it safe here.
 *
 * Frees are sized, as in most slab allocators: the caller passes the size
 * it allocated with, and the slab finds the class from it. ddheap hands
 * back the size the slab was really asked for (larger for a sampled block),
 * so the slab must use f.size, never the caller's size, to pick the class.
 *
 * Thread-safe (one lock per class); chunks are never returned to the
 * system. Requests above DD_SLAB_MAX_SIZE go to libc.
 */
#ifndef DD_SLAB_H
#define DD_SLAB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DD_SLAB_MAX_SIZE 4096

void *dd_slab_alloc(size_t size);
/* `size` must be the size passed to dd_slab_alloc for this object. */
void dd_slab_free(void *ptr, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* DD_SLAB_H */

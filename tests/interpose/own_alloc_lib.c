/* An allocator in a shared library of its own: malloc, free, calloc and
 * realloc over a static pool, with a count of the frees it was handed.
 * deepbind_plugin.c links it; opened with RTLD_DEEPBIND, the plugin binds
 * its malloc and free here, not to glibc, and dd_heap_interpose_libc()
 * must leave those slots alone (a wrapper over glibc's free there would
 * hand glibc this pool's blocks). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define POOL (1u << 20)
static _Alignas(16) unsigned char pool[POOL];
static size_t used;
static unsigned long frees;

int dd_own_alloc_owns(const void *p);
unsigned long dd_own_alloc_frees(void);

int dd_own_alloc_owns(const void *p)
{
    return (uintptr_t)p - (uintptr_t)pool < POOL;
}

unsigned long dd_own_alloc_frees(void)
{
    return frees;
}

void *malloc(size_t size)
{
    size_t start = (used + 15) & ~(size_t)15;
    if (size > POOL || start + size > POOL) {
        errno = ENOMEM;
        return NULL;
    }
    used = start + size;
    return pool + start;
}

void free(void *ptr)
{
    if (ptr != NULL && !dd_own_alloc_owns(ptr))
        abort(); /* never another allocator's block */
    frees += ptr != NULL;
}

void *calloc(size_t count, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return malloc(bytes); /* never reused: already zero */
}

void *realloc(void *ptr, size_t size)
{
    void *block = malloc(size);
    if (block != NULL && ptr != NULL)
        memcpy(block, ptr, size); /* the pool is contiguous: reading past is in bounds */
    free(ptr);
    return block;
}

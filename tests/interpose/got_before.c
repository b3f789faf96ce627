/* A library the GOT test links (loaded before main, lazily bound): its
 * calls to malloc and free go through its own PLT and GOT, which
 * dd_heap_interpose_libc() must rewrite like the executable's. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

void *dd_got_before_alloc(size_t size);
void dd_got_before_free(void *ptr);

void *dd_got_before_alloc(size_t size)
{
    char *p = malloc(size);
    if (p != NULL)
        memset(p, 0x5a, size);
    return p;
}

void dd_got_before_free(void *ptr)
{
    free(ptr);
}

/* dlopen through this library's GOT, which dd_heap_interpose_libc() has
 * rewritten: called from a constructor (ctor_dlopen.c), it reaches the
 * wrapped dlopen while the caller's dlopen holds the loader's lock. */
void *dd_got_before_dlopen(const char *path, int mode);

void *dd_got_before_dlopen(const char *path, int mode)
{
    return dlopen(path, mode);
}

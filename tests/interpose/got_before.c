/* A library the GOT test links (loaded before main, lazily bound): its
 * calls to malloc and free go through its own PLT and GOT, which
 * dd_heap_interpose_libc() must rewrite like the executable's. */
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

/* A plugin over its own allocator (own_alloc_lib.c), which the GOT test
 * opens with RTLD_LAZY | RTLD_DEEPBIND: its malloc and free resolve, at
 * their first call, to that allocator. The test allocates before the
 * rewrite (binding the malloc slot) and frees after it (the free slot
 * still lazy, pointing into this plugin's PLT). */
#include <stdlib.h>

void *dd_deepbind_alloc(size_t size);
void dd_deepbind_free(void *ptr);

void *dd_deepbind_alloc(size_t size)
{
    return malloc(size);
}

void dd_deepbind_free(void *ptr)
{
    free(ptr);
}

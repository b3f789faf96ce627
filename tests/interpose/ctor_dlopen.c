/* A library whose constructor loads another: glibc runs constructors
 * with its loader lock held, so the nested dlopen, made through a GOT
 * that dd_heap_interpose_libc() rewrote (got_before.c), reaches the
 * wrapped dlopen and its rescan under that lock. The GOT test loads and
 * unloads this library in threads while another thread turns the
 * rewrite on and off: the rescan must never wait for ddheap's lock while
 * that thread waits for the loader's. */
#include <dlfcn.h>
#include <stddef.h>

void *dd_got_before_dlopen(const char *path, int mode);

__attribute__((constructor)) static void load_another(void)
{
    void *handle = dd_got_before_dlopen(DDHEAP_TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (handle != NULL)
        dlclose(handle);
}

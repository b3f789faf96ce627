/*
 * libddheap_preload.so: libc's malloc family through ddheap, for any
 * dynamically linked program, with no change to it:
 *
 *     LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libddheap_preload.so program
 *
 * (tools/ddheap-run does that and prints how to attach a tracer). The
 * dynamic linker binds every object's malloc, free, ... to the first
 * definition in the lookup order, which is this library's; glibc's own
 * internal calls follow them too. Each function forwards to glibc's
 * __libc_* entry point through the hooks (src/libc_family.h), always with
 * the pointer-preserving scheme: this library links ddheap_shadow_lib
 * whatever marking scheme the archive is built with.
 *
 * What makes this safe (docs/interpose.md):
 *  - Blocks allocated before this library is in place (ld.so's own early
 *    allocations), or past it (glibc internals that call __libc_free),
 *    need nothing: the scheme leaves every pointer as glibc made it, so a
 *    block the hooks never saw is freed as is, and a sampled block freed
 *    past them only leaves a stale bit.
 *  - The library is linked with -z now: every function the cold path calls
 *    is bound at load, so no lazy binding (which may take ld.so's lock)
 *    runs inside malloc.
 *  - Threads, fork, signal handlers that allocate: the hooks' per-thread
 *    state and reentry guard (DESIGN §3, §5). exec: LD_PRELOAD is inherited
 *    by the environment, so the new image loads the library again.
 *
 * Exported: the malloc family and the state every copy of ddheap in the
 * process shares (preload.map; tests/interpose checks it with nm).
 *
 * Not defined: free_sized and free_aligned_sized (C23). glibc 2.36 declares
 * neither, so no program built against it can call them; the build defines
 * them when the C library declares free_sized (DDHEAP_PRELOAD_FREE_SIZED).
 */
#define _GNU_SOURCE

#include "libc_family.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdlib.h>

#define PUBLIC __attribute__((visibility("default")))

PUBLIC void *malloc(size_t size)
{
    return ddheap_libc_malloc(size);
}

PUBLIC void free(void *ptr)
{
    ddheap_libc_free(ptr);
}

PUBLIC void *calloc(size_t count, size_t size)
{
    return ddheap_libc_calloc(count, size);
}

PUBLIC void *realloc(void *ptr, size_t size)
{
    return ddheap_libc_realloc(ptr, size);
}

PUBLIC void *reallocarray(void *ptr, size_t count, size_t size)
{
    return ddheap_libc_reallocarray(ptr, count, size);
}

PUBLIC int posix_memalign(void **out, size_t alignment, size_t size)
{
    return ddheap_libc_posix_memalign(out, alignment, size);
}

PUBLIC void *aligned_alloc(size_t alignment, size_t size)
{
    return ddheap_libc_memalign(alignment, size);
}

PUBLIC void *memalign(size_t alignment, size_t size)
{
    return ddheap_libc_memalign(alignment, size);
}

PUBLIC void *valloc(size_t size)
{
    return ddheap_libc_valloc(size);
}

PUBLIC void *pvalloc(size_t size)
{
    return ddheap_libc_pvalloc(size);
}

#if DDHEAP_PRELOAD_FREE_SIZED
PUBLIC void free_sized(void *ptr, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, 0);
    __libc_free(f.ptr);
}

PUBLIC void free_aligned_sized(void *ptr, size_t alignment, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, alignment);
    __libc_free(f.ptr);
}
#endif

/*
 * malloc_usable_size: every block is exactly as glibc made it, so glibc's
 * answer is the right one. glibc has no __libc_ name for it: the next
 * definition is looked up once, from the constructor below (or at the
 * first call, if an earlier constructor asks first). This is not on the
 * allocation path, and dlsym's own allocations, if any, only reach the
 * wrappers above.
 */
typedef size_t usable_size_fn(void *);
static usable_size_fn *next_usable_size;

static usable_size_fn *find_next_usable_size(void)
{
    usable_size_fn *fn = __atomic_load_n(&next_usable_size, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        void *sym = dlsym(RTLD_NEXT, "malloc_usable_size");
        __builtin_memcpy(&fn, &sym, sizeof fn); /* POSIX: same representation */
        __atomic_store_n(&next_usable_size, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

__attribute__((constructor)) static void resolve_at_load(void)
{
    (void)find_next_usable_size();
}

PUBLIC size_t malloc_usable_size(void *ptr)
{
    usable_size_fn *fn = find_next_usable_size();
    return fn != NULL ? fn(ptr) : 0;
}

/*
 * libddheap_preload.so: the malloc family through ddheap, for any
 * dynamically linked program, with no change to it and with the allocator
 * it already uses:
 *
 *     LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libddheap_preload.so program
 *
 * (tools/ddheap-run does that and prints how to attach a tracer). The
 * dynamic linker binds every object's malloc, free, ... to the first
 * definition in the lookup order: the executable's, if it defines one,
 * else this library's. Each function here runs the hooks
 * (src/libc_family.h) around the NEXT definition in lookup order,
 * dlsym(RTLD_NEXT): glibc's, or the jemalloc, tcmalloc or mimalloc the
 * program is linked with or had preloaded after this library. Functions
 * ddheap does not wrap (mallocx, tc_malloc_size, mi_usable_size,
 * malloc_usable_size, malloc_stats...) are not defined here at all, so
 * they bind exactly where they would without ddheap: to the same
 * allocator, which gets every pointer and size unchanged (shadow marking).
 *
 * Which function each entry point reaches (docs/interpose.md):
 *  - the allocator is the object that defines the next malloc; every other
 *    entry point goes to that object's own definition, never to another
 *    object's (jemalloc lacks one of the family: the next definition of
 *    that name is glibc's, whose blocks jemalloc's free cannot take);
 *  - an entry point the allocator lacks is built from its siblings in the
 *    same object (the aligned and page-aligned classes from whichever
 *    aligned allocation it has; the sized frees from free), and
 *    only if it has none of them does the call go to the next definition
 *    of the same name, as it would without ddheap;
 *  - reallocarray is glibc's: an overflow check, then realloc as the
 *    process binds it (this library's, or the program's own realloc).
 *
 * Resolution happens once, in the constructor, or at the first call if an
 * earlier constructor allocates first. dlsym, dladdr and dlopen may
 * allocate while the real functions are not known yet: such calls (and
 * any other before resolution ends) are served from a small static arena.
 * Its blocks never reach the real allocator: free of one does nothing,
 * realloc of one copies it out, and they are never sampled.
 *
 * What makes this safe (docs/interpose.md):
 *  - Blocks allocated past the hooks (before this library is in place,
 *    inside the allocator, through its own API, by code that calls
 *    glibc's __libc_* names) need nothing: the scheme leaves every
 *    pointer as the allocator made it, so a block the hooks never saw is
 *    freed as is, and a sampled block freed past them only leaves a stale
 *    bit.
 *  - The library is linked with -z now: every function the cold path calls
 *    is bound at load, so no lazy binding (which may take ld.so's lock)
 *    runs inside malloc.
 *  - Threads, fork, signal handlers that allocate: the hooks' per-thread
 *    state and reentry guard. exec: LD_PRELOAD is inherited by the
 *    environment, so the new image loads the library again.
 *
 * Exported: the malloc family (src/malloc_family.def, through the
 * generated version script) and the state every copy of ddheap in the
 * process shares.
 */
#define _GNU_SOURCE

#include "libc_family.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PUBLIC __attribute__((visibility("default")))

/* Function pointers as data pointers: POSIX guarantees the conversion
 * (dlsym relies on it); ISO C does not, hence the union. */
union fn_as_data {
    void (*fn)(void);
    void *data;
};
#define AS_DATA(f) (((union fn_as_data){.fn = (void (*)(void))(f)}).data)
#define AS_FN(type, d) ((type *)((union fn_as_data){.data = (d)}).fn)

/* --- the bootstrap arena --- */

/* Big enough for what dlsym, dladdr and dlopen(RTLD_NOLOAD) allocate
 * (a dlerror buffer, a few hundred bytes each) many times over. Blocks are
 * never reused, so they are zero (calloc) and their size is in a header. */
#define ARENA_BYTES (64u * 1024u)
#define ARENA_HEADER 16u
static _Alignas(4096) unsigned char arena[ARENA_BYTES];
static size_t arena_used;

static bool in_arena(const void *ptr)
{
    return (uintptr_t)ptr - (uintptr_t)arena < ARENA_BYTES;
}

static void *arena_aligned(size_t alignment, size_t size)
{
    if (alignment < ARENA_HEADER)
        alignment = ARENA_HEADER;
    if ((alignment & (alignment - 1)) != 0 || alignment > 4096 || size > ARENA_BYTES) {
        errno = alignment > 4096 || size > ARENA_BYTES ? ENOMEM : EINVAL;
        return NULL;
    }
    size_t start = __atomic_load_n(&arena_used, __ATOMIC_RELAXED);
    size_t user, end;
    do {
        user = (start + ARENA_HEADER + alignment - 1) & ~(alignment - 1);
        end = user + size;
        if (end > ARENA_BYTES) {
            errno = ENOMEM;
            return NULL;
        }
    } while (!__atomic_compare_exchange_n(&arena_used, &start, end, true, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    memcpy(arena + user - ARENA_HEADER, &size, sizeof size);
    return arena + user;
}

static size_t arena_size(const void *ptr)
{
    size_t size;
    memcpy(&size, (const unsigned char *)ptr - ARENA_HEADER, sizeof size);
    return size;
}

/* --- finding the allocator --- */

/* Where each entry point's call goes: NULL until resolved. */
static struct ddheap_family_targets next;
/* The allocator's own definitions (NULL where it has none), for the
 * entry points built from their siblings. */
static struct ddheap_family_targets own;
enum { UNRESOLVED, RESOLVING, RESOLVED };
static int state = UNRESOLVED;

/* What the entry points the allocator lacks are built from, chosen by
 * class from its own definitions (find_targets): the first aligned
 * allocation of the table it defines, its posix_memalign, its free. */
static ddheap_aligned_via *own_aligned_fn;
static ddheap_posix_memalign_via *own_posix_fn;
static ddheap_free_via *own_free_fn;
#define SIBLING_aligned(fn) own_aligned_fn = own_aligned_fn != NULL ? own_aligned_fn : (fn);
#define SIBLING_posix_memalign(fn) own_posix_fn = own_posix_fn != NULL ? own_posix_fn : (fn);
#define SIBLING_free(fn) own_free_fn = own_free_fn != NULL ? own_free_fn : (fn);
#define SIBLING_alloc(fn)
#define SIBLING_calloc(fn)
#define SIBLING_realloc(fn)
#define SIBLING_reallocarray(fn)
#define SIBLING_page_aligned(fn)
#define SIBLING_whole_pages(fn)
#define SIBLING_free_sized(fn)
#define SIBLING_free_aligned_sized(fn)

/* The allocator's own aligned allocation, whichever it has. */
static void *own_aligned(size_t alignment, size_t size)
{
    if (own_aligned_fn != NULL)
        return own_aligned_fn(alignment, size);
    void *block = NULL;
    int rc = own_posix_fn(&block, alignment, size);
    if (rc != 0)
        errno = rc;
    return block;
}

/* glibc's checks, in its order: EINVAL for an alignment that is not a
 * power-of-two multiple of sizeof(void *), else ENOMEM on failure; errno
 * kept. */
static int own_posix_memalign(void **out, size_t alignment, size_t size)
{
    if (alignment % sizeof(void *) != 0 || alignment == 0 || (alignment & (alignment - 1)) != 0)
        return EINVAL;
    int saved = errno;
    void *block = own_aligned(alignment, size);
    errno = saved;
    if (block == NULL)
        return ENOMEM;
    *out = block;
    return 0;
}

/* The page_aligned and whole_pages classes (the latter's wrapper has
 * rounded the size up already). */
static void *own_page_aligned(size_t size)
{
    return own_aligned(ddheap_family_page_size(), size);
}

static void own_free_sized(void *ptr, size_t size)
{
    (void)size;
    own_free_fn(ptr);
}

static void own_free_aligned_sized(void *ptr, size_t alignment, size_t size)
{
    (void)alignment;
    (void)size;
    own_free_fn(ptr);
}

/* `name` as defined in the object at `base`, or NULL: dlsym on a handle
 * also searches the object's dependencies (glibc among them). */
static void *defined_in(void *handle, const void *base, const char *name)
{
    void *sym = handle != NULL ? dlsym(handle, name) : NULL;
    Dl_info info;
    return sym != NULL && dladdr(sym, &info) != 0 && info.dli_fbase == base ? sym : NULL;
}

/* An entry point of `class` the allocator lacks, built from what it has;
 * NULL if it has nothing to build it from. */
static void *built_from_siblings(const char *class)
{
    bool aligned = own_aligned_fn != NULL || own_posix_fn != NULL;
    if (aligned && strcmp(class, "aligned") == 0)
        return AS_DATA(own_aligned);
    if (aligned && strcmp(class, "posix_memalign") == 0)
        return AS_DATA(own_posix_memalign);
    if (aligned && (strcmp(class, "page_aligned") == 0 || strcmp(class, "whole_pages") == 0))
        return AS_DATA(own_page_aligned);
    if (own_free_fn != NULL && strcmp(class, "free_sized") == 0)
        return AS_DATA(own_free_sized);
    if (own_free_fn != NULL && strcmp(class, "free_aligned_sized") == 0)
        return AS_DATA(own_free_aligned_sized);
    return NULL;
}

static void find_targets(void)
{
    void *allocator_malloc = dlsym(RTLD_NEXT, "malloc");
    Dl_info info = {0};
    void *handle = NULL;
    if (allocator_malloc != NULL && dladdr(allocator_malloc, &info) != 0)
        handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    /* The allocator's own functions first: the siblings are built from
     * them. */
#define DDHEAP_FAMILY(name, class, via) \
    own.name = AS_FN(ddheap_##class##_via, defined_in(handle, info.dli_fbase, #via));
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
    if (handle != NULL)
        dlclose(handle); /* RTLD_NOLOAD took a reference: give it back */
#define DDHEAP_FAMILY(name, class, via) SIBLING_##class(own.name)
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
    /* reallocarray: realloc as the process binds it. The rest: the
     * allocator's own, else built from its siblings, else the next
     * definition of the name. Published one by one: a thread that sees
     * one still NULL takes the arena path for that call. */
    void *process_realloc = dlsym(RTLD_DEFAULT, "realloc");
#define DDHEAP_FAMILY(name, class, via)                                                      \
    {                                                                                        \
        void *fn = strcmp(#class, "reallocarray") == 0 ? process_realloc                     \
                   : own.name != NULL                  ? AS_DATA(own.name)                   \
                                                       : built_from_siblings(#class);        \
        if (fn == NULL)                                                                      \
            fn = dlsym(RTLD_NEXT, #via);                                                     \
        __atomic_store_n(&next.name, AS_FN(ddheap_##class##_via, fn), __ATOMIC_RELEASE);     \
    }
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
}

/* True once the targets are known; false while they are being found (by
 * this thread, inside dlsym, or by another): the caller then uses the
 * arena. */
static bool resolve(void)
{
    int seen = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (seen == RESOLVED)
        return true;
    if (seen == RESOLVING ||
        !__atomic_compare_exchange_n(&state, &seen, RESOLVING, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return __atomic_load_n(&state, __ATOMIC_ACQUIRE) == RESOLVED;
    find_targets();
    __atomic_store_n(&state, RESOLVED, __ATOMIC_RELEASE);
    return true;
}

/* The target of one entry point, resolving at the first call; NULL while
 * resolution is under way. One relaxed load on the fast path: the target
 * never changes once set. */
#define TARGET(slot) \
    (__builtin_expect(__atomic_load_n(slot, __ATOMIC_RELAXED) != NULL, 1) || resolve() \
         ? __atomic_load_n(slot, __ATOMIC_ACQUIRE)                                    \
         : NULL)

/* --- the entry points, by class ---
 *
 * early_<class>: the call made while the target is not known yet (the
 * first, or one during resolution), kept out of line so that the fast
 * path, preload_<class>, is the hooks' test and a jump. */

__attribute__((noinline, cold)) static void *early_alloc(ddheap_alloc_via **slot, size_t size)
{
    ddheap_alloc_via *via = TARGET(slot);
    return via != NULL ? ddheap_family_alloc(via, size) : arena_aligned(0, size);
}

__attribute__((noinline, cold)) static void *early_calloc(ddheap_calloc_via **slot, size_t count, size_t size)
{
    ddheap_calloc_via *via = TARGET(slot);
    size_t bytes;
    if (via != NULL)
        return ddheap_family_calloc(via, count, size);
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return arena_aligned(0, bytes);
}

static void *realloc_arena_block(void *ptr, size_t size)
{
    if (size == 0)
        return NULL; /* glibc's realloc(p, 0): p is freed (a no-op here) */
    ddheap_alloc_via *via = TARGET(&next.malloc);
    void *block = via != NULL ? ddheap_family_alloc(via, size) : arena_aligned(0, size);
    if (block != NULL) {
        size_t old = arena_size(ptr);
        memcpy(block, ptr, old < size ? old : size);
    }
    return block;
}

__attribute__((noinline, cold)) static void *early_realloc(ddheap_realloc_via **slot, void *ptr, size_t size)
{
    if (__builtin_expect(in_arena(ptr), 0))
        return realloc_arena_block(ptr, size);
    ddheap_realloc_via *via = TARGET(slot);
    if (via != NULL)
        return ddheap_family_realloc(via, ptr, size);
    if (ptr == NULL)
        return arena_aligned(0, size);
    errno = ENOMEM; /* another thread's block while this one resolves */
    return NULL;
}

__attribute__((noinline, cold)) static void *early_reallocarray(ddheap_reallocarray_via **slot, void *ptr, size_t count,
                                         size_t size)
{
    ddheap_reallocarray_via *via = TARGET(slot);
    return ddheap_family_reallocarray(via != NULL ? via : realloc, ptr, count, size);
}

/* A block freed while resolution is under way is one another thread made
 * before: left alone (a leak, never a wrong free). */
__attribute__((noinline, cold)) static void early_free(ddheap_free_via **slot, void *ptr)
{
    if (__builtin_expect(in_arena(ptr), 0))
        return;
    ddheap_free_via *via = TARGET(slot);
    if (via != NULL)
        ddheap_family_free(via, ptr);
}

__attribute__((noinline, cold)) static int early_posix_memalign(ddheap_posix_memalign_via **slot, void **out,
                                         size_t alignment, size_t size)
{
    ddheap_posix_memalign_via *via = TARGET(slot);
    if (via != NULL)
        return ddheap_family_posix_memalign(via, out, alignment, size);
    if (alignment % sizeof(void *) != 0 || (alignment & (alignment - 1)) != 0 || alignment == 0)
        return EINVAL;
    void *block = arena_aligned(alignment, size);
    if (block == NULL)
        return ENOMEM;
    *out = block;
    return 0;
}

__attribute__((noinline, cold)) static void *early_aligned(ddheap_aligned_via **slot, size_t alignment, size_t size)
{
    ddheap_aligned_via *via = TARGET(slot);
    return via != NULL ? ddheap_family_aligned(via, alignment, size) : arena_aligned(alignment, size);
}

__attribute__((noinline, cold)) static void *early_page_aligned(ddheap_page_aligned_via **slot, size_t size)
{
    ddheap_page_aligned_via *via = TARGET(slot);
    return via != NULL ? ddheap_family_page_aligned(via, size)
                       : arena_aligned(ddheap_family_page_size(), size);
}

__attribute__((noinline, cold)) static void *early_whole_pages(ddheap_whole_pages_via **slot, size_t size)
{
    ddheap_whole_pages_via *via = TARGET(slot);
    size_t page = ddheap_family_page_size();
    return via != NULL ? ddheap_family_whole_pages(via, size)
                       : arena_aligned(page, (size + page - 1) & ~(page - 1));
}

__attribute__((noinline, cold)) static void early_free_sized(ddheap_free_sized_via **slot, void *ptr, size_t size)
{
    if (__builtin_expect(in_arena(ptr), 0))
        return;
    ddheap_free_sized_via *via = TARGET(slot);
    if (via != NULL)
        ddheap_family_free_sized(via, ptr, size);
}

__attribute__((noinline, cold)) static void early_free_aligned_sized(ddheap_free_aligned_sized_via **slot, void *ptr,
                                              size_t alignment, size_t size)
{
    if (__builtin_expect(in_arena(ptr), 0))
        return;
    ddheap_free_aligned_sized_via *via = TARGET(slot);
    if (via != NULL)
        ddheap_family_free_aligned_sized(via, ptr, alignment, size);
}


#define LOADED(slot) __atomic_load_n(slot, __ATOMIC_RELAXED)

static inline void *preload_alloc(ddheap_alloc_via **slot, size_t size)
{
    ddheap_alloc_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_alloc(slot, size);
    return ddheap_family_alloc(via, size);
}

static inline void *preload_calloc(ddheap_calloc_via **slot, size_t count, size_t size)
{
    ddheap_calloc_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_calloc(slot, count, size);
    return ddheap_family_calloc(via, count, size);
}

static inline void *preload_realloc(ddheap_realloc_via **slot, void *ptr, size_t size)
{
    ddheap_realloc_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || in_arena(ptr), 0))
        return early_realloc(slot, ptr, size);
    return ddheap_family_realloc(via, ptr, size);
}

static inline void *preload_reallocarray(ddheap_reallocarray_via **slot, void *ptr, size_t count,
                                         size_t size)
{
    ddheap_reallocarray_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_reallocarray(slot, ptr, count, size);
    return ddheap_family_reallocarray(via, ptr, count, size);
}

static inline void preload_free(ddheap_free_via **slot, void *ptr)
{
    ddheap_free_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || in_arena(ptr), 0))
        early_free(slot, ptr);
    else
        ddheap_family_free(via, ptr);
}

static inline int preload_posix_memalign(ddheap_posix_memalign_via **slot, void **out,
                                         size_t alignment, size_t size)
{
    ddheap_posix_memalign_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_posix_memalign(slot, out, alignment, size);
    return ddheap_family_posix_memalign(via, out, alignment, size);
}

static inline void *preload_aligned(ddheap_aligned_via **slot, size_t alignment, size_t size)
{
    ddheap_aligned_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_aligned(slot, alignment, size);
    return ddheap_family_aligned(via, alignment, size);
}

static inline void *preload_page_aligned(ddheap_page_aligned_via **slot, size_t size)
{
    ddheap_page_aligned_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_page_aligned(slot, size);
    return ddheap_family_page_aligned(via, size);
}

static inline void *preload_whole_pages(ddheap_whole_pages_via **slot, size_t size)
{
    ddheap_whole_pages_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_whole_pages(slot, size);
    return ddheap_family_whole_pages(via, size);
}

/* The C23 sized frees are defined only where the C library declares them
 * (DDHEAP_PRELOAD_FREE_SIZED); clang would call these unused otherwise. */
__attribute__((unused)) static inline void preload_free_sized(ddheap_free_sized_via **slot,
                                                              void *ptr, size_t size)
{
    ddheap_free_sized_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || in_arena(ptr), 0))
        early_free_sized(slot, ptr, size);
    else
        ddheap_family_free_sized(via, ptr, size);
}

__attribute__((unused)) static inline void
preload_free_aligned_sized(ddheap_free_aligned_sized_via **slot, void *ptr, size_t alignment,
                           size_t size)
{
    ddheap_free_aligned_sized_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || in_arena(ptr), 0))
        early_free_aligned_sized(slot, ptr, alignment, size);
    else
        ddheap_family_free_aligned_sized(via, ptr, alignment, size);
}

/* The exported functions, one per line of src/malloc_family.def; the C23
 * ones only when the C library declares them (DDHEAP_PRELOAD_FREE_SIZED). */
#define DDHEAP_FAMILY(name, class, via)                                  \
    PUBLIC DDHEAP_##class##_TYPE(name)                                   \
    {                                                                    \
        DDHEAP_##class##_RETURN(preload_##class(&next.name, DDHEAP_##class##_ARGS)) \
    }
#if DDHEAP_PRELOAD_FREE_SIZED
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#else
#define DDHEAP_FAMILY_C23(name, class, via)
#endif
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23

/* --- start-up --- */

/* What ddheap-run asks for (DDHEAP_RUN_NOTICE=1): a line on stderr when
 * this library is not in charge of malloc, so the program's allocations
 * are not profiled (it runs as without ddheap). */
static void notice_unprofiled(void)
{
    const char *ask = getenv("DDHEAP_RUN_NOTICE");
    if (ask == NULL || strcmp(ask, "1") != 0)
        return;
    char line[512];
    int n = 0;
    Dl_info info, self;
    void *bound = dlsym(RTLD_DEFAULT, "malloc");
    /* Not `malloc` itself: in this position-independent code its address
     * is the process's binding, whoever defines it. */
    if (dladdr(AS_DATA(notice_unprofiled), &self) == 0)
        return;
    void *prefixed = NULL;
    const char *prefixed_name = NULL;
    static const char *const prefixed_names[] = {"je_malloc", "_rjem_malloc", "je_mallocx"};
    for (size_t i = 0; prefixed == NULL && i < sizeof prefixed_names / sizeof *prefixed_names; i++)
        if ((prefixed = dlsym(RTLD_DEFAULT, prefixed_names[i])) != NULL)
            prefixed_name = prefixed_names[i];
    if (bound != NULL && dladdr(bound, &info) != 0 && info.dli_fbase != self.dli_fbase)
        n = snprintf(line, sizeof line,
                     "ddheap-run: malloc is defined by %s, ahead of libddheap_preload.so: "
                     "the program runs with it, unprofiled\n",
                     info.dli_fname != NULL && info.dli_fname[0] ? info.dli_fname : "the program");
    else if (prefixed != NULL && dladdr(prefixed, &info) != 0)
        n = snprintf(line, sizeof line,
                     "ddheap-run: %s allocates through %s (an allocator with prefixed names "
                     "only), which ddheap cannot wrap: those allocations are not profiled\n",
                     info.dli_fname != NULL && info.dli_fname[0] ? info.dli_fname : "the program",
                     prefixed_name);
    if (n > 0) {
        ssize_t ignored = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
    }
}

__attribute__((constructor)) static void resolve_at_load(void)
{
    (void)resolve();
    notice_unprofiled();
}

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
#include <link.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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

/* The free path's one test (preload_free): the shadow summary counter of
 * the pointer's page residue (src/mark_shadow.h). Non-zero for every marked
 * block, by the scheme's own rule, and for every block of the arena, whose
 * counters are set to 255, a value that never changes again (counters
 * saturate there), before its first block is handed out: a zero sends the
 * free straight to the allocator with neither the arena's range check nor
 * the hooks' gates. Blocks that merely share a residue with either go the
 * long way, which decides exactly. */
static bool summary_nonzero(const void *ptr)
{
    const uint8_t *summary = ddheap_shared_v3.shadow_summary;
    return ddheap__nonzero8(&summary[(uint32_t)(uintptr_t)ptr >> 12]);
}

static void route_arena_frees(void)
{
    static bool routed;
    if (__atomic_load_n(&routed, __ATOMIC_ACQUIRE))
        return;
    /* every 4 KiB of the arena: the summary's unit, whatever the page size */
    for (uintptr_t page = (uintptr_t)arena; page < (uintptr_t)arena + ARENA_BYTES; page += 4096)
        __atomic_store_n(&ddheap_shared_v3.shadow_summary[(uint32_t)page >> 12], UINT8_MAX,
                         __ATOMIC_RELEASE);
    __atomic_store_n(&routed, true, __ATOMIC_RELEASE);
}

static void *arena_aligned(size_t alignment, size_t size)
{
    if (alignment < ARENA_HEADER)
        alignment = ARENA_HEADER;
    if ((alignment & (alignment - 1)) != 0 || alignment > 4096 || size > ARENA_BYTES) {
        errno = alignment > 4096 || size > ARENA_BYTES ? ENOMEM : EINVAL;
        return NULL;
    }
    route_arena_frees(); /* before any arena block can be freed */
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

/* A free whose summary counter is non-zero (preload_free): an arena
 * block, a marked block, or one that shares a residue with either. Also
 * every free while resolution is under way: a block freed then is one
 * another thread made before, left alone (a leak, never a wrong free). */
__attribute__((noinline, cold)) static void early_free(ddheap_free_via **slot, void *ptr)
{
    if (__builtin_expect(in_arena(ptr), 0))
        return;
    ddheap_free_via *via = TARGET(slot);
    if (via != NULL) /* the summary was read: straight to the unmark */
        via(ddheap__release(ptr, 0).ptr);
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
        via(ddheap__release(ptr, size).ptr, size);
}

__attribute__((noinline, cold)) static void early_free_aligned_sized(ddheap_free_aligned_sized_via **slot, void *ptr,
                                              size_t alignment, size_t size)
{
    if (__builtin_expect(in_arena(ptr), 0))
        return;
    ddheap_free_aligned_sized_via *via = TARGET(slot);
    if (via != NULL)
        via(ddheap__release(ptr, size).ptr, alignment, size);
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

/* A realloc whose new block is to be sampled (the countdown ran out), the
 * old one being neither marked nor the arena's: the fast path's cold half
 * (ddheap/fastpath.h, dd_allocation_realloc_prepare). */
__attribute__((noinline, cold)) static void *sampled_realloc(ddheap_realloc_via *via, void *ptr,
                                                             size_t size)
{
    dd_realloc_prep_t prep = ddheap__realloc_prepare(ptr, size);
    return dd_allocation_realloc_commit(ptr, via(prep.raw_ptr, prep.raw_size), prep);
}

/* As free, the old block's summary counter decides (preload_free): zero,
 * it is neither marked nor the arena's, and the call is an allocation of
 * `size` for the hooks, a jump to the allocator unless it is sampled.
 * (ddheap_family_realloc's two halves around the call kept a frame and
 * the halves' state across it: about 25 instructions on every realloc.) */
static inline void *preload_realloc(ddheap_realloc_via **slot, void *ptr, size_t size)
{
    ddheap_realloc_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || summary_nonzero(ptr), 0))
        return early_realloc(slot, ptr, size);
    if (__builtin_expect(ddheap__nonzero32(&ddheap__tracer_gate), 0) &&
        __builtin_expect(ddheap__countdown_borrows((uint64_t)size), 0))
        return sampled_realloc(via, ptr, size);
    return via(ptr, size);
}

static inline void *preload_reallocarray(ddheap_reallocarray_via **slot, void *ptr, size_t count,
                                         size_t size)
{
    ddheap_reallocarray_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL, 0))
        return early_reallocarray(slot, ptr, count, size);
    return ddheap_family_reallocarray(via, ptr, count, size);
}

/* The frees (and realloc) test the summary only (summary_nonzero); the long way,
 * early_free*, checks the arena, then unmarks (ddheap__release, exact).
 * The hooks' gates (this copy's free gate, the process's count of marks)
 * only save work when the summary is not read at all; here it is read at
 * every free, traced or not: one byte of a table that stays the kernel's
 * zero page until a mark lands, so no cache or memory to speak of. */
static inline void preload_free(ddheap_free_via **slot, void *ptr)
{
    ddheap_free_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || summary_nonzero(ptr), 0))
        early_free(slot, ptr);
    else
        via(ptr);
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
    if (__builtin_expect(via == NULL || summary_nonzero(ptr), 0))
        early_free_sized(slot, ptr, size);
    else
        via(ptr, size);
}

__attribute__((unused)) static inline void
preload_free_aligned_sized(ddheap_free_aligned_sized_via **slot, void *ptr, size_t alignment,
                           size_t size)
{
    ddheap_free_aligned_sized_via *via = LOADED(slot);
    if (__builtin_expect(via == NULL || summary_nonzero(ptr), 0))
        early_free_aligned_sized(slot, ptr, alignment, size);
    else
        via(ptr, alignment, size);
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

/* Whether the object `l` itself defines malloc (not one of its
 * dependencies): dlsym on its handle searches it first. */
static bool object_defines_malloc(struct link_map *l)
{
    if (l->l_name == NULL || l->l_name[0] == '\0')
        return false;
    void *handle = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        return false;
    void *found = dlsym(handle, "malloc");
    struct link_map *owner = NULL;
    Dl_info info;
    bool defines = found != NULL && dladdr1(found, &info, (void **)&owner, RTLD_DL_LINKMAP) != 0 &&
                   owner == l;
    dlclose(handle);
    return defines;
}

/* Whether malloc, as the process binds it, is defined by an object other
 * than this library (`self`). dlsym(RTLD_DEFAULT) answers unless the
 * executable holds a canonical PLT entry: a non-PIE executable that takes
 * malloc's address (Debian's python3) has an UNDEFINED dynamic symbol
 * `malloc` whose value is its PLT entry, so that every object sees one
 * address for the function. Lookups by name return that entry, which only
 * jumps to the real binding; dladdr1 reports the symbol, and its section
 * index says it is not a definition. The binding is then the first
 * definition after the executable: one of the objects loaded before this
 * library (an allocator preloaded ahead of it), or this library. */
static bool malloc_defined_elsewhere(struct link_map *self)
{
    void *bound = dlsym(RTLD_DEFAULT, "malloc");
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    struct link_map *owner = NULL;
    if (bound == NULL || dladdr1(bound, &info, (void **)&owner, RTLD_DL_LINKMAP) == 0)
        return false;
    if (owner == self)
        return false;
    if (dladdr1(bound, &info, (void **)&sym, RTLD_DL_SYMENT) == 0 || sym == NULL ||
        sym->st_shndx != SHN_UNDEF)
        return true;
    for (struct link_map *l = self->l_prev; l != NULL && l->l_prev != NULL; l = l->l_prev)
        if (object_defines_malloc(l))
            return true;
    return false;
}

/* Records in the process-wide status word (never on the program's
 * streams: docs/interpose.md) when this library is not in charge of
 * malloc, so the program's allocations are not profiled: malloc defined
 * ahead of it (by the executable, an earlier preloaded allocator or a
 * sanitizer's runtime), or an allocator with prefixed names only
 * (je_malloc). ddheap-prof reads the word and says it. */
static void record_unprofiled(void)
{
    Dl_info info;
    struct link_map *self = NULL;
    /* Not `malloc` itself: in this position-independent code its address
     * is the process's binding, whoever defines it. */
    if (dladdr1(AS_DATA(record_unprofiled), &info, (void **)&self, RTLD_DL_LINKMAP) == 0 ||
        self == NULL)
        return;
    uint64_t status = 0;
    if (malloc_defined_elsewhere(self)) {
        status = DDHEAP__STATUS_MALLOC_AHEAD;
    } else {
        static const char *const prefixed[] = {"je_malloc", "_rjem_malloc", "je_mallocx"};
        for (size_t i = 0; i < sizeof prefixed / sizeof *prefixed; i++)
            if (dlsym(RTLD_DEFAULT, prefixed[i]) != NULL)
                status = DDHEAP__STATUS_PREFIXED_ONLY;
    }
    if (status != 0)
        __atomic_fetch_or(&ddheap_shared_v3.status, status, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void resolve_at_load(void)
{
    (void)resolve();
    record_unprofiled();
}

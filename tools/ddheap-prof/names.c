/* Demangling and the allocator's own frames (names.h). */
#include "names.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* libstdc++'s demangler (the Itanium C++ ABI's entry point), declared
 * here so that C code can call it; linked from libstdc++. */
extern char *__cxa_demangle(const char *mangled, char *out, size_t *length, int *status);

char *dd_prof_demangle(const char *system_name)
{
    if (strncmp(system_name, "_Z", 2) != 0)
        return NULL;
    int status = 0;
    char *out = __cxa_demangle(system_name, NULL, NULL, &status);
    if (status != 0) {
        free(out);
        return NULL;
    }
    return out;
}

/* Exact names: the malloc family (the preload library's wrappers carry
 * these names too) and glibc's internal aliases of it. */
static const char *const allocator_names[] = {
    "malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc", "memalign",
    "valloc", "pvalloc", "reallocarray", "cfree", "malloc_usable_size",
    "_int_malloc", "_int_free", "_int_realloc", "_int_memalign", "sysmalloc",
    "tcache_init", "malloc_consolidate", "_mid_memalign", "__libc_memalign",
    /* ddheap's own static helpers (src/sampler.c), in a program linked
     * with libddheap.a: a real frame in a debug build */
    "created_the_long_way", "release_the_long_way",
};

/* Prefixes: ddheap's own symbols; glibc's __libc_malloc etc.; operator
 * new[] / delete[] in all their overloads (_Znwm, _Znam,
 * _ZnwmSt11align_val_t, _ZnwmRKSt9nothrow_t, _ZdlPvm, ...); jemalloc
 * (je_*, and its internals that malloc reaches), tcmalloc (tc_*, its
 * namespace) and mimalloc (mi_*, _mi_*). Not anonymous namespaces or
 * strdup: those are the user's code. */
static const char *const allocator_prefixes[] = {
    "ddheap_", "dd_", "__libc_malloc", "__libc_calloc", "__libc_realloc", "__libc_free",
    "__libc_memalign", "__libc_valloc", "__libc_pvalloc", "__libc_reallocarray",
    "__posix_memalign", "__GI___libc_", "_Znw", "_Zna", "_Zdl", "_Zda",
    "je_", "imalloc", "arena_malloc", "arena_ralloc", "tcache_alloc", "malloc_default",
    "tc_", "_ZN8tcmalloc", "mi_", "_mi_",
};

bool dd_prof_is_allocator_frame(const char *system_name)
{
    for (size_t i = 0; i < sizeof allocator_names / sizeof *allocator_names; i++)
        if (strcmp(system_name, allocator_names[i]) == 0)
            return true;
    for (size_t i = 0; i < sizeof allocator_prefixes / sizeof *allocator_prefixes; i++)
        if (strncmp(system_name, allocator_prefixes[i], strlen(allocator_prefixes[i])) == 0)
            return true;
    return false;
}

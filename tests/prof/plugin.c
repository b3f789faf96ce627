/*
 * A library for the dlopen test of ddheap-prof (test_prof.py, 'dlopen'):
 * it carries its own copy of libddheap.a and of the example libc wrapper,
 * so its probes are in its own .note.stapsdt, and is loaded with dlopen
 * after the profiler has attached to the executable.
 */
#include <dd_example_libc.h>
#include <ddheap.h>

#include <stdint.h>
#include <string.h>

void *prof_plugin_work(unsigned count);

/* Kept blocks are chained through their first word. */
__attribute__((noinline)) static void *site_plugin_blocks(unsigned count)
{
    void *kept = NULL;
    for (unsigned i = 0; i < count; i++) {
        void **block = dd_example_malloc(1000);
        if (block == NULL)
            return kept;
        memset(block, 0x5a, 1000);
        *block = kept;
        kept = block;
        char *scratch = dd_example_malloc(500);
        if (scratch != NULL) {
            memset(scratch, 0xa5, 500);
            dd_example_free(scratch);
        }
    }
    return kept;
}

void *prof_plugin_work(unsigned count)
{
    void *kept = site_plugin_blocks(count);
    __asm__ volatile("" ::: "memory"); /* keep the site's call from becoming a tail call */
    return kept;
}

/*
 * The program of ddheap-prof's inline test (test_prof.py, 'inline'),
 * built -O2 -g: a call site whose allocating helper is always inlined into
 * it, so the return address into the site lies in the helper's inlined
 * code. The profile must name both, the helper inlined into the site.
 * Prints its ground truth in the workload's format to argv[1].
 *
 *   prof-inline TRUTH_FILE COUNT
 */
#include <dd_example_libc.h>
#include <ddheap.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline __attribute__((always_inline)) void *inlined_helper(void *next)
{
    void **block = dd_example_malloc(1536);
    if (block == NULL)
        exit(2);
    memset(block, 7, 1536);
    *block = next;
    return block;
}

__attribute__((noinline)) static void *site_with_inlined_helper(unsigned count)
{
    void *kept = NULL;
    for (unsigned i = 0; i < count; i++)
        kept = inlined_helper(kept);
    __asm__ volatile("" ::: "memory"); /* the last call stays a call */
    return kept;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    unsigned n = (unsigned)strtoul(argv[2], NULL, 10);
    void *kept = site_with_inlined_helper(n);
    FILE *f = fopen(argv[1], "w");
    if (f == NULL)
        return 2;
    fprintf(f, "site site_with_inlined_helper alloc_bytes %u alloc_count %u live_bytes %u "
               "live_count %u\n", 1536 * n, n, 1536 * n, n);
    fprintf(f, "total alloc_bytes %u live_bytes %u\n", 1536 * n, 1536 * n);
    fclose(f);
    printf("inline: done %p\n", kept);
    return 0;
}

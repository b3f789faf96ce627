/*
 * A program with no ddheap in it, for ddheap-prof's preload test
 * (test_prof.py, 'preload'): three call sites on libc's malloc family,
 * profiled only when run with libddheap_preload.so. Prints its ground
 * truth in the workload's format to the file given as argv[1].
 *
 *   prof-plain TRUTH_FILE COUNT
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__clang__)
#define SITE __attribute__((noinline))
#else
#define SITE __attribute__((noinline, noclone))
#endif

SITE static void **site_plain_kept(unsigned count)
{
    void **kept = malloc(count * sizeof *kept);
    if (kept == NULL)
        exit(2);
    for (unsigned i = 0; i < count; i++) {
        kept[i] = malloc(1024);
        if (kept[i] == NULL)
            exit(2);
        memset(kept[i], 1, 1024);
    }
    return kept;
}

SITE static void site_plain_freed(unsigned count)
{
    for (unsigned i = 0; i < count; i++) {
        char *p = malloc(512);
        if (p == NULL)
            exit(2);
        memset(p, 2, 512);
        free(p);
    }
}

SITE static void **site_plain_calloc(unsigned count)
{
    void **kept = malloc(count * sizeof *kept);
    if (kept == NULL)
        exit(2);
    for (unsigned i = 0; i < count; i++) {
        kept[i] = calloc(64, 8);
        if (kept[i] == NULL)
            exit(2);
        if (i % 2) {
            free(kept[i]);
            kept[i] = NULL;
        }
    }
    return kept;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    unsigned n = (unsigned)strtoul(argv[2], NULL, 10);
    void **a = site_plain_kept(n);
    site_plain_freed(n);
    void **b = site_plain_calloc(n);
    FILE *f = fopen(argv[1], "w");
    if (f == NULL)
        return 2;
    /* The two index arrays are allocated at the sites too (their size
     * counts; they stay live). */
    unsigned long idx = (unsigned long)n * sizeof(void *);
    fprintf(f, "site site_plain_kept alloc_bytes %lu alloc_count %u live_bytes %lu live_count %u\n",
            1024ul * n + idx, n + 1, 1024ul * n + idx, n + 1);
    fprintf(f, "site site_plain_freed alloc_bytes %lu alloc_count %u live_bytes 0 live_count 0\n",
            512ul * n, n);
    fprintf(f, "site site_plain_calloc alloc_bytes %lu alloc_count %u live_bytes %lu live_count %u\n",
            512ul * n + idx, n + 1, 512ul * (n - n / 2) + idx, n - n / 2 + 1);
    fprintf(f, "total alloc_bytes %lu live_bytes %lu\n", 2048ul * n + 2 * idx,
            1024ul * n + 512ul * (n - n / 2) + 2 * idx);
    fclose(f);
    printf("plain: done %p %p\n", (void *)a, (void *)b);
    return 0;
}

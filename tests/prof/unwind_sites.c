/*
 * The plain -O2 program of test_unwind.py: built by the test with `cc -O2`
 * and nothing else (no frame pointers; gcc uses rbp as a general register
 * and optimises sibling calls), run under the preload library. Its call
 * sites of malloc are not tail calls (each uses the block after malloc
 * returns), so every one of them is on the stack when malloc samples.
 *
 *   unwind_sites TRUTH_FILE [SCALE]   three sites, called from run_sites
 *   unwind_sites TRUTH_FILE deep      one site under 24 frames of 2 KiB
 *
 * TRUTH_FILE gets one line per site and size: "site size count".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 8

struct truth {
    const char *site;
    size_t size[MAX_SIZES];
    unsigned long count[MAX_SIZES];
};

static struct truth truths[4] = {
    {.site = "site_small"}, {.site = "site_medium"}, {.site = "site_large"}, {.site = "site_deep"}};
static volatile unsigned long sink;

static inline __attribute__((always_inline)) void *counted(struct truth *t, size_t size)
{
    char *p = malloc(size);
    if (p == NULL)
        abort();
    for (int i = 0; i < MAX_SIZES; i++)
        if (t->size[i] == size || t->size[i] == 0) {
            t->size[i] = size;
            t->count[i]++;
            break;
        }
    p[0] = 1;
    p[size - 1] = 2;
    return p;
}

/* noinline: each site is a function of its own in the profile. */
__attribute__((noinline)) void site_small(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) {
        char *p = counted(&truths[0], 48 + (i % 4) * 16);
        sink += (unsigned char)p[0];
        free(p);
    }
    sink++;
}

__attribute__((noinline)) void site_medium(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) {
        char *p = counted(&truths[1], i % 2 ? 4000 : 6000);
        sink += (unsigned char)p[0];
        free(p);
    }
    sink++;
}

__attribute__((noinline)) void site_large(unsigned long n)
{
    for (unsigned long i = 0; i < n; i++) {
        char *p = counted(&truths[2], 300000);
        sink += (unsigned char)p[0];
        free(p);
    }
    sink++;
}

__attribute__((noinline)) void run_sites(unsigned long scale)
{
    site_small(400 * scale);
    site_medium(20 * scale);
    site_large(scale / 3 + 1);
    sink++;
}

__attribute__((noinline)) void site_deep(void)
{
    for (int i = 0; i < 200; i++) {
        char *p = counted(&truths[3], 1 << 20);
        sink += (unsigned char)p[0];
        free(p);
    }
    sink++;
}

/* 2 KiB of stack per level, kept live across the call. */
__attribute__((noinline)) void recurse(int depth)
{
    char frame[2048];
    memset(frame, depth, sizeof frame);
    if (depth == 0)
        site_deep();
    else
        recurse(depth - 1);
    sink += (unsigned char)frame[depth];
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: unwind_sites TRUTH_FILE [SCALE|deep]\n");
        return 2;
    }
    if (argc > 2 && strcmp(argv[2], "deep") == 0)
        recurse(24);
    else
        run_sites(argc > 2 ? strtoul(argv[2], NULL, 10) : 1000);
    FILE *f = fopen(argv[1], "w");
    if (f == NULL)
        return 1;
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < MAX_SIZES && truths[s].size[i]; i++)
            fprintf(f, "%s %zu %lu\n", truths[s].site, truths[s].size[i], truths[s].count[i]);
    fclose(f);
    printf("%lu\n", sink);
    return 0;
}

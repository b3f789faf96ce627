/*
 * The workload of the stack test (tests/tracer, test "stacks"): four
 * allocation sites calling the wrappers of stack_wrappers.c, compiled the
 * way a user compiles (-O2, frame pointers, sibling calls allowed). A
 * tracer's frame-pointer walk at each probe must name the site that called
 * the wrapper, however the wrapper and ddheap's cold path end.
 *
 * Every size belongs to one site, so an alloc event's size says which site
 * made it:
 *
 *   site_malloc    stack_malloc of 40, 700 and 3000 bytes
 *   site_aligned   stack_aligned_alloc of 1500 bytes at 64 and 8192 at 4096
 *                  (page-aligned: its mark is kept in ddheap's table)
 *   site_realloc   stack_realloc of a 700-byte block to 2400, then 6000
 *   site_free      stack_free of every block
 *
 * Frees happen in site_free, and in site_realloc for a realloc's old block.
 *
 *   stack-workload [--rounds=N] [--seed=N]
 *
 * Prints "stacks: pid=P ready", waits for a line on stdin, runs, prints
 * "stacks: done rounds=N" and waits for another line before exiting, so
 * that a tracer can print (and symbolise) its stacks while the process
 * still lives.
 */
#include "stack_wrappers.h"

#include <ddheap/testing.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A site has to stay a function of its own for its name to be looked for
 * in a stack: no inlining, and no clone under another name (GCC). Nothing
 * else is asked of the compiler: the calls to the wrappers are compiled as
 * in any program. */
#if defined(__clang__)
#define SITE __attribute__((noinline))
#else
#define SITE __attribute__((noinline, noclone))
#endif

static void *must(void *p)
{
    if (p == NULL) {
        fputs("stack-workload: allocation failed\n", stderr);
        exit(2);
    }
    return p;
}

/* The caller writes to each block, so a site's call to the wrapper is
 * never its last act (a site that tail-called the wrapper would rightly be
 * missing from the stack). */
SITE static char *site_malloc(size_t size)
{
    char *p = must(stack_malloc(size));
    p[0] = 1;
    return p;
}

SITE static char *site_aligned(size_t alignment, size_t size)
{
    char *p = must(stack_aligned_alloc(alignment, size));
    p[0] = 2;
    return p;
}

SITE static char *site_realloc(char *p, size_t size)
{
    p = must(stack_realloc(p, size));
    p[size - 1] = 3;
    return p;
}

SITE static void site_free(char *p)
{
    stack_free(p);
    __asm__ volatile("" ::: "memory"); /* keeps the free from being the last act */
}

static void round_of_sites(void)
{
    char *small = site_malloc(40);
    char *medium = site_malloc(700);
    char *large = site_malloc(3000);
    char *row = site_aligned(64, 1500);
    char *tile = site_aligned(4096, 8192);
    char *grown = site_malloc(700);
    grown = site_realloc(grown, 2400);
    grown = site_realloc(grown, 6000);
    site_free(small);
    site_free(medium);
    site_free(large);
    site_free(row);
    site_free(tile);
    site_free(grown);
}

static unsigned long parse(const char *arg, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || arg[n] != '=')
        return (unsigned long)-1;
    char *end;
    unsigned long v = strtoul(arg + n + 1, &end, 10);
    return *end || end == arg + n + 1 ? (unsigned long)-1 : v;
}

static void wait_line(void)
{
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL) {
        fputs("stack-workload: stdin closed\n", stderr);
        exit(3);
    }
}

int main(int argc, char **argv)
{
    unsigned long rounds = 20000, seed = 0;
    for (int i = 1; i < argc; i++) {
        unsigned long v;
        if ((v = parse(argv[i], "--rounds")) != (unsigned long)-1) {
            rounds = v;
        } else if ((v = parse(argv[i], "--seed")) != (unsigned long)-1) {
            seed = v;
        } else {
            fputs("usage: stack-workload [--rounds=N] [--seed=N]\n", stderr);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("stacks: pid=%d ready\n", (int)getpid());
    wait_line();
    if (seed)
        ddheap_test_seed_thread(seed);
    for (unsigned long r = 0; r < rounds; r++)
        round_of_sites();
    printf("stacks: done rounds=%lu\n", rounds);
    wait_line();
    return 0;
}

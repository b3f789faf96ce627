/*
 * A program that defines its own malloc, free, calloc and realloc, as
 * glibc's manual allows ("Replacing malloc"): a bump allocator over a
 * static array, each block with its size in front. Its executable's
 * definitions come first in every lookup, so with libddheap_preload.so
 * loaded they still serve the program, glibc's internal allocations
 * (strdup, asprintf) and reallocarray, which glibc and ddheap both build
 * on realloc as the process binds it. A block that reaches glibc's free
 * or realloc would abort the program ("invalid pointer"); the program
 * checks that every block it sees is its own.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POOL (64u << 20)
static _Alignas(16) unsigned char pool[POOL];
static size_t used;
static unsigned long calls;

void *malloc(size_t size);
void free(void *ptr);
void *calloc(size_t count, size_t size);
void *realloc(void *ptr, size_t size);

static int mine(const void *p)
{
    return (uintptr_t)p - (uintptr_t)pool < POOL;
}

void *malloc(size_t size)
{
    size_t start = (used + 15) & ~(size_t)15;
    if (size > POOL || start + 16 + size > POOL) {
        errno = ENOMEM;
        return NULL;
    }
    used = start + 16 + size;
    memcpy(pool + start, &size, sizeof size);
    calls++;
    return pool + start + 16;
}

void free(void *ptr)
{
    if (ptr != NULL && !mine(ptr))
        abort(); /* someone else's block: never */
}

void *calloc(size_t count, size_t size)
{
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    return malloc(bytes); /* the pool is never reused: already zero */
}

void *realloc(void *ptr, size_t size)
{
    if (ptr != NULL && !mine(ptr))
        abort();
    void *block = malloc(size);
    if (block != NULL && ptr != NULL) {
        size_t old;
        memcpy(&old, (unsigned char *)ptr - 16, sizeof old);
        memcpy(block, ptr, old < size ? old : size);
    }
    return block;
}

static void check(void *p, const char *what)
{
    if (p == NULL || !mine(p)) {
        fprintf(stderr, "own_malloc: %s gave a block that is not the program's (%p)\n", what, p);
        exit(1);
    }
}

int main(void)
{
    unsigned long sum = 0;
    for (unsigned i = 0; i < 2000; i++) {
        char *a = malloc(32 + i % 200);
        check(a, "malloc");
        snprintf(a, 32, "block %u", i);
        a = reallocarray(a, 3, 64 + i % 100);
        check(a, "reallocarray");
        char *s = strdup(a);
        check(s, "strdup");
        char *t = NULL;
        if (asprintf(&t, "%s and %u", s, i) < 0)
            return 1;
        check(t, "asprintf");
        for (char *c = t; *c; c++)
            sum = sum * 31 + (unsigned char)*c;
        free(t);
        free(s);
        free(a);
    }
    printf("own_malloc: result %lu\n", sum);
    printf("own_malloc: calls to the program's malloc: %s\n", calls > 6000 ? "all" : "too few");
    return 0;
}

/*
 * A program whose allocator has prefixed names only (je_malloc, as a
 * jemalloc built with --with-jemalloc-prefix=je_, or Rust's
 * tikv-jemallocator, gives): ddheap cannot wrap it. Under ddheap-run the
 * preload library says so at start and the program runs as without it
 * (tests/interpose/test_allocators.py, "unwrappable"). The allocator here
 * is a bump allocator over a static array, exported as je_malloc.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *je_malloc(size_t size);
void je_free(void *ptr);

static _Alignas(16) unsigned char pool[1u << 20];
static size_t used;

void *je_malloc(size_t size)
{
    size_t start = (used + 15) & ~(size_t)15;
    if (size > sizeof pool - start)
        return NULL;
    used = start + size;
    return pool + start;
}

void je_free(void *ptr)
{
    (void)ptr; /* never reused */
}

int main(void)
{
    unsigned long sum = 0;
    for (unsigned i = 0; i < 1000; i++) {
        char *a = je_malloc(100);
        char *b = malloc(100);
        if (a == NULL || b == NULL)
            return 1;
        snprintf(a, 100, "prefixed %u", i);
        memcpy(b, a, 100);
        for (char *c = b; *c; c++)
            sum = sum * 31 + (unsigned char)*c;
        free(b);
        je_free(a);
    }
    printf("prefixed: result %lu\n", sum);
    return 0;
}

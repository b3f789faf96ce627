/*
 * The slab allocator behind dd_slab.h.
 *
 *   chunk (64 KiB, 64 KiB aligned)
 *   | chunk header (64 B) | obj 0 | obj 1 | obj 2 | ... |
 *
 * Every object of a chunk has the chunk's class size; a free object holds
 * the free-list link in its first 8 bytes. The chunk header records the
 * class, which lets every free check that the size it was given leads to
 * the chunk the object lives in, and that the pointer is an object start:
 * a wrong size from ddheap would otherwise put the object on the wrong
 * free list and corrupt the heap silently, much later.
 *
 * The ddheap wiring is the four lines in dd_slab_alloc/dd_slab_free. A
 * sampled request is 16 bytes (the header) larger, so it usually lands in
 * the next class up; the user pointer is 16 bytes into the object.
 */
#include "dd_slab.h"

#include <ddheap.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHUNK_SIZE ((size_t)64 * 1024)
#define CHUNK_HEADER ((size_t)64)
#define CHUNK_MAGIC UINT32_C(0x51ab51ab)

/* Spacing 16 up to 128, then four classes per doubling: a request wastes
 * at most about 25%. All multiples of 16, so objects keep malloc's
 * alignment. */
static const uint32_t class_sizes[] = {
    16,   32,   48,   64,   80,   96,   112,  128,  160,  192,  224,  256,  320,  384,
    448,  512,  640,  768,  896,  1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096,
};
#define CLASS_COUNT (sizeof class_sizes / sizeof class_sizes[0])

struct chunk_header {
    uint32_t magic;
    uint32_t class_index;
};

struct size_class {
    pthread_mutex_t lock;
    void *free_list;     /* freed objects, linked through their first word */
    char *bump;          /* next never-used object in the newest chunk */
    char *bump_end;
};

static struct size_class classes[CLASS_COUNT];
static pthread_once_t classes_once = PTHREAD_ONCE_INIT;

static void init_classes(void)
{
    for (size_t i = 0; i < CLASS_COUNT; i++)
        pthread_mutex_init(&classes[i].lock, NULL);
}

/* The smallest class that holds `size` bytes (size <= DD_SLAB_MAX_SIZE). */
static size_t class_of(size_t size)
{
    size_t i = 0;
    while (class_sizes[i] < size)
        i++;
    return i;
}

static _Noreturn void corrupt(const char *what, const void *ptr, size_t size)
{
    fprintf(stderr, "dd_slab: %s (object %p, size %zu)\n", what, ptr, size);
    abort();
}

/* Refills the class's bump range with a fresh chunk. Called with the lock. */
static int new_chunk(struct size_class *c, size_t index)
{
    char *chunk = aligned_alloc(CHUNK_SIZE, CHUNK_SIZE);
    if (chunk == NULL)
        return -1;
    struct chunk_header *h = (struct chunk_header *)chunk;
    h->magic = CHUNK_MAGIC;
    h->class_index = (uint32_t)index;
    size_t objects = (CHUNK_SIZE - CHUNK_HEADER) / class_sizes[index];
    c->bump = chunk + CHUNK_HEADER;
    c->bump_end = c->bump + objects * class_sizes[index];
    return 0;
}

static void *class_alloc(size_t index)
{
    struct size_class *c = &classes[index];
    void *obj;
    pthread_mutex_lock(&c->lock);
    if (c->free_list != NULL) {
        obj = c->free_list;
        c->free_list = *(void **)obj;
    } else if (c->bump != c->bump_end || new_chunk(c, index) == 0) {
        obj = c->bump;
        c->bump += class_sizes[index];
    } else {
        obj = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    return obj;
}

static void class_free(void *obj, size_t size)
{
    size_t index = class_of(size);
    char *chunk = (char *)((uintptr_t)obj & ~(uintptr_t)(CHUNK_SIZE - 1));
    const struct chunk_header *h = (const struct chunk_header *)chunk;
    size_t offset = (size_t)((char *)obj - chunk);
    if (h->magic != CHUNK_MAGIC || h->class_index != index)
        corrupt("free with a size that does not match the object's chunk", obj, size);
    if (offset < CHUNK_HEADER || (offset - CHUNK_HEADER) % class_sizes[index] != 0)
        corrupt("free of a pointer that is not an object start", obj, size);

    struct size_class *c = &classes[index];
    pthread_mutex_lock(&c->lock);
    *(void **)obj = c->free_list;
    c->free_list = obj;
    pthread_mutex_unlock(&c->lock);
}

void *dd_slab_alloc(size_t size)
{
    pthread_once(&classes_once, init_classes);
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    void *raw;
    if (req.size > DD_SLAB_MAX_SIZE)
        raw = malloc(req.size);
    else
        raw = class_alloc(class_of(req.size ? req.size : 1));
    return dd_allocation_created(raw, req);
}

void dd_slab_free(void *ptr, size_t size)
{
    if (ptr == NULL)
        return;
    /* f.size is what dd_slab_alloc asked its classes for: the caller's size
     * plus ddheap's header when the object was sampled. */
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, 0);
    size_t real = f.size ? f.size : 1;
    if (real > DD_SLAB_MAX_SIZE)
        free(f.ptr);
    else
        class_free(f.ptr, real);
}

/*
 * ddheap over a slab allocator whose objects are packed back to back, so
 * the 16 bytes before an unsampled object are the tail of its neighbour:
 * user data, a freed object, or (deliberately) a copy of a real header.
 * Under a simulated tracer, sampled and unsampled objects are mixed; every
 * free must hand the slab exactly the pointer and size it gave out.
 *
 * Built with AddressSanitizer (scripts/stages/20-sanitizers.sh) the slab
 * poisons every free object, so the neighbour bytes ddheap reads before an
 * unsampled object are often poisoned: the run proves that ddheap's read is
 * exempt (DDHEAP__NO_SANITIZE_PEEK in fastpath.h and mark_header.c). A
 * control, in a child process, makes the same read from an ordinary
 * function and must be reported, which proves the poisoning is live.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "child.h"
#include "test_main.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLAB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLAB_ASAN 1
#endif
#endif
#ifndef SLAB_ASAN
#define SLAB_ASAN 0
#endif
#if SLAB_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Size classes of 8-byte granularity (ASan's shadow granule), including
 * sizes that are not multiples of 16, so objects start at every 8-byte
 * offset of a page; the enlarged requests of sampled blocks (+32) land in
 * the class above. */
#define CLASSES 8
#define REGION (64u * 1024u)
static const size_t class_size[CLASSES] = {24, 40, 48, 56, 72, 88, 104, 136};

struct slab_class {
    unsigned char *base;
    size_t count;
    uint32_t *free_stack; /* indices of free objects */
    size_t free_top;
    unsigned char *used;
};

static struct {
    unsigned char *arena;
    struct slab_class c[CLASSES];
    size_t live, errors;
} slab;

static void slab_init(void)
{
    memset(&slab, 0, sizeof slab);
    assert_int_equal(posix_memalign((void **)&slab.arena, 4096, (size_t)CLASSES * REGION), 0);
    for (int k = 0; k < CLASSES; k++) {
        struct slab_class *c = &slab.c[k];
        c->base = slab.arena + (size_t)k * REGION;
        c->count = REGION / class_size[k];
        c->free_stack = calloc(c->count, sizeof *c->free_stack);
        c->used = calloc(c->count, 1);
        assert_non_null(c->free_stack);
        assert_non_null(c->used);
        for (size_t i = 0; i < c->count; i++)
            c->free_stack[c->free_top++] = (uint32_t)(c->count - 1 - i);
    }
    POISON(slab.arena, (size_t)CLASSES * REGION);
}

static void slab_fini(void)
{
    UNPOISON(slab.arena, (size_t)CLASSES * REGION);
    for (int k = 0; k < CLASSES; k++) {
        free(slab.c[k].free_stack);
        free(slab.c[k].used);
    }
    free(slab.arena);
}

static int class_of(size_t size)
{
    for (int k = 0; k < CLASSES; k++)
        if (size <= class_size[k])
            return k;
    return -1;
}

static void *slab_alloc(size_t size)
{
    int k = class_of(size);
    if (k < 0 || slab.c[k].free_top == 0)
        return NULL;
    struct slab_class *c = &slab.c[k];
    uint32_t i = c->free_stack[--c->free_top];
    c->used[i] = 1;
    slab.live++;
    unsigned char *p = c->base + (size_t)i * class_size[k];
    UNPOISON(p, class_size[k]);
    return p;
}

/* A sized free, as slabs do: the size picks the class, and the pointer must
 * be exactly an object of that class that is in use. */
static void slab_free(void *ptr, size_t size)
{
    int k = class_of(size);
    unsigned char *p = ptr;
    struct slab_class *c = k < 0 ? NULL : &slab.c[k];
    if (c == NULL || p < c->base || p >= c->base + c->count * class_size[k] ||
        (size_t)(p - c->base) % class_size[k] != 0 || !c->used[(size_t)(p - c->base) / class_size[k]]) {
        slab.errors++;
        return;
    }
    size_t i = (size_t)(p - c->base) / class_size[k];
    c->used[i] = 0;
    c->free_stack[c->free_top++] = (uint32_t)i;
    slab.live--;
    POISON(p, class_size[k]);
}

/* --- wired to ddheap --- */

static size_t probe_allocs, probe_frees;

static void count_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    probe_allocs += ev->kind == DD_PROBE_ALLOC;
    probe_frees += ev->kind == DD_PROBE_FREE;
}

/* The slab object behind a block: the user pointer minus the bytes the
 * marking added in front (32 for the header scheme, 0 for a pointer tag,
 * whose top byte is dropped). */
static void *w_alloc(size_t size, int *sampled, unsigned char **raw)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    *sampled = req.weight != 0;
    *raw = slab_alloc(req.size);
    void *user = dd_allocation_created(*raw, req);
    return user;
}

static void w_free(void *p, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(p, size, 0);
    slab_free(f.ptr, f.size);
}

#define SLOTS 600

struct obj {
    unsigned char *p;
    size_t size;
    int sampled;
    unsigned char seed;
    size_t intact;     /* leading bytes that must still hold the seed */
    unsigned char *raw; /* the slab object (untagged) */
};

static uint64_t rng = 0x243f6a8885a308d3u;
static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_packed_neighbours(void **state)
{
    (void)state;
    struct obj objs[SLOTS];
    memset(objs, 0, sizeof objs);
    slab_init();
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(256); /* about one object in five sampled */
    ddheap_test_seed_thread(11);
    ddheap_test_set_probe_hook(count_hook, NULL);
    probe_allocs = probe_frees = 0;

    unsigned char header_copy[16];
    int have_header = 0;
    bool header_scheme = false; /* aarch64 pointer tagging has no header to copy */
    size_t ops = 0, forged = 0, sampled_seen = 0;
    for (; ops < 60000; ops++) {
        struct obj *o = &objs[next_random() % SLOTS];
        if (o->p == NULL) {
            o->size = 1 + next_random() % 104; /* + 32 fits the largest class */
            o->p = w_alloc(o->size, &o->sampled, &o->raw);
            assert_non_null(o->p);
            o->seed = (unsigned char)next_random();
            sampled_seen += (size_t)o->sampled;
            unsigned char *addr = (unsigned char *)((uintptr_t)o->p & ((UINT64_C(1) << 56) - 1));
            header_scheme |= addr != o->raw;
            if (o->sampled && !have_header && addr >= o->raw + 16) {
                /* A real header, to be planted before other objects. */
                memcpy(header_copy, addr - 16, 16);
                have_header = 1;
            }
            /* Fill the object; now and then end its slot with a copy of a
             * real header, i.e. plant it right before the next object. */
            memset(o->p, o->seed, o->size);
            o->intact = o->size;
            size_t slot = class_size[class_of(o->size + (size_t)(addr - o->raw))];
            unsigned char *slot_end = o->raw + slot;
            if (have_header && slot_end - 16 >= addr && next_random() % 3 == 0) {
                memcpy(slot_end - 16, header_copy, 16);
                if ((size_t)(slot_end - 16 - addr) < o->intact)
                    o->intact = (size_t)(slot_end - 16 - addr);
                forged++;
            }
        } else {
            for (size_t i = 0; i < o->intact; i++)
                if (o->p[i] != o->seed)
                    fail_msg("object %p (%zu bytes) changed at %zu", (void *)o->p, o->size, i);
            w_free(o->p, o->size);
            o->p = NULL;
        }
    }
    for (size_t i = 0; i < SLOTS; i++)
        if (objs[i].p)
            w_free(objs[i].p, objs[i].size);
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);
    print_message("%zu operations, %zu sampled, %zu header copies planted, ASan %s\n", ops,
                  sampled_seen, forged, SLAB_ASAN ? "on" : "off");
    assert_int_equal(slab.errors, 0); /* every free got exactly its object back */
    assert_int_equal(slab.live, 0);
    assert_int_equal(probe_allocs, sampled_seen);
    assert_int_equal(probe_frees, probe_allocs);
    assert_int_equal(ddheap_test_live_marked(), 0);
    assert_true(sampled_seen > 1000);
    assert_true(forged > 1000 || !header_scheme);
    slab_fini();
}

/* The same 16-byte read as ddheap's, from a function that is not exempt. */
__attribute__((noinline)) static uint64_t plain_read_before(const unsigned char *p)
{
    uint64_t v[2];
    memcpy(v, p - 16, sizeof v);
    return v[0] ^ v[1];
}

/* The control's child: reads the 16 bytes before an object whose
 * neighbour was freed (and so poisoned) from an ordinary function. */
static int read_before_poisoned(void *unused)
{
    (void)unused;
    slab_init();
    unsigned char *a = slab_alloc(40), *b = slab_alloc(40);
    slab_free(a, 40); /* poisons b's 16 bytes before */
    return plain_read_before(b) == 42 ? 3 : 0;
}

static void test_control_poison_is_live(void **state)
{
    (void)state;
    if (!SLAB_ASAN) {
        print_message("not an ASan build: the control has nothing to prove\n");
        return;
    }
    static struct child_output child;
    run_child(read_before_poisoned, NULL, &child);
    int status = child.status;
    const char *text = child.err;
    assert_false(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (strstr(text, "use-after-poison") == NULL)
        fail_msg("the control read was not reported as use-after-poison; child said: %s", text);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_packed_neighbours),
    cmocka_unit_test(test_control_poison_is_live))

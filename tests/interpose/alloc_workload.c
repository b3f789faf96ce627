/*
 * A program that uses its allocator both ways: the standard malloc family
 * and the allocator's own API, mixed (a block from one freed by the
 * other). Built once per allocator (tests/interpose/meson.build):
 *
 *   DDHEAP_TEST_ALLOCATOR=1  linked with -ljemalloc: mallocx, sdallocx,
 *                            rallocx, sallocx, mallctl
 *   DDHEAP_TEST_ALLOCATOR=2  linked with -ltcmalloc_minimal: tc_malloc,
 *                            tc_free, tc_malloc_size, MallocExtension
 *   DDHEAP_TEST_ALLOCATOR=3  mimalloc preloaded (LD_PRELOAD), not linked:
 *                            mi_* looked up with dlsym
 *   DDHEAP_TEST_ALLOCATOR=0  glibc
 *
 * It checks itself and exits 1 on the first failure: every block, from
 * every entry point, is owned by the allocator (jemalloc's arenas.lookup,
 * tcmalloc's MallocExtension_GetOwnership, mi_is_in_heap_region), and
 * malloc_usable_size agrees with the allocator's own size function. So
 * the program fails if anything hands its calls to another allocator.
 * It prints one result line (a checksum of the contents, the same with and
 * without ddheap) and the allocator's own statistics ("alloc: stat NAME
 * VALUE"), which test_allocators.py compares between runs.
 *
 * With DDHEAP_TEST_AGENT=path to a library holding libddheap.a (the GOT
 * test's agent), it first loads it and calls dd_heap_interpose_libc(), as
 * an agent would, with a simulated tracer at interval 1 and a probe hook
 * that counts what is reported: the same checks then hold for the
 * in-process rewrite, and at least one alloc must have been reported.
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ddheap.h>
#include <ddheap/testing.h>

#include "alloc_owner.h"

#define BIG (48u << 20) /* a block the statistics cannot miss */

static uint64_t hash;
static volatile size_t huge_count = SIZE_MAX / 2; /* volatile: no compile-time warning */
static void *volatile sink;

static void mix(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i += 61)
        hash = hash * 1099511628211u ^ b[i];
    hash = hash * 31 + n;
}

static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(seed + i * 7);
}

/* The whole standard family, each block filled, checked and freed. */
static void standard_family(unsigned round)
{
    size_t n = 24 + (round * 97u) % 9000u;
    char *a = owned_block(malloc(n), n, "malloc");
    fill(a, n, round);
    char *b = owned_block(calloc(round % 7 + 1, n), (round % 7 + 1) * n, "calloc");
    for (size_t i = 0; i < n; i += 257)
        if (b[i] != 0)
            fail("calloc: not zeroed");
    a = owned_block(realloc(a, 2 * n), 2 * n, "realloc");
    mix(a, n);
    a = owned_block(reallocarray(a, 3, n), 3 * n, "reallocarray");
    mix(a, n);
    void *c = NULL;
    if (posix_memalign(&c, 64, n) != 0)
        fail("posix_memalign");
    owned_block(c, n, "posix_memalign");
    if ((uintptr_t)c % 64 != 0)
        fail("posix_memalign: alignment");
    /* 64, not more: Debian's mimalloc 2.0.9 returns blocks aligned to 128
     * only for aligned_alloc(256, 1024), with or without ddheap. */
    void *d = owned_block(aligned_alloc(64, 1024), 1024, "aligned_alloc");
    void *e = owned_block(memalign(4096, n), n, "memalign");
    void *f = owned_block(valloc(n), n, "valloc");
    if ((uintptr_t)d % 64 != 0 || (uintptr_t)e % 4096 != 0 || (uintptr_t)f % 4096 != 0)
        fail("aligned entry points: alignment");
    if (pvalloc_is_the_allocators()) {
        void *g = owned_block(pvalloc(n), n, "pvalloc");
        free(g);
    }
    char *s = owned_block(strdup("a string strdup made inside libc"), 10, "strdup");
    mix(s, strlen(s));
    char *t = NULL;
    if (asprintf(&t, "round %u of the family", round) < 0)
        fail("asprintf");
    owned_block(t, strlen(t), "asprintf");
    mix(t, strlen(t));
    free(t);
    free(s);
    free(f);
    free(e);
    free(d);
    free(c);
    free(b);
    free(a);
    if (reallocarray(NULL, huge_count, 4) != NULL || errno != ENOMEM)
        fail("reallocarray: overflow must fail with ENOMEM");
}

static unsigned long reported_allocs;

static void count_report(const dd_probe_event_t *event, void *ctx)
{
    (void)ctx;
    reported_allocs += event->kind == DD_PROBE_ALLOC;
}

#define AGENT_FN(var, handle, name)                      \
    do {                                                 \
        void *sym_ = dlsym(handle, name);                \
        if (sym_ == NULL)                                \
            fail("the agent does not export " name);     \
        memcpy(&(var), &sym_, sizeof(var));              \
    } while (0)

/* Loads the agent and turns the in-process rewrite on; false if not asked. */
static bool interpose_through_agent(void)
{
    const char *path = getenv("DDHEAP_TEST_AGENT");
    if (path == NULL || path[0] == '\0')
        return false;
    void *agent = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (agent == NULL)
        fail("cannot load DDHEAP_TEST_AGENT");
    void (*set_interval)(uint64_t);
    void (*simulate)(bool);
    void (*set_hook)(dd_probe_hook_fn, void *);
    int (*interpose)(void);
    AGENT_FN(set_interval, agent, "dd_set_default_sampling_interval");
    AGENT_FN(simulate, agent, "dd_heap_simulate_tracer");
    AGENT_FN(set_hook, agent, "ddheap_test_set_probe_hook");
    AGENT_FN(interpose, agent, "dd_heap_interpose_libc");
    set_interval(1);
    simulate(true);
    set_hook(count_report, NULL);
    if (interpose() != 0)
        fail("dd_heap_interpose_libc did not return 0");
    return true;
}

int main(void)
{
    allocator_setup();
    bool interposed = interpose_through_agent();
    for (unsigned round = 0; round < 400; round++) {
        standard_family(round);
        allocator_specific(round, mix);
    }
    uint64_t before = allocator_stat();
    char *big = owned_block(malloc(BIG), BIG, "malloc(BIG)");
    fill(big, BIG, 3);
    sink = big;
    uint64_t during = allocator_stat();
    if (during < before + BIG)
        fail("the allocator's own statistics did not see malloc(BIG)");
    mix(big, BIG);
    free(big);
    if (interposed && reported_allocs == 0)
        fail("dd_heap_interpose_libc: nothing was reported");
    if (interposed)
        fprintf(stderr, "alloc: reported allocs %lu\n", reported_allocs);
    printf("alloc: allocator %s\n", ALLOCATOR_NAME);
    printf("alloc: result %016llx\n", (unsigned long long)hash);
    printf("alloc: stat allocated %llu\n", (unsigned long long)allocator_stat());
    printf("alloc: stat big_seen %llu\n", (unsigned long long)(during - before));
    return 0;
}

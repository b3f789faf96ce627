/*
 * Shadow marking (src/mark_shadow.*), built against ddheap_shadow_dep in
 * every build: whatever scheme the build's own library uses, this program
 * links the shadow archive and inlines the shadow fast path, exactly as
 * the libc interposer does.
 *
 * The scheme never touches a block, so most tests hand it addresses that
 * are not memory at all: a heap spread over a gigabyte, or one that wanders
 * across the whole address space, costs nothing to simulate.
 */
#include "mark.h"

#include <ddheap.h>
#include <ddheap/testing.h>

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "recording_alloc.h"
#include "test_main.h"

#if !DDHEAP_MARK_SHADOW
#error "test_mark_shadow must be built against ddheap_shadow_dep"
#endif

/* What a wrapper does, with a pointer the "allocator" chose. */
static void *mark(uintptr_t address, size_t size, size_t alignment)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    assert_int_equal(req.size, size);
    assert_int_equal(req.alignment, alignment);
    void *user = dd_allocation_created((void *)address, req);
    assert_ptr_equal(user, (void *)address);
    return user;
}

static void release(uintptr_t address, size_t size, size_t alignment)
{
    dd_alloc_freed_t f = dd_allocation_freed((void *)address, size, alignment);
    assert_ptr_equal(f.ptr, (void *)address);
    assert_int_equal(f.size, size);
}

static uint64_t splitmix(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Issue 12's memory row: 4000 live sampled blocks at random addresses over
 * a 1 GiB heap fit in 1 MiB of metadata (tables and summary, resident).
 * First in the program, so nothing before it has touched the tables. */
static void test_metadata_for_4000_blocks_over_1gib(void **state)
{
    (void)state;
    tracer_on(1);
    enum { N = 4000 };
    static uintptr_t at[N];
    uint64_t seed = 12;
    const uintptr_t base = UINT64_C(0x7f0000000000);
    for (int i = 0; i < N; i++) {
        at[i] = base + (splitmix(&seed) % (UINT64_C(1) << 30) & ~(uint64_t)15);
        for (int j = 0; j < i; j++)
            if (at[j] == at[i])
                at[i] += 16; /* distinct blocks */
        mark(at[i], 64, 0);
    }
    assert_int_equal(ddheap_test_live_marked(), N);
    size_t mapped = 0;
    size_t resident = ddheap_shadow_metadata_bytes(&mapped);
    print_message("4000 blocks over 1 GiB: %zu bytes of metadata resident (%zu of tables mapped, "
                  "%u level(s))\n",
                  resident, mapped, ddheap_shadow_levels_mapped());
    assert_true(resident > 0);
    assert_true(resident <= (size_t)1 << 20);
    for (int i = 0; i < N; i++)
        release(at[i], 64, 0);
    assert_int_equal(rec.allocs, N);
    assert_int_equal(rec.frees, N);
    tracer_done();
}

/* Issue 12, item 2: for every block, sampled or not, every alignment
 * sampling covers: the request, the pointer and the freed size are the
 * caller's own. */
static void test_contract_at_every_alignment(void **state)
{
    (void)state;
    for (int sampled = 0; sampled <= 1; sampled++) {
        tracer_on(sampled ? 1 : UINT64_C(1) << 62);
        size_t n = 0;
        for (size_t a = 0; a <= DDHEAP_MAX_SAMPLED_ALIGNMENT; a = a ? a * 2 : 1) {
            assert_int_equal(ddheap_mark_extra(a), 0);
            uintptr_t step = a > 16 ? a : 16; /* a block the allocator could return */
            uintptr_t address = (UINT64_C(0x200000000000) + step * 3) & ~(step - 1);
            mark(address, 100, a);
            release(address, n % 2 ? 100 : 0, a);
            n++;
        }
        assert_int_equal(rec.allocs, sampled ? n : 0);
        assert_int_equal(rec.frees, sampled ? n : 0);
        tracer_done();
    }
}

/* Every 8-byte address of a page sampled, freed in a shuffled order: each
 * free reports exactly its own pointer, and only once. */
static void test_every_granule_of_a_page(void **state)
{
    (void)state;
    tracer_on(1);
    enum { SLOTS = 512 };
    const uintptr_t page = UINT64_C(0x300000000000);
    for (int i = 0; i < SLOTS; i++)
        mark(page + (uintptr_t)i * 8, 8, 8);
    assert_int_equal(ddheap_test_live_marked(), SLOTS);
    int order[SLOTS];
    for (int i = 0; i < SLOTS; i++)
        order[i] = i;
    uint64_t seed = 5;
    for (int i = SLOTS - 1; i > 0; i--) {
        int j = (int)(splitmix(&seed) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (int i = 0; i < SLOTS; i++) {
        size_t before = rec.frees;
        uintptr_t address = page + (uintptr_t)order[i] * 8;
        release(address, 0, 0);
        assert_int_equal(rec.frees, before + 1);
        assert_int_equal(rec.ev[rec.n - 1].kind, DD_PROBE_FREE);
        assert_int_equal(rec.ev[rec.n - 1].ptr, address);
        release(address, 0, 0); /* again: the bit is gone */
        assert_int_equal(rec.frees, before + 1);
    }
    tracer_done();
}

/* Item 5: a sampled block freed without ddheap leaves a stale bit. The
 * next free at that address, of whatever block, reports it once; nothing
 * else is disturbed. */
static void test_stale_bit_reported_by_the_next_free(void **state)
{
    (void)state;
    tracer_on(1);
    const uintptr_t x = UINT64_C(0x310000000040);
    mark(x, 48, 0); /* ...and freed behind ddheap's back */
    mark(x + 64, 48, 0);
    dd_heap_simulate_tracer(false);
    release(x, 48, 0); /* an unsampled block that the allocator put there */
    assert_int_equal(rec.frees, 1);
    assert_int_equal(rec.ev[rec.n - 1].ptr, x);
    release(x, 48, 0);
    assert_int_equal(rec.frees, 1);
    assert_int_equal(ddheap_test_live_marked(), 1); /* x + 64 is still marked */
    release(x + 64, 48, 0);
    assert_int_equal(rec.frees, 2);
    tracer_done();
}

/* Item 5: a later sampled block at a stale address works: the stale block's
 * free is reported before the new block's alloc (a balanced stream), and
 * the new block's free is reported too. */
static void test_stale_bit_then_sampled_again(void **state)
{
    (void)state;
    tracer_on(1);
    const uintptr_t x = UINT64_C(0x320000000080);
    mark(x, 32, 0); /* freed behind ddheap's back */
    mark(x, 32, 0);
    assert_int_equal(rec.n, 3);
    assert_int_equal(rec.ev[0].kind, DD_PROBE_ALLOC);
    assert_int_equal(rec.ev[1].kind, DD_PROBE_FREE);
    assert_int_equal(rec.ev[1].ptr, x);
    assert_int_equal(rec.ev[2].kind, DD_PROBE_ALLOC);
    assert_int_equal(rec.ev[2].ptr, x);
    assert_int_equal(ddheap_test_live_marked(), 1);
    release(x, 32, 0);
    assert_int_equal(rec.frees, 2);
    tracer_done();
}

/* Blocks that one bit per 8 bytes cannot tell apart (not 8-byte aligned),
 * or whose span does not fit a word (top byte set): never marked, so never
 * reported, and the pointer still passes through. */
static void test_unmarkable_addresses_pass_through(void **state)
{
    (void)state;
    tracer_on(1);
    uintptr_t odd[] = {UINT64_C(0x330000000004), UINT64_C(0x330000000001),
                       UINT64_C(0xdd00330000000000), (UINT64_C(1) << 54) + 8};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
        mark(odd[i], 4, 0);
        release(odd[i], 4, 0);
    }
    assert_int_equal(rec.n, 0);
    tracer_done();
}

/* The highest markable address, 2^54: its span fills the word's tag. */
static void test_highest_markable_address(void **state)
{
    (void)state;
    tracer_on(1);
    const uintptr_t top = UINT64_C(1) << 54;
    mark(top, 4, 0);
    assert_int_equal(ddheap_test_live_marked(), 1);
    release(top, 4, 0);
    assert_int_equal(ddheap_test_live_marked(), 0);
    assert_int_equal(rec.n, 2);
    tracer_done();
}

/* More live marks than the first table holds: further tables are mapped
 * and every block is still found. 128 bytes apart, each block has a word
 * of its own. */
static void test_tables_grow_with_live_blocks(void **state)
{
    (void)state;
    tracer_on(1);
    enum { N = 150000 };
    const uintptr_t base = UINT64_C(0x340000000000);
    for (uintptr_t i = 0; i < N; i++)
        mark(base + i * 128, 100, 0);
    assert_int_equal(ddheap_test_live_marked(), N);
    assert_true(ddheap_shadow_levels_mapped() >= 3);
    assert_int_equal(ddheap_shared_v3.shadow_overflow, 0);
    for (uintptr_t i = 0; i < N; i++)
        release(base + (i * 7919 % N) * 128, 0, 0);
    assert_int_equal(rec.allocs, N);
    assert_int_equal(rec.frees, N);
    tracer_done();
}

/* Item 3, bounded memory: a heap that wanders across the address space
 * (2000 live blocks at a time, a million blocks over 2^46 bytes) maps no
 * table beyond what its first round needed, because words are reused as
 * soon as they empty; the summary is at most its fixed 1 MiB. */
static void test_wandering_heap_stays_bounded(void **state)
{
    (void)state;
    tracer_on(1);
    enum { LIVE = 2000, ROUNDS = 500 };
    static uintptr_t live[LIVE];
    uint64_t seed = 99;
    unsigned levels_after_first_round = 0;
    size_t mapped_after_first_round = 0;
    for (int round = 0; round < ROUNDS; round++) {
        uintptr_t region = (uintptr_t)(splitmix(&seed) % (UINT64_C(1) << 46)) & ~(uintptr_t)0xfff;
        region += UINT64_C(1) << 20;
        for (int i = 0; i < LIVE; i++) {
            if (round)
                release(live[i], 0, 0);
            live[i] = region + (uintptr_t)i * 48;
            mark(live[i], 40, 0);
        }
        if (round == 0) {
            levels_after_first_round = ddheap_shadow_levels_mapped();
            (void)ddheap_shadow_metadata_bytes(&mapped_after_first_round);
        }
    }
    size_t mapped = 0;
    size_t resident = ddheap_shadow_metadata_bytes(&mapped);
    print_message("wandering heap: %u level(s), %zu bytes mapped, %zu resident after %d blocks\n",
                  ddheap_shadow_levels_mapped(), mapped, resident, LIVE * ROUNDS);
    assert_int_equal(ddheap_shadow_levels_mapped(), levels_after_first_round);
    assert_int_equal(mapped, mapped_after_first_round);
    assert_true(resident <= mapped + sizeof ddheap_shared_v3.shadow_summary);
    for (int i = 0; i < LIVE; i++)
        release(live[i], 0, 0);
    assert_int_equal(rec.allocs, (size_t)LIVE * ROUNDS);
    assert_int_equal(rec.frees, (size_t)LIVE * ROUNDS);
    tracer_done();
}

/* Threads marking and unmarking interleaved addresses of the same words:
 * every compare-and-swap race must keep every other thread's bits. */
enum { THREADS = 4, PER_THREAD = 64, ROUNDS_PER_THREAD = 3000 };
static const uintptr_t shared_base = UINT64_C(0x350000000000);
static _Thread_local size_t my_allocs, my_frees, my_wrong;
static size_t thread_allocs[THREADS], thread_frees[THREADS], thread_wrong[THREADS];
static _Thread_local uintptr_t my_lo;

static void thread_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    /* a thread only ever reports its own addresses */
    uintptr_t slot = (ev->ptr - shared_base) / 8;
    my_wrong += ev->ptr < shared_base || slot % THREADS != my_lo;
    my_allocs += ev->kind == DD_PROBE_ALLOC;
    my_frees += ev->kind == DD_PROBE_FREE;
}

static void *churn(void *arg)
{
    int id = (int)(intptr_t)arg;
    my_lo = (uintptr_t)id;
    dd_set_default_sampling_interval(1);
    for (int r = 0; r < ROUNDS_PER_THREAD; r++) {
        for (int i = 0; i < PER_THREAD; i++) {
            uintptr_t a = shared_base + ((uintptr_t)i * THREADS + (uintptr_t)id) * 8;
            dd_alloc_req_t req = dd_allocation_requested(8, 0);
            (void)dd_allocation_created((void *)a, req);
        }
        for (int i = 0; i < PER_THREAD; i++) {
            uintptr_t a = shared_base + ((uintptr_t)i * THREADS + (uintptr_t)id) * 8;
            (void)dd_allocation_freed((void *)a, 0, 0);
        }
    }
    thread_allocs[id] = my_allocs;
    thread_frees[id] = my_frees;
    thread_wrong[id] = my_wrong;
    return NULL;
}

static void test_threads_share_words(void **state)
{
    (void)state;
    tracer_on(1);
    ddheap_test_set_probe_hook(thread_hook, NULL);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(intptr_t)i), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(thread_allocs[i], (size_t)PER_THREAD * ROUNDS_PER_THREAD);
        assert_int_equal(thread_frees[i], (size_t)PER_THREAD * ROUNDS_PER_THREAD);
        assert_int_equal(thread_wrong[i], 0);
    }
    tracer_done();
}

/* A block sampled before fork is recognised in the child, and the child's
 * free does not disturb the parent's copy of the bits. */
static void test_fork(void **state)
{
    (void)state;
    tracer_on(1);
    const uintptr_t x = UINT64_C(0x360000000100);
    mark(x, 16, 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        size_t before = rec.frees;
        (void)dd_allocation_freed((void *)x, 0, 0);
        _exit(rec.frees == before + 1 && ddheap_test_live_marked() == 0 ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(ddheap_test_live_marked(), 1);
    release(x, 0, 0);
    assert_int_equal(rec.frees, 1);
    tracer_off();
}

/* The realloc pair hands the real realloc exactly what the caller passed,
 * whether the old block is sampled, the new one is, both or neither. */
static void test_realloc_passes_through(void **state)
{
    (void)state;
    for (int sampled = 0; sampled <= 1; sampled++) {
        tracer_on(sampled ? 1 : UINT64_C(1) << 62);
        char *p = w_malloc(40);
        for (size_t n = 50; n < 5000; n = n * 3) {
            dd_realloc_prep_t prep = dd_allocation_realloc_prepare(p, n);
            assert_ptr_equal(prep.raw_ptr, p);
            assert_int_equal(prep.raw_size, n);
            void *raw = ra_realloc(prep.raw_ptr, prep.raw_size);
            char *q = dd_allocation_realloc_commit(p, raw, prep);
            assert_ptr_equal(q, raw);
            p = q;
        }
        w_free(p);
        assert_int_equal(rec.allocs, rec.frees);
        assert_int_equal(rec.allocs, sampled ? 6 : 0); /* malloc and 5 reallocs */
        tracer_done();
    }
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_metadata_for_4000_blocks_over_1gib),
    cmocka_unit_test(test_contract_at_every_alignment),
    cmocka_unit_test(test_every_granule_of_a_page),
    cmocka_unit_test(test_stale_bit_reported_by_the_next_free),
    cmocka_unit_test(test_stale_bit_then_sampled_again),
    cmocka_unit_test(test_unmarkable_addresses_pass_through),
    cmocka_unit_test(test_highest_markable_address),
    cmocka_unit_test(test_realloc_passes_through),
    cmocka_unit_test(test_threads_share_words),
    cmocka_unit_test(test_fork),
    cmocka_unit_test(test_wandering_heap_stays_bounded),
    cmocka_unit_test(test_tables_grow_with_live_blocks))

/*
 * realloc.c: the prepare/commit pair (docs/realloc.md).
 *
 * Every combination of {old block sampled, not} x {new block sampled, not}
 * x {real realloc moves, grows in place} x {grow, shrink}: contents kept up
 * to min(old, new), the exact probe sequence, exact sizes back on a sized
 * free of the result, and nothing leaked. Then the real realloc failing,
 * realloc(NULL, n), realloc(p, 0), over-aligned old blocks, and a
 * statistical check that a realloc-only workload is estimated without bias.
 */
#include "internal.h"
#include "mark.h"
#include "recording_alloc.h"
#include "test_main.h"

#include <math.h>
#include <stdio.h>

static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 8));
}

static void check_fill(const void *p, size_t n, unsigned seed)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(seed * 131 + i * 7 + (i >> 8)))
            fail_msg("content lost at byte %zu of %zu", i, n);
}

/* Sampled or not, by switching the simulated tracer (R stays 1). */
static void sampling(bool on)
{
    bool attached = dd_heap_profiler_attached();
    if (on != attached)
        dd_heap_simulate_tracer(on);
}

static void expect_event(size_t i, dd_probe_kind_t kind, const void *ptr, const void *new_ptr,
                         uint64_t size, uint64_t weight)
{
    assert_true(i < rec.n);
    const dd_probe_event_t *e = &rec.ev[i];
    assert_int_equal(e->kind, kind);
    assert_int_equal(e->ptr, (uintptr_t)ptr);
    if (kind == DD_PROBE_REALLOC)
        assert_int_equal(e->new_ptr, (uintptr_t)new_ptr);
    if (kind != DD_PROBE_FREE) {
        assert_int_equal(e->size, size);
        assert_int_equal(e->weight, weight);
    }
}

static void one_case(enum ra_realloc_mode mode, bool old_sampled, bool new_sampled,
                     size_t old_size, size_t new_size)
{
    tracer_on(1);
    ra.realloc_mode = mode;
    sampling(old_sampled);
    char *old = w_malloc(old_size);
    assert_non_null(old);
    fill(old, old_size, 3);
    rec.n = rec.allocs = rec.frees = rec.reallocs = 0;

    sampling(new_sampled);
    size_t allocs_before = ra.handed_out;
    char *fresh = w_realloc(old, new_size);
    assert_non_null(fresh);
    if (mode == RA_REALLOC_IN_PLACE) /* really grown or shrunk in place */
        assert_int_equal(ra.handed_out, allocs_before);
    check_fill(fresh, old_size < new_size ? old_size : new_size, 3);

    size_t i = 0;
    if (old_sampled)
        expect_event(i++, DD_PROBE_FREE, old, NULL, 0, 0);
    if (new_sampled)
        expect_event(i++, DD_PROBE_ALLOC, fresh, NULL, new_size, new_size);
    if (old_sampled || new_sampled)
        expect_event(i++, DD_PROBE_REALLOC, old, fresh, new_size, new_sampled ? new_size : 0);
    assert_int_equal(rec.n, i);

    rec.n = rec.allocs = rec.frees = rec.reallocs = 0;
    sampling(false);
    w_free_sized(fresh, new_size, 0); /* the recording allocator asserts the exact size */
    assert_int_equal(rec.frees, new_sampled ? 1 : 0);
    tracer_done();
}

static void test_all_combinations(void **state)
{
    (void)state;
    enum ra_realloc_mode modes[] = {RA_REALLOC_MOVE, RA_REALLOC_IN_PLACE};
    size_t sizes[][2] = {{100, 1000}, {1000, 100}, {100, 100}, {24, 25}, {3000, 17}};
    for (size_t m = 0; m < 2; m++)
        for (int old_s = 0; old_s < 2; old_s++)
            for (int new_s = 0; new_s < 2; new_s++)
                for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
                    one_case(modes[m], old_s, new_s, sizes[k][0], sizes[k][1]);
}

/* The real realloc fails: the old block is exactly as before (contents,
 * mark, a correct later free). If it was reported, prepare has reported it
 * freed already; commit reports it allocated again with the size and weight
 * it was first reported with, then realloc(old, 0, ...) for the failure,
 * and its later free is reported once. Small blocks (header) and
 * page-aligned ones (the table) keep their report in different places. */
static void failed_realloc_case(bool old_sampled, size_t alignment, size_t size, uint64_t interval)
{
    tracer_on(interval);
    ddheap_test_seed_thread(77);
    sampling(old_sampled);
    char *old = alignment ? w_alloc(size, alignment) : w_malloc(size);
    assert_non_null(old);
    fill(old, size, 9);
    uint64_t marked = ddheap_test_live_marked();
    uint64_t weight = 0;
    /* Shadow bits keep no report: a reported block whose realloc failed is
     * left unmarked, freed in the stream and never reported again. */
    const bool dropped = old_sampled && DDHEAP_MARK_SHADOW;
    if (old_sampled) {
        assert_int_equal(rec.n, 1); /* sampled: a large block at this interval */
        expect_event(0, DD_PROBE_ALLOC, old, NULL, size, rec.ev[0].weight);
        weight = rec.ev[0].weight;
        assert_true(weight >= size);
    }
    rec.n = rec.allocs = rec.frees = rec.reallocs = 0;

    ra.realloc_mode = RA_REALLOC_FAIL;
    sampling(true);
    assert_null(w_realloc(old, 5000));
    if (old_sampled && DDHEAP_MARK_KEEPS_REPORT) {
        expect_event(0, DD_PROBE_FREE, old, NULL, 0, 0);
        expect_event(1, DD_PROBE_ALLOC, old, NULL, size, weight); /* exactly as first reported */
        expect_event(2, DD_PROBE_REALLOC, old, NULL, 5000, 0);    /* new_ptr 0: it failed */
        assert_int_equal(rec.n, 3);
    } else if (old_sampled) {
        /* A pointer tag keeps no report (docs/realloc.md): freed, not again */
        expect_event(0, DD_PROBE_FREE, old, NULL, 0, 0);
        expect_event(1, DD_PROBE_REALLOC, old, NULL, 5000, 0);
        assert_int_equal(rec.n, 2);
    } else {
        assert_int_equal(rec.n, 0); /* no reported block involved */
    }
    assert_int_equal(ddheap_test_live_marked(), marked - (dropped ? 1 : 0));
    check_fill(old, size, 9);

    /* Fails again: the report was kept again, not lost with the first. */
    rec.n = rec.allocs = rec.frees = rec.reallocs = 0;
    assert_null(w_realloc(old, 6000));
    if (old_sampled && DDHEAP_MARK_KEEPS_REPORT)
        expect_event(1, DD_PROBE_ALLOC, old, NULL, size, weight);

    rec.n = rec.allocs = rec.frees = rec.reallocs = 0;
    w_free_sized(old, size, alignment); /* still recognised: raw and size recovered */
    assert_int_equal(rec.frees, old_sampled && !dropped ? 1 : 0);
    assert_int_equal(rec.n, old_sampled && !dropped ? 1 : 0);
    tracer_done();
}

static void test_failed_realloc_reports_old_block_again(void **state)
{
    (void)state;
    for (int old_s = 0; old_s < 2; old_s++) {
        failed_realloc_case(old_s, 0, 300, 1);     /* weight = size */
        failed_realloc_case(old_s, 0, 3000, 1024); /* weight > size: the Poisson estimate */
        failed_realloc_case(old_s, 4096, 3000, 1024); /* page-aligned: kept in the table */
        failed_realloc_case(old_s, 64, 3000, 1024);   /* header further in */
    }
}

static void test_realloc_null_allocates(void **state)
{
    (void)state;
    tracer_on(1);
    char *p = w_realloc(NULL, 77);
    assert_non_null(p);
    expect_event(0, DD_PROBE_ALLOC, p, NULL, 77, 77);
    expect_event(1, DD_PROBE_REALLOC, NULL, p, 77, 77);
    assert_int_equal(rec.n, 2);
    w_free_sized(p, 77, 0);
    /* realloc(NULL, 0): an allocation of 0 bytes, never sampled */
    rec.n = 0;
    void *z = w_realloc(NULL, 0);
    assert_int_equal(rec.n, 0);
    w_free(z);
    assert_int_equal(ra.live, 0);
    tracer_off();
}

/* realloc(p, 0) frees p (glibc semantics, which the recording allocator follows). */
static void test_realloc_to_zero_frees(void **state)
{
    (void)state;
    for (int old_s = 0; old_s < 2; old_s++) {
        tracer_on(1);
        sampling(old_s);
        char *p = w_malloc(64);
        rec.n = rec.allocs = rec.frees = rec.reallocs = 0;
        assert_null(w_realloc(p, 0));
        assert_int_equal(rec.frees, old_s ? 1 : 0);
        assert_int_equal(rec.allocs, 0);
        tracer_done();
    }
}

/* Old blocks aligned beyond 16 (header further in) and page-aligned ones
 * (table, no header): the new block's bytes and size still come out right,
 * in both realloc modes. */
static void test_realloc_of_aligned_blocks(void **state)
{
    (void)state;
    size_t aligns[] = {64, 2048, 4096, 65536};
    for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++)
        for (int mode = 0; mode < 2; mode++)
            for (int new_s = 0; new_s < 2; new_s++) {
                tracer_on(1);
                ra.realloc_mode = mode ? RA_REALLOC_IN_PLACE : RA_REALLOC_MOVE;
                char *p = w_alloc(1000, aligns[a]);
                assert_true((uintptr_t)p % aligns[a] == 0);
                fill(p, 1000, 5);
                sampling(new_s);
                char *q = w_realloc(p, 1500);
                check_fill(q, 1000, 5);
                sampling(true);
                q = w_realloc(q, 700);
                check_fill(q, 700, 5);
                w_free_sized(q, 700, 0);
                tracer_done();
            }
}

/* A signal handler that allocates while the real realloc has freed the old
 * block but commit has not run yet. prepare reported free(old) before the
 * real realloc, so no guard is needed: the handler's block is sampled like
 * any other, and even when it is handed the old address its alloc comes
 * after that free. The recording allocator's storage comes from libc, which hands the
 * chunk the realloc just freed to the next request of its size: the
 * handler asks for the old block's size, so it usually gets its address. */
static char *handler_block;
static size_t handler_size;

static void allocate_like_a_signal_handler(void)
{
    handler_block = w_malloc(handler_size);
}

static void test_signal_handler_inside_realloc_is_ordered(void **state)
{
    (void)state;
    tracer_on(1);
    handler_size = 100;
    char *p = w_malloc(handler_size);
    rec.n = rec.allocs = rec.frees = rec.reallocs = 0;
    ra.inside_realloc = allocate_like_a_signal_handler;
    char *q = w_realloc(p, 4000);
    ra.inside_realloc = NULL;
    assert_non_null(handler_block);
    print_message("handler got %s address\n", handler_block == p ? "the old" : "another");
    /* free(old), the handler's alloc, then the realloc's alloc(new) and realloc */
    expect_event(0, DD_PROBE_FREE, p, NULL, 0, 0);
    expect_event(1, DD_PROBE_ALLOC, handler_block, NULL, handler_size, handler_size);
    expect_event(2, DD_PROBE_ALLOC, q, NULL, 4000, 4000);
    expect_event(3, DD_PROBE_REALLOC, p, q, 4000, 4000);
    assert_int_equal(rec.n, 4);
    w_free(handler_block);
    w_free(q);
    assert_int_equal(rec.frees, 3);
    assert_int_equal(ra.live, 0);
    assert_int_equal(ddheap__thread_state.busy, 0);
    tracer_off();
}

/* --- statistical: a workload that grows buffers only with realloc --- */

#define MAP_SLOTS (1u << 16)
static struct {
    uintptr_t ptr;
    uint64_t weight;
} live_map[MAP_SLOTS];
static double est_allocated;
static uint64_t est_samples;

static size_t map_slot(uintptr_t p)
{
    size_t i = (size_t)((p >> 4) * UINT64_C(0x9e3779b97f4a7c15) >> 48);
    while (live_map[i].ptr != 0 && live_map[i].ptr != p)
        i = (i + 1) & (MAP_SLOTS - 1);
    return i;
}

static void map_remove(uintptr_t p)
{
    size_t i = map_slot(p);
    assert_int_equal(live_map[i].ptr, p); /* every free follows its alloc */
    live_map[i].ptr = 0;
    /* re-insert the rest of the cluster (linear probing deletion) */
    for (size_t j = (i + 1) & (MAP_SLOTS - 1); live_map[j].ptr; j = (j + 1) & (MAP_SLOTS - 1)) {
        uintptr_t q = live_map[j].ptr;
        uint64_t w = live_map[j].weight;
        live_map[j].ptr = 0;
        size_t k = map_slot(q);
        live_map[k].ptr = q;
        live_map[k].weight = w;
    }
}

static void profile_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_ALLOC) {
        size_t i = map_slot(ev->ptr);
        assert_int_equal(live_map[i].ptr, 0);
        live_map[i].ptr = ev->ptr;
        live_map[i].weight = ev->weight;
        est_allocated += (double)ev->weight;
        est_samples++;
    } else if (ev->kind == DD_PROBE_FREE) {
        map_remove(ev->ptr);
    }
}

static double block_variance(double size, double interval)
{
    double p = -expm1(-size / interval);
    return size * size * (1 - p) / p;
}

static void test_realloc_growth_unbiased(void **state)
{
    (void)state;
    const double interval = 4096;
    const int buffers = 1000;
    ra_reset();
    memset(live_map, 0, sizeof live_map);
    est_allocated = 0;
    est_samples = 0;
    ddheap_test_set_probe_hook(profile_hook, NULL);
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval((uint64_t)interval);
    ddheap_test_seed_thread(2024);

    static char *kept[1000];
    static size_t kept_size[1000];
    double true_allocated = 0, var_allocated = 0, true_live = 0, var_live = 0;
    for (int b = 0; b < buffers; b++) {
        size_t final = (size_t)16 << (b % 17); /* 16 B .. 1 MiB */
        char *p = NULL;
        for (size_t size = 16; size <= final; size *= 2) {
            p = w_realloc(p, size);
            assert_non_null(p);
            p[size - 1] = (char)size; /* touch the new end */
            true_allocated += (double)size;
            var_allocated += block_variance((double)size, interval);
        }
        if (b % 3 == 0) { /* freed */
            w_free(p);
        } else {
            kept[b] = p;
            kept_size[b] = final;
            true_live += (double)final;
            var_live += block_variance((double)final, interval);
        }
    }
    double est_live = 0;
    for (size_t i = 0; i < MAP_SLOTS; i++)
        if (live_map[i].ptr)
            est_live += (double)live_map[i].weight;

    print_message("allocated: estimate %.0f, truth %.0f, 5 sd %.0f\n", est_allocated,
                  true_allocated, 5 * sqrt(var_allocated));
    print_message("live:      estimate %.0f, truth %.0f, 5 sd %.0f\n", est_live, true_live,
                  5 * sqrt(var_live));
    /* each weight is rounded to a whole byte: at most 1/2 per sample */
    double rounding = 0.5 * (double)est_samples + 1;
    assert_true(fabs(est_allocated - true_allocated) <= 5 * sqrt(var_allocated) + rounding);
    assert_true(fabs(est_live - true_live) <= 5 * sqrt(var_live) + rounding);

    for (int b = 0; b < buffers; b++)
        if (kept[b])
            w_free_sized(kept[b], kept_size[b], 0);
    tracer_done();
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_all_combinations),
    cmocka_unit_test(test_failed_realloc_reports_old_block_again),
    cmocka_unit_test(test_realloc_null_allocates),
    cmocka_unit_test(test_realloc_to_zero_frees),
    cmocka_unit_test(test_realloc_of_aligned_blocks),
    cmocka_unit_test(test_signal_handler_inside_realloc_is_ordered),
    cmocka_unit_test(test_realloc_growth_unbiased))

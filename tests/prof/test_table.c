/*
 * ddheap-prof's table over time (tools/ddheap-prof/table.c), without BPF:
 * the peak is the state between the two events where the estimated live
 * bytes were highest, stacks touched after it keep their values at it;
 * a freed block's lifetime lands in its log2 bucket; the checkpoints give
 * a stack's live bytes at a fraction of the run and keep their spacing as
 * they are thinned; a process's exit takes its blocks, and only its, out
 * of the live heap.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "table.h"

static const uint64_t stack_a[] = {0x1000, 0x2000};
static const uint64_t stack_b[] = {0x3000};

static void alloc_at(struct dd_prof_table *t, const uint64_t *frames, uint32_t n, uint64_t ptr,
                     uint64_t weight, uint64_t ts)
{
    struct dd_prof_sample s = {.ptr = ptr, .size = weight, .weight = weight, .ts_ns = ts};
    assert_int_equal(dd_prof_table_alloc(t, &s, frames, n), 0);
}

static void free_at(struct dd_prof_table *t, uint64_t ptr, uint64_t ts)
{
    struct dd_prof_sample s = {.ptr = ptr, .ts_ns = ts};
    assert_int_equal(dd_prof_table_free_block(t, &s), 0);
}

static void alloc_by(struct dd_prof_table *t, uint32_t tgid, uint64_t ptr, uint64_t weight,
                     uint64_t ts)
{
    struct dd_prof_sample s = {
        .ptr = ptr, .size = weight, .weight = weight, .ts_ns = ts, .tgid = tgid};
    assert_int_equal(dd_prof_table_alloc(t, &s, stack_b, 1), 0);
}

/* Workers one after another, each holding many blocks when it exits, next
 * to a parent that lives on: the peak is one worker and the parent, never
 * the dead ones summed; after an exit not one of its blocks is left (the
 * removal runs through slots its own removals shift), the parent's all. */
static void exit_takes_its_process_out(void **state)
{
    (void)state;
    struct dd_prof_table t;
    dd_prof_table_init(&t);
    dd_prof_table_advance(&t, 1000);
    uint64_t ts = 1001;
    for (uint64_t i = 0; i < 100; i++)
        alloc_by(&t, 1, 0x100000 + 64 * i, 10, ts++);
    for (uint32_t worker = 2; worker < 12; worker++) {
        for (uint64_t i = 0; i < 3000; i++) /* the same addresses in each */
            alloc_by(&t, worker, 0x100000 + 64 * i, 1, ts++);
        assert_true(t.live_space == 1000 + 3000);
        assert_int_equal(dd_prof_table_process_exit(&t, worker, ts++), 3000);
        assert_int_equal(t.nlive, 100);
        assert_true(t.live_space == 1000);
    }
    assert_true(t.peak_space == 4000);
    assert_true(t.exited_space == 30000 && t.exited_blocks == 30000);
    /* Each worker's stack is its own: what it held at exit is there. */
    for (size_t i = 0; i < t.nstacks; i++) {
        const struct dd_prof_stack *st = &t.stacks[i];
        assert_true(st->tgid == 1 ? st->inuse_space == 1000 && st->exit_blocks == 0
                                  : st->inuse_space == 0 && st->exit_space == 3000);
    }
    /* A process with nothing live, or an exit read twice: nothing. */
    assert_int_equal(dd_prof_table_process_exit(&t, 5, ts++), 0);
    assert_int_equal(dd_prof_table_process_exit(&t, 99, ts++), 0);
    assert_int_equal(t.nlive, 100);
    dd_prof_table_free(&t);
}

static void peak_is_the_highest_state(void **state)
{
    (void)state;
    struct dd_prof_table t, v;
    dd_prof_table_init(&t);
    dd_prof_table_advance(&t, 1000);
    alloc_at(&t, stack_a, 2, 0xa, 100, 1001);
    alloc_at(&t, stack_b, 1, 0xb, 50, 1002); /* 150: the peak so far */
    free_at(&t, 0xa, 1003);                  /* 50 */
    alloc_at(&t, stack_b, 1, 0xc, 60, 1004); /* 110: below */
    assert_true(t.peak_space == 150 && t.peak_ts_ns == 1002);
    assert_int_equal(dd_prof_table_peak_view(&t, &v), 0);
    assert_true(v.stacks[0].inuse_space == 100 && v.stacks[1].inuse_space == 50);
    assert_true(v.stacks[1].alloc_space == 50 && v.stacks[0].life == NULL);
    free(v.stacks);
    /* Now only stack b changed after the peak; a new high takes both. */
    alloc_at(&t, stack_a, 2, 0xd, 200, 1005); /* 310 */
    assert_true(t.peak_space == 310 && t.peak_ts_ns == 1005);
    assert_int_equal(dd_prof_table_peak_view(&t, &v), 0);
    assert_true(v.stacks[0].inuse_space == 200 && v.stacks[1].inuse_space == 110);
    assert_true(v.stacks[0].alloc_space == 300 && v.stacks[1].alloc_space == 110);
    free(v.stacks);
    /* Every stack changed since the peak: the view is still the peak. */
    free_at(&t, 0xd, 1006);
    free_at(&t, 0xb, 1007);
    assert_int_equal(dd_prof_table_peak_view(&t, &v), 0);
    assert_true(v.stacks[0].inuse_space == 200 && v.stacks[1].inuse_space == 110);
    assert_true(t.stacks[0].inuse_space == 0 && t.stacks[1].inuse_space == 60);
    free(v.stacks);
    dd_prof_table_free(&t);
}

static void lifetimes_in_log2_buckets(void **state)
{
    (void)state;
    struct dd_prof_table t;
    dd_prof_table_init(&t);
    dd_prof_table_advance(&t, 1);
    alloc_at(&t, stack_a, 2, 0xa, 100, 10000);
    alloc_at(&t, stack_a, 2, 0xb, 100, 10000);
    free_at(&t, 0xa, 10000 + 3000);    /* [2048, 4096) */
    free_at(&t, 0xb, 10000 + 4096);    /* [4096, 8192) */
    free_at(&t, 0xe, 20000);           /* never seen: not a lifetime */
    const struct dd_prof_lifetimes *l = t.stacks[0].life;
    assert_non_null(l);
    assert_int_equal(l->count[11], 1);
    assert_int_equal(l->count[12], 1);
    assert_int_equal(l->freed, 2);
    assert_true(l->space[11] == 100);
    assert_int_equal(t.unmatched_frees, 1);
    assert_int_equal(dd_prof_life_bucket(0), 0);
    assert_int_equal(dd_prof_life_bucket(1), 0);
    assert_int_equal(dd_prof_life_bucket(2), 1);
    assert_int_equal(dd_prof_life_bucket(UINT64_MAX), 63);
    dd_prof_table_free(&t);
}

static void checkpoints_over_a_long_run(void **state)
{
    (void)state;
    const uint64_t s = 1000000000, start = 5 * s;
    struct dd_prof_table t;
    dd_prof_table_init(&t);
    dd_prof_table_advance(&t, start);
    /* One block of 10 bytes a second for 100 s: live = 10 x seconds. */
    for (uint64_t i = 1; i <= 100; i++)
        alloc_at(&t, stack_a, 2, i, 10, start + i * s - 1);
    dd_prof_table_advance(&t, start + 100 * s);
    assert_true(t.ncheckpoints <= DD_PROF_CHECKPOINTS);
    for (unsigned q = 1; q <= 3; q++) {
        double at = dd_prof_table_space_at(&t, 0, q / 4.0);
        /* Within one checkpoint spacing (at most a quarter of the run
         * here) of the truth at q/4. */
        double err = at - 250.0 * q;
        double step_bytes = 10.0 * (double)t.checkpoint_step_ns / (double)s;
        assert_true(err <= step_bytes && -err <= step_bytes);
    }
    assert_true(dd_prof_table_space_at(&t, 0, 1.0) == 1000);
    assert_true(dd_prof_table_space_at(&t, 0, 0.0) == 0);
    dd_prof_table_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(peak_is_the_highest_state),
        cmocka_unit_test(lifetimes_in_log2_buckets),
        cmocka_unit_test(checkpoints_over_a_long_run),
        cmocka_unit_test(exit_takes_its_process_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

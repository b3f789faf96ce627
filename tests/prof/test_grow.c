/*
 * ddheap-prof's growing arrays (tools/ddheap-prof/grow.c): appending one
 * at a time doubles the capacity from its first size, a larger need is met
 * at once, enough room changes nothing, and a failure (here a size that
 * would overflow) leaves the array, its contents and its capacity as they
 * were.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "grow.h"

static void appending_doubles(void **state)
{
    (void)state;
    uint64_t *v = NULL;
    size_t n = 0, cap = 0, first = 0, reallocs = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        size_t before = cap;
        assert_int_equal(dd_prof_grow(&v, &cap, n + 1, sizeof *v), 0);
        if (cap != before) {
            reallocs++;
            if (before == 0)
                first = cap;
            else
                assert_int_equal(cap, 2 * before);
        }
        assert_true(cap >= n + 1);
        v[n++] = i * 7;
    }
    for (size_t i = 0; i < n; i++)
        assert_int_equal(v[i], i * 7);
    assert_true(first > 0);
    /* first, 2 first, ... up to the first capacity of 1000 or more. */
    size_t expected = 1;
    for (size_t c = first; c < 1000; c *= 2)
        expected++;
    assert_int_equal(reallocs, expected);
    free(v);
}

static void a_larger_need_is_met_at_once(void **state)
{
    (void)state;
    char *v = NULL;
    size_t cap = 0;
    assert_int_equal(dd_prof_grow(&v, &cap, 5, 1), 0);
    size_t first = cap;
    assert_true(first >= 5);
    v[0] = 'x';
    size_t need = 10 * first + 3; /* more than twice the capacity */
    assert_int_equal(dd_prof_grow(&v, &cap, need, 1), 0);
    assert_int_equal(cap, need);
    assert_int_equal(v[0], 'x');
    v[need - 1] = 'y'; /* every element of the capacity is there */
    free(v);
}

static void enough_room_changes_nothing(void **state)
{
    (void)state;
    int *v = NULL;
    size_t cap = 0;
    assert_int_equal(dd_prof_grow(&v, &cap, 3, sizeof *v), 0);
    int *was = v;
    size_t cap_was = cap;
    assert_int_equal(dd_prof_grow(&v, &cap, cap_was, sizeof *v), 0);
    assert_int_equal(dd_prof_grow(&v, &cap, 0, sizeof *v), 0);
    assert_ptr_equal(v, was);
    assert_int_equal(cap, cap_was);
    free(v);
}

static void a_failure_leaves_the_array(void **state)
{
    (void)state;
    uint32_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(dd_prof_grow(&v, &cap, 4, sizeof *v), 0);
    for (uint32_t i = 0; i < 4; i++)
        v[i] = i + 100;
    uint32_t *was = v;
    size_t cap_was = cap;
    assert_int_equal(dd_prof_grow(&v, &cap, SIZE_MAX / sizeof *v + 1, sizeof *v), -1);
    assert_int_equal(dd_prof_grow(&v, &cap, SIZE_MAX, sizeof *v), -1);
    assert_ptr_equal(v, was);
    assert_int_equal(cap, cap_was);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(v[i], i + 100);
    free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(appending_doubles),
        cmocka_unit_test(a_larger_need_is_met_at_once),
        cmocka_unit_test(enough_room_changes_nothing),
        cmocka_unit_test(a_failure_leaves_the_array),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

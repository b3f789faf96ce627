/*
 * ddheap-prof's interpreter frames without BPF (cmocka): the merge of
 * interpreter frames into a native stack (tools/ddheap-prof/interp.c),
 * through a fake interpreter that implements interp.h, and CPython's line
 * tables (python/python.c) on tables written out by hand in the 3.10 and
 * 3.11+ formats, and the search for an eval loop's cold part from its
 * jumps, on cold_fixture (its path the first argument), whose symbol table
 * says where its function's cold part is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <unistd.h>

#include "interp.h"
#include "python/python.h"
#include "unwind.h"

/* The fake interpreter: its eval loop is [0x1000, 0x2000); a frame is
 * named "f<code>" at line = its offset. */
static bool fake_verify_ok = true;
static char fake_name[32];

static bool fake_verify(void *state, pid_t pid, char *why, size_t len)
{
    (void)state;
    (void)pid;
    snprintf(why, len, "the fake says no");
    return fake_verify_ok;
}

static bool fake_in_eval(const void *state, uint64_t addr)
{
    (void)state;
    return addr >= 0x1000 && addr < 0x2000;
}

static void fake_name_frame(void *state, pid_t pid, const struct dd_prof_interp_frame *f,
                            struct dd_prof_function_at *out)
{
    (void)state;
    (void)pid;
    snprintf(fake_name, sizeof fake_name, "f%llu", (unsigned long long)f->code);
    *out = (struct dd_prof_function_at){fake_name, "fake.py", (int)f->offset};
}

static void fake_free(void *state)
{
    (void)state;
}

static const struct dd_prof_interp fake = {
    .name = "fake",
    .verify = fake_verify,
    .in_eval_loop = fake_in_eval,
    .name_frame = fake_name_frame,
    .free = fake_free,
};

#define ENTRY DD_PROF_INTERP_ENTRY
#define TRUNC DD_PROF_TRUNCATED_FRAME

/* "name:line" of each merged frame, or "0x..." for a native one. */
static void describe(const uint64_t *out, uint32_t n, char *buf, size_t len)
{
    buf[0] = '\0';
    for (uint32_t i = 0; i < n; i++) {
        struct dd_prof_function_at at;
        char one[64];
        if (out[i] == TRUNC)
            snprintf(one, sizeof one, "[truncated]");
        else if (dd_prof_interp_frame_at(out[i], &at))
            snprintf(one, sizeof one, "%s:%d", at.function, at.line);
        else
            snprintf(one, sizeof one, "%#llx", (unsigned long long)out[i]);
        strncat(buf, i ? " " : "", len - strlen(buf) - 1);
        strncat(buf, one, len - strlen(buf) - 1);
    }
}

static void merge_and_check(const uint64_t *native, uint32_t n,
                            const struct dd_prof_interp_frame *frames, uint32_t nframes, bool cut,
                            const char *want)
{
    struct dd_prof_interp_proc *ip = dd_prof_interp_proc_new(&fake, NULL);
    assert_non_null(ip);
    uint64_t out[64];
    bool disable;
    uint32_t m = dd_prof_interp_merge(ip, 1, native, n, frames, nframes, cut, out, 64, &disable);
    char got[512];
    describe(out, m, got, sizeof got);
    assert_string_equal(got, want);
    assert_false(disable);
    dd_prof_interp_free(ip);
}

/* Each eval-loop frame takes the frames up to the next entry frame, put
 * before it (inner side); the probe site (index 0) is tested as it is,
 * return addresses by the call before them. */
static void test_groups_at_eval_frames(void **state)
{
    (void)state;
    const uint64_t native[] = {0x500, 0x1001, 0x600, 0x1800, 0x700};
    const struct dd_prof_interp_frame frames[] = {
        {1, 10, 1, 0, 0}, {2, 20, 1, 0, ENTRY}, {3, 30, 1, 0, 0}, {4, 40, 1, 0, ENTRY}};
    merge_and_check(native, 5, frames, 4, false,
                    "0x500 f1:10 f2:20 0x1001 0x600 f3:30 f4:40 0x1800 0x700");
}

/* 0x1000 as a return address is a call at 0xfff: not the eval loop. */
static void test_return_address_is_the_call(void **state)
{
    (void)state;
    const uint64_t native[] = {0x500, 0x1000, 0x1500, 0x700};
    const struct dd_prof_interp_frame frames[] = {{1, 10, 1, 0, ENTRY}};
    merge_and_check(native, 4, frames, 1, false, "0x500 0x1000 f1:10 0x1500 0x700");
}

/* Frames no eval-loop frame took: inside the outermost native frame, and
 * the stack marked. */
static void test_leftover_frames(void **state)
{
    (void)state;
    const uint64_t native[] = {0x500, 0x1001, 0x700};
    const struct dd_prof_interp_frame frames[] = {{1, 10, 1, 0, ENTRY}, {2, 20, 1, 0, ENTRY}};
    merge_and_check(native, 3, frames, 2, false, "0x500 f1:10 0x1001 f2:20 0x700 [truncated]");
}

/* A walk cut at its limit: the mark where frames are missing, the native
 * frames below as they were. */
static void test_cut_walk(void **state)
{
    (void)state;
    const uint64_t native[] = {0x500, 0x1001, 0x700};
    const struct dd_prof_interp_frame frames[] = {{1, 10, 1, 0, 0}, {2, 20, 1, 0, 0}};
    merge_and_check(native, 3, frames, 2, true, "0x500 f1:10 f2:20 [truncated] 0x1001 0x700");
}

/* An interpreter that fails its check: native frames only, and the
 * caller told to stop the walk. */
static void test_failed_check(void **state)
{
    (void)state;
    fake_verify_ok = false;
    struct dd_prof_interp_proc *ip = dd_prof_interp_proc_new(&fake, NULL);
    const uint64_t native[] = {0x500, 0x1001};
    const struct dd_prof_interp_frame frames[] = {{1, 10, 1, 0, ENTRY}};
    uint64_t out[8];
    bool disable;
    uint32_t m = dd_prof_interp_merge(ip, 1, native, 2, frames, 1, false, out, 8, &disable);
    assert_true(disable);
    assert_int_equal(m, 2);
    assert_int_equal(out[1], 0x1001);
    dd_prof_interp_free(ip);
    fake_verify_ok = true;
}

/* The same (function, file, line) is one address, whatever the process. */
static void test_one_address_per_name(void **state)
{
    (void)state;
    const uint64_t native[] = {0x500};
    const struct dd_prof_interp_frame frames[] = {{7, 3, 1, 0, ENTRY}};
    struct dd_prof_interp_proc *ip = dd_prof_interp_proc_new(&fake, NULL);
    uint64_t a[4], b[4];
    bool disable;
    assert_int_equal(dd_prof_interp_merge(ip, 1, native, 1, frames, 1, false, a, 4, &disable), 3);
    assert_int_equal(dd_prof_interp_merge(ip, 2, native, 1, frames, 1, false, b, 4, &disable), 3);
    assert_true(dd_prof_interp_is_frame(a[0]));
    assert_int_equal(a[0], b[0]);
    assert_false(dd_prof_interp_is_frame(native[0]));
    assert_false(dd_prof_interp_is_frame(TRUNC));
    dd_prof_interp_free(ip);
}

/* 3.10: (bytes, line delta) pairs; -128 is "no line". */
static void test_line_table_310(void **state)
{
    (void)state;
    const uint8_t t[] = {6, 1, 0, 5, 4, 2, 2, (uint8_t)-128, 2, 1};
    const uint32_t v = 0x030a0000;
    assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 0), 11);
    assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 5), 11);
    /* (An empty range only moves the line.) */
    assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 6), 18);
    assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 10), -1);
    assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 12), 19);
    assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 14), -1);
}

/* 3.11+: the location table, one entry of each kind. */
static void test_line_table_311(void **state)
{
    (void)state;
    const uint8_t t[] = {
        0x80 | 13 << 3 | 1, 0x04,                   /* no columns, 2 units, +2 */
        0x80 | 10 << 3 | 0, 0x05, 0x06,             /* one line, +0, 1 unit */
        0x80 | 11 << 3 | 1, 0x05, 0x06,             /* one line, +1, 2 units */
        0x80 | 15 << 3 | 0,                         /* no location, 1 unit */
        0x80 | 14 << 3 | 0, 0x07, 0x00, 0x01, 0x02, /* long form, -3 */
        0x80 | 0 << 3 | 0, 0x11,                    /* short form: same line */
        0x80 | 13 << 3 | 0, 0x50, 0x01,             /* +40: a two-byte varint */
    };
    for (uint32_t v = 0x030b0000; v <= 0x030d0000; v += 0x10000) {
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 0), 12);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 3), 12);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 4), 12);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 6), 13);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 9), 13);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 10), -1);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 12), 10);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 14), 10);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 16), 50);
        assert_int_equal(dd_prof_python_line(v, t, sizeof t, 10, 18), -1);
    }
}

/* The cold part found from the jumps is the one the symbol table names,
 * the same range to the byte. */
static const char *cold_fixture;

static void test_cold_part_from_jumps(void **state)
{
    (void)state;
    int fd = open(cold_fixture, O_RDONLY | O_CLOEXEC);
    assert_true(fd >= 0);
    const char *names[] = {"dd_cold_fixture_sum", "dd_cold_fixture_sum.cold"};
    struct dd_prof_elf_symbol sym[2], found = {0, 0};
    assert_true(dd_prof_elf_symbols(fd, names, 2, sym));
    assert_true(sym[0].value != 0 && sym[0].size != 0);
    /* (No cold part: the compiler did not split it, and the test proves
     * nothing: that is a failure too.) */
    assert_true(sym[1].value != 0 && sym[1].size != 0);
#if defined(__x86_64__)
    dd_prof_python_cold_part(fd, sym[0].value, sym[0].size, &found);
    assert_int_equal(found.value, sym[1].value);
    assert_int_equal(found.size, sym[1].size);
    /* Its cold part's own code is no function with a cold part. */
    found = (struct dd_prof_elf_symbol){0, 0};
    dd_prof_python_cold_part(fd, sym[1].value, sym[1].size, &found);
    assert_int_equal(found.value, 0);
#endif
    close(fd);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s COLD_FIXTURE\n", argv[0]);
        return 2;
    }
    cold_fixture = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groups_at_eval_frames),
        cmocka_unit_test(test_return_address_is_the_call),
        cmocka_unit_test(test_leftover_frames),
        cmocka_unit_test(test_cut_walk),
        cmocka_unit_test(test_failed_check),
        cmocka_unit_test(test_one_address_per_name),
        cmocka_unit_test(test_line_table_310),
        cmocka_unit_test(test_line_table_311),
        cmocka_unit_test(test_cold_part_from_jumps),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    dd_prof_interp_names_free();
    return rc;
}

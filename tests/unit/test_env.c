/*
 * env.c: the parsers behind DD_HEAP_SAMPLING_ENABLED and
 * DD_HEAP_SAMPLING_INTERVAL, and the values the process ends up with.
 * (Whole-process behaviour with bad values set before start-up is tested
 * in tests/robust/.)
 */
#include "internal.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdlib.h>
#include <cmocka.h>

#include "test_main.h"

static void test_enabled_words(void **state)
{
    (void)state;
    const char *on[] = {"1", "true", "TRUE", "Yes", "on", "ON"};
    const char *off[] = {"0", "false", "False", "no", "NO", "off"};
    const char *junk[] = {"", " 1", "2", "yess", "of", "-1", "truex", "enabled"};
    for (size_t i = 0; i < sizeof on / sizeof *on; i++)
        assert_int_equal(ddheap_parse_enabled(on[i]), 1);
    for (size_t i = 0; i < sizeof off / sizeof *off; i++)
        assert_int_equal(ddheap_parse_enabled(off[i]), 0);
    for (size_t i = 0; i < sizeof junk / sizeof *junk; i++)
        assert_int_equal(ddheap_parse_enabled(junk[i]), -1);
}

static void test_interval_numbers(void **state)
{
    (void)state;
    struct {
        const char *text;
        uint64_t value;
    } good[] = {{"1", 1},
                {"4096", 4096},
                {"512k", 512 * 1024},
                {"512K", 512 * 1024},
                {"3m", UINT64_C(3) << 20},
                {"2G", UINT64_C(2) << 30},
                {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        uint64_t v = 0;
        assert_true(ddheap_parse_interval(good[i].text, &v));
        assert_int_equal(v, good[i].value);
    }
    const char *bad[] = {"", "0", "-1", "-4096", " 4096", "4096 ", "12x", "k", "1kk",
                         "18446744073709551616", "99999999999999999999999", "17179869184g", "0x10",
                         "1.5m"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint64_t v = 77;
        if (ddheap_parse_interval(bad[i], &v))
            fail_msg("accepted interval \"%s\"", bad[i]);
        assert_int_equal(v, 77); /* untouched on failure */
    }
}

static void test_environment_read(void **state)
{
    (void)state;
    setenv("DD_HEAP_SAMPLING_INTERVAL", "64k", 1);
    setenv("DD_HEAP_SAMPLING_ENABLED", "off", 1);
    struct ddheap_config c = ddheap_read_environment();
    assert_false(c.enabled);
    assert_int_equal(c.interval, 65536);

    setenv("DD_HEAP_SAMPLING_INTERVAL", "-5", 1);
    setenv("DD_HEAP_SAMPLING_ENABLED", "maybe", 1);
    c = ddheap_read_environment(); /* complains on stderr, keeps defaults */
    assert_true(c.enabled);
    assert_int_equal(c.interval, DDHEAP_DEFAULT_INTERVAL);

    unsetenv("DD_HEAP_SAMPLING_INTERVAL");
    unsetenv("DD_HEAP_SAMPLING_ENABLED");
    c = ddheap_read_environment();
    assert_true(c.enabled);
    assert_int_equal(c.interval, DDHEAP_DEFAULT_INTERVAL);
}

/* The API overrides the environment; 0 restores the default. */
static void test_interval_api(void **state)
{
    (void)state;
    setenv("DD_HEAP_SAMPLING_INTERVAL", "8k", 1);
    ddheap_test_reload_config();
    assert_int_equal(dd_get_default_sampling_interval(), 8192);
    dd_set_default_sampling_interval(12345);
    assert_int_equal(dd_get_default_sampling_interval(), 12345);
    dd_set_default_sampling_interval(0);
    assert_int_equal(dd_get_default_sampling_interval(), DDHEAP_DEFAULT_INTERVAL);
    unsetenv("DD_HEAP_SAMPLING_INTERVAL");
    ddheap_test_reload_config();
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_enabled_words),
    cmocka_unit_test(test_interval_numbers),
    cmocka_unit_test(test_environment_read),
    cmocka_unit_test(test_interval_api))

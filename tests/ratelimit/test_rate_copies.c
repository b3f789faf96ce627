/*
 * One budget for every copy of ddheap in the process: the executable's
 * copy and a shared library's (tests/lib/ddheap_plugin.c, its own libddheap.a) share
 * ddheap_rate_v2, a GNU unique object. Checked both ways: a limit set
 * through either copy's API is the other's; samples taken through one
 * copy raise the interval the other copy's threads draw with; and each
 * copy still applies the raised mean to its own configured interval. A
 * third copy, dlopen'ed RTLD_LOCAL after start-up, joins the same budget.
 */
#include "internal.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test_main.h"

#include "ddheap_plugin.h"

static void test_one_limit(void **state)
{
    (void)state;
    dd_set_max_samples_per_second(1234);
    assert_int_equal(ddheap_plugin_limit(), 1234);
    ddheap_plugin_set_limit(4321);
    assert_int_equal(dd_get_max_samples_per_second(), 4321);
    ddheap_plugin_set_limit(0);
    assert_int_equal(dd_get_max_samples_per_second(), 0);
}

static void test_one_budget(void **state)
{
    (void)state;
    dd_set_default_sampling_interval(4096);
    ddheap_plugin_set_interval(8192);
    dd_set_max_samples_per_second(1000);
    assert_int_equal(dd_get_effective_sampling_interval(), 4096);
    assert_int_equal(ddheap_plugin_effective(), 8192);
    /* A burst through the plugin's copy only: 0.86 samples per 16 KiB
     * block at 8 KiB, about 3460, far beyond 1000 a second: the sample
     * that empties the bucket (1000, plus 1000 a second of running time,
     * so unless this takes over 2.4 s) raises the needed mean for the
     * whole process to what the last window (its quota: 25 samples)
     * measured. */
    uint64_t samples = ddheap_plugin_sample_burst(4000);
    uint64_t mine = dd_get_effective_sampling_interval();
    uint64_t theirs = ddheap_plugin_effective();
    print_message("%llu samples through the plugin; effective interval here %llu, there %llu\n",
                  (unsigned long long)samples, (unsigned long long)mine,
                  (unsigned long long)theirs);
    assert_true(samples >= 25);
    assert_true(mine > 8192);
    assert_int_equal(mine, theirs); /* the same needed mean, above both intervals */
    dd_set_max_samples_per_second(0);
    assert_int_equal(dd_get_effective_sampling_interval(), 4096);
    assert_int_equal(ddheap_plugin_effective(), 8192);
}

static void test_dlopened_copy(void **state)
{
    (void)state;
    void *h = dlopen(DDHEAP_TEST_SECOND_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL)
        fail_msg("dlopen: %s", dlerror());
    uint64_t (*limit)(void);
    uint64_t (*linked_limit)(void) = ddheap_plugin_limit;
    void (*set_limit)(uint64_t);
    *(void **)&limit = dlsym(h, "ddheap_plugin_limit"); /* POSIX's way round ISO C */
    *(void **)&set_limit = dlsym(h, "ddheap_plugin_set_limit");
    assert_non_null(limit);
    assert_non_null(set_limit);
    assert_memory_not_equal(&limit, &linked_limit, sizeof limit); /* really another copy */
    dd_set_max_samples_per_second(777);
    assert_int_equal(limit(), 777);
    set_limit(888);
    assert_int_equal(dd_get_max_samples_per_second(), 888);
    assert_int_equal(ddheap_plugin_limit(), 888);
    dd_set_max_samples_per_second(0);
    dlclose(h);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_one_limit),
    cmocka_unit_test(test_one_budget),
    cmocka_unit_test(test_dlopened_copy))

/*
 * sampling_math.c against libm (which the library itself may not call):
 * the exponential variate and 1 - e^-x must be accurate to ~1e-13 relative
 * over every input they are used with, or the weights would drift.
 */
#include "internal.h"

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "test_main.h"

static void assert_close(double got, double want, double rel, const char *what, double at)
{
    double err = fabs(got - want) / (fabs(want) > 1e-300 ? fabs(want) : 1.0);
    if (err > rel)
        fail_msg("%s(%.17g) = %.17g, libm says %.17g (relative error %.3g > %.3g)", what, at, got,
                 want, err, rel);
}

/* u = (top 53 bits + 1) / 2^53 covers (0, 1]; check -ln(u) at both ends,
 * at powers of two (exact exponents) and on a dense grid in between. */
static void test_exponential_matches_log(void **state)
{
    (void)state;
    uint64_t probes[] = {0, UINT64_MAX, UINT64_C(1) << 63, UINT64_C(1) << 11, 0x5555555555555555,
                         0xb504f333f9de6484 /* ~sqrt(1/2) * 2^64 */};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        double u = (double)((probes[i] >> 11) + 1) * 0x1.0p-53;
        assert_close(ddheap_exponential(probes[i]), -log(u), 1e-13, "exponential", u);
    }
    for (uint64_t k = 0; k < 200000; k++) {
        uint64_t bits = k * UINT64_C(0x9e3779b97f4a7c15);
        double u = (double)((bits >> 11) + 1) * 0x1.0p-53;
        double want = -log(u);
        double got = ddheap_exponential(bits);
        /* near u = 1 the value is ~0: compare absolutely there */
        if (want < 1e-3)
            assert_true(fabs(got - want) < 1e-16);
        else
            assert_close(got, want, 1e-13, "exponential", u);
    }
    assert_true(ddheap_exponential(UINT64_MAX) == 0.0); /* u = 1 exactly */
    assert_true(ddheap_exponential(0) > 36.7 && ddheap_exponential(0) < 36.8); /* u = 2^-53 */
}

static void test_one_minus_exp_neg_matches_expm1(void **state)
{
    (void)state;
    for (double x = 1e-12; x < 60; x *= 1.0137) {
        assert_close(ddheap_one_minus_exp_neg(x), -expm1(-x), 1e-13, "1-exp(-x)", x);
    }
    assert_true(ddheap_one_minus_exp_neg(0.0) == 0.0);
    assert_true(ddheap_one_minus_exp_neg(40.0) == 1.0);
    assert_true(ddheap_one_minus_exp_neg(1e6) == 1.0);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_exponential_matches_log),
    cmocka_unit_test(test_one_minus_exp_neg_matches_expm1))

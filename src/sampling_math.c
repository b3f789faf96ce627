/*
 * The two transcendental functions the sampler needs, without libm: the
 * cold path must not call a lazily bound symbol (docs/design.md, "The
 * cold path's manners"), and libm's
 * would be one. Both are accurate to a few ulp over the ranges used here,
 * far below the statistical noise of any profile.
 */
#include "internal.h"

#include <string.h>

#define LN2 0.69314718055994530942

static uint64_t double_bits(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static double bits_double(uint64_t b)
{
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* ln(u) for u in (0, 1]. u = m * 2^e with m in [sqrt(1/2), sqrt(2)), then
 * ln(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172: the odd series to s^15
 * leaves a truncation error below s^17/17 < 1e-14. */
static double log_unit(double u)
{
    uint64_t b = double_bits(u);
    int e = (int)((b >> 52) & 0x7ff) - 1023;
    double m = bits_double((b & UINT64_C(0x000fffffffffffff)) | UINT64_C(0x3ff0000000000000));
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e += 1;
    }
    double s = (m - 1.0) / (m + 1.0);
    double s2 = s * s;
    double series =
        1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 * (1.0 / 11 + s2 * (1.0 / 13 + s2 * (1.0 / 15)))))));
    return e * LN2 + 2.0 * s * series;
}

double ddheap_exponential(uint64_t random_bits)
{
    /* 53 random bits give u uniform on {1..2^53} / 2^53, i.e. (0, 1]:
     * never 0, so the logarithm is finite (at most 36.7). */
    double u = (double)((random_bits >> 11) + 1) * 0x1.0p-53;
    return -log_unit(u);
}

/* e^r - 1 for |r| <= ln2/2: its Taylor series to r^13 (the next term is
 * below 1e-17 relative), in Horner form with the 1/k! folded at compile
 * time. No constant term, so no cancellation for small r. */
static double expm1_reduced(double r)
{
    const double c2 = 1.0 / 2, c3 = c2 / 3, c4 = c3 / 4, c5 = c4 / 5, c6 = c5 / 6, c7 = c6 / 7;
    const double c8 = c7 / 8, c9 = c8 / 9, c10 = c9 / 10, c11 = c10 / 11, c12 = c11 / 12;
    const double c13 = c12 / 13;
    double tail =
        c8 + r * (c9 + r * (c10 + r * (c11 + r * (c12 + r * c13))));
    return r * (1.0 + r * (c2 + r * (c3 + r * (c4 + r * (c5 + r * (c6 + r * (c7 + r * tail)))))));
}

double ddheap_one_minus_exp_neg(double x)
{
    /* 1 - e^-x = -expm1(-x) for x >= 0. Past 40, e^-x < 5e-18: the result
     * rounds to 1 exactly. */
    if (x >= 40.0)
        return 1.0;
    /* -x = k ln2 + r with |r| <= ln2/2: e^-x - 1 = 2^k (expm1(r) + 1) - 1. */
    int k = (int)(-x / LN2 - 0.5);
    double r = -x - k * LN2;
    double em1 = expm1_reduced(r);
    if (k == 0)
        return -em1;
    double scale = bits_double((uint64_t)(k + 1023) << 52);
    return -(scale * em1 + (scale - 1.0));
}

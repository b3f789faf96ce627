/*
 * Every alignment is sampled (docs/alignment.md): page-and-larger aligned
 * blocks carry no header (user == raw) and are found through the
 * process-wide table; they are sampled at exactly the rate their size
 * predicts, freed correctly with plain and sized frees, and leave nothing
 * behind. Alignments that are not powers of two pass through unsampled.
 *
 * Rate bound: n blocks of S bytes at interval R give a Binomial(n, p)
 * number of samples, p = 1 - e^(-S/R); the test allows 5 sd,
 * 5 sqrt(n p (1-p)).
 */
#include "internal.h"
#include "mark.h"
#include "recording_alloc.h"
#include "test_main.h"

#include <math.h>

static void check_big_alignment(size_t alignment)
{
    const uint64_t interval = 16384;
    const size_t size = 4096;
    const int n = 1500;
    tracer_on(interval);
    ddheap_test_seed_thread(alignment);
    int samples = 0;
    for (int i = 0; i < n; i++) {
        dd_alloc_req_t req = dd_allocation_requested(size, alignment);
        void *raw = ra_alloc(req.size, req.alignment);
        char *user = dd_allocation_created(raw, req);
        assert_true((uintptr_t)user % alignment == 0);
        assert_int_equal(req.size, size); /* no header, no slack */
        if (req.weight) {
            samples++;
#if DDHEAP_MARK_TBI
            /* aarch64 TBI: the pointer tag is the whole mark, no table entry */
            assert_int_equal((uintptr_t)user, (uintptr_t)raw | ((uintptr_t)DDHEAP__TAG << 56));
#elif DDHEAP_MARK_SHADOW
            /* the shadow bit is the whole mark, the pointer is untouched */
            assert_ptr_equal(user, raw);
            assert_int_equal(ddheap_test_live_marked(), 1);
#else
            assert_ptr_equal(user, raw);
            assert_true(ddheap_shared_v3.table_live > 0);
#endif
        }
        memset(user, 0x11, size);
        dd_alloc_freed_t f = dd_allocation_freed(user, i % 2 ? size : 0, alignment);
        assert_ptr_equal(f.ptr, raw);
        assert_int_equal(f.size, i % 2 ? size : 0);
        ra_free(f.ptr, f.size);
    }
    double p = -expm1(-(double)size / (double)interval);
    double mean = n * p, sd = sqrt(n * p * (1 - p));
    print_message("alignment %zu: %d samples of %d blocks, expected %.1f +- %.1f\n", alignment,
                  samples, n, mean, sd);
    assert_true(fabs(samples - mean) <= 5 * sd);
    assert_int_equal(rec.allocs, samples);
    assert_int_equal(rec.frees, samples);
    assert_int_equal(ddheap_shared_v3.table_live, 0);
    tracer_done();
}

static void test_big_alignment(void **state)
{
    check_big_alignment(DDHEAP_CASE_VALUE(state));
}

/* Many page-aligned sampled blocks live at once, freed in another order:
 * the table keeps each one (windows overflow into the rest of the table). */
static void test_many_live_page_aligned_blocks(void **state)
{
    (void)state;
    tracer_on(1);
    enum { N = 3000 };
    static char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = w_alloc(64, 4096);
        assert_non_null(p[i]);
        p[i][0] = (char)i;
    }
    assert_int_equal(DDHEAP_MARK_TBI || DDHEAP_MARK_SHADOW ? ddheap_test_live_marked()
                                                          : ddheap_shared_v3.table_live,
                     N);
    for (int i = N - 1; i >= 0; i -= 2)
        w_free_sized(p[i], 64, 4096);
    for (int i = N - 2; i >= 0; i -= 2)
        w_free(p[i]);
    assert_int_equal(rec.allocs, N);
    assert_int_equal(rec.frees, N);
    assert_int_equal(ddheap_shared_v3.table_live, 0);
    assert_int_equal(ddheap_shared_v3.table_overflow, 0);
    tracer_done();
}

/* Not a power of two: passed through unsampled, the pointer untouched.
 * Above 1 GiB: likewise (no real allocator gives such blocks). */
static void test_invalid_alignments_pass_through(void **state)
{
    (void)state;
    tracer_on(1);
    size_t bad[] = {3, 24, 48, 100, 4097, 3u << 20, (size_t)1 << 31};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dd_alloc_req_t req = dd_allocation_requested(128, bad[i]);
        assert_int_equal(req.weight, 0);
        assert_int_equal(req.size, 128);
        assert_int_equal(req.alignment, bad[i]);
        char raw[160];
        assert_ptr_equal(dd_allocation_created(raw, req), raw);
        dd_alloc_freed_t f = dd_allocation_freed(raw, 128, bad[i]);
        assert_ptr_equal(f.ptr, raw);
        assert_int_equal(f.size, 128);
    }
    assert_int_equal(rec.n, 0);
    tracer_off();
}

/* Small alignments carry record and header, max(alignment, 32) bytes: the
 * per-block overhead docs/alignment.md states (none for tags and shadow
 * bits). */
static void test_small_alignment_overhead(void **state)
{
    (void)state;
    tracer_on(1);
    for (size_t a = 1; a < 4096; a *= 2) {
        dd_alloc_req_t req = dd_allocation_requested(100, a);
        size_t expected = DDHEAP_MARK_TBI || DDHEAP_MARK_SHADOW ? 0 : (a > 32 ? a : 32);
        assert_int_equal(req.size - req.user_size, expected);
        w_free(dd_allocation_created(ra_alloc(req.size, a), req));
    }
    tracer_done();
}

DDHEAP_TEST_MAIN(
    DDHEAP_CASE_WITH(test_big_alignment, "page alignment", 4096),
    DDHEAP_CASE_WITH(test_big_alignment, "64 KiB alignment", 65536),
    DDHEAP_CASE_WITH(test_big_alignment, "2 MiB alignment", UINT64_C(2) << 20),
    cmocka_unit_test(test_many_live_page_aligned_blocks),
    cmocka_unit_test(test_invalid_alignments_pass_through),
    cmocka_unit_test(test_small_alignment_overhead))

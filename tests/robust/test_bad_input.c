/*
 * Bad input at the allocation API: sizes that cannot be allocated or whose
 * enlarged (sampled) request would overflow, alignments that are 0, not a
 * power of two or huge, a real allocator that returns NULL on every path,
 * free(NULL), realloc(NULL, 0) and errno across every cold path.
 *
 * Each case runs with the tracer simulated and the interval at 1 byte
 * (every non-empty block sampled), the mode in which the most can go wrong.
 * The result every case must show is the same: no crash, the real
 * allocator gets back exactly what it handed out
 * (tests/lib/recording_alloc.h checks pointer and size), the probe stream stays balanced, no mark leaks
 * (ddheap_test_live_marked), and no request smaller than asked.
 * docs/reliability.md lists the documented result of each input.
 */
#include "recording_alloc.h"
#include "test_main.h"
#include "mark.h" /* DDHEAP_MARK_KEEPS_REPORT */

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#define ERRNO_SENTINEL 4242

static void fill(unsigned char *p, size_t n, unsigned char seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed + i * 31);
}

static void check(const unsigned char *p, size_t n, unsigned char seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed + i * 31))
            fail_msg("byte %zu of a block changed", i);
}

/* Size 0 is never sampled, whatever the interval: no probe, the real
 * allocator's own answer (malloc(0) gives a unique pointer) goes back out. */
static void test_size_zero(void **state)
{
    (void)state;
    const size_t aligns[] = {0, 16, 64, 4096, RA_MMAP_ALIGN};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        dd_alloc_req_t req = dd_allocation_requested(0, aligns[i]);
        assert_int_equal(req.weight, 0);
        assert_int_equal(req.size, 0);
        assert_int_equal(req.alignment, aligns[i]);
        void *raw = ra_alloc(req.size, req.alignment);
        assert_ptr_equal(dd_allocation_created(raw, req), raw);
        w_free_sized(raw, 0, aligns[i]);
    }
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 0);
    assert_int_equal(rec_count(DD_PROBE_FREE), 0);
}

/* SIZE_MAX and every size whose enlarged request would pass SIZE_MAX: the
 * request never wraps around to a small size (a small raw block under a
 * large user size would be a heap overflow). Such blocks pass through
 * unsampled with the size unchanged, the real allocator refuses them, and
 * nothing is reported. Sizes just below the limit are sampled, with the
 * exact extra bytes. */
static void test_size_overflow(void **state)
{
    (void)state;
    const size_t aligns[] = {0, 16, 32, 64, 2048, 4096, 1u << 21, 1u << 22};
    for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++) {
        for (size_t k = 0; k <= 2 * (aligns[a] > 16 ? 4096 : 16) + 1; k++) {
            size_t size = SIZE_MAX - k;
            dd_alloc_req_t req = dd_allocation_requested(size, aligns[a]);
            assert_true(req.size >= size);
            assert_int_equal(req.user_size, size);
            assert_int_equal(req.alignment, aligns[a]);
            /* A sampled request is enlarged by at most the alignment step. */
            if (req.weight == 0)
                assert_int_equal(req.size, size);
            errno = ERRNO_SENTINEL;
            void *raw = ra_alloc(req.size, req.alignment);
            assert_null(raw);
            int real_errno = errno;
            assert_null(dd_allocation_created(raw, req));
            assert_int_equal(errno, real_errno); /* the allocator's errno survives */
        }
    }
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 0);
}

/* Alignment 0 is the allocator's default; a sampled block keeps 16 bytes
 * of alignment and a sized free gets back the size the allocator saw. */
static void test_alignment_zero(void **state)
{
    (void)state;
    for (size_t size = 1; size < 300; size += 37) {
        unsigned char *p = w_alloc(size, 0);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        fill(p, size, (unsigned char)size);
        check(p, size, (unsigned char)size);
        w_free_sized(p, size, 0);
    }
    assert_int_equal(rec_count(DD_PROBE_ALLOC), rec_count(DD_PROBE_FREE));
    assert_true(rec_count(DD_PROBE_ALLOC) > 0);
}

/* Not a power of two: never sampled, passed through untouched (size and
 * alignment), so the real allocator decides (here, like posix_memalign:
 * EINVAL, which reaches the caller unchanged). */
static void test_alignment_not_power_of_two(void **state)
{
    (void)state;
    const size_t aligns[] = {3, 24, 48, 96, 100, 4097, 3u << 20, SIZE_MAX, SIZE_MAX / 2 + 1 + 1};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        dd_alloc_req_t req = dd_allocation_requested(64, aligns[i]);
        assert_int_equal(req.weight, 0);
        assert_int_equal(req.size, 64);
        assert_int_equal(req.alignment, aligns[i]);
        assert_ptr_equal(dd_allocation_created(NULL, req), NULL);
    }
    errno = 0;
    assert_null(w_alloc(64, 24));
    assert_int_equal(errno, EINVAL);
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 0);
}

/* Alignments above 2 MiB: up to 1 GiB they are sampled (user pointer =
 * raw pointer, recorded in the page table, no extra bytes); above that they
 * pass through unsampled. The block is aligned as asked and frees back to
 * the raw pointer with the exact size. */
static void test_alignment_huge(void **state)
{
    (void)state;
    const size_t sampled[] = {(size_t)1 << 21, (size_t)1 << 22, (size_t)1 << 26};
    for (size_t i = 0; i < sizeof sampled / sizeof *sampled; i++) {
        size_t size = 100 + i;
        size_t before = rec_count(DD_PROBE_ALLOC);
        unsigned char *p = w_alloc(size, sampled[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p & (sampled[i] - 1), 0);
        assert_int_equal(rec_count(DD_PROBE_ALLOC), before + 1);
        fill(p, size, 7);
        check(p, size, 7);
        w_free_sized(p, size, sampled[i]);
    }
    /* 1 GiB: sampled, with nothing added to the request. */
    dd_alloc_req_t req = dd_allocation_requested(100, (size_t)1 << 30);
    assert_true(req.weight != 0);
    assert_int_equal(req.size, 100);
    assert_null(dd_allocation_created(NULL, req));
    /* Above 1 GiB: unsampled, untouched. */
    for (int shift = 31; shift < 63; shift += 8) {
        req = dd_allocation_requested(100, (size_t)1 << shift);
        assert_int_equal(req.weight, 0);
        assert_int_equal(req.size, 100);
        assert_null(dd_allocation_created(NULL, req));
    }
}

/* The real allocator returns NULL: created() passes NULL through, reports
 * nothing and marks nothing; errno stays what the allocator set. */
static void test_real_alloc_fails(void **state)
{
    (void)state;
    const size_t aligns[] = {0, 32, 4096, 1u << 21};
    ra_set_fail(true);
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        errno = 0;
        assert_null(w_alloc(1000, aligns[i]));
        assert_int_equal(errno, ENOMEM);
    }
    errno = 0;
    assert_null(w_realloc(NULL, 1000)); /* realloc(NULL, n) is an allocation */
    assert_int_equal(errno, ENOMEM);
    ra_set_fail(false);
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 0);
}

/* A failed realloc leaves the old block exactly as it was: same bytes,
 * still marked if it was (its later free is reported once and returns the
 * right raw pointer and size), for every kind of old block and for a new
 * size too large to enlarge. A reported old block was reported freed by
 * prepare; it is reported allocated again as it was first, where the
 * marking scheme keeps that (docs/realloc.md); a pointer tag does not, and
 * its later free is then one without an alloc. */
static void expect_events(size_t from, const dd_probe_event_t *want, size_t n)
{
    pthread_mutex_lock(&rec.lock);
    size_t have = rec.n;
    pthread_mutex_unlock(&rec.lock);
    assert_int_equal(have, from + n);
    for (size_t i = 0; i < n; i++) {
        const dd_probe_event_t *e = &rec.ev[from + i];
        assert_int_equal(e->kind, want[i].kind);
        assert_int_equal(e->ptr, want[i].ptr);
        assert_int_equal(e->new_ptr, want[i].new_ptr);
        assert_int_equal(e->size, want[i].size);
        assert_int_equal(e->weight, want[i].weight);
    }
}

static void test_real_realloc_fails(void **state)
{
    (void)state;
    const size_t new_sizes[] = {2000, 10, SIZE_MAX - 8, SIZE_MAX};
    for (int sampled = 0; sampled < 2; sampled++) {
        for (size_t n = 0; n < sizeof new_sizes / sizeof *new_sizes; n++) {
            dd_set_default_sampling_interval(sampled ? 1 : UINT64_MAX);
            unsigned char *p = w_alloc(500, 0);
            assert_non_null(p);
            fill(p, 500, 3);
            uint64_t marked = ddheap_test_live_marked();
            dd_set_default_sampling_interval(1); /* the new block would be sampled */
            pthread_mutex_lock(&rec.lock);
            size_t before = rec.n;
            pthread_mutex_unlock(&rec.lock);
            ra_set_fail(true);
            errno = 0;
            assert_null(w_realloc(p, new_sizes[n]));
            assert_int_equal(errno, ENOMEM);
            ra_set_fail(false);
            /* shadow bits keep no report: the block is left unmarked */
            const bool dropped = sampled && DDHEAP_MARK_SHADOW;
            assert_int_equal(ddheap_test_live_marked(), marked - (dropped ? 1 : 0));
            check(p, 500, 3);
            uintptr_t u = (uintptr_t)p;
            const dd_probe_event_t kept[] = {{DD_PROBE_FREE, u, 0, 0, 0},
                                             {DD_PROBE_ALLOC, u, 0, 500, 500},
                                             {DD_PROBE_REALLOC, u, 0, new_sizes[n], 0}};
            const dd_probe_event_t not_kept[] = {{DD_PROBE_FREE, u, 0, 0, 0},
                                                 {DD_PROBE_REALLOC, u, 0, new_sizes[n], 0}};
            if (!sampled)
                expect_events(before, NULL, 0);
            else if (DDHEAP_MARK_KEEPS_REPORT)
                expect_events(before, kept, 3);
            else
                expect_events(before, not_kept, 2);
            size_t frees = rec_count(DD_PROBE_FREE);
            w_free_sized(p, 500, 0);
            assert_int_equal(rec_count(DD_PROBE_FREE), frees + (size_t)(sampled && !dropped));
            if (sampled && !DDHEAP_MARK_KEEPS_REPORT && !dropped)
                rec_start(); /* this block's events are the documented exception */
        }
    }
}

/* free(NULL) and sized free of NULL: no-ops, also while marked blocks live
 * (the header is never read at address -16, the page table is not asked). */
static void test_free_null(void **state)
{
    (void)state;
    dd_alloc_freed_t f = dd_allocation_freed(NULL, 0, 0);
    assert_null(f.ptr);
    assert_int_equal(f.size, 0);
    void *small = w_alloc(64, 0);        /* a header-marked block */
    void *page = w_alloc(64, 4096);      /* a table-marked block */
    assert_true(ddheap_test_live_marked() >= robust_marked_before + 2);
    f = dd_allocation_freed(NULL, 0, 0);
    assert_null(f.ptr);
    assert_int_equal(f.size, 0);
    f = dd_allocation_freed(NULL, 64, 4096);
    assert_null(f.ptr);
    assert_int_equal(f.size, 64);
    w_free(small);
    w_free(page);
    assert_int_equal(rec_count(DD_PROBE_FREE), 2);
}

/* realloc(NULL, 0) is malloc(0): never sampled; whatever the real realloc
 * returns (glibc: a unique minimum block) goes out and frees normally.
 * realloc(p, 0) of a sampled block frees it, reported once. */
static void test_realloc_null_zero(void **state)
{
    (void)state;
    void *p = w_realloc(NULL, 0);
    assert_non_null(p); /* the recording allocator's realloc(NULL, 0) is malloc(0) */
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 0);
    w_free(p);

    p = w_alloc(64, 0);
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 1);
    assert_null(w_realloc(p, 0));
    assert_int_equal(rec_count(DD_PROBE_FREE), 1);
    assert_int_equal(ddheap_test_live_marked(), robust_marked_before);
}

/* errno is the caller's: every cold path (sampling, marking, unmarking,
 * both realloc halves, configuration calls) leaves it as it was. */
static void test_errno_preserved(void **state)
{
    (void)state;
#define KEEPS_ERRNO(call)                                                                          \
    do {                                                                                           \
        errno = ERRNO_SENTINEL;                                                                    \
        call;                                                                                      \
        if (errno != ERRNO_SENTINEL)                                                               \
            fail_msg("%s changed errno to %d", #call, errno);                                     \
    } while (0)
    dd_alloc_req_t req;
    void *raw, *p, *q, *r;
    KEEPS_ERRNO(req = dd_allocation_requested(100, 0));
    assert_true(req.weight != 0);
    raw = ra_alloc(req.size, req.alignment);
    KEEPS_ERRNO(p = dd_allocation_created(raw, req));
    KEEPS_ERRNO(req = dd_allocation_requested(100, 8192));
    raw = ra_alloc(req.size, req.alignment);
    KEEPS_ERRNO(q = dd_allocation_created(raw, req));
    KEEPS_ERRNO(dd_allocation_created(NULL, dd_allocation_requested(5, 0)));

    dd_realloc_prep_t prep;
    KEEPS_ERRNO(prep = dd_allocation_realloc_prepare(p, 5000));
    raw = ra_realloc(prep.raw_ptr, prep.raw_size);
    KEEPS_ERRNO(p = dd_allocation_realloc_commit(p, raw, prep));
    KEEPS_ERRNO(prep = dd_allocation_realloc_prepare(NULL, 64));
    raw = ra_realloc(prep.raw_ptr, prep.raw_size);
    KEEPS_ERRNO(r = dd_allocation_realloc_commit(NULL, raw, prep));

    dd_alloc_freed_t f;
    KEEPS_ERRNO(f = dd_allocation_freed(p, 0, 0));
    ra_free(f.ptr, 0);
    KEEPS_ERRNO(f = dd_allocation_freed(q, 100, 8192));
    ra_free(f.ptr, f.size);
    KEEPS_ERRNO(prep = dd_allocation_realloc_prepare(r, 0));
    raw = ra_realloc(prep.raw_ptr, prep.raw_size);
    KEEPS_ERRNO(dd_allocation_realloc_commit(r, raw, prep));

    KEEPS_ERRNO(dd_set_default_sampling_interval(4096));
    KEEPS_ERRNO(dd_get_default_sampling_interval());
    KEEPS_ERRNO(dd_heap_simulate_tracer(true));
    KEEPS_ERRNO(dd_heap_simulate_tracer(false));
    KEEPS_ERRNO(dd_heap_profiler_attached());
    KEEPS_ERRNO(ddheap_test_seed_thread(1));
    dd_set_default_sampling_interval(1);
#undef KEEPS_ERRNO
}

DDHEAP_TEST_MAIN(
    ROBUST_CASE(test_size_zero),
    ROBUST_CASE(test_size_overflow),
    ROBUST_CASE(test_alignment_zero),
    ROBUST_CASE(test_alignment_not_power_of_two),
    ROBUST_CASE(test_alignment_huge),
    ROBUST_CASE(test_real_alloc_fails),
    ROBUST_CASE(test_real_realloc_fails),
    ROBUST_CASE(test_free_null),
    ROBUST_CASE(test_realloc_null_zero),
    ROBUST_CASE(test_errno_preserved))

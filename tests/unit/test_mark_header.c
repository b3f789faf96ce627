/*
 * mark_header.c (and mark_table.c behind it): the 16-byte keyed header.
 *
 * For every alignment 1..2048 (powers of two) and every raw address offset
 * within a page that the alignment allows: the user pointer is aligned, a
 * header-marked user pointer never lies in the first 16 bytes of a page
 * (those few blocks are recorded in the table instead, and no header is
 * read there), the raw pointer comes back exactly, a sized free gets the
 * allocated size back, and the header is zeroed when the block is freed.
 * Then: forged and copied headers before unsampled blocks are refused.
 */
#include "internal.h"
#include "mark.h"
#include "recording_alloc.h"
#include "test_main.h"

#include <stdio.h>

#if DDHEAP_MARK_TBI
#error "header scheme only (tests/unit/meson.build builds this file without TBI)"
#endif

static bool header_is_zero(const void *user)
{
    static const unsigned char zero[DDHEAP__HEADER];
    return memcmp((const char *)user - DDHEAP__HEADER, zero, DDHEAP__HEADER) == 0;
}

static void check_one(size_t alignment, size_t raw_offset, bool sized, size_t *in_table)
{
    const size_t size = 40;
    ra.page_offset = raw_offset + 1;
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    assert_true(req.weight > 0);
    void *raw = ra_alloc(req.size, req.alignment);
    assert_int_equal((uintptr_t)raw & 4095, raw_offset);
    char *user = dd_allocation_created(raw, req);
    uintptr_t u = (uintptr_t)user;

    assert_true(u % alignment == 0);
    assert_true(user >= (char *)raw + DDHEAP__HEADER || alignment >= DDHEAP__PAGE);
    assert_true(user + size <= (char *)raw + req.size); /* stays inside the raw block */
    memset(user, 0x5a, size);
    if ((u & 4095) < DDHEAP__HEADER) {
        (*in_table)++; /* page rule: no header here, the table knows it */
        assert_true(ddheap_shared_v3.table_live > 0);
    } else {
        assert_false(header_is_zero(user));
    }

    dd_alloc_freed_t f = dd_allocation_freed(user, sized ? size : 0, sized ? alignment : 0);
    assert_ptr_equal(f.ptr, raw);
    assert_int_equal(f.size, sized ? req.size : 0);
    if ((u & 4095) >= DDHEAP__HEADER)
        assert_true(header_is_zero(user)); /* zeroed before the real free */
    ra_free(f.ptr, f.size);
}

static void test_header_invariants_every_alignment_and_offset(void **state)
{
    (void)state;
    tracer_on(1);
    size_t cases = 0, in_table = 0;
    for (size_t alignment = 1; alignment <= 2048; alignment *= 2) {
        /* every offset within a page that a block of this alignment can have */
        for (size_t off = 0; off < 4096; off += alignment) {
            check_one(alignment, off, (off / alignment) % 2 == 1, &in_table);
            cases++;
        }
    }
    print_message("%zu placements checked, %zu landed on a page start (table)\n", cases, in_table);
    assert_true(in_table > 0); /* the page-start case was really exercised */
    assert_int_equal(rec.allocs, cases);
    assert_int_equal(rec.frees, cases);
    assert_int_equal(ra.live, 0);
    assert_int_equal(ddheap_test_live_marked(), 0);
    assert_int_equal(ddheap_shared_v3.table_live, 0);
    tracer_off();
}

/* A sampled block A (to make the free path read headers) and an unsampled
 * block B whose preceding 16 bytes an attacker controls. */
struct forge_setup {
    char *sampled;
    char *arena;  /* unsampled raw block standing in for a slab */
    char *victim; /* unsampled "object" 64 bytes into the arena */
};

static void forge_begin(struct forge_setup *s)
{
    tracer_on(1);
    s->sampled = w_malloc(100);
    assert_true(ddheap_test_live_marked() > 0);
    dd_heap_simulate_tracer(false);
    s->arena = w_malloc(4096);
    assert_true(((uintptr_t)s->arena & 4095) < 4096 - 200);
    s->victim = s->arena + 64;
}

static void expect_refused(struct forge_setup *s, const char *what)
{
    dd_alloc_freed_t f = dd_allocation_freed(s->victim, 48, 0);
    if (f.ptr != s->victim || f.size != 48)
        fail_msg("forged header accepted (%s)", what);
    assert_int_equal(rec.frees, 0);
}

static void forge_end(struct forge_setup *s)
{
    w_free(s->arena);
    w_free(s->sampled);
    assert_int_equal(ra.live, 0);
    tracer_off();
}

static void test_copied_header_refused(void **state)
{
    (void)state;
    struct forge_setup s;
    forge_begin(&s);
    memcpy(s.victim - DDHEAP__HEADER, s.sampled - DDHEAP__HEADER, DDHEAP__HEADER);
    expect_refused(&s, "exact copy of a live header");
    forge_end(&s);
}

static void test_forged_headers_refused(void **state)
{
    (void)state;
    struct forge_setup s;
    forge_begin(&s);
    uint64_t meta_good = 1 | 1 << 8 | 1 << 16; /* offset 16, extra 16, reported; no tag */
    uint64_t forged[][2] = {
        {0, 0},
        {0, meta_good},
        {UINT64_MAX, meta_good},
        {(uintptr_t)s.victim, meta_good},
        {(uintptr_t)s.victim ^ meta_good, meta_good},
        {0x6464686561700000, 16},
        /* the check a fixed-magic scheme would use */
        {UINT64_C(0xdeadbeefdeadbeef), 16},
    };
    for (size_t i = 0; i < sizeof forged / sizeof *forged; i++) {
        memcpy(s.victim - DDHEAP__HEADER, forged[i], DDHEAP__HEADER);
        expect_refused(&s, "fixed pattern");
    }
    /* Random bytes: 2^64 check words, 100k tries. */
    uint64_t x = 88172645463325252u;
    for (int i = 0; i < 100000; i++) {
        uint64_t h[2];
        for (int k = 0; k < 2; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            h[k] = x;
        }
        memcpy(s.victim - DDHEAP__HEADER, h, sizeof h);
        expect_refused(&s, "random bytes");
    }
    /* The filter word is no secret to whoever saw one header: key_filter is
     * its XOR with the address. Such a forger passes the inline test with
     * the right filter word for the victim, and must still be refused by the
     * tag: copied from the real header, with or without adjusted fields. */
    uint64_t real[2];
    memcpy(real, s.sampled - DDHEAP__HEADER, sizeof real);
    uint64_t key_filter = real[0] ^ (uintptr_t)s.sampled;
    uint64_t filter = (uintptr_t)s.victim ^ key_filter;
    uint64_t distance = (uintptr_t)s.victim ^ (uintptr_t)s.sampled;
    uint64_t with_filter[][2] = {
        {filter, real[1]},
        {filter, real[1] ^ distance},
        {filter, real[1] ^ (distance << 17)},
        {filter, real[1] ^ (distance >> 4)},
        {filter, meta_good},
        {filter, real[1] + 16}, /* same tag, fields one step off */
    };
    for (size_t i = 0; i < sizeof with_filter / sizeof *with_filter; i++) {
        memcpy(s.victim - DDHEAP__HEADER, with_filter[i], DDHEAP__HEADER);
        assert_true(ddheap__header_filter_matches((uintptr_t)s.victim)); /* reaches the cold path */
        expect_refused(&s, "right filter word, forged tag");
    }
    /* And 100k random tags behind the right filter word. */
    for (int i = 0; i < 100000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t h[2] = {filter, (x & ~UINT64_C(0x1ffff)) | (real[1] & 0x1ffff)};
        memcpy(s.victim - DDHEAP__HEADER, h, sizeof h);
        expect_refused(&s, "random tag");
    }
    /* The genuine words for the victim's address pass the filter (so the
     * refusals above were the tag's doing, not the filter's). */
    uint64_t genuine[2];
    assert_true(ddheap_header_words((uintptr_t)s.victim, 32, 32, true, genuine));
    assert_int_equal(genuine[0], filter);
    forge_end(&s);
}

/* A real header whose meta was tampered with fails the keyed check. */
static void test_tampered_meta_refused(void **state)
{
    (void)state;
    tracer_on(1);
    char *p = w_malloc(100);
    uint64_t meta;
    memcpy(&meta, p - 8, sizeof meta);
    uint64_t evil = meta + 1; /* offset one step (16 bytes) larger: the real free would get raw - 16 */
    memcpy(p - 8, &evil, sizeof evil);
    dd_alloc_freed_t f = dd_allocation_freed(p, 0, 0);
    assert_ptr_equal(f.ptr, p); /* refused: treated as unsampled */
    memcpy(p - 8, &meta, sizeof meta);
    w_free(p);
    tracer_done();
}

/* The stale header of a freed sampled block does not come back to life when
 * the same address is reused by an unsampled block. */
static void test_freed_header_stays_dead(void **state)
{
    (void)state;
    tracer_on(1);
    char *keep = w_malloc(10); /* keeps live_marked > 0 so frees read headers */
    char *storage = malloc(256);
    char *raw = storage + 32;
    dd_alloc_req_t req = dd_allocation_requested(50, 0);
    char *user = dd_allocation_created(raw, req);
    assert_ptr_equal(user, raw + 32); /* record and header */
    dd_alloc_freed_t f = dd_allocation_freed(user, 0, 0);
    assert_ptr_equal(f.ptr, raw);
    /* "reuse": an unsampled block handed out at `user` by some allocator */
    dd_alloc_freed_t g = dd_allocation_freed(user, 0, 0);
    assert_ptr_equal(g.ptr, user);
    free(storage);
    w_free(keep);
    tracer_off();
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_header_invariants_every_alignment_and_offset),
    cmocka_unit_test(test_copied_header_refused),
    cmocka_unit_test(test_forged_headers_refused),
    cmocka_unit_test(test_tampered_meta_refused),
    cmocka_unit_test(test_freed_header_stays_dead))

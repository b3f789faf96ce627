/*
 * Two marking schemes in one process: this program's copy of ddheap marks
 * with headers, the plugin's (tests/lib/ddheap_plugin.c) with shadow bits,
 * the way a header-marking program runs under the shadow-marking libc interposer.
 * Both share ddheap_shared_v3. Each scheme must count and look for its
 * own marks only: a header free never takes a shadow-marked block for one
 * of its own, the shadow live count does not open the header scheme's free
 * test (nor the reverse), and a header wrapper layered over the shadow
 * wrapper (the program's allocator calling an interposed malloc) unwraps
 * both marks in order.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "test_main.h"

#include "ddheap_plugin.h"

#if DDHEAP_MARK_SHADOW || DDHEAP_MARK_TBI
#error "test_mixed_schemes is for header-marking builds"
#endif

struct counts {
    size_t allocs, frees;
    uintptr_t last_alloc, last_free;
};
static struct counts exe, plugin;

static void count(struct counts *c, const dd_probe_event_t *ev)
{
    if (ev->kind == DD_PROBE_ALLOC) {
        c->allocs++;
        c->last_alloc = ev->ptr;
    } else if (ev->kind == DD_PROBE_FREE) {
        c->frees++;
        c->last_free = ev->ptr;
    }
}

static void exe_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    count(&exe, ev);
}

static void plugin_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    count(&plugin, ev);
}

/* This program's wrapper, over libc or over the plugin's wrapper. */
static void *exe_malloc(size_t size, bool over_plugin)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    void *raw = over_plugin ? ddheap_plugin_malloc(req.size) : malloc(req.size);
    return dd_allocation_created(raw, req);
}

static void exe_free(void *ptr, bool over_plugin)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    if (over_plugin)
        ddheap_plugin_free(f.ptr);
    else
        free(f.ptr);
}

static void trace_both(bool on)
{
    dd_heap_simulate_tracer(on);
    dd_set_default_sampling_interval(on ? 1 : 0);
    ddheap_test_set_probe_hook(on ? exe_hook : NULL, NULL);
    ddheap_plugin_trace(on, on ? plugin_hook : NULL);
}

static void test_each_scheme_counts_its_own(void **state)
{
    (void)state;
    trace_both(true);
    char *a = exe_malloc(64, false);   /* header-marked */
    char *b = ddheap_plugin_malloc(64); /* shadow-marked */
    a[0] = b[0] = 1;
    assert_int_equal(exe.allocs, 1);
    assert_int_equal(plugin.allocs, 1);
    assert_int_equal(ddheap_test_live_marked(), 1); /* live_marked: headers only */
    assert_int_equal(ddheap_plugin_live(), 1);      /* shadow_live: bits only */

    /* The header copy looks at b, finds no header of its own and hands
     * back b unchanged: freeing it through this wrapper (both wrap libc)
     * is what an unhooked free is to the shadow copy. */
    dd_alloc_freed_t f = dd_allocation_freed(b, 0, 0);
    assert_ptr_equal(f.ptr, b);
    assert_int_equal(exe.frees, 0);

    exe_free(a, false);
    assert_int_equal(exe.frees, 1);
    assert_int_equal(exe.last_free, (uintptr_t)a);
    assert_int_equal(ddheap_test_live_marked(), 0);
    assert_int_equal(ddheap_plugin_live(), 1);
    ddheap_plugin_free(b);
    assert_int_equal(plugin.frees, 1);
    assert_int_equal(plugin.last_free, (uintptr_t)b);
    assert_int_equal(ddheap_plugin_live(), 0);
    trace_both(false);
}

static void test_header_wrapper_over_shadow_wrapper(void **state)
{
    (void)state;
    exe = (struct counts){0};
    plugin = (struct counts){0};
    trace_both(true);
    enum { N = 200 };
    char *p[N];
    /* How far a header-marked user pointer sits into its raw block at the
     * default alignment: what the header scheme adds to every request. */
    dd_alloc_req_t probe = dd_allocation_requested(8, 0);
    const uintptr_t header_step = probe.size - probe.user_size; /* nothing allocated */
    assert_true(header_step >= 16);
    for (int i = 0; i < N; i++) {
        p[i] = exe_malloc(48 + (size_t)i, true);
        p[i][0] = (char)i;
        /* the plugin sampled the raw block the header scheme then marked */
        assert_int_equal(plugin.last_alloc + header_step, (uintptr_t)p[i]);
        assert_int_equal(exe.last_alloc, (uintptr_t)p[i]);
    }
    assert_int_equal(ddheap_test_live_marked(), N);
    assert_int_equal(ddheap_plugin_live(), N);
    for (int i = N - 1; i >= 0; i--) {
        exe_free(p[i], true); /* header first, then the shadow bit of raw */
        assert_int_equal(exe.last_free, (uintptr_t)p[i]);
        assert_int_equal(plugin.last_free + header_step, (uintptr_t)p[i]);
    }
    assert_int_equal(exe.allocs, N);
    assert_int_equal(exe.frees, N);
    assert_int_equal(plugin.allocs, N);
    assert_int_equal(plugin.frees, N);
    assert_int_equal(ddheap_test_live_marked(), 0);
    assert_int_equal(ddheap_plugin_live(), 0);
    trace_both(false);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_each_scheme_counts_its_own),
    cmocka_unit_test(test_header_wrapper_over_shadow_wrapper))

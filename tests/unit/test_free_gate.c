/*
 * Free gates (ddheap/coldpath.h, src/shared.c): a copy of ddheap in a
 * shared library tests its own gate byte first on every free, so that an
 * untraced process pays one compare and branch there too. Everything rests
 * on one promise: no block is handed out marked while any registered
 * copy's gate is closed. One process, in order:
 *
 *  1. nothing marked yet: every gate closed, no keys derived;
 *  2. a plugin loaded and unloaded before the first mark (its slot must be
 *     cleared, or opening the gates would write into unmapped memory);
 *  3. the first mark, in the executable's copy: the linked plugin's gate
 *     is open before the block is handed out, and the plugin's free
 *     recognises the block (the real free gets the raw pointer back);
 *  4. a plugin loaded after that starts open, and recognises blocks too;
 *  5. a child forked while a slot was claimed (an opener in another thread,
 *     simulated) finishes the write and drops the claim: otherwise its
 *     openers and that copy's destructor would wait for ever.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_main.h"

#include "ddheap_plugin.h"

static unsigned long frees_reported;

static void count_frees(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_FREE)
        frees_reported++;
}

static void *exe_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

static unsigned registered_slots(void)
{
    unsigned n = 0;
    for (unsigned i = 0; i < DDHEAP__FREE_GATES; i++)
        n += __atomic_load_n(&ddheap_shared_v3.free_gates[i], __ATOMIC_RELAXED) != 0;
    return n;
}

static void *load_second_plugin(uint8_t (**gate)(void), void (**release)(void *))
{
    void *h = dlopen(DDHEAP_TEST_SECOND_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    *(void **)gate = dlsym(h, "ddheap_plugin_gate");
    *(void **)release = dlsym(h, "ddheap_plugin_free");
    assert_non_null(*gate);
    assert_non_null(*release);
    return h;
}

static void test_gates_open_before_the_first_mark(void **state)
{
    (void)state;
    /* 1 */
    assert_int_equal(ddheap_shared_v3.free_gates_open, 0);
    assert_int_equal(ddheap_shared_v3.keys_ready, 0);
    assert_int_equal(ddheap_plugin_gate(), 0);
    assert_int_equal(ddheap__free_gate, 0);
    unsigned before = registered_slots();
    assert_true(before >= 2); /* this executable's copy and the linked plugin's */
    void *unsampled = exe_malloc(100);
    ddheap_plugin_free(unsampled); /* closed gate: straight to the real free */

    /* 2 */
    uint8_t (*second_gate)(void);
    void (*second_free)(void *);
    void *h = load_second_plugin(&second_gate, &second_free);
    assert_int_equal(registered_slots(), before + 1);
    assert_int_equal(second_gate(), 0);
    assert_int_equal(dlclose(h), 0);
    assert_int_equal(registered_slots(), before);

    /* 3 */
    ddheap_test_set_probe_hook(count_frees, NULL);
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    char *sampled[8];
    for (int i = 0; i < 8; i++) {
        sampled[i] = exe_malloc(64 + (size_t)i);
        assert_non_null(sampled[i]);
        sampled[i][0] = 'x';
    }
    assert_int_equal(ddheap_test_live_marked(), 8);
    assert_int_equal(ddheap_shared_v3.free_gates_open, 1);
    assert_int_equal(ddheap_plugin_gate(), 2);
    assert_int_equal(ddheap__free_gate, 2);
    for (int i = 0; i < 4; i++)
        ddheap_plugin_free(sampled[i]); /* a wrong pointer here would abort in free() */
    /* recognised and unmarked by the plugin's copy (whose probes fire,
     * with its own test hook unset: this copy's hook saw nothing) */
    assert_int_equal(ddheap_test_live_marked(), 4);
    assert_int_equal(frees_reported, 0);

    /* 4 */
    h = load_second_plugin(&second_gate, &second_free);
    assert_int_not_equal(second_gate(), 0);
    for (int i = 4; i < 8; i++)
        second_free(sampled[i]);
    assert_int_equal(ddheap_test_live_marked(), 0);
    /* and this copy still recognises its own */
    char *own = exe_malloc(32);
    dd_alloc_freed_t f = dd_allocation_freed(own, 0, 0);
    assert_ptr_equal(f.ptr, own - (DDHEAP_MARK_SHADOW ? 0 : 32)); /* record and header, or no change */
    assert_int_equal(ddheap_test_live_marked(), 0);
    free(f.ptr);
    assert_int_equal(frees_reported, 1);
    assert_int_equal(dlclose(h), 0);
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);

    /* 5: nothing is marked now, so the gate may be closed for the test */
    assert_int_equal(ddheap_test_live_marked(), 0);
    uintptr_t mine = (uintptr_t)&ddheap__free_gate;
    unsigned slot = DDHEAP__FREE_GATES;
    for (unsigned i = 0; i < DDHEAP__FREE_GATES; i++)
        if (ddheap_shared_v3.free_gates[i] == mine)
            slot = i;
    assert_true(slot < DDHEAP__FREE_GATES);
    __atomic_store_n(&ddheap__free_gate, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&ddheap_shared_v3.free_gates[slot], mine | 1, __ATOMIC_SEQ_CST);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0)
        _exit(ddheap_shared_v3.free_gates[slot] == mine && ddheap__free_gate == 2 ? 0 : 1);
    int status;
    assert_int_equal(waitpid(child, &status, 0), child);
    __atomic_store_n(&ddheap_shared_v3.free_gates[slot], mine, __ATOMIC_SEQ_CST);
    __atomic_store_n(&ddheap__free_gate, 2, __ATOMIC_SEQ_CST);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

DDHEAP_TEST_MAIN(
    cmocka_unit_test(test_gates_open_before_the_first_mark))

/*
 * dd_heap_interpose_libc() in a running process (src/interpose.c): the
 * executable, a library linked before start (lazily bound) and one
 * dlopen'ed after the rewrite all reach the hooks; libc's own internal
 * allocations (strdup) too; blocks allocated before the rewrite, or
 * sampled during it and freed after stop, are freed safely; stop puts
 * every entry back, also after an object was unloaded meanwhile.
 *
 * ddheap lives in a shared library (got_agent.c), as in an agent: the
 * object that holds ddheap is never rewritten, this executable is. It uses
 * only the API that library exports (never the inline hooks).
 *
 * Sampling at interval 1 with a simulated tracer: every allocation through
 * the wrappers is reported, exactly, and observed by the probe hook. In an
 * archive built with another marking scheme the call must refuse.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

void *dd_got_before_alloc(size_t size);
void dd_got_before_free(void *ptr);
int dd_got_agent_scheme_is_shadow(void);

struct counts {
    unsigned long allocs, frees, bytes;
    unsigned long of_size[8];
};
static struct counts seen;
static const uint64_t marker_sizes[8] = {1001, 1002, 6, 3003, 4004, 5005, 6006, 7007};

static void record(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_ALLOC) {
        seen.allocs++;
        seen.bytes += ev->size;
        for (int i = 0; i < 8; i++)
            seen.of_size[i] += ev->size == marker_sizes[i];
    } else if (ev->kind == DD_PROBE_FREE) {
        seen.frees++;
    }
}

static void reset(void)
{
    memset(&seen, 0, sizeof seen);
}

/* Every block escapes through here: at -O2 GCC removes a malloc (or
 * calloc, aligned_alloc) whose result is only freed, and the wrappers
 * would then have nothing to report. */
static void *volatile sink;

static void *kept(void *p)
{
    sink = p;
    return p;
}

typedef uint64_t work_fn(unsigned rounds);

static work_fn *load_plugin(void **handle)
{
    *handle = dlopen(DDHEAP_TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(*handle);
    void *sym = dlsym(*handle, "dd_interpose_plugin_work");
    assert_non_null(sym);
    work_fn *fn;
    memcpy(&fn, &sym, sizeof fn);
    return fn;
}

/* What dd_interpose_plugin_work(rounds) allocates (tests/interpose/plugin.c):
 * one array, `rounds` blocks, a realloc of every third; all freed. */
static unsigned long plugin_allocs(unsigned rounds)
{
    return 1 + rounds + (rounds + 2) / 3;
}

static void test_rewrite_and_restore(void **state)
{
    (void)state;
    dd_set_default_sampling_interval(1);
    dd_heap_simulate_tracer(true);
    ddheap_test_set_probe_hook(record, NULL);

    /* Before: nothing is hooked; these blocks were never seen. */
    reset();
    char *early_main = kept(malloc(1001));
    char *early_lib = dd_got_before_alloc(1002);
    assert_non_null(early_main);
    assert_non_null(early_lib);
    assert_int_equal(seen.allocs, 0);

    assert_int_equal(dd_heap_interpose_libc(), 0);

    reset();
    char *a = kept(malloc(1001));
    char *b = dd_got_before_alloc(1002);
    /* libc calls its malloc through its own GOT. Through a volatile
     * pointer: at -O2 GCC would otherwise turn strdup of a constant into
     * this program's own malloc and memcpy. */
    char *(*volatile libc_strdup)(const char *) = strdup;
    char *s = libc_strdup("hello");
    char *c = kept(calloc(3, 1001));
    void *d = NULL;
    assert_int_equal(posix_memalign(&d, 64, 4004), 0);
    void *e = kept(aligned_alloc(4096, 5005));
    void *f = kept(memalign(128, 6006));
    void *g = kept(valloc(7007));
    assert_true((uintptr_t)d % 64 == 0 && (uintptr_t)e % 4096 == 0 && (uintptr_t)f % 128 == 0);
    assert_true((uintptr_t)g % (uintptr_t)sysconf(_SC_PAGESIZE) == 0);
    assert_int_equal(seen.of_size[0], 1);
    assert_int_equal(seen.of_size[1], 1);
    assert_int_equal(seen.of_size[2], 1);
    assert_int_equal(seen.of_size[3], 1); /* calloc: one block of 3003 */
    assert_int_equal(seen.of_size[4], 1);
    assert_int_equal(seen.of_size[5], 1);
    assert_int_equal(seen.of_size[6], 1);
    assert_int_equal(seen.of_size[7], 1);
    assert_int_equal(seen.allocs, 8);
    a = kept(realloc(a, 20000)); /* a free and an alloc */
    assert_int_equal(seen.allocs, 9);
    assert_int_equal(seen.frees, 1);

    /* Blocks from before the rewrite go back to glibc untouched. */
    reset();
    free(early_main);
    dd_got_before_free(early_lib);
    assert_int_equal(seen.frees, 0);

    /* A library loaded after the rewrite is rewritten as it loads. */
    void *handle;
    work_fn *work = load_plugin(&handle);
    reset();
    work(300);
    assert_int_equal(seen.allocs, plugin_allocs(300));
    assert_int_equal(seen.frees, plugin_allocs(300));

    /* Again: nothing rewritten twice. */
    assert_int_equal(dd_heap_interpose_libc(), 0);
    reset();
    free(b);
    free(s);
    free(c);
    free(d);
    free(e);
    free(f);
    free(g);
    assert_int_equal(seen.frees, 7);

    /* Stop with a sampled block live: after it, nothing is reported and
     * that block is freed past the hooks (a stale mark, harmless). */
    assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    reset();
    free(a);
    char *after = kept(malloc(1001));
    dd_got_before_free(dd_got_before_alloc(1002));
    work(50);
    assert_int_equal(seen.allocs, 0);
    assert_int_equal(seen.frees, 0);
    free(after);
    dlclose(handle);

    ddheap_test_set_probe_hook(NULL, NULL);
    dd_heap_simulate_tracer(false);
}

/* Unloaded meanwhile: stop must skip an object that is gone (writing to
 * its old GOT would fault, or corrupt whatever is mapped there now), and
 * a library loaded again after stop is not hooked. */
static void test_unload_while_interposed(void **state)
{
    (void)state;
    dd_set_default_sampling_interval(1);
    dd_heap_simulate_tracer(true);
    ddheap_test_set_probe_hook(record, NULL);
    assert_int_equal(dd_heap_interpose_libc(), 0);
    void *handle;
    work_fn *work = load_plugin(&handle);
    reset();
    work(30);
    assert_int_equal(seen.allocs, plugin_allocs(30));
    assert_int_equal(dlclose(handle), 0);
    assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    work = load_plugin(&handle);
    reset();
    work(30);
    free(kept(malloc(1001)));
    assert_int_equal(seen.allocs, 0);
    dlclose(handle);
    ddheap_test_set_probe_hook(NULL, NULL);
    dd_heap_simulate_tracer(false);
}

/* A plugin over an allocator of its own, opened with RTLD_LAZY |
 * RTLD_DEEPBIND (deepbind_plugin.c, own_alloc_lib.c): its malloc slot is
 * bound to that allocator before the rewrite, its free slot still lazy.
 * Both must keep reaching the plugin's allocator: a lazy slot is rewritten
 * only where the object's own scope resolves the name to the function the
 * wrapper forwards to, and here it resolves to the plugin's free. */
typedef void *deep_alloc_fn(size_t size);
typedef void deep_free_fn(void *ptr);
typedef int owns_fn(const void *p);
typedef unsigned long frees_fn(void);

#define LOOKUP(var, handle, name)                 \
    do {                                          \
        void *sym_ = dlsym(handle, name);         \
        assert_non_null(sym_);                    \
        memcpy(&(var), &sym_, sizeof(var));       \
    } while (0)

static void test_deepbind_plugin_keeps_its_allocator(void **state)
{
    (void)state;
    if (RUNNING_ON_VALGRIND) {
        /* valgrind replaces every malloc in the process with its own, the
         * plugin's too: there is no allocator of the plugin's to keep. */
        print_message("valgrind replaces the plugin's malloc: nothing to check here\n");
        skip();
    }
    dd_set_default_sampling_interval(1);
    dd_heap_simulate_tracer(true);
    ddheap_test_set_probe_hook(record, NULL);
    void *handle = dlopen(DDHEAP_TEST_DEEPBIND, RTLD_LAZY | RTLD_LOCAL | RTLD_DEEPBIND);
    assert_non_null(handle);
    deep_alloc_fn *alloc;
    deep_free_fn *release;
    owns_fn *owns;
    frees_fn *frees;
    LOOKUP(alloc, handle, "dd_deepbind_alloc");
    LOOKUP(release, handle, "dd_deepbind_free");
    LOOKUP(owns, handle, "dd_own_alloc_owns");
    LOOKUP(frees, handle, "dd_own_alloc_frees");
    void *before = alloc(1001); /* binds the plugin's malloc slot */
    assert_true(owns(before));
    assert_int_equal(dd_heap_interpose_libc(), 0);
    reset();
    release(before); /* the lazy free slot, first call after the rewrite */
    assert_int_equal(frees(), 1);
    void *after = alloc(1002);
    assert_true(owns(after));
    release(after);
    assert_int_equal(frees(), 2);
    assert_int_equal(seen.allocs, 0); /* the plugin's allocator is not ddheap's to sample */
    assert_int_equal(seen.frees, 0);
    assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    dlclose(handle);
    ddheap_test_set_probe_hook(NULL, NULL);
    dd_heap_simulate_tracer(false);
}

/* dd_heap_interpose_libc(), again and again, and _stop(), while two
 * threads load and unload a library whose constructor dlopens through a
 * rewritten GOT (ctor_dlopen.c): that nested dlopen reaches the wrapper,
 * and its rescan, with the loader's lock held. Neither side may wait for
 * the other's lock while holding its own. A deadlock is caught by the
 * watchdog: the test then fails, it does not hang. */
enum { REWRITES = 300, MIN_LOADS = 50 };
static int rewrites_done;

static void watchdog(int sig)
{
    (void)sig;
    static const char line[] = "test_interpose_got: deadlock: dd_heap_interpose_libc and dlopen "
                               "did not finish within the watchdog's time\n";
    ssize_t ignored = write(STDERR_FILENO, line, sizeof line - 1);
    (void)ignored;
    _exit(1);
}

struct loader {
    const char *library; /* each thread its own copy, so dlclose unloads it */
    unsigned long loads;
};

static void *load_and_unload(void *arg)
{
    struct loader *l = arg;
    while (l->loads < MIN_LOADS || !__atomic_load_n(&rewrites_done, __ATOMIC_ACQUIRE)) {
        void *handle = dlopen(l->library, RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL)
            return NULL;
        dlclose(handle);
        l->loads++;
    }
    return NULL;
}

static void test_rewrite_while_others_dlopen(void **state)
{
    (void)state;
    signal(SIGALRM, watchdog);
    alarm(60); /* a hang guard: the loop takes well under a second */
    pthread_t threads[2];
    struct loader loaders[2] = {{DDHEAP_TEST_CTOR_DLOPEN_A, 0}, {DDHEAP_TEST_CTOR_DLOPEN_B, 0}};
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&threads[i], NULL, load_and_unload, &loaders[i]), 0);
    /* Mostly repeated calls while interposition is on (the case
     * docs/interpose.md recommends after loading by name): the loaders'
     * rescans are active then. A stop now and then restores and restarts. */
    for (int i = 0; i < REWRITES; i++) {
        assert_int_equal(dd_heap_interpose_libc(), 0);
        if (i % 50 == 49)
            assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    }
    assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    __atomic_store_n(&rewrites_done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    alarm(0);
    assert_true(loaders[0].loads >= MIN_LOADS && loaders[1].loads >= MIN_LOADS);
    print_message("loads while rewriting: %lu and %lu\n", loaders[0].loads, loaders[1].loads);
}

/* With another allocator in charge of malloc the call must change
 * nothing: libddheap_preload.so (meson runs this program with it and
 * --preloaded), or a sanitizer's runtime (the sanitizer stage). Valgrind
 * is not such a case: it redirects glibc's malloc and __libc_malloc alike,
 * so the wrappers and the program still share one heap, and the whole
 * test runs under it (the valgrind stage). */
static int preloaded_child(void)
{
    int rc = dd_heap_interpose_libc();
    return rc == EBUSY ? 0 : 1;
}

static bool malloc_replaced_by_a_tool(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    return true;
#endif
#endif
    return false;
}

static void test_refuses_foreign_malloc(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    ddheap_test_set_probe_hook(record, NULL);
    assert_int_equal(dd_heap_interpose_libc(), dd_got_agent_scheme_is_shadow() ? EBUSY : ENOTSUP);
    reset();
    free(kept(malloc(1001)));
    assert_int_equal(seen.allocs, 0);
    assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    ddheap_test_set_probe_hook(NULL, NULL);
    dd_heap_simulate_tracer(false);
}

static void test_refuses(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    ddheap_test_set_probe_hook(record, NULL);
    assert_int_equal(dd_heap_interpose_libc(), ENOTSUP);
    reset();
    free(kept(malloc(1001))); /* nothing was rewritten */
    assert_int_equal(seen.allocs, 0);
    assert_int_equal(dd_heap_interpose_libc_stop(), 0);
    ddheap_test_set_probe_hook(NULL, NULL);
    dd_heap_simulate_tracer(false);
}

/* --traced: the same story for a real tracer (test_interpose_traced.py
 * attaches bpftrace to the agent's probes): between two lines read on
 * stdin, the rewrite is turned on, blocks of 1001 bytes (executable) and
 * 1002 (the library linked before start) are allocated and freed with the
 * plugin loaded after the rewrite doing its work; then it is turned off,
 * and blocks of 1003 bytes from both, which no tracer may see, follow. */
static int wait_line(void)
{
    char line[64];
    return fgets(line, sizeof line, stdin) != NULL;
}

static int traced_run(void)
{
    enum { N = 100 };
    printf("got: pid %d\n", (int)getpid());
    fflush(stdout);
    if (!wait_line())
        return 1;
    char *early = kept(malloc(1003)); /* before the rewrite: never reported */
    int rc = dd_heap_interpose_libc();
    if (rc != 0) {
        printf("got: dd_heap_interpose_libc returned %d\n", rc);
        return 1;
    }
    char *mine[N], *theirs[N];
    for (int i = 0; i < N; i++) {
        mine[i] = kept(malloc(1001));
        theirs[i] = dd_got_before_alloc(1002);
    }
    void *handle = dlopen(DDHEAP_TEST_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    void *sym = handle != NULL ? dlsym(handle, "dd_interpose_plugin_work") : NULL;
    if (sym == NULL)
        return 1;
    work_fn *work;
    memcpy(&work, &sym, sizeof work);
    uint64_t h = work(200);
    for (int i = 0; i < N; i++) {
        free(mine[i]);
        dd_got_before_free(theirs[i]);
    }
    free(early);
    if (dd_heap_interpose_libc_stop() != 0)
        return 1;
    for (int i = 0; i < N; i++) {
        free(kept(malloc(1003)));
        dd_got_before_free(dd_got_before_alloc(1003));
    }
    h += work(50);
    dlclose(handle);
    printf("got: done plugin_allocs=%lu check=%llu\n", plugin_allocs(200), (unsigned long long)h);
    fflush(stdout);
    return wait_line() ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--preloaded") == 0)
        return preloaded_child();
    if (argc > 1 && strcmp(argv[1], "--traced") == 0)
        return traced_run();
    const struct CMUnitTest shadow[] = {
        cmocka_unit_test(test_rewrite_and_restore),
        cmocka_unit_test(test_unload_while_interposed),
        cmocka_unit_test(test_deepbind_plugin_keeps_its_allocator),
        cmocka_unit_test(test_rewrite_while_others_dlopen),
    };
    const struct CMUnitTest other[] = {
        cmocka_unit_test(test_refuses),
    };
    const struct CMUnitTest foreign[] = {
        cmocka_unit_test(test_refuses_foreign_malloc),
    };
    if (malloc_replaced_by_a_tool())
        return cmocka_run_group_tests(foreign, NULL, NULL);
    if (dd_got_agent_scheme_is_shadow())
        return cmocka_run_group_tests(shadow, NULL, NULL);
    return cmocka_run_group_tests(other, NULL, NULL);
}

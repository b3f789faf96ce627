/*
 * mark_tbi.c: aarch64 top-byte tagging (docs/arm64.md). Built and run only
 * in TBI builds (tests/tbi/meson.build); CI runs it under qemu-aarch64,
 * which enforces the tagged-address ABI like the kernel does (the control
 * test below shows a tagged buffer failing with EFAULT without it).
 *
 * The "real allocator" here is libc behind a registry of the raw blocks it
 * handed out, so every free and realloc can check it got back exactly one
 * of its own (untagged) pointers: glibc would abort on a tagged one, the
 * registry says which pointer was wrong. Threads never call cmocka asserts
 * (they would longjmp into the main thread's stack); they count what they
 * saw and the main thread asserts on the counts.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#define TAG_OF(p) ((uintptr_t)(p) >> 56)
#define UNTAGGED(p) ((void *)((uintptr_t)(p) & ((UINT64_C(1) << 56) - 1)))
#define OUR_TAG 0xddu

/* --- the real allocator: libc plus a registry of live raw blocks --- */

#define REGISTRY_MAX 4096

static struct {
    pthread_mutex_t lock;
    void *raw[REGISTRY_MAX];
    size_t size[REGISTRY_MAX];
    size_t live;
} registry = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Frees, reallocs and sized frees that handed the allocator something it
 * never returned (a tagged pointer, a wrong size): must stay 0. */
static atomic_ulong bad_calls;

static void registry_add(void *raw, size_t size)
{
    pthread_mutex_lock(&registry.lock);
    for (size_t i = 0; i < REGISTRY_MAX; i++) {
        if (registry.raw[i] == NULL) {
            registry.raw[i] = raw;
            registry.size[i] = size;
            registry.live++;
            pthread_mutex_unlock(&registry.lock);
            return;
        }
    }
    pthread_mutex_unlock(&registry.lock);
    abort(); /* a test keeps more than REGISTRY_MAX blocks: enlarge it */
}

/* Removes `raw` and gives the size it was asked for; false if the
 * allocator never handed it out. */
static bool registry_take(void *raw, size_t *size)
{
    bool found = false;
    pthread_mutex_lock(&registry.lock);
    for (size_t i = 0; i < REGISTRY_MAX && raw != NULL; i++) {
        if (registry.raw[i] == raw) {
            found = true;
            *size = registry.size[i];
            registry.raw[i] = NULL;
            registry.live--;
            break;
        }
    }
    pthread_mutex_unlock(&registry.lock);
    return found;
}

static size_t registry_live(void)
{
    pthread_mutex_lock(&registry.lock);
    size_t n = registry.live;
    pthread_mutex_unlock(&registry.lock);
    return n;
}

static void *raw_alloc(size_t alignment, size_t size)
{
    void *raw = NULL;
    if (alignment <= 16)
        raw = malloc(size);
    else if (posix_memalign(&raw, alignment, size) != 0)
        raw = NULL;
    if (raw)
        registry_add(raw, size);
    return raw;
}

/* `size` 0: an unsized free; otherwise it must be the size handed out. */
static void raw_free(void *raw, size_t size)
{
    size_t had;
    if (raw == NULL)
        return;
    if (!registry_take(raw, &had)) {
        atomic_fetch_add(&bad_calls, 1);
        return; /* not ours: handing it to glibc would abort the test */
    }
    if (size != 0 && size != had)
        atomic_fetch_add(&bad_calls, 1);
    free(raw);
}

static void *raw_realloc(void *raw, size_t size)
{
    size_t had = 0;
    if (raw && !registry_take(raw, &had)) {
        atomic_fetch_add(&bad_calls, 1);
        return NULL;
    }
    void *fresh = realloc(raw, size);
    if (fresh)
        registry_add(fresh, size);
    else if (raw && size != 0)
        registry_add(raw, had); /* failed: the old block lives on */
    return fresh;
}

/* --- the wiring under test, as a user writes it --- */

static void *w_aligned(size_t alignment, size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, alignment);
    return dd_allocation_created(raw_alloc(req.alignment, req.size), req);
}

static void *w_malloc(size_t size)
{
    return w_aligned(0, size);
}

/* Returns the size the real free was given. */
static size_t w_free_sized(void *ptr, size_t size)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, size, 0);
    raw_free(f.ptr, f.size);
    return f.size;
}

static void w_free(void *ptr)
{
    w_free_sized(ptr, 0);
}

static void *w_realloc(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    if (TAG_OF(prep.raw_ptr) != 0)
        atomic_fetch_add(&bad_calls, 1);
    void *raw = raw_realloc(prep.raw_ptr, prep.raw_size);
    return dd_allocation_realloc_commit(ptr, raw, prep);
}

/* --- probe counting --- */

static atomic_ulong n_alloc, n_free, n_realloc;
static atomic_uintptr_t last_alloc_ptr, last_free_ptr;

static void count_probe(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    switch (ev->kind) {
    case DD_PROBE_ALLOC:
        atomic_fetch_add(&n_alloc, 1);
        atomic_store(&last_alloc_ptr, ev->ptr);
        break;
    case DD_PROBE_FREE:
        atomic_fetch_add(&n_free, 1);
        atomic_store(&last_free_ptr, ev->ptr);
        break;
    case DD_PROBE_REALLOC:
        atomic_fetch_add(&n_realloc, 1);
        break;
    }
}

/* Every test: a simulated tracer sampling every allocation (R = 1), fresh
 * counters; afterwards nothing may be left allocated or mis-freed. */
static int setup(void **state)
{
    (void)state;
    atomic_store(&bad_calls, 0);
    atomic_store(&n_alloc, 0);
    atomic_store(&n_free, 0);
    atomic_store(&n_realloc, 0);
    ddheap_test_set_probe_hook(count_probe, NULL);
    dd_heap_simulate_tracer(true);
    dd_set_default_sampling_interval(1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(false);
    ddheap_test_set_probe_hook(NULL, NULL);
    assert_int_equal(atomic_load(&bad_calls), 0);
    assert_int_equal(registry_live(), 0);
    return 0;
}

static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)(i * 131 + seed);
}

static bool holds(const void *p, size_t n, unsigned seed)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != (unsigned char)(i * 131 + seed))
            return false;
    return true;
}

static void run_in_thread(void *(*fn)(void *), void *arg)
{
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
}

/* --- tests --- */

/* Runs first: ddheap's constructor enabled tagged addresses on the main
 * thread before main() ran, so its threads inherit them (mark_tbi.c). */
static void test_loading_thread_enabled_at_start(void **state)
{
    (void)state;
    int ctrl = prctl(PR_GET_TAGGED_ADDR_CTRL, 0UL, 0UL, 0UL, 0UL);
    assert_true(ctrl >= 0);
    assert_true((unsigned long)ctrl & PR_TAGGED_ADDR_ENABLE);
    assert_int_equal(dd_heap_thread_sampling_status(), DD_HEAP_THREAD_SAMPLING_READY);
}

static void test_sampled_block_is_tagged_and_freed_untagged(void **state)
{
    (void)state;
    uint64_t live = ddheap_test_live_marked();
    unsigned char *p = w_malloc(100);
    assert_non_null(p);
    assert_int_equal(TAG_OF(p), OUR_TAG);
    assert_int_equal(ddheap_test_live_marked(), live + 1);
    assert_int_equal(atomic_load(&n_alloc), 1);
    assert_int_equal(atomic_load(&last_alloc_ptr), (uintptr_t)p); /* the pointer the app sees */
    /* Loads and stores through the tag: the CPU ignores the top byte. */
    fill(p, 100, 1);
    assert_true(holds(UNTAGGED(p), 100, 1));
    /* A sized free: the allocator was asked for exactly 100 bytes (a tag
     * adds none) and gets its own untagged pointer back (the registry
     * counts anything else in bad_calls, checked in teardown). */
    assert_int_equal(w_free_sized(p, 100), 100);
    assert_int_equal(ddheap_test_live_marked(), live);
    assert_int_equal(atomic_load(&n_free), 1);
    assert_int_equal(atomic_load(&last_free_ptr), (uintptr_t)p);
}

static void test_unsampled_block_passes_through(void **state)
{
    (void)state;
    dd_heap_simulate_tracer(false); /* nothing samples without a tracer */
    unsigned char *p = w_malloc(100);
    assert_non_null(p);
    assert_int_equal(TAG_OF(p), 0);
    dd_alloc_freed_t f = dd_allocation_freed(p, 100, 0);
    assert_ptr_equal(f.ptr, p);
    assert_int_equal(f.size, 100);
    raw_free(f.ptr, f.size);
    dd_heap_simulate_tracer(true);
    assert_int_equal(atomic_load(&n_alloc), 0);
    assert_int_equal(atomic_load(&n_free), 0);
}

/* A tagged block handed to the kernel: write(2) reads from it, read(2)
 * writes into another, through a pipe. */
static void test_tagged_buffers_work_in_syscalls(void **state)
{
    (void)state;
    enum { N = 8192 }; /* below the 64 KiB pipe buffer: no reader thread */
    unsigned char *out = w_malloc(N);
    unsigned char *in = w_malloc(N);
    assert_int_equal(TAG_OF(out), OUR_TAG);
    assert_int_equal(TAG_OF(in), OUR_TAG);
    fill(out, N, 7);
    memset(in, 0, N);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    assert_int_equal(write(fd[1], out, N), N);
    assert_int_equal(read(fd[0], in, N), N);
    assert_true(holds(in, N, 7));
    close(fd[0]);
    close(fd[1]);
    w_free(out);
    w_free(in);
}

/* Control for the test above, and ddheap's own prctl at work: a thread
 * that switched tagged addresses off gets EFAULT for a tagged buffer;
 * once it reaches a sampling opportunity ddheap turns them on again. */
struct control_result {
    void *tagged;            /* a block the main thread sampled */
    long write_without;      /* write(2) with tagged addresses off */
    int errno_without;
    int status_before;       /* before ddheap asked for this thread */
    int status_after;
    uintptr_t own_block_tag; /* top byte of a block this thread sampled */
    long write_with;         /* write(2) of the same buffer afterwards */
};

static void *control_thread(void *arg)
{
    struct control_result *r = arg;
    int fd[2];
    if (pipe(fd) != 0)
        return NULL;
    prctl(PR_SET_TAGGED_ADDR_CTRL, 0UL, 0UL, 0UL, 0UL);
    r->write_without = write(fd[1], r->tagged, 64);
    r->errno_without = errno;
    r->status_before = dd_heap_thread_sampling_status();
    void *own = w_malloc(64); /* first sampling opportunity: ddheap asks */
    r->own_block_tag = TAG_OF(own);
    r->status_after = dd_heap_thread_sampling_status();
    r->write_with = write(fd[1], r->tagged, 64);
    w_free(own);
    close(fd[0]);
    close(fd[1]);
    return NULL;
}

static void test_kernel_needs_prctl_and_ddheap_asks(void **state)
{
    (void)state;
    struct control_result r = {.tagged = w_malloc(64)};
    assert_int_equal(TAG_OF(r.tagged), OUR_TAG);
    run_in_thread(control_thread, &r);
    assert_int_equal(r.write_without, -1);
    assert_int_equal(r.errno_without, EFAULT);
    assert_int_equal(r.status_before, DD_HEAP_THREAD_SAMPLING_PENDING);
    assert_int_equal(r.own_block_tag, OUR_TAG);
    assert_int_equal(r.status_after, DD_HEAP_THREAD_SAMPLING_READY);
    assert_int_equal(r.write_with, 64);
    w_free(r.tagged);
}

/* A thread created after start-up that never allocates inherits tagged
 * addresses from the main thread: it can write a block others sampled. */
struct inherit_result {
    void *tagged;
    int status;
    long written;
};

static void *inherit_thread(void *arg)
{
    struct inherit_result *r = arg;
    int fd[2];
    if (pipe(fd) != 0)
        return NULL;
    r->status = dd_heap_thread_sampling_status();
    r->written = write(fd[1], r->tagged, 256);
    close(fd[0]);
    close(fd[1]);
    return NULL;
}

static void test_new_threads_inherit_tagged_addresses(void **state)
{
    (void)state;
    struct inherit_result r = {.tagged = w_malloc(256), .written = -2};
    assert_int_equal(TAG_OF(r.tagged), OUR_TAG);
    fill(r.tagged, 256, 3);
    run_in_thread(inherit_thread, &r);
    assert_int_equal(r.status, DD_HEAP_THREAD_SAMPLING_PENDING); /* ddheap never asked */
    assert_int_equal(r.written, 256);
    w_free(r.tagged);
}

/* A thread whose prctl fails never hands out a tagged pointer, reports
 * why, and fires no alloc probe; once the failure is lifted it samples. */
struct refused_result {
    int status_before, status_after, status_retried;
    unsigned tagged;   /* tagged pointers seen while refused (must be 0) */
    unsigned blocks;   /* blocks allocated while refused */
    uintptr_t retried_tag;
};

static void *refused_thread(void *arg)
{
    struct refused_result *r = arg;
    static const size_t sizes[] = {1, 24, 100, 4096, 100000};
    void *blocks[40];
    ddheap_test_fail_tagging(true);
    r->status_before = dd_heap_thread_sampling_status();
    for (unsigned i = 0; i < 40; i++) {
        size_t size = sizes[i % 5];
        blocks[i] = i % 4 == 3 ? w_aligned(64, size) : w_malloc(size);
        if (i % 8 == 5)
            blocks[i] = w_realloc(blocks[i], size * 3);
        r->tagged += TAG_OF(blocks[i]) != 0;
        r->blocks++;
    }
    r->status_after = dd_heap_thread_sampling_status();
    for (unsigned i = 0; i < 40; i++)
        w_free(blocks[i]);

    ddheap_test_fail_tagging(false);
    ddheap_test_seed_thread(1); /* the refusal left a full countdown */
    void *p = w_malloc(32);
    r->retried_tag = TAG_OF(p);
    r->status_retried = dd_heap_thread_sampling_status();
    w_free(p);
    return NULL;
}

static void test_refused_thread_never_tags(void **state)
{
    (void)state;
    uint64_t live = ddheap_test_live_marked();
    struct refused_result r = {0};
    run_in_thread(refused_thread, &r);
    assert_int_equal(r.status_before, DD_HEAP_THREAD_SAMPLING_PENDING);
    assert_int_equal(r.blocks, 40);
    assert_int_equal(r.tagged, 0);
    assert_int_equal(r.status_after, DD_HEAP_THREAD_SAMPLING_NO_TAGGED_ADDR);
    /* Only the retried block was reported, allocated and freed. */
    assert_int_equal(atomic_load(&n_alloc), 1);
    assert_int_equal(atomic_load(&n_free), 1);
    assert_int_equal(r.retried_tag, OUR_TAG);
    assert_int_equal(r.status_retried, DD_HEAP_THREAD_SAMPLING_READY);
    assert_int_equal(ddheap_test_live_marked(), live);
}

/* Blocks cross threads both ways: freed by a thread that did not sample
 * them (and never allocated), with contents intact and the right probes. */
#define CROSS_N 128

struct cross_blocks {
    void *p[CROSS_N];
    size_t size[CROSS_N];
    unsigned tagged, intact;
};

static size_t cross_size(unsigned i)
{
    return 1 + (size_t)i * 97 % 20000;
}

static void *cross_free_thread(void *arg)
{
    struct cross_blocks *b = arg;
    for (unsigned i = 0; i < CROSS_N; i++) {
        b->intact += holds(b->p[i], b->size[i], i);
        w_free_sized(b->p[i], b->size[i]);
    }
    return NULL;
}

static void *cross_alloc_thread(void *arg)
{
    struct cross_blocks *b = arg;
    for (unsigned i = 0; i < CROSS_N; i++) {
        b->size[i] = cross_size(i);
        b->p[i] = i % 3 == 0 ? w_aligned((size_t)16 << (i % 9), b->size[i]) : w_malloc(b->size[i]);
        b->tagged += TAG_OF(b->p[i]) == OUR_TAG;
        fill(b->p[i], b->size[i], i);
    }
    return NULL;
}

static void test_tagged_blocks_freed_by_another_thread(void **state)
{
    (void)state;
    uint64_t live = ddheap_test_live_marked();
    struct cross_blocks b = {0};
    for (unsigned i = 0; i < CROSS_N; i++) {
        b.size[i] = cross_size(i);
        b.p[i] = w_malloc(b.size[i]);
        assert_int_equal(TAG_OF(b.p[i]), OUR_TAG);
        fill(b.p[i], b.size[i], i);
    }
    assert_int_equal(ddheap_test_live_marked(), live + CROSS_N);
    run_in_thread(cross_free_thread, &b);
    assert_int_equal(b.intact, CROSS_N);
    assert_int_equal(ddheap_test_live_marked(), live);
    assert_int_equal(atomic_load(&n_free), CROSS_N);

    /* The other way: a thread samples (its own prctl), the main thread frees. */
    struct cross_blocks c = {0};
    run_in_thread(cross_alloc_thread, &c);
    assert_int_equal(c.tagged, CROSS_N);
    for (unsigned i = 0; i < CROSS_N; i++) {
        assert_true(holds(c.p[i], c.size[i], i));
        assert_int_equal(w_free_sized(c.p[i], c.size[i]), c.size[i]);
    }
    assert_int_equal(ddheap_test_live_marked(), live);
    assert_int_equal(atomic_load(&n_alloc), 2 * CROSS_N);
    assert_int_equal(atomic_load(&n_free), 2 * CROSS_N);
}

/* Every power-of-two alignment is tagged without extra bytes, and the raw
 * block keeps its alignment; other alignments are never sampled. */
static void test_aligned_blocks(void **state)
{
    (void)state;
    for (size_t align = 16; align <= ((size_t)1 << 20); align <<= 1) {
        dd_alloc_req_t req = dd_allocation_requested(300, align);
        assert_true(req.weight != 0);
        assert_int_equal(req.size, 300); /* a tag needs no room */
        void *p = dd_allocation_created(raw_alloc(req.alignment, req.size), req);
        assert_int_equal(TAG_OF(p), OUR_TAG);
        assert_int_equal((uintptr_t)UNTAGGED(p) % align, 0);
        assert_int_equal(w_free_sized(p, 300), 300);
    }
    dd_alloc_req_t odd = dd_allocation_requested(300, 48);
    assert_int_equal(odd.weight, 0);
}

/* realloc keeps contents and hands the allocator untagged pointers
 * (checked by w_realloc) in every direction between tagged and untagged. */
static void test_realloc_tagged_blocks(void **state)
{
    (void)state;
    uint64_t live = ddheap_test_live_marked();

    /* tagged -> tagged, growing then shrinking */
    unsigned char *p = w_malloc(100);
    assert_int_equal(TAG_OF(p), OUR_TAG);
    fill(p, 100, 11);
    p = w_realloc(p, 50000);
    assert_int_equal(TAG_OF(p), OUR_TAG);
    assert_true(holds(p, 100, 11));
    fill(p, 50000, 12);
    p = w_realloc(p, 40);
    assert_int_equal(TAG_OF(p), OUR_TAG);
    assert_true(holds(p, 40, 12));
    assert_int_equal(ddheap_test_live_marked(), live + 1);

    /* tagged -> untagged: the new block is not sampled */
    dd_heap_simulate_tracer(false);
    p = w_realloc(p, 3000);
    assert_int_equal(TAG_OF(p), 0);
    assert_true(holds(p, 40, 12));
    assert_int_equal(ddheap_test_live_marked(), live);

    /* untagged -> tagged */
    fill(p, 3000, 13);
    dd_heap_simulate_tracer(true);
    p = w_realloc(p, 70000);
    assert_int_equal(TAG_OF(p), OUR_TAG);
    assert_true(holds(p, 3000, 13));
    assert_int_equal(ddheap_test_live_marked(), live + 1);

    /* A failed realloc leaves the old block tagged, live and intact. Its
     * prepare reported it freed, before the real realloc; a tag has no room
     * for the size and weight it would take to report it allocated again
     * (docs/realloc.md), so it is not. */
    fill(p, 70000, 14);
    unsigned frees_before = atomic_load(&n_free);
    unsigned char *q = w_realloc(p, SIZE_MAX / 4);
    assert_null(q);
    assert_int_equal(ddheap_test_live_marked(), live + 1);
    assert_true(holds(p, 70000, 14));
    assert_int_equal(atomic_load(&n_free), frees_before + 1);

    /* realloc(p, 0) frees the tagged block: reported again. */
    q = w_realloc(p, 0);
    assert_null(q);
    assert_int_equal(ddheap_test_live_marked(), live);

    /* Reported: malloc, grow, shrink, untagged -> tagged; each of those
     * went away exactly once, and the block of the failed realloc a second
     * time, without an alloc in between. */
    assert_int_equal(atomic_load(&n_alloc), 4);
    assert_int_equal(atomic_load(&n_free), 5);
}

/* MTE tag checks use bits 56..59: a thread with them on must not tag.
 * qemu-aarch64 (CI) emulates MTE; a CPU without it refuses the prctl. */
struct mte_result {
    int setup_rc, setup_errno;
    int status;
    unsigned tagged;
};

static void *mte_thread(void *arg)
{
    struct mte_result *r = arg;
    unsigned long ctrl = PR_TAGGED_ADDR_ENABLE | PR_MTE_TCF_SYNC | (0xfffeUL << PR_MTE_TAG_SHIFT);
    r->setup_rc = prctl(PR_SET_TAGGED_ADDR_CTRL, ctrl, 0UL, 0UL, 0UL);
    r->setup_errno = errno;
    if (r->setup_rc != 0)
        return NULL;
    void *blocks[16];
    for (unsigned i = 0; i < 16; i++) {
        blocks[i] = w_malloc(64 + i);
        r->tagged += TAG_OF(blocks[i]) != 0;
    }
    r->status = dd_heap_thread_sampling_status();
    for (unsigned i = 0; i < 16; i++)
        w_free(blocks[i]);
    return NULL;
}

static void test_mte_thread_never_tags(void **state)
{
    (void)state;
    struct mte_result r = {0};
    run_in_thread(mte_thread, &r);
    if (r.setup_rc != 0) {
        /* Real hardware without MTE: nothing to test, and cmocka says so. */
        assert_int_equal(r.setup_errno, EINVAL);
        skip();
    }
    assert_int_equal(r.tagged, 0);
    assert_int_equal(r.status, DD_HEAP_THREAD_SAMPLING_MTE);
    assert_int_equal(atomic_load(&n_alloc), 0);
}

static void test_status_when_disabled(void **state)
{
    (void)state;
    assert_int_equal(setenv("DD_HEAP_SAMPLING_ENABLED", "0", 1), 0);
    ddheap_test_reload_config();
    assert_int_equal(dd_heap_thread_sampling_status(), DD_HEAP_THREAD_SAMPLING_DISABLED);
    void *p = w_malloc(64);
    assert_int_equal(TAG_OF(p), 0);
    w_free(p);
    assert_int_equal(setenv("DD_HEAP_SAMPLING_ENABLED", "1", 1), 0);
    ddheap_test_reload_config();
    dd_set_default_sampling_interval(1);
    assert_int_equal(dd_heap_thread_sampling_status(), DD_HEAP_THREAD_SAMPLING_READY);
    p = w_malloc(64);
    assert_int_equal(TAG_OF(p), OUR_TAG);
    w_free(p);
}

/* Every case runs between setup and teardown. */
#define TBI_CASE(test) cmocka_unit_test_setup_teardown(test, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        TBI_CASE(test_loading_thread_enabled_at_start),
        TBI_CASE(test_sampled_block_is_tagged_and_freed_untagged),
        TBI_CASE(test_unsampled_block_passes_through),
        TBI_CASE(test_tagged_buffers_work_in_syscalls),
        TBI_CASE(test_kernel_needs_prctl_and_ddheap_asks),
        TBI_CASE(test_new_threads_inherit_tagged_addresses),
        TBI_CASE(test_refused_thread_never_tags),
        TBI_CASE(test_tagged_blocks_freed_by_another_thread),
        TBI_CASE(test_aligned_blocks),
        TBI_CASE(test_realloc_tagged_blocks),
        TBI_CASE(test_mte_thread_never_tags),
        TBI_CASE(test_status_when_disabled),
    };
    return cmocka_run_group_tests_name("tbi", tests, NULL, NULL);
}

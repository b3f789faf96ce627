/*
 * Allocation calls on a thread while it exits. Other libraries free (and
 * allocate) from their thread-exit hooks: C++ thread_local destructors
 * (__cxa_thread_atexit_impl, run first) and pthread key destructors (run
 * after them, for up to PTHREAD_DESTRUCTOR_ITERATIONS rounds). ddheap keeps
 * its per-thread state in static TLS with no destructor, so it is never
 * "gone" before them: these tests prove that sampled blocks are created,
 * reported and released correctly from every one of those hooks, including
 * on a thread whose first ddheap call happens during its exit, and for
 * blocks sampled on another (already finished) thread.
 */
#include "recording_alloc.h"
#include "test_main.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

/* glibc's registration of C++ thread_local destructors: what g++ emits for
 * a `thread_local` object with a destructor, callable from C. */
extern int __cxa_thread_atexit_impl(void (*fn)(void *), void *arg, void *dso_symbol);
extern void *__dso_handle;

#define BLOCKS 6

struct blocks {
    unsigned char *p[BLOCKS];
    size_t size[BLOCKS];
    size_t align[BLOCKS];
    int rounds; /* pthread key destructor rounds still to re-arm */
};

static pthread_key_t key;

/* cmocka's asserts may only run on the test's own thread (they longjmp):
 * the exiting threads count their failures here instead. */
static unsigned thread_failures;
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s failed on an exiting thread\n", __FILE__, __LINE__, #cond); \
            __atomic_add_fetch(&thread_failures, 1, __ATOMIC_RELAXED);                             \
        }                                                                                          \
    } while (0)

/* A mix of header-marked, over-aligned and page-table-marked blocks. */
static void alloc_blocks(struct blocks *b, unsigned char seed)
{
    const size_t aligns[BLOCKS] = {0, 0, 64, 4096, 0, 1u << 21};
    for (int i = 0; i < BLOCKS; i++) {
        b->size[i] = 100 + (size_t)i * 700;
        b->align[i] = aligns[i];
        b->p[i] = w_alloc(b->size[i], aligns[i]);
        CHECK(b->p[i] != NULL);
        if (b->p[i] == NULL)
            return;
        memset(b->p[i], seed + i, b->size[i]);
    }
    /* One goes through realloc too, so its mark moves. */
    unsigned char *grown = w_realloc(b->p[1], b->size[1] * 3);
    CHECK(grown != NULL);
    if (grown == NULL)
        return;
    b->p[1] = grown;
    memset(b->p[1] + b->size[1], seed + 1, b->size[1] * 2);
    b->size[1] *= 3;
}

static void free_blocks(struct blocks *b, unsigned char seed)
{
    for (int i = 0; i < BLOCKS; i++) {
        if (b->p[i] == NULL)
            continue;
        size_t changed = 0;
        for (size_t j = 0; j < b->size[i]; j++)
            changed += b->p[i][j] != (unsigned char)(seed + i);
        CHECK(changed == 0);
        if (i % 2)
            w_free_sized(b->p[i], b->size[i], b->align[i]);
        else
            w_free(b->p[i]);
        b->p[i] = NULL;
    }
}

static void run_thread(void *(*body)(void *), void *arg)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, body, arg), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(__atomic_load_n(&thread_failures, __ATOMIC_RELAXED), 0);
}

/* --- frees in a pthread key destructor of blocks the thread allocated --- */

static void key_free_dtor(void *arg)
{
    free_blocks(arg, 11);
}

static void *allocating_body(void *arg)
{
    alloc_blocks(arg, 11);
    pthread_setspecific(key, arg);
    return NULL;
}

static void test_key_destructor_frees(void **state)
{
    (void)state;
    struct blocks b = {0};
    assert_int_equal(pthread_key_create(&key, key_free_dtor), 0);
    run_thread(allocating_body, &b);
    pthread_key_delete(key);
    assert_int_equal(rec_count(DD_PROBE_ALLOC), BLOCKS + 1); /* + the realloc's new block */
    assert_int_equal(rec_count(DD_PROBE_FREE), BLOCKS + 1);
}

/* --- a thread whose first ddheap call happens during its exit, in several
 * destructor rounds (each round re-arms the key) --- */

static void key_round_dtor(void *arg)
{
    struct blocks *b = arg;
    alloc_blocks(b, 22);
    free_blocks(b, 22);
    if (b->rounds-- > 0)
        pthread_setspecific(key, b);
}

static void *idle_body(void *arg)
{
    pthread_setspecific(key, arg);
    return NULL;
}

static void test_first_call_in_destructor(void **state)
{
    (void)state;
    struct blocks b = {.rounds = 2};
    assert_int_equal(pthread_key_create(&key, key_round_dtor), 0);
    run_thread(idle_body, &b);
    pthread_key_delete(key);
    assert_int_equal(b.rounds, -1); /* three rounds ran */
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 3 * (BLOCKS + 1));
}

/* --- C++ thread_local destructors (run before the pthread key ones) --- */

static void tls_dtor(void *arg)
{
    struct blocks *b = arg;
    free_blocks(b, 33);   /* blocks from the thread body */
    alloc_blocks(b, 44);  /* and a fresh round during exit */
    free_blocks(b, 44);
}

static void *tls_body(void *arg)
{
    alloc_blocks(arg, 33);
    CHECK(__cxa_thread_atexit_impl(tls_dtor, arg, &__dso_handle) == 0);
    return NULL;
}

static void test_thread_local_destructor(void **state)
{
    (void)state;
    struct blocks b = {0};
    run_thread(tls_body, &b);
    assert_int_equal(rec_count(DD_PROBE_ALLOC), 2 * (BLOCKS + 1));
}

/* --- blocks sampled on a thread that has finished, freed by another
 * thread's exit hook --- */

static void *producer_body(void *arg)
{
    alloc_blocks(arg, 55);
    return NULL;
}

static void foreign_free_dtor(void *arg)
{
    free_blocks(arg, 55);
}

static void *consumer_body(void *arg)
{
    pthread_setspecific(key, arg);
    return NULL;
}

static void test_free_foreign_blocks_at_exit(void **state)
{
    (void)state;
    struct blocks b = {0};
    assert_int_equal(pthread_key_create(&key, foreign_free_dtor), 0);
    run_thread(producer_body, &b);
    assert_int_equal(ddheap_test_live_marked(), robust_marked_before + BLOCKS);
    run_thread(consumer_body, &b);
    pthread_key_delete(key);
    assert_int_equal(rec_count(DD_PROBE_FREE), BLOCKS + 1);
}

DDHEAP_TEST_MAIN(
    ROBUST_CASE(test_key_destructor_frees),
    ROBUST_CASE(test_first_call_in_destructor),
    ROBUST_CASE(test_thread_local_destructor),
    ROBUST_CASE(test_free_foreign_blocks_at_exit))

/*
 * A program started without ddheap, for test_attach.py: ddheap-prof -p
 * injects the agent into it while its threads are busy. Built at plain -O2
 * (no frame pointers), PIE and not, with full RELRO, lazy binding or
 * -fno-plt (tests/prof/meson.build).
 *
 * Threads: one in a tight malloc/free loop (the moment of attach finds it
 * inside malloc now and then), one blocked in read() on a pipe, one in a
 * futex wait (a condition variable), one in nanosleep. The main thread
 * reads commands on stdin, one a line, and answers each on stdout:
 *   keep N SIZE  allocates N blocks of SIZE bytes at site_kept, fills each
 *                with a pattern, keeps them: "kept"
 *   check        every kept block still holds its pattern, and the busy
 *                threads still run: "ok" or "bad ..."
 *   free         frees the kept blocks: "freed"
 *   stall        fills stderr (a pipe the test does not read yet), says
 *                "stalling", then calls malloc_stats(), which blocks
 *                writing to it while it holds the main arena's lock: the
 *                main thread is inside the allocator until the test reads
 *                stderr; then "unstalled"
 *   fork         forks a child that allocates once and then waits in
 *                pause() to be killed: "child PID"
 *   quit         stops the threads, exits 0
 * A timer sends the process SIGALRM every 2 ms (a handler counts them,
 * SA_RESTART): signals keep arriving while the agent is injected, to any
 * thread, the borrowed one included.
 *
 * At start it prints "ready". Arguments: "seccomp" first installs a
 * seccomp filter that allows everything (Seccomp: 2); "notimer" starts no
 * timer (for a process whose tracer waits for nothing).
 */
#define _GNU_SOURCE

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_bool stopping;
static atomic_ulong churn_rounds, sleep_rounds, alarms;
static bool timer_on;

static void on_alarm(int sig)
{
    (void)sig;
    atomic_fetch_add(&alarms, 1);
}
static int reader_pipe[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* Small blocks, a few thousand samples a second at the tests' interval
 * (64 KiB): the loop is always in or near malloc, and ddheap-prof reads
 * what it is sent. */
static void *churn(void *arg)
{
    (void)arg;
    while (!atomic_load(&stopping)) {
        void *blocks[16];
        for (int i = 0; i < 16; i++) {
            blocks[i] = malloc((size_t)(16 + 4 * i));
            if (blocks[i] == NULL)
                abort();
            memset(blocks[i], i, 16);
        }
        void *c = calloc(4, 25);
        void *r = realloc(blocks[0], 128);
        if (c == NULL || r == NULL)
            abort();
        blocks[0] = r;
        for (int i = 0; i < 16; i++)
            free(blocks[i]);
        free(c);
        atomic_fetch_add(&churn_rounds, 1);
    }
    return NULL;
}

static void *reader(void *arg)
{
    (void)arg;
    char byte;
    while (read(reader_pipe[0], &byte, 1) < 0)
        ;
    return NULL;
}

/* An hour from now, or now. */
static struct timespec deadline(time_t seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += seconds;
    return ts;
}

static void *waiter(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    while (!atomic_load(&stopping)) {
        struct timespec until = deadline(3600);
        pthread_cond_timedwait(&cond, &lock, &until);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/* Every function the threads block in, called once by main before they
 * start: under lazy binding their slots are then bound before "ready",
 * and a test reading the slots sees only what an attach changes. */
static void bind_before_threads(void)
{
    char byte = 0;
    if (write(reader_pipe[1], &byte, 1) != 1 || read(reader_pipe[0], &byte, 1) != 1)
        abort();
    pthread_mutex_lock(&lock);
    struct timespec now = deadline(0);
    pthread_cond_timedwait(&cond, &lock, &now);
    pthread_mutex_unlock(&lock);
    struct timespec none = {0, 0};
    nanosleep(&none, NULL);
    free(calloc(1, 16));
    free(realloc(malloc(16), 32));
}

static void *sleeper(void *arg)
{
    (void)arg;
    while (!atomic_load(&stopping)) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        atomic_fetch_add(&sleep_rounds, 1);
    }
    return NULL;
}

/* malloc's address taken, as python3 takes it: in the non-PIE build the
 * executable then holds a canonical PLT entry for malloc, which the whole
 * process binds the name to, and its own slot holds libc's malloc. */
void *(*volatile dd_test_malloc_ref)(size_t);

static unsigned char **kept;
static size_t n_kept, kept_size;

__attribute__((noinline)) static void site_kept(size_t n, size_t size)
{
    kept = dd_test_malloc_ref(n * sizeof *kept);
    if (kept == NULL)
        abort();
    for (size_t i = 0; i < n; i++) {
        kept[i] = malloc(size);
        if (kept[i] == NULL)
            abort();
        memset(kept[i], (int)(i * 7 + 1) & 0xff, size);
    }
    n_kept = n;
    kept_size = size;
}

static const char *check(void)
{
    for (size_t i = 0; i < n_kept; i++)
        for (size_t k = 0; k < kept_size; k++)
            if (kept[i][k] != ((i * 7 + 1) & 0xff))
                return "bad block contents";
    /* Alive: each busy thread moves on within 30 s (a machine under
     * load may not run it for a while; a deadlock never moves). */
    unsigned long churned = atomic_load(&churn_rounds), slept = atomic_load(&sleep_rounds);
    unsigned long alarmed = atomic_load(&alarms);
    for (int waited = 0; waited < 3000; waited++) {
        if (atomic_load(&churn_rounds) != churned && atomic_load(&sleep_rounds) != slept &&
            (atomic_load(&alarms) != alarmed || !timer_on))
            return "ok";
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (atomic_load(&churn_rounds) == churned)
        return "bad: the malloc loop stopped";
    if (atomic_load(&alarms) == alarmed && timer_on)
        return "bad: the timer's signals stopped";
    return "bad: the sleeping thread stopped";
}

static int allow_everything_filter(void)
{
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog program = {1, &allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program);
}

static void stall(void)
{
    static char filler[65536];
    memset(filler, '.', sizeof filler);
    size_t done = 0;
    while (done < sizeof filler) {
        ssize_t n = write(STDERR_FILENO, filler + done, sizeof filler - done);
        if (n <= 0)
            abort();
        done += (size_t)n;
    }
    printf("stalling\n");
    malloc_stats();
    printf("unstalled\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    dd_test_malloc_ref = malloc; /* in code: an absolute address when not PIE */
    bool timer = true;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "seccomp") == 0 && allow_everything_filter() != 0)
            return 2;
        timer = timer && strcmp(argv[i], "notimer") != 0;
    }
    if (pipe(reader_pipe) != 0)
        return 2;
    bind_before_threads();
    pthread_t threads[4];
    void *(*bodies[4])(void *) = {churn, reader, waiter, sleeper};
    for (int i = 0; i < 4; i++)
        if (pthread_create(&threads[i], NULL, bodies[i], NULL) != 0)
            return 2;
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    struct itimerval every = {{0, 2000}, {0, 2000}};
    if (sigaction(SIGALRM, &sa, NULL) != 0 || (timer && setitimer(ITIMER_REAL, &every, NULL) != 0))
        return 2;
    timer_on = timer;
    /* Every entry point used once before "ready": lazy slots are bound. */
    void *warm = aligned_alloc(64, 128);
    void *pm = NULL;
    if (warm == NULL || posix_memalign(&pm, 64, 64) != 0)
        return 2;
    free(warm);
    free(pm);
    printf("ready\n");
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        size_t n, size;
        if (sscanf(line, "keep %zu %zu", &n, &size) == 2) {
            site_kept(n, size);
            printf("kept\n");
        } else if (strncmp(line, "check", 5) == 0) {
            printf("%s\n", check());
        } else if (strncmp(line, "free", 4) == 0) {
            for (size_t i = 0; i < n_kept; i++)
                free(kept[i]);
            free(kept);
            n_kept = 0;
            printf("freed\n");
        } else if (strncmp(line, "fork", 4) == 0) {
            pid_t child = fork();
            if (child == 0) {
                free(malloc(100));
                pause();
                _exit(0);
            }
            printf("child %d\n", (int)child);
        } else if (strncmp(line, "stall", 5) == 0) {
            stall();
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        }
    }
    atomic_store(&stopping, true);
    pthread_mutex_lock(&lock);
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    if (write(reader_pipe[1], "x", 1) != 1)
        return 2;
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    return 0;
}

/*
 * DD_HEAP_SAMPLING_ENABLED / DD_HEAP_SAMPLING_INTERVAL set to garbage,
 * negative, zero and huge values before the process starts. Each case runs
 * in a fresh process (this program re-executes itself with the case's
 * environment), because ddheap reads the environment once, from a
 * constructor, before main: only a fresh process tests that path.
 *
 * The child reports what it got: the interval (API), whether sampling is on
 * (observed, not asked: at interval 1 a 64-byte block is sampled exactly
 * when sampling is enabled), how many of 64 blocks of 64 KiB were sampled
 * at the environment's interval, and whether every mark was released. The
 * parent compares with the documented result of each value and counts the
 * bits of the process-wide status word the child read: one per bad value,
 * none otherwise. The child's stderr stays empty: nothing inside a
 * profiled process writes on its streams.
 */
#include <ddheap.h>
#include <ddheap/testing.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "child.h"

#define BLOCKS 64
#define BLOCK_SIZE (64u * 1024u)
#define ANY_COUNT -1

static char self_path[4096];
static unsigned child_samples;

static void count_hook(const dd_probe_event_t *ev, void *ctx)
{
    (void)ctx;
    if (ev->kind == DD_PROBE_ALLOC)
        child_samples++;
}

static int child_main(void)
{
    uint64_t interval = dd_get_default_sampling_interval();

    ddheap_test_set_probe_hook(count_hook, NULL);
    dd_heap_simulate_tracer(true);
    void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        dd_alloc_req_t req = dd_allocation_requested(BLOCK_SIZE, 0);
        blocks[i] = dd_allocation_created(malloc(req.size), req);
        if (blocks[i] == NULL)
            return 2;
        memset(blocks[i], i, BLOCK_SIZE);
    }
    unsigned at_env_interval = child_samples;
    for (int i = 0; i < BLOCKS; i++)
        free(dd_allocation_freed(blocks[i], 0, 0).ptr);

    dd_set_default_sampling_interval(1);
    dd_alloc_req_t req = dd_allocation_requested(64, 0);
    int enabled = req.weight != 0;
    free(dd_allocation_freed(dd_allocation_created(malloc(req.size), req), 0, 0).ptr);
    dd_heap_simulate_tracer(false);

    uint64_t status = __atomic_load_n(&ddheap_shared_v3.status, __ATOMIC_RELAXED);
    printf("interval=%llu enabled=%d samples=%u clean=%d status=%llu\n",
           (unsigned long long)interval, enabled, at_env_interval, ddheap_test_live_marked() == 0,
           (unsigned long long)status);
    return 0;
}

struct env_case {
    const char *enabled;  /* NULL: unset */
    const char *interval; /* NULL: unset */
    int expect_enabled;
    uint64_t expect_interval;
    int expect_complaints;
    int expect_samples; /* of BLOCKS blocks at the environment's interval, or ANY_COUNT */
};

#define DEF 524288u

static const struct env_case cases[] = {
    {NULL, NULL, 1, DEF, 0, ANY_COUNT},
    /* DD_HEAP_SAMPLING_ENABLED: anything but the eight words is ignored
     * (sampling stays enabled) with one line on stderr. */
    {"garbage", NULL, 1, DEF, 1, ANY_COUNT},
    {"-1", NULL, 1, DEF, 1, ANY_COUNT},
    {"", NULL, 1, DEF, 1, ANY_COUNT},
    {"2", NULL, 1, DEF, 1, ANY_COUNT},
    {"99999999999999999999999", NULL, 1, DEF, 1, ANY_COUNT},
    {"0", NULL, 0, DEF, 0, 0},
    {"off", NULL, 0, DEF, 0, 0},
    {"FALSE", NULL, 0, DEF, 0, 0},
    {"yes", NULL, 1, DEF, 0, ANY_COUNT},
    /* DD_HEAP_SAMPLING_INTERVAL: not a positive byte count that fits in 64
     * bits: ignored (default kept) with one line on stderr. */
    {NULL, "garbage", 1, DEF, 1, ANY_COUNT},
    {NULL, "-4096", 1, DEF, 1, ANY_COUNT},
    {NULL, "-1", 1, DEF, 1, ANY_COUNT},
    {NULL, "0", 1, DEF, 1, ANY_COUNT},
    {NULL, "", 1, DEF, 1, ANY_COUNT},
    {NULL, "0x1000", 1, DEF, 1, ANY_COUNT},
    {NULL, "18446744073709551616", 1, DEF, 1, ANY_COUNT},
    {NULL, "99999999999999999999999", 1, DEF, 1, ANY_COUNT},
    {NULL, "17179869184g", 1, DEF, 1, ANY_COUNT},
    /* Valid extremes: 1 samples everything; the largest value samples
     * (practically) nothing, and neither crashes nor overflows a weight. */
    {NULL, "1", 1, 1, 0, BLOCKS},
    {NULL, "4k", 1, 4096, 0, BLOCKS},
    {NULL, "16g", 1, UINT64_C(16) << 30, 0, ANY_COUNT},
    {NULL, "18446744073709551615", 1, UINT64_MAX, 0, 0},
    /* Both bad: two lines; disabled with a bad interval: one. */
    {"garbage", "garbage", 1, DEF, 2, ANY_COUNT},
    {"0", "garbage", 0, DEF, 1, 0},
    {"0", "1", 0, 1, 0, 0},
};

/* The child of run_case: this program again, with the case's environment. */
static int exec_self(void *arg)
{
    const struct env_case *c = arg;
    unsetenv("DD_HEAP_SAMPLING_ENABLED");
    unsetenv("DD_HEAP_SAMPLING_INTERVAL");
    if (c->enabled)
        setenv("DD_HEAP_SAMPLING_ENABLED", c->enabled, 1);
    if (c->interval)
        setenv("DD_HEAP_SAMPLING_INTERVAL", c->interval, 1);
    char *argv[] = {self_path, (char *)"--child", NULL};
    execv(self_path, argv);
    /* A cross build under emulation: the kernel cannot run this binary
     * itself, so go through the emulator meson runs the tests with. */
    const char *wrapper = getenv("MESON_EXE_WRAPPER");
    if (errno == ENOEXEC && wrapper && *wrapper) {
        static char words[1024];
        char *wargv[16];
        int n = 0;
        snprintf(words, sizeof words, "%s", wrapper);
        for (char *w = strtok(words, " "); w && n < 13; w = strtok(NULL, " "))
            wargv[n++] = w;
        wargv[n++] = self_path;
        wargv[n++] = (char *)"--child";
        wargv[n] = NULL;
        execvp(wargv[0], wargv);
    }
    return 127;
}

static void run_case(const struct env_case *c)
{
    static struct child_output child;
    run_child(exec_self, (void *)c, &child);
    int status = child.status;
    char *stdout_text = child.out, *stderr_text = child.err;

    const char *label_e = c->enabled ? c->enabled : "(unset)";
    const char *label_i = c->interval ? c->interval : "(unset)";
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("ENABLED=%s INTERVAL=%s: child status %#x, stderr: %s", label_e, label_i, status,
                 stderr_text);
    unsigned long long interval, word;
    int enabled, clean;
    unsigned samples;
    if (sscanf(stdout_text, "interval=%llu enabled=%d samples=%u clean=%d status=%llu", &interval,
               &enabled, &samples, &clean, &word) != 5)
        fail_msg("ENABLED=%s INTERVAL=%s: unreadable child output \"%s\"", label_e, label_i,
                 stdout_text);

    int complaints = !!(word & DDHEAP__STATUS_BAD_ENABLED) +
                     !!(word & DDHEAP__STATUS_BAD_INTERVAL);
    size_t other_lines = strlen(stderr_text) != 0 ||
                         (word & ~(uint64_t)(DDHEAP__STATUS_BAD_ENABLED |
                                             DDHEAP__STATUS_BAD_INTERVAL)) != 0;
    print_message("ENABLED=%-10.10s INTERVAL=%-12.12s -> interval %llu, enabled %d, %u/%d sampled, "
                  "%d complaint(s)\n",
                  label_e, label_i, interval, enabled, samples, BLOCKS, complaints);
    if (interval != c->expect_interval || enabled != c->expect_enabled ||
        complaints != c->expect_complaints || other_lines != 0 || !clean ||
        (c->expect_samples != ANY_COUNT && samples != (unsigned)c->expect_samples))
        fail_msg("ENABLED=%s INTERVAL=%s: got interval %llu enabled %d complaints %d samples %u "
                 "clean %d, stderr \"%s\"",
                 label_e, label_i, interval, enabled, complaints, samples, clean, stderr_text);
}

static void test_case(void **state)
{
    run_case(*state);
}

#define NCASES (sizeof cases / sizeof *cases)

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--child") == 0)
        return child_main();
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n <= 0)
        return 1;
    self_path[n] = '\0';
    /* One cmocka test per case, named after its environment. */
    static char names[NCASES][96];
    struct CMUnitTest tests[NCASES];
    for (size_t i = 0; i < NCASES; i++) {
        snprintf(names[i], sizeof names[i], "ENABLED=%s INTERVAL=%s",
                 cases[i].enabled ? cases[i].enabled : "(unset)",
                 cases[i].interval ? cases[i].interval : "(unset)");
        tests[i] = (struct CMUnitTest){names[i], test_case, NULL, NULL, (void *)&cases[i]};
    }
    return _cmocka_run_group_tests("env_process", tests, NCASES, NULL, NULL);
}

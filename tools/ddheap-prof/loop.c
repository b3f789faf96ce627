/*
 * The BPF side and the event loop: loads the programs of
 * ddheap_prof.bpf.c, opens the ring buffer, and feeds each event into the
 * table (table.h) until the run ends, rescanning the process's mappings
 * for objects loaded later.
 */
#include <bpf/libbpf.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <linux/types.h>

#include "ddheap_prof.h"
/* bpftool embeds the BPF object as one string literal, longer than the
 * 4095 characters -Wpedantic holds C99 compilers to; gcc and clang take it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
#include "ddheap_prof.skel.h"
#pragma GCC diagnostic pop
#include "prof.h"

#define RESCAN_MS 200
#define SNAPSHOT_SLACK_NS 10000000LL

static volatile sig_atomic_t stop_requested, snapshot_requested;

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        snapshot_requested = 1;
    else
        stop_requested = 1;
}

static int libbpf_quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    if (level == LIBBPF_DEBUG)
        return 0;
    return vfprintf(stderr, fmt, ap);
}

static int on_event(void *ctx, void *data, size_t size)
{
    struct prof *p = ctx;
    const struct dd_prof_event_head *h = data;
    if (size < sizeof *h)
        return 0;
    struct dd_prof_sample sample = {.ptr = h->ptr, .ts_ns = h->ts_ns, .tgid = h->tgid};
    /* Snapshots due before this event see the table without it. */
    dd_prof_snapshots_before(p, h->ts_ns);
    if (h->type == DD_PROF_EV_FREE) {
        if (dd_prof_table_free_block(&p->table, &sample))
            p->oom = true;
    } else if (h->type == DD_PROF_EV_ALLOC &&
               size >= offsetof(struct dd_prof_alloc_event, frames)) {
        const struct dd_prof_alloc_event *a = data;
        uint32_t n = a->nframes;
        size_t room = (size - offsetof(struct dd_prof_alloc_event, frames)) / sizeof a->frames[0];
        if (n > room)
            n = (uint32_t)room;
        /* __u64 is unsigned long long, uint64_t unsigned long here: copy
         * rather than read one through the other. */
        uint64_t frames[DD_PROF_MAX_FRAMES];
        if (n > DD_PROF_MAX_FRAMES)
            n = DD_PROF_MAX_FRAMES;
        for (uint32_t i = 0; i < n; i++)
            frames[i] = a->frames[i];
        sample.size = a->size;
        sample.weight = a->weight;
        if (h->ptr != 0 && dd_prof_table_alloc(&p->table, &sample, frames, n))
            p->oom = true;
    }
    return 0;
}

void dd_prof_catch_snapshot_signal(void)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGUSR1, &sa, NULL);
}

int64_t dd_prof_now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int dd_prof_setup_bpf(struct prof *p)
{
    libbpf_set_print(p->opt.verbose ? NULL : libbpf_quiet);
    p->skel = ddheap_prof_bpf__open();
    if (p->skel == NULL) {
        fprintf(stderr, "ddheap-prof: cannot open the BPF object: %s\n", strerror(errno));
        return -1;
    }
    p->skel->rodata->target_tgid = (uint32_t)p->pid;
    /* A ring buffer's size is a power of two, at least a page. */
    unsigned long bytes = 4096;
    while (bytes < p->opt.ringbuf_kb * 1024)
        bytes <<= 1;
    p->skel->rodata->wake_bytes = bytes / 4;
    if (bpf_map__set_max_entries(p->skel->maps.events, (uint32_t)bytes) != 0 ||
        ddheap_prof_bpf__load(p->skel) != 0) {
        fprintf(stderr, "ddheap-prof: cannot load the BPF programs: %s\n", strerror(errno));
        return -1;
    }
    p->rb = ring_buffer__new(bpf_map__fd(p->skel->maps.events), on_event, p, NULL);
    if (p->rb == NULL) {
        fprintf(stderr, "ddheap-prof: cannot open the ring buffer: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

void dd_prof_teardown_bpf(struct prof *p)
{
    ring_buffer__free(p->rb);
    ddheap_prof_bpf__destroy(p->skel);
}

/* Runs until Ctrl-C, -d, the process's end or a failure (prof.h). */
bool dd_prof_run_loop(struct prof *p, bool *exited, int *status, bool *exec_seen)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* The run's clock starts now, for the table's checkpoints. */
    dd_prof_table_advance(&p->table, (uint64_t)p->started_mono);
    int64_t deadline =
        p->opt.duration > 0 ? p->started_mono + (int64_t)(p->opt.duration * 1e9) : 0;
    int64_t next_scan = dd_prof_now_ns(CLOCK_MONOTONIC) + RESCAN_MS * 1000000LL;
    bool cut_short = false;
    while (!stop_requested && !*exited && !p->oom) {
        int got = ring_buffer__poll(p->rb, 50);
        if (got < 0 && got != -EINTR) {
            fprintf(stderr, "ddheap-prof: reading the ring buffer: %s\n", strerror(-got));
            cut_short = true;
            break;
        }
        int64_t now = dd_prof_now_ns(CLOCK_MONOTONIC);
        if (p->child)
            *exited = dd_prof_child_events(p, status, exec_seen);
        else
            *exited = dd_prof_process_gone(p->pid);
        if (deadline && now >= deadline)
            break;
        /* A snapshot no event came after: once the buffer is drained,
         * every event stamped before it has been applied (an event still
         * being written on another CPU lands in the next one). */
        if (snapshot_requested || dd_prof_snapshot_due(p, now - SNAPSHOT_SLACK_NS)) {
            ring_buffer__consume(p->rb);
            if (dd_prof_snapshot_due(p, now - SNAPSHOT_SLACK_NS))
                dd_prof_snapshots_before(p, (uint64_t)(now - SNAPSHOT_SLACK_NS));
            if (snapshot_requested) {
                snapshot_requested = 0;
                dd_prof_snapshot_now(p, dd_prof_now_ns(CLOCK_MONOTONIC));
            }
        }
        if (!*exited && now >= next_scan) {
            dd_prof_rescan(p);
            next_scan = now + RESCAN_MS * 1000000LL;
        }
    }
    /* Everything the programs wrote before the end is in the buffer. */
    ring_buffer__consume(p->rb);
    if (p->oom) {
        fprintf(stderr, "ddheap-prof: out of memory: the profile stops here\n");
        cut_short = true;
    }
    return cut_short;
}

/*
 * The BPF side and the event loop: loads the programs of
 * ddheap_prof.bpf.c, opens the ring buffer, and feeds each event into the
 * table (table.h) until the run ends, rescanning the process's mappings
 * for objects loaded later.
 */
#include <bpf/bpf.h>
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

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int libbpf_quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    if (level == LIBBPF_DEBUG)
        return 0;
    return vfprintf(stderr, fmt, ap);
}

/* -v: everything libbpf says, the verifier's log included. */
static int libbpf_all(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    return vfprintf(stderr, fmt, ap);
}

/* The frames of an alloc event: the kernel's walk as it came, or the
 * copied stack unwound here. Returns how many. */
static uint32_t frames_of(struct prof *p, const struct dd_prof_alloc_event *a, size_t data_len,
                          uint64_t *frames)
{
    size_t len = a->len < data_len ? a->len : data_len;
    if (a->kind == DD_PROF_STACK_COPY) {
        if (p->unwinder == NULL)
            return 0;
        /* __u64 is unsigned long long, uint64_t unsigned long here: copy
         * rather than read one through the other. */
        uint64_t regs[4];
        for (int i = 0; i < 4; i++)
            regs[i] = a->regs[i];
        struct dd_prof_stack_copy copy = {
            .regs = regs, .data = a->data, .len = len, .wanted = a->wanted};
        return dd_prof_unwind(p->unwinder, &copy, frames, DD_PROF_MAX_FRAMES);
    }
    uint32_t n = (uint32_t)(len / sizeof(uint64_t));
    if (n > DD_PROF_MAX_FRAMES)
        n = DD_PROF_MAX_FRAMES;
    for (uint32_t i = 0; i < n; i++) {
        __u64 f;
        memcpy(&f, a->data + i * sizeof f, sizeof f);
        frames[i] = f;
    }
    return n;
}

static int on_event(void *ctx, void *data, size_t size)
{
    struct prof *p = ctx;
    const struct dd_prof_event_head *h = data;
    p->events++;
    p->event_bytes += size;
    if (size < sizeof *h)
        return 0;
    struct dd_prof_sample sample = {.ptr = h->ptr, .ts_ns = h->ts_ns, .tgid = h->tgid};
    if (h->type == DD_PROF_EV_FREE) {
        dd_prof_table_free_block(&p->table, &sample);
    } else if (h->type == DD_PROF_EV_ALLOC &&
               size >= offsetof(struct dd_prof_alloc_event, data)) {
        const struct dd_prof_alloc_event *a = data;
        uint64_t frames[DD_PROF_MAX_FRAMES];
        uint32_t n = frames_of(p, a, size - offsetof(struct dd_prof_alloc_event, data), frames);
        sample.size = a->size;
        sample.weight = a->weight;
        if (h->ptr != 0 && dd_prof_table_alloc(&p->table, &sample, frames, n))
            p->oom = true;
    }
    return 0;
}

int64_t dd_prof_now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int dd_prof_setup_bpf(struct prof *p)
{
    libbpf_set_print(p->opt.verbose ? libbpf_all : libbpf_quiet);
    p->skel = ddheap_prof_bpf__open();
    if (p->skel == NULL) {
        fprintf(stderr, "ddheap-prof: cannot open the BPF object: %s\n", strerror(errno));
        return -1;
    }
    p->skel->rodata->target_tgid = (uint32_t)p->pid;
    p->skel->rodata->stack_bytes = p->opt.unwind_fp ? 0 : (uint32_t)p->opt.stack_bytes;
    int cpus = libbpf_num_possible_cpus();
    if (!p->opt.unwind_fp) {
        p->unwinder = dd_prof_unwinder_new(&p->objs, p->pid);
        if (p->unwinder == NULL) {
            fprintf(stderr, "ddheap-prof: out of memory\n");
            return -1;
        }
    }
    /* A ring buffer's size is a power of two, at least a page. */
    unsigned long bytes = 4096;
    while (bytes < p->opt.ringbuf_kb * 1024)
        bytes <<= 1;
    p->skel->rodata->wake_bytes = bytes / 4;
    if (cpus <= 0 || bpf_map__set_max_entries(p->skel->maps.scratch, (uint32_t)cpus) != 0 ||
        bpf_map__set_max_entries(p->skel->maps.events, (uint32_t)bytes) != 0 ||
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

/* -v: what the programs cost in the kernel, when the kernel counts it
 * (sysctl kernel.bpf_stats_enabled=1), and what they sent. */
static void print_costs(struct prof *p)
{
    struct bpf_program *progs[2] = {p->skel->progs.on_alloc, p->skel->progs.on_free};
    for (int i = 0; i < 2; i++) {
        struct bpf_prog_info info;
        __u32 len = sizeof info;
        memset(&info, 0, sizeof info);
        if (bpf_obj_get_info_by_fd(bpf_program__fd(progs[i]), &info, &len) == 0 &&
            info.run_cnt > 0)
            fprintf(stderr, "ddheap-prof: %s: %llu runs, %.2f us each in the kernel\n",
                    bpf_program__name(progs[i]), (unsigned long long)info.run_cnt,
                    (double)info.run_time_ns / 1e3 / (double)info.run_cnt);
    }
    fprintf(stderr, "ddheap-prof: ring buffer: %llu events, %llu bytes (%.0f bytes each)\n",
            (unsigned long long)p->events, (unsigned long long)p->event_bytes,
            p->events ? (double)p->event_bytes / (double)p->events : 0.0);
}

void dd_prof_teardown_bpf(struct prof *p)
{
    if (p->skel && p->opt.verbose)
        print_costs(p);
    if (p->unwinder && p->opt.verbose) {
        const struct dd_prof_unwind_stats *st = dd_prof_unwind_stats(p->unwinder);
        fprintf(stderr,
                "ddheap-prof: unwound %llu stacks (%llu truncated), %.1f frames and %.1f us each\n",
                (unsigned long long)st->stacks, (unsigned long long)st->truncated,
                st->stacks ? (double)st->frames / (double)st->stacks : 0.0,
                st->stacks ? (double)st->ns / 1e3 / (double)st->stacks : 0.0);
    }
    dd_prof_unwinder_free(p->unwinder);
    p->unwinder = NULL;
    ring_buffer__free(p->rb);
    ddheap_prof_bpf__destroy(p->skel);
}

/* Runs until Ctrl-C, -d, the process's end or a failure (prof.h). */
bool dd_prof_run_loop(struct prof *p, bool *exited, int *status, bool *exec_seen)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
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

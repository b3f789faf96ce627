/*
 * The BPF side and the event loop: loads the programs of
 * ddheap_prof.bpf.c, attaches the process tracepoints, opens the ring
 * buffers, and feeds each event into the table (table.h), or to process.c
 * for forks, execs, exits and loader events, until the run ends,
 * rescanning the processes' mappings for objects loaded later.
 */
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
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
#include "grow.h"
#include "prof.h"

#define RESCAN_MS 200
/* A stack's native frames and its interpreter's, with a truncation mark. */
#define DD_PROF_MAX_MERGED (DD_PROF_MAX_FRAMES + DD_PROF_MAX_INTERP_FRAMES + 2)
#define DRAIN_MS 50
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

/* -v: everything libbpf says, the verifier's log included. */
static int libbpf_all(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    (void)level;
    return vfprintf(stderr, fmt, ap);
}

/* An unwinding session's rescan (unwind.h): the process's maps, read
 * again, and any new object with probes attached. */
static bool rescan_for_unwinder(void *arg, pid_t pid)
{
    struct prof *p = arg;
    struct dd_prof_proc *proc = dd_prof_proc_of(p, pid); /* there: the session is its */
    if (proc == NULL)
        return false;
    size_t before = proc->objs.n;
    dd_prof_rescan(p, proc);
    return proc->objs.n > before;
}

/* The frames of an alloc event of the process: the kernel's walk as it
 * came, or the copied stack unwound here with the process's own objects.
 * Returns how many. */
static uint32_t frames_of(struct prof *p, struct dd_prof_proc *proc,
                          const struct dd_prof_alloc_event *a, size_t data_len, uint64_t *frames)
{
    size_t len = a->len < data_len ? a->len : data_len;
    if (a->kind == DD_PROF_STACK_COPY) {
        if (proc == NULL || p->opt.unwind_fp)
            return 0;
        /* __u64 is unsigned long long, uint64_t unsigned long here: copy
         * rather than read one through the other. */
        uint64_t regs[4];
        for (int i = 0; i < 4; i++)
            regs[i] = a->regs[i];
        struct dd_prof_stack_copy copy = {
            .regs = regs, .data = a->data, .len = len, .wanted = a->wanted};
        uint32_t n = dd_prof_unwind(&proc->unwinder, proc->tgid, &proc->objs, &copy, frames,
                                    DD_PROF_MAX_FRAMES);
        if (n == 0)
            p->oom = true;
        return n;
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

void dd_prof_note_exit(struct prof *p, pid_t tgid, uint64_t ts_ns)
{
    if (tgid == p->pid)
        return;
    if (dd_prof_grow(&p->exits, &p->exits_cap, p->nexits + 1, sizeof *p->exits) != 0) {
        p->oom = true;
        return;
    }
    /* They come nearly in time order (one ring buffer, stamped as they
     * are written): an insertion from the end. */
    size_t i = p->nexits++;
    while (i > 0 && p->exits[i - 1].ts_ns > ts_ns) {
        p->exits[i] = p->exits[i - 1];
        i--;
    }
    p->exits[i] = (struct pending_exit){(uint32_t)tgid, ts_ns};
}

static void apply_exit(struct prof *p, uint32_t tgid, uint64_t ts_ns)
{
    struct dd_prof_proc *proc = dd_prof_proc_of(p, (pid_t)tgid);
    if (proc == NULL || dd_prof_table_process_exit(&p->table, tgid, ts_ns) < 0) {
        p->oom = true;
        return;
    }
    proc->exit_applied = true;
    p->exits_applied++;
}

/* Every exit stamped at or before ts_ns is applied, each after the
 * snapshots due before it: the table then is the state just before ts_ns. */
static void advance_to(struct prof *p, uint64_t ts_ns)
{
    size_t done = 0;
    for (; done < p->nexits && p->exits[done].ts_ns <= ts_ns; done++) {
        dd_prof_snapshots_before(p, p->exits[done].ts_ns);
        apply_exit(p, p->exits[done].tgid, p->exits[done].ts_ns);
    }
    if (done > 0) {
        memmove(p->exits, p->exits + done, (p->nexits - done) * sizeof *p->exits);
        p->nexits -= done;
    }
    dd_prof_snapshots_before(p, ts_ns);
}

static void apply_deferred(struct prof *p);

void dd_prof_apply_exits(struct prof *p)
{
    p->horizon_ns = UINT64_MAX;
    apply_deferred(p);
    if (p->nexits > 0)
        advance_to(p, p->exits[p->nexits - 1].ts_ns);
}

/* One event into the table, after the exits and snapshots due before it. */
static void apply_event(struct prof *p, uint32_t type, const struct dd_prof_sample *sample,
                        const uint64_t *frames, uint32_t n)
{
    advance_to(p, sample->ts_ns);
    if (type == DD_PROF_EV_FREE) {
        if (dd_prof_table_free_block(&p->table, sample))
            p->oom = true;
        return;
    }
    if (sample->ptr == 0)
        return;
    struct dd_prof_proc *proc = dd_prof_proc_of(p, (pid_t)sample->tgid);
    if (proc == NULL || dd_prof_table_alloc(&p->table, sample, frames, n)) {
        p->oom = true;
        return;
    }
    /* An event that came after its process's exit was applied (stamped
     * before it, read after): what it allocated is gone with the process
     * too. */
    if (proc->exit_applied &&
        dd_prof_table_process_exit(&p->table, sample->tgid, sample->ts_ns) < 0)
        p->oom = true;
}

/* Applies the events kept back (in the order read) that are no later
 * than the horizon; the rest stay. */
static void apply_deferred(struct prof *p)
{
    if (p->ndeferred == 0 || p->deferred_first_ns > p->horizon_ns)
        return; /* nothing kept is due yet */
    size_t kept = 0;
    uint64_t first = UINT64_MAX;
    for (size_t i = 0; i < p->ndeferred; i++) {
        struct deferred_event *d = &p->deferred[i];
        if (d->sample.ts_ns > p->horizon_ns) {
            if (d->sample.ts_ns < first)
                first = d->sample.ts_ns;
            p->deferred[kept++] = *d;
            continue;
        }
        apply_event(p, d->type, &d->sample, d->frames, d->nframes);
        free(d->frames);
    }
    p->ndeferred = kept;
    p->deferred_first_ns = first;
}

/* Keeps an event stamped after the horizon for a later consume. */
static void defer_event(struct prof *p, uint32_t type, const struct dd_prof_sample *sample,
                        const uint64_t *frames, uint32_t n)
{
    if (dd_prof_grow(&p->deferred, &p->deferred_cap, p->ndeferred + 1, sizeof *p->deferred) != 0) {
        p->oom = true;
        return;
    }
    uint64_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy == NULL) {
        p->oom = true;
        return;
    }
    memcpy(copy, frames, n * sizeof *frames);
    p->deferred[p->ndeferred++] = (struct deferred_event){*sample, type, n, copy};
    if (p->ndeferred == 1 || sample->ts_ns < p->deferred_first_ns)
        p->deferred_first_ns = sample->ts_ns;
}

/* An allocation or free event. The live heap is a sum over processes, so
 * an exit must be applied before the events of others stamped after it:
 * an exit stamped before the horizon (the instant the consume began) has
 * been read, one after it may not have been; an event stamped after the
 * horizon waits for the next consume, which reads the exits first. */
/* The native frames of an alloc event with its interpreter frames
 * merged in (interp.h), into merged[DD_PROF_MAX_MERGED]. */
static uint32_t with_interpreter_frames(struct prof *p, struct dd_prof_proc *proc,
                                        const struct dd_prof_alloc_event *a, size_t data_len,
                                        const uint64_t *native, uint32_t n, uint64_t *merged)
{
    size_t at = DD_PROF_INTERP_AT((size_t)a->len);
    uint32_t count = a->ninterp;
    if (at > data_len || count > (data_len - at) / sizeof(struct dd_prof_interp_frame))
        count = 0;
    struct dd_prof_interp_frame frames[DD_PROF_MAX_INTERP_FRAMES];
    if (count > DD_PROF_MAX_INTERP_FRAMES)
        count = DD_PROF_MAX_INTERP_FRAMES;
    memcpy(frames, a->data + at, count * sizeof *frames);
    bool disable;
    uint32_t m = dd_prof_interp_merge(proc->interp, proc->tgid, native, n, frames, count,
                                      a->interp_flags & DD_PROF_INTERP_CUT, merged,
                                      DD_PROF_MAX_MERGED, &disable);
    if (disable)
        dd_prof_stop_interpreter_walk(p, proc);
    return m;
}

/* A code object seen for the first time: its process's interpreter names
 * it now, while it is there. */
static int on_code_event(void *ctx, void *data, size_t size)
{
    struct prof *p = ctx;
    const struct dd_prof_code_event *c = data;
    if (size < sizeof *c)
        return 0;
    struct dd_prof_proc *proc = dd_prof_proc_of(p, (pid_t)c->head.tgid);
    if (proc && proc->interp)
        dd_prof_interp_note_code(proc->interp, proc->tgid, &c->frame);
    return 0;
}

static int on_event(void *ctx, void *data, size_t size)
{
    struct prof *p = ctx;
    const struct dd_prof_event_head *h = data;
    p->events++;
    p->event_bytes += size;
    if (size < sizeof *h)
        return 0;
    apply_deferred(p); /* scans only when a kept event is due */
    struct dd_prof_sample sample = {.ptr = h->ptr, .ts_ns = h->ts_ns, .tgid = h->tgid};
    uint64_t frames[DD_PROF_MAX_MERGED];
    uint32_t n = 0;
    if (h->type == DD_PROF_EV_ALLOC && size >= offsetof(struct dd_prof_alloc_event, data)) {
        const struct dd_prof_alloc_event *a = data;
        /* (Found before the unwinding, whose rescan adds no process.) */
        struct dd_prof_proc *proc = dd_prof_proc_of(p, (pid_t)h->tgid);
        if (proc != NULL && !proc->known) {
            /* A process forked while this read goes on (a long one, of
             * many stacks) sends its allocations, and may exit, before
             * its fork event is read: read the process events now, so it
             * has its parent's objects (its maps may be gone already).
             * Once per process. */
            proc->known = true;
            ring_buffer__consume(p->proc_rb);
            proc = dd_prof_proc_of(p, (pid_t)h->tgid); /* the array may have moved */
        }
        if (proc == NULL) {
            p->oom = true;
            return 0;
        }
        proc->samples++;
        size_t data_len = size - offsetof(struct dd_prof_alloc_event, data);
        uint64_t native[DD_PROF_MAX_FRAMES];
        n = frames_of(p, proc, a, data_len, native);
        if (proc->interp && a->ninterp > 0) {
            /* Code first seen since: named before this sample, which
             * may be long after it was taken. */
            ring_buffer__consume(p->code_rb);
            n = with_interpreter_frames(p, proc, a, data_len, native, n, frames);
        } else {
            memcpy(frames, native, n * sizeof *native);
        }
        sample.size = a->size;
        sample.weight = a->weight;
    } else if (h->type != DD_PROF_EV_FREE) {
        return 0;
    }
    if (h->ts_ns > p->horizon_ns)
        defer_event(p, h->type, &sample, frames, n);
    else
        apply_event(p, h->type, &sample, frames, n);
    return 0;
}

/* Naming the stacks (symbolize.h) is the reader's background work, done
 * between reads while the process's objects are mapped and its files are
 * where they were, so that a profile written later finds every address
 * named. Events come first, and one stack can take tens of milliseconds
 * to name (the first frame of a library with debug info: its DWARF is
 * read then). So naming runs only while the processes' rate limit bounds
 * a burst of one process to what the buffer holds for NAMING_STALL_NS
 * (the default, 3000 samples a second at 16 KiB of stack each, fills 16
 * MiB in a third of a second), when the buffer, at the rate the last read
 * found, would take NAMING_HEADROOM_NS or more to fill, and for
 * NAMING_BUDGET_NS at a time. Without a limit (exact mode fills 16 MiB in
 * milliseconds in a burst) naming waits for the end of the run: named in
 * the event handler, events were lost there. (Hazard: many processes
 * starting a burst together within one stall could still fill the
 * buffer; the loss is counted and said, like any other.) The table's
 * stacks are only ever appended, so those from p->stacks_named on are
 * the new ones. */
#define NAMING_BUDGET_NS 5000000LL
#define NAMING_HEADROOM_NS 1000000000LL
#define NAMING_STALL_NS 250000000LL

static bool room_to_name(struct prof *p, uint64_t bytes_just_read, int64_t now)
{
    int64_t since = now - p->last_read_ns;
    p->last_read_ns = now;
    uint64_t size = (uint64_t)p->opt.ringbuf_kb * 1024;
    /* The most a burst can send while a stack is named: an alloc event
     * (its stack copy) and a free a sample, at the limit, for
     * NAMING_STALL_NS. No limit, or one so high that this overflows the
     * buffer: bursts cannot be foreseen, naming waits for the end. */
    uint64_t per_sample = p->opt.stack_bytes + 2 * 256;
    double burst = (double)p->samples_per_second * (double)per_sample * NAMING_STALL_NS / 1e9;
    if (p->samples_per_second == 0 || burst > (double)size)
        return false;
    if (bytes_just_read == 0)
        return true;
    if (bytes_just_read >= size || since <= 0)
        return false;
    /* (size - read) / (read / since) >= headroom, without dividing. */
    return (double)(size - bytes_just_read) * (double)since >=
           (double)NAMING_HEADROOM_NS * (double)bytes_just_read;
}

static void name_new_stacks(struct prof *p, uint64_t bytes_just_read)
{
    int64_t now = dd_prof_now_ns(CLOCK_MONOTONIC);
    if (!room_to_name(p, bytes_just_read, now))
        return;
    int64_t until = now + NAMING_BUDGET_NS;
    while (p->stacks_named < p->table.nstacks && dd_prof_now_ns(CLOCK_MONOTONIC) < until) {
        const struct dd_prof_stack *s = &p->table.stacks[p->stacks_named++];
        struct dd_prof_proc *proc = dd_prof_proc_of(p, (pid_t)s->tgid);
        if (proc != NULL)
            dd_prof_symbolize_ahead(&proc->objs, s->frames, s->nframes);
    }
}

/* A consume of both ring buffers, with the horizon set at its start;
 * then every kept event and exit up to the horizon is applied. Returns
 * what ring_buffer__consume does. (New interpreter code first: named
 * while it is there.) */
static int consume(struct prof *p)
{
    ring_buffer__consume(p->code_rb);
    p->horizon_ns = (uint64_t)dd_prof_now_ns(CLOCK_MONOTONIC);
    int got = ring_buffer__consume(p->rb);
    apply_deferred(p);
    advance_to(p, p->horizon_ns);
    return got;
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
    libbpf_set_print(p->opt.verbose ? libbpf_all : libbpf_quiet);
    dd_prof_unwind_setup(&p->unwind_stats, rescan_for_unwinder, p);
    p->skel = ddheap_prof_bpf__open();
    if (p->skel == NULL) {
        fprintf(stderr, "ddheap-prof: cannot open the BPF object: %s\n", strerror(errno));
        return -1;
    }
    p->skel->rodata->follow_children = p->opt.follow;
    p->skel->rodata->exec_all = p->opt.all;
    p->skel->rodata->stop_forked_at_exec = p->opt.follow && !p->opt.all;
    p->skel->rodata->stack_bytes = p->opt.unwind_fp ? 0 : (uint32_t)p->opt.stack_bytes;
    int cpus = libbpf_num_possible_cpus();
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
    /* The process events first: each consume reads a fork before the
     * allocations of the child it made. */
    p->rb = ring_buffer__new(bpf_map__fd(p->skel->maps.proc_events), dd_prof_on_proc_event, p,
                             NULL);
    /* Both share the process events' consumer position (in the ring's
     * own page): what one reads, the other does not read again. */
    p->proc_rb = ring_buffer__new(bpf_map__fd(p->skel->maps.proc_events), dd_prof_on_proc_event,
                                  p, NULL);
    p->code_rb =
        ring_buffer__new(bpf_map__fd(p->skel->maps.code_events), on_code_event, p, NULL);
    if (p->rb == NULL || p->proc_rb == NULL || p->code_rb == NULL ||
        ring_buffer__add(p->rb, bpf_map__fd(p->skel->maps.events), on_event, p) != 0) {
        fprintf(stderr, "ddheap-prof: cannot open the ring buffer: %s\n", strerror(errno));
        return -1;
    }
    struct bpf_program *tracepoints[] = {p->opt.follow ? p->skel->progs.on_fork : NULL,
                                         p->skel->progs.on_exec, p->skel->progs.on_exit};
    for (size_t i = 0; i < sizeof tracepoints / sizeof *tracepoints; i++) {
        if (tracepoints[i] == NULL)
            continue;
        struct bpf_link *l = bpf_program__attach(tracepoints[i]);
        if (l == NULL) {
            fprintf(stderr, "ddheap-prof: cannot attach %s: %s\n",
                    bpf_program__name(tracepoints[i]), strerror(errno));
            return -1;
        }
        p->tracepoint_links[i] = l;
    }
    return 0;
}

void dd_prof_no_more_stops(struct prof *p)
{
    p->skel->bss->no_more_stops = true;
}

int dd_prof_follow(struct prof *p, pid_t tgid, uint32_t flags)
{
    uint32_t key = (uint32_t)tgid;
    return bpf_map__update_elem(p->skel->maps.followed, &key, sizeof key, &flags, sizeof flags,
                                BPF_ANY);
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
    if (p->skel->bss->lost_code)
        fprintf(stderr, "ddheap-prof: interpreter code announcements lost: %llu\n",
                (unsigned long long)p->skel->bss->lost_code);
    fprintf(stderr, "ddheap-prof: ring buffer: %llu events, %llu bytes (%.0f bytes each)\n",
            (unsigned long long)p->events, (unsigned long long)p->event_bytes,
            p->events ? (double)p->event_bytes / (double)p->events : 0.0);
}

void dd_prof_teardown_bpf(struct prof *p)
{
    if (p->skel && p->opt.verbose)
        print_costs(p);
    const struct dd_prof_unwind_stats *st = &p->unwind_stats;
    if (!p->opt.unwind_fp && p->opt.verbose)
        fprintf(stderr,
                "ddheap-prof: unwound %llu stacks (%llu truncated), %.1f frames and %.1f us each\n",
                (unsigned long long)st->stacks, (unsigned long long)st->truncated,
                st->stacks ? (double)st->frames / (double)st->stacks : 0.0,
                st->stacks ? (double)st->ns / 1e3 / (double)st->stacks : 0.0);
    if (!p->opt.unwind_fp && st->checked)
        fprintf(stderr, "ddheap-prof: unwinding checked on %llu stacks: %llu differ\n",
                (unsigned long long)st->checked, (unsigned long long)st->mismatched);
    for (size_t i = 0; i < p->proc_ids.n; i++) {
        dd_prof_unwinder_release(p->procs[i].unwinder.session);
        p->procs[i].unwinder.session = NULL;
    }
    dd_prof_unwinders_free();
    for (size_t i = 0; i < sizeof p->tracepoint_links / sizeof *p->tracepoint_links; i++)
        bpf_link__destroy(p->tracepoint_links[i]);
    ring_buffer__free(p->rb);
    ring_buffer__free(p->proc_rb);
    ring_buffer__free(p->code_rb);
    ddheap_prof_bpf__destroy(p->skel);
}

/* Frees the unwinding sessions of the processes that have exited: their
 * last allocations were made before their exit event, and a consume reads
 * the process events first, then the allocations, each buffer up to what
 * it holds then, so the one that read the exit has read them too. (One
 * read later anyway would only start a new session.) What stays of a
 * process is its objects, for symbolising. */
static void end_sessions_of_gone(struct prof *p)
{
    for (size_t i = 0; i < p->proc_ids.n; i++) {
        if (p->procs[i].gone && p->procs[i].unwinder.session) {
            dd_prof_unwinder_release(p->procs[i].unwinder.session);
            p->procs[i].unwinder.session = NULL;
        }
    }
}

/* Whether the target has ended: our command has exited (its pidfd says
 * so at once), or the -p process is gone (its exit event says so at once;
 * /proc, which also tells a zombie, is asked only when `ask_proc`: a
 * read of /proc/PID/stat at every wake-up was a third of what an idle
 * ddheap-prof cost). */
static bool target_ended(struct prof *p, bool pidfd_ready, bool ask_proc, int *status)
{
    if (p->opt.all)
        return false;
    if (p->child)
        return pidfd_ready && dd_prof_reap_command(p, status);
    struct dd_prof_proc *target = dd_prof_proc_of(p, p->pid);
    return (target && target->gone) || (ask_proc && dd_prof_process_gone(p->pid));
}

/* Runs until Ctrl-C, -d, the process's end or a failure (prof.h). */
bool dd_prof_run_loop(struct prof *p, bool *exited, int *status)
{
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* The run's clock starts now, for the table's checkpoints. */
    dd_prof_table_advance(&p->table, (uint64_t)p->started_mono);
    int64_t deadline =
        p->opt.duration > 0 ? p->started_mono + (int64_t)(p->opt.duration * 1e9) : 0;
    p->last_read_ns = dd_prof_now_ns(CLOCK_MONOTONIC);
    int64_t next_scan = p->last_read_ns + RESCAN_MS * 1000000LL;
    bool cut_short = false;
    /* With --http the server goes on after the target's end, until
     * stopped: its last profile is still served. */
    bool serving = p->http != NULL, said_ended = false, said_dropped = false;
    /* Woken by the process events (each wakes the reader), by allocation
     * events once a quarter of their buffer waits, by the command's exit,
     * by a client of --http; otherwise every DRAIN_MS to read what waits. */
    struct pollfd fds[4] = {{.fd = ring_buffer__epoll_fd(p->rb), .events = POLLIN},
                            {.fd = p->child ? p->child_pidfd : -1, .events = POLLIN},
                            {.fd = ring_buffer__epoll_fd(p->code_rb), .events = POLLIN},
                            {.fd = dd_prof_http_fd(p), .events = POLLIN}};
    while (!stop_requested && !(*exited && !serving) && !p->oom) {
        int64_t now = dd_prof_now_ns(CLOCK_MONOTONIC);
        int64_t wait_ns = DRAIN_MS * 1000000LL;
        if (deadline && deadline - now < wait_ns)
            wait_ns = deadline - now > 0 ? deadline - now : 0;
        wait_ns = dd_prof_host_wait_ns(p, now, dd_prof_http_wait_ns(p, now, wait_ns));
        int ready = poll(fds, 4, (int)((wait_ns + 999999) / 1000000));
        if (ready < 0 && errno != EINTR) {
            fprintf(stderr, "ddheap-prof: poll: %s\n", strerror(errno));
            cut_short = true;
            break;
        }
        uint64_t bytes_before = p->event_bytes;
        int got = consume(p);
        if (got < 0 && got != -EINTR) {
            fprintf(stderr, "ddheap-prof: reading the ring buffer: %s\n", strerror(-got));
            cut_short = true;
            break;
        }
        name_new_stacks(p, p->event_bytes - bytes_before);
        end_sessions_of_gone(p);
        now = dd_prof_now_ns(CLOCK_MONOTONIC);
        dd_prof_host_poll(p, now);
        if (p->table.dropped && !said_dropped) {
            fprintf(stderr, "ddheap-prof: a cap is reached (--max-blocks %zu, --max-stacks %zu): "
                            "samples beyond are dropped from now on, and counted\n",
                    p->opt.max_live, p->opt.max_stacks);
            said_dropped = true;
        }
        if (!*exited) {
            *exited = target_ended(p, ready > 0 && (fds[1].revents & POLLIN), now >= next_scan,
                                   status);
            if (*exited)
                fds[1].fd = -1; /* reaped: it would stay readable */
        }
        if (*exited && serving && !said_ended) {
            fprintf(stderr, "ddheap-prof: pid %d has ended; its profile is served until "
                            "ddheap-prof is stopped\n", (int)p->pid);
            said_ended = true;
        }
        /* Requests see the table with every event read so far, and the
         * exits stamped before them (as a snapshot does): without events
         * after it, an exit would wait for the end to be applied. */
        if (serving)
            advance_to(p, (uint64_t)(now - SNAPSHOT_SLACK_NS));
        dd_prof_http_run(p);
        if (deadline && now >= deadline) {
            p->interrupted = true;
            break;
        }
        /* A snapshot no event came after: once the buffer is drained,
         * every event stamped before it has been applied (an event still
         * being written on another CPU lands in the next one). */
        if (snapshot_requested || dd_prof_snapshot_due(p, now - SNAPSHOT_SLACK_NS)) {
            consume(p);
            if (dd_prof_snapshot_due(p, now - SNAPSHOT_SLACK_NS))
                advance_to(p, (uint64_t)(now - SNAPSHOT_SLACK_NS));
            if (snapshot_requested) {
                dd_prof_apply_exits(p);
                snapshot_requested = 0;
                dd_prof_snapshot_now(p, dd_prof_now_ns(CLOCK_MONOTONIC));
            }
        }
        if (!*exited && now >= next_scan) {
            dd_prof_rescan_all(p);
            next_scan = now + RESCAN_MS * 1000000LL;
        }
    }
    if (stop_requested)
        p->interrupted = true;
    /* The processes that still run (-p, -d, Ctrl-C) said what they had to. */
    for (size_t i = 0; i < p->proc_ids.n; i++)
        if (!p->procs[i].gone)
            dd_prof_read_library_status(p, &p->procs[i]);
    /* Everything the programs wrote before the end is in the buffers. */
    ring_buffer__consume(p->rb);
    dd_prof_apply_exits(p);
    if (p->oom) {
        fprintf(stderr, "ddheap-prof: out of memory: the profile stops here\n");
        cut_short = true;
    }
    return cut_short;
}

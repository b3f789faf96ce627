/*
 * ddheap-prof: a heap profiler for ddheap-instrumented processes, on
 * libbpf. It attaches USDT programs (ddheap_prof.bpf.c) to the `alloc`
 * and `free` probes of every object that carries them in the processes
 * it follows (the command or -p PID, and with -f the ones they fork),
 * keeps the live sampled blocks in user space (table.h), and at the end
 * writes a gzipped pprof profile, and optionally folded stacks and a
 * flame-graph SVG. docs/ddheap-prof.md is the user's guide; prof.h says
 * which file does which part of the run.
 *
 *   ddheap-prof [-p PID | -- CMD ARGS...] [-f | --no-follow] [-d SECONDS]
 *               [-o FILE.pb.gz] [--svg FILE] [--folded FILE]
 *               [--provider ddheap|otel_memory]
 *
 * This file is the order of a run: options, outputs, the process, the
 * BPF side, attaching, the loop, the outputs.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "prof.h"

/* The name of the command's program: the image it last exec'd (ddheap-run,
 * env or a shell exec the real one). */
static const char *program_name(struct prof *p)
{
    struct dd_prof_proc *proc = dd_prof_proc_of(p, p->pid);
    return proc && proc->name ? proc->name : p->opt.cmd[0];
}

/* Says how a started command ended, if not with status 0; returns the
 * status to pass on, as a shell would: its exit code, or 128 + signal. */
static int command_status(struct prof *p, int status)
{
    if (WIFSIGNALED(status)) {
        fprintf(stderr, "ddheap-prof: %s (pid %d) was killed by signal %d\n", program_name(p),
                (int)p->pid, WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "ddheap-prof: %s (pid %d) exited with status %d\n", program_name(p),
                (int)p->pid, WEXITSTATUS(status));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static void free_run(struct prof *p)
{
    dd_prof_http_stop(p);
    dd_prof_host_free(p);
    dd_prof_teardown_bpf(p);
    for (size_t i = 0; i < p->proc_ids.n; i++) {
        dd_prof_objects_free(&p->procs[i].objs);
        dd_prof_interp_free(p->procs[i].interp);
        dd_prof_proc_free_names(&p->procs[i]);
    }
    dd_prof_interp_names_free();
    free(p->procs);
    dd_prof_files_free();
    dd_prof_keys_free(&p->proc_ids);
    dd_prof_table_free(&p->table);
    free(p->exits);
    for (size_t i = 0; i < p->ndeferred; i++)
        free(p->deferred[i].frames);
    free(p->deferred);
    free(p->links);
    free(p->link_pids);
    free(p->attached);
    free(p->loader_hooked);
    free(p->sem_files);
    dd_prof_snapshots_free(p);
}

/* Names the processes that ran, for a run that never found a probe. */
static void report_no_probes(struct prof *p)
{
    if (!p->child) {
        fprintf(stderr, "ddheap-prof: process %d never mapped an object with %s:alloc probes "
                        "(is it linked with libddheap, or run with libddheap_preload.so?)\n",
                (int)p->pid, p->opt.provider);
        return;
    }
    fprintf(stderr, "ddheap-prof: %s (pid %d", program_name(p), (int)p->pid);
    size_t others = p->proc_ids.n - 1;
    if (others)
        fprintf(stderr, ", and the %zu process%s it started", others, others == 1 ? "" : "es");
    fprintf(stderr, ") never mapped an object with %s:alloc probes (is it linked with libddheap, "
                    "or run with libddheap_preload.so?); no profile written\n",
            p->opt.provider);
}

int main(int argc, char **argv)
{
    static struct prof p;
    dd_prof_parse_options(argc, argv, &p.opt);
    dd_prof_snapshots_setup(&p);
    dd_prof_catch_snapshot_signal();
    dd_prof_objects_set_provider(p.opt.provider);
    dd_prof_table_init(&p.table);
    p.table.max_live = p.opt.max_live;
    p.table.max_stacks = p.opt.max_stacks;
    /* Raised by the processes found (host.c): the library's default. */
    p.samples_per_second = DD_PROF_DEFAULT_SAMPLES_PER_SECOND;
    if (geteuid() != 0) {
        fprintf(stderr, "ddheap-prof: must run as root (it loads BPF programs and attaches "
                        "uprobes)\n");
        return 1;
    }
    if (p.opt.pid && dd_prof_process_gone(p.opt.pid)) {
        fprintf(stderr, "ddheap-prof: no process with pid %d\n", (int)p.opt.pid);
        return 1;
    }
    pid_t tgid = p.opt.pid ? dd_prof_tgid_of(p.opt.pid) : 0;
    if (tgid && tgid != p.opt.pid) {
        /* A thread id (ps -L, top -H, gettid()): the heap is its process's. */
        fprintf(stderr, "ddheap-prof: %d is a thread of process %d; profiling the process\n",
                (int)p.opt.pid, (int)tgid);
        p.opt.pid = tgid;
    }
    dd_prof_record_signals();
    /* A server or an agent writes no file unless asked to. */
    bool want_files = !(p.opt.http_addr || p.opt.all) || p.opt.files_asked;
    struct outputs files = {0};
    if (want_files)
        dd_prof_open_outputs(&p.opt, &files);
    signal(SIGPIPE, SIG_IGN);
    /* Listening before anything is attached: a port in use fails now. */
    if (p.opt.http_addr && dd_prof_http_start(&p) != 0)
        return 1;

    p.child = p.opt.cmd != NULL;
    p.child_pidfd = -1;
    p.agent_fd = -1;
    p.pid = p.opt.pid;
    if (dd_prof_setup_bpf(&p) != 0)
        return 1;
    dd_prof_guardian_start(&p);
    p.started_realtime = dd_prof_now_ns(CLOCK_REALTIME);
    p.started_mono = dd_prof_now_ns(CLOCK_MONOTONIC);
    if (p.opt.all) {
        if (dd_prof_host_start(&p) != 0)
            return 1;
    } else if (p.child) {
        /* Stopped at its exec; the loop attaches and lets it go. */
        int rc = dd_prof_start_command(&p);
        if (rc == 0)
            rc = dd_prof_release_command(&p);
        if (rc != 0)
            return rc;
    } else {
        struct dd_prof_proc *target = dd_prof_proc_of(&p, p.pid);
        if (target == NULL || dd_prof_follow(&p, p.pid, 0) != 0) {
            fprintf(stderr, "ddheap-prof: cannot follow pid %d\n", (int)p.pid);
            return 1;
        }
        if (dd_prof_rescan(&p, target) < 0) {
            fprintf(stderr, "ddheap-prof: cannot read the mappings of pid %d: %s\n", (int)p.pid,
                    strerror(errno));
            return 1;
        }
        if (dd_prof_inject_agent(&p, target) != 0)
            return 1;
        if (p.nattached == 0) {
            fprintf(stderr, "ddheap-prof: process %d has no %s:alloc probe in any object it "
                            "maps (is it linked with libddheap, or run with "
                            "libddheap_preload.so?)\n",
                    (int)p.pid, p.opt.provider);
            return 1;
        }
        p.interval = dd_prof_interval_of(p.pid, &p.samples_per_second);
    }
    if (p.opt.all)
        fprintf(stderr, "ddheap-prof: profiling every process with %s probes; Ctrl-C to stop\n",
                p.opt.provider);
    else
        fprintf(stderr, "ddheap-prof: profiling pid %d%s; Ctrl-C to stop\n", (int)p.pid,
                p.opt.follow ? " and the processes it starts" : "");

    /* A run cut short (the ring buffer failed, memory ran out) still writes
     * what it has, and then exits non-zero: a partial profile is no success. */
    int child_status = 0;
    bool exited = false;
    bool cut_short = dd_prof_run_loop(&p, &exited, &child_status);
    dd_prof_report_library_status(&p);
    /* The command's status is passed on when its end ended the run (not
     * Ctrl-C or -d, after which it may still run, and runs free). */
    int rc = 0;
    if (p.child && !exited)
        dd_prof_let_go(&p);
    else if (p.child && (!p.interrupted || p.opt.http_addr))
        /* (Served on after its end: its status is still the one to pass
         * on when the server is stopped.) */
        rc = command_status(&p, child_status);
    dd_prof_release_agent(&p);
    dd_prof_http_stop(&p);
    if (p.table.dropped)
        fprintf(stderr, "ddheap-prof: %" PRIu64 " samples were dropped at the caps (--max-blocks "
                        "%zu, --max-stacks %zu)\n",
                p.table.dropped, p.opt.max_live, p.opt.max_stacks);
    if (p.nattached == 0 && !p.opt.all) {
        report_no_probes(&p);
        dd_prof_detach_all(&p);
        return rc ? rc : 1;
    }
    /* The outputs first, then the uprobes' removal (the slow part). */
    /* (--all forgets the files of the processes gone: nattached may be 0
     * with their profile to write.) */
    bool written = !want_files ||
                   ((p.nattached > 0 || p.opt.all) && dd_prof_write_outputs(&p, &files) == 0);
    dd_prof_detach_all(&p);
    free_run(&p);
    if (rc == 0 && (!written || cut_short))
        rc = 1;
    return rc;
}

/*
 * ddheap-prof: a heap profiler for ddheap-instrumented processes, on
 * libbpf. It attaches USDT programs (ddheap_prof.bpf.c) to the `alloc`
 * and `free` probes of every object of one process that carries them,
 * keeps the live sampled blocks in user space (table.h), and at the end
 * writes a gzipped pprof profile, and optionally folded stacks and a
 * flame-graph SVG. docs/ddheap-prof.md is the user's guide; prof.h says
 * which file does which part of the run.
 *
 *   ddheap-prof [-p PID | -- CMD ARGS...] [-d SECONDS] [-o FILE.pb.gz]
 *               [--svg FILE] [--folded FILE] [--provider ddheap|otel_memory]
 *
 * This file is the order of a run: options, outputs, the process, the
 * BPF side, attaching, the loop, the outputs.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "prof.h"

/* Says how a started command ended, if not with status 0. */
static void report_child_status(const struct prof *p, int status)
{
    if (WIFSIGNALED(status))
        fprintf(stderr, "ddheap-prof: %s was killed by signal %d\n", p->opt.cmd[0],
                WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "ddheap-prof: %s exited with status %d\n", p->opt.cmd[0],
                WEXITSTATUS(status));
}

/* Until the exec stop, a started child runs ddheap-prof's own image.
 * Returns false if it exited before its exec. */
static bool wait_for_exec(struct prof *p, bool *exited, int *status, bool *exec_seen)
{
    while (!*exec_seen && !*exited) {
        *exited = dd_prof_child_events(p, status, exec_seen);
        if (!*exited && !*exec_seen)
            nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    return *exec_seen;
}

static void free_run(struct prof *p)
{
    dd_prof_teardown_bpf(p);
    dd_prof_objects_free(&p->objs);
    dd_prof_table_free(&p->table);
    free(p->links);
    free(p->attached);
    dd_prof_snapshots_free(p);
}

int main(int argc, char **argv)
{
    static struct prof p;
    dd_prof_parse_options(argc, argv, &p.opt);
    dd_prof_snapshots_setup(&p);
    dd_prof_catch_snapshot_signal();
    dd_prof_objects_set_provider(p.opt.provider);
    dd_prof_table_init(&p.table);
    if (geteuid() != 0) {
        fprintf(stderr, "ddheap-prof: must run as root (it loads BPF programs and attaches "
                        "uprobes)\n");
        return 1;
    }
    if (p.opt.pid && dd_prof_process_gone(p.opt.pid)) {
        fprintf(stderr, "ddheap-prof: no process with pid %d\n", (int)p.opt.pid);
        return 1;
    }
    struct outputs files;
    dd_prof_open_outputs(&p.opt, &files);
    signal(SIGPIPE, SIG_IGN);

    p.child = p.opt.cmd != NULL;
    p.pid = p.child ? dd_prof_start_command(p.opt.cmd) : p.opt.pid;
    if (dd_prof_setup_bpf(&p) != 0) {
        if (p.child)
            kill(p.pid, SIGKILL);
        return 1;
    }
    p.started_realtime = dd_prof_now_ns(CLOCK_REALTIME);
    p.started_mono = dd_prof_now_ns(CLOCK_MONOTONIC);
    int child_status = 0;
    bool exited = false, exec_seen = false;
    if (p.child) {
        if (!wait_for_exec(&p, &exited, &child_status, &exec_seen)) {
            fprintf(stderr, "ddheap-prof: %s exited before it started\n", p.opt.cmd[0]);
            return 1;
        }
    } else if (dd_prof_rescan(&p) < 0) {
        fprintf(stderr, "ddheap-prof: cannot read the mappings of pid %d: %s\n", (int)p.pid,
                strerror(errno));
        return 1;
    }
    if (p.nattached == 0 && !p.child) {
        fprintf(stderr, "ddheap-prof: process %d has no %s:alloc probe in any object it maps "
                        "(is it linked with libddheap, or run with libddheap_preload.so?)\n",
                (int)p.pid, p.opt.provider);
        return 1;
    }
    p.interval = dd_prof_interval_of(p.pid);
    fprintf(stderr, "ddheap-prof: profiling pid %d; Ctrl-C to stop\n", (int)p.pid);

    /* A run cut short (the ring buffer failed, memory ran out) still writes
     * what it has, and then exits non-zero: a partial profile is no success. */
    bool cut_short = dd_prof_run_loop(&p, &exited, &child_status, &exec_seen);
    if (exited && p.child)
        report_child_status(&p, child_status);
    if (p.child && !exited)
        dd_prof_detach_child(&p);
    dd_prof_detach_all(&p);
    if (p.nattached == 0) {
        fprintf(stderr, "ddheap-prof: process %d (%s) never mapped an object with %s:alloc "
                        "probes (is it linked with libddheap, or run with libddheap_preload.so?)\n",
                (int)p.pid, p.opt.cmd[0], p.opt.provider);
        return 1;
    }
    int rc = dd_prof_write_outputs(&p, &files);
    free_run(&p);
    return rc == 0 && !cut_short ? 0 : 1;
}

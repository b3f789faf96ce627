/*
 * One run of ddheap-prof: its options and its state, shared by the parts
 * that each do one job (main.c runs them in order):
 *
 *   cli.c      the command line
 *   process.c  starting the command, following it, letting it go
 *   attach.c   finding the objects with probes and attaching to them
 *   loop.c     the BPF side and the event loop that feeds the table
 *   output.c   the profile, folded stacks and flame graph at the end
 *   timeline.c the heap over time: the peak, snapshots (--every, SIGUSR1)
 *   leaks.c    the lifetime and leak report (--report)
 *
 * The BPF programs are ddheap_prof.bpf.c; the events they send are
 * ddheap_prof.h; the profile's data structures are table.h (live blocks,
 * stacks), objects.h (mapped files), report.h (symbolised stacks).
 */
#ifndef DDHEAP_PROF_PROF_H
#define DDHEAP_PROF_PROF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "flame.h"
#include "objects.h"
#include "table.h"

struct options {
    pid_t pid;
    char **cmd;
    double duration;
    const char *out_path, *svg_path, *folded_path;
    const char *provider;
    enum dd_prof_value value;
    unsigned long ringbuf_kb;
    bool verbose;
    const char *peak_path, *report_path;
    double every;        /* seconds between snapshots; 0: none */
    unsigned max_files;  /* snapshots kept on disk; 0: all */
};

/* The numbered snapshots of a run (timeline.c). */
struct snapshots {
    char *pattern;          /* printf pattern with one integer conversion */
    uint64_t period_ns;     /* 0: only on SIGUSR1 */
    uint64_t next_ns;       /* CLOCK_MONOTONIC instant of the next one */
    unsigned seq;           /* the last number written */
    const char *svg_pattern; /* --svg with one %d: a flame graph each */
    bool failed;
};

struct file_id {
    uint64_t dev, ino;
};

struct prof {
    struct options opt;
    pid_t pid;
    bool child; /* started by us, under ptrace */
    struct ddheap_prof_bpf *skel;
    struct ring_buffer *rb;
    struct dd_prof_objects objs;
    struct dd_prof_table table;
    struct bpf_link **links;
    size_t nlinks, links_cap;
    struct file_id *attached;
    size_t nattached, attached_cap;
    uint64_t interval; /* the process's sampling interval: pprof's period */
    bool oom;
    int64_t started_realtime, started_mono; /* ns, when profiling began */
    struct snapshots snaps;
};

/* The outputs, opened before anything is attached. */
struct outputs {
    FILE *out, *svg, *folded;
};

/* cli.c: fills o from argv; exits 2 with the usage on bad input. */
void dd_prof_parse_options(int argc, char **argv, struct options *o);

/* process.c */
pid_t dd_prof_start_command(char **cmd);
/* The process's environment as execve wants it (NULL-terminated, its
 * strings in *buf_out); NULL if it cannot be read. Free both. */
char **dd_prof_environment_of(pid_t pid, char **buf_out);
/* Handles the child's pending state changes. Returns true once it has
 * exited (its wait status in *status); *exec_seen is set at its exec. */
bool dd_prof_child_events(struct prof *p, int *status, bool *exec_seen);
void dd_prof_detach_child(struct prof *p);
bool dd_prof_process_gone(pid_t pid);
/* The mean sampling interval the process runs with, as its environment
 * says (ddheap's default otherwise). */
uint64_t dd_prof_interval_of(pid_t pid);

/* attach.c */
/* Attaches to every object with probes not attached yet. Returns the
 * number of objects attached so far, -1 if the maps could not be read. */
int dd_prof_rescan(struct prof *p);
/* For a process stopped at its exec: attaches to the libraries the
 * dynamic loader is about to map. */
void dd_prof_attach_needed_libraries(struct prof *p);
void dd_prof_detach_all(struct prof *p);

/* loop.c */
int dd_prof_setup_bpf(struct prof *p);
/* Runs until Ctrl-C, -d, the process's end or a failure. Returns true if
 * the run was cut short (ring buffer error, out of memory); *exited and
 * *status tell whether (and how) a started command ended. */
bool dd_prof_run_loop(struct prof *p, bool *exited, int *status, bool *exec_seen);
void dd_prof_teardown_bpf(struct prof *p);
/* From the start: SIGUSR1 asks the loop for a snapshot (it must not end
 * ddheap-prof, the default action, if it comes early). */
void dd_prof_catch_snapshot_signal(void);
int64_t dd_prof_now_ns(clockid_t clock);

/* output.c */
void dd_prof_open_outputs(const struct options *o, struct outputs *f);
/* Writes every output and closes the files. Returns 0 or -1. */
int dd_prof_write_outputs(struct prof *p, struct outputs *f);
/* One complete profile of table t (the run's, or a view of it) to path,
 * through a temporary name renamed into place, so a reader never sees half
 * a file. note (may be NULL) is one more comment. Returns 0 or -1. */
int dd_prof_write_profile_file(struct prof *p, const struct dd_prof_table *t, const char *path,
                               int64_t at_mono_ns, const char *note);
/* A snapshot of the run's table: the profile to pb_path and, if svg_path
 * is not NULL, its flame graph (--value), from one symbolised report,
 * each through a temporary name. Returns 0 or -1. */
int dd_prof_write_snapshot_files(struct prof *p, const char *pb_path, const char *svg_path,
                                 int64_t at_mono_ns, const char *note, const char *title);
/* Why a view with nothing in it is empty, in one sentence (into buf);
 * NULL if it is not empty. */
const char *dd_prof_empty_reason(const struct prof *p, const struct dd_prof_table *t,
                                 enum dd_prof_value v, char *buf, size_t len);

/* timeline.c */
/* Checks the snapshot options against -o; exits 2 on a bad pattern. */
void dd_prof_snapshots_setup(struct prof *p);
/* Called before each event is applied: writes every snapshot due before
 * ts_ns, so a snapshot is the state between two events. */
void dd_prof_snapshots_before(struct prof *p, uint64_t ts_ns);
/* Writes one snapshot of the state now (SIGUSR1, the end of a run). */
void dd_prof_snapshot_now(struct prof *p, int64_t now_mono_ns);
/* True if the next scheduled snapshot is due at now. */
bool dd_prof_snapshot_due(const struct prof *p, int64_t now_mono_ns);
void dd_prof_snapshots_free(struct prof *p);
/* The peak profile (--peak). Returns 0 or -1. */
int dd_prof_write_peak(struct prof *p);

/* leaks.c: the text report (--report) from the symbolised report r of the
 * run's table. Returns 0 or -1. */
struct dd_prof_report;
int dd_prof_write_lifetime_report(FILE *out, const struct prof *p, const struct dd_prof_report *r);

#endif

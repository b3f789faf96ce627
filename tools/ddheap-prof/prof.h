/*
 * One run of ddheap-prof: its options and its state, shared by the parts
 * that each do one job (main.c runs them in order):
 *
 *   cli.c      the command line
 *   process.c  starting the command, following it, letting it go
 *   attach.c   finding the objects with probes and attaching to them
 *   needed.c   what the loader maps for an executable (PT_INTERP, --list)
 *   preload.c  a command without probes run under libddheap_preload.so
 *   agent.c    -p PID without probes: ddheap's agent injected (inject.c)
 *   loop.c     the BPF side and the event loop that feeds the table
 *   output.c   writing the files: the profile, folded stacks, flame graph
 *   timeline.c the heap over time: the peak, snapshots (--every, SIGUSR1)
 *   leaks.c    the lifetime and leak report (--report)
 *   interp.c   interpreters' frames merged into native stacks (interp.h;
 *              CPython's, BPF walk and naming, in python/)
 *   http.c     serving the profile as Go's net/http/pprof (--http)
 *   host.c     finding every process with probes on the host (--all)
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
#include "intern.h"
#include "interp.h"
#include "objects.h"
#include "symbolize.h"
#include "table.h"
#include "unwind.h"

struct options {
    pid_t pid;
    char **cmd;
    double duration;
    const char *out_path, *svg_path, *folded_path;
    const char *provider;
    enum dd_prof_value value;
    unsigned long ringbuf_kb;
    bool unwind_fp;            /* --unwind=fp: the kernel's frame-pointer walk */
    unsigned long stack_bytes; /* --stack-bytes: user stack copied per sample */
    bool verbose;
    /* Follow the processes the target forks (-f; on by default with
     * -- CMD, off with -p; --no-follow). */
    bool follow;
    const char *peak_path, *report_path;
    double every;        /* seconds between snapshots; 0: none */
    unsigned max_files;  /* snapshots kept on disk; 0: all */
    bool python;         /* Python frames (--python, on by default) */
    const char *http_addr; /* --http: serve the profile there (http.c) */
    bool all;            /* --all: every process with probes on the host (host.c) */
    const char *only;    /* --only GLOB: --all's processes whose executable matches */
    /* Any file output asked for: with --http or --all none is written
     * unless asked for. */
    bool files_asked;
    size_t max_live, max_stacks; /* --max-blocks, --max-stacks (0: none) */
    bool no_preload;     /* --no-preload: CMD runs as it is, probes or not */
    bool no_inject;      /* --no-inject: -p PID without probes is refused */
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

/* An attached file's semaphores, raised by ddheap-prof in the processes
 * it follows (attach.c). */
struct dd_prof_sem_file {
    uint64_t dev, ino;
    uint64_t addr[16]; /* link-time addresses */
    size_t n;
};

struct file_id {
    uint64_t dev, ino;
    pid_t pid; /* --all: the process it was attached for; 0 otherwise */
};

/* One process of the run: the target or a process it forked. Its
 * objects are recorded while it lives, to symbolise its stacks at the end. */
struct dd_prof_proc {
    pid_t tgid, parent;
    char *name;    /* its executable's base name, at its last exec */
    /* Its command, as its labels in the profile (pprof.h): the kernel's
     * comm and the executable's path, read at its start (-p), its exec,
     * or copied from its parent at its fork; NULL if never read. */
    char *comm, *exe;
    uint64_t samples; /* alloc events from it */
    bool gone;     /* exited: nothing more to scan */
    bool exit_applied; /* its blocks have left the table's live heap */
    /* Its fork or exec was read, or the process events were read again
     * for it (loop.c): its objects are what the reader can know. */
    bool known;
    bool links_released; /* --all: its uprobes released once gone (host.c) */
    bool loader_stop_pending; /* a descendant stopped for us, at its loader to come */
    struct dd_prof_objects objs;
    /* Its DWARF unwinding session (shared with the processes whose
     * objects are the same), taken for objs at its first copied stack;
     * released at its exec and fork (objs replaced) and once it is gone
     * and its events read (loop.c). None with --unwind=fp. */
    struct dd_prof_unwind_hold unwinder;
    /* The interpreter it runs whose frames are walked (interp.h), with
     * what the BPF side was given for it; NULL if none. Objects
     * objs.v[0, interp_seen) have been looked at for one. */
    struct dd_prof_interp_proc *interp;
    struct dd_prof_interp_config interp_cfg;
    size_t interp_seen;
};

struct prof {
    struct options opt;
    /* What the library recorded in the processes' status words
     * (libstatus.c): every bit seen, and the first process seen with each. */
    uint64_t lib_status;
    pid_t lib_status_pid[8];
    char *lib_status_name[8];
    pid_t pid; /* the target: the command started, or -p */
    bool child; /* started by us (our child: stopped at its execs) */
    int child_pidfd; /* readable once it has exited */
    bool child_stopped;       /* at an exec or loader stop, waiting for us */
    bool loader_stop_pending; /* it will stop when its loader has mapped */
    struct ddheap_prof_bpf *skel;
    struct ring_buffer *rb;
    /* The process events alone, read from within an allocation's handler
     * when it comes from a process whose fork has not been read yet. */
    struct ring_buffer *proc_rb;
    /* Interpreter code objects seen for the first time (code_events):
     * read before each sample and at each wake-up, ahead of the backlog. */
    struct ring_buffer *code_rb;
    /* The processes seen, by tgid: procs[i] is the one of key i. */
    struct dd_prof_keys proc_ids;
    struct dd_prof_proc *procs;
    size_t procs_cap;
    struct file_id *loader_hooked; /* dynamic loaders hooked (on_loader) */
    size_t nloader_hooked, loader_hooked_cap;
    struct dd_prof_table table;
    /* Exits read but not applied to the table yet, in time order: each is
     * applied before the first event stamped after it (loop.c). */
    struct pending_exit {
        uint32_t tgid;
        uint64_t ts_ns;
    } *exits;
    size_t nexits, exits_cap;
    uint64_t exits_applied;
    /* Allocation and free events stamped after the horizon (the start of
     * the consume that read them) wait for the next one (loop.c). */
    uint64_t horizon_ns;
    struct deferred_event {
        struct dd_prof_sample sample;
        uint32_t type, nframes;
        uint64_t *frames;
    } *deferred;
    size_t ndeferred, deferred_cap;
    /* The earliest stamp among them (UINT64_MAX: none): while it is past
     * the horizon, no kept event is due, and an event read need not scan
     * them (a flood of events kept back made each read scan all of them). */
    uint64_t deferred_first_ns;
    struct dd_prof_unwind_stats unwind_stats; /* of every process's session (-v) */
    uint64_t event_bytes, events;      /* read from the ring buffer (-v) */
    size_t stacks_named; /* the table's stacks [0, stacks_named) are named (loop.c) */
    int64_t last_read_ns;  /* when the loop last read the ring buffer */
    struct bpf_link *tracepoint_links[3]; /* fork, exec, exit */
    struct bpf_link **links;
    pid_t *link_pids; /* the process each link was made for */
    size_t nlinks, links_cap, link_pids_cap; /* nlinks: entries of both */
    struct file_id *attached;
    size_t nattached, attached_cap;
    struct dd_prof_sem_file *sem_files;
    size_t nsem_files, sem_files_cap;
    uint64_t interval; /* the process's sampling interval: pprof's period */
    /* The rate the profiled processes' samples are limited to, as their
     * environment says (0: none): it bounds how fast events can come, so
     * whether the reader may pause to name stacks (loop.c). */
    uint64_t samples_per_second;
    bool oom;
    bool interrupted; /* the run was ended by Ctrl-C, SIGTERM or -d */
    int64_t started_realtime, started_mono; /* ns, when profiling began */
    struct snapshots snaps;
    struct dd_prof_http *http;   /* --http's server, NULL without */
    struct dd_prof_host *host;   /* --all's discovery, NULL without */
    int agent_fd; /* closing it detaches the injected agent; -1: none */
};

/* The outputs of the end, created before anything is attached (each a
 * temporary file until it is complete); out and svg are NULL when -o or
 * --svg is a snapshot pattern, the others when not asked for. */
struct outputs {
    FILE *out, *svg, *folded, *peak, *report;
};

/* cli.c: fills o from argv; exits 2 with the usage on bad input. */
void dd_prof_parse_options(int argc, char **argv, struct options *o);

/* process.c */
/* Records the signal dispositions the command is to start with; call
 * before changing any. */
void dd_prof_record_signals(void);
/* Forks CMD, which waits for ddheap-prof's word before its exec; the pid
 * is followed (and stopped at each exec) from then on. Returns 0, or the
 * exit status to end with (the message printed). */
int dd_prof_start_command(struct prof *p);
/* Lets the command go to its exec; returns 0, or 127 (not found) or 126
 * (not runnable) if it could not be run (message printed). */
int dd_prof_release_command(struct prof *p);
/* The process entry of tgid, added if new (NULL when out of memory); a new
 * one has its command read (dd_prof_read_command). */
struct dd_prof_proc *dd_prof_proc_of(struct prof *p, pid_t tgid);
/* Reads the process's comm and executable path from /proc (what cannot be
 * read keeps its old value: a process gone by now). */
void dd_prof_read_command(struct dd_prof_proc *proc);
/* Frees what a process entry owns but its objects. */
void dd_prof_proc_free_names(struct dd_prof_proc *proc);
/* Handles a process event (fork, exec, exit, loader) of the proc_events
 * ring buffer. */
int dd_prof_on_proc_event(void *ctx, void *data, size_t size);
/* At the end of a run that the command outlives: no more stops, and if it
 * is at one of ours, it goes on. */
void dd_prof_let_go(struct prof *p);
/* The exit status of the command once it has exited (its pidfd was
 * readable); false if it has not. */
bool dd_prof_reap_command(struct prof *p, int *status);
/* The process's environment as execve wants it (NULL-terminated, its
 * strings in *buf_out); NULL if it cannot be read. Free both. */
char **dd_prof_environment_of(pid_t pid, char **buf_out);
/* The process thread `id` belongs to (id itself for a process's first
 * thread); 0 if /proc does not say. */
pid_t dd_prof_tgid_of(pid_t id);
bool dd_prof_process_gone(pid_t pid);
/* The library's default limit (DD_HEAP_SAMPLES_PER_SECOND). */
#define DD_PROF_DEFAULT_SAMPLES_PER_SECOND 3000
/* The mean sampling interval the process runs with, as its environment
 * says (ddheap's default otherwise), and the rate its samples are limited
 * to (0: none). */
uint64_t dd_prof_interval_of(pid_t pid, uint64_t *samples_per_second);

/* libstatus.c: what the library recorded in the process's status word,
 * read now; said once per kind by dd_prof_report_library_status. */
void dd_prof_read_library_status(struct prof *p, struct dd_prof_proc *proc);
void dd_prof_report_library_status(struct prof *p);

/* needed.c */
/* The executable's PT_INTERP (malloc'ed), NULL if none (static) or unreadable. */
char *dd_prof_interpreter_of(const char *exe);
/* Runs the loader `interp --list exe` with the environment env and calls
 * each() with the path of every library it names. */
void dd_prof_list_libraries(const char *interp, const char *exe, char **env,
                            void (*each)(const char *path, void *ctx), void *ctx);

/* preload.c */
enum dd_prof_library { DD_PROF_PRELOAD_LIB, DD_PROF_AGENT_LIB };
/* The path of one of ddheap's libraries for this ddheap-prof (its build
 * tree's, the installed one's, or the environment's override). */
const char *dd_prof_library(enum dd_prof_library which);
/* Before starting -- CMD: the preload library to run it with when neither
 * it nor what it starts with carries probes (one line says so), else NULL. */
const char *dd_prof_preload_for(const struct options *o);
/* In the child before its exec: lib goes into LD_PRELOAD. */
void dd_prof_add_preload(const char *lib);

/* agent.c */
/* After the first rescan of -p PID: if no object but an agent carries
 * probes, injects the agent (refused with --no-inject) and attaches to it.
 * Returns 0 (nothing to do, or injected), -1 (message printed). */
int dd_prof_inject_agent(struct prof *p, struct dd_prof_proc *proc);
/* The agent detaches (at once: the end of the run). */
void dd_prof_release_agent(struct prof *p);

/* attach.c */
/* Rescans the maps of the process and attaches to every object with
 * probes not attached yet. Returns the number of files attached so far,
 * -1 if the maps could not be read. */
int dd_prof_rescan(struct prof *p, struct dd_prof_proc *proc);
/* Every followed process still running. */
void dd_prof_rescan_all(struct prof *p);
/* For a process stopped at its exec: hooks its dynamic loader (returns
 * true: it will stop again once the loader has mapped the libraries), or
 * else attaches to the libraries the loader is about to map. */
bool dd_prof_prepare_exec(struct prof *p, struct dd_prof_proc *proc);
/* Looks for an interpreter among the process's new objects (once it has
 * none), and tells the BPF side to walk its frames. */
void dd_prof_recognize_interpreter(struct prof *p, struct dd_prof_proc *proc);
/* A forked process runs its parent's interpreter, at the same addresses. */
void dd_prof_inherit_interpreter(struct prof *p, struct dd_prof_proc *proc,
                                 const struct dd_prof_proc *parent);
/* No more walks of the process's interpreter (its exit, a failed check);
 * what names its frames stays. */
void dd_prof_stop_interpreter_walk(struct prof *p, struct dd_prof_proc *proc);
/* The process's interpreter is forgotten (its exec, its fork's copy). */
void dd_prof_forget_interpreter(struct prof *p, struct dd_prof_proc *proc);
/* Lowers the semaphores ddheap-prof raised in the live processes. */
bool dd_prof_sites_shared(const struct prof *p);
void dd_prof_lower_semaphores(struct prof *p);
/* Destroys every link; the uprobes go once ddheap-prof has exited. */
void dd_prof_detach_all(struct prof *p);

/* guardian.c: undoes, if ddheap-prof dies, the semaphores it raised and
 * the stops it made in the processes it follows. */
void dd_prof_guardian_start(struct prof *p);
void dd_prof_guardian_raised(pid_t pid, uint64_t addr, int delta);
void dd_prof_guardian_fork(pid_t child, pid_t parent);
void dd_prof_guardian_gone(pid_t pid); /* its exec or exit */
/* All is undone: the guardian leaves. */
void dd_prof_guardian_done(void);

/* loop.c */
/* Opens and loads the BPF programs, and attaches the process tracepoints. */
int dd_prof_setup_bpf(struct prof *p);
/* No process is stopped any more; those waiting for us are continued. */
void dd_prof_end_stops(struct prof *p);
/* The BPF side stops no process any more (the run ends). */
void dd_prof_no_more_stops(struct prof *p);
/* Adds a process to the BPF map of followed ones. */
int dd_prof_follow(struct prof *p, pid_t tgid, uint32_t flags);
/* A followed process other than the target exited at ts_ns: its blocks
 * leave the live heap at that instant (the target's stay: the run ends
 * with it, and what it held then is the end profile). */
void dd_prof_note_exit(struct prof *p, pid_t tgid, uint64_t ts_ns);
/* Applies the exits noted so far. Call after a consume of the ring
 * buffers: the one that read an exit has read every event its process
 * sent before it (the process events first, then the others, each up to
 * what it holds). */
void dd_prof_apply_exits(struct prof *p);
/* Runs until Ctrl-C, -d, the process's end or a failure. Returns true if
 * the run was cut short (ring buffer error, out of memory); *exited and
 * *status tell whether (and how) a started command ended. */
bool dd_prof_run_loop(struct prof *p, bool *exited, int *status);
void dd_prof_teardown_bpf(struct prof *p);
/* From the start: SIGUSR1 asks the loop for a snapshot (it must not end
 * ddheap-prof, the default action, if it comes early). */
void dd_prof_catch_snapshot_signal(void);
int64_t dd_prof_now_ns(clockid_t clock);

/* output.c */
/* Creates each output as a temporary file beside it (exits 1 with a
 * message if one cannot be): the real name appears only when complete. */
void dd_prof_open_outputs(const struct options *o, struct outputs *f);
/* Writes every output, closes it and gives it its name. Returns 0 or -1
 * (then no output is left). */
int dd_prof_write_outputs(struct prof *p, struct outputs *f);
/* Removes the temporary files of outputs not written. */
void dd_prof_discard_outputs(void);
/* What to say after "wrote PATH" once the pending output PATH (the very
 * pointer given to dd_prof_open_outputs) has its name; nothing is said of
 * an output that is not published. */
void dd_prof_announce_output(const char *path, const char *detail);
/* One complete profile of table t (the run's, or a view of it) to out,
 * the temporary file of path. note (may be NULL) is one more comment.
 * Returns 0 or -1. */
int dd_prof_write_profile(struct prof *p, const struct dd_prof_table *t, FILE *out,
                          const char *path, int64_t at_mono_ns, const char *note);
/* A snapshot of the run's table: the profile to pb_path and, if svg_path
 * is not NULL, its flame graph (--value), from one symbolised report,
 * each written through a temporary file renamed into place once complete
 * (a reader never sees half a file). Returns 0 or -1. */
int dd_prof_write_snapshot_files(struct prof *p, const char *pb_path, const char *svg_path,
                                 int64_t at_mono_ns, const char *note, const char *title);
/* Why a view with nothing in it is empty, in one sentence (into buf);
 * NULL if it is not empty. */
const char *dd_prof_empty_reason(const struct prof *p, const struct dd_prof_table *t,
                                 enum dd_prof_value v, char *buf, size_t len);

/* One complete gzipped profile of table t, covering from_mono_ns (the
 * run's start, or a delta's) to at_mono_ns, into a malloc'd buffer (*buf,
 * *len); alloc_space the default sample type if alloc_first. Returns 0 or
 * -1. */
int dd_prof_profile_bytes(struct prof *p, const struct dd_prof_table *t, int64_t from_mono_ns,
                          int64_t at_mono_ns, const char *note, bool alloc_first, char **buf,
                          size_t *len);

/* http.c: --http (one server, run from the event loop; no threads). */
struct sockaddr_storage;
/* ADDR: PORT or :PORT (loopback), IPV4:PORT, [IPV6]:PORT, localhost:PORT. */
bool dd_prof_http_parse_addr(const char *addr, struct sockaddr_storage *ss, unsigned *len);
/* Listens (the address said on stderr); returns 0, or -1 (message printed). */
int dd_prof_http_start(struct prof *p);
/* The descriptor the loop polls for the server (-1 without --http). */
int dd_prof_http_fd(const struct prof *p);
/* wait_ns, or less if the server needs to run sooner. */
int64_t dd_prof_http_wait_ns(const struct prof *p, int64_t now_ns, int64_t wait_ns);
/* Answers what can be answered now (requests, deltas that are due). */
void dd_prof_http_run(struct prof *p);
void dd_prof_http_stop(struct prof *p);

/* host.c: --all. */
/* Finds every running process with probes and attaches to each (by pid);
 * returns 0 or -1 (message printed). */
int dd_prof_host_start(struct prof *p);
/* A process has exec'd (any process on the host, with --all). */
void dd_prof_host_on_exec(struct prof *p, pid_t tgid);
/* A followed process has forked this child (followed by the BPF side):
 * it is attached by its own pid. */
void dd_prof_host_on_fork(struct prof *p, struct dd_prof_proc *child);
/* After a consume: releases the uprobes of the processes gone; checks
 * the processes due a look: the recently exec'd, and every few seconds
 * every process not profiled (dlopen). */
void dd_prof_host_poll(struct prof *p, int64_t now_ns);
/* wait_ns, or less if a process is due a look sooner. */
int64_t dd_prof_host_wait_ns(const struct prof *p, int64_t now_ns, int64_t wait_ns);
void dd_prof_host_free(struct prof *p);

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
/* The peak profile (--peak) to out. Returns 0 or -1. */
int dd_prof_write_peak(struct prof *p, FILE *out);

/* leaks.c: the text report (--report) from the symbolised report r of the
 * run's table. Returns 0 or -1. */
struct dd_prof_report;
int dd_prof_write_lifetime_report(FILE *out, const struct prof *p, const struct dd_prof_report *r);

#endif

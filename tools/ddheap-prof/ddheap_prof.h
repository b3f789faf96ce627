/*
 * The events ddheap-prof's BPF programs (ddheap_prof.bpf.c) put into the
 * ring buffer, shared by both sides. Fixed-width fields only: the same
 * layout under clang -target bpf and the host compiler.
 */
#ifndef DDHEAP_PROF_H
#define DDHEAP_PROF_H

/* The kernel's default perf_event_max_stack. */
#define DD_PROF_MAX_FRAMES 127

enum dd_prof_event_type {
    DD_PROF_EV_ALLOC = 0,
    DD_PROF_EV_FREE = 1,
    /* Process events, on their own ring buffer (proc_events): a flood of
     * allocations never crowds them out. */
    DD_PROF_EV_FORK = 2,   /* tgid: the new process; ptr: its parent's tgid */
    DD_PROF_EV_EXEC = 3,   /* tgid: the process that exec'd */
    DD_PROF_EV_EXIT = 4,   /* tgid: the process whose last thread exited */
    DD_PROF_EV_LOADED = 5, /* tgid: its dynamic loader mapped objects (start, dlopen) */
};

/* The value of a process in the BPF map of followed processes. */
enum dd_prof_follow_flags {
    /* Our own child: stopped (SIGSTOP) at each exec, before the new
     * image's first instruction, so its objects are attached first. Only
     * its parent, ddheap-prof, can see that stop. */
    DD_PROF_STOP_AT_EXEC = 1,
    /* ... and stopped once more when its dynamic loader has mapped the
     * initial libraries, before their constructors run. */
    DD_PROF_STOP_AT_LOADER = 2,
};

/* glibc's struct r_debug: r_state's offset (int, pointer, address before
 * it) and its value once the link map is consistent. */
#define DD_PROF_R_STATE_OFFSET 24
#define DD_PROF_RT_CONSISTENT 0

/* What every event starts with. */
struct dd_prof_event_head {
    __u32 type;
    __u32 tgid;  /* the process that fired the probe */
    __u64 ts_ns; /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
    __u64 ptr;
};

struct dd_prof_free_event {
    struct dd_prof_event_head head;
};

struct dd_prof_alloc_event {
    struct dd_prof_event_head head;
    __u64 size;
    __u64 weight;
    __u32 nframes;
    __u32 pad;
    __u64 frames[DD_PROF_MAX_FRAMES]; /* innermost first; nframes of them */
};

#endif

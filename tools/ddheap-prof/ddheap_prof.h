/*
 * The events ddheap-prof's BPF programs (ddheap_prof.bpf.c) put into the
 * ring buffer, shared by both sides. Fixed-width fields only: the same
 * layout under clang -target bpf and the host compiler.
 */
#ifndef DDHEAP_PROF_H
#define DDHEAP_PROF_H

/* The kernel's default perf_event_max_stack. */
#define DD_PROF_MAX_FRAMES 127

enum dd_prof_event_type { DD_PROF_EV_ALLOC = 0, DD_PROF_EV_FREE = 1 };

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

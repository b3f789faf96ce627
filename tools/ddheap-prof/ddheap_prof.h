/*
 * The events ddheap-prof's BPF programs (ddheap_prof.bpf.c) put into the
 * ring buffer, shared by both sides. Fixed-width fields only: the same
 * layout under clang -target bpf and the host compiler.
 */
#ifndef DDHEAP_PROF_H
#define DDHEAP_PROF_H

#include "python/python_layout.h"

/* The kernel's default perf_event_max_stack. */
#define DD_PROF_MAX_FRAMES 127

/* The most of the user stack one alloc event can carry (--stack-bytes):
 * perf's limit too (65528). A power of two, so the BPF side can bound
 * offsets into it with a mask. */
#define DD_PROF_MAX_STACK 65536
#define DD_PROF_DEFAULT_STACK 16384

/* The registers an unwinder starts from, as the probe saw them. */
#if defined(__TARGET_ARCH_arm64) || defined(__aarch64__)
enum { DD_PROF_REG_PC, DD_PROF_REG_SP, DD_PROF_REG_FP, DD_PROF_REG_LR, DD_PROF_NREGS };
#else
enum { DD_PROF_REG_PC, DD_PROF_REG_SP, DD_PROF_REG_FP, DD_PROF_NREGS };
#endif

enum dd_prof_event_type {
    DD_PROF_EV_ALLOC = 0,
    DD_PROF_EV_FREE = 1,
    /* Process events, on their own ring buffer (proc_events): a flood of
     * allocations never crowds them out. */
    DD_PROF_EV_FORK = 2,   /* tgid: the new process; ptr: its parent's tgid */
    DD_PROF_EV_EXEC = 3,   /* tgid: the process that exec'd */
    DD_PROF_EV_EXIT = 4,   /* tgid: the process whose last thread exited */
    DD_PROF_EV_LOADED = 5, /* tgid: its dynamic loader mapped objects (start, dlopen) */
    /* On a ring buffer of its own (code_events): an interpreter's code
     * object seen for the first time (struct dd_prof_code_event), for
     * user space to read while it is still there. */
    DD_PROF_EV_CODE = 6,
    DD_PROF_EV_EXEC_OTHER = 7, /* --all: tgid, not followed, exec'd (a process to look at) */
};

/* The value of a process in the BPF map of followed processes. */
enum dd_prof_follow_flags {
    /* Our own child: stopped (SIGSTOP) at each exec, before the new
     * image's first instruction, so its objects are attached first. Only
     * its parent, ddheap-prof, can see that stop. Following (not --all),
     * a forked child too: its parent may see that stop (SIGCHLD with
     * CLD_STOPPED, waitpid with WUNTRACED), for a few milliseconds. */
    DD_PROF_STOP_AT_EXEC = 1,
    /* ... and stopped once more when its dynamic loader has mapped the
     * initial libraries, before their constructors run. */
    DD_PROF_STOP_AT_LOADER = 2,
};

/* glibc's struct r_debug: r_state's offset (int, pointer, address before
 * it) and its value once the link map is consistent. */
#define DD_PROF_R_STATE_OFFSET 24
#define DD_PROF_RT_CONSISTENT 0

/* What the data of an alloc event holds. */
enum dd_prof_stack_kind {
    /* The kernel's frame-pointer walk: data holds len / 8 return
     * addresses (__u64), innermost first, the probe site first. */
    DD_PROF_STACK_FRAMES = 0,
    /* The user stack from regs[DD_PROF_REG_SP] up: len bytes of it, for
     * user space to unwind by DWARF CFI. */
    DD_PROF_STACK_COPY = 1,
};

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

/* Variable length: the ring buffer gets the header and len bytes of data. */
struct dd_prof_alloc_event {
    struct dd_prof_event_head head;
    __u64 size;
    __u64 weight;
    __u32 kind;     /* enum dd_prof_stack_kind */
    __u32 len;      /* bytes of data that follow */
    __u32 wanted;   /* stack bytes asked for (--stack-bytes); len < wanted
                     * means the copy stopped at the end of the stack */
    __u16 ninterp;  /* interpreter frames after the stack (struct
                     * dd_prof_interp_frame), at data + DD_PROF_INTERP_AT(len) */
    __u16 interp_flags; /* DD_PROF_INTERP_CUT */
    __u64 regs[4];  /* DD_PROF_REG_*; unused ones 0 */
    __u8 data[DD_PROF_MAX_STACK];
};

/* Interpreter frames (python/): what the BPF side records of each frame
 * of the interpreter's own stack, innermost first, for user space to name
 * by reading the process and to merge into the native stack where the
 * interpreter's eval loop is (interp.h). */
#define DD_PROF_MAX_INTERP_FRAMES 128
#define DD_PROF_INTERP_AT(len) (((len) + 7u) & ~7u)

struct dd_prof_interp_frame {
    __u64 code;      /* the code object's address */
    __u32 offset;    /* the instruction's byte offset in the code */
    __u32 firstline; /* the code's first line, as read at the sample */
    __u32 check;     /* a fingerprint of the code object (dd_prof_py_check) */
    __u32 flags;     /* DD_PROF_INTERP_ENTRY */
};

enum {
    /* The frame the eval loop was entered with from C: it and the frames
     * inside it (before it, innermost first) ran in one C-level call. */
    DD_PROF_INTERP_ENTRY = 1,
    /* interp_flags: the walk stopped at DD_PROF_MAX_INTERP_FRAMES. */
    DD_PROF_INTERP_CUT = 1,
};

enum dd_prof_interp_kind { DD_PROF_INTERP_PYTHON = 1 };

/* DD_PROF_EV_CODE: head.tgid the process, frame the first frame seen
 * running that code (address, fingerprint, first line). */
struct dd_prof_code_event {
    struct dd_prof_event_head head;
    struct dd_prof_interp_frame frame;
};

/* What the BPF side walks in one process (the map interp_procs). */
struct dd_prof_interp_config {
    __u32 kind; /* enum dd_prof_interp_kind */
    __u32 pad;
    union {
        struct dd_prof_py_layout python;
    };
};

#endif

/*
 * CPython's frames at a sample, BPF side (included by ddheap_prof.bpf.c;
 * the user side, which names what is recorded here, is python.c).
 *
 * The thread's PyThreadState is found in the main interpreter's list of
 * threads by the thread's own id (the kernel's thread id, 3.11+; the
 * thread pointer that pthread_self() returns, 3.10): the thread that
 * called malloc, whether or not it holds the GIL, so threads never get one
 * another's frames. Where it was found is kept per thread and checked at
 * each use, so the list is walked once per thread. From its current frame
 * the walk follows `previous`, recording per frame the code object's
 * address, the instruction's offset, and a fingerprint of the code; it
 * never follows a pointer it has not just read from the process, and
 * every read is a bpf_probe_read_user that may fail (the walk then ends).
 */
#ifndef DDHEAP_PROF_PYTHON_BPF_H
#define DDHEAP_PROF_PYTHON_BPF_H

/* Kernel thread id -> the address of its PyThreadState. */
struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 8192);
    __type(key, __u32);
    __type(value, __u64);
} py_thread_states SEC(".maps");

/* One frame and one code object as read; offsets into them are masked
 * to 0xff, so a field read is always inside. */
struct py_read_buf {
    __u8 frame[256 + 8];
    __u8 code[256 + 8];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct py_read_buf);
} py_bufs SEC(".maps");

static __always_inline __u64 py_u64(const __u8 *buf, __u32 off)
{
    return *(const __u64 *)(buf + (off & 0xff));
}

static __always_inline __u32 py_u32(const __u8 *buf, __u32 off)
{
    return *(const __u32 *)(buf + (off & 0xff));
}

static __always_inline __u64 py_read_u64(__u64 addr)
{
    __u64 v = 0;
    if (bpf_probe_read_user(&v, sizeof v, (const void *)addr) != 0)
        return 0;
    return v;
}

/* What the interpreter stores as this thread's id. */
static __always_inline __u64 py_thread_id(const struct dd_prof_py_layout *l)
{
    if (!l->thread_is_pthread)
        return (__u32)bpf_get_current_pid_tgid();
#if defined(__TARGET_ARCH_x86)
    /* glibc's pthread_self() is the thread pointer, %fs's base. */
    struct task_struct *t = bpf_get_current_task_btf();
    return t->thread.fsbase;
#else
    return 0;
#endif
}

struct py_thread_walk {
    __u64 tstate, want, found;
    __u16 next, thread;
};

static long py_thread_step(__u64 i, void *ctx)
{
    struct py_thread_walk *w = ctx;
    if (w->tstate == 0)
        return 1;
    if (py_read_u64(w->tstate + w->thread) == w->want) {
        w->found = w->tstate;
        return 1;
    }
    w->tstate = py_read_u64(w->tstate + w->next);
    return 0;
}

static __always_inline __u64 py_thread_state(const struct dd_prof_py_layout *l)
{
    __u32 tid = (__u32)bpf_get_current_pid_tgid();
    __u64 want = py_thread_id(l);
    if (want == 0)
        return 0;
    __u64 *cached = bpf_map_lookup_elem(&py_thread_states, &tid);
    if (cached && *cached && py_read_u64(*cached + l->tstate_thread) == want)
        return *cached;
    __u64 interp = py_read_u64(l->runtime + l->runtime_interp_head);
    if (interp == 0)
        return 0;
    struct py_thread_walk w = {.tstate = py_read_u64(interp + l->interp_threads_head),
                               .want = want,
                               .next = l->tstate_next,
                               .thread = l->tstate_thread};
    bpf_loop(1024, py_thread_step, &w, 0);
    if (w.found)
        bpf_map_update_elem(&py_thread_states, &tid, &w.found, BPF_ANY);
    return w.found;
}

/* The event's records start at byte `at` of its data; this far they may
 * go (the scratch's slack after the largest stack copy). */
#define PY_RECORDS_END (DD_PROF_MAX_STACK + 4096)

struct py_frame_walk {
    struct dd_prof_py_layout l;
    __u64 frame;
    __u32 at, n, cpu;
};

static __always_inline struct dd_prof_interp_frame *py_record(struct alloc_scratch *s, __u32 at)
{
    barrier_var(at);
    if (at > PY_RECORDS_END - sizeof(struct dd_prof_interp_frame))
        return NULL;
    return (struct dd_prof_interp_frame *)(s->ev.data + at);
}

static long py_frame_step(__u64 i, void *ctx)
{
    struct py_frame_walk *w = ctx;
    const struct dd_prof_py_layout *l = &w->l;
    __u32 zero = 0;
    struct py_read_buf *b = bpf_map_lookup_elem(&py_bufs, &zero);
    struct alloc_scratch *s = bpf_map_lookup_elem(&scratch, &w->cpu);
    if (w->frame == 0 || b == NULL || s == NULL ||
        bpf_probe_read_user(b->frame, DD_PROF_PY_FRAME_READ, (const void *)w->frame) != 0)
        return 1;
    __u64 code = py_u64(b->frame, l->frame_code);
    w->frame = py_u64(b->frame, l->frame_previous);
    if (l->frame_owner != DD_PROF_PY_NONE &&
        b->frame[l->frame_owner & 0xff] == DD_PROF_PY_OWNED_BY_CSTACK) {
        /* 3.12+: the shim below an eval call's first frame. */
        struct dd_prof_interp_frame *last =
            w->n ? py_record(s, w->at - sizeof(struct dd_prof_interp_frame)) : NULL;
        if (last)
            last->flags |= DD_PROF_INTERP_ENTRY;
        return 0;
    }
    if (bpf_probe_read_user(b->code, DD_PROF_PY_CODE_READ, (const void *)code) != 0)
        return 1;
    if (py_u64(b->code, 8) != l->code_type) /* ob_type: not code (3.13's shim) */
        return 0;
    struct dd_prof_interp_frame *r = py_record(s, w->at);
    if (r == NULL)
        return 1;
    r->code = code;
    if (l->instr_is_index)
        r->offset = py_u32(b->frame, l->frame_instr) * 2;
    else
        r->offset = (__u32)(py_u64(b->frame, l->frame_instr) - (code + l->code_adaptive));
    r->firstline = py_u32(b->code, l->code_firstlineno);
    r->check = dd_prof_py_check(py_u64(b->code, l->code_name), py_u64(b->code, l->code_linetable),
                                py_u32(b->code, l->code_argcount));
    r->flags = l->every_frame_entry ||
                       (l->frame_entry != DD_PROF_PY_NONE && b->frame[l->frame_entry & 0xff])
                   ? DD_PROF_INTERP_ENTRY
                   : 0;
    note_code(r);
    w->at += sizeof *r;
    return ++w->n >= DD_PROF_MAX_INTERP_FRAMES;
}

/* Records the thread's Python frames at byte `at` of ev->data; sets
 * ev->ninterp and ev->interp_flags. */
static __always_inline void python_walk(const struct dd_prof_py_layout *l,
                                        struct dd_prof_alloc_event *ev, __u32 at, __u32 cpu)
{
    __u64 tstate = py_thread_state(l);
    if (tstate == 0)
        return;
    __u64 frame = py_read_u64(tstate + l->tstate_frame);
    if (frame && l->cframe_frame != DD_PROF_PY_NONE)
        frame = py_read_u64(frame + l->cframe_frame);
    struct py_frame_walk w = {.frame = frame, .at = at, .cpu = cpu};
    __builtin_memcpy(&w.l, l, sizeof w.l);
    bpf_loop(DD_PROF_MAX_INTERP_FRAMES, py_frame_step, &w, 0);
    ev->ninterp = (__u16)w.n;
    if (w.n >= DD_PROF_MAX_INTERP_FRAMES && w.frame != 0)
        ev->interp_flags |= DD_PROF_INTERP_CUT;
}

#endif

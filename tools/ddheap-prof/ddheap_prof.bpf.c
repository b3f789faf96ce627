/*
 * ddheap-prof, kernel side: two USDT programs, attached to the `alloc` and
 * `free` probes (provider `ddheap` or `otel_memory`) of the followed
 * processes, that copy each event into a BPF ring buffer for the user side
 * (loop.c). An alloc event carries the registers and the top of the user
 * stack, which user space unwinds by DWARF CFI (unwind.c), or with
 * --unwind=fp the kernel's frame-pointer walk; in a process that runs an
 * interpreter ddheap-prof knows (interp.h), the interpreter's own frames
 * follow the stack (python/python.bpf.h). And the programs that keep
 * the set of followed processes and tell the user side about them (forks,
 * execs, exits, the dynamic loader's link-map changes), stopping
 * ddheap-prof's own child at the points where its new objects must be
 * attached before it runs on (process.c).
 *
 * Nothing is aggregated here: the table of live sampled blocks lives in
 * user space, so its size is bounded by memory, not by a map's key count.
 * An event the ring buffer has no room for is counted, never waited for
 * (a probe must not stall the traced thread); the user side reports the
 * counts, because a lost free leaves a block live for ever in the profile
 * and a lost alloc removes one from it.
 */
#include "vmlinux.h"

#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#include "ddheap_prof.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The processes to report, tgid -> dd_prof_follow_flags (ddheap_prof.h):
 * the one given, and with follow_children each process it forks, added
 * here at the fork, before the child runs. Uprobes attached to a file for
 * every process fire in others too; this map is the filter. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u32);
} followed SEC(".maps");

const volatile bool follow_children = false;
/* --all: every exec on the host is told (DD_PROF_EV_EXEC_OTHER), so that
 * user space can look at the new image's objects; nothing else is done
 * to a process not followed. */
const volatile bool exec_all = false;
/* Following with the probe sites shared by every process (attach.c): a
 * forked child is stopped at its exec, like the command, so that the
 * user side hooks its loader and raises its semaphores before its
 * libraries' constructors run. */
const volatile bool stop_forked_at_exec = false;
/* Set by the user side as the run ends: nobody would continue a stop. */
bool no_more_stops = false;

/* Waking the reader for every event costs the traced thread an irq_work
 * each time; the reader polls every 50 ms anyway, so it is woken only
 * once this much is waiting (set to a quarter of the buffer). */
const volatile __u64 wake_bytes = 0;

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 64); /* resized by the user side */
} events SEC(".maps");

/* How much of the user stack each alloc event copies (--stack-bytes; 0
 * with --unwind=fp: the kernel's frame-pointer walk instead). */
const volatile __u32 stack_bytes = DD_PROF_DEFAULT_STACK;

/* The alloc event is built here, then copied into the ring buffer with its
 * real length. A plain array indexed by CPU rather than a per-CPU array:
 * a per-CPU value is at most 32 KiB. The slack after the event lets the
 * verifier accept a page-sized read at any offset below the maximum. */
struct alloc_scratch {
    struct dd_prof_alloc_event ev;
    __u8 slack[4096];
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1); /* set to the number of possible CPUs */
    __type(key, __u32);
    __type(value, struct alloc_scratch);
} scratch SEC(".maps");

/* Forks, execs, exits and loader events: few, each one waking the reader. */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 16);
} proc_events SEC(".maps");

/* The processes that run an interpreter whose frames are walked at each
 * sample (interp.h), tgid -> where to find them; set by the user side
 * when it recognises the interpreter among a process's objects. */
struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct dd_prof_interp_config);
} interp_procs SEC(".maps");

/* Interpreter code objects already announced on code_events, by
 * process: each is announced once (an LRU: one evicted is announced
 * again, which costs a read). */
struct interp_code_key {
    __u64 code;
    __u32 tgid, check;
};

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct interp_code_key);
    __type(value, __u8);
} interp_code_seen SEC(".maps");

/* New code objects, each waking the reader at once: it reads their names
 * from the process before the backlog of samples, while the code is
 * still there (exec'd code, a module's top-level code at its import). */
struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 16);
} code_events SEC(".maps");

__u64 lost_code = 0;

/* In front of interp_code_seen, per CPU: the codes seen last, one per
 * slot of a hash of (process, code, fingerprint). A frame's code is most
 * often one of them, and an array's lookup costs next to nothing where
 * the LRU's costs a hash, a lock and list updates. */
#define CODE_RECENT_SLOTS 512
struct code_recent {
    __u64 tag[CODE_RECENT_SLOTS];
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct code_recent);
} interp_code_recent SEC(".maps");

/* Announces the code of frame f (just recorded) if it is new. */
static __always_inline void note_code(const struct dd_prof_interp_frame *f)
{
    struct interp_code_key k = {.code = f->code,
                                .tgid = (__u32)(bpf_get_current_pid_tgid() >> 32),
                                .check = f->check};
    __u64 tag = (f->code ^ (__u64)k.check << 32 ^ (__u64)k.tgid << 48) | 1;
    __u32 zero = 0;
    struct code_recent *recent = bpf_map_lookup_elem(&interp_code_recent, &zero);
    __u32 slot = (__u32)((tag * 0x9e3779b97f4a7c15ull) >> 55) & (CODE_RECENT_SLOTS - 1);
    if (recent) {
        if (recent->tag[slot] == tag)
            return;
        recent->tag[slot] = tag;
    }
    if (bpf_map_lookup_elem(&interp_code_seen, &k))
        return;
    struct dd_prof_code_event ev = {.head = {.type = DD_PROF_EV_CODE,
                                             .tgid = k.tgid,
                                             .ts_ns = bpf_ktime_get_ns(),
                                             .ptr = f->code},
                                    .frame = *f};
    __u8 one = 1;
    if (bpf_ringbuf_output(&code_events, &ev, sizeof ev, BPF_RB_FORCE_WAKEUP) != 0)
        __sync_fetch_and_add(&lost_code, 1); /* not marked seen: announced next time */
    else
        bpf_map_update_elem(&interp_code_seen, &k, &one, BPF_ANY);
}

#include "python/python.bpf.h"

/* Ring-buffer failures by event type (index DD_PROF_EV_ALLOC or _FREE). */
__u64 lost[2] = {0, 0};
/* Process events the proc_events buffer had no room for. */
__u64 lost_proc = 0;

static __always_inline int ours(void)
{
    __u32 tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
    return bpf_map_lookup_elem(&followed, &tgid) != NULL;
}

static __always_inline void fill_head(struct dd_prof_event_head *h, __u32 type, __u64 ptr)
{
    h->type = type;
    h->tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
    h->ts_ns = bpf_ktime_get_ns();
    h->ptr = ptr;
}

static __always_inline __u64 wake_flag(void)
{
    return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wake_bytes ? BPF_RB_FORCE_WAKEUP
                                                                        : BPF_RB_NO_WAKEUP;
}

static __always_inline void copy_registers(struct pt_regs *regs, struct dd_prof_alloc_event *ev)
{
    ev->regs[DD_PROF_REG_PC] = PT_REGS_IP(regs);
    ev->regs[DD_PROF_REG_SP] = PT_REGS_SP(regs);
    ev->regs[DD_PROF_REG_FP] = PT_REGS_FP(regs);
#if defined(__TARGET_ARCH_arm64)
    /* A leaf function's caller is only in the link register. */
    ev->regs[DD_PROF_REG_LR] = PT_REGS_RET(regs);
#else
    ev->regs[3] = 0;
#endif
}

/* Copies up to stack_bytes of the user stack from sp up into ev->data;
 * returns how many bytes it got. A bpf_probe_read_user that crosses the
 * end of the stack's mapping fails as a whole, so the copy goes page by
 * page (the first read up to sp's page end): it stops exactly at the end
 * of the mapping, or at the first page not resident. */
static __always_inline __u32 copy_stack(struct dd_prof_alloc_event *ev, __u64 sp)
{
    __u64 want = stack_bytes;
    if (want > DD_PROF_MAX_STACK)
        want = DD_PROF_MAX_STACK;
    __u64 got = 0;
    for (int i = 0; i < DD_PROF_MAX_STACK / 4096 + 1; i++) {
        if (got >= want)
            break;
        __u64 at = sp + got;
        __u64 len = 4096 - (at & 4095);
        if (len > want - got)
            len = want - got;
        /* Bounds the verifier can see (the compiler knows them already
         * and would drop the tests without the barriers). */
        barrier_var(len);
        barrier_var(got);
        if (len > 4096 || got >= DD_PROF_MAX_STACK)
            break;
        if (bpf_probe_read_user(ev->data + got, len, (const void *)at) != 0)
            break;
        got += len;
    }
    ev->wanted = (__u32)want;
    return (__u32)got;
}

/* The probe contract (docs/probes.md) puts the arguments in the SysV
 * argument registers, in order; attach.c refuses a note that says
 * otherwise. Following, the uprobes are on the files, for every process:
 * ours() keeps the followed ones (the others never reach a site: their
 * semaphores stay 0, attach.c). */
SEC("uprobe")
int on_alloc(struct pt_regs *ctx)
{
    if (!ours())
        return 0;
    __u64 ptr = PT_REGS_PARM1(ctx), size = PT_REGS_PARM2(ctx), weight = PT_REGS_PARM3(ctx);
    __u32 cpu = bpf_get_smp_processor_id();
    struct alloc_scratch *s = bpf_map_lookup_elem(&scratch, &cpu);
    if (!s)
        return 0;
    struct dd_prof_alloc_event *ev = &s->ev;
    fill_head(&ev->head, DD_PROF_EV_ALLOC, ptr);
    ev->size = size;
    ev->weight = weight;
    ev->ninterp = 0;
    ev->interp_flags = 0;
    copy_registers(ctx, ev);
    __u32 len = 0;
    ev->wanted = 0;
    if (stack_bytes > 0)
        len = copy_stack(ev, ev->regs[DD_PROF_REG_SP]);
    if (len > 0) {
        ev->kind = DD_PROF_STACK_COPY;
    } else {
        /* --unwind=fp, or a stack that could not be read: the kernel's
         * frame-pointer walk (bpftrace's ustack): first the probe site,
         * then return addresses. */
        long got = bpf_get_stack(ctx, ev->data, DD_PROF_MAX_FRAMES * sizeof(__u64),
                                 BPF_F_USER_STACK);
        len = got > 0 ? (__u32)got : 0;
        ev->kind = DD_PROF_STACK_FRAMES;
    }
    barrier_var(len);
    if (len > DD_PROF_MAX_STACK)
        len = DD_PROF_MAX_STACK;
    ev->len = len;
    /* The interpreter's frames, if it runs one, after the stack. */
    __u32 tgid = ev->head.tgid;
    __u64 end = len;
    struct dd_prof_interp_config *interp = bpf_map_lookup_elem(&interp_procs, &tgid);
    if (interp && interp->kind == DD_PROF_INTERP_PYTHON) {
        python_walk(&interp->python, ev, DD_PROF_INTERP_AT(len), cpu);
        __u64 n = ev->ninterp;
        if (n > DD_PROF_MAX_INTERP_FRAMES)
            n = DD_PROF_MAX_INTERP_FRAMES;
        if (n)
            end = DD_PROF_INTERP_AT(len) + n * sizeof(struct dd_prof_interp_frame);
    }
    /* (64-bit, and the bound tested on the very register passed on: a
     * 32-bit copy's test would not bound it for the verifier.) */
    barrier_var(end);
    if (end > PY_RECORDS_END)
        end = PY_RECORDS_END;
    barrier_var(end);
    if (bpf_ringbuf_output(&events, ev, offsetof(struct dd_prof_alloc_event, data) + end,
                           wake_flag()) != 0)
        __sync_fetch_and_add(&lost[DD_PROF_EV_ALLOC], 1);
    return 0;
}

SEC("uprobe")
int on_free(struct pt_regs *ctx)
{
    if (!ours())
        return 0;
    __u64 ptr = PT_REGS_PARM1(ctx);
    struct dd_prof_free_event *ev = bpf_ringbuf_reserve(&events, sizeof *ev, 0);
    if (!ev) {
        __sync_fetch_and_add(&lost[DD_PROF_EV_FREE], 1);
        return 0;
    }
    fill_head(&ev->head, DD_PROF_EV_FREE, ptr);
    bpf_ringbuf_submit(ev, wake_flag());
    return 0;
}

static __always_inline void proc_event(__u32 type, __u32 tgid, __u64 arg)
{
    struct dd_prof_event_head *h = bpf_ringbuf_reserve(&proc_events, sizeof *h, 0);
    if (!h) {
        __sync_fetch_and_add(&lost_proc, 1);
        return;
    }
    h->type = type;
    h->tgid = tgid;
    h->ts_ns = bpf_ktime_get_ns();
    h->ptr = arg;
    bpf_ringbuf_submit(h, BPF_RB_FORCE_WAKEUP);
}

#define DD_SIGSTOP 19

/* A new process (not a thread) of a followed one is followed from its
 * first instruction: the fork runs in the parent, before the child. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
    __u32 parent_tgid = BPF_CORE_READ(parent, tgid), child_tgid = BPF_CORE_READ(child, tgid);
    if (!follow_children || parent_tgid == child_tgid ||
        !bpf_map_lookup_elem(&followed, &parent_tgid))
        return 0;
    /* Never stopped at its fork (its parent could see that, and it runs
     * its parent's image, semaphores included); at its exec, maybe. */
    __u32 flags = stop_forked_at_exec ? DD_PROF_STOP_AT_EXEC : 0;
    bpf_map_update_elem(&followed, &child_tgid, &flags, BPF_ANY);
    proc_event(DD_PROF_EV_FORK, child_tgid, parent_tgid);
    return 0;
}

/* The exec has replaced the image; the new one has not run. The signal
 * is pending until the return to user space, and the event is sent after
 * it, so whatever the reader does on the event comes after the stop. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm)
{
    __u32 tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
    __u32 *flags = bpf_map_lookup_elem(&followed, &tgid);
    if (!flags) {
        if (exec_all)
            proc_event(DD_PROF_EV_EXEC_OTHER, tgid, 0);
        return 0;
    }
    __u64 stopped = 0;
    if ((*flags & DD_PROF_STOP_AT_EXEC) && !no_more_stops && bpf_send_signal(DD_SIGSTOP) == 0)
        stopped = 1;
    proc_event(DD_PROF_EV_EXEC, tgid, stopped);
    return 0;
}

/* The last thread of a followed process is exiting. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
    __u32 tgid = BPF_CORE_READ(p, tgid);
    if (BPF_CORE_READ(p, signal, live.counter) != 0 || !bpf_map_lookup_elem(&followed, &tgid))
        return 0;
    bpf_map_delete_elem(&followed, &tgid);
    proc_event(DD_PROF_EV_EXIT, tgid, 0);
    return 0;
}

/* glibc's dynamic loader calls _dl_debug_state() (the debugger's hook)
 * around every change of its link map: at start and at each dlopen and
 * dlclose. The attach cookie is the distance from the function to
 * _r_debug.r_state, which says whether the change is complete. */
SEC("uprobe")
int on_loader(struct pt_regs *ctx)
{
    __u32 tgid = (__u32)(bpf_get_current_pid_tgid() >> 32);
    __u32 *flags = bpf_map_lookup_elem(&followed, &tgid);
    if (!flags)
        return 0;
    int state = -1;
    __u64 at = PT_REGS_IP(ctx) + bpf_get_attach_cookie(ctx);
    if (bpf_probe_read_user(&state, sizeof state, (void *)at) != 0 ||
        state != DD_PROF_RT_CONSISTENT)
        return 0;
    if ((*flags & DD_PROF_STOP_AT_LOADER) && !no_more_stops) {
        __u32 rest = *flags & ~(__u32)DD_PROF_STOP_AT_LOADER;
        bpf_map_update_elem(&followed, &tgid, &rest, BPF_EXIST);
        bpf_send_signal(DD_SIGSTOP);
    }
    proc_event(DD_PROF_EV_LOADED, tgid, 0);
    return 0;
}

/*
 * ddheap-prof, kernel side: two USDT programs, attached to a process's
 * `alloc` and `free` probes (provider `ddheap` or `otel_memory`), that copy
 * each event into a BPF ring buffer for the user side (loop.c).
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
#include <bpf/bpf_tracing.h>
#include <bpf/usdt.bpf.h>

#include "ddheap_prof.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set by the user side before loading: the process to report (uprobes
 * attached with a pid are already filtered by it; this also drops events
 * of a child that inherited the breakpoints across fork). */
const volatile __u32 target_tgid = 0;

/* Waking the reader for every event costs the traced thread an irq_work
 * each time; the reader polls every 50 ms anyway, so it is woken only
 * once this much is waiting (set to a quarter of the buffer). */
const volatile __u64 wake_bytes = 0;

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096 * 64); /* resized by the user side */
} events SEC(".maps");

/* The alloc event is built here, then copied into the ring buffer with its
 * real length: a stack is usually much shorter than the maximum. */
struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct dd_prof_alloc_event);
} scratch SEC(".maps");

/* Ring-buffer failures by event type (index DD_PROF_EV_ALLOC or _FREE). */
__u64 lost[2] = {0, 0};

static __always_inline int ours(void)
{
    return (__u32)(bpf_get_current_pid_tgid() >> 32) == target_tgid;
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

SEC("usdt")
int BPF_USDT(on_alloc, __u64 ptr, __u64 size, __u64 weight)
{
    if (!ours())
        return 0;
    __u32 zero = 0;
    struct dd_prof_alloc_event *ev = bpf_map_lookup_elem(&scratch, &zero);
    if (!ev)
        return 0;
    fill_head(&ev->head, DD_PROF_EV_ALLOC, ptr);
    ev->size = size;
    ev->weight = weight;
    /* The kernel's frame-pointer walk of the user stack (the same walk as
     * bpftrace's ustack): first the probe site, then return addresses. */
    long got = bpf_get_stack(ctx, ev->frames, sizeof ev->frames, BPF_F_USER_STACK);
    if (got < 0)
        got = 0;
    __u64 bytes = (__u64)got;
    if (bytes > sizeof ev->frames)
        bytes = sizeof ev->frames;
    ev->nframes = (__u32)(bytes / sizeof ev->frames[0]);
    ev->pad = 0;
    __u64 len = offsetof(struct dd_prof_alloc_event, frames) + bytes;
    if (len > sizeof *ev)
        len = sizeof *ev;
    if (bpf_ringbuf_output(&events, ev, len, wake_flag()) != 0)
        __sync_fetch_and_add(&lost[DD_PROF_EV_ALLOC], 1);
    return 0;
}

SEC("usdt")
int BPF_USDT(on_free, __u64 ptr)
{
    if (!ours())
        return 0;
    struct dd_prof_free_event *ev = bpf_ringbuf_reserve(&events, sizeof *ev, 0);
    if (!ev) {
        __sync_fetch_and_add(&lost[DD_PROF_EV_FREE], 1);
        return 0;
    }
    fill_head(&ev->head, DD_PROF_EV_FREE, ptr);
    bpf_ringbuf_submit(ev, wake_flag());
    return 0;
}

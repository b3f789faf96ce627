/*
 * The USDT probes: the only place they are expanded, so each appears once
 * per provider in .note.stapsdt (a tracer attaching to a probe that appears
 * twice would attach twice).
 *
 * The contract (docs/probes.md) says the arguments sit in the SysV argument
 * registers, in order, because the OpenTelemetry profiler reads them from
 * pt_regs without parsing the note. Each probe function therefore pins its
 * arguments to rdi/rsi/rdx/rcx (x0..x3 on aarch64) with local register
 * variables and an "r" constraint: the note then reads `8@%rdi 8@%rsi ...`
 * in every build type, -O0 included, where the default "nor" constraint
 * would describe stack slots.
 *
 * The probe site is sys/sdt.h's own 1-byte nop. A 5-byte nop would let a
 * kernel that optimises uprobes (Linux 6.18 does) replace a hit probe by
 * a call into a trampoline page, about halving the cost of a hit; but a
 * child forked after that inherits the call and not the page, and
 * crashes at its next probe hit (measured here: every forked child of a
 * traced program, SIGSEGV at the trampoline's address). A program that
 * forks without exec (a server's workers, redis's BGSAVE, Python's
 * multiprocessing) must survive being traced: tests/tracer/fork_probe.c.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>

#define _SDT_HAS_SEMAPHORES 1
#if defined(__x86_64__)
#define STAP_SDT_ARG_CONSTRAINT r
#elif defined(__aarch64__)
#define STAP_SDT_ARG_CONSTRAINT r
#endif
#include <sys/sdt.h>

/* The semaphores, laid out by hand so that the two alloc semaphores form
 * one aligned 32-bit word, ddheap__tracer_gate, which the fast path loads
 * once. A tracer increments a semaphore on attach and decrements it on
 * detach; the symbols are local so that no foreign name (otel_memory_*)
 * leaks into the archive's global symbols. */
__asm__(".pushsection .probes,\"aw\",%progbits\n"
        ".balign 8\n"
        ".globl ddheap__tracer_gate\n"
        ".hidden ddheap__tracer_gate\n"
        ".type ddheap__tracer_gate, %object\n"
        ".size ddheap__tracer_gate, 4\n"
        "ddheap__tracer_gate:\n"
        "ddheap_alloc_semaphore: .2byte 0\n"
        "otel_memory_alloc_semaphore: .2byte 0\n"
        "ddheap_free_semaphore: .2byte 0\n"
        "otel_memory_free_semaphore: .2byte 0\n"
        "ddheap_realloc_semaphore: .2byte 0\n"
        "otel_memory_realloc_semaphore: .2byte 0\n"
        ".popsection\n");

/* sys/sdt.h names the semaphores in C too (an "m" operand). */
extern unsigned short ddheap_alloc_semaphore DDHEAP__HIDDEN;
extern unsigned short ddheap_free_semaphore DDHEAP__HIDDEN;
extern unsigned short ddheap_realloc_semaphore DDHEAP__HIDDEN;
extern unsigned short otel_memory_alloc_semaphore DDHEAP__HIDDEN;
extern unsigned short otel_memory_free_semaphore DDHEAP__HIDDEN;
extern unsigned short otel_memory_realloc_semaphore DDHEAP__HIDDEN;

/* The platform's first four integer argument registers, which the probe
 * notes name (docs/probes.md, "Registers"). */
#if defined(__x86_64__)
#define DDHEAP_REG1 "rdi"
#define DDHEAP_REG2 "rsi"
#define DDHEAP_REG3 "rdx"
#define DDHEAP_REG4 "rcx"
#elif defined(__aarch64__)
#define DDHEAP_REG1 "x0"
#define DDHEAP_REG2 "x1"
#define DDHEAP_REG3 "x2"
#define DDHEAP_REG4 "x3"
#endif
#define DDHEAP_ARG_REG1(a) register uint64_t a1 __asm__(DDHEAP_REG1) = (a)
#define DDHEAP_ARG_REGS(a, b, c, d)                                                                \
    DDHEAP_ARG_REG1(a);                                                                            \
    register uint64_t a2 __asm__(DDHEAP_REG2) = (b);                                               \
    register uint64_t a3 __asm__(DDHEAP_REG3) = (c);                                               \
    register uint64_t a4 __asm__(DDHEAP_REG4) = (d)

static dd_probe_hook_fn probe_hook;
static void *probe_hook_ctx;

void ddheap_test_set_probe_hook(dd_probe_hook_fn hook, void *ctx)
{
    __atomic_store_n(&probe_hook_ctx, ctx, __ATOMIC_RELAXED);
    __atomic_store_n(&probe_hook, hook, __ATOMIC_RELEASE);
}

/* The hook is foreign code inside someone's malloc: errno is kept around
 * it here, the only place a probe can change it (the probe sites are nops).
 * Out of line, so that the probe functions stay frame-light when no hook
 * is set (bench/: saving errno inline cost 13 instructions per probe). */
__attribute__((noinline, cold)) static void run_hook(dd_probe_hook_fn hook, dd_probe_kind_t kind,
                                                     uintptr_t ptr, uintptr_t new_ptr,
                                                     uint64_t size, uint64_t weight)
{
    int saved_errno = errno;
    dd_probe_event_t ev = {kind, ptr, new_ptr, size, weight};
    hook(&ev, __atomic_load_n(&probe_hook_ctx, __ATOMIC_RELAXED));
    errno = saved_errno;
}

static inline void call_hook(dd_probe_kind_t kind, uintptr_t ptr, uintptr_t new_ptr, uint64_t size,
                             uint64_t weight)
{
    dd_probe_hook_fn hook = __atomic_load_n(&probe_hook, __ATOMIC_ACQUIRE);
    if (hook)
        run_hook(hook, kind, ptr, new_ptr, size, weight);
}

/* Whether a test hook may be set: on x86-64 one compare with memory and a
 * branch (ddheap__nonzero64, as the fast path's tests), one instruction
 * less on every probe than a load and a test. The hook itself is loaded
 * with acquire ordering where it is called. */
static inline int hook_may_be_set(void)
{
    return ddheap__nonzero64((const uint64_t *)(const void *)&probe_hook);
}

/* The free probe's hook, as a tail call that hands `out` back: the probe
 * function then keeps nothing across a call. */
__attribute__((noinline, cold)) static dd_alloc_freed_t run_free_hook(uintptr_t ptr,
                                                                      dd_alloc_freed_t out)
{
    call_hook(DD_PROBE_FREE, ptr, 0, 0, 0);
    return out;
}

/* The alloc probe's hook, likewise handing the user pointer back. */
__attribute__((noinline, cold)) static void *run_alloc_hook(uintptr_t ptr, uint64_t size,
                                                          uint64_t weight)
{
    call_hook(DD_PROBE_ALLOC, ptr, 0, size, weight);
    return (void *)ptr;
}

/* noinline (+ noclone for GCC, whose IPA could otherwise specialise a copy
 * with the probe inside): one expansion each, in a function of its own. */
#if defined(__clang__)
#define DDHEAP_PROBE_FN __attribute__((noinline, used))
#else
#define DDHEAP_PROBE_FN __attribute__((noinline, noclone, used))
#endif

/*
 * A frame of the probe function's own at the probe site, in every build
 * type and with either compiler (docs/probes.md, "Stacks").
 *
 * A tracer's stack at a probe is a frame-pointer walk: the probe site,
 * then the return address of each frame on the rbp (x29) chain. A
 * function that has not set up its frame hides the return address on top
 * of its stack (in x30 on aarch64), i.e. the function that called it. The
 * probe functions are reached by tail calls: the user's wrapper ends in
 * `return dd_allocation_created(...)`, a jump into the cold path at -O2,
 * which itself ends in a jump here. The return address on top of the
 * stack is then the one into the allocation site, and only a frame set up
 * here puts it on the chain. Without one, -fno-omit-frame-pointer is not
 * enough: these functions need no stack, and GCC's shrink-wrapping moves
 * the prologue onto the test hook's path, or drops it.
 *
 * Taking the frame's address makes both compilers set up the frame (push
 * rbp; mov rsp, rbp / stp x29, x30; mov x29, sp) before anything that
 * uses it, and the empty volatile asm that uses it stays before the
 * probe's own volatile asm. It costs the frame (3 instructions per probe
 * on x86-64), on the sampled path only.
 */
#define DDHEAP_FRAME_AT_PROBE() __asm__ volatile("" : : "r"(__builtin_frame_address(0)))

DDHEAP_PROBE_FN void *ddheap_fire_alloc(uintptr_t ptr, uint64_t size, uint64_t weight)
{
    DDHEAP_FRAME_AT_PROBE();
    DDHEAP_ARG_REGS(ptr, size, weight, 0);
    (void)a4;
#if DDHEAP_PROVIDER_DDHEAP
    STAP_PROBE3(ddheap, alloc, a1, a2, a3);
#endif
#if DDHEAP_PROVIDER_OTEL
    STAP_PROBE3(otel_memory, alloc, a1, a2, a3);
#endif
    if (DDHEAP__UNLIKELY(hook_may_be_set()))
        return run_alloc_hook(ptr, size, weight);
    return (void *)ptr;
}

/* `raw` and `size` only pass through, in rsi/rdx (x1/x2), to come back
 * as the result in rax:rdx (x0:x1); only the probe's own argument
 * register is pinned, so nothing overwrites them. */
DDHEAP_PROBE_FN dd_alloc_freed_t ddheap_fire_free(uintptr_t ptr, void *raw, size_t size)
{
    DDHEAP_FRAME_AT_PROBE();
    DDHEAP_ARG_REG1(ptr);
#if DDHEAP_PROVIDER_DDHEAP
    STAP_PROBE1(ddheap, free, a1);
#endif
#if DDHEAP_PROVIDER_OTEL
    STAP_PROBE1(otel_memory, free, a1);
#endif
    dd_alloc_freed_t out = {raw, size};
    if (DDHEAP__UNLIKELY(hook_may_be_set()))
        return run_free_hook(ptr, out);
    return out;
}

DDHEAP_PROBE_FN void ddheap_fire_realloc(uintptr_t old_ptr, uintptr_t new_ptr, uint64_t size,
                                         uint64_t weight)
{
    DDHEAP_FRAME_AT_PROBE();
    DDHEAP_ARG_REGS(old_ptr, new_ptr, size, weight);
#if DDHEAP_PROVIDER_DDHEAP
    STAP_PROBE4(ddheap, realloc, a1, a2, a3, a4);
#endif
#if DDHEAP_PROVIDER_OTEL
    STAP_PROBE4(otel_memory, realloc, a1, a2, a3, a4);
#endif
    call_hook(DD_PROBE_REALLOC, old_ptr, new_ptr, size, weight);
}

bool dd_heap_profiler_attached(void)
{
    return __atomic_load_n(&ddheap__tracer_gate, __ATOMIC_RELAXED) != 0;
}

void dd_heap_simulate_tracer(bool attached)
{
    /* Exactly what a tracer does: count attaches on the semaphore. The
     * ddheap provider's alloc semaphore is the gate's first half. */
    unsigned short now = __atomic_load_n(&ddheap_alloc_semaphore, __ATOMIC_RELAXED);
    unsigned short next;
    do {
        if (attached)
            next = now == USHRT_MAX ? now : (unsigned short)(now + 1);
        else
            next = now == 0 ? 0 : (unsigned short)(now - 1); /* never below "detached" */
    } while (!__atomic_compare_exchange_n(&ddheap_alloc_semaphore, &now, next, true,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

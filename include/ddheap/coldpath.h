/*
 * What the inlined fast path (ddheap/fastpath.h) needs from the library:
 * the per-thread countdown, the process-wide marking state and the cold-path
 * entry points. Nothing here is API; names carry a `ddheap__` prefix and may
 * change between releases. Include <ddheap.h> instead.
 */
#ifndef DDHEAP_COLDPATH_H
#define DDHEAP_COLDPATH_H

#include <stddef.h>
#include <stdint.h>

#include <ddheap/config.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DDHEAP__HIDDEN __attribute__((visibility("hidden")))
#define DDHEAP__LIKELY(x) __builtin_expect(!!(x), 1)
#define DDHEAP__UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#error "ddheap needs GCC or Clang"
#endif

/* Per-thread sampler state. Static TLS, zero-initialised, no destructor:
 * all-zero means "not initialised yet", and a zero countdown sends the
 * first non-empty allocation to the cold path, which initialises it. */
struct ddheap__thread {
    uint64_t countdown; /* bytes left before the next sample point */
    uint64_t mean;      /* the interval R this countdown was drawn with */
    uint64_t rng;       /* generator state; 0 until initialised */
    uint32_t epoch;     /* interval setting this thread last adopted */
    uint16_t busy;      /* reentry guard: non-zero inside the cold path */
    uint8_t tagging;    /* aarch64 TBI: enum ddheap__tagging in src/ */
    uint8_t seed_fixed; /* the generator was seeded by ddheap_test_seed_thread */
};

/* The TLS access model of the countdown decides the cost of every traced
 * allocation. In a shared library (-fPIC without -fPIE): initial-exec, a
 * %fs/tpidr_el0-relative access through an offset loaded from the GOT (a
 * dlopen'ed library draws on glibc's static TLS reserve, which this small
 * block fits). In an executable: local-exec, the offset is a link-time
 * constant inside the access itself, one load less. The symbol is hidden,
 * so it is always defined in the module that uses it, as local-exec needs;
 * code built for an executable but linked into a shared library is refused
 * by the linker (R_X86_64_TPOFF32), never miscompiled. */
#if defined(__PIC__) && !defined(__PIE__)
#define DDHEAP__TLS_MODEL "initial-exec"
#else
#define DDHEAP__TLS_MODEL "local-exec"
#endif
extern __thread struct ddheap__thread ddheap__thread_state
    __attribute__((tls_model(DDHEAP__TLS_MODEL))) DDHEAP__HIDDEN;

/* The alloc-probe semaphores of both providers, adjacent in `.probes`
 * (src/probes.c), read as one 32-bit word: non-zero iff a tracer (or
 * dd_heap_simulate_tracer) is attached to either provider's alloc probe. */
extern uint32_t ddheap__tracer_gate DDHEAP__HIDDEN;

/* Process-wide marking state, one instance per process however many copies
 * of ddheap are linked in (an executable and its shared libraries each may
 * carry one): the symbol is STB_GNU_UNIQUE, so the dynamic linker binds
 * every copy to the same object. A block sampled by one copy is recognised
 * and released by any other copy of the same scheme. The layout is the same
 * whatever scheme a copy marks with (copies of different schemes may share a
 * process: a header-marking executable under the shadow-marking libc
 * interposer); the `_v3` suffix is its version. */
#define DDHEAP__PAGE 4096u
#define DDHEAP__HEADER 16u
#define DDHEAP__TABLE_SLOTS 16384u
#define DDHEAP__FREE_GATES 64u
/* Shadow scheme (src/mark_shadow.h): the summary has one counter per
 * page-number residue modulo 2^20 (the free path indexes it with the
 * address's bits 12..31); the bitmap words live in up to SHADOW_LEVELS
 * mmap'd tables. */
#define DDHEAP__SHADOW_SUMMARY_BITS 20u
#define DDHEAP__SHADOW_LEVELS 14u

/* ddheap__shared.status: bits of what the library could not do. */
#define DDHEAP__STATUS_MALLOC_AHEAD 1u      /* malloc is bound to a definition ahead of
                                               libddheap_preload.so: unprofiled */
#define DDHEAP__STATUS_PREFIXED_ONLY 2u     /* an allocator with prefixed names only
                                               (je_malloc) is loaded: unprofiled */
#define DDHEAP__STATUS_BAD_ENABLED 4u       /* DD_HEAP_SAMPLING_ENABLED ignored */
#define DDHEAP__STATUS_BAD_INTERVAL 8u      /* DD_HEAP_SAMPLING_INTERVAL ignored */
#define DDHEAP__STATUS_BAD_RATE 16u         /* DD_HEAP_SAMPLES_PER_SECOND ignored */

struct ddheap__table_slot {
    uintptr_t user;  /* 0: free slot */
    uint64_t meta;   /* offset, extra, reported (src/mark.h) */
    uint64_t size;   /* what the block's alloc probe reported (src/realloc.c */
    uint64_t weight; /* reports it again if a realloc fails); 0: nothing */
};

struct ddheap__shared {
    /* Read by every free: zero while no header- or tag-marked block is live
     * anywhere in the process, which lets frees skip the header read
     * entirely. Written (atomically) on every mark and unmark, so it has a
     * line of its own: the keys below, read by every free while something
     * is live, must not bounce between cores with it. */
    uint64_t live_marked;
    /* The same for the shadow scheme, which counts its own marks: a copy
     * of one scheme then never pays the other's free-time test for blocks
     * it cannot have marked (each scheme looks only at its own marks). */
    uint64_t shadow_live;
    uint64_t line0_pad[6];
    /* Header keys, derived from AT_RANDOM (identical in every copy);
     * written once before the first block is marked, then only read.
     * key_filter makes a header's first word (user ^ key_filter), which the
     * inline free path compares; key_xor and key_mul make the tag in its
     * meta word, which the cold path verifies (src/mark_header.c). */
    uint64_t key_filter;
    uint64_t key_xor;
    uint64_t key_mul; /* odd */
    uint64_t keys_ready;
    uint64_t line1_pad[4];
    /* Table of marked blocks whose user pointer is in the first 16 bytes
     * of a page (no room for a readable header): page-and-larger aligned
     * blocks, and the rare small block that lands there. */
    uint64_t table_live;
    uint64_t table_overflow; /* entries placed outside their probe window */
    uint32_t free_gates_open; /* ddheap__free_gate: see below */
    uint32_t free_gate_count; /* slots of free_gates handed out */
    /* What the library found wrong in this process, DDHEAP__STATUS_* bits
     * set with an atomic OR (never cleared). The library writes nothing on
     * the program's streams: a profiler reads this word from the process
     * (ddheap-prof does, and says it on its own stderr). It was padding in
     * earlier libraries, which leave it 0: the layout and size are
     * unchanged, so the `_v3` name stays. */
    uint64_t status;
    uint64_t line2_pad[4];
    struct ddheap__table_slot table[DDHEAP__TABLE_SLOTS];
    /* The address of each copy's ddheap__free_gate (bit 0 set while an
     * opener writes through it; NULL once the copy is unloaded). */
    uintptr_t free_gates[DDHEAP__FREE_GATES];
    /* Shadow scheme (src/mark_shadow.c): the tables of bitmap words,
     * installed lazily by compare-and-swap (NULL: not mapped yet); the bits
     * set in tables other than the first (0: a lookup reads the first
     * only); the sampled blocks that found no room in any table. */
    uint64_t *shadow_levels[DDHEAP__SHADOW_LEVELS];
    uint64_t shadow_upper_live;
    uint64_t shadow_overflow;
    /* Shadow summary: counter i is at least the number of set bits for
     * addresses whose bits 12..31 equal i (saturating at 255, then sticky).
     * Zero lets a free skip the bitmap. */
    uint8_t shadow_summary[1u << DDHEAP__SHADOW_SUMMARY_BITS];
};

extern struct ddheap__shared ddheap_shared_v3 __attribute__((visibility("default")));

/* The free path's first test in a shared library (header and shadow
 * schemes). There, reading live_marked (shadow_live) takes two
 * instructions and a branch: the address of ddheap_shared_v3 comes from
 * the GOT. This per-copy byte is read
 * RIP-relative, in one compare: 0 means no block has ever been marked in
 * the process (and none can be without this byte changing first); 1, the
 * initial value, means "not known yet" (the copy's constructor has not run,
 * or it could not register); 2 means opened. The first block marked in the
 * process opens every registered copy's gate before it is handed out
 * (src/shared.c); a gate never closes again. */
extern uint8_t ddheap__free_gate DDHEAP__HIDDEN;

/* Cold-path entry points (src/). A sampled request's dd_alloc_req_t goes
 * through memory, written where the caller says. Returned in registers
 * instead, GCC keeps its fields in callee-saved registers across the real
 * allocation, and the prologue that saves them then runs on every
 * allocation, traced or not (bench/: +8 instructions per pair with no
 * tracer). Returned as a struct in memory (the hidden pointer of the
 * calling convention), the callee must hand that pointer back in rax, and
 * GCC then keeps it in a saved register across its own calls, even those
 * on paths the request rarely takes: 4 instructions on every sampled
 * request that an explicit out pointer does without. */
struct dd_alloc_req;
struct dd_alloc_freed;
struct dd_realloc_prep;
/* Read on its own (the headers' self-containment check), this header
 * declares functions that return the structs <ddheap.h> defines later;
 * clang's C++ front end warns about an incomplete return type behind C
 * linkage. Every call site sees the complete C structs. */
#if defined(__cplusplus) && defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wreturn-type-c-linkage"
#endif
DDHEAP__HIDDEN void ddheap__sample_request(struct dd_alloc_req *out, size_t size, size_t alignment);
DDHEAP__HIDDEN void *ddheap__sample_created(void *raw, size_t user_size, uint64_t weight,
                                            size_t extra);
DDHEAP__HIDDEN struct dd_alloc_freed ddheap__release(void *user, size_t size);
/* src/realloc.c: a realloc with a tracer attached or a marked old block */
DDHEAP__HIDDEN struct dd_realloc_prep ddheap__realloc_prepare(void *old_user, size_t new_size);
DDHEAP__HIDDEN void *ddheap__realloc_commit(void *old_user, void *new_raw,
                                            struct dd_realloc_prep prep);
#if defined(__cplusplus) && defined(__clang__)
#pragma clang diagnostic pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* DDHEAP_COLDPATH_H */

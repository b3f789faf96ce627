/*
 * ddheap — sampled heap profiling for any allocator, read by an eBPF tracer.
 *
 * Wire your allocator with three calls (plus two for realloc). A complete
 * malloc-style wrapper over libc looks like this:
 *
 *     #include <ddheap.h>
 *     #include <stdlib.h>
 *
 *     void *my_malloc(size_t size)
 *     {
 *         dd_alloc_req_t req = dd_allocation_requested(size, 0);
 *         return dd_allocation_created(malloc(req.size), req);
 *     }
 *
 *     void *my_aligned_alloc(size_t alignment, size_t size)
 *     {
 *         dd_alloc_req_t req = dd_allocation_requested(size, alignment);
 *         return dd_allocation_created(aligned_alloc(req.alignment, req.size), req);
 *     }
 *
 *     void my_free(void *ptr)
 *     {
 *         dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
 *         free(f.ptr);
 *     }
 *
 *     void my_free_sized(void *ptr, size_t size)        // sized free: f.size is
 *     {                                                 // what the real allocator
 *         dd_alloc_freed_t f = dd_allocation_freed(ptr, size, 0);  // was asked for
 *         free_sized_for_real(f.ptr, f.size);
 *     }
 *
 *     void *my_realloc(void *ptr, size_t size)
 *     {
 *         dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
 *         void *raw = realloc(prep.raw_ptr, prep.raw_size);
 *         return dd_allocation_realloc_commit(ptr, raw, prep);
 *     }
 *
 * Rules of the road:
 *  - Always hand the real allocator req.size / req.alignment (a sampled
 *    request is a little larger) and always free f.ptr with f.size.
 *  - dd_allocation_created() must see the pointer the real allocator
 *    returned, NULL included (NULL is passed through and nothing is reported).
 *  - Every block that went through dd_allocation_created() must be released
 *    through dd_allocation_freed() or the realloc pair, never freed raw.
 *  - alignment 0 means "the allocator's default" (at most 16 bytes); any
 *    other value must be a power of two or the block is never sampled.
 *
 * Nothing happens until a tracer attaches to the `alloc` probe of provider
 * `ddheap` or `otel_memory` (see docs/probes.md). Then, about once per
 * sampling interval of allocated bytes (default 512 KiB, Poisson), a block
 * is sampled and reported with a weight whose expected sum equals the bytes
 * really allocated. Build with `pkg-config --cflags --libs ddheap`.
 */
#ifndef DDHEAP_H
#define DDHEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDHEAP_VERSION_MAJOR 0
#define DDHEAP_VERSION_MINOR 1
#define DDHEAP_VERSION_PATCH 0

#if defined(__GNUC__) && !defined(DDHEAP_NO_VISIBILITY)
#define DDHEAP_API __attribute__((visibility("default")))
#else
#define DDHEAP_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* What dd_allocation_requested() tells the caller to ask the real allocator
 * for. `size`/`alignment` go to the real allocator; `user_size` is what the
 * application asked for; `weight` is non-zero exactly when this block is
 * sampled (it is then the unbiased byte estimate the probe reports). */
typedef struct dd_alloc_req {
    size_t size;
    size_t user_size;
    size_t alignment;
    uint64_t weight;
} dd_alloc_req_t;

/* What dd_allocation_freed() tells the caller to hand the real free:
 * `ptr` is the pointer the real allocator returned, `size` the size it was
 * asked for (0 when the caller passed 0, i.e. an unsized free). */
typedef struct dd_alloc_freed {
    void *ptr;
    size_t size;
} dd_alloc_freed_t;

/* Carried from dd_allocation_realloc_prepare() to _commit(). The caller
 * reads `raw_ptr` and `raw_size` only: realloc(prep.raw_ptr, prep.raw_size). */
typedef struct dd_realloc_prep {
    void *raw_ptr;
    size_t raw_size;
    size_t new_size;       /* what the application asked for */
    uint64_t weight;       /* non-zero: the new block is sampled */
    uint32_t old_offset;   /* user - raw of the old block, if it was marked */
    uint32_t old_extra;    /* its real size minus its user size */
    uint32_t new_offset;   /* user - raw the new block will get */
    uint32_t flags;        /* 0: neither block needs the cold path (src/realloc.c) */
    uint64_t old_size;     /* what the old block was reported with: prepare */
    uint64_t old_weight;   /* reports it freed, commit reports it again if the
                            * real realloc fails (0: not reported, or not kept) */
} dd_realloc_prep_t;

/* Sets the mean sampling interval R in bytes for the whole process
 * (0 restores the default, 512 KiB; 1 samples every non-empty allocation
 * with weight = size). The calling thread switches at once; other threads
 * switch at their next sample point, so every reported weight stays
 * computed with the interval its countdown was drawn with. */
DDHEAP_API void dd_set_default_sampling_interval(uint64_t bytes);

/* The configured mean sampling interval (environment or the call above).
 * The sampling-rate limit below may draw countdowns with a larger one. */
DDHEAP_API uint64_t dd_get_default_sampling_interval(void);

/* Caps the samples the whole process reports per second, however fast it
 * allocates (0: no limit; default 3000, or DD_HEAP_SAMPLES_PER_SECOND). A
 * process-wide controller, shared by every thread and every copy of
 * ddheap in the process, raises the mean interval above the configured
 * one while the allocation rate would exceed the limit, and lowers it back
 * (never below the configured interval) when the rate falls. Weights stay
 * unbiased: each is computed with the interval its own countdown was drawn
 * with. An interval of 1 (every allocation, exactly) is never limited.
 * What is guaranteed, and how fast it adapts: docs/performance.md, "Rate
 * limit". */
DDHEAP_API void dd_set_max_samples_per_second(uint64_t samples_per_second);

/* The current limit in samples per second (0: none). */
DDHEAP_API uint64_t dd_get_max_samples_per_second(void);

/* The mean interval new countdowns are drawn with now: the configured one,
 * or the larger one the rate limit currently needs. Each thread adopts it
 * at its next sample point. */
DDHEAP_API uint64_t dd_get_effective_sampling_interval(void);

/* True while a tracer is attached to the `alloc` probe of either provider
 * (or one is simulated with dd_heap_simulate_tracer()). */
DDHEAP_API bool dd_heap_profiler_attached(void);

/* Makes ddheap behave as if a tracer were attached (true) or removes that
 * pretence (false): exactly what bpftrace does to the probe semaphore, so
 * the whole sampling path runs without a tracer. Calls nest like attaches.
 * For tests and benchmarks; the probes still fire into the void. */
DDHEAP_API void dd_heap_simulate_tracer(bool attached);

/* Whether the calling thread can sample, and if not, why
 * (dd_heap_thread_sampling_status()). Only aarch64 builds with pointer
 * tagging (docs/arm64.md) ever report PENDING, NO_TAGGED_ADDR or MTE. */
enum dd_heap_thread_status {
    DD_HEAP_THREAD_SAMPLING_READY = 0,   /* samples while a tracer is attached */
    DD_HEAP_THREAD_SAMPLING_PENDING = 1, /* decided at its first sampling opportunity */
    DD_HEAP_THREAD_SAMPLING_DISABLED = 2, /* DD_HEAP_SAMPLING_ENABLED turned it off */
    DD_HEAP_THREAD_SAMPLING_NO_TAGGED_ADDR = 3, /* the kernel refused tagged addresses */
    DD_HEAP_THREAD_SAMPLING_MTE = 4,     /* MTE tag checks are on: a tag would fault */
};

/* One of enum dd_heap_thread_status for the calling thread. A thread that
 * reports NO_TAGGED_ADDR or MTE never samples; its frees still work. */
DDHEAP_API int dd_heap_thread_sampling_status(void);

/* Puts the malloc family through ddheap in this running process, with
 * no restart and no LD_PRELOAD (docs/interpose.md): every GOT entry of a
 * loaded object (but the one holding ddheap) for the malloc family, dlopen
 * or dlmopen that is bound to what the process's global scope binds the
 * name to (glibc's malloc, or jemalloc's, tcmalloc's...) is pointed at a
 * wrapper over that same function, and objects dlopen'ed later are
 * rewritten when they load. Entries bound elsewhere (an RTLD_DEEPBIND
 * object over an allocator of its own) are left alone. Calling it again
 * rewrites what was loaded past the hooks meanwhile; it may be called
 * while other threads dlopen. Returns 0, or an errno value:
 *   ENOTSUP  this archive was not built with -Dmarking=shadow, the only
 *            scheme that survives frees past the hooks (nothing is
 *            changed);
 *   EBUSY    malloc in this process already runs ddheap's hooks
 *            (libddheap_preload.so, or a program that wires them) or is a
 *            sanitizer's (nothing is changed);
 *   ENOSYS   no dynamic linker to ask (a static program);
 *   EAGAIN   a non-PIE executable's PLT stub stands for a function
 *            (its address taken) whose slot is not bound yet: call it
 *            again once the program has called the function;
 *   ENOMEM, or mprotect's error: some entries could not be rewritten. */
DDHEAP_API int dd_heap_interpose_libc(void);

/* Puts back every entry dd_heap_interpose_libc() rewrote, in the objects
 * still loaded; blocks sampled meanwhile stay valid (their marks are only
 * beside the heap). Returns 0 or mprotect's error. */
DDHEAP_API int dd_heap_interpose_libc_stop(void);

#ifdef __cplusplus
}
#endif

/* The inlined fast path: dd_allocation_requested(), dd_allocation_created(),
 * dd_allocation_freed(), dd_allocation_realloc_prepare() and
 * dd_allocation_realloc_commit(). */
#include <ddheap/fastpath.h>

#endif /* DDHEAP_H */

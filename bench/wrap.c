/*
 * Allocator wrappers measured by the benchmarks, written exactly as the
 * usage comment of <ddheap.h> tells users to write them. Built twice (see
 * bench.h): DD_BENCH_VARIANT is pie or pic and names the exported table.
 *
 * The no-op allocator returns one buffer through an empty asm, so the
 * compiler cannot see what it returns (a real allocator is opaque too) and
 * cannot drop the ddheap code around it. The buffer is per thread: two
 * threads must never hold the same block, or one thread's sampled header
 * would be zeroed under the other's feet and the process-wide count of
 * marked blocks would never return to zero (every later free would then
 * take the header-reading path). Blocks start 64 bytes into a page-aligned
 * buffer, so neither an unsampled block (raw) nor a sampled one (raw + 16)
 * sits in the first 16 bytes of a page: a free then always takes the
 * header test, as most frees do with glibc, instead of the cheaper
 * page-start branch. The buffer holds the largest request made here
 * (4096 + 16 bytes).
 */
#include "bench.h"

#include <ddheap.h>
#include <stdlib.h>

#ifndef DD_BENCH_VARIANT
#error "compile with -DDD_BENCH_VARIANT=pie or pic"
#endif
#define DD_BENCH_CAT2(a, b) a##b
#define DD_BENCH_CAT(a, b) DD_BENCH_CAT2(a, b)
#define DD_BENCH_STR2(x) #x
#define DD_BENCH_STR(x) DD_BENCH_STR2(x)

static __thread _Alignas(4096) unsigned char noop_buffer[2 * 4096]
    __attribute__((tls_model("initial-exec")));
#define noop_arena (noop_buffer + 64)

static void *opaque(void *p)
{
    __asm__("" : "+r"(p));
    return p;
}

static void consume(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

/* --- the real allocators, bare --- */

static void *bare_libc_alloc(size_t size)
{
    return malloc(size);
}

static void bare_libc_release(void *ptr)
{
    free(ptr);
}

static void *bare_libc_resize(void *ptr, size_t size)
{
    return realloc(ptr, size);
}

static void *bare_noop_alloc(size_t size)
{
    (void)size;
    return opaque(noop_arena);
}

static void bare_noop_release(void *ptr)
{
    consume(ptr);
}

static void *bare_noop_resize(void *ptr, size_t size)
{
    consume(ptr);
    (void)size;
    return opaque(noop_arena);
}

/* --- the same through ddheap --- */

static void *dd_libc_alloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

static void dd_libc_release(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

static void *dd_libc_resize(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    void *raw = realloc(prep.raw_ptr, prep.raw_size);
    return dd_allocation_realloc_commit(ptr, raw, prep);
}

static void *dd_noop_alloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(opaque(noop_arena), req);
}

static void dd_noop_release(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    consume(f.ptr);
}

static void *dd_noop_resize(void *ptr, size_t size)
{
    dd_realloc_prep_t prep = dd_allocation_realloc_prepare(ptr, size);
    consume(prep.raw_ptr);
    return dd_allocation_realloc_commit(ptr, opaque(noop_arena), prep);
}

/* --- control of this copy of ddheap --- */

static void simulate_tracer(bool attached)
{
    dd_heap_simulate_tracer(attached);
}

static void set_interval(uint64_t bytes)
{
    dd_set_default_sampling_interval(bytes);
}

static bool attached(void)
{
    return dd_heap_profiler_attached();
}

__attribute__((visibility("default"))) const struct dd_bench_api DD_BENCH_CAT(dd_bench_api_, DD_BENCH_VARIANT) = {
    .variant = DD_BENCH_STR(DD_BENCH_VARIANT),
    .bare_libc = {"libc", bare_libc_alloc, bare_libc_release, bare_libc_resize},
    .dd_libc = {"libc", dd_libc_alloc, dd_libc_release, dd_libc_resize},
    .bare_noop = {"noop", bare_noop_alloc, bare_noop_release, bare_noop_resize},
    .dd_noop = {"noop", dd_noop_alloc, dd_noop_release, dd_noop_resize},
    .simulate_tracer = simulate_tracer,
    .set_interval = set_interval,
    .attached = attached,
};

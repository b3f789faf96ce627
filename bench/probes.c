/*
 * Bench-only probes for the probe-hit comparison: one 3-argument probe
 * built the way most projects build one (sys/sdt.h as shipped: a 1-byte
 * nop, default operand constraint, as src/probes.c has it) and the same
 * with a 5-byte nop, which this kernel optimises into a call (and which
 * src/probes.c gave up: it crashes forked children). Provider dd_bench, so they can never be
 * mistaken for ddheap's. Semaphores let the driver wait until a tracer is
 * attached to both before timing.
 */
#include "bench.h"

#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>

/* One expansion per probe, in a function of its own (clang never clones). */
#if defined(__clang__)
#define DD_BENCH_PROBE_FN __attribute__((noinline))
#else
#define DD_BENCH_PROBE_FN __attribute__((noinline, noclone))
#endif

__attribute__((section(".probes"))) unsigned short dd_bench_usual_semaphore;
__attribute__((section(".probes"))) unsigned short dd_bench_nop5_semaphore;

DD_BENCH_PROBE_FN void dd_bench_probe_usual(uint64_t a, uint64_t b, uint64_t c)
{
    STAP_PROBE3(dd_bench, usual, a, b, c);
}

#if defined(__x86_64__)
/* sys/sdt.h expands _SDT_NOP where a probe is used, so from here on. */
#undef _SDT_NOP
#define _SDT_NOP .nops 5
#endif

DD_BENCH_PROBE_FN void dd_bench_probe_nop5(uint64_t a, uint64_t b, uint64_t c)
{
    STAP_PROBE3(dd_bench, nop5, a, b, c);
}

/*
 * Declarations shared by the cold-path modules. One allocation's cold path
 * reads top to bottom in sampler.c; it calls out to the marking scheme
 * (mark.h), the probes (probes.c) and the sampling math (sampling_math.c).
 */
#ifndef DDHEAP_INTERNAL_H
#define DDHEAP_INTERNAL_H

#include <ddheap.h>
#include <ddheap/testing.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DDHEAP_DEFAULT_INTERVAL (UINT64_C(512) * 1024)

/* Default ceiling on samples per second (docs/performance.md, "Rate
 * limit", says why this value). */
#define DDHEAP_DEFAULT_SAMPLES_PER_SECOND UINT64_C(3000)

/* Alignment limit of sampling: larger (and non-power-of-two) alignments
 * pass through unsampled. 1 GiB covers every huge page size. */
#define DDHEAP_MAX_SAMPLED_ALIGNMENT (UINT64_C(1) << 30)

/* --- sampling_math.c --- */
/* An Exp(1) variate from 64 random bits (uses the top 53). */
double ddheap_exponential(uint64_t random_bits);
/* 1 - e^-x for x >= 0, accurate for small x. */
double ddheap_one_minus_exp_neg(double x);

/* Process configuration, as read from the environment (env.c) and kept
 * by sampler.c. */
struct ddheap_config {
    bool enabled;
    uint64_t interval;
    uint64_t samples_per_second; /* 0: no limit */
};

/* --- env.c --- */
/* Parses DD_HEAP_SAMPLING_ENABLED / DD_HEAP_SAMPLING_INTERVAL; prints one
 * line on stderr for each invalid value and keeps the default for it. */
struct ddheap_config ddheap_read_environment(void);
/* Parses a decimal byte count (optional KiB/MiB/GiB-style suffix k, m, g);
 * false for anything else, including negatives, 0 and overflow. */
bool ddheap_parse_interval(const char *text, uint64_t *out);
/* 1 = on, 0 = off, -1 = not understood. */
int ddheap_parse_enabled(const char *text);
/* Parses a plain decimal count of samples per second, 0 included (no
 * limit); false for anything else (signs, suffixes, spaces, overflow). */
bool ddheap_parse_rate(const char *text, uint64_t *out);

/* --- rate.c: the process-wide sampling-rate limit --- */
/* Sets the limit (0: none). From the environment it only takes effect if
 * neither the API nor another copy's environment read set it first. */
void ddheap_rate_set_limit(uint64_t samples_per_second, bool from_api);
/* Lets the environment set the limit again (ddheap_test_reload_config). */
void ddheap_rate_forget_limit(void);
uint64_t ddheap_rate_limit(void);
/* The mean interval, in bytes, that keeps the process within the limit
 * at its last measured allocation rate; 0 while there is no limit. */
uint64_t ddheap_rate_needed_mean(void);
/* Counts one sample of the Poisson sampler with its weight, and returns
 * the needed mean, possibly just updated. Cold path: no lock, keeps errno. */
uint64_t ddheap_rate_record(uint64_t weight);
/* Windows the controller closed since the limit was last set. */
uint64_t ddheap_rate_windows(void);
/* Binds clock_gettime and getpid (ddheap_process_init). */
void ddheap_rate_process_init(void);
/* Tests only: called by the thread that closes a window, while it holds
 * the window's claim (tests/ratelimit/test_rate_fork.c forks there). */
void ddheap_rate_set_closing_hook(void (*hook)(void));

/* --- probes.c --- */
/* The alloc and free probes. Each hands back what its caller returns next
 * (the user pointer; the freed block's raw pointer and size), so that the
 * sampler's cold paths end in tail calls and keep nothing across them. */
void *ddheap_fire_alloc(uintptr_t ptr, uint64_t size, uint64_t weight);
dd_alloc_freed_t ddheap_fire_free(uintptr_t ptr, void *raw, size_t size);
void ddheap_fire_realloc(uintptr_t old_ptr, uintptr_t new_ptr, uint64_t size, uint64_t weight);

/* --- shared.c --- */
/* Derives the header keys from AT_RANDOM if no copy did yet, after opening
 * every copy's free gate: called on the first mark, so that a process in
 * which nothing was ever marked keeps its gates closed. */
void ddheap_ensure_keys(void);
#if !DDHEAP_MARK_TBI
/* Enters this copy's free gate in the shared object (constructor). */
void ddheap_register_free_gate(void);
#endif
/* 64-bit values derived from the process secret, the same in every copy
 * of the library (domain separates the uses). */
uint64_t ddheap_process_secret(uint64_t domain);

/* Runs once per process, from a constructor when possible: derives the
 * keys, reads the environment and makes every libc function the cold path
 * calls (getauxval, getenv, __errno_location, ...) get bound before any
 * allocation can need it, so lazy binding never runs inside the cold path. */
void ddheap_process_init(void);

/* The GOT rewrite of src/interpose.c: what dd_heap_interpose_libc() and
 * dd_heap_interpose_libc_stop() do, for the injected agent (src/agent/)
 * too. Same return values. */
int ddheap_interpose_begin(void);
int ddheap_interpose_end(void);
/* ddheap_interpose_end in a child just forked (an atfork child handler
 * registered after the first ddheap_interpose_begin): no loader lock. */
void ddheap_interpose_end_in_child(void);

#endif /* DDHEAP_INTERNAL_H */

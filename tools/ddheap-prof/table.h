/*
 * ddheap-prof's view of the heap: every distinct allocation stack with its
 * four totals (Go's heap sample types), and the table of sampled blocks
 * still live, which links a block's free back to its stack. Both grow with
 * memory; nothing here is bounded by a key count, and nothing grows with
 * the length of a run: per stack, the totals at the peak, a log2 lifetime
 * histogram and a few checkpoints of its live bytes are fixed-size.
 *
 * Time is the events' own (ts_ns, CLOCK_MONOTONIC): the state "at time T"
 * is the table after every event stamped before T, so the peak and the
 * checkpoints are each taken between two events. One table holds every
 * followed process (stacks and blocks keyed by tgid too): its live bytes,
 * and so its peak, are those of all of them together. A process that
 * exits frees everything it had: its blocks leave the live heap at its
 * exit (dd_prof_table_process_exit), each counted, by stack, as what the
 * process still held then.
 */
#ifndef DDHEAP_PROF_TABLE_H
#define DDHEAP_PROF_TABLE_H

#include <stddef.h>
#include <stdint.h>

/* Lifetime bucket k holds lifetimes in [2^k, 2^(k+1)) ns (bucket 0 also
 * holds 0 and 1 ns). */
#define DD_PROF_LIFE_BUCKETS 64
/* Checkpoints of each stack's live bytes, evenly spaced over the run so
 * far (the spacing doubles when they are all used). */
#define DD_PROF_CHECKPOINTS 8

/* The freed sampled blocks of one stack by lifetime (free ts - alloc ts),
 * allocated at the stack's first matched free. */
struct dd_prof_lifetimes {
    uint32_t count[DD_PROF_LIFE_BUCKETS];       /* sampled blocks */
    double space[DD_PROF_LIFE_BUCKETS];         /* their weights (bytes) */
    double objects[DD_PROF_LIFE_BUCKETS];       /* weight / size */
    uint64_t freed;                             /* sum of count */
};

struct dd_prof_stack {
    uint64_t *frames; /* innermost first, as the kernel walked them */
    uint32_t nframes;
    uint32_t hash;
    uint32_t tgid; /* the same addresses in two processes are two stacks */
    /* Estimates: sums of weights (bytes) and of weight / size (objects). */
    double alloc_objects, alloc_space;
    double inuse_objects, inuse_space;
    /* The four at the table's peak; stale while peak_dirty (the stack
     * changed since): the current values become the peak ones when a new
     * peak is reached. */
    double peak_alloc_objects, peak_alloc_space, peak_inuse_objects, peak_inuse_space;
    uint8_t peak_dirty;
    /* What its process still held when it exited (estimates, and the
     * sampled blocks); 0 while it lives. */
    double exit_space, exit_objects;
    uint32_t exit_blocks;
    struct dd_prof_lifetimes *life; /* NULL until a block of it is freed */
    double checkpoint_space[DD_PROF_CHECKPOINTS]; /* inuse_space at each checkpoint */
};

struct dd_prof_block {
    uint64_t ptr; /* 0: empty slot */
    uint32_t tgid; /* a block is (process, address) */
    uint32_t stack;
    double weight, objects;
    uint64_t ts_ns; /* its alloc event's */
};

struct dd_prof_proc_live {
    uint32_t tgid; /* 0: empty slot */
    uint32_t blocks;
};

struct dd_prof_table {
    struct dd_prof_stack *stacks;
    size_t nstacks, stacks_cap;
    uint32_t *stack_slots; /* open addressing: index + 1 into stacks, 0 empty */
    size_t stack_slots_cap;
    struct dd_prof_block *live;
    size_t nlive, live_cap;
    uint64_t allocs, frees, unmatched_frees, replaced_allocs;
    /* Live sampled blocks per process (tgid -> count, open addressing,
     * never deleted): an exit scans the live table only when it has some. */
    struct dd_prof_proc_live *proc_live;
    size_t nproc_live, proc_live_cap;
    /* What processes held when they exited. */
    uint64_t exited_blocks;
    double exited_space;
    /* Caps (0: none): a sample that would make more live blocks or more
     * stacks than these is dropped, and counted. */
    size_t max_live, max_stacks;
    uint64_t dropped;

    /* The estimated live bytes (sum of live weights) now and at its
     * highest; the stacks changed since that peak (each once). */
    double live_space, peak_space;
    uint64_t peak_ts_ns;
    uint32_t *peak_dirty;
    size_t npeak_dirty, peak_dirty_cap;

    /* Run time: the first event's ts, the last seen, and the checkpoints:
     * checkpoint i is the state at first_ts + (i + 1) * checkpoint_step. */
    uint64_t first_ts_ns, last_ts_ns;
    uint64_t checkpoint_step_ns;
    unsigned ncheckpoints;
};

/* One event as the table takes it (size and weight: alloc only). */
struct dd_prof_sample {
    uint64_t ptr, size, weight;
    uint64_t ts_ns; /* CLOCK_MONOTONIC */
    uint32_t tgid;
};

void dd_prof_table_init(struct dd_prof_table *t);
void dd_prof_table_free(struct dd_prof_table *t);
/* Returns 0, or -1 when out of memory. */
int dd_prof_table_alloc(struct dd_prof_table *t, const struct dd_prof_sample *a,
                        const uint64_t *frames, uint32_t nframes);
/* Returns 0, or -1 when out of memory (the free is applied all the same). */
int dd_prof_table_free_block(struct dd_prof_table *t, const struct dd_prof_sample *f);
/* The process tgid has exited at ts_ns (CLOCK_MONOTONIC): its live blocks
 * are taken out of the live heap, each recorded by its stack as held at
 * exit. Events of the process stamped later (one that ended in the ring
 * buffer after its exit was applied) are the caller's to drop. Returns
 * the number of blocks taken out, or -1 when out of memory. */
long dd_prof_table_process_exit(struct dd_prof_table *t, uint32_t tgid, uint64_t ts_ns);
/* Brings the checkpoints up to time now (the end of a run: the state has
 * not changed since the last event). */
void dd_prof_table_advance(struct dd_prof_table *t, uint64_t now_ns);

/* A copy of the stack array with the four totals as they stood at the
 * peak (no lifetimes: life is NULL); frames are shared with t. The copy
 * becomes a table *out that must not be given to dd_prof_table_free:
 * free(out->stacks) only. Returns 0 or -1. */
int dd_prof_table_peak_view(const struct dd_prof_table *t, struct dd_prof_table *out);

/* The lifetime bucket of a lifetime in ns, and the smallest lifetime of
 * bucket k. */
unsigned dd_prof_life_bucket(uint64_t ns);
uint64_t dd_prof_life_bucket_start(unsigned k);
/* The live bytes of stack s at fraction f (0..1] of the run so far, from
 * the checkpoint nearest that time (0 before the first; the current value
 * at 1). */
double dd_prof_table_space_at(const struct dd_prof_table *t, size_t s, double f);

#endif

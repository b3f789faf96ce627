/*
 * ddheap-prof's view of the heap: every distinct allocation stack with its
 * four totals (Go's heap sample types), and the table of sampled blocks
 * still live, which links a block's free back to its stack. Both grow with
 * memory; nothing here is bounded by a key count.
 */
#ifndef DDHEAP_PROF_TABLE_H
#define DDHEAP_PROF_TABLE_H

#include <stddef.h>
#include <stdint.h>

struct dd_prof_stack {
    uint64_t *frames; /* innermost first, as the kernel walked them */
    uint32_t nframes;
    uint32_t hash;
    uint32_t tgid; /* the same addresses in two processes are two stacks */
    /* Estimates: sums of weights (bytes) and of weight / size (objects). */
    double alloc_objects, alloc_space;
    double inuse_objects, inuse_space;
};

struct dd_prof_block {
    uint64_t ptr; /* 0: empty slot */
    uint32_t tgid; /* a block is (process, address) */
    uint32_t stack;
    double weight, objects;
};

struct dd_prof_table {
    struct dd_prof_stack *stacks;
    size_t nstacks, stacks_cap;
    uint32_t *stack_slots; /* open addressing: index + 1 into stacks, 0 empty */
    size_t stack_slots_cap;
    struct dd_prof_block *live;
    size_t nlive, live_cap;
    uint64_t allocs, frees, unmatched_frees, replaced_allocs;
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
void dd_prof_table_free_block(struct dd_prof_table *t, const struct dd_prof_sample *f);

#endif

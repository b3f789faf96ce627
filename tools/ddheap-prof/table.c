/*
 * The stack table and the live-block table (table.h): two open-addressing
 * hash tables with linear probing. The live table deletes by shifting the
 * following entries back, so it never fills with tombstones however long
 * a process runs and however many blocks come and go.
 */
#include "table.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

static uint32_t hash_frames(uint32_t tgid, const uint64_t *frames, uint32_t n)
{
    uint64_t h = mix64((uint64_t)tgid << 32 | n);
    for (uint32_t i = 0; i < n; i++)
        h = mix64(h ^ frames[i]) + i;
    return (uint32_t)h;
}

void dd_prof_table_init(struct dd_prof_table *t)
{
    memset(t, 0, sizeof *t);
}

void dd_prof_table_free(struct dd_prof_table *t)
{
    for (size_t i = 0; i < t->nstacks; i++)
        free(t->stacks[i].frames);
    free(t->stacks);
    free(t->stack_slots);
    free(t->live);
    memset(t, 0, sizeof *t);
}

static int grow_stack_slots(struct dd_prof_table *t)
{
    size_t cap = t->stack_slots_cap ? 2 * t->stack_slots_cap : 1024;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < t->nstacks; i++) {
        size_t j = t->stacks[i].hash & (cap - 1);
        while (slots[j] != 0)
            j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)(i + 1);
    }
    free(t->stack_slots);
    t->stack_slots = slots;
    t->stack_slots_cap = cap;
    return 0;
}

/* The index of the stack with these frames, added if new; -1 if out of
 * memory. */
static long intern_stack(struct dd_prof_table *t, uint32_t tgid, const uint64_t *frames,
                         uint32_t n)
{
    if (2 * (t->nstacks + 1) > t->stack_slots_cap && grow_stack_slots(t) != 0)
        return -1;
    uint32_t h = hash_frames(tgid, frames, n);
    size_t mask = t->stack_slots_cap - 1, j = h & mask;
    for (; t->stack_slots[j] != 0; j = (j + 1) & mask) {
        const struct dd_prof_stack *s = &t->stacks[t->stack_slots[j] - 1];
        if (s->hash == h && s->tgid == tgid && s->nframes == n &&
            memcmp(s->frames, frames, n * sizeof *frames) == 0)
            return (long)t->stack_slots[j] - 1;
    }
    if (t->nstacks == t->stacks_cap) {
        size_t cap = t->stacks_cap ? 2 * t->stacks_cap : 256;
        struct dd_prof_stack *grown = realloc(t->stacks, cap * sizeof *grown);
        if (grown == NULL)
            return -1;
        t->stacks = grown;
        t->stacks_cap = cap;
    }
    uint64_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy == NULL)
        return -1;
    memcpy(copy, frames, n * sizeof *frames);
    t->stacks[t->nstacks] =
        (struct dd_prof_stack){.frames = copy, .nframes = n, .hash = h, .tgid = tgid};
    t->stack_slots[j] = (uint32_t)(t->nstacks + 1);
    return (long)t->nstacks++;
}

static size_t live_slot(const struct dd_prof_table *t, uint32_t tgid, uint64_t ptr)
{
    return (size_t)mix64(ptr ^ (uint64_t)tgid << 47 ^ tgid) & (t->live_cap - 1);
}

static int grow_live(struct dd_prof_table *t)
{
    size_t cap = t->live_cap ? 2 * t->live_cap : 4096;
    struct dd_prof_block *old = t->live;
    size_t old_cap = t->live_cap;
    struct dd_prof_block *live = calloc(cap, sizeof *live);
    if (live == NULL)
        return -1;
    t->live = live;
    t->live_cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i].ptr == 0)
            continue;
        size_t j = live_slot(t, old[i].tgid, old[i].ptr);
        while (live[j].ptr != 0)
            j = (j + 1) & (cap - 1);
        live[j] = old[i];
    }
    free(old);
    return 0;
}

/* The slot holding the process's ptr, or the empty slot where it would go. */
static size_t find_live(const struct dd_prof_table *t, uint32_t tgid, uint64_t ptr)
{
    size_t mask = t->live_cap - 1, j = live_slot(t, tgid, ptr);
    while (t->live[j].ptr != 0 && (t->live[j].ptr != ptr || t->live[j].tgid != tgid))
        j = (j + 1) & mask;
    return j;
}

static void take_out(struct dd_prof_table *t, const struct dd_prof_block *b)
{
    struct dd_prof_stack *s = &t->stacks[b->stack];
    s->inuse_space -= b->weight;
    s->inuse_objects -= b->objects;
}

/* Empties slot j and moves back every later entry of the same probe run
 * that could not otherwise be found any more. */
static void remove_slot(struct dd_prof_table *t, size_t j)
{
    size_t mask = t->live_cap - 1;
    size_t hole = j;
    for (size_t k = (j + 1) & mask; t->live[k].ptr != 0; k = (k + 1) & mask) {
        size_t home = live_slot(t, t->live[k].tgid, t->live[k].ptr);
        /* k may move into the hole when its home is not in (hole, k]. */
        bool between = hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!between) {
            t->live[hole] = t->live[k];
            hole = k;
        }
    }
    t->live[hole].ptr = 0;
    t->nlive--;
}

int dd_prof_table_alloc(struct dd_prof_table *t, const struct dd_prof_sample *a,
                        const uint64_t *frames, uint32_t nframes)
{
    uint64_t ptr = a->ptr, size = a->size, weight = a->weight;
    long stack = intern_stack(t, a->tgid, frames, nframes);
    if (stack < 0)
        return -1;
    if (2 * (t->nlive + 1) > t->live_cap && grow_live(t) != 0)
        return -1;
    double objects = size ? (double)weight / (double)size : 0.0;
    struct dd_prof_stack *s = &t->stacks[stack];
    s->alloc_space += (double)weight;
    s->alloc_objects += objects;
    s->inuse_space += (double)weight;
    s->inuse_objects += objects;
    t->allocs++;
    size_t j = find_live(t, a->tgid, ptr);
    if (t->live[j].ptr == ptr) {
        /* The stream is balanced, so this means the free of the earlier
         * block was lost: it is not live any more. */
        take_out(t, &t->live[j]);
        t->replaced_allocs++;
    } else {
        t->nlive++;
    }
    t->live[j] = (struct dd_prof_block){ptr, a->tgid, (uint32_t)stack, (double)weight, objects};
    return 0;
}

void dd_prof_table_free_block(struct dd_prof_table *t, const struct dd_prof_sample *f)
{
    uint64_t ptr = f->ptr;
    t->frees++;
    if (t->live_cap == 0 || ptr == 0) {
        t->unmatched_frees++;
        return;
    }
    size_t j = find_live(t, f->tgid, ptr);
    if (t->live[j].ptr != ptr) {
        /* Sampled before we attached, or its alloc event was lost. */
        t->unmatched_frees++;
        return;
    }
    take_out(t, &t->live[j]);
    remove_slot(t, j);
}

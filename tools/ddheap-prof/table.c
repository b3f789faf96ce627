/*
 * The stack table and the live-block table (table.h): two open-addressing
 * hash tables with linear probing. The live table deletes by shifting the
 * following entries back, so it never fills with tombstones however long
 * a process runs and however many blocks come and go.
 *
 * The peak costs O(1) per event, amortised: each event marks its stack
 * dirty (once, onto a list), and a new peak copies the current totals of
 * the dirty stacks only, which every other stack already has. So the
 * growth phase, where every alloc is a new peak, copies one stack per
 * event, and a long run below its peak grows the list to at most the
 * number of stacks.
 */
#include "table.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

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
    for (size_t i = 0; i < t->nstacks; i++) {
        free(t->stacks[i].frames);
        free(t->stacks[i].life);
    }
    free(t->stacks);
    free(t->stack_slots);
    free(t->live);
    free(t->peak_dirty);
    free(t->proc_live);
    memset(t, 0, sizeof *t);
}

static int grow_proc_live(struct dd_prof_table *t)
{
    size_t cap = t->proc_live_cap ? 2 * t->proc_live_cap : 256;
    struct dd_prof_proc_live *v = calloc(cap, sizeof *v);
    if (v == NULL)
        return -1;
    for (size_t i = 0; i < t->proc_live_cap; i++) {
        if (t->proc_live[i].tgid == 0)
            continue;
        size_t j = (size_t)mix64(t->proc_live[i].tgid) & (cap - 1);
        while (v[j].tgid != 0)
            j = (j + 1) & (cap - 1);
        v[j] = t->proc_live[i];
    }
    free(t->proc_live);
    t->proc_live = v;
    t->proc_live_cap = cap;
    return 0;
}

/* The process's count of live blocks, added if new; NULL when out of
 * memory. (tgid 0, the idle task, never allocates.) */
static uint32_t *proc_live_count(struct dd_prof_table *t, uint32_t tgid)
{
    if (2 * (t->nproc_live + 1) > t->proc_live_cap && grow_proc_live(t) != 0)
        return NULL;
    size_t mask = t->proc_live_cap - 1, j = (size_t)mix64(tgid) & mask;
    while (t->proc_live[j].tgid != 0 && t->proc_live[j].tgid != tgid)
        j = (j + 1) & mask;
    if (t->proc_live[j].tgid == 0) {
        t->proc_live[j].tgid = tgid;
        t->nproc_live++;
    }
    return &t->proc_live[j].blocks;
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
 * memory, -2 if new and the table holds max_stacks already. */
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
    if (t->max_stacks && t->nstacks >= t->max_stacks)
        return -2;
    /* peak_dirty lists each stack at most once: it needs a place per stack. */
    size_t need = t->nstacks + 1;
    if (dd_prof_grow(&t->stacks, &t->stacks_cap, need, sizeof *t->stacks) != 0 ||
        dd_prof_grow(&t->peak_dirty, &t->peak_dirty_cap, need, sizeof *t->peak_dirty) != 0)
        return -1;
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

/* Stack i is about to change: its totals at the peak are its current ones
 * until the next new peak (the dirty list has room for every stack). */
static void touch(struct dd_prof_table *t, uint32_t i)
{
    struct dd_prof_stack *s = &t->stacks[i];
    if (s->peak_dirty)
        return;
    s->peak_dirty = 1;
    t->peak_dirty[t->npeak_dirty++] = i;
}

/* After an alloc: if the estimated live bytes are the highest yet, the
 * table as it is now becomes the peak. */
static void note_peak(struct dd_prof_table *t, uint64_t ts_ns)
{
    if (!(t->live_space > t->peak_space))
        return;
    for (size_t k = 0; k < t->npeak_dirty; k++) {
        struct dd_prof_stack *s = &t->stacks[t->peak_dirty[k]];
        s->peak_alloc_objects = s->alloc_objects;
        s->peak_alloc_space = s->alloc_space;
        s->peak_inuse_objects = s->inuse_objects;
        s->peak_inuse_space = s->inuse_space;
        s->peak_dirty = 0;
    }
    t->npeak_dirty = 0;
    t->peak_space = t->live_space;
    t->peak_ts_ns = ts_ns;
}

unsigned dd_prof_life_bucket(uint64_t ns)
{
    return ns < 2 ? 0 : 63u - (unsigned)__builtin_clzll(ns);
}

uint64_t dd_prof_life_bucket_start(unsigned k)
{
    return k == 0 ? 0 : UINT64_C(1) << k;
}

static void record_checkpoint(struct dd_prof_table *t)
{
    if (t->ncheckpoints == DD_PROF_CHECKPOINTS) {
        /* Keep every second one (times 2, 4, ... steps), at twice the
         * spacing: checkpoint i stays at first + (i + 1) * step. */
        for (size_t s = 0; s < t->nstacks; s++)
            for (unsigned i = 0; i < DD_PROF_CHECKPOINTS / 2; i++)
                t->stacks[s].checkpoint_space[i] = t->stacks[s].checkpoint_space[2 * i + 1];
        t->ncheckpoints = DD_PROF_CHECKPOINTS / 2;
        t->checkpoint_step_ns *= 2;
    }
    for (size_t s = 0; s < t->nstacks; s++)
        t->stacks[s].checkpoint_space[t->ncheckpoints] = t->stacks[s].inuse_space;
    t->ncheckpoints++;
}

void dd_prof_table_advance(struct dd_prof_table *t, uint64_t now_ns)
{
    if (t->first_ts_ns == 0) {
        t->first_ts_ns = t->last_ts_ns = now_ns;
        t->checkpoint_step_ns = 250000000; /* 250 ms, doubled as the run goes on */
        return;
    }
    if (now_ns < t->last_ts_ns)
        return; /* another CPU's clock, a hair behind: same instant for us */
    /* The table has not changed since last_ts: every checkpoint due before
     * now is the state as it is. */
    while (t->first_ts_ns + (t->ncheckpoints + 1) * t->checkpoint_step_ns <= now_ns)
        record_checkpoint(t);
    t->last_ts_ns = now_ns;
}

double dd_prof_table_space_at(const struct dd_prof_table *t, size_t s, double f)
{
    if (t->checkpoint_step_ns == 0 || f >= 1)
        return t->stacks[s].inuse_space;
    double at = f * (double)(t->last_ts_ns - t->first_ts_ns) / (double)t->checkpoint_step_ns;
    long i = lround(at) - 1;
    if (i < 0)
        return 0;
    if (i >= (long)t->ncheckpoints)
        return t->stacks[s].inuse_space;
    return t->stacks[s].checkpoint_space[i];
}

int dd_prof_table_peak_view(const struct dd_prof_table *t, struct dd_prof_table *out)
{
    *out = *t;
    out->stacks = malloc((t->nstacks ? t->nstacks : 1) * sizeof *out->stacks);
    if (out->stacks == NULL)
        return -1;
    out->stacks_cap = t->nstacks;
    out->stack_slots = NULL;
    out->live = NULL;
    out->peak_dirty = NULL;
    for (size_t i = 0; i < t->nstacks; i++) {
        struct dd_prof_stack s = t->stacks[i];
        /* A dirty stack changed after the peak: its peak_* are right.
         * A clean one has not changed since: both agree. */
        s.alloc_objects = s.peak_alloc_objects;
        s.alloc_space = s.peak_alloc_space;
        s.inuse_objects = s.peak_inuse_objects;
        s.inuse_space = s.peak_inuse_space;
        s.life = NULL;
        out->stacks[i] = s;
    }
    out->live_space = t->peak_space;
    return 0;
}

static void take_out(struct dd_prof_table *t, const struct dd_prof_block *b)
{
    touch(t, b->stack);
    struct dd_prof_stack *s = &t->stacks[b->stack];
    s->inuse_space -= b->weight;
    s->inuse_objects -= b->objects;
    t->live_space -= b->weight;
}

/* A freed block's lifetime into its stack's histogram. Returns -1 when out
 * of memory. */
static int record_lifetime(struct dd_prof_table *t, const struct dd_prof_block *b, uint64_t ts_ns)
{
    struct dd_prof_stack *s = &t->stacks[b->stack];
    if (s->life == NULL && (s->life = calloc(1, sizeof *s->life)) == NULL)
        return -1;
    unsigned k = dd_prof_life_bucket(ts_ns > b->ts_ns ? ts_ns - b->ts_ns : 0);
    s->life->count[k]++;
    s->life->space[k] += b->weight;
    s->life->objects[k] += b->objects;
    s->life->freed++;
    return 0;
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
    dd_prof_table_advance(t, a->ts_ns);
    /* At a cap: the sample is dropped whole (counted), so that every total
     * stays a sum over the blocks kept. */
    if (t->max_live && t->nlive >= t->max_live) {
        t->dropped++;
        return 0;
    }
    long stack = intern_stack(t, a->tgid, frames, nframes);
    if (stack == -2) {
        t->dropped++;
        return 0;
    }
    uint32_t *count = proc_live_count(t, a->tgid);
    if (stack < 0 || count == NULL)
        return -1;
    if (2 * (t->nlive + 1) > t->live_cap && grow_live(t) != 0)
        return -1;
    double objects = size ? (double)weight / (double)size : 0.0;
    touch(t, (uint32_t)stack);
    struct dd_prof_stack *s = &t->stacks[stack];
    t->live_space += (double)weight;
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
        (*count)++;
    }
    t->live[j] =
        (struct dd_prof_block){ptr, a->tgid, (uint32_t)stack, (double)weight, objects, a->ts_ns};
    note_peak(t, a->ts_ns);
    return 0;
}

int dd_prof_table_free_block(struct dd_prof_table *t, const struct dd_prof_sample *f)
{
    uint64_t ptr = f->ptr;
    dd_prof_table_advance(t, f->ts_ns);
    t->frees++;
    if (t->live_cap == 0 || ptr == 0) {
        t->unmatched_frees++;
        return 0;
    }
    size_t j = find_live(t, f->tgid, ptr);
    if (t->live[j].ptr != ptr) {
        /* Sampled before we attached, or its alloc event was lost. */
        t->unmatched_frees++;
        return 0;
    }
    int rc = record_lifetime(t, &t->live[j], f->ts_ns);
    uint32_t *count = proc_live_count(t, f->tgid);
    if (count != NULL && *count > 0)
        (*count)--;
    take_out(t, &t->live[j]);
    remove_slot(t, j);
    return rc;
}

long dd_prof_table_process_exit(struct dd_prof_table *t, uint32_t tgid, uint64_t ts_ns)
{
    dd_prof_table_advance(t, ts_ns);
    uint32_t *count = proc_live_count(t, tgid);
    if (count == NULL)
        return -1;
    if (*count == 0)
        return 0;
    long removed = 0;
    /* remove_slot moves later entries of a probe run back into the hole,
     * never before it: slot j is looked at again until it holds another
     * process's block, and no block of tgid is left behind j. */
    for (size_t j = 0; j < t->live_cap; j++) {
        while (t->live[j].ptr != 0 && t->live[j].tgid == tgid) {
            const struct dd_prof_block *b = &t->live[j];
            struct dd_prof_stack *s = &t->stacks[b->stack];
            touch(t, b->stack);
            s->exit_space += b->weight;
            s->exit_objects += b->objects;
            s->exit_blocks++;
            t->exited_space += b->weight;
            t->exited_blocks++;
            take_out(t, b);
            remove_slot(t, j);
            removed++;
        }
    }
    *count = 0;
    return removed;
}

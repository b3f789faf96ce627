/*
 * The lifetime and leak report (--report FILE), plain text:
 *
 *   - the run: its length, the peak, the live heap at the end;
 *   - leak suspects, ranked;
 *   - per site (allocation stack): allocated and live bytes, and the log2
 *     histogram of the lifetimes of its freed sampled blocks.
 *
 * The leak rule, per site s (docs/ddheap-prof.md says the same):
 *   p90(s)  the lifetime that 90 % of s's freed sampled blocks lived less
 *           than, rounded up to a power of two (the end of the histogram
 *           bucket where 90 % is reached); with no freed block, 0;
 *   old(s)  the estimated bytes of s's live sampled blocks older than
 *           p90(s) at the last event of the run;
 *   L(f)    s's estimated live bytes at fraction f of the run, from its
 *           start to its last event (the table's checkpoints, table.h);
 *   s is a suspect if old(s) > 0 and L(1/4) < L(1/2) < L(1): blocks that
 *   outlived what the site's blocks normally live, at a site whose live
 *   bytes kept growing. Suspects rank by old(s), largest first.
 * A cache filled once and kept is old but does not grow; a queue that
 * grows and drains is young. Neither is a suspect.
 *
 * Then what the processes that exited during the run still held at their
 * exit, by process and site: a worker that leaks keeps its blocks until it
 * exits, and the live heap never shows them together.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "prof.h"
#include "report.h"

struct site {
    size_t index; /* into the table's stacks and the report's */
    uint64_t p90_ns, oldest_ns;
    double old_space;
    unsigned old_blocks;
    double l_quarter, l_half, l_end;
    bool suspect;
};

static uint64_t p90_of(const struct dd_prof_lifetimes *life)
{
    if (life == NULL || life->freed == 0)
        return 0;
    uint64_t need = (life->freed * 9 + 9) / 10, seen = 0;
    for (unsigned k = 0; k < DD_PROF_LIFE_BUCKETS; k++) {
        seen += life->count[k];
        if (seen >= need)
            return k + 1 < 64 ? dd_prof_life_bucket_start(k + 1) : UINT64_MAX;
    }
    return UINT64_MAX;
}

/* "1.5 ms" and the like. */
static void put_duration(char *buf, size_t len, double ns)
{
    if (ns < 1e3)
        snprintf(buf, len, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, len, "%.1f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, len, "%.1f ms", ns / 1e6);
    else
        snprintf(buf, len, "%.1f s", ns / 1e9);
}

static void put_bytes(char *buf, size_t len, double b)
{
    if (b < 0)
        b = 0;
    if (b < 1024)
        snprintf(buf, len, "%.0f B", b);
    else if (b < 1048576)
        snprintf(buf, len, "%.1f KiB", b / 1024);
    else
        snprintf(buf, len, "%.1f MiB", b / 1048576);
}

/* The site's name: its stack's functions, innermost first, up to four,
 * with the innermost one's file:line; and its process when the run had
 * several (a site is one process's stack). */
static void put_site(FILE *out, const struct prof *p, const struct dd_prof_report *r, size_t i)
{
    const struct dd_prof_resolved *s = &r->stacks[i];
    unsigned shown = 0;
    for (uint32_t k = 0; k < s->n && shown < 4; k++) {
        const struct dd_prof_location *l = &r->locs[s->locs[k]];
        for (unsigned j = 0; j < l->n && shown < 4; j++, shown++) {
            const struct dd_prof_function *f = &r->funcs[l->function[j]];
            fprintf(out, "%s%s", shown ? " < " : "", r->strings.v[f->name]);
            if (shown == 0 && f->file != 0)
                fprintf(out, " (%s:%d)", r->strings.v[f->file], l->line[j]);
        }
    }
    if (shown == 0)
        fputs("[unknown]", out);
    if (s->n > 0 && shown == 4)
        fputs(" < ...", out);
    if (p->proc_ids.n > 1) {
        pid_t tgid = (pid_t)s->stack->tgid;
        const struct dd_prof_proc *proc = NULL;
        for (size_t k = 0; k < p->proc_ids.n && proc == NULL; k++)
            if (p->procs[k].tgid == tgid)
                proc = &p->procs[k];
        fprintf(out, " [pid %d%s%s]", (int)tgid, proc && proc->comm ? " " : "",
                proc && proc->comm ? proc->comm : "");
    }
}

static int by_old_space(const void *a, const void *b)
{
    const struct site *x = a, *y = b;
    return (x->old_space < y->old_space) - (x->old_space > y->old_space);
}

static int by_live_then_alloc(const void *a, const void *b, void *ctx)
{
    const struct dd_prof_table *t = ctx;
    const struct dd_prof_stack *x = &t->stacks[((const struct site *)a)->index];
    const struct dd_prof_stack *y = &t->stacks[((const struct site *)b)->index];
    if (x->inuse_space != y->inuse_space)
        return (x->inuse_space < y->inuse_space) - (x->inuse_space > y->inuse_space);
    return (x->alloc_space < y->alloc_space) - (x->alloc_space > y->alloc_space);
}

/* The most exited processes listed one by one, and the most sites each. */
#define EXITED_SHOWN 20
#define EXITED_SITES 5

struct exited {
    uint32_t tgid;
    double space;
    uint32_t blocks;
};

static int by_space(const void *a, const void *b)
{
    const struct exited *x = a, *y = b;
    return (x->space < y->space) - (x->space > y->space);
}

static int by_exit_space(const void *a, const void *b, void *ctx)
{
    const struct dd_prof_table *t = ctx;
    double x = t->stacks[*(const size_t *)a].exit_space, y = t->stacks[*(const size_t *)b].exit_space;
    return (x < y) - (x > y);
}

/* Each exited process with sampled blocks left, its held bytes summed
 * over its sites; sorted, largest first. Returns how many, -1 if out of
 * memory. */
static long exited_processes(const struct dd_prof_table *t, struct exited **out)
{
    struct exited *v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < t->nstacks; i++) {
        const struct dd_prof_stack *s = &t->stacks[i];
        if (s->exit_blocks == 0)
            continue;
        size_t k = 0;
        while (k < n && v[k].tgid != s->tgid)
            k++;
        if (k == n) {
            if (dd_prof_grow(&v, &cap, n + 1, sizeof *v) != 0) {
                free(v);
                return -1;
            }
            v[n++] = (struct exited){s->tgid, 0, 0};
        }
        v[k].space += s->exit_space;
        v[k].blocks += s->exit_blocks;
    }
    if (n)
        qsort(v, n, sizeof *v, by_space);
    *out = v;
    return (long)n;
}

static int write_exited(FILE *out, const struct prof *p, const struct dd_prof_report *r)
{
    const struct dd_prof_table *t = &p->table;
    struct exited *procs = NULL;
    long n = exited_processes(t, &procs);
    size_t *sites = malloc((t->nstacks ? t->nstacks : 1) * sizeof *sites);
    if (n < 0 || sites == NULL) {
        free(sites);
        free(procs);
        return -1;
    }
    char a[32];
    put_bytes(a, sizeof a, t->exited_space);
    fprintf(out, "\nEXITED PROCESSES: %" PRIu64 " exited during the run; %ld still held sampled "
                 "blocks at their exit, %s in all\n(out of the live heap from their exit on). "
                 "By bytes held, with each one's sites:\n",
            p->exits_applied, n, a);
    for (long i = 0; i < n && i < EXITED_SHOWN; i++) {
        put_bytes(a, sizeof a, procs[i].space);
        const struct dd_prof_proc *proc = NULL;
        for (size_t k = 0; k < p->proc_ids.n && proc == NULL; k++)
            if ((uint32_t)p->procs[k].tgid == procs[i].tgid)
                proc = &p->procs[k];
        fprintf(out, "\npid %" PRIu32 " (%s): %s in %" PRIu32 " sampled blocks at exit\n",
                procs[i].tgid, proc && proc->name ? proc->name : "?", a, procs[i].blocks);
        size_t m = 0;
        for (size_t s = 0; s < t->nstacks; s++)
            if (t->stacks[s].tgid == procs[i].tgid && t->stacks[s].exit_blocks > 0)
                sites[m++] = s;
        qsort_r(sites, m, sizeof *sites, by_exit_space, (void *)t);
        for (size_t k = 0; k < m && k < EXITED_SITES; k++) {
            put_bytes(a, sizeof a, t->stacks[sites[k]].exit_space);
            fprintf(out, "    %10s  ", a);
            put_site(out, p, r, sites[k]);
            fputc('\n', out);
        }
        if (m > EXITED_SITES)
            fprintf(out, "    (and %zu more sites)\n", m - EXITED_SITES);
    }
    if (n > EXITED_SHOWN) {
        double rest = 0;
        for (long i = EXITED_SHOWN; i < n; i++)
            rest += procs[i].space;
        put_bytes(a, sizeof a, rest);
        fprintf(out, "\n(and %ld more processes, %s at their exit)\n", n - EXITED_SHOWN, a);
    }
    free(sites);
    free(procs);
    return 0;
}

int dd_prof_write_lifetime_report(FILE *out, const struct prof *p, const struct dd_prof_report *r)
{
    const struct dd_prof_table *t = &p->table;
    size_t n = t->nstacks;
    struct site *sites = calloc(n ? n : 1, sizeof *sites);
    if (sites == NULL)
        return -1;
    uint64_t end = t->last_ts_ns;
    for (size_t i = 0; i < n; i++) {
        sites[i].index = i;
        sites[i].p90_ns = p90_of(t->stacks[i].life);
        sites[i].l_quarter = dd_prof_table_space_at(t, i, 0.25);
        sites[i].l_half = dd_prof_table_space_at(t, i, 0.5);
        sites[i].l_end = t->stacks[i].inuse_space;
    }
    for (size_t j = 0; j < t->live_cap; j++) {
        const struct dd_prof_block *b = &t->live[j];
        if (b->ptr == 0)
            continue;
        struct site *s = &sites[b->stack];
        uint64_t age = end > b->ts_ns ? end - b->ts_ns : 0;
        if (age > s->oldest_ns)
            s->oldest_ns = age;
        if (age > s->p90_ns) {
            s->old_space += b->weight;
            s->old_blocks++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct site *s = &sites[i];
        s->suspect = s->old_space > 0 && s->l_quarter < s->l_half && s->l_half < s->l_end;
    }

    char a[32], b[32], c[32], d[32], e[32];
    double run_ns = (double)(end - t->first_ts_ns);
    put_duration(a, sizeof a, run_ns);
    fprintf(out, "ddheap-prof lifetime report: pid %d, %s from the start to the last event, "
                 "sampling interval %" PRIu64 " bytes\n",
            (int)p->pid, a, p->interval);
    if (p->proc_ids.n > 1)
        fprintf(out, "processes: %zu (the target and those it started); a site is one "
                     "process's stack, the peak that of them all together\n",
                p->proc_ids.n);
    fprintf(out, "sampled: %" PRIu64 " allocations, %" PRIu64 " frees (%" PRIu64
                 " of blocks not seen allocated), %zu still live\n",
            t->allocs, t->frees, t->unmatched_frees, t->nlive);
    put_bytes(a, sizeof a, t->peak_space);
    put_duration(b, sizeof b, t->peak_ts_ns ? (double)((int64_t)t->peak_ts_ns - p->started_mono) : 0);
    put_bytes(c, sizeof c, t->live_space);
    fprintf(out, "peak: %s estimated live, %s into the run (--peak FILE writes it)\n", a, b);
    fprintf(out, "end:  %s estimated live\n\n", c);

    fprintf(out,
            "LEAK SUSPECTS: sites with live sampled blocks older than the site's p90 lifetime\n"
            "(90 %% of its freed sampled blocks lived less, to the next power of two; 0 when\n"
            "none was freed) whose live bytes grew: L(1/4 run) < L(1/2 run) < L(end), the\n"
            "run from its start to its last event.\n"
            "Ranked by the bytes of those old blocks.\n");
    struct site *ranked = malloc((n ? n : 1) * sizeof *ranked);
    if (ranked == NULL) {
        free(sites);
        return -1;
    }
    memcpy(ranked, sites, n * sizeof *ranked);
    qsort(ranked, n, sizeof *ranked, by_old_space);
    unsigned rank = 0;
    for (size_t i = 0; i < n; i++) {
        const struct site *s = &ranked[i];
        if (!s->suspect)
            continue;
        put_bytes(a, sizeof a, s->old_space);
        put_duration(b, sizeof b, (double)s->p90_ns);
        put_duration(c, sizeof c, (double)s->oldest_ns);
        put_bytes(d, sizeof d, s->l_quarter);
        put_bytes(e, sizeof e, s->l_half);
        fprintf(out, "#%u ", ++rank);
        put_site(out, p, r, s->index);
        char f[32];
        put_bytes(f, sizeof f, s->l_end);
        fprintf(out, "\n    old live %s in %u sampled blocks (p90 lifetime %s, oldest %s); "
                     "live %s -> %s -> %s\n",
                a, s->old_blocks, b, c, d, e, f);
    }
    if (rank == 0)
        fputs("(none)\n", out);

    fputs("\nSITES by live bytes at the end, then bytes allocated. Lifetimes: the freed\n"
          "sampled blocks by log2 bucket [from, twice that).\n",
          out);
    qsort_r(ranked, n, sizeof *ranked, by_live_then_alloc, (void *)t);
    for (size_t i = 0; i < n; i++) {
        const struct site *s = &ranked[i];
        const struct dd_prof_stack *st = &t->stacks[s->index];
        fprintf(out, "\n");
        put_site(out, p, r, s->index);
        put_bytes(a, sizeof a, st->alloc_space);
        put_bytes(b, sizeof b, st->inuse_space);
        put_bytes(c, sizeof c, s->old_space);
        put_duration(d, sizeof d, (double)s->p90_ns);
        fprintf(out, "\n    allocated %s, live %s (old %s), p90 lifetime %s%s\n", a, b, c, d,
                s->suspect ? ", LEAK SUSPECT" : "");
        const struct dd_prof_lifetimes *life = st->life;
        for (unsigned k = 0; life != NULL && k < DD_PROF_LIFE_BUCKETS; k++) {
            if (life->count[k] == 0)
                continue;
            put_duration(a, sizeof a, (double)dd_prof_life_bucket_start(k));
            fprintf(out, "    lifetime %-9s %8" PRIu32 " sampled  %5.1f %%  ", a, life->count[k],
                    100.0 * life->count[k] / (double)life->freed);
            for (unsigned x = 0; x < 40 * life->count[k] / life->freed; x++)
                fputc('#', out);
            fprintf(out, "  [bucket %u]\n", k);
        }
    }
    free(ranked);
    free(sites);
    if (write_exited(out, p, r) != 0)
        return -1;
    return ferror(out) ? -1 : 0;
}

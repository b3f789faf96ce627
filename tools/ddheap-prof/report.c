/* Resolving the stack table into locations and functions (report.h). */
#include "report.h"

#include "grow.h"
#include "interp.h"
#include "names.h"
#include "symbolize.h"

#include <stdlib.h>
#include <string.h>

/* The function with this symbol and file, added if new (its name
 * demangled once); -1 if out of memory. An interpreter's function has
 * its final name and no system_name: consumers that demangle a name equal
 * to its system_name by heuristics (go tool pprof strips "<...>" from
 * names that look like C++) leave a name with no system_name as it is,
 * so "<module>" and "<lambda>" stay shown. */
static long function_of(struct dd_prof_report *r, const char *system_name, const char *file,
                        bool interp)
{
    long sn = dd_prof_strings_intern(&r->strings, system_name);
    long f = dd_prof_strings_intern(&r->strings, file ? file : "");
    if (sn < 0 || f < 0)
        return -1;
    int added;
    long fn = dd_prof_keys_intern(&r->func_keys,
                                  (uint64_t)sn << 33 | (uint64_t)f << 1 | (uint64_t)interp, &added);
    if (fn < 0 || !added)
        return fn;
    if (dd_prof_grow(&r->funcs, &r->funcs_cap, (size_t)fn + 1, sizeof *r->funcs) != 0)
        return -1;
    char *demangled = interp ? NULL : dd_prof_demangle(system_name);
    long n = demangled ? dd_prof_strings_intern(&r->strings, demangled) : sn;
    free(demangled);
    if (n < 0)
        return -1;
    r->funcs[fn] = (struct dd_prof_function){(uint32_t)n, interp ? 0 : (uint32_t)sn, (uint32_t)f};
    return fn;
}

static bool is_allocator_location(const struct dd_prof_report *r, const struct dd_prof_location *l)
{
    return l->in_ddheap_object ||
           dd_prof_is_allocator_frame(r->strings.v[r->funcs[l->function[l->n - 1]].system_name]);
}

/* Every function of the preload library is ddheap's or the malloc
 * family's, whatever it is called (its wrappers' names are its own). */
static bool is_ddheap_object(const struct dd_prof_object *o)
{
    if (o == NULL || o->path == NULL)
        return false;
    const char *slash = strrchr(o->path, '/');
    const char *base = slash ? slash + 1 : o->path;
    return strncmp(base, "libddheap_preload", strlen("libddheap_preload")) == 0;
}

/* What symbolises one process's stacks: its objects, their symbolizer
 * (opened on first use) and its addresses, each numbered once. */
struct process_view {
    const struct dd_prof_process_objects *objects;
    struct dd_prof_symbolizer *sym;
    struct dd_prof_keys addrs;
    uint32_t index;
};

/* The location of the process's addr, resolved when first seen; -1 if
 * out of memory. */
static long location_of(struct dd_prof_report *r, struct process_view *v, uint64_t addr,
                        bool return_address)
{
    int added;
    long local = dd_prof_keys_intern(&v->addrs, addr, &added);
    if (local < 0)
        return -1;
    long i = dd_prof_keys_intern(&r->addrs, (uint64_t)v->index << 32 | (uint64_t)local, &added);
    if (i < 0 || !added)
        return i;
    if (v->sym == NULL && (v->sym = dd_prof_symbolizer_new(v->objects->objs)) == NULL)
        return -1;
    struct dd_prof_symbolizer *sym = v->sym;
    const struct dd_prof_objects *objs = v->objects->objs;
    if (dd_prof_grow(&r->locs, &r->locs_cap, (size_t)i + 1, sizeof *r->locs) != 0)
        return -1;
    struct dd_prof_frame f = {.n = 1, .object = NULL};
    bool interp = dd_prof_interp_frame_at(addr, &f.fn[0]);
    if (!interp)
        dd_prof_symbolize(sym, addr, return_address, &f);
    struct dd_prof_location *l = &r->locs[i];
    l->addr = addr;
    l->interp = interp;
    l->object = f.object ? (long)(v->objects->first + (size_t)(f.object - objs->v)) : -1;
    l->in_ddheap_object = is_ddheap_object(f.object);
    /* ddheap's hooks inlined into the allocator are left off too: the
     * location starts at the allocator's own line of the call. */
    unsigned skip = 0;
    while (skip + 1 < f.n && dd_prof_is_allocator_frame(f.fn[skip].function))
        skip++;
    l->n = f.n - skip;
    for (unsigned k = 0; k < l->n; k++) {
        const struct dd_prof_function_at *at = &f.fn[skip + k];
        long fn = function_of(r, at->function, at->file, interp);
        if (fn < 0)
            return -1;
        l->function[k] = (uint32_t)fn;
        l->line[k] = at->line;
        if (at->file)
            r->any_lines = true;
    }
    return i;
}

static void free_views(struct process_view *views, size_t n)
{
    for (size_t i = 0; views && i < n; i++) {
        dd_prof_symbolizer_free(views[i].sym);
        dd_prof_keys_free(&views[i].addrs);
    }
    free(views);
}

int dd_prof_report_build(struct dd_prof_report *r, const struct dd_prof_table *t,
                         const struct dd_prof_process_objects *procs, size_t nprocs)
{
    memset(r, 0, sizeof *r);
    /* views[nprocs]: a process of which nothing was recorded. */
    static const struct dd_prof_objects none;
    const struct dd_prof_process_objects unknown = {0, &none, 0};
    struct process_view *views = calloc(nprocs + 1, sizeof *views);
    struct dd_prof_keys tgids = {0};
    if (views == NULL || dd_prof_strings_intern(&r->strings, "") != 0)
        goto fail;
    for (size_t i = 0; i <= nprocs; i++) {
        views[i].objects = i < nprocs ? &procs[i] : &unknown;
        views[i].index = (uint32_t)i;
    }
    for (size_t i = 0; i < nprocs; i++) {
        int added;
        if (dd_prof_keys_intern(&tgids, procs[i].tgid, &added) != (long)i)
            goto fail; /* out of memory, or a tgid twice */
    }
    r->stacks = calloc(t->nstacks ? t->nstacks : 1, sizeof *r->stacks);
    if (r->stacks == NULL)
        goto fail;
    for (size_t s = 0; s < t->nstacks; s++) {
        const struct dd_prof_stack *st = &t->stacks[s];
        struct dd_prof_resolved *out = &r->stacks[r->nstacks++];
        out->stack = st;
        out->locs = malloc((st->nframes ? st->nframes : 1) * sizeof *out->locs);
        if (out->locs == NULL)
            goto fail;
        int added;
        long pi = dd_prof_keys_intern(&tgids, st->tgid, &added);
        if (pi < 0)
            goto fail;
        /* (A tgid not among procs gets an index from nprocs on.) */
        struct process_view *v = &views[(size_t)pi < nprocs ? (size_t)pi : nprocs];
        /* The allocator's frames (ddheap's hooks, the wrapper or the
         * allocator that called them, operator new above it) are the
         * innermost ones: drop that run, so the caller is on top. */
        long keep_from = 0;
        for (uint32_t k = 0; k < st->nframes; k++) {
            long loc = location_of(r, v, st->frames[k], k > 0);
            if (loc < 0)
                goto fail;
            out->locs[out->n++] = (uint32_t)loc;
            if (keep_from == (long)k && is_allocator_location(r, &r->locs[loc]))
                keep_from = (long)k + 1;
        }
        if (keep_from > 0 && keep_from < (long)out->n) {
            memmove(out->locs, out->locs + keep_from, (out->n - (size_t)keep_from) * sizeof *out->locs);
            out->n -= (uint32_t)keep_from;
        }
    }
    free_views(views, nprocs + 1);
    dd_prof_keys_free(&tgids);
    return 0;
fail:
    free_views(views, nprocs + 1);
    dd_prof_keys_free(&tgids);
    dd_prof_report_free(r);
    return -1;
}

void dd_prof_report_free(struct dd_prof_report *r)
{
    for (size_t i = 0; i < r->nstacks; i++)
        free(r->stacks[i].locs);
    free(r->stacks);
    free(r->locs);
    free(r->funcs);
    dd_prof_strings_free(&r->strings);
    dd_prof_keys_free(&r->addrs);
    dd_prof_keys_free(&r->func_keys);
    memset(r, 0, sizeof *r);
}

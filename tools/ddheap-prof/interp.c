/* Interpreter frames merged into native stacks (interp.h). */
#include "interp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "intern.h"
#include "python/python.h"
#include "unwind.h"

static const struct dd_prof_interp *const interpreters[] = {&dd_prof_python};

struct dd_prof_interp_proc {
    const struct dd_prof_interp *impl;
    void *state;
    int checked; /* 0: not yet; 1: agrees; -1: does not (its frames dropped) */
};

/* Interpreter frames' addresses: DD_PROF_INTERP_BASE + the index of
 * "function\x1f" "file\x1f" "line" in names (the run's, for every process:
 * the same code in two processes is one function of the profile). */
#define DD_PROF_INTERP_BASE 0xffffc00000000000ull
#define DD_PROF_INTERP_SPAN 0x0000100000000000ull
static struct dd_prof_strings names, parts;
static struct dd_prof_function_at *named; /* parallel to names.v */
static size_t named_cap;

struct dd_prof_interp_proc *dd_prof_interp_recognize(const struct dd_prof_object *o, pid_t pid,
                                                     struct dd_prof_interp_config *cfg)
{
    for (size_t i = 0; i < sizeof interpreters / sizeof *interpreters; i++) {
        char why[256] = "";
        memset(cfg, 0, sizeof *cfg);
        void *state = interpreters[i]->recognize(o, pid, cfg, why, sizeof why);
        if (state == NULL) {
            /* Said once a run for each reason (a program that forks and
             * execs the same interpreter would say it again and again). */
            static char said[256];
            if (why[0] && strcmp(why, said) != 0) {
                fprintf(stderr, "ddheap-prof: %s in %s: %s; its stacks are native only\n",
                        interpreters[i]->name, o->path, why);
                snprintf(said, sizeof said, "%s", why);
            }
            continue;
        }
        return dd_prof_interp_proc_new(interpreters[i], state);
    }
    return NULL;
}

struct dd_prof_interp_proc *dd_prof_interp_proc_new(const struct dd_prof_interp *impl,
                                                    void *state)
{
    struct dd_prof_interp_proc *ip = calloc(1, sizeof *ip);
    if (ip == NULL) {
        impl->free(state);
        return NULL;
    }
    ip->impl = impl;
    ip->state = state;
    return ip;
}

struct dd_prof_interp_proc *dd_prof_interp_fork(const struct dd_prof_interp_proc *ip)
{
    struct dd_prof_interp_proc *copy = calloc(1, sizeof *copy);
    if (copy == NULL || (copy->state = ip->impl->fork(ip->state)) == NULL) {
        free(copy);
        return NULL;
    }
    copy->impl = ip->impl;
    copy->checked = ip->checked;
    return copy;
}

void dd_prof_interp_free(struct dd_prof_interp_proc *ip)
{
    if (ip == NULL)
        return;
    ip->impl->free(ip->state);
    free(ip);
}

void dd_prof_interp_note_code(struct dd_prof_interp_proc *ip, pid_t pid,
                              const struct dd_prof_interp_frame *f)
{
    /* (Before the check, if it comes first: what it reads is only
     * remembered, and dropped with the frames if the check fails.) */
    if (ip->checked >= 0) {
        struct dd_prof_function_at at;
        ip->impl->name_frame(ip->state, pid, f, &at);
    }
}

bool dd_prof_interp_is_frame(uint64_t addr)
{
    return addr >= DD_PROF_INTERP_BASE && addr - DD_PROF_INTERP_BASE < DD_PROF_INTERP_SPAN;
}

bool dd_prof_interp_frame_at(uint64_t addr, struct dd_prof_function_at *out)
{
    if (!dd_prof_interp_is_frame(addr) || addr - DD_PROF_INTERP_BASE >= names.n)
        return false;
    *out = named[addr - DD_PROF_INTERP_BASE];
    return true;
}

/* The address standing for one named frame; 0 when out of memory. */
static uint64_t frame_address(const struct dd_prof_function_at *at)
{
    char key[1024];
    snprintf(key, sizeof key, "%s\x1f%s\x1f%d", at->function, at->file ? at->file : "", at->line);
    size_t before = names.n;
    long i = dd_prof_strings_intern(&names, key);
    if (i < 0)
        return 0;
    if (names.n > before) {
        if (dd_prof_grow(&named, &named_cap, names.n, sizeof *named) != 0)
            return 0;
        /* The parts of the key, as interned strings of their own. */
        long fn = dd_prof_strings_intern(&parts, at->function);
        long file = dd_prof_strings_intern(&parts, at->file ? at->file : "");
        if (fn < 0 || file < 0)
            return 0;
        named[i] = (struct dd_prof_function_at){parts.v[fn], at->file ? parts.v[file] : NULL,
                                                at->line};
    }
    return DD_PROF_INTERP_BASE + (uint64_t)i;
}

void dd_prof_interp_names_free(void)
{
    dd_prof_strings_free(&names);
    dd_prof_strings_free(&parts);
    free(named);
    named = NULL;
    named_cap = 0;
}

/* frames[*next ...] up to and including the next entry frame (the ones
 * one eval call ran) into out[*n ...]; a walk that was cut (cut) and ends
 * inside this call is marked "[truncated]" where the frames are missing. */
static void copy_group(struct dd_prof_interp_proc *ip, pid_t pid,
                       const struct dd_prof_interp_frame *frames, uint32_t nframes, bool cut,
                       uint32_t *next, uint64_t *out, uint32_t *n, uint32_t max)
{
    while (*next < nframes) {
        const struct dd_prof_interp_frame *f = &frames[(*next)++];
        struct dd_prof_function_at at;
        ip->impl->name_frame(ip->state, pid, f, &at);
        uint64_t addr = frame_address(&at);
        if (addr && *n < max)
            out[(*n)++] = addr;
        if (f->flags & DD_PROF_INTERP_ENTRY)
            return;
    }
    if (cut && *n < max)
        out[(*n)++] = DD_PROF_TRUNCATED_FRAME;
}

uint32_t dd_prof_interp_merge(struct dd_prof_interp_proc *ip, pid_t pid, const uint64_t *native,
                              uint32_t n, const struct dd_prof_interp_frame *frames,
                              uint32_t nframes, bool cut, uint64_t *out, uint32_t max,
                              bool *disable)
{
    *disable = false;
    if (nframes > 0 && ip->checked == 0) {
        char why[256] = "";
        ip->checked = ip->impl->verify(ip->state, pid, why, sizeof why) ? 1 : -1;
        if (ip->checked < 0) {
            fprintf(stderr, "ddheap-prof: %s in process %d: %s; its stacks are native only\n",
                    ip->impl->name, (int)pid, why);
            *disable = true;
        }
    }
    if (ip->checked < 0)
        nframes = 0;
    uint32_t next = 0, m = 0, i = 0;
    bool left_over = false;
    /* One slot kept for a truncation mark. */
    uint32_t room = max - 1;
    for (; i < n && m < room; i++) {
        bool truncated = native[i] == DD_PROF_TRUNCATED_FRAME;
        /* A return address's call is the byte before it. */
        if (!truncated && next < nframes && ip->impl->in_eval_loop(ip->state, native[i] - (i > 0)))
            copy_group(ip, pid, frames, nframes, cut, &next, out, &m, room);
        /* Frames the eval loops of the stack did not take (a loop not
         * recognised, a stack cut short): inside the outermost native
         * frame, where a user still sees them under the code that called
         * them; the stack is marked as not whole. */
        if ((truncated || i + 1 == n) && next < nframes) {
            left_over = true;
            while (next < nframes && m < room)
                copy_group(ip, pid, frames, nframes, cut, &next, out, &m, room);
        }
        if (m < room)
            out[m++] = native[i];
    }
    if ((i < n || next < nframes || left_over) &&
        (m == 0 || out[m - 1] != DD_PROF_TRUNCATED_FRAME))
        out[m++] = DD_PROF_TRUNCATED_FRAME;
    return m;
}

/*
 * The outputs of a run: the gzipped pprof profile (pprof.c), folded stacks
 * and the flame graph (flame.c), all from one symbolised report
 * (report.c), with what the run lost or could not match said on stderr
 * and in the profile's comments.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <linux/types.h>

#include "ddheap_prof.h"
/* bpftool embeds the BPF object as one string literal, longer than the
 * 4095 characters -Wpedantic holds C99 compilers to; gcc and clang take it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
#include "ddheap_prof.skel.h"
#pragma GCC diagnostic pop
#include "pprof.h"
#include "prof.h"
#include "report.h"

static FILE *open_output(const char *path)
{
    if (path == NULL)
        return NULL;
    FILE *f = fopen(path, "we");
    if (f == NULL) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    return f;
}

/* Every output is opened before anything is attached: a path that cannot
 * be written fails now, not after the run. */
void dd_prof_open_outputs(const struct options *o, struct outputs *f)
{
    f->out = open_output(o->out_path);
    f->svg = open_output(o->svg_path);
    f->folded = open_output(o->folded_path);
}

static int write_all(struct prof *p, FILE *out, FILE *svg, FILE *folded)
{
    uint64_t interval = p->interval;
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    char c_lost[256], c_what[256], c_counts[256];
    snprintf(c_what, sizeof c_what, "ddheap-prof: pid %d, provider %s, interval %" PRIu64,
             (int)p->pid, p->opt.provider, interval);
    snprintf(c_lost, sizeof c_lost,
             "ddheap-prof: lost events: %" PRIu64 " (alloc %" PRIu64 ", free %" PRIu64
             "; ring buffer %lu KiB)",
             lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    snprintf(c_counts, sizeof c_counts,
             "ddheap-prof: alloc events %" PRIu64 ", free events %" PRIu64
             " (%" PRIu64 " of blocks not seen allocated), live sampled blocks %zu",
             p->table.allocs, p->table.frees, p->table.unmatched_frees, p->table.nlive);
    fprintf(stderr, "%s\n", c_counts);
    if (lost_alloc + lost_free)
        fprintf(stderr, "ddheap-prof: LOST %" PRIu64 " events (alloc %" PRIu64 ", free %" PRIu64
                        "): the ring buffer was full; raise --ringbuf-kb (now %lu)\n",
                lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    const char *comments[] = {c_what, c_counts, c_lost};

    struct dd_prof_report r;
    if (dd_prof_report_build(&r, &p->table, &p->objs) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        return -1;
    }
    int rc = 0;
    if (folded && dd_prof_write_folded(folded, &r, p->opt.value) != 0) {
        fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.folded_path);
        rc = -1;
    }
    if (svg) {
        char title[128];
        snprintf(title, sizeof title, "ddheap-prof: %s, pid %d", dd_prof_value_names[p->opt.value],
                 (int)p->pid);
        if (dd_prof_write_svg(svg, &r, p->opt.value, title) != 0) {
            fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.svg_path);
            rc = -1;
        }
    }
    struct dd_prof_meta meta = {p->started_realtime, dd_prof_now_ns(CLOCK_MONOTONIC) - p->started_mono,
                                (int64_t)interval, comments, 3};
    if (dd_prof_write_pprof(out, p->opt.out_path, &r, &p->objs, &meta) != 0)
        rc = -1;
    dd_prof_report_free(&r);
    if (rc == 0)
        fprintf(stderr, "ddheap-prof: wrote %s (%zu stacks)\n", p->opt.out_path, p->table.nstacks);
    return rc;
}

int dd_prof_write_outputs(struct prof *p, struct outputs *f)
{
    int rc = write_all(p, f->out, f->svg, f->folded);
    if ((f->svg && fclose(f->svg) != 0) || (f->folded && fclose(f->folded) != 0) ||
        fclose(f->out) != 0)
        rc = -1;
    return rc;
}

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
#include <unistd.h>

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

/* An output written later (through a temporary name): its directory must
 * be writable now, and the file if it exists. Exits 1 if not. */
static void check_writable(const char *path)
{
    if (path == NULL)
        return;
    char *dir = strdup(path);
    if (dir == NULL)
        exit(1);
    char *slash = strrchr(dir, '/');
    const char *d = slash == NULL ? "." : slash == dir ? "/" : (*slash = '\0', dir);
    int rc = access(d, W_OK);
    if (rc != 0 || (access(path, F_OK) == 0 && access(path, W_OK) != 0)) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    free(dir);
}

/* Every output is opened (or, if written later, checked) before anything
 * is attached: a path that cannot be written fails now, not after the
 * run. */
void dd_prof_open_outputs(const struct options *o, struct outputs *f)
{
    check_writable(o->peak_path);
    check_writable(o->report_path);
    if (o->every > 0 || strchr(o->out_path, '%'))
        check_writable(o->out_path);
    if (o->svg_path && strchr(o->svg_path, '%'))
        check_writable(o->svg_path);
    /* -o as a snapshot pattern: the final profile is the last snapshot. */
    f->out = strchr(o->out_path, '%') ? NULL : open_output(o->out_path);
    /* --svg as a pattern: one per snapshot, the last one at the end. */
    f->svg = o->svg_path && strchr(o->svg_path, '%') ? NULL : open_output(o->svg_path);
    f->folded = open_output(o->folded_path);
}

const char *dd_prof_empty_reason(const struct prof *p, const struct dd_prof_table *t,
                                 enum dd_prof_value v, char *buf, size_t len)
{
    double total = 0;
    for (size_t i = 0; i < t->nstacks; i++) {
        const struct dd_prof_stack *s = &t->stacks[i];
        double x = v == DD_PROF_ALLOC_OBJECTS ? s->alloc_objects
                   : v == DD_PROF_ALLOC_SPACE ? s->alloc_space
                   : v == DD_PROF_INUSE_OBJECTS ? s->inuse_objects : s->inuse_space;
        total += x > 0 ? x : 0;
    }
    if (total >= 0.5)
        return NULL;
    if (p->table.allocs == 0)
        snprintf(buf, len,
                 "nothing to show: no sampled allocation was seen (the program allocated less "
                 "than about the sampling interval, %" PRIu64 " bytes, through ddheap)",
                 p->interval);
    else
        snprintf(buf, len,
                 "nothing to show: every sampled block (%" PRIu64 ") was freed by then; the "
                 "heap peaked at %.1f MiB (--peak FILE writes that profile)",
                 p->table.allocs, p->table.peak_space / 1048576.0);
    return buf;
}

/* One profile of table t (the run's, or a view of it) with the run's
 * comments, then note, then why it is empty if it is. */
static int write_pprof_of(struct prof *p, const struct dd_prof_table *t,
                          struct dd_prof_report *built, FILE *out, const char *path,
                          int64_t at_mono_ns, const char *note)
{
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    char c_lost[256], c_what[256], c_counts[256], c_empty[300];
    snprintf(c_what, sizeof c_what, "ddheap-prof: pid %d, provider %s, interval %" PRIu64,
             (int)p->pid, p->opt.provider, p->interval);
    snprintf(c_lost, sizeof c_lost,
             "ddheap-prof: lost events: %" PRIu64 " (alloc %" PRIu64 ", free %" PRIu64
             "; ring buffer %lu KiB)",
             lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    snprintf(c_counts, sizeof c_counts,
             "ddheap-prof: alloc events %" PRIu64 ", free events %" PRIu64
             " (%" PRIu64 " of blocks not seen allocated), live sampled blocks %zu",
             p->table.allocs, p->table.frees, p->table.unmatched_frees, p->table.nlive);
    const char *comments[5] = {c_what, c_counts, c_lost};
    size_t ncomments = 3;
    if (note)
        comments[ncomments++] = note;
    const char *empty = dd_prof_empty_reason(p, t, DD_PROF_INUSE_SPACE, c_empty, sizeof c_empty);
    if (empty)
        comments[ncomments++] = empty;

    struct dd_prof_report own, *r = built ? built : &own;
    if (built == NULL && dd_prof_report_build(&own, t, &p->objs) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        return -1;
    }
    struct dd_prof_meta meta = {p->started_realtime, at_mono_ns - p->started_mono,
                                (int64_t)p->interval, comments, ncomments};
    int rc = dd_prof_write_pprof(out, path, r, &p->objs, &meta);
    if (built == NULL)
        dd_prof_report_free(&own);
    return rc;
}

/* Writes through path.tmp, renamed into place once complete: a reader
 * never sees half a file, and a failure leaves none. */
static int write_file_atomically(const char *path, int (*write)(FILE *, void *), void *ctx)
{
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    if (tmp == NULL)
        return -1;
    snprintf(tmp, n, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    int rc = write(f, ctx);
    if (fclose(f) != 0)
        rc = -1;
    if (rc == 0 && rename(tmp, path) != 0) {
        fprintf(stderr, "ddheap-prof: cannot rename %s to %s: %s\n", tmp, path, strerror(errno));
        rc = -1;
    }
    if (rc != 0)
        unlink(tmp);
    free(tmp);
    return rc;
}

/* One file to write from table t; r, if not NULL, is t's report already
 * built (a snapshot's profile and flame graph share one). */
struct file_job {
    struct prof *p;
    const struct dd_prof_table *t;
    struct dd_prof_report *r;
    const char *path, *note, *title;
    int64_t at_mono_ns;
};

static int write_profile_job(FILE *f, void *ctx)
{
    const struct file_job *j = ctx;
    return write_pprof_of(j->p, j->t, j->r, f, j->path, j->at_mono_ns, j->note);
}

int dd_prof_write_profile_file(struct prof *p, const struct dd_prof_table *t, const char *path,
                               int64_t at_mono_ns, const char *note)
{
    struct file_job j = {p, t, NULL, path, note, NULL, at_mono_ns};
    return write_file_atomically(path, write_profile_job, &j);
}

static int write_svg_job(FILE *f, void *ctx)
{
    const struct file_job *j = ctx;
    char why[300];
    const char *empty = dd_prof_empty_reason(j->p, j->t, j->p->opt.value, why, sizeof why);
    return dd_prof_write_svg_noted(f, j->r, j->p->opt.value, j->title, empty);
}

int dd_prof_write_snapshot_files(struct prof *p, const char *pb_path, const char *svg_path,
                                 int64_t at_mono_ns, const char *note, const char *title)
{
    struct dd_prof_report r;
    if (dd_prof_report_build(&r, &p->table, &p->objs) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        return -1;
    }
    /* The flame graph first: the profile's writer adds its own strings
     * to the report's table. */
    struct file_job svg = {p, &p->table, &r, svg_path, NULL, title, 0};
    struct file_job pb = {p, &p->table, &r, pb_path, note, NULL, at_mono_ns};
    int rc = 0;
    if (svg_path != NULL)
        rc = write_file_atomically(svg_path, write_svg_job, &svg);
    if (rc == 0)
        rc = write_file_atomically(pb_path, write_profile_job, &pb);
    dd_prof_report_free(&r);
    return rc;
}

/* For a started command that freed everything it had sampled, the SVG and
 * folded stacks show the peak (the end would be empty). */
static bool show_peak(const struct prof *p)
{
    return p->child && p->table.nlive == 0 && p->table.peak_space > 0 &&
           (p->opt.value == DD_PROF_INUSE_SPACE || p->opt.value == DD_PROF_INUSE_OBJECTS);
}

static int write_views(struct prof *p, FILE *svg, FILE *folded)
{
    struct dd_prof_table peak;
    const struct dd_prof_table *t = &p->table;
    bool at_peak = show_peak(p);
    if (at_peak) {
        if (dd_prof_table_peak_view(&p->table, &peak) != 0)
            return -1;
        t = &peak;
    }
    char title[128], why[300];
    const char *empty = dd_prof_empty_reason(p, t, p->opt.value, why, sizeof why);
    char note[200] = "";
    if (at_peak) {
        snprintf(title, sizeof title, "ddheap-prof: %s at the peak, pid %d",
                 dd_prof_value_names[p->opt.value], (int)p->pid);
        snprintf(note, sizeof note,
                 "%.1f MiB estimated live, %.2f s into the run; the program freed everything "
                 "by its end",
                 p->table.peak_space / 1048576.0,
                 (double)((int64_t)p->table.peak_ts_ns - p->started_mono) / 1e9);
    } else {
        snprintf(title, sizeof title, "ddheap-prof: %s, pid %d", dd_prof_value_names[p->opt.value],
                 (int)p->pid);
        if (empty)
            snprintf(note, sizeof note, "%s", empty);
    }
    /* An empty inuse_space view was said with the profile's (write_all). */
    bool said = p->opt.value == DD_PROF_INUSE_SPACE && p->opt.out_path != NULL &&
                strchr(p->opt.out_path, '%') == NULL;
    if (empty && (svg || folded) && !said)
        fprintf(stderr, "ddheap-prof: the %s view is empty: %s\n",
                dd_prof_value_names[p->opt.value], empty);
    else if (at_peak && (svg || folded))
        fprintf(stderr, "ddheap-prof: every sampled block was freed by the end: the flame "
                        "graph shows the heap at its peak\n");

    int rc = 0;
    struct dd_prof_report r;
    if (dd_prof_report_build(&r, t, &p->objs) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        rc = -1;
    } else {
        /* Folded stacks have no room for a title: an empty view is an
         * empty file, with the reason on stderr. */
        if (folded && dd_prof_write_folded(folded, &r, p->opt.value) != 0) {
            fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.folded_path);
            rc = -1;
        }
        if (svg && dd_prof_write_svg_noted(svg, &r, p->opt.value, title, note[0] ? note : NULL) != 0) {
            fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.svg_path);
            rc = -1;
        }
        dd_prof_report_free(&r);
    }
    if (at_peak)
        free(peak.stacks);
    return rc;
}

static int write_report(struct prof *p)
{
    FILE *f = fopen(p->opt.report_path, "we");
    if (f == NULL) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", p->opt.report_path, strerror(errno));
        return -1;
    }
    struct dd_prof_report r;
    int rc = -1;
    if (dd_prof_report_build(&r, &p->table, &p->objs) == 0) {
        rc = dd_prof_write_lifetime_report(f, p, &r);
        dd_prof_report_free(&r);
    }
    if (fclose(f) != 0 || rc != 0) {
        fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.report_path);
        return -1;
    }
    fprintf(stderr, "ddheap-prof: wrote %s\n", p->opt.report_path);
    return 0;
}

static int write_all(struct prof *p, FILE *out, FILE *svg, FILE *folded)
{
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    /* The table's clock stays at its last event: the leak rule's quarters
     * are of the time events came in, not of an idle tail or of the time
     * it took to notice the end. */
    int64_t end = dd_prof_now_ns(CLOCK_MONOTONIC);
    fprintf(stderr,
            "ddheap-prof: alloc events %" PRIu64 ", free events %" PRIu64 " (%" PRIu64
            " of blocks not seen allocated), live sampled blocks %zu\n",
            p->table.allocs, p->table.frees, p->table.unmatched_frees, p->table.nlive);
    if (lost_alloc + lost_free)
        fprintf(stderr, "ddheap-prof: LOST %" PRIu64 " events (alloc %" PRIu64 ", free %" PRIu64
                        "): the ring buffer was full; raise --ringbuf-kb (now %lu)\n",
                lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    char why[300];
    const char *empty = dd_prof_empty_reason(p, &p->table, DD_PROF_INUSE_SPACE, why, sizeof why);
    if (empty && out)
        fprintf(stderr, "ddheap-prof: the profile's inuse_space%s is empty: %s\n",
                svg && p->opt.value == DD_PROF_INUSE_SPACE && !show_peak(p) ? " (and the flame graph)" : "",
                empty);

    int rc = write_views(p, svg, folded);
    if (p->opt.peak_path && dd_prof_write_peak(p) != 0)
        rc = -1;
    if (p->opt.report_path && write_report(p) != 0)
        rc = -1;
    if (p->snaps.period_ns || out == NULL || p->snaps.svg_pattern != NULL) {
        /* The series ends with the state at the end of the run; with -o a
         * pattern, that is the final profile. */
        dd_prof_snapshot_now(p, end);
        if (p->snaps.failed)
            rc = -1;
    }
    if (out) {
        int prc = write_pprof_of(p, &p->table, NULL, out, p->opt.out_path, end, NULL);
        if (prc == 0)
            fprintf(stderr, "ddheap-prof: wrote %s (%zu stacks)\n", p->opt.out_path,
                    p->table.nstacks);
        else
            rc = -1;
    }
    return rc;
}

int dd_prof_write_outputs(struct prof *p, struct outputs *f)
{
    int rc = write_all(p, f->out, f->svg, f->folded);
    if ((f->svg && fclose(f->svg) != 0) || (f->folded && fclose(f->folded) != 0) ||
        (f->out && fclose(f->out) != 0))
        rc = -1;
    return rc;
}

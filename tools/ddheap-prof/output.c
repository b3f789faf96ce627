/*
 * The outputs of a run: the gzipped pprof profile (pprof.c), folded stacks
 * and the flame graph (flame.c), all from one symbolised report
 * (report.c), with what the run lost or could not match said on stderr
 * and in the profile's comments.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The outputs being written: each a temporary file beside its final
 * path, renamed at the end. Whatever ends the run before (an error, exit)
 * removes the temporary files: no empty or half-written output is ever
 * left under an output's name. */
enum { MAX_OUTPUTS = 3 };
static struct pending {
    char *tmp;
    const char *path;
} pending[MAX_OUTPUTS];

void dd_prof_discard_outputs(void)
{
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (pending[i].tmp) {
            unlink(pending[i].tmp);
            free(pending[i].tmp);
            pending[i].tmp = NULL;
        }
}

static FILE *open_output(const char *path)
{
    if (path == NULL)
        return NULL;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", path, strerror(EISDIR));
        exit(1);
    }
    /* DIR/.NAME.XXXXXX: in the same directory (and file system) as the
     * output, so the rename is atomic and its permission is proved now. */
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0;
    char *tmp = NULL;
    if (asprintf(&tmp, "%.*s.%s.XXXXXX", dir_len, path, slash ? slash + 1 : path) < 0) {
        fprintf(stderr, "ddheap-prof: out of memory\n");
        exit(1);
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        free(tmp);
        exit(1);
    }
    /* mkstemp's 0600 would make a profile only root can read. */
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask);
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (pending[i].tmp == NULL) {
            pending[i] = (struct pending){tmp, path};
            break;
        }
    return f;
}

/* Every output is created before anything is attached: a path that cannot
 * be written fails now, not after the run. */
void dd_prof_open_outputs(const struct options *o, struct outputs *f)
{
    atexit(dd_prof_discard_outputs);
    f->out = open_output(o->out_path);
    f->svg = open_output(o->svg_path);
    f->folded = open_output(o->folded_path);
}

/* Gives every written output its name. */
static int publish_outputs(void)
{
    int rc = 0;
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (pending[i].tmp && rename(pending[i].tmp, pending[i].path) != 0) {
            fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", pending[i].path,
                    strerror(errno));
            rc = -1;
        }
    for (int i = 0; i < MAX_OUTPUTS && rc == 0; i++) {
        free(pending[i].tmp);
        pending[i].tmp = NULL;
    }
    return rc;
}

/* Every process's objects, one after another: the profile's mappings. */
static int gather_objects(struct prof *p, struct dd_prof_objects *all,
                          struct dd_prof_process_objects **views)
{
    size_t n = 0, nprocs = p->proc_ids.n;
    for (size_t i = 0; i < nprocs; i++)
        n += p->procs[i].objs.n;
    *all = (struct dd_prof_objects){.v = calloc(n + 1, sizeof *all->v), .cap = n};
    *views = calloc(nprocs + 1, sizeof **views);
    if (all->v == NULL || *views == NULL)
        return -1;
    for (size_t i = 0; i < nprocs; i++) {
        const struct dd_prof_objects *objs = &p->procs[i].objs;
        (*views)[i] = (struct dd_prof_process_objects){(uint32_t)p->procs[i].tgid, objs, all->n};
        /* Shallow copies: the processes own the paths and descriptors. */
        memcpy(all->v + all->n, objs->v, objs->n * sizeof *objs->v);
        all->n += objs->n;
    }
    return 0;
}

static int write_all(struct prof *p, FILE *out, FILE *svg, FILE *folded)
{
    uint64_t interval = p->interval;
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    char c_lost[256], c_what[256], c_counts[256];
    snprintf(c_what, sizeof c_what,
             "ddheap-prof: pid %d, processes %zu (label pid), provider %s, interval %" PRIu64,
             (int)p->pid, p->proc_ids.n, p->opt.provider, interval);
    uint64_t lost_proc = p->skel->bss->lost_proc;
    if (lost_proc)
        fprintf(stderr, "ddheap-prof: LOST %" PRIu64 " process events (forks, execs): some "
                        "processes may be missing or unsymbolised\n", lost_proc);
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
    struct dd_prof_objects all;
    struct dd_prof_process_objects *views = NULL;
    if (gather_objects(p, &all, &views) != 0 ||
        dd_prof_report_build(&r, &p->table, views, p->proc_ids.n) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        free(all.v);
        free(views);
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
    if (dd_prof_write_pprof(out, p->opt.out_path, &r, &all, &meta) != 0)
        rc = -1;
    dd_prof_report_free(&r);
    free(all.v);
    free(views);
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
    if (rc == 0)
        rc = publish_outputs();
    if (rc != 0)
        dd_prof_discard_outputs();
    return rc;
}

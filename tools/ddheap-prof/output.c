/*
 * The outputs of a run: the gzipped pprof profile (pprof.c), folded stacks
 * and the flame graph (flame.c), the peak profile and the numbered
 * snapshots (timeline.c), the lifetime report (leaks.c), each from a
 * report of the table symbolised with every process's own objects
 * (report.c), with what the run lost or could not match said on stderr
 * and in the profiles' comments.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

/* Every file is written as a temporary file beside its final path
 * (DIR/.NAME.XXXXXX: the same directory and file system, so the rename is
 * atomic and its permission is proved when it is created) and renamed
 * once complete. Whatever ends the run before (an error, exit) removes the
 * temporary files: no empty or half-written file is ever left under an
 * output's name, and a reader never sees half a snapshot.
 *
 * What the path names decides where that happens (docs/ddheap-prof.md,
 * "Outputs"): a symlink is followed to the file at the end of its chain,
 * dangling or not, and that file is the one replaced, in its own
 * directory (the link stays); an existing file that is not a regular one
 * (a device, a FIFO) is never replaced: the output is built in memory and
 * written through it once complete, as a shell's redirection would. An
 * existing regular file must be writable (an immutable one is refused at
 * the start, before anything runs). "wrote" is said only once the file
 * has its name (or its data went through).
 *
 * Pending at once: the outputs of the end (-o, --svg, --folded, --peak,
 * --report), created before anything is attached and renamed together at
 * the end; and while a snapshot is written, its profile and flame graph,
 * each renamed as soon as it is complete. */
enum { MAX_OUTPUTS = 7 };
static struct pending {
    bool used;
    const char *path; /* as given */
    char *target;     /* the file written: path, or where its symlinks lead */
    char *tmp;        /* the temporary file renamed onto target; NULL when ... */
    int through_fd;   /* ... target is a device or FIFO: the data, in memory */
    char *wrote;      /* what to say once published (dd_prof_announce_output) */
} pending[MAX_OUTPUTS];

static void discard(struct pending *o)
{
    if (!o->used)
        return;
    if (o->tmp)
        unlink(o->tmp);
    if (o->through_fd >= 0)
        close(o->through_fd);
    free(o->tmp);
    free(o->target);
    free(o->wrote);
    *o = (struct pending){.through_fd = -1};
}

void dd_prof_discard_outputs(void)
{
    for (int i = 0; i < MAX_OUTPUTS; i++)
        discard(&pending[i]);
}

/* The file path names: path itself, or the end of its chain of symlinks
 * (which may not exist yet). NULL (errno set) for a loop or a bad link. */
static char *follow_symlinks(const char *path)
{
    char *at = strdup(path);
    for (int depth = 0; at != NULL && depth < 40; depth++) {
        struct stat st;
        if (lstat(at, &st) != 0 || !S_ISLNK(st.st_mode))
            return at;
        char link[PATH_MAX];
        ssize_t n = readlink(at, link, sizeof link - 1);
        char *next = NULL;
        if (n > 0) {
            link[n] = '\0';
            /* A relative link is relative to the link's directory. */
            const char *slash = strrchr(at, '/');
            int dir_len = link[0] == '/' || slash == NULL ? 0 : (int)(slash - at + 1);
            if (asprintf(&next, "%.*s%s", dir_len, at, link) < 0)
                next = NULL;
        }
        free(at);
        at = next;
    }
    if (at != NULL) {
        free(at);
        errno = ELOOP;
    }
    return NULL;
}

/* Whether an existing file can be written. A regular file is opened
 * (which changes nothing: no O_TRUNC): an immutable or read-only one says
 * EPERM, EACCES or EROFS. Anything else is only asked about: opening a
 * FIFO would end the stream of a reader already waiting on it. */
static bool writable(const char *target, bool regular)
{
    if (!regular)
        return faccessat(AT_FDCWD, target, W_OK, AT_EACCESS) == 0;
    int fd = open(target, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* Opens the temporary file of o (regular target) or its in-memory copy
 * (device, FIFO) into *f. -1 with errno on failure. */
static int open_pending_file(struct pending *o, bool through, FILE **f)
{
    int fd;
    if (through) {
        fd = memfd_create("ddheap-prof-output", MFD_CLOEXEC);
        o->through_fd = fd >= 0 ? dup(fd) : -1;
        if (o->through_fd < 0 && fd >= 0) {
            close(fd);
            fd = -1;
        }
    } else {
        const char *slash = strrchr(o->target, '/');
        int dir_len = slash ? (int)(slash - o->target + 1) : 0;
        if (asprintf(&o->tmp, "%.*s.%s.XXXXXX", dir_len, o->target,
                     slash ? slash + 1 : o->target) < 0) {
            o->tmp = NULL;
            errno = ENOMEM;
            return -1;
        }
        fd = mkostemp(o->tmp, O_CLOEXEC);
        if (fd < 0) {
            free(o->tmp);
            o->tmp = NULL;
            return -1;
        }
        /* mkstemp's 0600 would make a profile only root can read. */
        mode_t mask = umask(0);
        umask(mask);
        fchmod(fd, 0666 & ~mask);
    }
    *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (*f == NULL && fd >= 0) {
        int saved = errno;
        close(fd);
        errno = saved;
    }
    return *f ? 0 : -1;
}

/* Creates the temporary file of path, recorded as pending, open in *f.
 * NULL (the reason said) if it cannot be. */
static struct pending *create_pending(const char *path, FILE **f)
{
    struct pending *o = NULL;
    for (int i = 0; i < MAX_OUTPUTS && o == NULL; i++)
        if (!pending[i].used)
            o = &pending[i];
    if (o == NULL) {
        fprintf(stderr, "ddheap-prof: cannot write %s: too many files at once\n", path);
        return NULL;
    }
    *o = (struct pending){.used = true, .path = path, .through_fd = -1};
    struct stat st;
    int err = 0;
    bool through = false; /* an existing file, not a regular one */
    o->target = follow_symlinks(path);
    if (o->target == NULL)
        err = errno;
    else if (stat(o->target, &st) != 0)
        err = errno == ENOENT ? 0 : errno; /* ENOENT: a new file */
    else if (S_ISDIR(st.st_mode))
        err = EISDIR;
    else if (!writable(o->target, S_ISREG(st.st_mode)))
        err = errno;
    else
        through = !S_ISREG(st.st_mode);
    if (err == 0 && open_pending_file(o, through, f) != 0)
        err = errno;
    if (err != 0) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", path, strerror(err));
        discard(o);
        return NULL;
    }
    return o;
}

/* Writes the in-memory output of o through its device or FIFO. An open
 * of a FIFO waits for a reader, as a shell's redirection does. */
static int write_through(struct pending *o)
{
    int out = open(o->target, O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (out < 0 || lseek(o->through_fd, 0, SEEK_SET) != 0) {
        if (out >= 0)
            close(out);
        return -1;
    }
    char buf[65536];
    int rc = 0;
    for (;;) {
        ssize_t n = read(o->through_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            rc = n < 0 ? -1 : 0;
            break;
        }
        for (ssize_t done = 0; done < n && rc == 0;) {
            ssize_t w = write(out, buf + done, (size_t)(n - done));
            if (w > 0)
                done += w;
            else if (w < 0 && errno != EINTR)
                rc = -1;
        }
        if (rc != 0)
            break;
    }
    int saved = errno;
    if (close(out) != 0 && rc == 0)
        return -1;
    errno = saved;
    return rc;
}

/* Gives a written file its name (or writes it through its device or
 * FIFO); removes it if it cannot. */
static int publish(struct pending *o)
{
    int rc = o->tmp ? rename(o->tmp, o->target) : write_through(o);
    if (rc != 0)
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", o->path, strerror(errno));
    else if (o->wrote)
        fprintf(stderr, "ddheap-prof: wrote %s%s\n", o->path, o->wrote);
    if (rc == 0 && o->tmp) {
        free(o->tmp); /* renamed: nothing to remove */
        o->tmp = NULL;
    }
    discard(o);
    return rc;
}

void dd_prof_announce_output(const char *path, const char *detail)
{
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (pending[i].used && pending[i].path == path) {
            free(pending[i].wrote);
            pending[i].wrote = strdup(detail);
            return;
        }
}

/* An output of the end: created now, or ddheap-prof exits 1. */
static FILE *open_output(const char *path)
{
    FILE *f = NULL;
    if (path != NULL && create_pending(path, &f) == NULL)
        exit(1);
    return f;
}

/* A name pattern's files (snapshots) are created later: that its
 * directory takes one is proved now, with a temporary file removed at
 * once. Exits 1 if it does not. */
static void check_pattern(const char *pattern)
{
    FILE *f;
    struct pending *o = create_pending(pattern, &f);
    if (o == NULL)
        exit(1);
    fclose(f);
    discard(o);
}

/* Every output is created before anything is attached: a path that cannot
 * be written fails now, not after the run. */
void dd_prof_open_outputs(const struct options *o, struct outputs *f)
{
    atexit(dd_prof_discard_outputs);
    /* -o as a snapshot pattern: the final profile is the last snapshot;
     * --svg as one: a flame graph per snapshot, the last one at the end. */
    bool out_pattern = strchr(o->out_path, '%') != NULL;
    bool svg_pattern = o->svg_path != NULL && strchr(o->svg_path, '%') != NULL;
    if (out_pattern)
        check_pattern(o->out_path);
    if (svg_pattern)
        check_pattern(o->svg_path);
    *f = (struct outputs){.out = out_pattern ? NULL : open_output(o->out_path),
                          .svg = svg_pattern ? NULL : open_output(o->svg_path),
                          .folded = open_output(o->folded_path),
                          .peak = open_output(o->peak_path),
                          .report = open_output(o->report_path)};
}

/* Gives every output of the end its name. */
static int publish_outputs(void)
{
    int rc = 0;
    for (int i = 0; i < MAX_OUTPUTS; i++)
        if (pending[i].used && publish(&pending[i]) != 0)
            rc = -1;
    return rc;
}

/* A table symbolised: each stack with the objects of its own process
 * (report.c), and every process's objects one after another, the
 * profile's mappings. */
struct symbolised {
    struct dd_prof_report r;
    struct dd_prof_objects all;
    struct dd_prof_process_objects *views;
};

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

static int symbolise(struct prof *p, const struct dd_prof_table *t, struct symbolised *s)
{
    s->views = NULL;
    if (gather_objects(p, &s->all, &s->views) != 0 ||
        dd_prof_report_build(&s->r, t, s->views, p->proc_ids.n) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        free(s->all.v);
        free(s->views);
        return -1;
    }
    return 0;
}

static void symbolised_free(struct symbolised *s)
{
    dd_prof_report_free(&s->r);
    free(s->all.v);
    free(s->views);
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

/* How a served profile differs from a file's (http.c). */
struct served {
    int64_t from_mono_ns; /* the start of the period it covers */
    bool alloc_first;     /* alloc_space the default sample type */
    bool delta;           /* a change, not a state: no "why it is empty" */
};

/* One profile of table t (the run's, or a view of it) with the run's
 * comments, then note, then why it is empty if it is; from built, t's
 * symbolised report, if not NULL; as served says if not NULL. */
static int write_pprof_of(struct prof *p, const struct dd_prof_table *t,
                          struct symbolised *built, FILE *out, const char *path,
                          int64_t at_mono_ns, const char *note, const struct served *served)
{
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    char c_lost[256], c_what[256], c_counts[256], c_empty[300];
    if (p->opt.all)
        snprintf(c_what, sizeof c_what,
                 "ddheap-prof: every process with probes on the host (--all), processes %zu "
                 "(labels pid, comm, exe), provider %s, interval %" PRIu64,
                 p->proc_ids.n, p->opt.provider, p->interval);
    else
        snprintf(c_what, sizeof c_what,
                 "ddheap-prof: pid %d, processes %zu (labels pid, comm, exe), provider %s, "
                 "interval %" PRIu64,
                 (int)p->pid, p->proc_ids.n, p->opt.provider, p->interval);
    snprintf(c_lost, sizeof c_lost,
             "ddheap-prof: lost events: %" PRIu64 " (alloc %" PRIu64 ", free %" PRIu64
             "; ring buffer %lu KiB)",
             lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    snprintf(c_counts, sizeof c_counts,
             "ddheap-prof: alloc events %" PRIu64 ", free events %" PRIu64
             " (%" PRIu64 " of blocks not seen allocated), live sampled blocks %zu",
             p->table.allocs, p->table.frees, p->table.unmatched_frees, p->table.nlive);
    const char *comments[6] = {c_what, c_counts, c_lost};
    size_t ncomments = 3;
    char c_dropped[200];
    if (p->table.dropped) {
        snprintf(c_dropped, sizeof c_dropped,
                 "ddheap-prof: DROPPED %" PRIu64 " samples at the caps (--max-blocks %zu, "
                 "--max-stacks %zu): the totals are of the samples kept",
                 p->table.dropped, p->opt.max_live, p->opt.max_stacks);
        comments[ncomments++] = c_dropped;
    }
    if (note)
        comments[ncomments++] = note;
    const char *empty = served && served->delta
                            ? NULL
                            : dd_prof_empty_reason(p, t, DD_PROF_INUSE_SPACE, c_empty, sizeof c_empty);
    if (empty)
        comments[ncomments++] = empty;

    struct dd_prof_command *commands = calloc(p->proc_ids.n + 1, sizeof *commands);
    struct symbolised own, *s = built ? built : &own;
    if (commands == NULL || (built == NULL && symbolise(p, t, &own) != 0)) {
        free(commands);
        return -1;
    }
    for (size_t i = 0; i < p->proc_ids.n; i++)
        commands[i] = (struct dd_prof_command){(uint32_t)p->procs[i].tgid, p->procs[i].comm,
                                               p->procs[i].exe};
    int64_t from = served ? served->from_mono_ns : p->started_mono;
    struct dd_prof_meta meta = {.time_nanos = p->started_realtime + (from - p->started_mono),
                                .duration_nanos = at_mono_ns - from,
                                .period = (int64_t)p->interval,
                                .comments = comments,
                                .ncomments = ncomments,
                                .alloc_first = served && served->alloc_first,
                                .commands = commands,
                                .ncommands = p->proc_ids.n};
    int rc = dd_prof_write_pprof(out, path, &s->r, &s->all, &meta);
    if (built == NULL)
        symbolised_free(&own);
    free(commands);
    return rc;
}

int dd_prof_write_profile(struct prof *p, const struct dd_prof_table *t, FILE *out,
                          const char *path, int64_t at_mono_ns, const char *note)
{
    return write_pprof_of(p, t, NULL, out, path, at_mono_ns, note, NULL);
}

int dd_prof_profile_bytes(struct prof *p, const struct dd_prof_table *t, int64_t from_mono_ns,
                          int64_t at_mono_ns, const char *note, bool alloc_first, char **buf,
                          size_t *len)
{
    /* A period that starts after the run's is a delta (?seconds=N). */
    struct served served = {from_mono_ns, alloc_first, from_mono_ns != p->started_mono};
    *buf = NULL;
    *len = 0;
    FILE *mem = open_memstream(buf, len);
    if (mem == NULL)
        return -1;
    int rc = write_pprof_of(p, t, NULL, mem, "a served profile", at_mono_ns, note, &served);
    if (fclose(mem) != 0)
        rc = -1;
    if (rc != 0) {
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* One file of a snapshot, from the run's table symbolised once. */
struct file_job {
    struct prof *p;
    struct symbolised *s;
    const char *path, *note, *title;
    int64_t at_mono_ns;
};

/* Writes path through its temporary file and renames it into place. */
static int write_through_temp(const char *path, int (*write)(FILE *, void *), void *ctx)
{
    FILE *f;
    struct pending *o = create_pending(path, &f);
    if (o == NULL)
        return -1;
    int rc = write(f, ctx);
    if (fclose(f) != 0)
        rc = -1;
    if (rc != 0) {
        fprintf(stderr, "ddheap-prof: writing %s failed\n", path);
        discard(o);
        return -1;
    }
    return publish(o);
}

static int write_profile_job(FILE *f, void *ctx)
{
    const struct file_job *j = ctx;
    return write_pprof_of(j->p, &j->p->table, j->s, f, j->path, j->at_mono_ns, j->note,
                          NULL);
}

static int write_svg_job(FILE *f, void *ctx)
{
    const struct file_job *j = ctx;
    char why[300];
    const char *empty = dd_prof_empty_reason(j->p, &j->p->table, j->p->opt.value, why, sizeof why);
    return dd_prof_write_svg_noted(f, &j->s->r, j->p->opt.value, j->title, empty);
}

int dd_prof_write_snapshot_files(struct prof *p, const char *pb_path, const char *svg_path,
                                 int64_t at_mono_ns, const char *note, const char *title)
{
    struct symbolised s;
    if (symbolise(p, &p->table, &s) != 0)
        return -1;
    /* The flame graph first: the profile's writer adds its own strings
     * to the report's table. */
    struct file_job svg = {p, &s, svg_path, NULL, title, 0};
    struct file_job pb = {p, &s, pb_path, note, NULL, at_mono_ns};
    int rc = 0;
    if (svg_path != NULL)
        rc = write_through_temp(svg_path, write_svg_job, &svg);
    if (rc == 0)
        rc = write_through_temp(pb_path, write_profile_job, &pb);
    symbolised_free(&s);
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
    bool said = p->opt.value == DD_PROF_INUSE_SPACE && strchr(p->opt.out_path, '%') == NULL;
    if (empty && (svg || folded) && !said)
        fprintf(stderr, "ddheap-prof: the %s view is empty: %s\n",
                dd_prof_value_names[p->opt.value], empty);
    else if (at_peak && (svg || folded))
        fprintf(stderr, "ddheap-prof: every sampled block was freed by the end: the flame "
                        "graph shows the heap at its peak\n");

    int rc = 0;
    struct symbolised s;
    if (symbolise(p, t, &s) != 0) {
        rc = -1;
    } else {
        /* Folded stacks have no room for a title: an empty view is an
         * empty file, with the reason on stderr. */
        if (folded && dd_prof_write_folded(folded, &s.r, p->opt.value) != 0) {
            fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.folded_path);
            rc = -1;
        }
        if (svg &&
            dd_prof_write_svg_noted(svg, &s.r, p->opt.value, title, note[0] ? note : NULL) != 0) {
            fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.svg_path);
            rc = -1;
        }
        symbolised_free(&s);
    }
    if (at_peak)
        free(peak.stacks);
    return rc;
}

static int write_report(struct prof *p, FILE *f)
{
    struct symbolised s;
    int rc = -1;
    if (symbolise(p, &p->table, &s) == 0) {
        rc = dd_prof_write_lifetime_report(f, p, &s.r);
        symbolised_free(&s);
    }
    if (rc != 0 || fflush(f) != 0) {
        fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.report_path);
        return -1;
    }
    dd_prof_announce_output(p->opt.report_path, "");
    return 0;
}

/* What the run cost ddheap-prof, per process followed, and what could not
 * be read (objects.h). The processes' side (probes, stack copies) is theirs. */
static void report_costs(const struct prof *p)
{
    dd_prof_files_report(stderr);
    if (p->proc_ids.n < 2)
        return;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return;
    double cpu = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                 (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    fprintf(stderr, "ddheap-prof: %zu processes (%" PRIu64 " exited during the run, holding %.1f "
                    "MiB then), %zu distinct files; ddheap-prof's own CPU %.3f s, %.2f ms per "
                    "process\n",
            p->proc_ids.n, p->exits_applied, p->table.exited_space / 1048576.0,
            dd_prof_files_count(), cpu, 1e3 * cpu / (double)p->proc_ids.n);
}

/* The samples of one command (comm) over the processes that ran it. */
struct command_total {
    const char *comm;
    uint64_t samples;
    size_t processes;
    pid_t pid; /* the first of them */
};

static int by_samples(const void *a, const void *b)
{
    const struct command_total *x = a, *y = b;
    return (x->samples < y->samples) - (x->samples > y->samples);
}

/* One line naming what ran, by sampled allocations: a run's processes are
 * told apart by their commands (comm), not by their pids. */
static void say_commands(const struct prof *p)
{
    enum { SHOWN = 8 };
    size_t n = 0;
    struct command_total *v = calloc(p->proc_ids.n + 1, sizeof *v);
    if (v == NULL)
        return;
    for (size_t i = 0; i < p->proc_ids.n; i++) {
        const struct dd_prof_proc *proc = &p->procs[i];
        const char *comm = proc->comm ? proc->comm : "?";
        if (proc->samples == 0)
            continue;
        size_t k = 0;
        while (k < n && strcmp(v[k].comm, comm) != 0)
            k++;
        if (k == n)
            v[n++] = (struct command_total){comm, 0, 0, proc->tgid};
        v[k].samples += proc->samples;
        v[k].processes++;
    }
    qsort(v, n, sizeof *v, by_samples);
    if (n > 0)
        fprintf(stderr, "ddheap-prof: sampled allocations by command:");
    for (size_t k = 0; k < n && k < SHOWN; k++) {
        if (v[k].processes == 1)
            fprintf(stderr, "%s %s %" PRIu64 " (pid %d)", k ? "," : "", v[k].comm, v[k].samples,
                    (int)v[k].pid);
        else
            fprintf(stderr, "%s %s %" PRIu64 " (%zu processes)", k ? "," : "", v[k].comm,
                    v[k].samples, v[k].processes);
    }
    if (n > SHOWN)
        fprintf(stderr, ", and %zu more commands", n - SHOWN);
    if (n > 0)
        fputc('\n', stderr);
    free(v);
}

static int write_all(struct prof *p, const struct outputs *f)
{
    dd_prof_apply_exits(p); /* those read after the loop (dd_prof_let_go) */
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    uint64_t lost_proc = p->skel->bss->lost_proc;
    /* The table's clock stays at its last event: the leak rule's quarters
     * are of the time events came in, not of an idle tail or of the time
     * it took to notice the end. */
    int64_t end = dd_prof_now_ns(CLOCK_MONOTONIC);
    if (lost_proc)
        fprintf(stderr, "ddheap-prof: LOST %" PRIu64 " process events (forks, execs): some "
                        "processes may be missing or unsymbolised\n", lost_proc);
    fprintf(stderr,
            "ddheap-prof: alloc events %" PRIu64 ", free events %" PRIu64 " (%" PRIu64
            " of blocks not seen allocated), live sampled blocks %zu\n",
            p->table.allocs, p->table.frees, p->table.unmatched_frees, p->table.nlive);
    say_commands(p);
    if (lost_alloc + lost_free)
        fprintf(stderr, "ddheap-prof: LOST %" PRIu64 " events (alloc %" PRIu64 ", free %" PRIu64
                        "): the ring buffer was full; raise --ringbuf-kb (now %lu)\n",
                lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    char why[300];
    const char *empty = dd_prof_empty_reason(p, &p->table, DD_PROF_INUSE_SPACE, why, sizeof why);
    if (empty && f->out)
        fprintf(stderr, "ddheap-prof: the profile's inuse_space%s is empty: %s\n",
                f->svg && p->opt.value == DD_PROF_INUSE_SPACE && !show_peak(p)
                    ? " (and the flame graph)" : "",
                empty);

    int rc = write_views(p, f->svg, f->folded);
    if (f->peak && dd_prof_write_peak(p, f->peak) != 0)
        rc = -1;
    if (f->report && write_report(p, f->report) != 0)
        rc = -1;
    if (p->snaps.period_ns || f->out == NULL || p->snaps.svg_pattern != NULL) {
        /* The series ends with the state at the end of the run; with -o a
         * pattern, that is the final profile. */
        dd_prof_snapshot_now(p, end);
        if (p->snaps.failed)
            rc = -1;
    }
    if (f->out) {
        char detail[64];
        snprintf(detail, sizeof detail, " (%zu stacks)", p->table.nstacks);
        if (write_pprof_of(p, &p->table, NULL, f->out, p->opt.out_path, end, NULL, NULL) == 0)
            dd_prof_announce_output(p->opt.out_path, detail);
        else
            rc = -1;
    }
    report_costs(p);
    return rc;
}

int dd_prof_write_outputs(struct prof *p, struct outputs *f)
{
    int rc = write_all(p, f);
    FILE *files[] = {f->out, f->svg, f->folded, f->peak, f->report};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++)
        if (files[i] && fclose(files[i]) != 0)
            rc = -1;
    if (rc == 0)
        rc = publish_outputs();
    if (rc != 0)
        dd_prof_discard_outputs();
    if (p->opt.verbose) {
        uint64_t ahead, later;
        double longest_ms;
        dd_prof_symbolize_counts(&ahead, &later, &longest_ms);
        fprintf(stderr, "ddheap-prof: addresses named: %" PRIu64 " while running (the longest "
                        "stack %.1f ms), %" PRIu64 " when writing\n", ahead, longest_ms, later);
    }
    return rc;
}

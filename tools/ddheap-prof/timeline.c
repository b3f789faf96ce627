/*
 * The heap over time: numbered snapshots and the peak profile. Their
 * samples carry the pid label of each stack's process, and the snapshots'
 * the lifetime label of the blocks freed by then (pprof.c).
 *
 * Snapshots. With --every SECONDS, snapshot instants are the multiples of
 * SECONDS on CLOCK_MONOTONIC (the clock of the events' ts_ns), so that a
 * program can tell where they fall. Snapshot N is the table after every
 * event stamped before its instant: on_event asks before applying each
 * event (dd_prof_snapshots_before), and the loop writes the ones no event
 * came after (dd_prof_snapshot_due), once the ring buffer is drained. So
 * no sample is lost or counted twice between two snapshots: each is taken
 * between two events in ring-buffer order. Only the allocation and free
 * events (the `events` ring buffer) order snapshots, by their ts_ns: the
 * process events (forks, execs, exits) come on a ring buffer of their own,
 * read before it at each consume, and change no total of the table.
 * SIGUSR1 writes one at once.
 *
 * The peak is the run's: the highest estimated live bytes of all the
 * followed processes together (one table, table.h), at one instant; a
 * process's own peak may be elsewhere, and -tagfocus=pid=N on the peak
 * profile shows that process's part of the common peak.
 *
 * Each snapshot is a complete profile: alloc_* cumulative since the start,
 * inuse_* at that instant. `go tool pprof -base N N+1` is then the
 * interval's allocations and the change of the live heap.
 *
 * Names: -o with one integer conversion (%d, %4d, %04d...) is the
 * pattern; otherwise -o with ".%04d" before its ".pb.gz" (or ".gz", or at
 * the end). --svg with one is the pattern of a flame graph per snapshot.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prof.h"

/* Returns true if pattern has exactly one conversion, %[0][width]d, and
 * otherwise only %% escapes. */
static bool valid_pattern(const char *pattern)
{
    int conversions = 0;
    for (const char *c = pattern; *c; c++) {
        if (*c != '%')
            continue;
        if (c[1] == '%') {
            c++;
            continue;
        }
        c++;
        if (*c == '0')
            c++;
        while (*c >= '0' && *c <= '9')
            c++;
        if (*c != 'd')
            return false;
        conversions++;
    }
    return conversions == 1;
}

static char *derived_pattern(const char *out)
{
    size_t n = strlen(out), stem = n;
    static const char *const suffixes[] = {".pb.gz", ".gz"};
    for (size_t i = 0; i < 2; i++) {
        size_t k = strlen(suffixes[i]);
        if (n > k && strcmp(out + n - k, suffixes[i]) == 0) {
            stem = n - k;
            break;
        }
    }
    /* '%' in the stem would be read as a conversion: doubled. */
    size_t len = 2 * n + 8;
    char *p = malloc(len), *w = p;
    if (p == NULL)
        return NULL;
    for (size_t i = 0; i < stem; i++) {
        if (out[i] == '%')
            *w++ = '%';
        *w++ = out[i];
    }
    w += sprintf(w, ".%%04d");
    for (size_t i = stem; i < n; i++) {
        if (out[i] == '%')
            *w++ = '%';
        *w++ = out[i];
    }
    *w = '\0';
    return p;
}

void dd_prof_snapshots_setup(struct prof *p)
{
    struct snapshots *s = &p->snaps;
    const char *out = p->opt.out_path;
    s->pattern = strchr(out, '%') ? strdup(out) : derived_pattern(out);
    if (s->pattern == NULL) {
        fprintf(stderr, "ddheap-prof: out of memory\n");
        exit(1);
    }
    if (!valid_pattern(s->pattern) && p->opt.every == 0) {
        free(s->pattern); /* no snapshots but on SIGUSR1, which says so */
        s->pattern = NULL;
    } else if (!valid_pattern(s->pattern)) {
        fprintf(stderr, "ddheap-prof: -o %s: a snapshot name pattern has one %%d (or %%04d...) "
                        "and no other %% but %%%%\n", out);
        exit(2);
    }
    if (p->opt.svg_path != NULL && strchr(p->opt.svg_path, '%') != NULL) {
        if (!valid_pattern(p->opt.svg_path)) {
            fprintf(stderr, "ddheap-prof: --svg %s: a name pattern has one %%d (or %%04d...) "
                            "and no other %% but %%%%\n", p->opt.svg_path);
            exit(2);
        }
        s->svg_pattern = p->opt.svg_path;
    }
    if (p->opt.every > 0) {
        s->period_ns = (uint64_t)llround(p->opt.every * 1e9);
        uint64_t now = (uint64_t)dd_prof_now_ns(CLOCK_MONOTONIC);
        s->next_ns = (now / s->period_ns + 1) * s->period_ns;
    }
}

/* The name of snapshot seq by a checked pattern (valid_pattern), in buf;
 * false if it does not fit. */
static bool snapshot_name(char *buf, size_t len, const char *pattern, unsigned seq)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    int n = snprintf(buf, len, pattern, seq);
#pragma GCC diagnostic pop
    if (n < 0 || (size_t)n >= len) {
        fprintf(stderr, "ddheap-prof: snapshot name too long\n");
        return false;
    }
    return true;
}

/* Writes the table as it is now as the next numbered snapshot, stamped
 * at_ns (and its flame graph with --svg a pattern); removes the files of
 * the number --max-files before (numbers are consecutive, so the newest N
 * stay). */
static void write_snapshot(struct prof *p, uint64_t at_ns)
{
    struct snapshots *s = &p->snaps;
    if (s->pattern == NULL) {
        fprintf(stderr, "ddheap-prof: no snapshot: -o %s is not a name pattern (one %%d)\n",
                p->opt.out_path);
        return;
    }
    char name[4096];
    unsigned seq = s->seq + 1;
    if (!snapshot_name(name, sizeof name, s->pattern, seq)) {
        s->failed = true;
        return;
    }
    char note[160];
    double into = (double)((int64_t)at_ns - p->started_mono) / 1e9;
    snprintf(note, sizeof note,
             "ddheap-prof: snapshot %u at CLOCK_MONOTONIC %" PRIu64 " ns, %.3f s into the run", seq,
             at_ns, into);
    char svg[4096], title[128];
    snprintf(title, sizeof title, "ddheap-prof: %s, pid %d, snapshot %u (%.2f s)",
             dd_prof_value_names[p->opt.value], (int)p->pid, seq, into);
    if ((s->svg_pattern != NULL && !snapshot_name(svg, sizeof svg, s->svg_pattern, seq)) ||
        dd_prof_write_snapshot_files(p, name, s->svg_pattern ? svg : NULL, (int64_t)at_ns, note,
                                     title) != 0) {
        s->failed = true;
        return;
    }
    s->seq = seq;
    if (p->opt.verbose)
        fprintf(stderr, "ddheap-prof: wrote %s\n", name);
    if (p->opt.max_files == 0 || seq <= p->opt.max_files)
        return;
    const char *patterns[2] = {s->pattern, s->svg_pattern};
    for (int i = 0; i < 2; i++) {
        if (patterns[i] == NULL || !snapshot_name(name, sizeof name, patterns[i],
                                                  seq - p->opt.max_files))
            continue;
        if (unlink(name) != 0 && errno != ENOENT)
            fprintf(stderr, "ddheap-prof: cannot remove %s: %s\n", name, strerror(errno));
    }
}

void dd_prof_snapshots_before(struct prof *p, uint64_t ts_ns)
{
    struct snapshots *s = &p->snaps;
    while (s->period_ns && ts_ns >= s->next_ns && !s->failed) {
        write_snapshot(p, s->next_ns);
        s->next_ns += s->period_ns;
    }
}

bool dd_prof_snapshot_due(const struct prof *p, int64_t now_mono_ns)
{
    return p->snaps.period_ns && !p->snaps.failed && (uint64_t)now_mono_ns >= p->snaps.next_ns;
}

void dd_prof_snapshot_now(struct prof *p, int64_t now_mono_ns)
{
    /* Scheduled ones due by now first: numbers stay in time order. */
    dd_prof_snapshots_before(p, (uint64_t)now_mono_ns);
    if (!p->snaps.failed)
        write_snapshot(p, (uint64_t)now_mono_ns);
}

void dd_prof_snapshots_free(struct prof *p)
{
    free(p->snaps.pattern);
    memset(&p->snaps, 0, sizeof p->snaps);
}

int dd_prof_write_peak(struct prof *p, FILE *out)
{
    struct dd_prof_table view;
    if (dd_prof_table_peak_view(&p->table, &view) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory writing %s\n", p->opt.peak_path);
        return -1;
    }
    char note[200];
    int64_t at = (int64_t)p->table.peak_ts_ns;
    snprintf(note, sizeof note,
             "ddheap-prof: the peak: %.0f bytes estimated live at CLOCK_MONOTONIC %" PRId64
             " ns, %.3f s into the run",
             p->table.peak_space, at, at ? (double)(at - p->started_mono) / 1e9 : 0.0);
    int rc = dd_prof_write_profile(p, &view, out, p->opt.peak_path, at ? at : p->started_mono,
                                   note);
    free(view.stacks);
    if (rc == 0) {
        char detail[120];
        snprintf(detail, sizeof detail, " (the peak: %.1f MiB estimated live, %.3f s into the run)",
                 p->table.peak_space / 1048576.0, at ? (double)(at - p->started_mono) / 1e9 : 0.0);
        dd_prof_announce_output(p->opt.peak_path, detail);
    }
    return rc;
}

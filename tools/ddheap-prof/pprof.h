/*
 * Writing a report (report.h) as a gzipped pprof profile with Go's four
 * heap sample types, the recorded mappings and comments.
 */
#ifndef DDHEAP_PROF_PPROF_H
#define DDHEAP_PROF_PPROF_H

#include <stdbool.h>
#include <stdio.h>

#include "objects.h"
#include "report.h"

/* A process's command, its samples' string labels comm and exe (either
 * may be NULL: no label). */
struct dd_prof_command {
    uint32_t tgid;
    const char *comm, *exe;
};

struct dd_prof_meta {
    int64_t time_nanos, duration_nanos;
    int64_t period; /* the sampling interval, bytes */
    const char **comments;
    size_t ncomments;
    /* alloc_space the default sample type (Go's /debug/pprof/allocs);
     * inuse_space otherwise. */
    bool alloc_first;
    struct dd_prof_command *commands; /* sorted here by tgid */
    size_t ncommands;
};

/* Writes to out (already open, so a bad path failed before attaching).
 * Adds the profile's own strings to r's string table. Returns 0, or -1
 * with a message on stderr. */
int dd_prof_write_pprof(FILE *out, const char *path, struct dd_prof_report *r,
                        const struct dd_prof_objects *objs, const struct dd_prof_meta *meta);

#endif

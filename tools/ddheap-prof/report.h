/*
 * A profile ready to be written: every stack of the table resolved into
 * locations (one per distinct address) and functions (one per distinct
 * name and file), with the names interned once for all outputs. The
 * allocator's own frames (names.h: ddheap's probe and hooks, the malloc
 * family, operator new) are left off the innermost end of each stack, so
 * the code that asked for the memory is on top.
 */
#ifndef DDHEAP_PROF_REPORT_H
#define DDHEAP_PROF_REPORT_H

#include "intern.h"
#include "objects.h"
#include "symbolize.h"
#include "table.h"

struct dd_prof_location {
    uint64_t addr;
    long object; /* index into the objects, -1 if unmapped */
    /* As in dd_prof_frame: innermost inlined function first, the frame's
     * own function last (function[n - 1]). */
    uint32_t function[DD_PROF_MAX_INLINE];
    int line[DD_PROF_MAX_INLINE];
    unsigned n;
    bool in_ddheap_object; /* in libddheap_preload.so: ddheap's, whatever its name */
    bool interp;           /* an interpreter's frame (interp.h): shown with file:line */
};

struct dd_prof_function {
    /* String indices: name demangled (what every output shows),
     * system_name as the object has it (mangled), 0 ("") for an
     * interpreter's function (its name is final); file 0 ("") if unknown. */
    uint32_t name, system_name, file;
};

struct dd_prof_resolved {
    const struct dd_prof_stack *stack;
    uint32_t *locs; /* location indices, innermost first */
    uint32_t n;
};

struct dd_prof_report {
    struct dd_prof_strings strings; /* index 0 is "" */
    struct dd_prof_keys addrs;      /* location i has key addrs.v[i] (process, address) */
    struct dd_prof_location *locs;
    size_t locs_cap;
    struct dd_prof_keys func_keys; /* system_name << 33 | file << 1 | interp */
    struct dd_prof_function *funcs;
    size_t funcs_cap;
    struct dd_prof_resolved *stacks;
    size_t nstacks;
    bool any_lines; /* some location has file:line */
};

/* The objects of one process of the table's stacks (their tgid); they are
 * the profile's mappings first ... first + objs->n - 1. */
struct dd_prof_process_objects {
    uint32_t tgid;
    const struct dd_prof_objects *objs;
    size_t first;
};

/* Each stack is symbolised with the objects of its own process. */
int dd_prof_report_build(struct dd_prof_report *r, const struct dd_prof_table *t,
                         const struct dd_prof_process_objects *procs, size_t nprocs);
void dd_prof_report_free(struct dd_prof_report *r);

#endif

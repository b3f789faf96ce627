/*
 * Folded stacks and the flame-graph SVG, from a report (report.h): one
 * value per stack (which of the four is the caller's choice), frames named
 * by function, root first.
 */
#ifndef DDHEAP_PROF_FLAME_H
#define DDHEAP_PROF_FLAME_H

#include <stdio.h>

#include "report.h"

enum dd_prof_value { DD_PROF_ALLOC_OBJECTS, DD_PROF_ALLOC_SPACE, DD_PROF_INUSE_OBJECTS,
                     DD_PROF_INUSE_SPACE };

extern const char *const dd_prof_value_names[4];

/* "a;b;c 123" lines, the format of tools/ddheap-fold; stacks whose names
 * coincide are summed, zero totals left out. Returns 0 or -1. */
int dd_prof_write_folded(FILE *out, const struct dd_prof_report *r, enum dd_prof_value v);

/* A self-contained interactive SVG (click to zoom, search). title is shown
 * at the top. Returns 0 or -1. */
int dd_prof_write_svg(FILE *out, const struct dd_prof_report *r, enum dd_prof_value v,
                      const char *title);
/* The same with a line under the title (why it is empty, what it shows). */
int dd_prof_write_svg_noted(FILE *out, const struct dd_prof_report *r, enum dd_prof_value v,
                            const char *title, const char *note);

#endif

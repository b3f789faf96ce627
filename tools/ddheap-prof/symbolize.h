/*
 * Turning the addresses of a stack into function names (and file:line
 * where the object has DWARF line tables, with the functions inlined at
 * the address where it has DWARF scopes), from the ELF files of the
 * objects recorded while the process lived (objects.h): it works after
 * the process has exited. Uses elfutils' libdwfl: the symbol table for
 * names, debug info (in the file or found by build id / debuglink) for
 * lines.
 */
#ifndef DDHEAP_PROF_SYMBOLIZE_H
#define DDHEAP_PROF_SYMBOLIZE_H

#include <elfutils/libdwfl.h>

#include "objects.h"

/* Functions inlined into one another at an address, at most this many. */
#define DD_PROF_MAX_INLINE 8

struct dd_prof_function_at {
    const char *function; /* never NULL: "[unknown]" or "object+0xoff" */
    const char *file;     /* NULL without line info */
    int line;
};

struct dd_prof_frame {
    /* Innermost first: fn[0] is the code at the address (its line), each
     * next one the function it was inlined into (at the line of the
     * inlined call); fn[n - 1] is the function the frame really is, named
     * from the symbol table. n >= 1. */
    struct dd_prof_function_at fn[DD_PROF_MAX_INLINE];
    unsigned n;
    const struct dd_prof_object *object; /* NULL if no recorded mapping has addr */
};

struct dd_prof_symbolizer;

struct dd_prof_symbolizer *dd_prof_symbolizer_new(const struct dd_prof_objects *objs);

/* How libdwfl finds an object's ELF file and its separate debug info
 * (/usr/lib/debug, by build id too): one set for the symbolizer and the
 * unwinder. */
const Dwfl_Callbacks *dd_prof_dwfl_callbacks(void);
/* return_address: addr is where a call returns to (every frame but the
 * innermost), so the call itself, at addr - 1, is what gets named. The
 * strings stay valid until the symbolizer is freed. */
void dd_prof_symbolize(struct dd_prof_symbolizer *s, uint64_t addr, bool return_address,
                       struct dd_prof_frame *out);
void dd_prof_symbolizer_free(struct dd_prof_symbolizer *s);

/* Resolves the frames of a stack seen lately (innermost first, as the
 * unwinder gives them) with the process's objects of now, so that the
 * work of naming is done while the run goes on and a report later finds
 * every address remembered (each file's session keeps what it resolved).
 * Interpreter frames (interp.h) are named already and are passed over. */
void dd_prof_symbolize_ahead(const struct dd_prof_objects *objs, const uint64_t *frames,
                             uint32_t n);
/* How many addresses were resolved so far: ahead, while the run went on;
 * later, by a report (stacks not named ahead: the end of the run pays);
 * and the longest a stack named ahead took. */
void dd_prof_symbolize_counts(uint64_t *ahead, uint64_t *later, double *longest_ms);

#endif

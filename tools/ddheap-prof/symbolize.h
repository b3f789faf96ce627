/*
 * Turning the addresses of a stack into function names (and file:line
 * where the object has DWARF line tables), from the ELF files of the
 * objects recorded while the process lived (objects.h): it works after
 * the process has exited. Uses elfutils' libdwfl: the symbol table for
 * names, debug info (in the file or found by build id / debuglink) for
 * lines.
 */
#ifndef DDHEAP_PROF_SYMBOLIZE_H
#define DDHEAP_PROF_SYMBOLIZE_H

#include "objects.h"

struct dd_prof_frame {
    const char *function; /* never NULL: "[unknown]" or "object+0xoff" */
    const char *file;     /* NULL without line info */
    int line;
    const struct dd_prof_object *object; /* NULL if no recorded mapping has addr */
    bool known;                          /* function comes from a symbol */
};

struct dd_prof_symbolizer;

struct dd_prof_symbolizer *dd_prof_symbolizer_new(const struct dd_prof_objects *objs);
/* return_address: addr is where a call returns to (every frame but the
 * innermost), so the call itself, at addr - 1, is what gets named. The
 * strings stay valid until the symbolizer is freed. */
void dd_prof_symbolize(struct dd_prof_symbolizer *s, uint64_t addr, bool return_address,
                       struct dd_prof_frame *out);
void dd_prof_symbolizer_free(struct dd_prof_symbolizer *s);

#endif

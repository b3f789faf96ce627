/*
 * CPython 3.10-3.13 (interp.h): recognised by its _PyRuntime symbol in
 * the executable or libpython; its frames walked in BPF (python.bpf.h)
 * and named here from the process's code objects.
 */
#ifndef DDHEAP_PROF_PYTHON_H
#define DDHEAP_PROF_PYTHON_H

#include "../interp.h"

extern const struct dd_prof_interp dd_prof_python;

/* The line of the instruction at byte offset `offset` of a code object
 * whose first line is firstline, from its line table as the interpreter
 * version (PY_VERSION_HEX, major and minor) stores it; -1 if the table
 * gives none. (For the tests.) */
int dd_prof_python_line(uint32_t version, const uint8_t *table, size_t len, int firstline,
                        uint32_t offset);

#endif

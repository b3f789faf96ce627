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

/* The cold part of the function at link-time address lo (size bytes) of
 * the ELF file fd, found without its symbol: the code outside the
 * function that most of the function's jumps go to, as the range of its
 * .eh_frame entry; out->value 0 if no one entry has most of them (at
 * least 16, and at least a quarter of all the jumps that leave the
 * function). (For the tests too.) */
void dd_prof_python_cold_part(int fd, uint64_t lo, uint64_t size, struct dd_prof_elf_symbol *out);

#endif

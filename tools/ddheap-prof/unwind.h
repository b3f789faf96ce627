/*
 * Unwinding a copied user stack by DWARF CFI (.eh_frame, or .debug_frame
 * from the file or its separate debug file), with elfutils' libdwfl: the
 * registers the probe saw and the top of the stack the BPF side copied are
 * all libdwfl reads; the code is read from the ELF files of the objects
 * recorded for the process (objects.h). Where an object has no CFI for an
 * address, libdwfl's architecture backend walks that one frame by its
 * frame pointer.
 */
#ifndef DDHEAP_PROF_UNWIND_H
#define DDHEAP_PROF_UNWIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "objects.h"

/* A frame address no code has (it is in the kernel's half): the unwinder
 * puts it outermost when the copy of the stack ended before the unwinding
 * did, or the stack was deeper than a profile keeps; symbolised as
 * "[truncated]". */
#define DD_PROF_TRUNCATED_FRAME 0xfffffffffffff000ull

struct dd_prof_unwinder;

/* The stack as one alloc event carries it. */
struct dd_prof_stack_copy {
    const uint64_t *regs; /* DD_PROF_REG_* of ddheap_prof.h */
    const unsigned char *data;
    size_t len;    /* bytes of stack from regs[DD_PROF_REG_SP] up */
    size_t wanted; /* asked for: len < wanted means the stack's end was reached */
};

struct dd_prof_unwind_stats {
    uint64_t stacks, truncated, frames;
    uint64_t ns; /* time spent unwinding */
};

/* objs is the process's record of its mappings; it is rescanned (pid,
 * while the process lives) when a frame's address is in no object. */
struct dd_prof_unwinder *dd_prof_unwinder_new(struct dd_prof_objects *objs, pid_t pid);
/* Fills frames (innermost first: the probe site, then return addresses)
 * and returns how many; at most max, the last possibly
 * DD_PROF_TRUNCATED_FRAME. */
uint32_t dd_prof_unwind(struct dd_prof_unwinder *u, const struct dd_prof_stack_copy *copy,
                        uint64_t *frames, uint32_t max);
const struct dd_prof_unwind_stats *dd_prof_unwind_stats(const struct dd_prof_unwinder *u);
void dd_prof_unwinder_free(struct dd_prof_unwinder *u);

#endif

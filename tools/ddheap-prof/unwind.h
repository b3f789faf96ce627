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

/* An unwinding session: built from a list of objects (each file at its
 * load bias) and shared by every process whose objects are that list: a
 * forking server's workers and its parent share one as long as none maps
 * something of its own. A process holds one (NULL at first); when its
 * objects grow (a rescan, a dlopen) it moves to the session of its new
 * list (grown in place when it is the only holder); when it replaces them
 * (a fork's copy of its parent's, an exec) or exits, it releases it.
 * Sessions nobody holds are kept for the next process with that list;
 * their libdwfl state (a descriptor per module) is freed, least recently
 * used first, to stay within a share of the descriptor limit, and made
 * again when needed. */
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
    /* DDHEAP_PROF_CHECK_UNWIND=1 (unwind.c): samples the quick walk
     * unwound and libdwfl's too, and those where the two differed */
    uint64_t checked, mismatched;
};

/* What a session calls when a frame's address is in no object of the
 * process: rescan its maps into the objects given to dd_prof_unwind (at
 * most every 20 ms per session). Returns whether any object was added. */
typedef bool dd_prof_rescan_fn(void *arg, pid_t pid);

/* What every session costs is added to *stats; rescan is called for a
 * frame in no object. Call once, before the first unwind. */
void dd_prof_unwind_setup(struct dd_prof_unwind_stats *stats, dd_prof_rescan_fn *rescan,
                          void *rescan_arg);
/* What a process keeps of its unwinding (zeroed at first). */
struct dd_prof_unwind_hold {
    struct dd_prof_unwinder *session; /* NULL until its first stack */
    /* When its maps were last rescanned for a frame in no object (at most
     * every 20 ms: per process, as a process whose objects are not read
     * yet shares the session of the empty list with others). */
    int64_t last_rescan_ns;
};

/* Unwinds one stack of process pid, whose objects are objs (rescan adds to
 * them), with the session it holds (replaced by the one that fits objs,
 * the old one released). Fills frames (innermost first: the probe site,
 * then return addresses) and returns how many; at most max, the last
 * possibly DD_PROF_TRUNCATED_FRAME; 0 when out of memory. */
uint32_t dd_prof_unwind(struct dd_prof_unwind_hold *hold, pid_t pid,
                        const struct dd_prof_objects *objs,
                        const struct dd_prof_stack_copy *copy, uint64_t *frames, uint32_t max);
/* A process lets its session go (NULL: nothing). */
void dd_prof_unwinder_release(struct dd_prof_unwinder *u);
/* Every session, at the end of the run. */
void dd_prof_unwinders_free(void);

#endif

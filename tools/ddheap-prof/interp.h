/*
 * Interpreters whose own frames ddheap-prof names: where the native stack
 * says the interpreter's eval loop (`_PyEval_EvalFrameDefault` over and
 * over), the profile says which code of the interpreted program it ran.
 *
 * An interpreter is one struct dd_prof_interp (python/python.c is the one
 * there is): it recognises itself among the objects mapped into a process
 * and fills what its BPF walk needs (struct dd_prof_interp_config,
 * ddheap_prof.h; the walk is in its folder too), checks that once the
 * process runs, names the frames the walk recorded by reading the process
 * as the records arrive, and says which native frames are its eval loop.
 * The rest is here, the same for any interpreter: the merge of its frames
 * into the native stack, and the frames' names, one address each.
 */
#ifndef DDHEAP_PROF_INTERP_H
#define DDHEAP_PROF_INTERP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <linux/types.h>

#include "ddheap_prof.h"
#include "objects.h"
#include "symbolize.h"

struct dd_prof_interp {
    const char *name;
    /* o has just been recorded for process pid. If it is this
     * interpreter, returns its state for the process and fills *cfg. An
     * interpreter it knows but cannot walk (a version it has no layout
     * for) says why in why[] and returns NULL. */
    void *(*recognize)(const struct dd_prof_object *o, pid_t pid,
                       struct dd_prof_interp_config *cfg, char *why, size_t why_len);
    /* The process now runs the interpreter's code (its first frames have
     * come): whether what cfg says agrees with what the interpreter in
     * the process says of itself; if not, why. */
    bool (*verify)(void *state, pid_t pid, char *why, size_t why_len);
    /* Whether the code at addr is the eval loop's. */
    bool (*in_eval_loop)(const void *state, uint64_t addr);
    /* The function, file and line of a recorded frame, the strings valid
     * until the next call: read from the process now, or remembered. */
    void (*name_frame)(void *state, pid_t pid, const struct dd_prof_interp_frame *f,
                       struct dd_prof_function_at *out);
    /* The state of a process forked from the one of state (same code at
     * the same addresses, until they differ). */
    void *(*fork)(const void *state);
    void (*free)(void *state);
};

/* One process's interpreter. */
struct dd_prof_interp_proc;

/* Whether object o of process pid is an interpreter ddheap-prof can walk:
 * its session, with *cfg for the BPF side; NULL if not (and an
 * interpreter it cannot walk is said once, on stderr). */
struct dd_prof_interp_proc *dd_prof_interp_recognize(const struct dd_prof_object *o, pid_t pid,
                                                     struct dd_prof_interp_config *cfg);
/* A session of impl with its state (which it then owns); NULL when out
 * of memory (the state freed). */
struct dd_prof_interp_proc *dd_prof_interp_proc_new(const struct dd_prof_interp *impl,
                                                    void *state);
struct dd_prof_interp_proc *dd_prof_interp_fork(const struct dd_prof_interp_proc *ip);
void dd_prof_interp_free(struct dd_prof_interp_proc *ip);

/* The merged stack of one sample into out (at most max, innermost first):
 * the native frames, with the interpreter frames each eval-loop frame ran
 * inserted before it (inner side), named now; frames no eval-loop frame
 * took, just inside the outermost native frame. Returns how many; true in
 * *disable when the process's interpreter failed its check (said once on
 * stderr): stop walking it. */
uint32_t dd_prof_interp_merge(struct dd_prof_interp_proc *ip, pid_t pid, const uint64_t *native,
                              uint32_t n, const struct dd_prof_interp_frame *frames,
                              uint32_t nframes, bool cut, uint64_t *out, uint32_t max,
                              bool *disable);

/* A code object the BPF side saw for the first time (f: the frame that
 * ran it): named now, while it is there, and remembered. */
void dd_prof_interp_note_code(struct dd_prof_interp_proc *ip, pid_t pid,
                              const struct dd_prof_interp_frame *f);

/* Interpreter frames stand in a stack as addresses in the kernel's half,
 * one per distinct (function, file, line) of the run. */
bool dd_prof_interp_is_frame(uint64_t addr);
/* Its function, file and line; false if addr is no interpreter frame. */
bool dd_prof_interp_frame_at(uint64_t addr, struct dd_prof_function_at *out);
/* Forgets every frame's name (the end of the run). */
void dd_prof_interp_names_free(void);

#endif

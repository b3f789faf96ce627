/*
 * Loading a library into a running process and calling a function of it,
 * by ptrace, without a debugger (inject.c; docs/attach.md). Knows nothing
 * of the rest of ddheap-prof: agent.c calls it.
 */
#ifndef DDHEAP_PROF_INJECT_H
#define DDHEAP_PROF_INJECT_H

#include <stddef.h>
#include <sys/types.h>

struct dd_prof_injection {
    /* Our copy of the descriptor the start function returned in the
     * target (pidfd_getfd); the target's own copy is closed. -1 if none. */
    int fd;
    double latency_ms;    /* the whole of dd_prof_inject: checks, tracer, calls */
    double longest_stop_ms; /* longest a thread of the target was held */
    unsigned attempts;    /* stops until one was at a safe point */
    int loaded;           /* 1: dlopen was called; 0: the library was there */
};

/* Loads `lib` (a path in our mount namespace; loaded once, reused after)
 * into process pid, calls `start` (int start(void), returning a descriptor
 * of the target or -errno) in it, and puts every register of the thread
 * it borrowed back. Returns 0, or -1 with the reason in why: then the
 * process was refused before anything was done to it, or (said so) the
 * call failed and its registers were restored. */
int dd_prof_inject(pid_t pid, const char *lib, const char *start, struct dd_prof_injection *out,
                   char *why, size_t why_size);

#endif

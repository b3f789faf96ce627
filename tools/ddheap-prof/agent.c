/*
 * -p PID of a process without ddheap's probes: ddheap's agent
 * (libddheap_agent.so, src/agent/) is injected into it (inject.c), and its
 * probes are then attached like any object's. The agent detaches when the
 * descriptor kept here closes: at the end of the run, or when ddheap-prof
 * dies (docs/attach.md).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "inject.h"
#include "prof.h"

#define AGENT_NAME "libddheap_agent.so"

/* Whether every object of the process with probes is an agent (one left
 * inert by an earlier run counts as none). */
static bool only_agent_probes(const struct dd_prof_proc *proc)
{
    for (size_t i = 0; i < proc->objs.n; i++) {
        const struct dd_prof_object *o = &proc->objs.v[i];
        const char *slash = o->path ? strrchr(o->path, '/') : NULL;
        const char *base = slash ? slash + 1 : o->path ? o->path : "";
        if ((o->probes & DD_PROF_HAS_ALLOC) && strncmp(base, AGENT_NAME, strlen(AGENT_NAME)) != 0)
            return false;
    }
    return true;
}

int dd_prof_inject_agent(struct prof *p, struct dd_prof_proc *proc)
{
    if (!only_agent_probes(proc))
        return 0;
    if (p->opt.no_inject) {
        fprintf(stderr, "ddheap-prof: process %d has no %s:alloc probe in any object it maps, and "
                        "--no-inject forbids injecting ddheap's agent\n",
                (int)proc->tgid, p->opt.provider);
        return -1;
    }
    const char *lib = dd_prof_library(DD_PROF_AGENT_LIB);
    struct dd_prof_injection inj;
    char why[512];
    if (dd_prof_inject(proc->tgid, lib, "ddheap_agent_start", &inj, why, sizeof why) != 0) {
        fprintf(stderr, "ddheap-prof: cannot inject ddheap's agent into process %d: %s\n",
                (int)proc->tgid, why);
        return -1;
    }
    p->agent_fd = inj.fd;
    fprintf(stderr, "ddheap-prof: injected %s into process %d (%s; attach %.1f ms, a thread of "
                    "it held %.1f ms at most, %u stop%s)\n",
            lib, (int)proc->tgid, inj.loaded ? "loaded" : "loaded already", inj.latency_ms,
            inj.longest_stop_ms, inj.attempts, inj.attempts == 1 ? "" : "s");
    if (dd_prof_rescan(p, proc) < 0)
        return -1;
    return 0;
}

void dd_prof_release_agent(struct prof *p)
{
    if (p->agent_fd >= 0)
        close(p->agent_fd);
    p->agent_fd = -1;
}

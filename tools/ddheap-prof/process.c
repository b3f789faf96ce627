/*
 * The profiled process: a command ddheap-prof starts (under ptrace, so
 * that the probes are attached at its exec, before its first instruction,
 * and its last mappings can be read at its exit stop), or a running one
 * given by -p; its environment (the sampling interval it runs with); and
 * whether it is gone.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

#include "prof.h"

/* The process's environment, as execve wants it (NULL-terminated). */
char **dd_prof_environment_of(pid_t pid, char **buf_out)
{
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 16384;
            char *g = realloc(buf, cap);
            if (g == NULL) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = g;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[len] = '\0';
    size_t count = 0;
    for (size_t i = 0; i < len; i++)
        count += buf[i] == '\0';
    char **env = calloc(count + 2, sizeof *env);
    if (env == NULL) {
        free(buf);
        return NULL;
    }
    size_t k = 0;
    for (size_t i = 0; i < len; i += strlen(buf + i) + 1)
        env[k++] = buf + i;
    *buf_out = buf;
    return env;
}

static uint64_t parse_interval(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return 0;
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    return *end ? 0 : (uint64_t)v;
}

/* pprof's period (prof.h). */
uint64_t dd_prof_interval_of(pid_t pid)
{
    char *buf = NULL;
    char **env = dd_prof_environment_of(pid, &buf);
    uint64_t interval = 512 * 1024;
    for (size_t i = 0; env && env[i]; i++)
        if (strncmp(env[i], "DD_HEAP_SAMPLING_INTERVAL=", 26) == 0) {
            uint64_t v = parse_interval(env[i] + 26);
            if (v)
                interval = v;
        }
    free(env);
    free(buf);
    return interval;
}

/* Forks CMD; the child waits for a byte on a pipe before its exec, so the
 * parent can seize it first and see the exec stop. Returns the pid. */
pid_t dd_prof_start_command(char **cmd)
{
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) {
        perror("ddheap-prof: pipe");
        exit(1);
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("ddheap-prof: fork");
        exit(1);
    }
    if (pid == 0) {
        char byte;
        close(go[1]);
        if (read(go[0], &byte, 1) != 1)
            _exit(127);
        execvp(cmd[0], cmd);
        fprintf(stderr, "ddheap-prof: cannot run %s: %s\n", cmd[0], strerror(errno));
        _exit(127);
    }
    close(go[0]);
    if (ptrace(PTRACE_SEIZE, pid, NULL,
               (void *)(long)(PTRACE_O_TRACEEXEC | PTRACE_O_TRACEEXIT)) != 0) {
        perror("ddheap-prof: ptrace");
        kill(pid, SIGKILL);
        exit(1);
    }
    if (write(go[1], "g", 1) != 1) {
        perror("ddheap-prof: starting the command");
        exit(1);
    }
    close(go[1]);
    return pid;
}

/* Handles whatever state changes of the child are pending (prof.h). */
bool dd_prof_child_events(struct prof *p, int *status, bool *exec_seen)
{
    for (;;) {
        int st;
        pid_t got = waitpid(p->pid, &st, WNOHANG | __WALL);
        if (got <= 0)
            return false;
        if (WIFEXITED(st) || WIFSIGNALED(st)) {
            *status = st;
            return true;
        }
        if (!WIFSTOPPED(st))
            continue;
        int event = st >> 16, sig = WSTOPSIG(st);
        if (event == PTRACE_EVENT_EXEC) {
            /* Not one instruction of the new image has run. The old
             * image's objects are gone with it; forget them unless a
             * stack already points into them (the first mapping is what
             * pprof takes for the main binary). */
            if (p->table.allocs == 0)
                dd_prof_objects_free(&p->objs);
            if (dd_prof_rescan(p) >= 0)
                dd_prof_attach_needed_libraries(p);
            p->interval = dd_prof_interval_of(p->pid);
            if (p->nattached == 0)
                /* A wrapper (env, a shell) may exec the real program
                 * later, or the program dlopen an instrumented library. */
                fprintf(stderr, "ddheap-prof: no %s probes in %s yet; profiling starts when it "
                                "maps an object that has them\n",
                        p->opt.provider, p->opt.cmd[0]);
            *exec_seen = true;
            sig = 0;
        } else if (event == PTRACE_EVENT_EXIT) {
            dd_prof_rescan(p); /* the last look at the mappings */
            sig = 0;
        } else if (event == PTRACE_EVENT_STOP) {
            /* A group stop (SIGSTOP, Ctrl-Z): the program stays stopped,
             * as it would untraced, while we keep watching. */
            ptrace(PTRACE_LISTEN, p->pid, NULL, NULL);
            continue;
        } else if (event != 0) {
            sig = 0;
        }
        /* A signal-delivery stop: hand the signal on. */
        ptrace(PTRACE_CONT, p->pid, NULL, (void *)(long)sig);
    }
}

/* Lets go of a command that is still running (Ctrl-C, -d): stops it with
 * PTRACE_INTERRUPT and detaches at that stop. A signal caught on the way
 * (the terminal's SIGINT reaches the command too) is handed on by the
 * detach itself; a tracer that just exited would swallow it. */
void dd_prof_detach_child(struct prof *p)
{
    if (ptrace(PTRACE_INTERRUPT, p->pid, NULL, NULL) != 0)
        return;
    for (;;) {
        int st;
        if (waitpid(p->pid, &st, __WALL) != p->pid || !WIFSTOPPED(st))
            return;
        int event = st >> 16, sig = WSTOPSIG(st);
        if (event == PTRACE_EVENT_EXEC || event == PTRACE_EVENT_EXIT) {
            ptrace(PTRACE_CONT, p->pid, NULL, NULL);
            continue;
        }
        ptrace(PTRACE_DETACH, p->pid, NULL, (void *)(long)(event ? 0 : sig));
        return;
    }
}

/* Gone, or a zombie: it allocates nothing any more either way. */
bool dd_prof_process_gone(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    char name[64], buf[512];
    snprintf(name, sizeof name, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* the command name may hold anything */
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

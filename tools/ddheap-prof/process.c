/*
 * The profiled processes: a command ddheap-prof starts, or a running one
 * given by -p, and (following) the processes they fork; their
 * environment (the sampling interval they run with); whether they are
 * gone.
 *
 * No ptrace: the command waits on a pipe until the BPF side follows its
 * pid, and the BPF side stops it (SIGSTOP, which only its parent, we, can
 * see) at each exec, before the new image's first instruction, and once
 * more when the dynamic loader has mapped the libraries, before their
 * constructors. At each stop its objects are attached, then SIGCONT lets
 * it go. Between and after, it runs as it would without us: its signals,
 * timers and threads are its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <bpf/libbpf.h>
#include <limits.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/types.h>

#include "ddheap_prof.h"
#include "grow.h"
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
        if (dd_prof_grow(&buf, &cap, len + 4096 + 1, 1) != 0) {
            free(buf);
            fclose(f);
            return NULL;
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

/* pprof's period, and the rate its samples are limited to (prof.h). */
uint64_t dd_prof_interval_of(pid_t pid, uint64_t *samples_per_second)
{
    char *buf = NULL;
    char **env = dd_prof_environment_of(pid, &buf);
    uint64_t interval = 512 * 1024;
    *samples_per_second = DD_PROF_DEFAULT_SAMPLES_PER_SECOND;
    for (size_t i = 0; env && env[i]; i++) {
        if (strncmp(env[i], "DD_HEAP_SAMPLING_INTERVAL=", 26) == 0) {
            uint64_t v = parse_interval(env[i] + 26);
            if (v)
                interval = v;
        }
        const char *rate = "DD_HEAP_SAMPLES_PER_SECOND=";
        if (strncmp(env[i], rate, strlen(rate)) == 0) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(env[i] + strlen(rate), &end, 10);
            if (errno == 0 && *end == '\0' && end != env[i] + strlen(rate))
                *samples_per_second = v; /* 0: no limit */
        }
    }
    free(env);
    free(buf);
    return interval;
}

/* SIGPIPE as it was when ddheap-prof started: main ignores it for its
 * own writes, and an ignored signal stays ignored across exec. */
static struct sigaction original_sigpipe;
static int go_fd = -1, exec_error_fd = -1;

void dd_prof_record_signals(void)
{
    sigaction(SIGPIPE, NULL, &original_sigpipe);
}

/* Forks CMD (prof.h). The child waits on a pipe; once told, it execs, or
 * writes its errno to a second pipe that the exec closes otherwise. */
int dd_prof_start_command(struct prof *p)
{
    const char *preload = dd_prof_preload_for(&p->opt);
    int go[2], err[2];
    if (pipe2(go, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        perror("ddheap-prof: pipe");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("ddheap-prof: fork");
        return 1;
    }
    if (pid == 0) {
        char byte;
        close(go[1]);
        close(err[0]);
        sigaction(SIGPIPE, &original_sigpipe, NULL);
        if (read(go[0], &byte, 1) != 1)
            _exit(127);
        if (preload != NULL)
            dd_prof_add_preload(preload);
        execvp(p->opt.cmd[0], p->opt.cmd);
        int e = errno;
        if (write(err[1], &e, sizeof e) != (ssize_t)sizeof e)
            _exit(127);
        _exit(127);
    }
    close(go[0]);
    close(err[1]);
    go_fd = go[1];
    exec_error_fd = err[0];
    p->pid = pid;
    p->child_pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (p->child_pidfd < 0) {
        perror("ddheap-prof: pidfd_open");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    struct dd_prof_proc *proc = dd_prof_proc_of(p, pid);
    if (proc == NULL || dd_prof_follow(p, pid, DD_PROF_STOP_AT_EXEC) != 0) {
        fprintf(stderr, "ddheap-prof: cannot follow the command\n");
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 1;
    }
    return 0;
}

int dd_prof_release_command(struct prof *p)
{
    if (write(go_fd, "g", 1) != 1) {
        perror("ddheap-prof: starting the command");
        kill(p->pid, SIGKILL);
        return 1;
    }
    close(go_fd);
    /* Returns at the exec (the pipe closes: the child is stopped there
     * now) or with the errno of a failed one. */
    int e = 0;
    ssize_t got;
    do
        got = read(exec_error_fd, &e, sizeof e);
    while (got < 0 && errno == EINTR);
    close(exec_error_fd);
    if (got == (ssize_t)sizeof e) {
        waitpid(p->pid, NULL, 0);
        fprintf(stderr, "ddheap-prof: cannot run %s: %s\n", p->opt.cmd[0], strerror(e));
        return e == ENOENT ? 127 : 126; /* a shell's statuses */
    }
    return 0;
}

struct dd_prof_proc *dd_prof_proc_of(struct prof *p, pid_t tgid)
{
    int added;
    long i = dd_prof_keys_intern(&p->proc_ids, (uint64_t)tgid, &added);
    if (i < 0)
        return NULL;
    if (dd_prof_grow(&p->procs, &p->procs_cap, (size_t)i + 1, sizeof *p->procs) != 0)
        return NULL;
    struct dd_prof_proc *proc = &p->procs[i];
    if (added) {
        *proc = (struct dd_prof_proc){.tgid = tgid};
        dd_prof_read_command(proc);
    }
    return proc;
}

/* Replaces *field with a copy of value (kept as it was if out of memory). */
static void replace(char **field, const char *value)
{
    char *copy = strdup(value);
    if (copy) {
        free(*field);
        *field = copy;
    }
}

void dd_prof_read_command(struct dd_prof_proc *proc)
{
    char path[64], exe[PATH_MAX], comm[64];
    snprintf(path, sizeof path, "/proc/%d/exe", (int)proc->tgid);
    ssize_t n = readlink(path, exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        replace(&proc->exe, exe);
        const char *slash = strrchr(exe, '/');
        replace(&proc->name, slash ? slash + 1 : exe);
    }
    snprintf(path, sizeof path, "/proc/%d/comm", (int)proc->tgid);
    FILE *f = fopen(path, "re");
    if (f != NULL && fgets(comm, sizeof comm, f) != NULL) {
        comm[strcspn(comm, "\n")] = '\0';
        replace(&proc->comm, comm);
    }
    if (f != NULL)
        fclose(f);
}

void dd_prof_proc_free_names(struct dd_prof_proc *proc)
{
    free(proc->name);
    free(proc->comm);
    free(proc->exe);
    proc->name = proc->comm = proc->exe = NULL;
}

/* Our child is stopped (or its stop is pending) at one of the stops the
 * BPF side made; SIGCONT after a pending stop discards it. Either way it
 * runs on, and only we, its parent, could have seen anything. */
static void resume(struct prof *p)
{
    p->child_stopped = false;
    kill(p->pid, SIGCONT);
}

void dd_prof_let_go(struct prof *p)
{
    dd_prof_no_more_stops(p);
    dd_prof_follow(p, p->pid, 0);
    /* A stop made before that has its event waiting: handled here. */
    ring_buffer__consume(p->rb);
    if (p->child_stopped)
        resume(p);
    dd_prof_end_stops(p);
}

void dd_prof_end_stops(struct prof *p)
{
    dd_prof_no_more_stops(p);
    for (size_t i = 0; i < p->proc_ids.n; i++)
        if (p->procs[i].loader_stop_pending) {
            p->procs[i].loader_stop_pending = false;
            kill(p->procs[i].tgid, SIGCONT);
        }
}

static void on_exec(struct prof *p, struct dd_prof_proc *proc, bool stopped)
{
    /* The old image's objects are gone with it; they are forgotten unless
     * a stack may point into them (the first mapping is what pprof takes
     * for the main binary). */
    if (proc->samples == 0)
        dd_prof_objects_free(&proc->objs);
    /* Kept, they only name frames: nothing is attached or raised in them
     * (their addresses are the new image's now). */
    for (size_t i = 0; i < proc->objs.n; i++) {
        proc->objs.v[i].attach_tried = true;
        proc->objs.v[i].attached = proc->objs.v[i].semaphores_raised = false;
    }
    /* Its unwinding session knew the old image's modules. */
    dd_prof_unwinder_release(proc->unwinder.session);
    proc->unwinder = (struct dd_prof_unwind_hold){0};
    /* The new image's interpreter, if any, is among the objects to come. */
    dd_prof_forget_interpreter(p, proc);
    proc->interp_seen = proc->objs.n;
    dd_prof_read_command(proc);
    bool ours = p->child && proc->tgid == p->pid;
    if (ours)
        p->child_stopped = true;
    dd_prof_rescan(p, proc);
    bool loader_stop = dd_prof_prepare_exec(p, proc) && (ours || stopped);
    if (stopped && !ours) {
        /* A descendant, stopped by the BPF side (DD_PROF_STOP_AT_EXEC). */
        if (loader_stop &&
            dd_prof_follow(p, proc->tgid, DD_PROF_STOP_AT_EXEC | DD_PROF_STOP_AT_LOADER) == 0)
            proc->loader_stop_pending = true;
        kill(proc->tgid, SIGCONT);
    }
    if (ours) {
        p->interval = dd_prof_interval_of(p->pid, &p->samples_per_second);
        /* On to the loader's stop, where the libraries are attached. */
        if (loader_stop &&
            dd_prof_follow(p, proc->tgid, DD_PROF_STOP_AT_EXEC | DD_PROF_STOP_AT_LOADER) == 0)
            p->loader_stop_pending = true;
        resume(p);
    }
}

/* The process events of the BPF side (prof.h). */
int dd_prof_on_proc_event(void *ctx, void *data, size_t size)
{
    struct prof *p = ctx;
    const struct dd_prof_event_head *h = data;
    if (size < sizeof *h)
        return 0;
    if (h->type == DD_PROF_EV_EXEC_OTHER) {
        /* Not followed: no entry for it unless it has probes (host.c). */
        dd_prof_host_on_exec(p, (pid_t)h->tgid);
        return 0;
    }
    struct dd_prof_proc *proc = dd_prof_proc_of(p, (pid_t)h->tgid);
    if (proc == NULL) {
        p->oom = true;
        return 0;
    }
    switch (h->type) {
    case DD_PROF_EV_FORK: {
        /* Its address space is a copy of its parent's. */
        struct dd_prof_proc *parent = dd_prof_proc_of(p, (pid_t)h->ptr);
        if (parent == NULL) {
            p->oom = true;
            break;
        }
        proc = dd_prof_proc_of(p, (pid_t)h->tgid); /* parent's growth may move it */
        /* (Its first samples may have been read before its fork: the two
         * ring buffers are read one after the other.) */
        uint64_t samples = proc->samples;
        dd_prof_objects_free(&proc->objs);
        dd_prof_unwinder_release(proc->unwinder.session); /* built from the objects just freed */
        dd_prof_forget_interpreter(p, proc);
        dd_prof_proc_free_names(proc);
        *proc = (struct dd_prof_proc){.tgid = (pid_t)h->tgid, .parent = (pid_t)h->ptr,
                                      .samples = samples, .known = true};
        /* Until it execs, it runs its parent's command. */
        const char *names[3] = {parent->name, parent->comm, parent->exe};
        char **copies[3] = {&proc->name, &proc->comm, &proc->exe};
        for (int i = 0; i < 3; i++)
            if (names[i])
                replace(copies[i], names[i]);
        if (dd_prof_objects_copy(&proc->objs, &parent->objs) != 0)
            p->oom = true;
        else if (p->opt.all)
            dd_prof_host_on_fork(p, proc);
        dd_prof_guardian_fork(proc->tgid, parent->tgid);
        dd_prof_inherit_interpreter(p, proc, parent);
        break;
    }
    case DD_PROF_EV_EXEC:
        dd_prof_guardian_gone(proc->tgid);
        proc->known = true;
        on_exec(p, proc, h->ptr != 0);
        break;
    case DD_PROF_EV_LOADED:
        dd_prof_rescan(p, proc);
        if (proc->loader_stop_pending) {
            proc->loader_stop_pending = false;
            kill(proc->tgid, SIGCONT);
        }
        if (p->child && proc->tgid == p->pid && p->loader_stop_pending) {
            p->loader_stop_pending = false;
            if (p->nattached == 0)
                /* A wrapper (env, a shell) may exec the real program
                 * later, or the program dlopen an instrumented library. */
                fprintf(stderr, "ddheap-prof: no %s probes in %s yet; profiling starts when it "
                                "maps an object that has them\n",
                        p->opt.provider, proc->name ? proc->name : p->opt.cmd[0]);
            resume(p);
        }
        break;
    case DD_PROF_EV_EXIT:
        dd_prof_guardian_gone(proc->tgid);
        proc->gone = true;
        /* Nothing to lower in it (its pid may be another process's soon). */
        for (size_t i = 0; i < proc->objs.n; i++)
            proc->objs.v[i].semaphores_raised = false;
        dd_prof_note_exit(p, proc->tgid, h->ts_ns);
        /* (Its last samples are still to be read: the names are kept.) */
        dd_prof_stop_interpreter_walk(p, proc);
        break;
    default:
        break;
    }
    return 0;
}

bool dd_prof_reap_command(struct prof *p, int *status)
{
    int st;
    pid_t got;
    do
        got = waitpid(p->pid, &st, WNOHANG);
    while (got < 0 && errno == EINTR);
    if (got != p->pid)
        return false;
    *status = st;
    return true;
}

/* The process a thread id belongs to: /proc/ID/status's Tgid (an id of
 * a thread that is not its process's first resolves there too). 0 if it
 * cannot be read. */
pid_t dd_prof_tgid_of(pid_t id)
{
    char name[64], line[256];
    snprintf(name, sizeof name, "/proc/%d/status", (int)id);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return 0;
    long tgid = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Tgid: %ld", &tgid) == 1)
            break;
    fclose(f);
    return tgid > 0 && tgid <= INT_MAX ? (pid_t)tgid : 0;
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

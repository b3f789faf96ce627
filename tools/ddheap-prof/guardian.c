/*
 * The guardian: what ddheap-prof changed in the processes it follows is
 * undone even if it dies first (SIGKILL, a crash). Following, it raises
 * the probe semaphores of those processes itself and stops each forked
 * child at its exec for a moment (attach.c, process.c); a process of its
 * own, started before any of that, holds the map of followed processes
 * and the end of a pipe on which ddheap-prof tells it each semaphore it
 * raises or lowers and each fork, exec and exit that changes who holds
 * one. At ddheap-prof's normal end it is told all is well; at EOF (its
 * death) it lowers what is still raised in live processes and continues
 * every followed process that is stopped.
 */
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddheap_prof.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
#include "ddheap_prof.skel.h"
#pragma GCC diagnostic pop
#include "grow.h"
#include "prof.h"

struct guardian_record {
    char type; /* 'R' raised, 'L' lowered, 'F' fork, 'G' gone (exec, exit), 'D' done */
    int32_t pid, parent;
    uint64_t addr;
};

struct raised {
    int32_t pid;
    uint64_t addr;
};

static int guardian_fd = -1;

static void tell(char type, pid_t pid, pid_t parent, uint64_t addr)
{
    if (guardian_fd < 0)
        return;
    struct guardian_record r = {type, pid, parent, addr};
    /* (A record is smaller than PIPE_BUF: written whole or not at all.) */
    while (write(guardian_fd, &r, sizeof r) < 0 && errno == EINTR)
        ;
}

void dd_prof_guardian_raised(pid_t pid, uint64_t addr, int delta)
{
    tell(delta > 0 ? 'R' : 'L', pid, 0, addr);
}

void dd_prof_guardian_fork(pid_t child, pid_t parent)
{
    tell('F', child, parent, 0);
}

void dd_prof_guardian_gone(pid_t pid)
{
    tell('G', pid, 0, 0);
}

/* Whether /proc says the process is stopped. */
static bool is_stopped(uint32_t pid)
{
    char path[40], buf[256];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && paren[2] == 'T';
}

struct table {
    struct raised *v;
    size_t n, cap;
};

static void push(struct table *t, int32_t pid, uint64_t addr)
{
    if (dd_prof_grow(&t->v, &t->cap, t->n + 1, sizeof *t->v) != 0)
        return;
    t->v[t->n++] = (struct raised){pid, addr};
}

/* Applies one record to the table of raised semaphores: a forked child
 * holds its parent's, an exec or an exit drops the process's. */
static void apply(struct table *t, const struct guardian_record *r)
{
    if (r->type == 'R') {
        push(t, r->pid, r->addr);
    } else if (r->type == 'F') {
        for (size_t i = 0, end = t->n; i < end; i++)
            if (t->v[i].pid == r->parent)
                push(t, r->pid, t->v[i].addr);
    } else if (r->type == 'L' || r->type == 'G') {
        size_t kept = 0;
        for (size_t i = 0; i < t->n; i++)
            if (t->v[i].pid != r->pid || (r->type == 'L' && t->v[i].addr != r->addr))
                t->v[kept++] = t->v[i];
        t->n = kept;
    }
}

static _Noreturn void guard(int ended, int followed)
{
    dup2(ended, 0);
    dup2(followed, 1);
    close_range(2, ~0U, 0); /* no uprobe, program or ring buffer kept alive */
    struct table t = {NULL, 0, 0};
    struct guardian_record r;
    ssize_t got;
    for (;;) {
        while ((got = read(0, &r, sizeof r)) < 0 && errno == EINTR)
            ;
        if (got != (ssize_t)sizeof r)
            break; /* ddheap-prof is gone */
        if (r.type == 'D')
            _exit(0);
        apply(&t, &r);
    }
    for (size_t i = 0; i < t.n; i++) {
        uint16_t s;
        struct iovec local = {&s, sizeof s};
        struct iovec remote = {(void *)(uintptr_t)t.v[i].addr, sizeof s};
        if (process_vm_readv(t.v[i].pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof s && s > 0) {
            s--;
            (void)!process_vm_writev(t.v[i].pid, &local, 1, &remote, 1, 0);
        }
    }
    uint32_t key, next;
    const void *prev = NULL;
    while (bpf_map_get_next_key(1, prev, &next) == 0) {
        if (is_stopped(next))
            kill((pid_t)next, SIGCONT);
        key = next;
        prev = &key;
    }
    _exit(0);
}

void dd_prof_guardian_start(struct prof *p)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return;
    pid_t pid = fork();
    if (pid == 0) {
        if (fork() != 0) /* not our child: nothing for us to reap */
            _exit(0);
        guard(fds[0], bpf_map__fd(p->skel->maps.followed));
    }
    close(fds[0]);
    if (pid > 0) {
        waitpid(pid, NULL, 0);
        guardian_fd = fds[1];
    } else {
        close(fds[1]);
    }
}

void dd_prof_guardian_done(void)
{
    tell('D', 0, 0, 0);
    if (guardian_fd >= 0)
        close(guardian_fd);
    guardian_fd = -1;
}

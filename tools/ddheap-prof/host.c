/*
 * --all: a host agent. Every process on the host whose mapped objects carry
 * ddheap's alloc probe is profiled, each attached by its own pid (uprobes
 * for one pid: DESIGN.md §15; never for every process), and only those:
 * a process without probes is only ever looked at through /proc (its maps
 * read), nothing is placed in it.
 *
 * Found: the processes running at the start (every /proc/PID/maps); a
 * process that execs (the BPF side tells every exec on the host), looked
 * at a few times as its loader maps its libraries (at 0, 50, 150, 350, 750
 * and 1550 ms); and, for dlopen, every process not profiled, looked at
 * again every HOST_RESCAN_MS. Whether a file has probes is asked once per
 * file (device and inode) and kept. A profiled process that forks has its
 * child followed (the fork tracepoint) and attached by pid too; one that
 * exits has its uprobes released (its blocks leave the live heap with its
 * exit, as for every followed process: loop.c).
 * --only GLOB keeps the processes whose executable's path matches (the
 * services a user cares for; the tests' own programs).
 */
#include <bpf/libbpf.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "grow.h"
#include "prof.h"

#define HOST_RESCAN_MS 2000
#define EXEC_LOOKS 6
#define FIRST_LOOK_MS 50

/* Whether a file (device, inode) has the alloc probe. */
struct verdict {
    uint64_t dev, ino;
    unsigned probes;
};

/* A process that exec'd recently, looked at again until it has probes
 * or EXEC_LOOKS looks have found none. */
struct candidate {
    pid_t pid;
    unsigned looks;
    int64_t next_ns;
};

struct dd_prof_host {
    struct dd_prof_keys file_ids; /* a hash of (dev, ino) -> index into verdicts */
    struct verdict *verdicts;
    size_t verdicts_cap;
    struct candidate *candidates;
    size_t ncandidates, candidates_cap;
    int64_t next_rescan_ns;
    pid_t self;
};

static uint64_t file_key(uint64_t dev, uint64_t ino)
{
    uint64_t x = dev * 0x9e3779b97f4a7c15ull ^ ino;
    x ^= x >> 31;
    return x ? x : 1;
}

/* The probes of the file mapped at [start, end) by pid, asked once per
 * file; a hash collision (another file's entry) is asked every time. */
static unsigned probes_of(struct dd_prof_host *h, pid_t pid, uint64_t start, uint64_t end,
                          uint64_t dev, uint64_t ino)
{
    int added = 0;
    long i = dd_prof_keys_intern(&h->file_ids, file_key(dev, ino), &added);
    if (i >= 0 && !added && h->verdicts[i].dev == dev && h->verdicts[i].ino == ino)
        return h->verdicts[i].probes;
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)pid, start, end);
    unsigned probes = dd_prof_elf_probes(path, -1);
    if (i < 0 || !added)
        return probes;
    if (dd_prof_grow(&h->verdicts, &h->verdicts_cap, (size_t)i + 1, sizeof *h->verdicts) != 0)
        return probes; /* asked again next time */
    h->verdicts[i] = (struct verdict){dev, ino, probes};
    return probes;
}

/* Whether any executable file mapping of pid has the alloc probe. */
static bool has_probes(struct dd_prof_host *h, pid_t pid)
{
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return false;
    char line[PATH_MAX + 128];
    bool found = false;
    uint64_t last_dev = 0, last_ino = 0;
    while (!found && fgets(line, sizeof line, f)) {
        struct dd_prof_mapping m;
        if (!dd_prof_parse_maps_line(line, &m) || m.perms[2] != 'x' ||
            (m.dev == last_dev && m.ino == last_ino))
            continue;
        last_dev = m.dev;
        last_ino = m.ino;
        found = probes_of(h, pid, m.start, m.end, m.dev, m.ino) & DD_PROF_HAS_ALLOC;
    }
    fclose(f);
    return found;
}

/* The path of the process's executable into exe; false if unreadable
 * (gone, a kernel thread). */
static bool exe_of(pid_t pid, char *exe, size_t size)
{
    char link[64];
    snprintf(link, sizeof link, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(link, exe, size - 1);
    if (n <= 0)
        return false;
    exe[n] = '\0';
    return true;
}

/* --only GLOB: whether the process's executable (its full path) matches. */
static bool selected(const struct prof *p, pid_t pid)
{
    char exe[PATH_MAX];
    return p->opt.only == NULL ||
           (exe_of(pid, exe, sizeof exe) && fnmatch(p->opt.only, exe, 0) == 0);
}

static bool profiled(struct prof *p, pid_t pid)
{
    for (size_t i = 0; i < p->proc_ids.n; i++)
        if (p->procs[i].tgid == pid)
            return !p->procs[i].gone;
    return false;
}

/* Profiles pid: followed by the BPF side, then attached (by pid). */
static void adopt(struct prof *p, pid_t pid)
{
    struct dd_prof_proc *proc = dd_prof_proc_of(p, pid);
    if (proc == NULL) {
        p->oom = true;
        return;
    }
    proc->gone = proc->links_released = false; /* a pid used again */
    if (dd_prof_follow(p, pid, 0) != 0) {
        fprintf(stderr, "ddheap-prof: cannot follow pid %d\n", (int)pid);
        return;
    }
    if (dd_prof_rescan(p, proc) < 0)
        return; /* gone meanwhile */
    uint64_t rate;
    uint64_t interval = dd_prof_interval_of(pid, &rate);
    if (p->interval == 0)
        p->interval = interval;
    /* The highest limit, none above all. */
    if (p->samples_per_second != 0 && (rate == 0 || rate > p->samples_per_second))
        p->samples_per_second = rate;
    char exe[PATH_MAX];
    fprintf(stderr, "ddheap-prof: profiling pid %d (%s)\n", (int)pid,
            exe_of(pid, exe, sizeof exe) ? exe : "?");
}

/* Looks at pid once: adopts it if it has probes. Returns true if it is
 * profiled now. */
static bool look_at(struct prof *p, pid_t pid)
{
    if (pid == p->host->self)
        return true; /* never: but nothing more to look at either */
    if (profiled(p, pid))
        return true;
    if (!selected(p, pid) || !has_probes(p->host, pid))
        return false;
    adopt(p, pid);
    return true;
}

static void look_at_all(struct prof *p)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        long pid = strtol(e->d_name, NULL, 10);
        if (pid > 0 && pid <= INT_MAX)
            look_at(p, (pid_t)pid);
    }
    closedir(d);
}

int dd_prof_host_start(struct prof *p)
{
    p->host = calloc(1, sizeof *p->host);
    if (p->host == NULL) {
        fprintf(stderr, "ddheap-prof: out of memory\n");
        return -1;
    }
    p->host->self = getpid();
    look_at_all(p);
    p->host->next_rescan_ns = dd_prof_now_ns(CLOCK_MONOTONIC) + HOST_RESCAN_MS * 1000000LL;
    fprintf(stderr, "ddheap-prof: --all: %zu processes with %s probes; watching for more\n",
            p->proc_ids.n, p->opt.provider);
    return 0;
}

void dd_prof_host_on_exec(struct prof *p, pid_t tgid)
{
    struct dd_prof_host *h = p->host;
    if (h == NULL)
        return;
    if (dd_prof_grow(&h->candidates, &h->candidates_cap, h->ncandidates + 1,
                     sizeof *h->candidates) != 0)
        return; /* found by the next full look instead */
    /* The first look at once: the executable itself may carry probes. */
    h->candidates[h->ncandidates++] =
        (struct candidate){tgid, 0, dd_prof_now_ns(CLOCK_MONOTONIC)};
}

void dd_prof_host_on_fork(struct prof *p, struct dd_prof_proc *child)
{
    /* Its objects are copies of its parent's, attached for the parent's
     * pid only: attached again for its own. */
    for (size_t i = 0; i < child->objs.n; i++)
        child->objs.v[i].attached = child->objs.v[i].attach_tried = false;
    dd_prof_rescan(p, child);
}

/* Destroys the links (NULL-terminated, freed) without waiting for their
 * uprobes' removal, each of which waits for a grace period (measured:
 * 0.2 s for two; the event loop must not). A grandchild holds the
 * descriptors until ours are closed, then exits: its exit drops the last
 * references, so the waits are its own (as dd_prof_detach_all does for
 * the run's end). */
static void destroy_links(struct bpf_link **links)
{
    int held[2];
    pid_t pid = pipe2(held, O_CLOEXEC) == 0 ? fork() : -1;
    if (pid == 0) {
        if (fork() != 0)
            _exit(0);
        close(held[1]);
        char byte;
        while (read(held[0], &byte, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
    for (size_t i = 0; links[i]; i++)
        bpf_link__destroy(links[i]);
    free(links);
    if (pid >= 0) {
        close(held[0]);
        close(held[1]); /* the grandchild's read ends: it exits */
    }
}

/* Removes the entries of pid from a list of attached files. */
static void forget_files(struct file_id *v, size_t *n, pid_t pid)
{
    size_t kept = 0;
    for (size_t i = 0; i < *n; i++)
        if (v[i].pid != pid)
            v[kept++] = v[i];
    *n = kept;
}

/* A process that is gone: its links are released (a host agent runs for
 * days; each is two descriptors and a kernel uprobe consumer) and its
 * files forgotten, so that a new process given the same pid is attached
 * afresh. */
static void release_process(struct prof *p, pid_t pid)
{
    size_t n = 0, kept = 0;
    for (size_t i = 0; i < p->nlinks; i++)
        n += p->link_pids[i] == pid;
    struct bpf_link **gone = n ? calloc(n + 1, sizeof *gone) : NULL;
    if (n && gone == NULL)
        return; /* kept: tried again at the next process's end */
    n = 0;
    for (size_t i = 0; i < p->nlinks; i++) {
        if (p->link_pids[i] == pid) {
            gone[n++] = p->links[i];
        } else {
            p->links[kept] = p->links[i];
            p->link_pids[kept++] = p->link_pids[i];
        }
    }
    p->nlinks = kept;
    forget_files(p->attached, &p->nattached, pid);
    forget_files(p->loader_hooked, &p->nloader_hooked, pid);
    if (gone == NULL)
        return;
    int64_t t0 = dd_prof_now_ns(CLOCK_MONOTONIC);
    destroy_links(gone);
    if (p->opt.verbose)
        fprintf(stderr, "ddheap-prof: released %zu links of pid %d in %.1f ms\n", n, (int)pid,
                (double)(dd_prof_now_ns(CLOCK_MONOTONIC) - t0) / 1e6);
}

/* The processes that have exited: their uprobes released (their blocks
 * leave the live heap with their exit, loop.c). */
static void release_the_gone(struct prof *p)
{
    for (size_t i = 0; i < p->proc_ids.n; i++) {
        struct dd_prof_proc *proc = &p->procs[i];
        if (proc->gone && !proc->links_released) {
            proc->links_released = true;
            release_process(p, proc->tgid);
        }
    }
}

void dd_prof_host_poll(struct prof *p, int64_t now_ns)
{
    struct dd_prof_host *h = p->host;
    if (h == NULL)
        return;
    release_the_gone(p);
    size_t kept = 0;
    for (size_t i = 0; i < h->ncandidates; i++) {
        struct candidate c = h->candidates[i];
        if (c.next_ns <= now_ns) {
            if (look_at(p, c.pid) || dd_prof_process_gone(c.pid) || ++c.looks >= EXEC_LOOKS)
                continue;
            /* 50, 100, 200... ms apart: the loader maps the libraries
             * within milliseconds; a slow start is still caught. */
            c.next_ns = now_ns + (FIRST_LOOK_MS << (c.looks - 1)) * 1000000LL;
        }
        h->candidates[kept++] = c;
    }
    h->ncandidates = kept;
    if (now_ns >= h->next_rescan_ns) {
        look_at_all(p);
        h->next_rescan_ns = now_ns + HOST_RESCAN_MS * 1000000LL;
    }
}

int64_t dd_prof_host_wait_ns(const struct prof *p, int64_t now_ns, int64_t wait_ns)
{
    const struct dd_prof_host *h = p->host;
    for (size_t i = 0; h && i < h->ncandidates; i++)
        if (h->candidates[i].next_ns - now_ns < wait_ns)
            wait_ns = h->candidates[i].next_ns > now_ns ? h->candidates[i].next_ns - now_ns : 0;
    return wait_ns;
}

void dd_prof_host_free(struct prof *p)
{
    struct dd_prof_host *h = p->host;
    if (h == NULL)
        return;
    dd_prof_keys_free(&h->file_ids);
    free(h->verdicts);
    free(h->candidates);
    free(h);
    p->host = NULL;
}

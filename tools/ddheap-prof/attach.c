/*
 * Finding the objects of the processes that carry ddheap's probes and
 * attaching the BPF programs to them: at the start, at each exec, when a
 * process's dynamic loader says it has mapped objects (its start, dlopen),
 * and at each rescan of /proc/PID/maps. Files are reached through
 * /proc/PID/map_files, so what is attached is what the process maps,
 * whatever its mount namespace and whether or not the file has been
 * deleted or replaced on disk since.
 */
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/types.h>

#include "ddheap_prof.h"
/* bpftool embeds the BPF object as one string literal, longer than the
 * 4095 characters -Wpedantic holds C99 compilers to; gcc and clang take it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
#include "ddheap_prof.skel.h"
#pragma GCC diagnostic pop
#include "grow.h"
#include "probe_sites.h"
#include "prof.h"

static bool already_attached(const struct prof *p, pid_t pid, uint64_t dev, uint64_t ino)
{
    for (size_t i = 0; i < p->nattached; i++)
        if (p->attached[i].dev == dev && p->attached[i].ino == ino && p->attached[i].pid == pid)
            return true;
    return false;
}

/* Keeps the link, made for pid (link_pids: --all releases a process's
 * links when it is gone, host.c). */
static int keep_link(struct prof *p, struct bpf_link *l, pid_t pid)
{
    if (dd_prof_grow(&p->links, &p->links_cap, p->nlinks + 1, sizeof *p->links) != 0 ||
        dd_prof_grow(&p->link_pids, &p->link_pids_cap, p->nlinks + 1, sizeof *p->link_pids) != 0)
        return -1;
    p->link_pids[p->nlinks] = pid;
    p->links[p->nlinks++] = l;
    return 0;
}

static int remember_file(struct file_id **v, size_t *n, size_t *cap, pid_t pid, uint64_t dev,
                         uint64_t ino)
{
    if (dd_prof_grow(v, cap, *n + 1, sizeof **v) != 0)
        return -1;
    (*v)[(*n)++] = (struct file_id){dev, ino, pid};
    return 0;
}

/* Every uprobe is placed without the kernel's semaphore, which the
 * kernel would raise in every process where the uprobe is installed:
 * ddheap-prof raises the semaphores of the processes it profiles itself
 * (raise_semaphores), lowers them at the end, and a guardian lowers them
 * if it dies (guardian.c). (The kernel refuses two uprobes at one place,
 * one with the semaphore and one without: all of ddheap-prof's are
 * without.) Following, the probe sites' uprobes are on the file, for
 * every process, so that a forked child, which inherits its raised
 * semaphores with its memory, is seen from its first instruction at no
 * cost to its fork; the BPF side keeps the followed processes. A
 * bystander mapping the file keeps its semaphores at 0, so it never
 * reaches a site. Otherwise (a target alone, or --all) every uprobe is
 * for the process pid alone (DESIGN.md §15). The attached files are kept
 * per pid with --all. */
bool dd_prof_sites_shared(const struct prof *p)
{
    return p->opt.follow && !p->opt.all;
}

static pid_t uprobe_pid(const struct prof *p, pid_t pid)
{
    return p->opt.all ? pid : p->opt.follow ? -1 : p->pid;
}

static pid_t attached_key(const struct prof *p, pid_t pid)
{
    return p->opt.all ? pid : 0;
}

/* The loader's hook is executed by every dlopen of every process mapping
 * the loader (a debugger such as valgrind stops at a foreign breakpoint
 * there): it is for the process alone, always. A forked child inherits
 * the breakpoint, which the kernel removes from it at its first hit. */
static pid_t loader_key(const struct prof *p, pid_t pid)
{
    return p->opt.all || p->opt.follow ? pid : 0;
}

/* Remembers the semaphores (link-time addresses) of an attached file. */
static int remember_semaphores(struct prof *p, uint64_t dev, uint64_t ino,
                               const struct dd_prof_probe_site *s, size_t n)
{
    if (dd_prof_grow(&p->sem_files, &p->sem_files_cap, p->nsem_files + 1,
                     sizeof *p->sem_files) != 0)
        return -1;
    struct dd_prof_sem_file *f = &p->sem_files[p->nsem_files++];
    *f = (struct dd_prof_sem_file){.dev = dev, .ino = ino};
    for (size_t i = 0; i < n; i++)
        if (s[i].semaphore_addr && f->n < sizeof f->addr / sizeof f->addr[0])
            f->addr[f->n++] = s[i].semaphore_addr;
    return 0;
}

/* Places the uprobes of one probe (name, with nargs arguments) of the
 * file open as fd. Returns the number placed, or -1 (message printed). */
static int attach_probe(struct prof *p, pid_t pid, int fd, const char *kernel_path,
                        const char *name, const char *probe, unsigned nargs,
                        struct dd_prof_probe_site *sites, size_t max)
{
    char why[256];
    int n = dd_prof_probe_sites(fd, p->opt.provider, probe, nargs, sites, max, why, sizeof why);
    if (n < 0) {
        fprintf(stderr, "ddheap-prof: cannot attach to %s: %s\n", name, why);
        return -1;
    }
    struct bpf_program *prog = nargs == 1 ? p->skel->progs.on_free : p->skel->progs.on_alloc;
    for (int i = 0; i < n; i++) {
        /* Never the kernel's semaphore: raise_semaphores. */
        struct bpf_uprobe_opts opts = {.sz = sizeof opts};
        struct bpf_link *l = bpf_program__attach_uprobe_opts(prog, uprobe_pid(p, pid), kernel_path,
                                                             (size_t)sites[i].offset, &opts);
        if (l == NULL) {
            int e = errno;
            fprintf(stderr, "ddheap-prof: cannot attach to %s:%s in %s: %s\n", p->opt.provider,
                    probe, name, strerror(e));
            if (e == EINVAL)
                fprintf(stderr, "ddheap-prof: (the kernel refuses a uprobe without the "
                                "semaphore where another tracer, such as bpftrace, has one "
                                "with it: stop that tracer, or profile with it alone)\n");
            return -1;
        }
        if (keep_link(p, l, pid) != 0) {
            bpf_link__destroy(l);
            return -1;
        }
    }
    return n;
}

/* Attaches free, then alloc (a block must never be seen allocated by a
 * tracer that cannot yet see its free), to the file: uprobes on the
 * file's inode, so they also cover mappings made later. kernel_path is a
 * path the kernel resolves to the very file the process maps (through
 * /proc/PID/map_files or /proc/PID/root: a process in another mount
 * namespace, a file deleted or replaced since); name is the process's.
 * Returns 1 if attached now, 0 if it was already, or -1 (message
 * printed). */
static int attach_file(struct prof *p, pid_t pid, const char *kernel_path, const char *name,
                       uint64_t dev, uint64_t ino, unsigned probes_present)
{
    if (already_attached(p, attached_key(p, pid), dev, ino))
        return 0;
    int fd = open(kernel_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "ddheap-prof: cannot open %s: %s\n", name, strerror(errno));
        return -1;
    }
    struct dd_prof_probe_site sites[2 * DD_PROF_MAX_SITES];
    int nfree = 0, nalloc = -1;
    if (probes_present & DD_PROF_HAS_FREE)
        nfree = attach_probe(p, pid, fd, kernel_path, name, "free", 1, sites, DD_PROF_MAX_SITES);
    if (nfree >= 0)
        nalloc = attach_probe(p, pid, fd, kernel_path, name, "alloc", 3, sites + nfree,
                              DD_PROF_MAX_SITES);
    close(fd);
    if (nalloc < 0)
        return -1;
    if (remember_semaphores(p, dev, ino, sites, (size_t)(nfree + nalloc)) != 0 ||
        remember_file(&p->attached, &p->nattached, &p->attached_cap, attached_key(p, pid), dev,
                      ino) != 0)
        return -1;
    return 1;
}

/* Said once a file is attached and, for a process mapping it, its
 * semaphores raised (what a reader of stderr waits for). */
static void say_attached(const struct prof *p, const char *name, unsigned probes_present)
{
    fprintf(stderr, "ddheap-prof: attached to %s (%s:alloc%s)\n", name, p->opt.provider,
            probes_present & DD_PROF_HAS_FREE ? ", free" : "; no free probe: allocation profile only");
}

/* Adds delta to one semaphore at addr in the process; false if it
 * cannot be read or written (not mapped yet, the process gone), or would
 * drop below 0. The guardian hears of a raise before it is made, of a
 * lowering after. */
static bool add_to_semaphore(pid_t pid, uint64_t addr, int delta)
{
    uint16_t v;
    struct iovec local = {&v, sizeof v};
    struct iovec remote = {(void *)(uintptr_t)addr, sizeof v};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof v ||
        (delta < 0 && v == 0))
        return false;
    v = (uint16_t)(v + delta);
    if (delta > 0)
        dd_prof_guardian_raised(pid, addr, delta);
    bool wrote = process_vm_writev(pid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof v;
    if (wrote != (delta > 0))
        dd_prof_guardian_raised(pid, addr, -1);
    return wrote;
}

/* Adds delta to the semaphores of the attached file in the process (at
 * their run-time addresses, by the load bias), all or none. Nothing else
 * writes them (a tracer that places its uprobes with the kernel's
 * semaphore adds and subtracts its own count on the same counter: our
 * write races with that tracer's attach only). */
static bool add_to_semaphores(const struct prof *p, pid_t pid, const struct dd_prof_object *o,
                              int delta)
{
    for (size_t i = 0; i < p->nsem_files; i++) {
        const struct dd_prof_sem_file *f = &p->sem_files[i];
        if (f->dev != o->dev || f->ino != o->ino)
            continue;
        for (size_t k = 0; k < f->n; k++)
            if (!add_to_semaphore(pid, f->addr[k] + o->bias, delta) && delta > 0) {
                while (k-- > 0)
                    add_to_semaphore(pid, f->addr[k] + o->bias, -delta);
                return false;
            }
        return true;
    }
    return false;
}

/* Raises, once, the semaphores of the process's attached objects. */
static void raise_semaphores(struct prof *p, struct dd_prof_proc *proc)
{
    for (size_t i = 0; i < proc->objs.n; i++) {
        struct dd_prof_object *o = &proc->objs.v[i];
        if (o->attached && !o->semaphores_raised)
            o->semaphores_raised = add_to_semaphores(p, proc->tgid, o, 1);
        /* Said once it samples (its data segment may not be mapped yet:
         * then at a later rescan). */
        if (o->announce && o->semaphores_raised) {
            o->announce = false;
            say_attached(p, o->path, o->probes);
        }
    }
}

void dd_prof_lower_semaphores(struct prof *p)
{
    for (size_t i = 0; i < p->proc_ids.n; i++) {
        struct dd_prof_proc *proc = &p->procs[i];
        for (size_t k = 0; !proc->gone && k < proc->objs.n; k++) {
            struct dd_prof_object *o = &proc->objs.v[k];
            if (o->semaphores_raised) {
                add_to_semaphores(p, proc->tgid, o, -1);
                o->semaphores_raised = false;
            }
        }
    }
}

/* /proc/PID/map_files/START-END of the object's first mapping. */
static void map_files_path(char *buf, size_t size, pid_t pid, const struct dd_prof_object *o)
{
    snprintf(buf, size, "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)pid, o->map_start,
             o->map_end);
}

/* Rescans one process's maps (prof.h). */
int dd_prof_rescan(struct prof *p, struct dd_prof_proc *proc)
{
    if (proc->gone)
        return (int)p->nattached;
    if (dd_prof_objects_scan(&proc->objs, proc->tgid) < 0) {
        if (errno == ESRCH || errno == ENOENT)
            proc->gone = true;
        return -1;
    }
    for (size_t i = 0; i < proc->objs.n; i++) {
        struct dd_prof_object *o = &proc->objs.v[i];
        if ((o->probes & DD_PROF_HAS_ALLOC) && !o->attach_tried) {
            /* Tried once: a failure is reported, the other objects are
             * still profiled. */
            char path[96];
            map_files_path(path, sizeof path, proc->tgid, o);
            int r = attach_file(p, proc->tgid, path, o->path, o->dev, o->ino, o->probes);
            o->attached = r >= 0;
            o->attach_tried = true;
            o->announce = r > 0;
        }
    }
    raise_semaphores(p, proc);
    dd_prof_read_library_status(p, proc);
    dd_prof_recognize_interpreter(p, proc);
    return (int)p->nattached;
}

void dd_prof_recognize_interpreter(struct prof *p, struct dd_prof_proc *proc)
{
    for (; p->opt.python && proc->interp == NULL && proc->interp_seen < proc->objs.n;
         proc->interp_seen++) {
        proc->interp = dd_prof_interp_recognize(&proc->objs.v[proc->interp_seen], proc->tgid,
                                                &proc->interp_cfg);
        uint32_t key = (uint32_t)proc->tgid;
        if (proc->interp &&
            bpf_map__update_elem(p->skel->maps.interp_procs, &key, sizeof key, &proc->interp_cfg,
                                 sizeof proc->interp_cfg, BPF_ANY) != 0) {
            dd_prof_interp_free(proc->interp);
            proc->interp = NULL;
        }
    }
    proc->interp_seen = proc->objs.n;
}

void dd_prof_inherit_interpreter(struct prof *p, struct dd_prof_proc *proc,
                                 const struct dd_prof_proc *parent)
{
    proc->interp_seen = proc->objs.n;
    if (parent->interp == NULL || (proc->interp = dd_prof_interp_fork(parent->interp)) == NULL)
        return;
    uint32_t key = (uint32_t)proc->tgid;
    proc->interp_cfg = parent->interp_cfg;
    if (bpf_map__update_elem(p->skel->maps.interp_procs, &key, sizeof key, &proc->interp_cfg,
                             sizeof proc->interp_cfg, BPF_ANY) != 0)
        dd_prof_forget_interpreter(p, proc);
}

void dd_prof_stop_interpreter_walk(struct prof *p, struct dd_prof_proc *proc)
{
    uint32_t key = (uint32_t)proc->tgid;
    if (proc->interp)
        bpf_map__delete_elem(p->skel->maps.interp_procs, &key, sizeof key, 0);
}

void dd_prof_forget_interpreter(struct prof *p, struct dd_prof_proc *proc)
{
    if (proc->interp == NULL)
        return;
    dd_prof_stop_interpreter_walk(p, proc);
    dd_prof_interp_free(proc->interp);
    proc->interp = NULL;
}

void dd_prof_rescan_all(struct prof *p)
{
    for (size_t i = 0; i < p->proc_ids.n; i++)
        if (!p->procs[i].gone)
            dd_prof_rescan(p, &p->procs[i]);
}

/* Hooks the loader's _dl_debug_state (on_loader) in the object, if it is
 * glibc's dynamic loader. Returns true if it is hooked. */
static bool hook_loader(struct prof *p, pid_t pid, const struct dd_prof_object *o)
{
    for (size_t i = 0; i < p->nloader_hooked; i++)
        if (p->loader_hooked[i].dev == o->dev && p->loader_hooked[i].ino == o->ino &&
            p->loader_hooked[i].pid == loader_key(p, pid))
            return true;
    uint64_t offset;
    int64_t to_state;
    int fd = dd_prof_file_fd(o->file);
    if (fd < 0 || !dd_prof_elf_loader_hook(fd, &offset, &to_state))
        return false;
    char path[96];
    map_files_path(path, sizeof path, pid, o);
    /* (Not LIBBPF_OPTS: a statement expression, which -Wpedantic refuses.) */
    struct bpf_uprobe_opts opts = {.sz = sizeof opts, .bpf_cookie = (uint64_t)to_state};
    struct bpf_link *l =
        bpf_program__attach_uprobe_opts(p->skel->progs.on_loader, pid, path,
                                        (size_t)offset, &opts);
    if (l == NULL)
        return false;
    if (keep_link(p, l, pid) != 0 ||
        remember_file(&p->loader_hooked, &p->nloader_hooked, &p->loader_hooked_cap,
                      loader_key(p, pid), o->dev, o->ino) != 0)
        return false;
    return true;
}

/* Attaches to the libraries the dynamic loader will map for the process
 * stopped at its exec, when the loader cannot be hooked (not glibc's):
 * the loader's own `--list`, run on the same executable with the same
 * environment (LD_PRELOAD and LD_LIBRARY_PATH included), names them. They
 * are not mapped yet; the uprobes are placed on their files and become
 * live as the loader maps them. (The paths are those of our mount
 * namespace.) */
struct listed {
    struct prof *p;
    pid_t pid;
};

static void attach_listed(const char *path, void *ctx)
{
    const struct listed *l = ctx;
    struct stat st;
    unsigned probes = stat(path, &st) == 0 ? dd_prof_elf_probes(path, -1) : 0;
    if (probes & DD_PROF_HAS_ALLOC)
        if (attach_file(l->p, l->pid, path, path, st.st_dev, st.st_ino, probes) > 0)
            say_attached(l->p, path, probes);
}

static void attach_needed_libraries(struct prof *p, pid_t pid)
{
    char exe[PATH_MAX], link[64];
    snprintf(link, sizeof link, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(link, exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *interp = dd_prof_interpreter_of(exe);
    char *envbuf = NULL;
    char **env = interp ? dd_prof_environment_of(pid, &envbuf) : NULL;
    if (env != NULL)
        dd_prof_list_libraries(interp, exe, env, attach_listed, &(struct listed){p, pid});
    free(interp);
    free(env);
    free(envbuf);
}

bool dd_prof_prepare_exec(struct prof *p, struct dd_prof_proc *proc)
{
    char exe[64];
    snprintf(exe, sizeof exe, "/proc/%d/exe", (int)proc->tgid);
    char *interp = dd_prof_interpreter_of(exe);
    if (interp == NULL)
        return false; /* static: all it maps is mapped */
    free(interp);
    /* Mapped by now: the executable and its loader. */
    for (size_t i = 0; i < proc->objs.n; i++)
        if (hook_loader(p, proc->tgid, &proc->objs.v[i]))
            return true;
    attach_needed_libraries(p, proc->tgid);
    return false;
}

/* Removing a uprobe waits for a grace period, about 0.1 s each, and the
 * kernel removes them one at a time: waiting for that would be most of
 * ddheap-prof's finishing time. A grandchild holding the same descriptors
 * waits for our exit (the end of a pipe) and then exits itself: the last
 * reference it drops removes them, after we have gone. Its standard
 * streams are /dev/null, so whoever reads ours sees them end at our exit.
 * Nothing is stopped at ours by then (dd_prof_let_go). */
void dd_prof_detach_all(struct prof *p)
{
    dd_prof_end_stops(p);
    dd_prof_lower_semaphores(p);
    dd_prof_guardian_done();
    int ended[2];
    pid_t pid = pipe2(ended, O_CLOEXEC) == 0 ? fork() : -1;
    if (pid == 0) {
        if (fork() != 0)
            _exit(0);
        close(ended[1]);
        int null = open("/dev/null", O_RDWR);
        for (int fd = 0; fd < 3 && null >= 0; fd++)
            dup2(null, fd);
        char byte;
        while (read(ended[0], &byte, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    if (pid > 0) {
        waitpid(pid, NULL, 0);
        close(ended[0]); /* ended[1] closes at our exit */
    }
    for (size_t i = 0; i < p->nlinks; i++)
        bpf_link__destroy(p->links[i]);
    p->nlinks = 0;
}

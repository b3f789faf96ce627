/*
 * Injection by ptrace, without a debugger (docs/attach.md): every thread
 * of the target is seized (PTRACE_SEIZE stops nothing), one at a time is
 * interrupted until one is found at a safe point, and that one thread
 * calls the target's own dlopen and then the library's start function
 * while the others run on. Then every register it had is put back and
 * every thread let go.
 *
 * Refused before anything is done to the process (the reason is the
 * message): x86-64 only; a static executable (no loader to ask), musl, a
 * process traced already, kernel.yama.ptrace_scope=3, a seccomp filter, a
 * libc without dlopen, a library path the target cannot see.
 *
 * A safe point: the thread's pc and its return addresses (unwound by the
 * CFI of its objects with libdwfl, through ptrace; where that fails, every
 * word of the top of its stack that points into code stands in for them)
 * lie outside the dynamic loader and the allocator (the
 * malloc-family functions of libc and of the executable, and all the code
 * of a library that exports malloc: jemalloc, tcmalloc), and the loader's
 * r_debug.r_state is RT_CONSISTENT. So the thread holds neither the
 * loader's lock nor an allocator's when it calls dlopen, which takes the
 * one and allocates; a false alarm (a stale word on the stack) only makes
 * us try again.
 *
 * The call: the thread's registers and extended (FPU, SSE, AVX) state are
 * saved; the stack pointer skips the 128-byte red zone, the strings go
 * below it, the stack is aligned to 16 and a return address of 0 is
 * pushed: the call's return faults at pc 0, a SIGSEGV that we see (and
 * suppress) as a signal-delivery-stop. orig_rax is set to -1: a thread
 * stopped inside a system call would otherwise have the kernel restart
 * that call by moving the pc back, into our function. Restoring the saved
 * registers at the end restores orig_rax too, so an interrupted read or
 * nanosleep is restarted exactly as after any signal. Signals that come
 * meanwhile, to any seized thread, are passed on; a group stop is left as
 * it is (PTRACE_LISTEN).
 *
 * The tracer is a child of ddheap-prof that exits once done: its exit
 * detaches every thread it seized without stopping it, so only the
 * threads tried for a safe point are ever interrupted. It sends the
 * result and its copy of the agent's descriptor back over a socket pair.
 */
#include <dirent.h>
#include <elf.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "grow.h"
#include "inject.h"

#if defined(__x86_64__)

/* How long to look for a safe point, and to wait for one remote call. */
#define SAFE_POINT_TIMEOUT_NS (3 * 1000000000LL)
#define CALL_TIMEOUT_NS (10 * 1000000000LL)
#define STACK_SCAN_BYTES 8192
#define RED_ZONE 128
#define RT_CONSISTENT 0
#define RTLD_NOW_ 0x2
#define RTLD_DLOPEN_FLAG 0x80000000 /* __libc_dlopen_mode's __RTLD_DLOPEN */
#define MFD_CLOEXEC_ 0x1
/* The name of the anonymous file, and how the target's maps show it. */
#define MEMFD_NAME "ddheap-agent"
#define MEMFD_MAPPED "/memfd:" MEMFD_NAME " (deleted)"

/* The start of glibc's struct r_debug (link.h), as the target has it. */
struct r_debug_head {
    int r_version;
    uint64_t r_map, r_brk;
    int r_state;
};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int refuse(char *why, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    return -1;
}

/* --- what the process maps --- */

struct mapping {
    uint64_t start, end, offset;
    bool exec;
    char *path; /* NULL for an anonymous mapping */
};

struct range {
    uint64_t lo, hi;
};

struct target {
    pid_t pid;
    struct mapping *maps;
    size_t nmaps;
    struct range *unsafe; /* the loader's and the allocator's code */
    size_t nunsafe, unsafe_cap;
    uint64_t r_state;     /* address of _r_debug.r_state; 0 if unknown */
    uint64_t fn_dlopen, fn_libc_dlopen_mode, fn_close, fn_start;
    uint64_t fn_memfd_create, fn_write;
    const char *lib_real; /* the library's path, resolved */
    /* The target's mount namespace has no such file at that path (a
     * container): the library reaches it as an anonymous file that the
     * target makes itself (load_through_memfd), and is mapped under
     * MEMFD_MAPPED rather than lib_real. */
    bool via_memfd;
    const char *lib_mapped; /* its path in the target's maps */
    bool lib_loaded;        /* mapped already */
    int mem;              /* /proc/PID/mem */
    Dwfl *dwfl;           /* unwinds a stopped thread by CFI; NULL if not */
};

static void free_maps(struct target *t)
{
    for (size_t i = 0; i < t->nmaps; i++)
        free(t->maps[i].path);
    free(t->maps);
    t->maps = NULL;
    t->nmaps = 0;
}

static int read_maps(struct target *t)
{
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)t->pid);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return -1;
    free_maps(t);
    size_t maps_cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    while (getline(&line, &line_cap, f) > 0) {
        uint64_t start, end, offset;
        char perms[8];
        int path_at = 0;
        if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %*s %*s %n", &start, &end, perms,
                   &offset, &path_at) < 4)
            continue;
        if (dd_prof_grow(&t->maps, &maps_cap, t->nmaps + 1, sizeof *t->maps) != 0)
            break;
        char *path = line + path_at;
        path[strcspn(path, "\n")] = '\0';
        t->maps[t->nmaps++] = (struct mapping){start, end, offset, perms[2] == 'x',
                                               path[0] == '/' ? strdup(path) : NULL};
    }
    free(line);
    fclose(f);
    return 0;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The first mapping of the object whose path satisfies `match`. */
static const struct mapping *find_object(const struct target *t,
                                         bool (*match)(const char *path, const void *arg),
                                         const void *arg)
{
    for (size_t i = 0; i < t->nmaps; i++)
        if (t->maps[i].path != NULL && match(t->maps[i].path, arg))
            return &t->maps[i];
    return NULL;
}

static bool is_loader(const char *path, const void *arg)
{
    (void)arg;
    const char *b = base_name(path);
    return strncmp(b, "ld-linux", 8) == 0 || strncmp(b, "ld-2.", 5) == 0;
}

static bool is_musl(const char *path, const void *arg)
{
    (void)arg;
    const char *b = base_name(path);
    return strncmp(b, "ld-musl", 7) == 0 || strncmp(b, "libc.musl", 9) == 0;
}

static bool is_libc(const char *path, const void *arg)
{
    (void)arg;
    const char *b = base_name(path);
    return strncmp(b, "libc.so", 7) == 0 || strncmp(b, "libc-2.", 7) == 0;
}

static bool is_path(const char *path, const void *arg)
{
    return strcmp(path, (const char *)arg) == 0;
}

static int add_unsafe(struct target *t, uint64_t lo, uint64_t hi)
{
    if (dd_prof_grow(&t->unsafe, &t->unsafe_cap, t->nunsafe + 1, sizeof *t->unsafe) != 0)
        return -1;
    t->unsafe[t->nunsafe++] = (struct range){lo, hi};
    return 0;
}

static void add_code_of(struct target *t, const char *path)
{
    for (size_t i = 0; i < t->nmaps; i++)
        if (t->maps[i].exec && t->maps[i].path != NULL && strcmp(t->maps[i].path, path) == 0)
            add_unsafe(t, t->maps[i].start, t->maps[i].end);
}

/* --- symbols of a mapped object, read from the file it maps --- */

struct wanted {
    const char *name;
    uint64_t value, size; /* value 0: not defined there */
};

/* The object's load bias: where its lowest PT_LOAD landed minus its
 * link-time address. */
static bool object_bias(const struct target *t, const struct mapping *first, Elf *elf,
                        uint64_t *bias)
{
    size_t n;
    if (elf_getphdrnum(elf, &n) != 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD) {
            /* the mapping of file offset 0 holds the first PT_LOAD */
            for (size_t m = 0; m < t->nmaps; m++)
                if (t->maps[m].path != NULL && strcmp(t->maps[m].path, first->path) == 0 &&
                    t->maps[m].offset == (ph.p_offset & ~(uint64_t)4095)) {
                    *bias = t->maps[m].start - (ph.p_vaddr & ~(uint64_t)4095);
                    return true;
                }
            return false;
        }
    }
    return false;
}

/* Fills each wanted symbol's run-time address and size from the dynamic
 * symbol table of the object `first` maps. Returns false if the file
 * cannot be read. */
static bool lookup_symbols(const struct target *t, const struct mapping *first, struct wanted *w,
                           size_t nw)
{
    char path[96];
    snprintf(path, sizeof path, "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)t->pid,
             first->start, first->end);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || elf_version(EV_CURRENT) == EV_NONE) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    Elf *elf = elf_begin(fd, ELF_C_READ, NULL);
    uint64_t bias = 0;
    bool ok = elf != NULL && object_bias(t, first, elf, &bias);
    for (size_t i = 0; i < nw; i++)
        w[i].value = w[i].size = 0;
    Elf_Scn *scn = NULL;
    while (ok && (scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) == NULL || sh.sh_type != SHT_DYNSYM || sh.sh_entsize == 0)
            continue;
        Elf_Data *data = elf_getdata(scn, NULL);
        size_t count = sh.sh_size / sh.sh_entsize;
        for (size_t k = 0; data != NULL && k < count; k++) {
            GElf_Sym sym;
            if (gelf_getsym(data, (int)k, &sym) == NULL || sym.st_shndx == SHN_UNDEF)
                continue;
            int type = GELF_ST_TYPE(sym.st_info);
            if (type != STT_FUNC && type != STT_GNU_IFUNC && type != STT_OBJECT)
                continue;
            const char *name = elf_strptr(elf, sh.sh_link, sym.st_name);
            for (size_t i = 0; name != NULL && i < nw; i++)
                if (w[i].value == 0 && strcmp(name, w[i].name) == 0) {
                    w[i].value = bias + sym.st_value;
                    w[i].size = sym.st_size;
                }
        }
    }
    if (elf)
        elf_end(elf);
    close(fd);
    return ok;
}

/* The allocator's entry points: a thread inside one may hold its lock. */
static const char *const family[] = {
    "malloc", "free", "calloc", "realloc", "reallocarray", "memalign", "posix_memalign",
    "aligned_alloc", "valloc", "pvalloc", "malloc_trim", "malloc_usable_size", "mallinfo",
    "mallinfo2", "malloc_stats", "malloc_info", "mallopt", "free_sized", "free_aligned_sized",
    "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign",
    "__libc_valloc", "__libc_pvalloc", "fork", "_Fork"};
#define N_FAMILY (sizeof family / sizeof family[0])

static void add_family_of(struct target *t, const struct mapping *first)
{
    struct wanted w[N_FAMILY];
    for (size_t i = 0; i < N_FAMILY; i++)
        w[i] = (struct wanted){family[i], 0, 0};
    if (!lookup_symbols(t, first, w, N_FAMILY))
        return;
    for (size_t i = 0; i < N_FAMILY; i++)
        if (w[i].value != 0)
            add_unsafe(t, w[i].value, w[i].value + (w[i].size ? w[i].size : 1));
}

/* The allocator: libc's malloc family, the executable's if it defines
 * one, and the whole code of any other object that exports malloc. */
static void find_allocators(struct target *t, const struct mapping *libc, const char *exe)
{
    add_family_of(t, libc);
    for (size_t i = 0; i < t->nmaps; i++) {
        const struct mapping *m = &t->maps[i];
        if (m->path == NULL || m->offset != 0 || is_libc(m->path, NULL) || is_loader(m->path, NULL))
            continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = t->maps[j].path != NULL && strcmp(t->maps[j].path, m->path) == 0;
        if (seen)
            continue;
        if (strcmp(m->path, exe) == 0) {
            add_family_of(t, m);
            continue;
        }
        struct wanted w = {"malloc", 0, 0};
        if (lookup_symbols(t, m, &w, 1) && w.value != 0)
            add_code_of(t, m->path);
    }
}

/* --- refusals, before anything is done to the process --- */

static long status_field(pid_t pid, const char *field)
{
    char name[64], line[256];
    snprintf(name, sizeof name, "/proc/%d/status", (int)pid);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return -1;
    long value = -1;
    size_t len = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            value = strtol(line + len + 1, NULL, 10);
            break;
        }
    fclose(f);
    return value;
}

static int preflight(struct target *t, const char *lib, char *why, size_t size)
{
    pid_t pid = t->pid;
    FILE *scope = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    int level = 0;
    if (scope != NULL) {
        if (fscanf(scope, "%d", &level) != 1)
            level = 0;
        fclose(scope);
    }
    if (level >= 3)
        return refuse(why, size, "kernel.yama.ptrace_scope is 3: no process may be traced");
    long tracer = status_field(pid, "TracerPid");
    if (tracer < 0)
        return refuse(why, size, "cannot read /proc/%d/status", (int)pid);
    if (tracer > 0)
        return refuse(why, size, "it is traced already (by pid %ld: a debugger?)", tracer);
    if (status_field(pid, "Seccomp") == 2)
        return refuse(why, size, "it runs under a seccomp filter (Seccomp: 2 in /proc/%d/status), "
                                 "which may forbid or kill on what loading a library needs",
                      (int)pid);
    if (read_maps(t) != 0)
        return refuse(why, size, "cannot read /proc/%d/maps", (int)pid);
    if (find_object(t, is_musl, NULL) != NULL)
        return refuse(why, size, "it runs on musl, whose dynamic loader cannot be driven so");
    const struct mapping *loader = find_object(t, is_loader, NULL);
    if (loader == NULL)
        return refuse(why, size, "it is statically linked (no dynamic loader to load a library)");
    const struct mapping *libc = find_object(t, is_libc, NULL);
    if (libc == NULL)
        return refuse(why, size, "it does not map glibc's libc.so.6");
    struct wanted lw[] = {{"dlopen", 0, 0}, {"__libc_dlopen_mode", 0, 0}, {"close", 0, 0},
                          {"memfd_create", 0, 0}, {"write", 0, 0}};
    if (!lookup_symbols(t, libc, lw, 5))
        return refuse(why, size, "cannot read the symbols of %s", libc->path);
    t->fn_dlopen = lw[0].value;
    t->fn_libc_dlopen_mode = lw[1].value;
    t->fn_close = lw[2].value;
    t->fn_memfd_create = lw[3].value;
    t->fn_write = lw[4].value;
    if (t->fn_dlopen == 0 && t->fn_libc_dlopen_mode == 0)
        return refuse(why, size, "its libc has neither dlopen nor __libc_dlopen_mode");
    if (t->fn_close == 0)
        return refuse(why, size, "its libc has no close");
    struct wanted rw = {"_r_debug", 0, 0};
    if (lookup_symbols(t, loader, &rw, 1) && rw.value != 0)
        t->r_state = rw.value + offsetof(struct r_debug_head, r_state);
    add_code_of(t, loader->path);
    char exe_link[64], exe[PATH_MAX];
    snprintf(exe_link, sizeof exe_link, "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(exe_link, exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    find_allocators(t, libc, exe);
    /* The library must be the same file at the same path in the target's
     * mount namespace. */
    struct stat ours, theirs;
    char in_root[PATH_MAX + 64];
    snprintf(in_root, sizeof in_root, "/proc/%d/root%s", (int)pid, t->lib_real);
    if (stat(t->lib_real, &ours) != 0)
        return refuse(why, size, "%s: %s", lib, strerror(errno));
    t->lib_mapped = t->lib_real;
    if (stat(in_root, &theirs) != 0 || ours.st_dev != theirs.st_dev || ours.st_ino != theirs.st_ino) {
        if (t->fn_memfd_create == 0 || t->fn_write == 0)
            return refuse(why, size, "%s is not the same file in its mount namespace, and its libc "
                                     "has no memfd_create to receive it otherwise", t->lib_real);
        t->via_memfd = true;
        t->lib_mapped = MEMFD_MAPPED;
    }
    t->lib_loaded = find_object(t, is_path, t->lib_mapped) != NULL;
    return 0;
}

/* --- threads --- */

struct threads {
    pid_t pid; /* their process */
    pid_t *tid; /* 0: gone */
    int64_t *stopped_at; /* when each was interrupted; 0: running */
    size_t n;            /* entries of both */
    size_t tid_cap, stopped_cap;
};

static bool has_thread(const struct threads *th, pid_t tid)
{
    for (size_t i = 0; i < th->n; i++)
        if (th->tid[i] == tid)
            return true;
    return false;
}

static int add_thread(struct threads *th, pid_t tid)
{
    if (dd_prof_grow(&th->tid, &th->tid_cap, th->n + 1, sizeof *th->tid) != 0 ||
        dd_prof_grow(&th->stopped_at, &th->stopped_cap, th->n + 1, sizeof *th->stopped_at) != 0)
        return ENOMEM;
    th->stopped_at[th->n] = 0;
    th->tid[th->n++] = tid;
    return 0;
}

/* Seizes every thread of the process, listing them again until a listing
 * finds no new one (a thread created later is never seized: nothing of
 * ours concerns it). Returns 0 or an errno. */
static int seize_all(pid_t pid, struct threads *th)
{
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/task", (int)pid);
    for (bool added = true; added;) {
        added = false;
        DIR *d = opendir(name);
        if (d == NULL)
            return errno;
        struct dirent *e;
        int err = 0;
        while (err == 0 && (e = readdir(d)) != NULL) {
            pid_t tid = (pid_t)strtol(e->d_name, NULL, 10);
            if (tid <= 0 || has_thread(th, tid))
                continue;
            if (ptrace(PTRACE_SEIZE, tid, NULL, NULL) != 0) {
                if (errno != ESRCH) /* ESRCH: it exited meanwhile */
                    err = errno;
                continue;
            }
            err = add_thread(th, tid);
            if (err != 0)
                ptrace(PTRACE_DETACH, tid, NULL, NULL);
            added = true;
        }
        closedir(d);
        if (err != 0)
            return err;
    }
    return 0;
}

enum stop_kind { STOP_NONE, STOP_INTERRUPT, STOP_SIGNAL, STOP_GROUP, STOP_GONE };

/* Waits (without blocking) for an event of one thread and sorts it. */
static enum stop_kind poll_thread(pid_t tid, int *sig)
{
    int status;
    pid_t got = waitpid(tid, &status, __WALL | WNOHANG);
    if (got == 0)
        return STOP_NONE;
    if (got < 0)
        return errno == EINTR ? STOP_NONE : STOP_GONE;
    if (WIFEXITED(status) || WIFSIGNALED(status))
        return STOP_GONE;
    if (!WIFSTOPPED(status))
        return STOP_NONE;
    *sig = WSTOPSIG(status);
    if ((status >> 16) == PTRACE_EVENT_STOP)
        return *sig == SIGTRAP ? STOP_INTERRUPT : STOP_GROUP;
    return STOP_SIGNAL;
}

/* The events of every thread but `busy` (which the caller handles): a
 * signal is passed on, a group stop left stopped, an interrupt (ours)
 * left for the caller. Returns false if the process is gone. */
static bool pass_on_others(struct threads *th, pid_t busy)
{
    for (size_t i = 0; i < th->n; i++) {
        if (th->tid[i] == busy || th->tid[i] == 0 || th->stopped_at[i] != 0)
            continue;
        int sig = 0;
        switch (poll_thread(th->tid[i], &sig)) {
        case STOP_SIGNAL: ptrace(PTRACE_CONT, th->tid[i], NULL, (void *)(intptr_t)sig); break;
        case STOP_GROUP: ptrace(PTRACE_LISTEN, th->tid[i], NULL, NULL); break;
        case STOP_GONE: th->tid[i] = 0; break;
        default: break;
        }
    }
    (void)busy;
    return kill(th->pid, 0) == 0;
}

/* Interrupts one thread and waits for it to stop (passing on the
 * signals it and the others meet meanwhile). Returns 0, ESRCH if it is
 * gone, ETIMEDOUT. */
static int stop_thread(struct threads *th, size_t i, int64_t deadline)
{
    pid_t tid = th->tid[i];
    if (ptrace(PTRACE_INTERRUPT, tid, NULL, NULL) != 0)
        return ESRCH;
    int64_t asked = now_ns();
    for (;;) {
        int sig = 0;
        switch (poll_thread(tid, &sig)) {
        case STOP_INTERRUPT:
        case STOP_GROUP: /* stopped either way; our interrupt stays pending */
            th->stopped_at[i] = asked;
            return 0;
        case STOP_SIGNAL: ptrace(PTRACE_CONT, tid, NULL, (void *)(intptr_t)sig); break;
        case STOP_GONE: th->tid[i] = 0; return ESRCH;
        default: break;
        }
        if (!pass_on_others(th, tid))
            return ESRCH;
        if (now_ns() > deadline)
            return ETIMEDOUT;
        struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
    }
}

static double held_ms(const struct threads *th, size_t i)
{
    return th->stopped_at[i] ? (double)(now_ns() - th->stopped_at[i]) / 1e6 : 0;
}

/* --- memory and registers of the stopped thread --- */

static bool read_mem(const struct target *t, uint64_t addr, void *buf, size_t n)
{
    return pread(t->mem, buf, n, (off_t)addr) == (ssize_t)n;
}

static bool write_mem(const struct target *t, uint64_t addr, const void *buf, size_t n)
{
    return pwrite(t->mem, buf, n, (off_t)addr) == (ssize_t)n;
}

static bool is_unsafe(const struct target *t, uint64_t addr)
{
    for (size_t i = 0; i < t->nunsafe; i++)
        if (addr >= t->unsafe[i].lo && addr < t->unsafe[i].hi)
            return true;
    return false;
}

/* The stopped thread's return addresses, unwound by the CFI of its
 * objects (.eh_frame, in every Debian binary) through ptrace. */
struct walk {
    const struct target *t;
    bool unsafe;
    unsigned depth;
};

static int check_frame(Dwfl_Frame *frame, void *arg)
{
    struct walk *w = arg;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(frame, &pc, &activation))
        return DWARF_CB_ABORT;
    /* A return address, not the thread's own pc: the call is before it. */
    if (is_unsafe(w->t, activation ? pc : pc - 1)) {
        w->unsafe = true;
        return DWARF_CB_ABORT;
    }
    return ++w->depth < 512 ? DWARF_CB_OK : DWARF_CB_ABORT;
}

/* Unwinds the thread: 1 when one of its frames is in the loader or the
 * allocator, 0 when none is (the walk reached the outermost frame), -1
 * when it could not be walked to the end. */
static int unwound_unsafe(const struct target *t, pid_t tid)
{
    if (t->dwfl == NULL)
        return -1;
    struct walk w = {t, false, 0};
    int rc = dwfl_getthread_frames(t->dwfl, tid, check_frame, &w);
    if (w.unsafe)
        return 1;
    return rc == 0 ? 0 : -1;
}

/* Whether the stopped thread is at a safe point (the top of this file):
 * its frames unwound by CFI, or when that fails every word of the top of
 * its stack that points into code (conservative: a stale word makes it
 * unsafe). */
static bool at_safe_point(const struct target *t, pid_t tid, const struct user_regs_struct *regs)
{
    if (is_unsafe(t, regs->rip))
        return false;
    if (t->r_state != 0) {
        int state = -1;
        if (!read_mem(t, t->r_state, &state, sizeof state) || state != RT_CONSISTENT)
            return false;
    }
    int unwound = unwound_unsafe(t, tid);
    if (unwound >= 0)
        return unwound == 0;
    uint64_t words[512];
    for (uint64_t at = regs->rsp; at < regs->rsp + STACK_SCAN_BYTES; at += sizeof words) {
        ssize_t got = pread(t->mem, words, sizeof words, (off_t)at);
        if (got <= 0)
            break; /* the top of the stack */
        for (size_t k = 0; k < (size_t)got / 8; k++)
            if (is_unsafe(t, words[k]))
                return false;
    }
    return true;
}

/* The unwinder of the process's threads, stopped by us when used. */
static Dwfl *process_unwinder(pid_t pid)
{
    static const Dwfl_Callbacks callbacks = {
        .find_elf = dwfl_linux_proc_find_elf,
        .find_debuginfo = dwfl_standard_find_debuginfo,
    };
    Dwfl *dwfl = dwfl_begin(&callbacks);
    if (dwfl == NULL)
        return NULL;
    if (dwfl_linux_proc_report(dwfl, pid) != 0 || dwfl_report_end(dwfl, NULL, NULL) != 0 ||
        dwfl_linux_proc_attach(dwfl, pid, true) != 0) {
        dwfl_end(dwfl);
        return NULL;
    }
    return dwfl;
}

struct saved_state {
    struct user_regs_struct regs;
    unsigned char xstate[16384];
    struct iovec xstate_iov;
    struct user_fpregs_struct fp; /* when XSTATE is not offered */
    bool have_xstate;
};

static bool save_state(pid_t tid, struct saved_state *s)
{
    if (ptrace(PTRACE_GETREGS, tid, NULL, &s->regs) != 0)
        return false;
    s->xstate_iov = (struct iovec){s->xstate, sizeof s->xstate};
    s->have_xstate = ptrace(PTRACE_GETREGSET, tid, (void *)NT_X86_XSTATE, &s->xstate_iov) == 0;
    return s->have_xstate || ptrace(PTRACE_GETFPREGS, tid, NULL, &s->fp) == 0;
}

static bool restore_state(pid_t tid, struct saved_state *s)
{
    bool ok = ptrace(PTRACE_SETREGS, tid, NULL, &s->regs) == 0;
    if (s->have_xstate)
        ok = ptrace(PTRACE_SETREGSET, tid, (void *)NT_X86_XSTATE, &s->xstate_iov) == 0 && ok;
    else
        ok = ptrace(PTRACE_SETFPREGS, tid, NULL, &s->fp) == 0 && ok;
    return ok;
}

/* Calls fn(args...) on the stopped thread i, on a frame below the saved
 * stack (its red zone skipped) whose return address is 0, and waits for
 * the fault that says it returned. `data` is copied below the frame; its
 * address in the target replaces any argument equal to DATA_ARG. Returns
 * 0 with the call's rax, or an errno (ETIMEDOUT, ESRCH: gone, EFAULT: it
 * faulted elsewhere). The thread is left stopped, registers undefined. */
#define DATA_ARG UINT64_MAX
static int remote_call(const struct target *t, struct threads *th, size_t i,
                       const struct saved_state *saved, uint64_t fn, const uint64_t *args,
                       size_t nargs, const void *data, size_t data_size, uint64_t *ret)
{
    pid_t tid = th->tid[i];
    struct user_regs_struct r = saved->regs;
    uint64_t sp = saved->regs.rsp - RED_ZONE;
    uint64_t data_at = (sp - data_size) & ~(uint64_t)15;
    sp = data_at;
    if (data_size && !write_mem(t, data_at, data, data_size))
        return EFAULT;
    sp -= 8;
    uint64_t zero = 0;
    if (!write_mem(t, sp, &zero, sizeof zero))
        return EFAULT;
    unsigned long long *slots[] = {&r.rdi, &r.rsi, &r.rdx, &r.rcx, &r.r8, &r.r9};
    for (size_t k = 0; k < nargs && k < 6; k++)
        *slots[k] = args[k] == DATA_ARG ? data_at : args[k];
    r.rsp = sp;
    r.rip = fn;
    r.rax = 0;
    r.orig_rax = (unsigned long long)-1;
    if (ptrace(PTRACE_SETREGS, tid, NULL, &r) != 0 || ptrace(PTRACE_CONT, tid, NULL, NULL) != 0)
        return ESRCH;
    int64_t deadline = now_ns() + CALL_TIMEOUT_NS;
    for (;;) {
        int sig = 0;
        switch (poll_thread(tid, &sig)) {
        case STOP_SIGNAL:
            if (sig == SIGSEGV) {
                if (ptrace(PTRACE_GETREGS, tid, NULL, &r) != 0)
                    return ESRCH;
                if (r.rip == 0) {
                    *ret = r.rax;
                    return 0;
                }
                return EFAULT; /* a real fault inside the call: not passed on */
            }
            ptrace(PTRACE_CONT, tid, NULL, (void *)(intptr_t)sig);
            break;
        case STOP_GROUP: ptrace(PTRACE_LISTEN, tid, NULL, NULL); break;
        case STOP_INTERRUPT: ptrace(PTRACE_CONT, tid, NULL, NULL); break;
        case STOP_GONE: th->tid[i] = 0; return ESRCH;
        default: break;
        }
        if (!pass_on_others(th, tid))
            return ESRCH;
        if (now_ns() > deadline) {
            ptrace(PTRACE_INTERRUPT, tid, NULL, NULL);
            struct timespec pause = {0, 1000000};
            while (poll_thread(tid, &sig) == STOP_NONE)
                nanosleep(&pause, NULL);
            return ETIMEDOUT;
        }
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
}

/* Detaches the threads stopped now (the borrowed one, its registers put
 * back) after passing on what the others reported meanwhile. The others
 * are running: the tracer's exit detaches them without a stop
 * (dd_prof_inject runs all this in a child), so a thread never tried is
 * never interrupted (no EINTR from its epoll_wait or semop). */
static void let_go(struct threads *th, double *longest)
{
    pass_on_others(th, 0);
    for (size_t i = 0; i < th->n; i++) {
        if (th->tid[i] == 0 || th->stopped_at[i] == 0)
            continue;
        double held = held_ms(th, i);
        if (held > *longest)
            *longest = held;
        ptrace(PTRACE_DETACH, th->tid[i], NULL, NULL);
        th->stopped_at[i] = 0;
    }
}

/* Looks for a thread at a safe point: each in turn is stopped, looked at
 * and let go again, until one is safe. Returns its index, or -1 with the
 * errno in *err. */
static long find_safe_thread(struct target *t, struct threads *th, struct saved_state *saved,
                             unsigned *attempts, double *longest, int *err)
{
    int64_t deadline = now_ns() + SAFE_POINT_TIMEOUT_NS;
    for (size_t round = 0;; round++) {
        size_t i = round % th->n;
        if (th->tid[i] == 0)
            continue;
        int e = stop_thread(th, i, deadline);
        if (e == ETIMEDOUT || (e == ESRCH && kill(t->pid, 0) != 0)) {
            *err = e;
            return -1;
        }
        if (e != 0)
            continue;
        (*attempts)++;
        if (save_state(th->tid[i], saved) && at_safe_point(t, th->tid[i], &saved->regs))
            return (long)i;
        double held = held_ms(th, i);
        if (held > *longest)
            *longest = held;
        th->stopped_at[i] = 0;
        ptrace(PTRACE_CONT, th->tid[i], NULL, NULL);
        if (now_ns() > deadline) {
            *err = ETIMEDOUT;
            return -1;
        }
        struct timespec pause = {0, 200000};
        nanosleep(&pause, NULL);
    }
}

/* The start function of the library, once it is mapped. */
static bool find_start(struct target *t, const char *start)
{
    if (read_maps(t) != 0)
        return false;
    const struct mapping *m = find_object(t, is_path, t->lib_mapped);
    struct wanted w = {start, 0, 0};
    if (m == NULL || !lookup_symbols(t, m, &w, 1) || w.value == 0)
        return false;
    t->fn_start = w.value;
    return true;
}

/* For a target whose mount namespace does not see the library (a
 * container): the target creates an anonymous file (memfd_create, so
 * nothing is left on any file system, whatever happens next) and writes
 * the library's bytes into it, a chunk at a time from its own stack; it is
 * then opened as /proc/self/fd/N, a path valid in every mount namespace.
 * Returns the target's descriptor, or -1 (why set). */
static int load_through_memfd(struct target *t, struct threads *th, size_t i,
                              const struct saved_state *saved, char *why, size_t size)
{
    int file = open(t->lib_real, O_RDONLY | O_CLOEXEC);
    if (file < 0)
        return refuse(why, size, "%s: %s", t->lib_real, strerror(errno));
    uint64_t ret = 0;
    uint64_t create_args[2] = {DATA_ARG, MFD_CLOEXEC_};
    int e = remote_call(t, th, i, saved, t->fn_memfd_create, create_args, 2, MEMFD_NAME,
                        sizeof MEMFD_NAME, &ret);
    int memfd = (int)(int32_t)ret;
    if (e != 0 || memfd < 0) {
        close(file);
        return refuse(why, size, "its memfd_create failed: %s", strerror(e ? e : (int)-memfd));
    }
    static char chunk[16384];
    ssize_t got;
    while ((got = read(file, chunk, sizeof chunk)) > 0) {
        for (ssize_t done = 0; done < got;) {
            uint64_t write_args[3] = {(uint64_t)memfd, DATA_ARG, (uint64_t)(got - done)};
            e = remote_call(t, th, i, saved, t->fn_write, write_args, 3, chunk + done,
                            (size_t)(got - done), &ret);
            if (e != 0 || (int64_t)ret <= 0) {
                got = -1;
                break;
            }
            /* its copy of the bytes was taken from the start of the
             * data: the rest goes again from the next byte */
            done += (ssize_t)ret;
        }
        if (got < 0)
            break;
    }
    close(file);
    if (got < 0) {
        uint64_t close_args[1] = {(uint64_t)memfd};
        (void)remote_call(t, th, i, saved, t->fn_close, close_args, 1, NULL, 0, &ret);
        return refuse(why, size, "cannot copy %s into the process", t->lib_real);
    }
    return memfd;
}

/* The calls, on the borrowed thread: dlopen (unless loaded), start,
 * close of the target's copy of the descriptor (ours taken first). */
static int call_agent(struct target *t, struct threads *th, size_t i,
                      const struct saved_state *saved, const char *start,
                      struct dd_prof_injection *out, char *why, size_t size)
{
    uint64_t ret = 0;
    if (!t->lib_loaded) {
        char fd_path[64];
        const char *path = t->lib_real;
        int memfd = -1;
        if (t->via_memfd) {
            if ((memfd = load_through_memfd(t, th, i, saved, why, size)) < 0)
                return -1;
            snprintf(fd_path, sizeof fd_path, "/proc/self/fd/%d", memfd);
            path = fd_path;
        }
        uint64_t args[2] = {DATA_ARG, RTLD_NOW_};
        uint64_t fn = t->fn_dlopen;
        if (fn == 0) {
            fn = t->fn_libc_dlopen_mode;
            args[1] |= RTLD_DLOPEN_FLAG;
        }
        int e = remote_call(t, th, i, saved, fn, args, 2, path, strlen(path) + 1, &ret);
        if (memfd >= 0) { /* the mapping keeps the anonymous file alive */
            uint64_t close_args[1] = {(uint64_t)memfd};
            uint64_t ignored;
            (void)remote_call(t, th, i, saved, t->fn_close, close_args, 1, NULL, 0, &ignored);
        }
        if (e != 0)
            return refuse(why, size, "its dlopen of %s failed: %s", path, strerror(e));
        if (ret == 0)
            return refuse(why, size, "its dlopen of %s returned NULL", path);
        out->loaded = 1;
    }
    if (!find_start(t, start))
        return refuse(why, size, "%s has no %s once loaded", t->lib_mapped, start);
    int e = remote_call(t, th, i, saved, t->fn_start, NULL, 0, NULL, 0, &ret);
    if (e != 0)
        return refuse(why, size, "%s() failed: %s", start, strerror(e));
    int fd = (int)(int32_t)ret;
    if (fd < 0)
        return refuse(why, size, "%s() refused: %s", start,
                      fd == -EBUSY ? "attached already, or its malloc runs ddheap's or a "
                                     "sanitizer's hooks"
                                   : strerror(-fd));
    int pidfd = (int)syscall(SYS_pidfd_open, t->pid, 0);
    out->fd = pidfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0) : -1;
    int taken = errno;
    if (pidfd >= 0)
        close(pidfd);
    /* Its own copy goes either way: without ours, closing it detaches. */
    uint64_t close_args[1] = {(uint64_t)fd};
    e = remote_call(t, th, i, saved, t->fn_close, close_args, 1, NULL, 0, &ret);
    if (out->fd < 0)
        return refuse(why, size, "cannot take the agent's descriptor: %s", strerror(taken));
    if (e != 0)
        return refuse(why, size, "close() in the process failed: %s", strerror(e));
    return 0;
}

/* The injection itself, in the tracer (a child of ddheap-prof). */
static int inject_here(pid_t pid, const char *lib, const char *start,
                       struct dd_prof_injection *out, char *why, size_t why_size)
{
    *out = (struct dd_prof_injection){.fd = -1};
    struct target t = {.pid = pid, .mem = -1};
    char *real = realpath(lib, NULL);
    if (real == NULL)
        return refuse(why, why_size, "%s: %s", lib, strerror(errno));
    t.lib_real = real;
    int rc = preflight(&t, lib, why, why_size);
    struct threads th = {.pid = pid};
    static struct saved_state saved;
    int64_t began = now_ns();
    if (rc == 0) {
        char name[64];
        snprintf(name, sizeof name, "/proc/%d/mem", (int)pid);
        t.mem = open(name, O_RDWR | O_CLOEXEC);
        if (t.mem < 0)
            rc = refuse(why, why_size, "cannot open %s: %s", name, strerror(errno));
    }
    if (rc == 0)
        t.dwfl = process_unwinder(pid); /* before any thread is seized */
    if (rc == 0) {
        int e = seize_all(pid, &th);
        if (e != 0)
            rc = refuse(why, why_size, "cannot trace it: %s", strerror(e));
    }
    long borrowed = -1;
    if (rc == 0) {
        int e = 0;
        borrowed = find_safe_thread(&t, &th, &saved, &out->attempts, &out->longest_stop_ms, &e);
        if (borrowed < 0)
            rc = refuse(why, why_size, e == ETIMEDOUT
                                           ? "no thread came to a safe point (outside the loader "
                                             "and the allocator) in %d s"
                                           : "it exited",
                        (int)(SAFE_POINT_TIMEOUT_NS / 1000000000LL));
    }
    if (borrowed >= 0) {
        rc = call_agent(&t, &th, (size_t)borrowed, &saved, start, out, why, why_size);
        if (th.tid[borrowed] != 0 && !restore_state(th.tid[borrowed], &saved) && rc == 0)
            rc = refuse(why, why_size, "cannot restore the registers of thread %d",
                        (int)th.tid[borrowed]);
    }
    let_go(&th, &out->longest_stop_ms);
    out->latency_ms = (double)(now_ns() - began) / 1e6;
    if (rc != 0 && out->fd >= 0) {
        close(out->fd); /* the agent, if started, detaches */
        out->fd = -1;
    }
    if (t.dwfl != NULL)
        dwfl_end(t.dwfl);
    free(th.tid);
    free(th.stopped_at);
    free(t.unsafe);
    free_maps(&t);
    if (t.mem >= 0)
        close(t.mem);
    free(real);
    return rc;
}

/* What the tracer sends back: the result, its reason, and (SCM_RIGHTS)
 * its copy of the agent's descriptor. */
struct report {
    int rc;
    struct dd_prof_injection out;
    char why[512];
};

int dd_prof_inject(pid_t pid, const char *lib, const char *start, struct dd_prof_injection *out,
                   char *why, size_t why_size)
{
    *out = (struct dd_prof_injection){.fd = -1};
    int64_t began = now_ns();
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return refuse(why, why_size, "socketpair: %s", strerror(errno));
    pid_t tracer = fork();
    if (tracer < 0) {
        close(sv[0]);
        close(sv[1]);
        return refuse(why, why_size, "fork: %s", strerror(errno));
    }
    if (tracer == 0) {
        /* Ctrl-C reaches the whole process group: the tracer dying while
         * a thread of the target runs our call would leave that thread to
         * return to address 0. It finishes instead (within its time-outs);
         * ddheap-prof sees the Ctrl-C after. */
        signal(SIGINT, SIG_IGN);
        signal(SIGQUIT, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
        close(sv[0]);
        static struct report r;
        r.rc = inject_here(pid, lib, start, &r.out, r.why, sizeof r.why);
        struct iovec iov = {&r, sizeof r};
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(int))];
        } control;
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (r.out.fd >= 0) {
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
            struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &r.out.fd, sizeof(int));
        }
        _exit(sendmsg(sv[1], &msg, 0) == (ssize_t)sizeof r ? 0 : 1);
    }
    close(sv[1]);
    static struct report r;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {&r, sizeof r};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    ssize_t got;
    do
        got = recvmsg(sv[0], &msg, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    close(sv[0]);
    while (waitpid(tracer, NULL, 0) < 0 && errno == EINTR)
        ;
    if (got != (ssize_t)sizeof r)
        return refuse(why, why_size, "the tracer process ended without a word");
    *out = r.out;
    out->latency_ms = (double)(now_ns() - began) / 1e6; /* the fork included */
    out->fd = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
        memcpy(&out->fd, CMSG_DATA(c), sizeof(int));
    snprintf(why, why_size, "%s", r.why);
    if (r.rc == 0 && out->fd < 0)
        return refuse(why, why_size, "the agent's descriptor was not passed on");
    return r.rc;
}

#else

int dd_prof_inject(pid_t pid, const char *lib, const char *start, struct dd_prof_injection *out,
                   char *why, size_t why_size)
{
    (void)pid, (void)lib, (void)start;
    *out = (struct dd_prof_injection){.fd = -1};
    snprintf(why, why_size, "injection is implemented on x86-64 only");
    return -1;
}

#endif

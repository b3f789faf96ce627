/*
 * ddheap-prof: a heap profiler for ddheap-instrumented processes, on
 * libbpf. It attaches USDT programs (ddheap_prof.bpf.c) to the `alloc`
 * and `free` probes of every object of one process that carries them,
 * keeps the live sampled blocks in user space (table.h), and at the end
 * writes a gzipped pprof profile, and optionally folded stacks and a
 * flame-graph SVG. docs/ddheap-prof.md is the user's guide.
 *
 *   ddheap-prof [-p PID | -- CMD ARGS...] [-d SECONDS] [-o FILE.pb.gz]
 *               [--svg FILE] [--folded FILE] [--provider ddheap|otel_memory]
 *
 * With -- CMD the command is started under ptrace, stopped at its exec:
 * the probes of the executable and of the libraries the dynamic loader
 * will map (asked of the loader with --list) are attached before its first
 * instruction; the exit stop lets the last mappings be read before the
 * process is gone. Objects that appear later (dlopen) are found by
 * rescanning /proc/PID/maps.
 */
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <gelf.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/types.h>

#include "ddheap_prof.h"
/* bpftool embeds the BPF object as one string literal, longer than the
 * 4095 characters -Wpedantic holds C99 compilers to; gcc and clang take it. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
#include "ddheap_prof.skel.h"
#pragma GCC diagnostic pop
#include "flame.h"
#include "objects.h"
#include "pprof.h"
#include "report.h"
#include "table.h"

#define RESCAN_MS 200

struct options {
    pid_t pid;
    char **cmd;
    double duration;
    const char *out_path, *svg_path, *folded_path;
    const char *provider;
    enum dd_prof_value value;
    unsigned long ringbuf_kb;
    bool verbose;
};

struct file_id {
    uint64_t dev, ino;
};

struct prof {
    struct options opt;
    pid_t pid;
    bool child; /* started by us, under ptrace */
    struct ddheap_prof_bpf *skel;
    struct ring_buffer *rb;
    struct dd_prof_objects objs;
    struct dd_prof_table table;
    struct bpf_link **links;
    size_t nlinks, links_cap;
    struct file_id *attached;
    size_t nattached, attached_cap;
    uint64_t interval; /* the process's sampling interval: pprof's period */
    bool oom;
};

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *to)
{
    fputs("usage: ddheap-prof [-p PID | -- CMD ARGS...] [-d SECONDS] [-o FILE.pb.gz]\n"
          "                   [--svg FILE] [--folded FILE] [--provider ddheap|otel_memory]\n"
          "                   [--value inuse_space|alloc_space|inuse_objects|alloc_objects]\n"
          "                   [--ringbuf-kb KB] [-v]\n"
          "Profiles the heap of a ddheap-instrumented process; writes a gzipped pprof\n"
          "profile (default ddheap-prof.pb.gz) on Ctrl-C, after -d SECONDS, or when CMD\n"
          "exits. --svg and --folded show --value (default inuse_space).\n",
          to);
}

static void die_usage(const char *what)
{
    fprintf(stderr, "ddheap-prof: %s\n", what);
    usage(stderr);
    exit(2);
}

static void parse_options(int argc, char **argv, struct options *o)
{
    enum { OPT_SVG = 256, OPT_FOLDED, OPT_PROVIDER, OPT_VALUE, OPT_RINGBUF, OPT_HELP };
    static const struct option longs[] = {
        {"pid", required_argument, NULL, 'p'},       {"duration", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},    {"svg", required_argument, NULL, OPT_SVG},
        {"folded", required_argument, NULL, OPT_FOLDED},
        {"provider", required_argument, NULL, OPT_PROVIDER},
        {"value", required_argument, NULL, OPT_VALUE},
        {"ringbuf-kb", required_argument, NULL, OPT_RINGBUF},
        {"verbose", no_argument, NULL, 'v'},         {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    *o = (struct options){.out_path = "ddheap-prof.pb.gz", .provider = "ddheap",
                          .value = DD_PROF_INUSE_SPACE, .ringbuf_kb = 16384};
    int c;
    char *end;
    /* '+': stop at the first non-option, so CMD's own options stay its own. */
    while ((c = getopt_long(argc, argv, "+p:d:o:v", longs, NULL)) != -1) {
        switch (c) {
        case 'p': {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || v <= 0 || v > INT_MAX)
                die_usage("-p needs a process id");
            o->pid = (pid_t)v;
            break;
        }
        case 'd':
            errno = 0;
            o->duration = strtod(optarg, &end);
            if (errno || *end || end == optarg || !(o->duration > 0))
                die_usage("-d needs a positive number of seconds");
            break;
        case 'o': o->out_path = optarg; break;
        case OPT_SVG: o->svg_path = optarg; break;
        case OPT_FOLDED: o->folded_path = optarg; break;
        case OPT_PROVIDER:
            if (strcmp(optarg, "ddheap") != 0 && strcmp(optarg, "otel_memory") != 0)
                die_usage("--provider is ddheap or otel_memory");
            o->provider = optarg;
            break;
        case OPT_VALUE: {
            int found = -1;
            for (int i = 0; i < 4; i++)
                if (strcmp(optarg, dd_prof_value_names[i]) == 0)
                    found = i;
            if (found < 0)
                die_usage("--value is inuse_space, alloc_space, inuse_objects or alloc_objects");
            o->value = (enum dd_prof_value)found;
            break;
        }
        case OPT_RINGBUF:
            errno = 0;
            o->ringbuf_kb = strtoul(optarg, &end, 10);
            if (errno || *end || end == optarg || o->ringbuf_kb < 4 || o->ringbuf_kb > (1ul << 21))
                die_usage("--ringbuf-kb needs a size in KiB, 4 to 2097152");
            break;
        case 'v': o->verbose = true; break;
        case OPT_HELP: usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc)
        o->cmd = argv + optind;
    if ((o->pid != 0) == (o->cmd != NULL))
        die_usage(o->pid ? "give -p PID or -- CMD, not both" : "give -p PID or -- CMD");
}

static FILE *open_output(const char *path)
{
    if (path == NULL)
        return NULL;
    FILE *f = fopen(path, "we");
    if (f == NULL) {
        fprintf(stderr, "ddheap-prof: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    return f;
}

static int libbpf_quiet(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    if (level == LIBBPF_DEBUG)
        return 0;
    return vfprintf(stderr, fmt, ap);
}

/* --- attaching ----------------------------------------------------- */

static bool already_attached(const struct prof *p, uint64_t dev, uint64_t ino)
{
    for (size_t i = 0; i < p->nattached; i++)
        if (p->attached[i].dev == dev && p->attached[i].ino == ino)
            return true;
    return false;
}

static int keep_link(struct prof *p, struct bpf_link *l)
{
    if (p->nlinks == p->links_cap) {
        size_t cap = p->links_cap ? 2 * p->links_cap : 16;
        struct bpf_link **v = realloc(p->links, cap * sizeof *v);
        if (v == NULL)
            return -1;
        p->links = v;
        p->links_cap = cap;
    }
    p->links[p->nlinks++] = l;
    return 0;
}

/* Attaches free, then alloc (a block must never be seen allocated by a
 * tracer that cannot yet see its free), to the file at path for our pid:
 * a uprobe on the file's inode, so it also covers mappings made later.
 * Returns 0 or -1 (message printed). */
static int attach_file(struct prof *p, const char *path, uint64_t dev, uint64_t ino,
                       unsigned probes_present)
{
    if (already_attached(p, dev, ino))
        return 0;
    static const char *const probes[2] = {"free", "alloc"};
    for (int i = 0; i < 2; i++) {
        if (!(probes_present & (i == 0 ? DD_PROF_HAS_FREE : DD_PROF_HAS_ALLOC)))
            continue;
        struct bpf_program *prog = i == 0 ? p->skel->progs.on_free : p->skel->progs.on_alloc;
        struct bpf_link *l =
            bpf_program__attach_usdt(prog, p->pid, path, p->opt.provider, probes[i], NULL);
        if (l == NULL) {
            fprintf(stderr, "ddheap-prof: cannot attach to %s:%s:%s in %s: %s\n", p->opt.provider,
                    probes[i], path, path, strerror(errno));
            return -1;
        }
        if (keep_link(p, l) != 0) {
            bpf_link__destroy(l);
            return -1;
        }
    }
    if (p->nattached == p->attached_cap) {
        size_t cap = p->attached_cap ? 2 * p->attached_cap : 16;
        struct file_id *v = realloc(p->attached, cap * sizeof *v);
        if (v == NULL)
            return -1;
        p->attached = v;
        p->attached_cap = cap;
    }
    p->attached[p->nattached++] = (struct file_id){dev, ino};
    fprintf(stderr, "ddheap-prof: attached to %s (%s:alloc%s)\n", path, p->opt.provider,
            probes_present & DD_PROF_HAS_FREE ? ", free" : "; no free probe: allocation profile only");
    return 0;
}

/* Rescans the maps; attaches to every object with probes not attached
 * yet. Returns the number of objects with probes attached so far, -1 if
 * the maps could not be read. */
static int rescan(struct prof *p)
{
    if (dd_prof_objects_scan(&p->objs, p->pid) < 0)
        return -1;
    for (size_t i = 0; i < p->objs.n; i++) {
        struct dd_prof_object *o = &p->objs.v[i];
        if ((o->probes & DD_PROF_HAS_ALLOC) && !o->attached) {
            /* Tried once: a failure is reported, the other objects are
             * still profiled. */
            attach_file(p, o->path, o->dev, o->ino, o->probes);
            o->attached = true;
        }
    }
    return (int)p->nattached;
}

/* --- starting a command -------------------------------------------- */

/* The ELF interpreter (dynamic loader) named by the executable, if any. */
static char *interpreter_of(const char *exe)
{
    int fd = open(exe, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || elf_version(EV_CURRENT) == EV_NONE) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    char *interp = NULL;
    Elf *elf = elf_begin(fd, ELF_C_READ, NULL);
    size_t n;
    if (elf && elf_getphdrnum(elf, &n) == 0) {
        for (size_t i = 0; i < n && !interp; i++) {
            GElf_Phdr ph;
            if (!gelf_getphdr(elf, (int)i, &ph) || ph.p_type != PT_INTERP || ph.p_filesz > 4096)
                continue;
            size_t len;
            const char *raw = elf_rawfile(elf, &len);
            if (raw && ph.p_offset + ph.p_filesz <= len)
                interp = strndup(raw + ph.p_offset, ph.p_filesz);
        }
    }
    if (elf)
        elf_end(elf);
    close(fd);
    return interp;
}

/* The process's environment, as execve wants it (NULL-terminated). */
static char **environment_of(pid_t pid, char **buf_out)
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

/* The mean sampling interval the process runs with, as its environment
 * says (ddheap's default otherwise): pprof's period. */
static uint64_t interval_of(pid_t pid)
{
    char *buf = NULL;
    char **env = environment_of(pid, &buf);
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

/* Attaches to the libraries the dynamic loader will map for the process
 * stopped at its exec: the loader's own `--list`, run on the same
 * executable with the same environment (LD_PRELOAD and LD_LIBRARY_PATH
 * included), names them. They are not mapped yet; the uprobes are placed
 * on their files and become live as the loader maps them. */
static void attach_needed_libraries(struct prof *p)
{
    char exe[PATH_MAX], link[64];
    snprintf(link, sizeof link, "/proc/%d/exe", (int)p->pid);
    ssize_t n = readlink(link, exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *interp = interpreter_of(exe);
    char *envbuf = NULL;
    char **env = interp ? environment_of(p->pid, &envbuf) : NULL;
    int fds[2];
    if (env == NULL || pipe2(fds, O_CLOEXEC) != 0) {
        free(interp);
        free(env);
        free(envbuf);
        return;
    }
    pid_t lister = fork();
    if (lister == 0) {
        dup2(fds[1], STDOUT_FILENO);
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0)
            dup2(null, STDERR_FILENO);
        char *argv[] = {interp, (char *)"--list", exe, NULL};
        execve(interp, argv, env);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = lister > 0 ? fdopen(fds[0], "r") : NULL;
    if (f == NULL)
        close(fds[0]);
    char *line = NULL;
    size_t cap = 0;
    while (f && getline(&line, &cap, f) > 0) {
        /* "\tlibx.so => /path/libx.so (0x...)" or "\t/path/lib.so (0x...)" */
        char *path = strstr(line, "=> ");
        path = path ? path + 3 : line + strspn(line, " \t");
        if (*path != '/')
            continue;
        path[strcspn(path, " \t\n")] = '\0';
        struct stat st;
        unsigned probes = stat(path, &st) == 0 ? dd_prof_elf_probes(path, -1) : 0;
        if (probes & DD_PROF_HAS_ALLOC)
            attach_file(p, path, st.st_dev, st.st_ino, probes);
    }
    free(line);
    if (f)
        fclose(f);
    if (lister > 0)
        waitpid(lister, NULL, 0);
    free(interp);
    free(env);
    free(envbuf);
}

/* Forks CMD; the child waits for a byte on a pipe before its exec, so the
 * parent can seize it first and see the exec stop. Returns the pid. */
static pid_t start_command(char **cmd)
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

/* Handles whatever state changes of the child are pending. Returns true
 * once it has exited (its status in *status). */
static bool child_events(struct prof *p, int *status, bool *exec_seen)
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
            if (rescan(p) >= 0)
                attach_needed_libraries(p);
            p->interval = interval_of(p->pid);
            if (p->nattached == 0)
                /* A wrapper (env, a shell) may exec the real program
                 * later, or the program dlopen an instrumented library. */
                fprintf(stderr, "ddheap-prof: no %s probes in %s yet; profiling starts when it "
                                "maps an object that has them\n",
                        p->opt.provider, p->opt.cmd[0]);
            *exec_seen = true;
            sig = 0;
        } else if (event == PTRACE_EVENT_EXIT) {
            rescan(p); /* the last look at the mappings */
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
static void detach_child(struct prof *p)
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

/* --- the profile ----------------------------------------------------- */

static int on_event(void *ctx, void *data, size_t size)
{
    struct prof *p = ctx;
    const struct dd_prof_free_event *f = data;
    if (size < sizeof *f)
        return 0;
    if (f->type == DD_PROF_EV_FREE) {
        dd_prof_table_free_block(&p->table, f->ptr);
    } else if (f->type == DD_PROF_EV_ALLOC &&
               size >= offsetof(struct dd_prof_alloc_event, frames)) {
        const struct dd_prof_alloc_event *a = data;
        uint32_t n = a->nframes;
        size_t room = (size - offsetof(struct dd_prof_alloc_event, frames)) / sizeof a->frames[0];
        if (n > room)
            n = (uint32_t)room;
        /* __u64 is unsigned long long, uint64_t unsigned long here: copy
         * rather than read one through the other. */
        uint64_t frames[DD_PROF_MAX_FRAMES];
        if (n > DD_PROF_MAX_FRAMES)
            n = DD_PROF_MAX_FRAMES;
        for (uint32_t i = 0; i < n; i++)
            frames[i] = a->frames[i];
        if (a->ptr != 0 && dd_prof_table_alloc(&p->table, a->ptr, a->size, a->weight, frames, n))
            p->oom = true;
    }
    return 0;
}

static int64_t now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int write_outputs(struct prof *p, FILE *out, FILE *svg, FILE *folded, int64_t started,
                         int64_t started_mono)
{
    uint64_t interval = p->interval;
    uint64_t lost_alloc = p->skel->bss->lost[DD_PROF_EV_ALLOC];
    uint64_t lost_free = p->skel->bss->lost[DD_PROF_EV_FREE];
    char c_lost[256], c_what[256], c_counts[256];
    snprintf(c_what, sizeof c_what, "ddheap-prof: pid %d, provider %s, interval %" PRIu64,
             (int)p->pid, p->opt.provider, interval);
    snprintf(c_lost, sizeof c_lost,
             "ddheap-prof: lost events: %" PRIu64 " (alloc %" PRIu64 ", free %" PRIu64
             "; ring buffer %lu KiB)",
             lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    snprintf(c_counts, sizeof c_counts,
             "ddheap-prof: alloc events %" PRIu64 ", free events %" PRIu64
             " (%" PRIu64 " of blocks not seen allocated), live sampled blocks %zu",
             p->table.allocs, p->table.frees, p->table.unmatched_frees, p->table.nlive);
    fprintf(stderr, "%s\n", c_counts);
    if (lost_alloc + lost_free)
        fprintf(stderr, "ddheap-prof: LOST %" PRIu64 " events (alloc %" PRIu64 ", free %" PRIu64
                        "): the ring buffer was full; raise --ringbuf-kb (now %lu)\n",
                lost_alloc + lost_free, lost_alloc, lost_free, p->opt.ringbuf_kb);
    const char *comments[] = {c_what, c_counts, c_lost};

    struct dd_prof_report r;
    if (dd_prof_report_build(&r, &p->table, &p->objs) != 0) {
        fprintf(stderr, "ddheap-prof: out of memory symbolising\n");
        return -1;
    }
    int rc = 0;
    if (folded && dd_prof_write_folded(folded, &r, p->opt.value) != 0) {
        fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.folded_path);
        rc = -1;
    }
    if (svg) {
        char title[128];
        snprintf(title, sizeof title, "ddheap-prof: %s, pid %d", dd_prof_value_names[p->opt.value],
                 (int)p->pid);
        if (dd_prof_write_svg(svg, &r, p->opt.value, title) != 0) {
            fprintf(stderr, "ddheap-prof: writing %s failed\n", p->opt.svg_path);
            rc = -1;
        }
    }
    struct dd_prof_meta meta = {started, now_ns(CLOCK_MONOTONIC) - started_mono,
                                (int64_t)interval, comments, 3};
    if (dd_prof_write_pprof(out, p->opt.out_path, &r, &p->objs, &meta) != 0)
        rc = -1;
    dd_prof_report_free(&r);
    if (rc == 0)
        fprintf(stderr, "ddheap-prof: wrote %s (%zu stacks)\n", p->opt.out_path, p->table.nstacks);
    return rc;
}

static int setup_bpf(struct prof *p)
{
    libbpf_set_print(p->opt.verbose ? NULL : libbpf_quiet);
    p->skel = ddheap_prof_bpf__open();
    if (p->skel == NULL) {
        fprintf(stderr, "ddheap-prof: cannot open the BPF object: %s\n", strerror(errno));
        return -1;
    }
    p->skel->rodata->target_tgid = (uint32_t)p->pid;
    /* A ring buffer's size is a power of two, at least a page. */
    unsigned long bytes = 4096;
    while (bytes < p->opt.ringbuf_kb * 1024)
        bytes <<= 1;
    p->skel->rodata->wake_bytes = bytes / 4;
    if (bpf_map__set_max_entries(p->skel->maps.events, (uint32_t)bytes) != 0 ||
        ddheap_prof_bpf__load(p->skel) != 0) {
        fprintf(stderr, "ddheap-prof: cannot load the BPF programs: %s\n", strerror(errno));
        return -1;
    }
    p->rb = ring_buffer__new(bpf_map__fd(p->skel->maps.events), on_event, p, NULL);
    if (p->rb == NULL) {
        fprintf(stderr, "ddheap-prof: cannot open the ring buffer: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* Gone, or a zombie: it allocates nothing any more either way. */
static bool process_gone(pid_t pid)
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

int main(int argc, char **argv)
{
    static struct prof p;
    parse_options(argc, argv, &p.opt);
    dd_prof_objects_set_provider(p.opt.provider);
    dd_prof_table_init(&p.table);
    if (geteuid() != 0) {
        fprintf(stderr, "ddheap-prof: must run as root (it loads BPF programs and attaches "
                        "uprobes)\n");
        return 1;
    }
    if (p.opt.pid && process_gone(p.opt.pid)) {
        fprintf(stderr, "ddheap-prof: no process with pid %d\n", (int)p.opt.pid);
        return 1;
    }
    /* Every output is opened before anything is attached: a path that
     * cannot be written fails now, not after the run. */
    FILE *out = open_output(p.opt.out_path);
    FILE *svg = open_output(p.opt.svg_path);
    FILE *folded = open_output(p.opt.folded_path);

    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    p.child = p.opt.cmd != NULL;
    p.pid = p.child ? start_command(p.opt.cmd) : p.opt.pid;
    if (setup_bpf(&p) != 0) {
        if (p.child)
            kill(p.pid, SIGKILL);
        return 1;
    }
    int64_t started = now_ns(CLOCK_REALTIME), started_mono = now_ns(CLOCK_MONOTONIC);
    int child_status = 0;
    bool exited = false, exec_seen = false;
    if (p.child) {
        /* Until the exec stop, the child runs ddheap-prof's own image. */
        while (!exec_seen && !exited)
            if (!(exited = child_events(&p, &child_status, &exec_seen)))
                poll(NULL, 0, 5);
        if (!exec_seen) {
            fprintf(stderr, "ddheap-prof: %s exited before it started\n", p.opt.cmd[0]);
            return 1;
        }
    } else if (rescan(&p) < 0) {
        fprintf(stderr, "ddheap-prof: cannot read the mappings of pid %d: %s\n", (int)p.pid,
                strerror(errno));
        return 1;
    }
    if (p.nattached == 0 && !p.child) {
        fprintf(stderr, "ddheap-prof: process %d has no %s:alloc probe in any object it maps "
                        "(is it linked with libddheap, or run with libddheap_preload.so?)\n",
                (int)p.pid, p.opt.provider);
        return 1;
    }
    p.interval = interval_of(p.pid);
    fprintf(stderr, "ddheap-prof: profiling pid %d; Ctrl-C to stop\n", (int)p.pid);

    int64_t deadline = p.opt.duration > 0 ? started_mono + (int64_t)(p.opt.duration * 1e9) : 0;
    int64_t next_scan = now_ns(CLOCK_MONOTONIC) + RESCAN_MS * 1000000LL;
    /* A run cut short (the ring buffer failed, memory ran out) still writes
     * what it has, and then exits non-zero: a partial profile is no success. */
    bool cut_short = false;
    while (!stop_requested && !exited && !p.oom) {
        int got = ring_buffer__poll(p.rb, 50);
        if (got < 0 && got != -EINTR) {
            fprintf(stderr, "ddheap-prof: reading the ring buffer: %s\n", strerror(-got));
            cut_short = true;
            break;
        }
        int64_t now = now_ns(CLOCK_MONOTONIC);
        if (p.child)
            exited = child_events(&p, &child_status, &exec_seen);
        else
            exited = process_gone(p.pid);
        if (deadline && now >= deadline)
            break;
        if (!exited && now >= next_scan) {
            rescan(&p);
            next_scan = now + RESCAN_MS * 1000000LL;
        }
    }
    /* Everything the programs wrote before the end is in the buffer. */
    ring_buffer__consume(p.rb);
    if (p.oom) {
        fprintf(stderr, "ddheap-prof: out of memory: the profile stops here\n");
        cut_short = true;
    }
    if (exited && p.child && (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0)) {
        if (WIFSIGNALED(child_status))
            fprintf(stderr, "ddheap-prof: %s was killed by signal %d\n", p.opt.cmd[0],
                    WTERMSIG(child_status));
        else
            fprintf(stderr, "ddheap-prof: %s exited with status %d\n", p.opt.cmd[0],
                    WEXITSTATUS(child_status));
    }
    if (p.child && !exited)
        detach_child(&p);
    for (size_t i = 0; i < p.nlinks; i++)
        bpf_link__destroy(p.links[i]);
    if (p.nattached == 0) {
        fprintf(stderr, "ddheap-prof: process %d (%s) never mapped an object with %s:alloc "
                        "probes (is it linked with libddheap, or run with libddheap_preload.so?)\n",
                (int)p.pid, p.opt.cmd[0], p.opt.provider);
        return 1;
    }
    int rc = write_outputs(&p, out, svg, folded, started, started_mono);
    if ((svg && fclose(svg) != 0) || (folded && fclose(folded) != 0) || fclose(out) != 0)
        rc = -1;
    ring_buffer__free(p.rb);
    ddheap_prof_bpf__destroy(p.skel);
    dd_prof_objects_free(&p.objs);
    dd_prof_table_free(&p.table);
    free(p.links);
    free(p.attached);
    return rc == 0 && !cut_short ? 0 : 1;
}

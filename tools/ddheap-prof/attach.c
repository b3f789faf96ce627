/*
 * Finding the objects of the process that carry ddheap's probes and
 * attaching the BPF programs to them: at the start, at each rescan of
 * /proc/PID/maps (dlopen), and, for a command stopped at its exec, to the
 * libraries its dynamic loader is about to map.
 */
#include <bpf/libbpf.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
#include "prof.h"

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

/* Rescans the maps (prof.h). */
int dd_prof_rescan(struct prof *p)
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

/* Attaches to the libraries the dynamic loader will map for the process
 * stopped at its exec: the loader's own `--list`, run on the same
 * executable with the same environment (LD_PRELOAD and LD_LIBRARY_PATH
 * included), names them. They are not mapped yet; the uprobes are placed
 * on their files and become live as the loader maps them. */
void dd_prof_attach_needed_libraries(struct prof *p)
{
    char exe[PATH_MAX], link[64];
    snprintf(link, sizeof link, "/proc/%d/exe", (int)p->pid);
    ssize_t n = readlink(link, exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = '\0';
    char *interp = interpreter_of(exe);
    char *envbuf = NULL;
    char **env = interp ? dd_prof_environment_of(p->pid, &envbuf) : NULL;
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

void dd_prof_detach_all(struct prof *p)
{
    for (size_t i = 0; i < p->nlinks; i++)
        bpf_link__destroy(p->links[i]);
    p->nlinks = 0;
}

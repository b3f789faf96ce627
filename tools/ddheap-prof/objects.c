/*
 * Reading /proc/PID/maps into dd_prof_objects (objects.h); the files they
 * load, each opened and read once for the whole run, their descriptors
 * within a bound; and what ddheap-prof needs from an object's ELF
 * headers: whether its .note.stapsdt carries the probes, its GNU build
 * id, and, for glibc's dynamic loader, where its debugger hook is.
 */
#include "objects.h"

#include <linux/types.h>

#include "ddheap_prof.h"
#include "grow.h"

#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <inttypes.h>
#include <limits.h>
#include <libelf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define NT_STAPSDT 3

static const char *want_provider = "ddheap";

void dd_prof_objects_set_provider(const char *provider)
{
    want_provider = provider;
}

static Elf *open_elf(int fd)
{
    if (elf_version(EV_CURRENT) == EV_NONE)
        return NULL;
    Elf *elf = elf_begin(fd, ELF_C_READ_MMAP, NULL);
    if (elf && elf_kind(elf) != ELF_K_ELF) {
        elf_end(elf);
        return NULL;
    }
    return elf;
}

/* One stapsdt note's description: three addresses (probe, base,
 * semaphore), then provider, name and arguments as C strings. */
static void note_probe(const char *desc, size_t len, unsigned *probes)
{
    size_t at = 3 * sizeof(uint64_t);
    if (len <= at)
        return;
    const char *provider = desc + at;
    size_t plen = strnlen(provider, len - at);
    if (at + plen + 1 >= len || strcmp(provider, want_provider) != 0)
        return;
    const char *name = provider + plen + 1;
    size_t nlen = strnlen(name, len - at - plen - 1);
    if (at + plen + 1 + nlen >= len)
        return;
    if (strcmp(name, "alloc") == 0)
        *probes |= DD_PROF_HAS_ALLOC;
    else if (strcmp(name, "free") == 0)
        *probes |= DD_PROF_HAS_FREE;
}

/* Walks every note section; fills whatever of probes / build_id the
 * caller asked for. */
static void read_notes(Elf *elf, unsigned *probes, char *build_id, size_t build_id_size)
{
    Elf_Scn *scn = NULL;
    while ((scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) == NULL || sh.sh_type != SHT_NOTE)
            continue;
        Elf_Data *data = elf_getdata(scn, NULL);
        if (data == NULL)
            continue;
        size_t off = 0, name_off, desc_off;
        GElf_Nhdr nh;
        while ((off = gelf_getnote(data, off, &nh, &name_off, &desc_off)) > 0) {
            const char *name = (const char *)data->d_buf + name_off;
            const char *desc = (const char *)data->d_buf + desc_off;
            if (probes && nh.n_type == NT_STAPSDT && nh.n_namesz == 8 &&
                memcmp(name, "stapsdt", 8) == 0)
                note_probe(desc, nh.n_descsz, probes);
            else if (build_id && nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
                     memcmp(name, "GNU", 4) == 0 && 2 * nh.n_descsz < build_id_size) {
                for (size_t i = 0; i < nh.n_descsz; i++)
                    snprintf(build_id + 2 * i, 3, "%02x", (unsigned char)desc[i]);
            }
        }
    }
}

unsigned dd_prof_elf_probes(const char *path, int fd)
{
    int own = -1;
    if (fd < 0 && (fd = own = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return 0;
    unsigned has = 0;
    Elf *elf = open_elf(fd);
    if (elf) {
        read_notes(elf, &has, NULL, 0);
        elf_end(elf);
    }
    if (own >= 0)
        close(own);
    return has;
}

/* The link-time address of file offset 0, from the first PT_LOAD segment
 * (the one that maps offset 0): a load's run-time minus link-time address
 * is its address of offset 0 minus this. */
static uint64_t link_base_of(Elf *elf)
{
    size_t n;
    if (elf_getphdrnum(elf, &n) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD) {
            uint64_t align = ph.p_align ? ph.p_align : 1;
            return (ph.p_vaddr & ~(align - 1)) - (ph.p_offset & ~(align - 1));
        }
    }
    return 0;
}

/* The files seen in the run (objects.h), each once; they live until the
 * end (dd_prof_files_free). */
static struct dd_prof_file **files;
static size_t nfiles, files_cap;
static size_t nopen;           /* files with a descriptor open */
static uint64_t use_clock;
static void (*release_built_on)(struct dd_prof_file *f, bool for_good);
static uint64_t generation;

uint64_t dd_prof_files_generation(void)
{
    return generation;
}

void dd_prof_files_on_close(void (*release)(struct dd_prof_file *f, bool for_good))
{
    release_built_on = release;
}

unsigned dd_prof_fd_budget(void)
{
    struct rlimit rl;
    uint64_t n = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        n = rl.rlim_cur;
    if (n > 65536)
        n = 65536;
    return n < 64 ? 16 : (unsigned)n;
}

/* Files with a descriptor at once: each may also have its symbolisation
 * session's (libdwfl keeps one of its own), so two descriptors each, in a
 * quarter of the budget. */
static size_t max_open_files(void)
{
    size_t n = dd_prof_fd_budget() / 8;
    return n < 4 ? 4 : n;
}

void dd_prof_file_failed(struct dd_prof_file *f, const char *what, const char *why)
{
    if (f->why[0] == '\0')
        snprintf(f->why, sizeof f->why, "%s: %s", what, why);
}

static void close_file(struct dd_prof_file *f, bool for_good)
{
    if (release_built_on)
        release_built_on(f, for_good);
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
        nopen--;
    }
}

/* Room for one more descriptor: the least recently used file is closed
 * if the bound is reached. */
static void make_room(void)
{
    while (nopen >= max_open_files()) {
        struct dd_prof_file *lru = NULL;
        for (size_t i = 0; i < nfiles; i++)
            if (files[i]->fd >= 0 && (!lru || files[i]->last_use < lru->last_use))
                lru = files[i];
        if (lru == NULL)
            return;
        close_file(lru, false);
    }
}

static void opened(struct dd_prof_file *f, int fd)
{
    f->fd = fd;
    f->last_use = ++use_clock;
    nopen++;
}

/* Reopens a file the bound closed: by its path, if that is still the same
 * file (device and inode). */
static int reopen(struct dd_prof_file *f)
{
    make_room();
    int fd = open(f->path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_ino != f->ino)) {
        close(fd);
        fd = -1;
        errno = ESTALE;
    }
    if (fd < 0) {
        dd_prof_file_failed(f, "closed to stay within the descriptor limit, then cannot be "
                               "reopened by its path", strerror(errno));
        return -1;
    }
    opened(f, fd);
    return fd;
}

int dd_prof_file_fd(struct dd_prof_file *f)
{
    if (f->fd >= 0) {
        f->last_use = ++use_clock;
        return f->fd;
    }
    return f->elf ? reopen(f) : -1;
}

size_t dd_prof_files_count(void)
{
    return nfiles;
}

static int open_mapped(pid_t pid, const char *path, uint64_t start, uint64_t end)
{
    /* map_files reaches the very file that is mapped, even if it was
     * deleted or replaced since; the path under the process's root (its
     * mount namespace) is the fallback. */
    char link[PATH_MAX + 64];
    make_room();
    snprintf(link, sizeof link, "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, (int)pid, start, end);
    int fd = open(link, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int first = errno;
        snprintf(link, sizeof link, "/proc/%d/root%s", (int)pid, path);
        fd = open(link, O_RDONLY | O_CLOEXEC);
        if (fd < 0 && (first == EMFILE || first == ENFILE))
            errno = first; /* the reason that matters */
    }
    return fd;
}

/* Reads what the file's ELF headers say, once. */
static void read_file(struct dd_prof_file *f, int fd)
{
    Elf *elf = open_elf(fd);
    if (elf == NULL) {
        f->not_elf = true; /* a mapped data file */
        close(fd);
        return;
    }
    f->elf = true;
    f->link_base = link_base_of(elf);
    read_notes(elf, &f->probes, f->build_id, sizeof f->build_id);
    elf_end(elf);
    opened(f, fd);
}

/* The file of this mapping, added and read if new; opened again through
 * this process if an earlier open failed for want of descriptors. NULL
 * when out of memory. */
static struct dd_prof_file *file_of(pid_t pid, const char *path, uint64_t dev, uint64_t ino,
                                    uint64_t start, uint64_t end)
{
    struct dd_prof_file *f = NULL;
    for (size_t i = 0; i < nfiles && f == NULL; i++)
        if (files[i]->dev == dev && files[i]->ino == ino)
            f = files[i];
    if (f == NULL) {
        if (dd_prof_grow(&files, &files_cap, nfiles + 1, sizeof *files) != 0)
            return NULL;
        f = calloc(1, sizeof *f);
        if (f == NULL || (f->path = strdup(path)) == NULL) {
            free(f);
            return NULL;
        }
        f->dev = dev;
        f->ino = ino;
        f->fd = -1;
        files[nfiles++] = f;
    }
    if (!f->elf && !f->not_elf) {
        int fd = open_mapped(pid, path, start, end);
        if (fd >= 0) {
            read_file(f, fd);
            /* A session made while it could not be opened names nothing. */
            if (f->elf && release_built_on)
                release_built_on(f, true);
            if (f->elf && f->why[0] != '\0')
                generation++;
        } else {
            dd_prof_file_failed(f, "cannot open", strerror(errno));
        }
    }
    return f;
}

unsigned dd_prof_files_report(FILE *out)
{
    unsigned failed = 0;
    for (size_t i = 0; i < nfiles; i++) {
        const struct dd_prof_file *f = files[i];
        if (f->why[0] == '\0' || (f->unnamed_frames == 0 && f->cut_stacks == 0 && f->elf))
            continue;
        failed++;
        fprintf(out, "ddheap-prof: could not read %s (%s): %" PRIu64 " distinct frames left "
                     "unnamed, %" PRIu64 " stacks whose unwinding ended there\n",
                f->path, f->why, f->unnamed_frames, f->cut_stacks);
    }
    return failed;
}

void dd_prof_files_free(void)
{
    for (size_t i = 0; i < nfiles; i++) {
        close_file(files[i], true);
        free(files[i]->path);
        free(files[i]);
    }
    free(files);
    files = NULL;
    nfiles = files_cap = nopen = 0;
}

static struct dd_prof_object *find_load(struct dd_prof_objects *objs, uint64_t dev, uint64_t ino,
                                        uint64_t at)
{
    struct dd_prof_object *best = NULL;
    for (size_t i = 0; i < objs->n; i++) {
        struct dd_prof_object *o = &objs->v[i];
        if (o->dev == dev && o->ino == ino && o->base <= at && (!best || o->base > best->base))
            best = o;
    }
    return best;
}

static struct dd_prof_object *add_object(struct dd_prof_objects *objs, pid_t pid, const char *path,
                                         uint64_t dev, uint64_t ino, uint64_t start, uint64_t end)
{
    struct dd_prof_file *f = file_of(pid, path, dev, ino, start, end);
    /* A mapped data file is no object; one that could not be opened is
     * kept (its frames are named object+offset, and counted). */
    if (f == NULL || f->not_elf)
        return NULL;
    if (dd_prof_grow(&objs->v, &objs->cap, objs->n + 1, sizeof *objs->v) != 0)
        return NULL;
    struct dd_prof_object *o = &objs->v[objs->n];
    memset(o, 0, sizeof *o);
    o->path = strdup(path);
    if (o->path == NULL)
        return NULL;
    o->dev = dev;
    o->ino = ino;
    o->base = o->lo = o->map_start = start;
    o->hi = o->map_end = end;
    o->file = f;
    o->bias = start - f->link_base;
    o->probes = f->probes;
    o->build_id = f->build_id;
    objs->n++;
    return o;
}

bool dd_prof_parse_maps_line(char *line, struct dd_prof_mapping *m)
{
    unsigned major, minor;
    int path_at = 0;
    if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64 " %n", &m->start,
               &m->end, m->perms, &m->offset, &major, &minor, &m->ino, &path_at) < 7 ||
        path_at == 0 || m->ino == 0 || line[path_at] != '/')
        return false;
    m->path = line + path_at;
    m->path[strcspn(m->path, "\n")] = '\0';
    m->dev = makedev(major, minor);
    return true;
}

int dd_prof_objects_scan(struct dd_prof_objects *objs, pid_t pid)
{
    char name[64];
    snprintf(name, sizeof name, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(name, "re");
    if (f == NULL)
        return -1;
    int added = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        struct dd_prof_mapping m;
        if (!dd_prof_parse_maps_line(line, &m))
            continue;
        uint64_t start = m.start, end = m.end, offset = m.offset, dev = m.dev, ino = m.ino;
        const char *perms = m.perms, *path = m.path;
        struct dd_prof_object *o = find_load(objs, dev, ino, start);
        if (offset == 0 && (o == NULL || o->base != start)) {
            /* A new load (a later one of the same file: dlopen again). */
            if ((o = add_object(objs, pid, path, dev, ino, start, end)) == NULL)
                continue;
            added++;
        }
        if (o == NULL)
            continue;
        if (start < o->lo)
            o->lo = start;
        if (end > o->hi)
            o->hi = end;
        if (strchr(perms, 'x') && o->exec_end == 0) {
            o->exec_start = start;
            o->exec_end = end;
            o->exec_offset = offset;
        }
    }
    free(line);
    fclose(f);
    return added;
}

const struct dd_prof_object *dd_prof_objects_find(const struct dd_prof_objects *objs,
                                                  uint64_t addr)
{
    for (size_t i = objs->n; i-- > 0;)
        if (objs->v[i].lo <= addr && addr < objs->v[i].hi)
            return &objs->v[i];
    return NULL;
}

void dd_prof_objects_free(struct dd_prof_objects *objs)
{
    for (size_t i = 0; i < objs->n; i++)
        free(objs->v[i].path);
    free(objs->v);
    memset(objs, 0, sizeof *objs);
}

int dd_prof_objects_copy(struct dd_prof_objects *dst, const struct dd_prof_objects *src)
{
    memset(dst, 0, sizeof *dst);
    if (src->n == 0)
        return 0;
    dst->v = malloc(src->n * sizeof *dst->v);
    if (dst->v == NULL)
        return -1;
    dst->cap = src->n;
    for (size_t i = 0; i < src->n; i++) {
        struct dd_prof_object *o = &dst->v[dst->n];
        *o = src->v[i];
        o->path = strdup(src->v[i].path);
        if (o->path == NULL)
            return -1;
        dst->n++;
    }
    return 0;
}

/* The symbols of names[] found in the table of type sh_type (SHT_DYNSYM,
 * SHT_SYMTAB) into out[] (those not found are left as they are). */
static void find_symbols(Elf *elf, unsigned sh_type, const char *const *names, size_t n,
                         struct dd_prof_elf_symbol *out)
{
    Elf_Scn *scn = NULL;
    while ((scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) == NULL || sh.sh_type != sh_type || sh.sh_entsize == 0)
            continue;
        Elf_Data *data = elf_getdata(scn, NULL);
        for (size_t i = 0; data && i < sh.sh_size / sh.sh_entsize; i++) {
            GElf_Sym sym;
            const char *name;
            if (!gelf_getsym(data, (int)i, &sym) || sym.st_value == 0 ||
                (name = elf_strptr(elf, sh.sh_link, sym.st_name)) == NULL)
                continue;
            for (size_t k = 0; k < n; k++)
                if (out[k].value == 0 && strcmp(name, names[k]) == 0)
                    out[k] = (struct dd_prof_elf_symbol){sym.st_value, sym.st_size};
        }
    }
}

/* The dynamic symbol's value, or 0. */
static uint64_t dynamic_symbol(Elf *elf, const char *want)
{
    struct dd_prof_elf_symbol sym = {0, 0};
    find_symbols(elf, SHT_DYNSYM, &want, 1, &sym);
    return sym.value;
}

bool dd_prof_elf_symbols(int fd, const char *const *names, size_t n,
                         struct dd_prof_elf_symbol *out)
{
    memset(out, 0, n * sizeof *out);
    Elf *elf = open_elf(fd);
    if (elf == NULL)
        return false;
    find_symbols(elf, SHT_DYNSYM, names, n, out);
    find_symbols(elf, SHT_SYMTAB, names, n, out);
    elf_end(elf);
    return true;
}

bool dd_prof_elf_read(int fd, uint64_t vaddr, void *buf, size_t len)
{
    Elf *elf = open_elf(fd);
    size_t n;
    bool done = false;
    if (elf && elf_getphdrnum(elf, &n) == 0) {
        for (size_t i = 0; i < n && !done; i++) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD && ph.p_vaddr <= vaddr &&
                vaddr - ph.p_vaddr + len <= ph.p_filesz)
                done = pread(fd, buf, len, (off_t)(ph.p_offset + (vaddr - ph.p_vaddr))) ==
                       (ssize_t)len;
        }
    }
    if (elf)
        elf_end(elf);
    return done;
}

uint64_t dd_prof_elf_dynamic_symbol(int fd, const char *name)
{
    Elf *elf = open_elf(fd);
    if (elf == NULL)
        return 0;
    uint64_t value = dynamic_symbol(elf, name);
    elf_end(elf);
    return value;
}

bool dd_prof_elf_loader_hook(int fd, uint64_t *offset, int64_t *to_state)
{
    Elf *elf = open_elf(fd);
    if (elf == NULL)
        return false;
    uint64_t hook = dynamic_symbol(elf, "_dl_debug_state");
    uint64_t r_debug = hook ? dynamic_symbol(elf, "_r_debug") : 0;
    bool found = false;
    size_t n;
    if (r_debug && elf_getphdrnum(elf, &n) == 0) {
        for (size_t i = 0; i < n && !found; i++) {
            GElf_Phdr ph;
            if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD &&
                (ph.p_flags & PF_X) && ph.p_vaddr <= hook && hook < ph.p_vaddr + ph.p_filesz) {
                *offset = hook - ph.p_vaddr + ph.p_offset;
                *to_state = (int64_t)(r_debug + DD_PROF_R_STATE_OFFSET) - (int64_t)hook;
                found = true;
            }
        }
    }
    elf_end(elf);
    return found;
}

/*
 * libdwfl-based symbolisation (symbolize.h). One Dwfl session per file
 * (objects.h: device and inode), shared by every process and every load
 * that maps it: its module is reported at its link-time addresses, and an
 * address is looked up there after taking off the load's bias. So a
 * library that was unloaded and another loaded at the same addresses
 * cannot collide, the object of an address is chosen by our own mapping
 * record, not by dwfl, and a forking server's thousand copies of libc
 * cost one session. Each session remembers what it said of every address
 * (the same stacks come from every worker), in strings of its own: when
 * the descriptor bound closes the file, its libdwfl state goes and what it
 * learnt stays (a server with more files than the bound holds would
 * otherwise parse them again and again).
 */
#include "symbolize.h"

#include "grow.h"
#include "interp.h"
#include "intern.h"
#include "unwind.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* What one address of a file resolved to (object left NULL). */
struct memo {
    uint64_t at; /* link-time address + 1; 0: empty slot */
    struct dd_prof_frame frame;
};

/* A file's symbolisation: its libdwfl state, opened at the first address
 * not remembered and closed when the file's descriptor is (the bound),
 * and what it resolved, which outlives that (its strings are copies). */
struct file_session {
    Dwfl *dwfl;
    Dwfl_Module *mod; /* NULL if the file could not be read */
    bool opened;      /* dwfl opened (or tried) since the last close */
    char **names; /* strings made here ("lib.so+0x..."), freed with the session */
    size_t nnames, names_cap;
    struct dd_prof_strings kept; /* every string of the remembered frames */
    struct memo *memo;
    size_t nmemo, memo_cap;
};

struct dd_prof_symbolizer {
    const struct dd_prof_objects *objs;
};

/* Addresses resolved (not found remembered), [1] while the run went on
 * (dd_prof_symbolize_ahead, from the reader's loop), [0] when a report
 * asked. */
static struct {
    bool ahead;
    uint64_t resolved[2];
    double longest_ms; /* the longest stack named ahead */
} naming;

static char *debuginfo_path;
static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &debuginfo_path,
};

const Dwfl_Callbacks *dd_prof_dwfl_callbacks(void)
{
    return &callbacks;
}

struct dd_prof_symbolizer *dd_prof_symbolizer_new(const struct dd_prof_objects *objs)
{
    struct dd_prof_symbolizer *s = calloc(1, sizeof *s);
    if (s != NULL)
        s->objs = objs;
    return s;
}

static void close_dwfl(struct file_session *fs)
{
    if (fs->dwfl)
        dwfl_end(fs->dwfl);
    fs->dwfl = NULL;
    fs->mod = NULL;
    fs->opened = false;
}

static void release_session(struct dd_prof_file *f, bool for_good)
{
    struct file_session *fs = f->sym;
    if (fs == NULL)
        return;
    close_dwfl(fs);
    if (!for_good)
        return;
    for (size_t i = 0; i < fs->nnames; i++)
        free(fs->names[i]);
    free(fs->names);
    dd_prof_strings_free(&fs->kept);
    free(fs->memo);
    free(fs);
    f->sym = NULL;
}

/* The file's session (what it remembers); NULL only when out of memory. */
static struct file_session *session_of(struct dd_prof_file *f)
{
    if (f->sym == NULL) {
        dd_prof_files_on_close(release_session);
        f->sym = calloc(1, sizeof(struct file_session));
    }
    return f->sym;
}

/* The file's module, its libdwfl state opened if it is not (NULL if the
 * file cannot be read as ELF: the reason is recorded with the file). */
static Dwfl_Module *module_of(struct dd_prof_file *f, struct file_session *fs)
{
    if (fs->opened)
        return fs->mod;
    fs->opened = true;
    int fd = dd_prof_file_fd(f);
    if (fd < 0)
        return NULL;
    fs->dwfl = dwfl_begin(&callbacks);
    /* dwfl owns the descriptor it is given: a copy, so the file keeps
     * its own. */
    int copy = fs->dwfl ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (copy < 0) {
        dd_prof_file_failed(f, "cannot open a symbolisation session", strerror(errno));
        return NULL;
    }
    dwfl_report_begin(fs->dwfl);
    /* Base 0, add_p_vaddr: the module is at its link-time addresses. */
    fs->mod = dwfl_report_elf(fs->dwfl, f->path, f->path, copy, 0, true);
    dwfl_report_end(fs->dwfl, NULL, NULL);
    if (fs->mod == NULL) {
        dd_prof_file_failed(f, "libdwfl cannot read it", dwfl_errmsg(-1));
        close(copy);
    }
    return fs->mod;
}

/* A copy of str that lives as long as the session; NULL stays NULL. */
static const char *kept(struct file_session *fs, const char *str)
{
    if (str == NULL)
        return NULL;
    long i = dd_prof_strings_intern(&fs->kept, str);
    return i < 0 ? "[unknown]" : fs->kept.v[i];
}

static const char *keep_name(struct file_session *s, char *name)
{
    if (name == NULL)
        return "[unknown]";
    if (dd_prof_grow(&s->names, &s->names_cap, s->nnames + 1, sizeof *s->names) != 0) {
        free(name);
        return "[unknown]";
    }
    s->names[s->nnames++] = name;
    return name;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The name of an inlined function as a symbol would have it: its linkage
 * (mangled) name where DWARF has one (C++), so that it demangles to the
 * same qualified name as a call of it that was not inlined. */
static const char *scope_name(Dwarf_Die *scope)
{
    Dwarf_Attribute attr;
    const char *name = dwarf_formstring(dwarf_attr_integrate(scope, DW_AT_linkage_name, &attr));
    if (name == NULL)
        name = dwarf_formstring(dwarf_attr_integrate(scope, DW_AT_MIPS_linkage_name, &attr));
    if (name == NULL)
        name = dwarf_diename(scope);
    return name ? name : "[inlined]";
}

/* A symbol's name without its version ("__libc_start_main@@GLIBC_2.34"),
 * kept until the symbolizer is freed. */
static const char *unversioned(struct file_session *s, const char *name)
{
    const char *at = strchr(name, '@');
    if (at == NULL || at == name)
        return name;
    return keep_name(s, strndup(name, (size_t)(at - name)));
}

/* The inlined calls at `at`, innermost first, into out->fn[0..] (names
 * and call lines), ahead of the real function, which the caller puts
 * last. Returns how many were added. */
static unsigned inlined_at(Dwfl_Module *mod, Dwarf_Addr at, struct dd_prof_frame *out)
{
    Dwarf_Addr bias;
    Dwarf_Die *cu = dwfl_module_addrdie(mod, at, &bias);
    Dwarf_Die *scopes = NULL;
    int n = cu ? dwarf_getscopes(cu, at - bias, &scopes) : 0;
    Dwarf_Files *files = NULL;
    size_t nfiles = 0;
    if (n > 0 && dwarf_getsrcfiles(cu, &files, &nfiles) != 0)
        files = NULL;
    unsigned k = 0;
    /* Each inlined subroutine scope is one inlined call; its call line
     * is where the next function out (the one it was inlined into) is. */
    for (int i = 0; i < n && k + 1 < DD_PROF_MAX_INLINE; i++) {
        if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine)
            continue;
        out->fn[k].function = scope_name(&scopes[i]);
        Dwarf_Attribute attr;
        Dwarf_Word file = 0, line = 0;
        dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_file, &attr), &file);
        dwarf_formudata(dwarf_attr(&scopes[i], DW_AT_call_line, &attr), &line);
        /* The caller's position, filled into the next entry. */
        out->fn[k + 1].file = files && file < nfiles ? dwarf_filesrc(files, file, NULL, NULL) : NULL;
        out->fn[k + 1].line = (int)line;
        k++;
    }
    free(scopes);
    return k;
}

/* The frame of link-time address at in the file, from its session. */
static void resolve(struct dd_prof_file *f, struct file_session *fs, uint64_t at,
                    struct dd_prof_frame *out)
{
    Dwfl_Module *mod = module_of(f, fs);
    unsigned k = mod ? inlined_at(mod, at, out) : 0;
    out->n = k + 1;
    /* The code at the address: its own line, whichever function it is. */
    Dwfl_Line *line = mod ? dwfl_module_getsrc(mod, at) : NULL;
    if (line) {
        int lineno = 0;
        const char *file = dwfl_lineinfo(line, NULL, &lineno, NULL, NULL, NULL);
        if (file) {
            out->fn[0].file = file;
            out->fn[0].line = lineno;
        }
    } else {
        out->fn[0].file = NULL;
    }
    const char *name = mod ? dwfl_module_addrname(mod, at) : NULL;
    if (name != NULL)
        name = unversioned(fs, name);
    if (name == NULL) {
        if (mod == NULL)
            f->unnamed_frames++;
        char *made = NULL;
        if (asprintf(&made, "%s+0x%" PRIx64, base_name(f->path), at) < 0)
            made = NULL;
        name = keep_name(fs, made);
    }
    out->fn[k].function = name;
    /* Remembered beyond the libdwfl state the strings come from. */
    for (unsigned i = 0; i < out->n; i++) {
        out->fn[i].function = kept(fs, out->fn[i].function);
        out->fn[i].file = kept(fs, out->fn[i].file);
    }
}

/* The remembered frame of at, or the empty slot where it goes (the table
 * grown first if need be); NULL when out of memory. */
static struct memo *memo_slot(struct file_session *fs, uint64_t at)
{
    if (2 * (fs->nmemo + 1) > fs->memo_cap) {
        size_t cap = fs->memo_cap ? 2 * fs->memo_cap : 256;
        struct memo *v = calloc(cap, sizeof *v);
        if (v == NULL)
            return NULL;
        for (size_t i = 0; i < fs->memo_cap; i++) {
            if (fs->memo[i].at == 0)
                continue;
            size_t j = (fs->memo[i].at * 0x9e3779b97f4a7c15ull >> 20) & (cap - 1);
            while (v[j].at != 0)
                j = (j + 1) & (cap - 1);
            v[j] = fs->memo[i];
        }
        free(fs->memo);
        fs->memo = v;
        fs->memo_cap = cap;
    }
    size_t mask = fs->memo_cap - 1, j = ((at + 1) * 0x9e3779b97f4a7c15ull >> 20) & mask;
    while (fs->memo[j].at != 0 && fs->memo[j].at != at + 1)
        j = (j + 1) & mask;
    return &fs->memo[j];
}

void dd_prof_symbolize(struct dd_prof_symbolizer *s, uint64_t addr, bool return_address,
                       struct dd_prof_frame *out)
{
    memset(out, 0, sizeof *out);
    out->n = 1;
    out->fn[0].function = "[unknown]";
    if (addr == DD_PROF_TRUNCATED_FRAME) {
        /* The unwinder's mark: the stack goes on, its copy did not. */
        out->fn[0].function = "[truncated]";
        return;
    }
    const struct dd_prof_object *o = dd_prof_objects_find(s->objs, addr);
    if (o == NULL)
        return;
    uint64_t at = (return_address && addr > 0 ? addr - 1 : addr) - o->bias;
    struct file_session *fs = session_of(o->file);
    struct memo *m = fs ? memo_slot(fs, at) : NULL;
    if (m == NULL) {
        out->object = o;
        return;
    }
    if (m->at == 0) {
        naming.resolved[naming.ahead]++;
        resolve(o->file, fs, at, &m->frame);
        m->at = at + 1;
        fs->nmemo++;
    }
    *out = m->frame;
    out->object = o;
}

void dd_prof_symbolizer_free(struct dd_prof_symbolizer *s)
{
    free(s);
}

void dd_prof_symbolize_ahead(const struct dd_prof_objects *objs, const uint64_t *frames,
                             uint32_t n)
{
    struct dd_prof_symbolizer s = {objs};
    struct dd_prof_frame ignored;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    naming.ahead = true;
    for (uint32_t k = 0; k < n; k++) {
        if (!dd_prof_interp_is_frame(frames[k]))
            dd_prof_symbolize(&s, frames[k], k > 0, &ignored);
    }
    naming.ahead = false;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    if (ms > naming.longest_ms)
        naming.longest_ms = ms;
}

void dd_prof_symbolize_counts(uint64_t *ahead, uint64_t *later, double *longest_ms)
{
    *ahead = naming.resolved[1];
    *later = naming.resolved[0];
    *longest_ms = naming.longest_ms;
}

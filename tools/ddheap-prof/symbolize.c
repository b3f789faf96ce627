/*
 * libdwfl-based symbolisation (symbolize.h). One Dwfl session per object,
 * each module reported at the load bias recorded for it: a library that
 * was unloaded and another loaded at the same addresses cannot collide in
 * one session, and the object of an address is chosen by our own mapping
 * record, not by dwfl.
 */
#include "symbolize.h"

#include "unwind.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct module {
    Dwfl *dwfl;
    Dwfl_Module *mod;
};

struct dd_prof_symbolizer {
    const struct dd_prof_objects *objs;
    struct module *mods; /* parallel to objs->v; opened on first use */
    bool *tried;
    char **names; /* strings made here ("lib.so+0x..."), freed at the end */
    size_t nnames, names_cap;
};

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
    if (s == NULL)
        return NULL;
    s->objs = objs;
    s->mods = calloc(objs->n ? objs->n : 1, sizeof *s->mods);
    s->tried = calloc(objs->n ? objs->n : 1, sizeof *s->tried);
    if (s->mods == NULL || s->tried == NULL) {
        dd_prof_symbolizer_free(s);
        return NULL;
    }
    return s;
}

/* The object's dwfl session, opened on first use; NULL if its file
 * cannot be read as ELF. */
static struct module *module_of(struct dd_prof_symbolizer *s, const struct dd_prof_object *o)
{
    size_t i = (size_t)(o - s->objs->v);
    if (s->tried[i])
        return s->mods[i].mod ? &s->mods[i] : NULL;
    s->tried[i] = true;
    Dwfl *dwfl = o->fd >= 0 ? dwfl_begin(&callbacks) : NULL;
    if (dwfl == NULL)
        return NULL;
    /* dwfl owns the descriptor it is given: a copy, so the object keeps
     * its own. */
    int fd = dup(o->fd);
    dwfl_report_begin(dwfl);
    /* add_p_vaddr: the module starts at bias + its first segment's
     * address, i.e. where it was really mapped. */
    Dwfl_Module *mod = fd >= 0 ? dwfl_report_elf(dwfl, o->path, o->path, fd, o->bias, true) : NULL;
    dwfl_report_end(dwfl, NULL, NULL);
    if (mod == NULL) {
        dwfl_end(dwfl);
        return NULL;
    }
    s->mods[i] = (struct module){dwfl, mod};
    return &s->mods[i];
}

static const char *keep_name(struct dd_prof_symbolizer *s, char *name)
{
    if (name == NULL)
        return "[unknown]";
    if (s->nnames == s->names_cap) {
        size_t cap = s->names_cap ? 2 * s->names_cap : 64;
        char **v = realloc(s->names, cap * sizeof *v);
        if (v == NULL) {
            free(name);
            return "[unknown]";
        }
        s->names = v;
        s->names_cap = cap;
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
static const char *unversioned(struct dd_prof_symbolizer *s, const char *name)
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
    out->object = o;
    if (o == NULL)
        return;
    uint64_t at = return_address && addr > 0 ? addr - 1 : addr;
    struct module *m = module_of(s, o);
    unsigned k = m ? inlined_at(m->mod, at, out) : 0;
    out->n = k + 1;
    /* The code at the address: its own line, whichever function it is. */
    Dwfl_Line *line = m ? dwfl_module_getsrc(m->mod, at) : NULL;
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
    const char *name = m ? dwfl_module_addrname(m->mod, at) : NULL;
    if (name != NULL)
        name = unversioned(s, name);
    if (name == NULL) {
        char *made = NULL;
        if (asprintf(&made, "%s+0x%" PRIx64, base_name(o->path), at - o->bias) < 0)
            made = NULL;
        name = keep_name(s, made);
    }
    out->fn[k].function = name;
}

void dd_prof_symbolizer_free(struct dd_prof_symbolizer *s)
{
    if (s == NULL)
        return;
    if (s->mods)
        for (size_t i = 0; i < s->objs->n; i++)
            if (s->mods[i].dwfl)
                dwfl_end(s->mods[i].dwfl);
    for (size_t i = 0; i < s->nnames; i++)
        free(s->names[i]);
    free(s->names);
    free(s->mods);
    free(s->tried);
    free(s);
}

/*
 * CPython, user side (python.h): which object of a process is the
 * interpreter and where its frames are (for the BPF walk, python.bpf.h),
 * and the names of the code objects that walk records.
 *
 * The layouts: 3.13 publishes its own, _Py_DebugOffsets at the start of
 * _PyRuntime (initialised data: read from the file); 3.10-3.12 do not,
 * and have one table each below (read off the DWARF of CPython builds of
 * each minor version: the offsets do not change within one). Whichever it
 * is, once the process runs Python it is checked against the member table
 * of PyCode_Type in the process (the offsets of co_filename and the
 * others as the interpreter itself declares them to Python code).
 *
 * A code object is named by reading it in the process when its first
 * record arrives (qualified name, file, line table), remembered per
 * (address, fingerprint): the fingerprint the BPF side took is compared
 * with what is read, so a code object freed since, its address reused,
 * is never given the new one's name: it is "<unknown>", at its first line.
 */
#include "python.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <unistd.h>

#include <elfutils/libdw.h>
#include <libelf.h>

#define NONE DD_PROF_PY_NONE

/* What naming reads besides what the BPF walk does. */
struct names_layout {
    uint16_t code_filename, code_qualname;
    uint16_t ascii_size;   /* sizeof(PyASCIIObject): a compact ASCII string's characters follow */
    uint16_t compact_size; /* sizeof(PyCompactUnicodeObject): other compact strings' */
    uint16_t utf8;         /* PyCompactUnicodeObject.utf8 (utf8_length the word before) */
};

struct version_layout {
    uint32_t version;
    struct dd_prof_py_layout walk;
    struct names_layout names;
};

/* 3.10 has no qualified name in its code objects: co_name is taken. */
static const struct version_layout layouts[] = {
    {0x030a0000,
     {.runtime_interp_head = 0x20, .interp_threads_head = 0x08, .tstate_next = 0x08,
      .tstate_thread = 0xb0, .tstate_frame = 0x18, .cframe_frame = NONE, .frame_code = 0x20,
      .frame_previous = 0x18, .frame_instr = 0x60, .frame_entry = NONE, .frame_owner = NONE,
      .code_argcount = 0x10, .code_firstlineno = 0x28, .code_name = 0x70,
      .code_linetable = 0x78, .code_adaptive = 0, .thread_is_pthread = 1, .instr_is_index = 1,
      .every_frame_entry = 1},
     {.code_filename = 0x68, .code_qualname = 0x70, .ascii_size = 0x30, .compact_size = 0x48,
      .utf8 = 0x38}},
    {0x030b0000,
     {.runtime_interp_head = 0x28, .interp_threads_head = 0x10, .tstate_next = 0x08,
      .tstate_thread = 0xa0, .tstate_frame = 0x38, .cframe_frame = 0x08, .frame_code = 0x20,
      .frame_previous = 0x30, .frame_instr = 0x38, .frame_entry = 0x44, .frame_owner = 0x45,
      .code_argcount = 0x38, .code_firstlineno = 0x48, .code_name = 0x80,
      .code_linetable = 0x88, .code_adaptive = 0xb8},
     {.code_filename = 0x70, .code_qualname = 0x80, .ascii_size = 0x30, .compact_size = 0x48,
      .utf8 = 0x38}},
    {0x030c0000,
     {.runtime_interp_head = 0x28, .interp_threads_head = 0x48, .tstate_next = 0x08,
      .tstate_thread = 0x90, .tstate_frame = 0x38, .cframe_frame = 0x00, .frame_code = 0x00,
      .frame_previous = 0x08, .frame_instr = 0x38, .frame_entry = NONE, .frame_owner = 0x46,
      .code_argcount = 0x34, .code_firstlineno = 0x44, .code_name = 0x80,
      .code_linetable = 0x88, .code_adaptive = 0xc0},
     {.code_filename = 0x70, .code_qualname = 0x80, .ascii_size = 0x28, .compact_size = 0x38,
      .utf8 = 0x30}},
};

/* 3.12's strings are 3.13's (no _Py_DebugOffsets entry for the UTF-8 copy). */
static const struct names_layout strings_312 = {0, 0, 0x28, 0x38, 0x30};

struct code_entry {
    uint64_t code; /* 0: empty slot */
    uint32_t check, firstline;
    char *qualname, *filename; /* qualname NULL: not a code object we could read */
    uint8_t *linetable;
    size_t linetable_len;
};

struct py_state {
    struct dd_prof_py_layout walk;
    struct names_layout names;
    uint64_t eval_lo, eval_hi, cold_lo, cold_hi;
    struct code_entry *cache; /* open addressing, cap a power of two */
    size_t n, cap;
};

static bool read_mem(pid_t pid, uint64_t addr, void *buf, size_t len)
{
    struct iovec local = {buf, len}, remote = {(void *)addr, len};
    return addr != 0 && process_vm_readv(pid, &local, 1, &remote, 1, 0) == (ssize_t)len;
}

static uint64_t u64_at(const uint8_t *b, size_t off)
{
    uint64_t v;
    memcpy(&v, b + off, sizeof v);
    return v;
}

static uint32_t u32_at(const uint8_t *b, size_t off)
{
    uint32_t v;
    memcpy(&v, b + off, sizeof v);
    return v;
}

/* 3.13's layout from its _Py_DebugOffsets (the field positions of 3.13's
 * struct, which 3.14 changes: only 3.13 is read this way). */
static bool from_debug_offsets(int fd, uint64_t runtime, uint32_t version,
                               struct version_layout *out)
{
    uint8_t d[360];
    if (!dd_prof_elf_read(fd, runtime, d, sizeof d) || memcmp(d, "xdebugpy", 8) != 0 ||
        (u64_at(d, 8) & 0xffff0000) != version || version != 0x030d0000)
        return false;
    *out = (struct version_layout){
        .version = version,
        .walk = {.runtime_interp_head = (uint16_t)u64_at(d, 40),
                 .interp_threads_head = (uint16_t)u64_at(d, 72),
                 .tstate_next = (uint16_t)u64_at(d, 168),
                 .tstate_thread = (uint16_t)u64_at(d, 200), /* native_thread_id */
                 .tstate_frame = (uint16_t)u64_at(d, 184),
                 .cframe_frame = NONE,
                 .frame_previous = (uint16_t)u64_at(d, 232),
                 .frame_code = (uint16_t)u64_at(d, 240), /* f_executable */
                 .frame_instr = (uint16_t)u64_at(d, 248),
                 .frame_entry = NONE,
                 .frame_owner = (uint16_t)u64_at(d, 264),
                 .code_name = (uint16_t)u64_at(d, 296), /* co_qualname */
                 .code_linetable = (uint16_t)u64_at(d, 304),
                 .code_firstlineno = (uint16_t)u64_at(d, 312),
                 .code_argcount = (uint16_t)u64_at(d, 320),
                 .code_adaptive = (uint16_t)u64_at(d, 344)},
        .names = strings_312,
    };
    out->names.code_filename = (uint16_t)u64_at(d, 280);
    out->names.code_qualname = (uint16_t)u64_at(d, 296);
    return true;
}

/* Whether every field the walk reads is inside what it reads. */
static bool fits_reads(const struct version_layout *v)
{
    const struct dd_prof_py_layout *w = &v->walk;
    uint16_t frame[] = {w->frame_code, w->frame_previous, w->frame_instr};
    uint16_t frame_bytes[] = {w->frame_entry, w->frame_owner};
    uint16_t code[] = {w->code_argcount, w->code_firstlineno, w->code_name, w->code_linetable};
    for (size_t i = 0; i < sizeof frame / sizeof *frame; i++)
        if (frame[i] + 8 > DD_PROF_PY_FRAME_READ)
            return false;
    for (size_t i = 0; i < sizeof frame_bytes / sizeof *frame_bytes; i++)
        if (frame_bytes[i] != NONE && frame_bytes[i] >= DD_PROF_PY_FRAME_READ)
            return false;
    for (size_t i = 0; i < sizeof code / sizeof *code; i++)
        if (code[i] + 8 > DD_PROF_PY_CODE_READ)
            return false;
    return v->names.code_filename + 8 <= DD_PROF_PY_CODE_READ &&
           v->names.code_qualname + 8 <= DD_PROF_PY_CODE_READ;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* "python3.10", "libpython3.9.so.1.0": the version in a file's name, as
 * PY_VERSION_HEX's major and minor; 0 if none. */
static uint32_t version_in_name(const char *name)
{
    const char *at = strstr(name, "python3.");
    if (at == NULL)
        return 0;
    char *end;
    unsigned long minor = strtoul(at + strlen("python3."), &end, 10);
    if (end == at + strlen("python3.") || minor > 255)
        return 0;
    return 0x03000000u | (uint32_t)minor << 16;
}

/* (python.h) GCC moves the unlikely paths of a function to a part of its own
 * ("name.cold", in .text.unlikely), which has an FDE of its own and is
 * reached only by jumps from the hot part; the eval loop has hundreds of
 * them. The jumps are read without decoding instructions: every
 * "jmp rel32" (e9) and "jcc rel32" (0f 8x) byte pattern; patterns that
 * are not instructions point anywhere and do not gather in one FDE.
 * x86-64 only. */
void dd_prof_python_cold_part(int fd, uint64_t lo, uint64_t size, struct dd_prof_elf_symbol *out)
{
#if defined(__x86_64__)
    enum { MAX_RANGES = 64, MIN_JUMPS = 16 };
    uint8_t *code = size && size < (4u << 20) ? malloc(size) : NULL;
    Elf *elf = NULL;
    Dwarf_CFI *cfi = NULL;
    if (code == NULL || !dd_prof_elf_read(fd, lo, code, size) ||
        elf_version(EV_CURRENT) == EV_NONE ||
        (elf = elf_begin(fd, ELF_C_READ_MMAP, NULL)) == NULL ||
        (cfi = dwarf_getcfi_elf(elf)) == NULL)
        goto done;
    struct fde_jumps {
        uint64_t lo, hi;
        unsigned jumps;
    } r[MAX_RANGES];
    size_t nr = 0;
    unsigned outside = 0;
    for (uint64_t i = 0; i + 6 <= size; i++) {
        int32_t rel;
        uint64_t target;
        if (code[i] == 0x0f && (code[i + 1] & 0xf0) == 0x80) {
            memcpy(&rel, code + i + 2, sizeof rel);
            target = lo + i + 6 + (uint64_t)(int64_t)rel;
        } else if (code[i] == 0xe9) {
            memcpy(&rel, code + i + 1, sizeof rel);
            target = lo + i + 5 + (uint64_t)(int64_t)rel;
        } else {
            continue;
        }
        if (target >= lo && target < lo + size)
            continue;
        outside++;
        size_t k = 0;
        while (k < nr && !(target >= r[k].lo && target < r[k].hi))
            k++;
        if (k == nr) {
            Dwarf_Frame *frame;
            Dwarf_Addr start, end;
            if (nr == MAX_RANGES || dwarf_cfi_addrframe(cfi, target, &frame) != 0)
                continue;
            int ok = dwarf_frame_info(frame, &start, &end, NULL) >= 0;
            free(frame);
            if (!ok || end <= start)
                continue;
            r[nr++] = (struct fde_jumps){start, end, 0};
        }
        r[k].jumps++;
    }
    size_t best = nr;
    for (size_t k = 0; k < nr; k++)
        if (best == nr || r[k].jumps > r[best].jumps)
            best = k;
    if (best < nr && r[best].jumps >= MIN_JUMPS && 4 * r[best].jumps >= outside)
        *out = (struct dd_prof_elf_symbol){.value = r[best].lo, .size = r[best].hi - r[best].lo};
done:
    if (cfi)
        dwarf_cfi_end(cfi);
    if (elf)
        elf_end(elf);
    free(code);
#else
    (void)fd, (void)lo, (void)size, (void)out;
#endif
}

enum { SYM_RUNTIME, SYM_EVAL, SYM_EVAL_COLD, SYM_CODE_TYPE, SYM_VERSION, NSYMS };

static void *python_recognize(const struct dd_prof_object *o, pid_t pid,
                              struct dd_prof_interp_config *cfg, char *why, size_t why_len)
{
    (void)pid;
    static const char *const want[NSYMS] = {"_PyRuntime", "_PyEval_EvalFrameDefault",
                                            "_PyEval_EvalFrameDefault.cold", "PyCode_Type",
                                            "Py_Version"};
    struct dd_prof_elf_symbol sym[NSYMS];
    int fd = o->file ? dd_prof_file_fd(o->file) : -1;
    if (fd < 0 || !dd_prof_elf_symbols(fd, want, NSYMS, sym) ||
        sym[SYM_RUNTIME].value == 0 || sym[SYM_EVAL].value == 0 || sym[SYM_CODE_TYPE].value == 0)
        return NULL;
    /* Py_Version (3.11+) is the running interpreter's PY_VERSION_HEX;
     * before it, the version is in the file's name only. */
    uint32_t version = 0;
    if (sym[SYM_VERSION].value &&
        dd_prof_elf_read(fd, sym[SYM_VERSION].value, &version, sizeof version))
        version &= 0xffff0000;
    else
        version = version_in_name(base_name(o->path));
    struct version_layout v = {0};
    bool known = false;
    for (size_t i = 0; i < sizeof layouts / sizeof *layouts && !known; i++)
        if (layouts[i].version == version) {
            v = layouts[i];
            known = true;
        }
    if (!known)
        known = from_debug_offsets(fd, sym[SYM_RUNTIME].value, version, &v);
    if (!known || !fits_reads(&v)) {
        if (version)
            snprintf(why, why_len, "CPython %u.%u is not one ddheap-prof knows (3.10-3.13)",
                     version >> 24, (version >> 16) & 0xff);
        else
            snprintf(why, why_len, "a CPython whose version it cannot tell");
        return NULL;
    }
    struct py_state *st = calloc(1, sizeof *st);
    if (st == NULL)
        return NULL;
    st->walk = v.walk;
    st->names = v.names;
    st->walk.version = version;
    st->walk.runtime = o->bias + sym[SYM_RUNTIME].value;
    st->walk.code_type = o->bias + sym[SYM_CODE_TYPE].value;
    st->eval_lo = o->bias + sym[SYM_EVAL].value;
    st->eval_hi = st->eval_lo + sym[SYM_EVAL].size;
    /* The eval loop's cold part is a local symbol: in the file's own
     * symbol table if it kept one, else in its debug file if there is
     * one, else found from the jumps of the hot part. */
    if (sym[SYM_EVAL_COLD].value == 0 && o->build_id && o->build_id[0] && o->build_id[1]) {
        char path[300];
        snprintf(path, sizeof path, "/usr/lib/debug/.build-id/%.2s/%s.debug", o->build_id,
                 o->build_id + 2);
        int debug_fd = open(path, O_RDONLY | O_CLOEXEC);
        struct dd_prof_elf_symbol cold;
        const char *cold_name = want[SYM_EVAL_COLD];
        if (debug_fd >= 0 && dd_prof_elf_symbols(debug_fd, &cold_name, 1, &cold))
            sym[SYM_EVAL_COLD] = cold;
        if (debug_fd >= 0)
            close(debug_fd);
    }
    if (sym[SYM_EVAL_COLD].value == 0)
        dd_prof_python_cold_part(fd, sym[SYM_EVAL].value, sym[SYM_EVAL].size,
                                 &sym[SYM_EVAL_COLD]);
    if (sym[SYM_EVAL_COLD].value) {
        st->cold_lo = o->bias + sym[SYM_EVAL_COLD].value;
        st->cold_hi = st->cold_lo + sym[SYM_EVAL_COLD].size;
    }
    cfg->kind = DD_PROF_INTERP_PYTHON;
    cfg->python = st->walk;
    return st;
}

/* PyTypeObject's tp_basicsize and tp_members (the same in 3.10-3.13);
 * PyMemberDef's size, name and offset. */
#define TP_BASICSIZE 0x20
#define TP_MEMBERS 0xf0
#define MEMBER_SIZE 40
#define MEMBER_OFFSET 16

static bool python_verify(void *state, pid_t pid, char *why, size_t why_len)
{
    struct py_state *st = state;
    uint8_t type[TP_MEMBERS + 8];
    if (!read_mem(pid, st->walk.code_type, type, sizeof type)) {
        snprintf(why, why_len, "PyCode_Type cannot be read");
        return false;
    }
    const struct {
        const char *name;
        uint16_t offset;
        bool required;
    } expect[] = {
        {"co_argcount", st->walk.code_argcount, true},
        {"co_firstlineno", st->walk.code_firstlineno, true},
        {"co_filename", st->names.code_filename, true},
        {st->walk.version < 0x030b0000 ? "co_name" : "co_qualname", st->names.code_qualname, true},
        {"co_linetable", st->walk.code_linetable, false},
    };
    enum { NEXPECT = sizeof expect / sizeof *expect };
    bool seen[NEXPECT] = {false};
    uint64_t members = u64_at(type, TP_MEMBERS);
    for (int i = 0; i < 64; i++) {
        uint8_t m[MEMBER_SIZE];
        char name[32];
        if (!read_mem(pid, members + (uint64_t)i * MEMBER_SIZE, m, sizeof m) || u64_at(m, 0) == 0)
            break;
        if (!read_mem(pid, u64_at(m, 0), name, sizeof name))
            continue;
        name[sizeof name - 1] = '\0';
        for (int k = 0; k < NEXPECT; k++) {
            if (strcmp(name, expect[k].name) != 0)
                continue;
            seen[k] = true;
            if (u64_at(m, MEMBER_OFFSET) != expect[k].offset) {
                snprintf(why, why_len, "PyCode_Type says %s is at %#llx, the layout %#x", name,
                         (unsigned long long)u64_at(m, MEMBER_OFFSET), expect[k].offset);
                return false;
            }
        }
    }
    for (int k = 0; k < NEXPECT; k++)
        if (expect[k].required && !seen[k]) {
            snprintf(why, why_len, "PyCode_Type's members do not list %s", expect[k].name);
            return false;
        }
    /* 3.11+: the instructions follow the fixed part (the type's basic
     * size; each code unit is an item). */
    uint64_t basicsize = u64_at(type, TP_BASICSIZE);
    if (st->walk.version >= 0x030b0000 && basicsize != st->walk.code_adaptive) {
        snprintf(why, why_len, "PyCode_Type's basic size %#llx is not where the code is (%#x)",
                 (unsigned long long)basicsize, st->walk.code_adaptive);
        return false;
    }
    return true;
}

static bool python_in_eval_loop(const void *state, uint64_t addr)
{
    const struct py_state *st = state;
    return (addr >= st->eval_lo && addr < st->eval_hi) ||
           (addr >= st->cold_lo && addr < st->cold_hi);
}

/* Whether s is well-formed UTF-8 (no overlong form, surrogate or code
 * point past U+10FFFF). A str read while the process frees or reuses it
 * can hold anything, and a profile's strings must be text. */
static bool is_utf8(const unsigned char *s)
{
    while (*s) {
        unsigned n = *s < 0x80 ? 0 : (*s & 0xe0) == 0xc0 ? 1 : (*s & 0xf0) == 0xe0 ? 2
                                   : (*s & 0xf8) == 0xf0 ? 3 : 4;
        if (n == 4)
            return false;
        uint32_t c = n == 0 ? *s : *s & (0x3f >> n);
        for (unsigned k = 1; k <= n; k++) {
            if ((s[k] & 0xc0) != 0x80)
                return false;
            c = c << 6 | (s[k] & 0x3f);
        }
        static const uint32_t least[] = {0, 0x80, 0x800, 0x10000};
        if (c < least[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
            return false;
        s += n + 1;
    }
    return true;
}

static char *read_str_unchecked(pid_t pid, const struct names_layout *l, uint64_t addr);

/* A str object's characters as UTF-8 (malloc'd), or NULL: compact
 * strings only (every identifier and file name is), and only what reads
 * as text. */
static char *read_str(pid_t pid, const struct names_layout *l, uint64_t addr)
{
    char *s = read_str_unchecked(pid, l, addr);
    if (s && !is_utf8((const unsigned char *)s)) {
        free(s);
        return NULL;
    }
    return s;
}

static char *read_str_unchecked(pid_t pid, const struct names_layout *l, uint64_t addr)
{
    uint8_t h[0x48];
    if (!read_mem(pid, addr, h, sizeof h))
        return NULL;
    int64_t len;
    memcpy(&len, h + 0x10, sizeof len);
    uint32_t state = u32_at(h, 0x20);
    unsigned kind = (state >> 2) & 7, compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
    if (!compact || len < 0 || len > 4096)
        return NULL;
    if (!ascii && u64_at(h, l->utf8) != 0) {
        memcpy(&len, h + l->utf8 - 8, sizeof len);
        if (len < 0 || len > 4 * 4096)
            return NULL;
        char *s = malloc((size_t)len + 1);
        if (s && !read_mem(pid, u64_at(h, l->utf8), s, (size_t)len)) {
            free(s);
            return NULL;
        }
        if (s)
            s[len] = '\0';
        return s;
    }
    if (ascii)
        kind = 1;
    else if (kind != 1 && kind != 2 && kind != 4)
        return NULL;
    uint8_t *raw = malloc((size_t)len * kind + 1);
    char *s = malloc((size_t)len * 4 + 1);
    size_t n = 0;
    if (raw && s && read_mem(pid, addr + (ascii ? l->ascii_size : l->compact_size), raw,
                             (size_t)len * kind)) {
        for (int64_t i = 0; i < len; i++) {
            uint32_t c = kind == 1 ? raw[i] : kind == 2 ? (uint32_t)((uint16_t *)raw)[i]
                                                        : ((uint32_t *)raw)[i];
            if (c < 0x80) {
                s[n++] = (char)c;
            } else if (c < 0x800) {
                s[n++] = (char)(0xc0 | c >> 6);
                s[n++] = (char)(0x80 | (c & 0x3f));
            } else if (c < 0x10000) {
                s[n++] = (char)(0xe0 | c >> 12);
                s[n++] = (char)(0x80 | ((c >> 6) & 0x3f));
                s[n++] = (char)(0x80 | (c & 0x3f));
            } else {
                s[n++] = (char)(0xf0 | c >> 18);
                s[n++] = (char)(0x80 | ((c >> 12) & 0x3f));
                s[n++] = (char)(0x80 | ((c >> 6) & 0x3f));
                s[n++] = (char)(0x80 | (c & 0x3f));
            }
        }
        s[n] = '\0';
    } else {
        free(s);
        s = NULL;
    }
    free(raw);
    return s;
}

/* A bytes object's contents (PyBytesObject: ob_size 0x10, ob_sval 0x20
 * in 3.10-3.13). */
static uint8_t *read_bytes(pid_t pid, uint64_t addr, size_t *len)
{
    int64_t size;
    if (!read_mem(pid, addr + 0x10, &size, sizeof size) || size <= 0 || size > (1 << 20))
        return NULL;
    uint8_t *b = malloc((size_t)size);
    if (b && !read_mem(pid, addr + 0x20, b, (size_t)size)) {
        free(b);
        return NULL;
    }
    *len = (size_t)size;
    return b;
}

/* A name read from the process, or NULL: an empty one is no name. */
static char *nonempty(char *s)
{
    if (s != NULL && s[0] == '\0') {
        free(s);
        return NULL;
    }
    return s;
}

static void forget_names(struct code_entry *e)
{
    free(e->qualname);
    free(e->filename);
    free(e->linetable);
    e->qualname = e->filename = NULL;
    e->linetable = NULL;
    e->linetable_len = 0;
}

/* Whether the code object read in c is the one of the record: its type,
 * first line and fingerprint. */
static bool is_recorded_code(const struct py_state *st, const uint8_t *c,
                             const struct code_entry *e)
{
    const struct dd_prof_py_layout *w = &st->walk;
    return u64_at(c, 8) == w->code_type && u32_at(c, w->code_firstlineno) == e->firstline &&
           dd_prof_py_check(u64_at(c, w->code_name), u64_at(c, w->code_linetable),
                            u32_at(c, w->code_argcount)) == e->check;
}

/* Reads the code object the record names, if it is still that one: read
 * again after its strings, it must still be that one and point at the
 * same file name (freed and reused in between, the strings read may be
 * another's). */
static void read_code(struct py_state *st, pid_t pid, struct code_entry *e)
{
    uint8_t c[DD_PROF_PY_CODE_READ], again[DD_PROF_PY_CODE_READ];
    const struct names_layout *n = &st->names;
    if (!read_mem(pid, e->code, c, sizeof c) || !is_recorded_code(st, c, e))
        return;
    e->qualname = nonempty(read_str(pid, n, u64_at(c, n->code_qualname)));
    e->filename = nonempty(read_str(pid, n, u64_at(c, n->code_filename)));
    e->linetable = read_bytes(pid, u64_at(c, st->walk.code_linetable), &e->linetable_len);
    if (e->qualname == NULL || !read_mem(pid, e->code, again, sizeof again) ||
        !is_recorded_code(st, again, e) ||
        u64_at(again, n->code_filename) != u64_at(c, n->code_filename))
        forget_names(e);
}

static size_t slot_of(uint64_t code, uint32_t check, size_t cap)
{
    uint64_t h = (code ^ (uint64_t)check << 32) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

/* The cache's entry of the record, added (and read) if new; NULL when
 * out of memory. */
static struct code_entry *entry_of(struct py_state *st, pid_t pid,
                                   const struct dd_prof_interp_frame *f)
{
    if (2 * (st->n + 1) > st->cap) {
        size_t cap = st->cap ? 2 * st->cap : 256;
        struct code_entry *v = calloc(cap, sizeof *v);
        if (v == NULL)
            return NULL;
        for (size_t i = 0; i < st->cap; i++) {
            if (st->cache[i].code == 0)
                continue;
            size_t k = slot_of(st->cache[i].code, st->cache[i].check, cap);
            while (v[k].code != 0)
                k = (k + 1) & (cap - 1);
            v[k] = st->cache[i];
        }
        free(st->cache);
        st->cache = v;
        st->cap = cap;
    }
    size_t k = slot_of(f->code, f->check, st->cap);
    for (; st->cache[k].code != 0; k = (k + 1) & (st->cap - 1)) {
        struct code_entry *e = &st->cache[k];
        if (e->code == f->code && e->check == f->check && e->firstline == f->firstline)
            return e;
    }
    struct code_entry *e = &st->cache[k];
    *e = (struct code_entry){.code = f->code, .check = f->check, .firstline = f->firstline};
    st->n++;
    read_code(st, pid, e);
    return e;
}

static void python_name(void *state, pid_t pid, const struct dd_prof_interp_frame *f,
                        struct dd_prof_function_at *out)
{
    struct py_state *st = state;
    const struct code_entry *e = f->code ? entry_of(st, pid, f) : NULL;
    *out = (struct dd_prof_function_at){"<unknown>", NULL, (int)f->firstline};
    if (e == NULL || e->qualname == NULL)
        return;
    out->function = e->qualname;
    out->file = e->filename;
    /* 3.10: an offset below 0 (f_lasti -1) is a frame not started. */
    int line = f->offset < 0x80000000u && e->linetable
                   ? dd_prof_python_line(st->walk.version, e->linetable, e->linetable_len,
                                         (int)e->firstline, f->offset)
                   : -1;
    out->line = line >= 0 ? line : (int)e->firstline;
}

/* 3.10: (bytes, line delta) pairs, -128 for "no line". */
static int line_310(const uint8_t *t, size_t len, int line, uint32_t offset)
{
    uint32_t end = 0;
    for (size_t i = 0; i + 1 < len; i += 2) {
        uint32_t start = end;
        end += t[i];
        int8_t delta = (int8_t)t[i + 1];
        if (delta != -128)
            line += delta;
        if (offset >= start && offset < end)
            return delta == -128 ? -1 : line;
    }
    return -1;
}

/* 3.11+'s location table: an entry starts with a byte with its top bit
 * set, 1cccclll: code c, covering l + 1 code units (2 bytes each); codes
 * 13 and 14 are followed by the line delta as a signed varint (6 bits a
 * byte, bit 6 "more", low bit the sign), 10-12 mean a delta of 0-2, 15 no
 * line, the others the same line. */
static uint32_t varint(const uint8_t *t, size_t len, size_t *i)
{
    uint32_t b = t[(*i)++], v = b & 63;
    for (unsigned shift = 6; (b & 64) && *i < len && shift < 32; shift += 6) {
        b = t[(*i)++];
        v |= (b & 63) << shift;
    }
    return v;
}

static int line_311(const uint8_t *t, size_t len, int line, uint32_t offset)
{
    uint32_t start = 0;
    for (size_t i = 0; i < len;) {
        uint8_t b = t[i++];
        if (!(b & 0x80))
            continue;
        unsigned code = (b >> 3) & 15;
        uint32_t end = start + ((b & 7) + 1u) * 2;
        if ((code == 13 || code == 14) && i < len) {
            uint32_t v = varint(t, len, &i);
            line += (v & 1) ? -(int)(v >> 1) : (int)(v >> 1);
        } else if (code >= 10 && code <= 12) {
            line += (int)code - 10;
        }
        if (offset >= start && offset < end)
            return code == 15 ? -1 : line;
        start = end;
    }
    return -1;
}

int dd_prof_python_line(uint32_t version, const uint8_t *table, size_t len, int firstline,
                        uint32_t offset)
{
    return version < 0x030b0000 ? line_310(table, len, firstline, offset)
                                : line_311(table, len, firstline, offset);
}

static void *python_fork(const void *state)
{
    const struct py_state *st = state;
    struct py_state *copy = calloc(1, sizeof *copy);
    if (copy == NULL)
        return NULL;
    copy->walk = st->walk;
    copy->names = st->names;
    copy->eval_lo = st->eval_lo;
    copy->eval_hi = st->eval_hi;
    copy->cold_lo = st->cold_lo;
    copy->cold_hi = st->cold_hi;
    return copy;
}

static void python_free(void *state)
{
    struct py_state *st = state;
    if (st == NULL)
        return;
    for (size_t i = 0; i < st->cap; i++) {
        free(st->cache[i].qualname);
        free(st->cache[i].filename);
        free(st->cache[i].linetable);
    }
    free(st->cache);
    free(st);
}

const struct dd_prof_interp dd_prof_python = {
    .name = "CPython",
    .recognize = python_recognize,
    .verify = python_verify,
    .in_eval_loop = python_in_eval_loop,
    .name_frame = python_name,
    .fork = python_fork,
    .free = python_free,
};

/*
 * DWARF unwinding of copied stacks (unwind.h), the way perf unwinds its
 * --call-graph dwarf samples: one libdwfl session per process, its
 * modules reported from the objects recorded for it (each at its load
 * bias), and "thread state" callbacks that hand libdwfl the registers the
 * probe saw and serve its memory reads from the copy of the stack (and
 * from the read-only segments of the mapped files).
 *
 * A session belongs to a list of objects, not to a process (unwind.h):
 * every process with the same objects at the same addresses (a forking
 * server's workers) unwinds with it, so libdwfl parses each module's CFI
 * once for all of them, and a new worker costs no session. A module is
 * reported when its object is first recorded; an object mapped over the
 * range of an earlier one (dlclose, then dlopen at the same address)
 * rebuilds the session from the latest object of each range.
 *
 * On x86-64 a walk first tries the session's rules cache (quick_walk):
 * libdwfl allocates a frame state and looks up and interprets the CFI of
 * every frame of every sample, about 1 us a frame; but almost every frame
 * of compiled code is described by three numbers (the CFA is rsp or rbp
 * plus an offset, the return address and the saved rbp at fixed offsets
 * from it), which are looked up once per address and kept, so a frame
 * costs a hash lookup and two reads of the copy. Anything else (an
 * expression, a signal frame, an address with no CFI or in a module not
 * reported, a read the copy cannot serve, the end of the copy) sends the
 * whole sample to libdwfl's walk, which then decides exactly as before.
 * DDHEAP_PROF_CHECK_UNWIND=1 runs both walks on every sample and counts
 * where they differ.
 */
#include "unwind.h"

#include <dwarf.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <fcntl.h>
#include <gelf.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <linux/types.h>

#include "ddheap_prof.h"
#include "grow.h"
#include "symbolize.h"

/* A read this far above the copy's end is taken as a read of the rest of
 * the stack (the copy was too short), not as a wild pointer. */
#define STACK_REACH (8u << 20)
/* At most one rescan of the maps this often, for addresses in no object. */
#define RESCAN_NS 20000000LL
/* Entries of the rules cache (direct-mapped, per session): a program's
 * hot code has a few hundred frame addresses. */
#define RULES 4096u

/* How a frame's caller is found from it, for one address (quick_walk). */
enum rule_kind {
    RULE_EMPTY,     /* nothing known for this slot yet */
    RULE_SIMPLE,    /* by the offsets below */
    RULE_OUTERMOST, /* the return address is undefined: the walk ends */
    RULE_SLOW       /* only libdwfl's walk knows */
};
enum saved_fp { FP_SAME, FP_AT, FP_UNDEFINED };

struct rule {
    uint64_t pc; /* the address looked up (a return address less 1) */
    int32_t cfa_offset, ra_offset, fp_offset; /* ra, fp: from the CFA */
    uint8_t kind, cfa_from_fp, fp;
};

/* One object of a session's list: which file, where. */
struct layout_entry {
    const struct dd_prof_file *file;
    uint64_t bias;
    bool reported; /* its module is in the session (its file could be read) */
};

struct dd_prof_unwinder {
    struct layout_entry *layout;
    size_t n, cap;
    unsigned holders; /* processes holding it */
    uint64_t last_use;
    Dwfl *dwfl;     /* NULL until needed, and after the bound freed it */
    unsigned fds;   /* descriptors its modules hold */
    bool partial;   /* some module could not be reported ... */
    uint64_t files_generation; /* ... as the files were then (objects.h) */
    pid_t pid;      /* the id its thread state was attached with */
    struct rule *rules; /* RULES of them (NULL until the first quick walk),
                         * emptied whenever its modules change */
    /* The stack being unwound. */
    const struct dd_prof_objects *objs;
    const struct dd_prof_stack_copy *copy;
    bool read_past_copy;
    uint64_t *frames;
    uint32_t n_frames, max;
    bool too_deep;
};

/* Every session, held or kept for later. */
static struct dd_prof_unwinder **sessions;
static size_t nsessions, sessions_cap;
static uint64_t use_clock;
static unsigned session_fds; /* held by every session's modules */
static struct dd_prof_unwind_stats *stats;
static dd_prof_rescan_fn *rescan;
static void *rescan_arg;
static bool check_walks; /* DDHEAP_PROF_CHECK_UNWIND=1 */

/* Sessions nobody holds, kept for a process with their list, at most. */
#define KEPT_SESSIONS 16

void dd_prof_unwind_setup(struct dd_prof_unwind_stats *s, dd_prof_rescan_fn *fn, void *arg)
{
    stats = s;
    rescan = fn;
    rescan_arg = arg;
    const char *check = getenv("DDHEAP_PROF_CHECK_UNWIND");
    check_walks = check != NULL && strcmp(check, "1") == 0;
}

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* One thread, whatever its id: the one whose stack was copied. */
static pid_t next_thread(Dwfl *dwfl, void *dwfl_arg, void **thread_argp)
{
    (void)dwfl;
    (void)dwfl_arg;
    (void)thread_argp;
    return 0;
}

static bool get_thread(Dwfl *dwfl, pid_t tid, void *dwfl_arg, void **thread_argp)
{
    (void)dwfl;
    (void)tid;
    *thread_argp = dwfl_arg;
    return true;
}

/* A word of a read-only segment of a mapped file, as the process sees it
 * (the file's bytes: nothing writes there). Writable segments are not
 * served: their contents at the time of the sample are unknown. */
static bool read_mapped_file(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result)
{
    Dwfl_Module *mod = dwfl_addrmodule(dwfl, addr);
    Dwarf_Addr bias;
    Elf *elf = mod ? dwfl_module_getelf(mod, &bias) : NULL;
    size_t n;
    if (elf == NULL || elf_getphdrnum(elf, &n) != 0)
        return false;
    Dwarf_Addr vaddr = addr - bias;
    for (size_t i = 0; i < n; i++) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, (int)i, &ph) == NULL || ph.p_type != PT_LOAD || (ph.p_flags & PF_W) ||
            vaddr < ph.p_vaddr || vaddr - ph.p_vaddr + sizeof *result > ph.p_filesz)
            continue;
        Elf_Data *d = elf_getdata_rawchunk(elf, (int64_t)(ph.p_offset + (vaddr - ph.p_vaddr)),
                                           sizeof *result, ELF_T_BYTE);
        if (d == NULL || d->d_size < sizeof *result)
            return false;
        memcpy(result, d->d_buf, sizeof *result);
        return true;
    }
    return false;
}

/* A word of the copy at `addr`: 1 read; 0 beyond a copy that stopped at
 * the size asked for, not at the end of the stack (the rest of the stack
 * was needed: the walk is truncated there); -1 anywhere else. */
static int read_copy(const struct dd_prof_unwinder *u, uint64_t addr, uint64_t *word)
{
    const struct dd_prof_stack_copy *c = u->copy;
    uint64_t sp = c->regs[DD_PROF_REG_SP];
    if (addr >= sp && addr - sp <= c->len && c->len - (addr - sp) >= sizeof *word) {
        memcpy(word, c->data + (addr - sp), sizeof *word);
        return 1;
    }
    if (addr >= sp + c->len && addr - sp < STACK_REACH && c->len >= c->wanted)
        return 0;
    return -1;
}

static bool memory_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result, void *dwfl_arg)
{
    struct dd_prof_unwinder *u = dwfl_arg;
    uint64_t word;
    switch (read_copy(u, addr, &word)) {
    case 1:
        *result = word;
        return true;
    case 0:
        u->read_past_copy = true;
        return false;
    default:
        return read_mapped_file(dwfl, addr, result);
    }
}

/* The registers the probe saw, in DWARF numbering. */
static bool set_initial_registers(Dwfl_Thread *thread, void *thread_arg)
{
    const struct dd_prof_unwinder *u = thread_arg;
    const uint64_t *r = u->copy->regs;
#if defined(__x86_64__)
    Dwarf_Word bp_sp[2] = {r[DD_PROF_REG_FP], r[DD_PROF_REG_SP]}; /* rbp 6, rsp 7 */
    if (!dwfl_thread_state_registers(thread, 6, 2, bp_sp))
        return false;
#elif defined(__aarch64__)
    Dwarf_Word fp_lr_sp[3] = {r[DD_PROF_REG_FP], r[DD_PROF_REG_LR], r[DD_PROF_REG_SP]};
    if (!dwfl_thread_state_registers(thread, 29, 3, fp_lr_sp)) /* x29, x30, sp 31 */
        return false;
#else
#error "ddheap-prof unwinds x86_64 and aarch64 only"
#endif
    dwfl_thread_state_register_pc(thread, r[DD_PROF_REG_PC]);
    return true;
}

static const Dwfl_Thread_Callbacks thread_callbacks = {
    .next_thread = next_thread,
    .get_thread = get_thread,
    .memory_read = memory_read,
    .set_initial_registers = set_initial_registers,
};

static bool overlap(const struct dd_prof_object *a, const struct dd_prof_object *b)
{
    return a->lo < b->hi && b->lo < a->hi;
}

static void forget_rules(struct dd_prof_unwinder *u)
{
    if (u->rules)
        memset(u->rules, 0, RULES * sizeof *u->rules);
}

static void drop_dwfl(struct dd_prof_unwinder *u)
{
    forget_rules(u); /* derived from its modules */
    if (u->dwfl)
        dwfl_end(u->dwfl);
    u->dwfl = NULL;
    session_fds -= u->fds;
    u->fds = 0;
    for (size_t i = 0; i < u->n; i++)
        u->layout[i].reported = false;
}

/* Room for `more` descriptors in the sessions' half of the budget: the
 * libdwfl state of the least recently used other sessions is freed. */
static void make_room(const struct dd_prof_unwinder *keep, unsigned more)
{
    unsigned budget = dd_prof_fd_budget() / 2;
    while (session_fds + more > budget) {
        struct dd_prof_unwinder *lru = NULL;
        for (size_t i = 0; i < nsessions; i++)
            if (sessions[i] != keep && sessions[i]->dwfl &&
                (!lru || sessions[i]->last_use < lru->last_use))
                lru = sessions[i];
        if (lru == NULL)
            return;
        drop_dwfl(lru);
    }
}

static void report_object(struct dd_prof_unwinder *u, size_t i)
{
    struct dd_prof_object *o = &u->objs->v[i];
    /* libdwfl keeps (and closes) the descriptor it is given: a copy. */
    int fd = dd_prof_file_fd(o->file);
    int copy = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd >= 0 && copy < 0)
        dd_prof_file_failed(o->file, "cannot open an unwinding session", strerror(errno));
    if (copy < 0)
        return;
    if (dwfl_report_elf(u->dwfl, o->path, o->path, copy, o->bias, true) == NULL) {
        dd_prof_file_failed(o->file, "libdwfl cannot read it", dwfl_errmsg(-1));
        close(copy);
        return;
    }
    u->layout[i].reported = true;
    u->fds++;
    session_fds++;
}

/* The session's libdwfl state, from the latest object of every address
 * range of objs (its list). */
static void build(struct dd_prof_unwinder *u)
{
    drop_dwfl(u);
    make_room(u, (unsigned)u->n);
    u->dwfl = dwfl_begin(dd_prof_dwfl_callbacks());
    if (u->dwfl == NULL)
        return;
    dwfl_report_begin(u->dwfl);
    for (size_t i = u->n; i-- > 0;) {
        bool hidden = false;
        for (size_t j = i + 1; j < u->n && !hidden; j++)
            hidden = overlap(&u->objs->v[i], &u->objs->v[j]);
        if (!hidden)
            report_object(u, i);
    }
    dwfl_report_end(u->dwfl, NULL, NULL);
    u->files_generation = dd_prof_files_generation();
    u->partial = false;
    for (size_t i = 0; i < u->n; i++) {
        bool hidden = false;
        for (size_t j = i + 1; j < u->n && !hidden; j++)
            hidden = overlap(&u->objs->v[i], &u->objs->v[j]);
        u->partial |= !hidden && !u->layout[i].reported;
    }
    /* The architecture comes from the modules' ELF headers. */
    if (!dwfl_attach_state(u->dwfl, NULL, u->pid, &thread_callbacks, u))
        drop_dwfl(u);
}

static bool layout_is(const struct dd_prof_unwinder *u, const struct dd_prof_objects *objs,
                      size_t n)
{
    if (u->n != n || objs->n < n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (u->layout[i].file != objs->v[i].file || u->layout[i].bias != objs->v[i].bias)
            return false;
    return true;
}

/* Appends objs->v[from..] to the session's list; -1 if out of memory. */
static int extend_layout(struct dd_prof_unwinder *u, const struct dd_prof_objects *objs)
{
    if (objs->n > u->cap) {
        size_t cap = objs->n + 16;
        struct layout_entry *v = realloc(u->layout, cap * sizeof *v);
        if (v == NULL)
            return -1;
        u->layout = v;
        u->cap = cap;
    }
    for (size_t i = u->n; i < objs->n; i++)
        u->layout[i] = (struct layout_entry){objs->v[i].file, objs->v[i].bias, false};
    return 0;
}

/* Frees sessions nobody holds beyond the ones kept, oldest first. */
static void trim_kept(void)
{
    size_t kept = 0;
    for (size_t i = 0; i < nsessions; i++)
        kept += sessions[i]->holders == 0;
    while (kept > KEPT_SESSIONS) {
        size_t lru = nsessions;
        for (size_t i = 0; i < nsessions; i++)
            if (sessions[i]->holders == 0 &&
                (lru == nsessions || sessions[i]->last_use < sessions[lru]->last_use))
                lru = i;
        struct dd_prof_unwinder *u = sessions[lru];
        drop_dwfl(u);
        free(u->rules);
        free(u->layout);
        free(u);
        sessions[lru] = sessions[--nsessions];
        kept--;
    }
}

void dd_prof_unwinder_release(struct dd_prof_unwinder *u)
{
    if (u == NULL)
        return;
    if (u->holders > 0)
        u->holders--;
    trim_kept();
}

/* The session for a process whose objects are objs, held by it from now
 * on (cur, the one it held, released or grown in place); NULL when out of
 * memory. */
static struct dd_prof_unwinder *fit(struct dd_prof_unwinder *cur, pid_t pid,
                                    const struct dd_prof_objects *objs)
{
    if (cur && layout_is(cur, objs, objs->n))
        return cur;
    /* Its own session, and its list only grew: the session grows too. */
    if (cur && cur->holders == 1 && layout_is(cur, objs, cur->n)) {
        if (extend_layout(cur, objs) != 0)
            return NULL;
        size_t from = cur->n;
        cur->n = objs->n;
        cur->objs = objs;
        bool fresh = cur->dwfl == NULL;
        for (size_t i = from; i < objs->n && !fresh; i++)
            for (size_t j = 0; j < i && !fresh; j++)
                fresh = overlap(&objs->v[i], &objs->v[j]);
        if (fresh) {
            build(cur);
        } else {
            make_room(cur, (unsigned)(objs->n - from));
            forget_rules(cur);
            dwfl_report_begin_add(cur->dwfl);
            for (size_t i = from; i < objs->n; i++)
                report_object(cur, i);
            dwfl_report_end(cur->dwfl, NULL, NULL);
        }
        return cur;
    }
    struct dd_prof_unwinder *u = NULL;
    for (size_t i = 0; i < nsessions && u == NULL; i++)
        if (layout_is(sessions[i], objs, objs->n))
            u = sessions[i];
    if (u == NULL) {
        if (dd_prof_grow(&sessions, &sessions_cap, nsessions + 1, sizeof *sessions) != 0)
            return NULL;
        u = calloc(1, sizeof *u);
        if (u == NULL || extend_layout(u, objs) != 0) {
            free(u);
            return NULL;
        }
        u->n = objs->n;
        u->pid = pid;
        sessions[nsessions++] = u;
    }
    u->holders++;
    dd_prof_unwinder_release(cur);
    return u;
}

void dd_prof_unwinders_free(void)
{
    for (size_t i = 0; i < nsessions; i++) {
        drop_dwfl(sessions[i]);
        free(sessions[i]->rules);
        free(sessions[i]->layout);
        free(sessions[i]);
    }
    free(sessions);
    sessions = NULL;
    nsessions = sessions_cap = 0;
}

static int on_frame(Dwfl_Frame *state, void *arg)
{
    struct dd_prof_unwinder *u = arg;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(state, &pc, &activation))
        return DWARF_CB_ABORT;
    /* One slot is kept for the truncation mark. */
    if (u->n_frames + 1 >= u->max) {
        u->too_deep = true;
        return DWARF_CB_ABORT;
    }
    u->frames[u->n_frames++] = pc;
    return DWARF_CB_OK;
}

/* libdwfl's walk into u->frames. Its result is not looked at: libdwfl
 * ends without an error both at the outermost frame and at a return
 * address it could not read; the reads tell the two apart. */
static void slow_walk(struct dd_prof_unwinder *u)
{
    u->n_frames = 0;
    u->too_deep = false;
    u->read_past_copy = false;
    if (u->dwfl != NULL)
        dwfl_getthread_frames(u->dwfl, u->pid, on_frame, u);
}

#if defined(__x86_64__)
/* DWARF registers of x86-64. */
#define DW_RBP 6
#define DW_RSP 7
#define DW_RA 16

/* A location "CFA + n" (dwarf_frame_register's simple form) in *offset. */
static bool at_cfa(const Dwarf_Op *ops, size_t nops, int32_t *offset)
{
    if (nops < 1 || nops > 2 || ops[0].atom != DW_OP_call_frame_cfa)
        return false;
    if (nops == 2 && ops[1].atom != DW_OP_plus_uconst)
        return false;
    int64_t n = nops == 2 ? (int64_t)ops[1].number : 0;
    if (n < INT32_MIN || n > INT32_MAX)
        return false;
    *offset = (int32_t)n;
    return true;
}

/* The rule of the .eh_frame row for `pc`, or RULE_SLOW for anything but
 * the three-number form (where .eh_frame says nothing, libdwfl looks at
 * .debug_frame and frame pointers: so does the slow walk). */
static void derive_rule(struct dd_prof_unwinder *u, uint64_t pc, struct rule *r)
{
    *r = (struct rule){.pc = pc, .kind = RULE_SLOW};
    Dwfl_Module *mod = dwfl_addrmodule(u->dwfl, pc);
    Dwarf_Addr bias;
    Dwarf_CFI *cfi = mod ? dwfl_module_eh_cfi(mod, &bias) : NULL;
    Dwarf_Frame *frame = NULL;
    if (cfi == NULL || dwarf_cfi_addrframe(cfi, pc - bias, &frame) != 0 || frame == NULL)
        return;
    bool signal = false;
    Dwarf_Op *ops, mem[3];
    size_t nops;
    if (dwarf_frame_info(frame, NULL, NULL, &signal) != DW_RA || signal ||
        dwarf_frame_cfa(frame, &ops, &nops) != 0 || nops != 1 || ops[0].atom != DW_OP_bregx ||
        (ops[0].number != DW_RSP && ops[0].number != DW_RBP) ||
        (int64_t)ops[0].number2 < INT32_MIN || (int64_t)ops[0].number2 > INT32_MAX)
        goto out;
    r->cfa_from_fp = ops[0].number == DW_RBP;
    r->cfa_offset = (int32_t)(int64_t)ops[0].number2;
    if (dwarf_frame_register(frame, DW_RA, mem, &ops, &nops) != 0)
        goto out;
    if (nops == 0 && ops == mem) {
        r->kind = RULE_OUTERMOST;
        goto out;
    }
    if (!at_cfa(ops, nops, &r->ra_offset) ||
        dwarf_frame_register(frame, DW_RBP, mem, &ops, &nops) != 0)
        goto out;
    if (nops == 0)
        r->fp = ops == NULL ? FP_SAME : FP_UNDEFINED;
    else if (at_cfa(ops, nops, &r->fp_offset))
        r->fp = FP_AT;
    else
        goto out;
    r->kind = RULE_SIMPLE;
out:
    free(frame);
}

static const struct rule *rule_of(struct dd_prof_unwinder *u, uint64_t pc)
{
    struct rule *r = &u->rules[((pc * 0x9e3779b97f4a7c15ull) >> 52) & (RULES - 1)];
    if (r->kind == RULE_EMPTY || r->pc != pc)
        derive_rule(u, pc, r);
    return r;
}

/* The walk by cached rules, into u->frames; false if the sample needs
 * libdwfl's (u->frames is then to be overwritten). The same frames and
 * the same end as slow_walk() with memory_read. */
static bool quick_walk(struct dd_prof_unwinder *u)
{
    u->n_frames = 0;
    u->too_deep = false;
    u->read_past_copy = false;
    if (u->dwfl == NULL)
        return false;
    if (u->rules == NULL && (u->rules = calloc(RULES, sizeof *u->rules)) == NULL)
        return false;
    const uint64_t *regs = u->copy->regs;
    uint64_t pc = regs[DD_PROF_REG_PC], sp = regs[DD_PROF_REG_SP], fp = regs[DD_PROF_REG_FP];
    bool fp_known = true;
    for (bool first = true;; first = false) {
        /* One slot is kept for the truncation mark (on_frame). */
        if (u->n_frames + 1 >= u->max) {
            u->too_deep = true;
            return true;
        }
        u->frames[u->n_frames++] = pc;
        const struct rule *r = rule_of(u, first ? pc : pc - 1);
        if (r->kind == RULE_OUTERMOST)
            return true;
        if (r->kind != RULE_SIMPLE || (r->cfa_from_fp && !fp_known))
            return false;
        uint64_t cfa = (r->cfa_from_fp ? fp : sp) + (uint64_t)(int64_t)r->cfa_offset;
        uint64_t ra;
        int got = read_copy(u, cfa + (uint64_t)(int64_t)r->ra_offset, &ra);
        if (got == 0) {
            u->read_past_copy = true;
            return true;
        }
        if (got < 0 || ra == 0)
            return false;
        if (r->fp == FP_AT) {
            if (read_copy(u, cfa + (uint64_t)(int64_t)r->fp_offset, &fp) != 1)
                return false;
            fp_known = true;
        } else if (r->fp == FP_UNDEFINED) {
            fp_known = false;
        }
        sp = cfa;
        pc = ra;
    }
}
#else
static bool quick_walk(struct dd_prof_unwinder *u)
{
    (void)u;
    return false;
}
#endif

/* One walk of the stack copy into frames (at most max of them), with the
 * session's libdwfl state made if it has none: the quick one where it
 * can, else libdwfl's; with DDHEAP_PROF_CHECK_UNWIND both, libdwfl's
 * kept. */
static void walk(struct dd_prof_unwinder *u, const struct dd_prof_objects *objs,
                 const struct dd_prof_stack_copy *copy, uint64_t *frames, uint32_t max)
{
    u->objs = objs;
    u->copy = copy;
    u->frames = frames;
    u->max = max;
    u->last_use = ++use_clock;
    if (u->dwfl == NULL ||
        (u->partial && u->files_generation != dd_prof_files_generation()))
        build(u);
    if (!check_walks) {
        if (!quick_walk(u))
            slow_walk(u);
        return;
    }
    uint64_t quick[DD_PROF_MAX_FRAMES];
    bool quick_ok = u->max <= DD_PROF_MAX_FRAMES && quick_walk(u);
    uint32_t quick_n = u->n_frames;
    bool quick_cut = u->too_deep || u->read_past_copy;
    if (quick_ok)
        memcpy(quick, u->frames, quick_n * sizeof *quick);
    slow_walk(u);
    if (!quick_ok)
        return;
    stats->checked++;
    if (quick_n != u->n_frames || quick_cut != (u->too_deep || u->read_past_copy) ||
        memcmp(quick, u->frames, quick_n * sizeof *quick) != 0)
        stats->mismatched++;
}

uint32_t dd_prof_unwind(struct dd_prof_unwind_hold *hold, pid_t pid,
                        const struct dd_prof_objects *objs,
                        const struct dd_prof_stack_copy *copy, uint64_t *frames, uint32_t max)
{
    int64_t t0 = monotonic_ns();
    if (max < 2)
        return 0;
    struct dd_prof_unwinder *u = hold->session = fit(hold->session, pid, objs);
    if (u == NULL)
        return 0;
    walk(u, objs, copy, frames, max);
    /* A frame in no recorded object: a library mapped since the last
     * scan. The caller scans this process's maps again (while it lives,
     * attaching to any new object with probes) and the walk is retried,
     * with the session of its grown list. */
    uint64_t last = u->n_frames ? frames[u->n_frames - 1] : copy->regs[DD_PROF_REG_PC];
    if (dd_prof_objects_find(objs, last) == NULL && t0 - hold->last_rescan_ns > RESCAN_NS) {
        hold->last_rescan_ns = t0;
        if (rescan(rescan_arg, pid)) {
            if ((u = hold->session = fit(u, pid, objs)) == NULL)
                return 0;
            walk(u, objs, copy, frames, max);
        }
    }
    uint32_t n = u->n_frames;
    if (n == 0) {
        /* Not even the probe site: keep it, so the sample still counts. */
        frames[n++] = copy->regs[DD_PROF_REG_PC];
    }
    /* Where the walk ended, in an object whose file could not be read:
     * the stack is cut there, and that file is said at the end. */
    const struct dd_prof_object *end = dd_prof_objects_find(objs, frames[n - 1]);
    if (end && !u->layout[(size_t)(end - objs->v)].reported)
        end->file->cut_stacks++;
    /* libdwfl takes a return address it cannot read for the end of the
     * stack (and returns success): what ends a walk is told by the
     * reads, not by rc. */
    bool truncated = u->too_deep || u->read_past_copy;
    if (truncated) {
        frames[n++] = DD_PROF_TRUNCATED_FRAME;
        stats->truncated++;
    }
    stats->stacks++;
    stats->frames += n;
    stats->ns += (uint64_t)(monotonic_ns() - t0);
    return n;
}

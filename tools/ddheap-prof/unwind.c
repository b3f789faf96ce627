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
 */
#include "unwind.h"

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
#include "symbolize.h"

/* A read this far above the copy's end is taken as a read of the rest of
 * the stack (the copy was too short), not as a wild pointer. */
#define STACK_REACH (8u << 20)
/* At most one rescan of the maps this often, for addresses in no object. */
#define RESCAN_NS 20000000LL

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

/* Sessions nobody holds, kept for a process with their list, at most. */
#define KEPT_SESSIONS 16

void dd_prof_unwind_setup(struct dd_prof_unwind_stats *s, dd_prof_rescan_fn *fn, void *arg)
{
    stats = s;
    rescan = fn;
    rescan_arg = arg;
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

static bool memory_read(Dwfl *dwfl, Dwarf_Addr addr, Dwarf_Word *result, void *dwfl_arg)
{
    struct dd_prof_unwinder *u = dwfl_arg;
    const struct dd_prof_stack_copy *c = u->copy;
    uint64_t sp = c->regs[DD_PROF_REG_SP];
    if (addr >= sp && addr - sp <= c->len && c->len - (addr - sp) >= sizeof *result) {
        memcpy(result, c->data + (addr - sp), sizeof *result);
        return true;
    }
    /* Beyond a copy that stopped at the size asked for, not at the end
     * of the stack: the rest of the stack was needed. */
    if (addr >= sp + c->len && addr - sp < STACK_REACH && c->len >= c->wanted) {
        u->read_past_copy = true;
        return false;
    }
    return read_mapped_file(dwfl, addr, result);
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

static void drop_dwfl(struct dd_prof_unwinder *u)
{
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
        if (nsessions == sessions_cap) {
            size_t cap = sessions_cap ? 2 * sessions_cap : 16;
            struct dd_prof_unwinder **v = realloc(sessions, cap * sizeof *v);
            if (v == NULL)
                return NULL;
            sessions = v;
            sessions_cap = cap;
        }
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

/* One walk into u->frames, with the session's libdwfl state made if it
 * has none. Its result is not looked at: libdwfl ends without an error
 * both at the outermost frame and at a return address it could not read;
 * the reads tell the two apart. */
static void walk(struct dd_prof_unwinder *u)
{
    u->n_frames = 0;
    u->too_deep = false;
    u->read_past_copy = false;
    u->last_use = ++use_clock;
    if (u->dwfl == NULL ||
        (u->partial && u->files_generation != dd_prof_files_generation()))
        build(u);
    if (u->dwfl != NULL)
        dwfl_getthread_frames(u->dwfl, u->pid, on_frame, u);
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
    u->objs = objs;
    u->copy = copy;
    u->frames = frames;
    u->max = max;
    walk(u);
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
            u->objs = objs;
            u->copy = copy;
            u->frames = frames;
            u->max = max;
            walk(u);
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

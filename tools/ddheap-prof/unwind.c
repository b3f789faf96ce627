/*
 * DWARF unwinding of copied stacks (unwind.h), the way perf unwinds its
 * --call-graph dwarf samples: one libdwfl session per process, its
 * modules reported from the objects recorded for it (each at its load
 * bias), and "thread state" callbacks that hand libdwfl the registers the
 * probe saw and serve its memory reads from the copy of the stack (and
 * from the read-only segments of the mapped files).
 *
 * The session lives as long as the process's image (the caller frees it
 * at an exec, and once the process has exited and its last events are
 * unwound): libdwfl keeps each module's parsed CFI, so an unwind costs the
 * walk, not the parse. A module is
 * reported when its object is first recorded; an object mapped over the
 * range of an earlier one (dlclose, then dlopen at the same address)
 * rebuilds the session from the latest object of each range.
 */
#include "unwind.h"

#include <elfutils/libdwfl.h>
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

struct dd_prof_unwinder {
    const struct dd_prof_objects *objs; /* the process's, as of this call */
    pid_t pid;
    dd_prof_rescan_fn *rescan;
    void *rescan_arg;
    struct dd_prof_unwind_stats *stats;
    Dwfl *dwfl;
    size_t reported; /* objs->v[0, reported) have been considered */
    int64_t last_rescan_ns;
    /* The stack being unwound. */
    const struct dd_prof_stack_copy *copy;
    bool read_past_copy;
    uint64_t *frames;
    uint32_t n, max;
    bool too_deep;
};


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

static void report_object(Dwfl *dwfl, const struct dd_prof_object *o)
{
    /* libdwfl keeps (and closes) the descriptor it is given: a copy. */
    int fd = o->fd >= 0 ? dup(o->fd) : -1;
    if (fd < 0)
        return;
    if (dwfl_report_elf(dwfl, o->path, o->path, fd, o->bias, true) == NULL)
        close(fd);
}

/* A new session with the latest object of every address range. */
static void rebuild(struct dd_prof_unwinder *u)
{
    if (u->dwfl)
        dwfl_end(u->dwfl);
    u->dwfl = dwfl_begin(dd_prof_dwfl_callbacks());
    if (u->dwfl == NULL)
        return;
    dwfl_report_begin(u->dwfl);
    for (size_t i = u->objs->n; i-- > 0;) {
        bool hidden = false;
        for (size_t j = i + 1; j < u->objs->n && !hidden; j++)
            hidden = overlap(&u->objs->v[i], &u->objs->v[j]);
        if (!hidden)
            report_object(u->dwfl, &u->objs->v[i]);
    }
    dwfl_report_end(u->dwfl, NULL, NULL);
    u->reported = u->objs->n;
    /* The architecture comes from the modules' ELF headers. */
    if (!dwfl_attach_state(u->dwfl, NULL, u->pid, &thread_callbacks, u)) {
        dwfl_end(u->dwfl);
        u->dwfl = NULL;
    }
}

/* Reports the objects recorded since the last call. */
static void sync_modules(struct dd_prof_unwinder *u)
{
    if (u->reported == u->objs->n && u->dwfl)
        return;
    /* (Fewer objects than reported: a list replaced under the session,
     * which the caller should not do; start afresh rather than trust it.) */
    bool fresh = u->dwfl == NULL || u->reported > u->objs->n;
    for (size_t i = u->reported; i < u->objs->n && !fresh; i++)
        for (size_t j = 0; j < i && !fresh; j++)
            fresh = overlap(&u->objs->v[i], &u->objs->v[j]);
    if (fresh) {
        rebuild(u);
        return;
    }
    dwfl_report_begin_add(u->dwfl);
    for (size_t i = u->reported; i < u->objs->n; i++)
        report_object(u->dwfl, &u->objs->v[i]);
    dwfl_report_end(u->dwfl, NULL, NULL);
    u->reported = u->objs->n;
}

struct dd_prof_unwinder *dd_prof_unwinder_new(pid_t pid, struct dd_prof_unwind_stats *stats,
                                              dd_prof_rescan_fn *rescan, void *rescan_arg)
{
    struct dd_prof_unwinder *u = calloc(1, sizeof *u);
    if (u == NULL)
        return NULL;
    u->pid = pid;
    u->stats = stats;
    u->rescan = rescan;
    u->rescan_arg = rescan_arg;
    return u;
}

static int on_frame(Dwfl_Frame *state, void *arg)
{
    struct dd_prof_unwinder *u = arg;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(state, &pc, &activation))
        return DWARF_CB_ABORT;
    /* One slot is kept for the truncation mark. */
    if (u->n + 1 >= u->max) {
        u->too_deep = true;
        return DWARF_CB_ABORT;
    }
    u->frames[u->n++] = pc;
    return DWARF_CB_OK;
}

/* One walk into u->frames. Its result is not looked at: libdwfl ends
 * without an error both at the outermost frame and at a return address
 * it could not read; the reads tell the two apart. */
static void walk(struct dd_prof_unwinder *u)
{
    u->n = 0;
    u->too_deep = false;
    u->read_past_copy = false;
    if (u->dwfl != NULL)
        dwfl_getthread_frames(u->dwfl, u->pid, on_frame, u);
}

uint32_t dd_prof_unwind(struct dd_prof_unwinder *u, const struct dd_prof_objects *objs,
                        const struct dd_prof_stack_copy *copy, uint64_t *frames, uint32_t max)
{
    int64_t t0 = monotonic_ns();
    if (max < 2)
        return 0;
    u->objs = objs;
    u->copy = copy;
    u->frames = frames;
    u->max = max;
    sync_modules(u);
    walk(u);
    /* A frame in no recorded object: a library mapped since the last
     * scan. The caller scans this process's maps again (while it lives,
     * attaching to any new object with probes) and the walk is retried. */
    uint64_t last = u->n ? frames[u->n - 1] : copy->regs[DD_PROF_REG_PC];
    if (dd_prof_objects_find(u->objs, last) == NULL && t0 - u->last_rescan_ns > RESCAN_NS) {
        u->last_rescan_ns = t0;
        if (u->rescan(u->rescan_arg, u->pid)) {
            sync_modules(u);
            walk(u);
        }
    }
    if (u->n == 0) {
        /* Not even the probe site: keep it, so the sample still counts. */
        frames[u->n++] = copy->regs[DD_PROF_REG_PC];
    }
    /* libdwfl takes a return address it cannot read for the end of the
     * stack (and returns success): what ends a walk is told by the
     * reads, not by rc. */
    bool truncated = u->too_deep || u->read_past_copy;
    if (truncated) {
        frames[u->n++] = DD_PROF_TRUNCATED_FRAME;
        u->stats->truncated++;
    }
    u->stats->stacks++;
    u->stats->frames += u->n;
    u->stats->ns += (uint64_t)(monotonic_ns() - t0);
    return u->n;
}

void dd_prof_unwinder_free(struct dd_prof_unwinder *u)
{
    if (u == NULL)
        return;
    if (u->dwfl)
        dwfl_end(u->dwfl);
    free(u);
}

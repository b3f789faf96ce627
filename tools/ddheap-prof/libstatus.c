/*
 * What the ddheap library found wrong inside a profiled process. The
 * library never writes on the program's streams (docs/interpose.md, "What
 * the program sees"): it sets bits of the status word in the process-wide
 * object ddheap_shared_v3 (include/ddheap/coldpath.h). ddheap-prof reads
 * that word from the process's memory while it runs (at each rescan of
 * its maps and at the end) and says, on its own stderr, once per kind,
 * which process it first saw it in. A process that ends between two
 * reads (0.2 s apart) may go unreported.
 *
 * Every object that defines ddheap_shared_v3 (the preload library, an
 * executable or library linked with libddheap.a) is read: the dynamic
 * linker binds all of them to one instance (STB_GNU_UNIQUE), and the
 * others stay zero, so the bits are ORed.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <ddheap/coldpath.h>

#include "prof.h"

static const struct {
    uint64_t bit;
    const char *what;
} kinds[] = {
    {DDHEAP__STATUS_MALLOC_AHEAD, "malloc is bound to a definition ahead of ddheap's "
                                  "(an allocator preloaded first, or the executable's own): "
                                  "its allocations are not profiled"},
    {DDHEAP__STATUS_PREFIXED_ONLY, "an allocator with prefixed names only (je_malloc) is "
                                   "loaded: what it allocates is not profiled"},
    {DDHEAP__STATUS_BAD_ENABLED, "DD_HEAP_SAMPLING_ENABLED is not 1/true/yes/on or "
                                 "0/false/no/off: ignored, sampling stays enabled"},
    {DDHEAP__STATUS_BAD_INTERVAL, "DD_HEAP_SAMPLING_INTERVAL is not a positive byte count "
                                  "(such as 524288 or 512k): ignored, 524288 used"},
    {DDHEAP__STATUS_BAD_RATE, "DD_HEAP_SAMPLES_PER_SECOND is not a whole number: ignored, the "
                              "default limit used"},
};
_Static_assert(sizeof kinds / sizeof *kinds <= sizeof ((struct prof *)0)->lib_status_pid /
                                                   sizeof(pid_t),
               "one slot of lib_status_pid per kind");

static void note(struct prof *p, const struct dd_prof_proc *proc, uint64_t word)
{
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        if (!(word & kinds[k].bit) || (p->lib_status & kinds[k].bit))
            continue;
        p->lib_status |= kinds[k].bit;
        p->lib_status_pid[k] = proc->tgid;
        p->lib_status_name[k] = proc->name ? strdup(proc->name) : NULL;
    }
}

void dd_prof_read_library_status(struct prof *p, struct dd_prof_proc *proc)
{
    for (size_t i = 0; i < proc->objs.n; i++) {
        struct dd_prof_object *o = &proc->objs.v[i];
        if (!(o->probes & DD_PROF_HAS_ALLOC) || !o->file)
            continue;
        struct dd_prof_file *f = o->file;
        if (!f->status_looked) { /* once per file, whatever maps it */
            int fd = dd_prof_file_fd(f);
            if (fd < 0)
                continue;
            f->shared_vaddr = dd_prof_elf_dynamic_symbol(fd, "ddheap_shared_v3");
            f->status_looked = true;
        }
        if (f->shared_vaddr == 0)
            continue;
        uint64_t word = 0;
        struct iovec local = {&word, sizeof word};
        struct iovec remote = {(void *)(uintptr_t)(o->bias + f->shared_vaddr +
                                                   offsetof(struct ddheap__shared, status)),
                               sizeof word};
        if (process_vm_readv(proc->tgid, &local, 1, &remote, 1, 0) == (ssize_t)sizeof word)
            note(p, proc, word);
    }
}

void dd_prof_report_library_status(struct prof *p)
{
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
        if (!(p->lib_status & kinds[k].bit))
            continue;
        fprintf(stderr, "ddheap-prof: pid %d (%s): %s\n", (int)p->lib_status_pid[k],
                p->lib_status_name[k] ? p->lib_status_name[k] : "?", kinds[k].what);
        free(p->lib_status_name[k]);
        p->lib_status_name[k] = NULL;
    }
}

/*
 * The ELF objects mapped into a profiled process, as read from
 * /proc/PID/maps at attach and on every rescan. Each object keeps an open
 * descriptor of its file (opened through /proc/PID/map_files, or
 * /proc/PID/root: the process's own file, in its mount namespace) and the address ranges it was mapped at, so
 * stacks can be symbolised after the process has exited (or the file has
 * been replaced) and the profile can name its mappings and build ids.
 */
#ifndef DDHEAP_PROF_OBJECTS_H
#define DDHEAP_PROF_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct dd_prof_object {
    char *path;        /* as the kernel names it in the maps */
    uint64_t dev, ino; /* identity of the file: one object per load of it */
    uint64_t base;     /* start of the mapping of file offset 0 */
    uint64_t bias;     /* run-time address minus link-time address */
    uint64_t lo, hi;   /* span of all its mappings seen */
    uint64_t map_start, map_end; /* its first mapping: /proc/PID/map_files/START-END */
    uint64_t exec_start, exec_end, exec_offset; /* its executable mapping, if seen */
    int fd;            /* -1 if it could not be opened */
    char build_id[129]; /* hex, "" if none */
    unsigned probes;   /* DD_PROF_HAS_ALLOC | DD_PROF_HAS_FREE of the provider */
    bool attached;
    /* The link-time address of the object's ddheap_shared_v3, if it defines
     * it (0: not looked up yet, or none: see status_looked). */
    uint64_t shared_vaddr;
    bool status_looked;
};

struct dd_prof_objects {
    struct dd_prof_object *v;
    size_t n, cap;
};

/* Which provider's probes count as "has probes". */
void dd_prof_objects_set_provider(const char *provider);

/* Reads /proc/PID/maps and records the objects not seen before. Returns
 * the number of new objects, or -1 if the maps cannot be read (errno set:
 * ESRCH once the process is gone). */
int dd_prof_objects_scan(struct dd_prof_objects *objs, pid_t pid);

enum { DD_PROF_HAS_ALLOC = 1, DD_PROF_HAS_FREE = 2 };

/* Which of the provider's alloc and free probes the ELF file at path (or
 * fd, if >= 0) carries. A build without live-heap tracking has no free. */
unsigned dd_prof_elf_probes(const char *path, int fd);

/* The object whose mappings span addr, the latest loaded if several did. */
const struct dd_prof_object *dd_prof_objects_find(const struct dd_prof_objects *objs,
                                                  uint64_t addr);

void dd_prof_objects_free(struct dd_prof_objects *objs);

/* dst (empty) becomes a copy of src, with descriptors of its own: a
 * forked process's objects are its parent's. Returns 0 or -1. */
int dd_prof_objects_copy(struct dd_prof_objects *dst, const struct dd_prof_objects *src);

/* The value of the dynamic symbol `name` in the ELF file, or 0. */
uint64_t dd_prof_elf_dynamic_symbol(int fd, const char *name);

/* Whether the ELF file is glibc's dynamic loader, with the debugger's
 * hook: *offset is the file offset of _dl_debug_state, *to_state the
 * distance from it to _r_debug.r_state in memory. */
bool dd_prof_elf_loader_hook(int fd, uint64_t *offset, int64_t *to_state);

#endif

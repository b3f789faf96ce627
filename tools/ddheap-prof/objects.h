/*
 * The ELF objects mapped into a profiled process, as read from
 * /proc/PID/maps at attach and on every rescan: each one a load of a file
 * at an address range, so stacks can be symbolised after the process has
 * exited (or the file has been replaced) and the profile can name its
 * mappings and build ids.
 *
 * The files themselves are shared: one dd_prof_file per distinct file
 * (device and inode) however many processes map it (a server that forks
 * per connection maps the same libc thousands of times), with one open
 * descriptor (opened through /proc/PID/map_files, or /proc/PID/root: the
 * process's own file, in its mount namespace), one read of its ELF
 * headers and one symbolisation session (symbolize.c). Descriptors are
 * bounded (least recently used closed first, reopened when needed), and
 * whatever could not be opened or read is counted and said at the end.
 */
#ifndef DDHEAP_PROF_OBJECTS_H
#define DDHEAP_PROF_OBJECTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

struct dd_prof_file {
    uint64_t dev, ino;
    char *path;        /* as the first process that mapped it names it */
    int fd;            /* -1: not open (failed, or closed to stay in bounds) */
    bool elf;          /* its ELF headers were read */
    bool not_elf;      /* a mapped data file: never an object */
    uint64_t link_base; /* a load's bias is its address of offset 0 minus this */
    char build_id[129];
    unsigned probes;   /* DD_PROF_HAS_ALLOC | DD_PROF_HAS_FREE of the provider */
    uint64_t last_use; /* the bound's clock */
    /* What failed with it, for the end of the run: the first reason, the
     * distinct addresses in it left unnamed, the stacks whose unwinding
     * ended in it. */
    char why[200];
    uint64_t unnamed_frames, cut_stacks;
    void *sym; /* its symbolisation session (symbolize.c), or NULL */
    /* The link-time address of the file's ddheap_shared_v3, if it defines
     * it (0: not looked up yet, or none: see status_looked; libstatus.c). */
    uint64_t shared_vaddr;
    bool status_looked;
};

/* The file's descriptor (not the caller's to close), reopened if the bound
 * closed it; -1 if it cannot be had (the reason is recorded). */
int dd_prof_file_fd(struct dd_prof_file *f);
/* Records why something failed with f (the first reason is kept). */
void dd_prof_file_failed(struct dd_prof_file *f, const char *what, const char *why);
/* Called before a file's descriptor is closed: to stay in bounds (what
 * was built on it gives up its descriptors, keeping what it learnt), or
 * for good (a file opened at a later try, the end of the run: all of it
 * goes). symbolize.c registers its sessions' release. */
void dd_prof_files_on_close(void (*release)(struct dd_prof_file *f, bool for_good));
/* How many descriptors ddheap-prof's files and the sessions built on them
 * may hold, from RLIMIT_NOFILE (a quarter of it for the files and their
 * symbolisation, half for unwinding sessions, a quarter left to the rest). */
unsigned dd_prof_fd_budget(void);
/* Says on out what could not be read, and how much that cost (nothing if
 * all went well); returns the number of files that failed. */
unsigned dd_prof_files_report(FILE *out);
/* Counts the files that could be read only at a later try (an open that
 * failed for want of descriptors): a session built without one of them
 * is built again when this has changed. */
uint64_t dd_prof_files_generation(void);
/* Every file: the number of distinct ones seen. */
size_t dd_prof_files_count(void);
void dd_prof_files_free(void);

struct dd_prof_object {
    char *path;        /* as the kernel names it in the maps */
    uint64_t dev, ino; /* identity of the file: one object per load of it */
    uint64_t base;     /* start of the mapping of file offset 0 */
    uint64_t bias;     /* run-time address minus link-time address */
    uint64_t lo, hi;   /* span of all its mappings seen */
    uint64_t map_start, map_end; /* its first mapping: /proc/PID/map_files/START-END */
    uint64_t exec_start, exec_end, exec_offset; /* its executable mapping, if seen */
    struct dd_prof_file *file; /* shared with every load of the same file */
    const char *build_id; /* its file's, hex, "" if none */
    unsigned probes;   /* DD_PROF_HAS_ALLOC | DD_PROF_HAS_FREE of the provider */
    bool attach_tried, attached;
    bool semaphores_raised; /* by ddheap-prof in this process (attach.c) */
    bool announce;          /* attached now: said once its semaphores are raised */
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

/* One line of /proc/PID/maps that maps a file. */
struct dd_prof_mapping {
    uint64_t start, end, offset, dev, ino;
    char perms[8];
    char *path; /* in the line, its newline cut off */
};
/* Parses line (modified); false if it maps no file (anonymous, [heap],
 * [vdso]...) or cannot be read. */
bool dd_prof_parse_maps_line(char *line, struct dd_prof_mapping *m);

enum { DD_PROF_HAS_ALLOC = 1, DD_PROF_HAS_FREE = 2 };

/* Which of the provider's alloc and free probes the ELF file at path (or
 * fd, if >= 0) carries. A build without live-heap tracking has no free. */
unsigned dd_prof_elf_probes(const char *path, int fd);

/* The object whose mappings span addr, the latest loaded if several did. */
const struct dd_prof_object *dd_prof_objects_find(const struct dd_prof_objects *objs,
                                                  uint64_t addr);

void dd_prof_objects_free(struct dd_prof_objects *objs);

/* dst (empty) becomes a copy of src (sharing its files): a forked
 * process's objects are its parent's. Returns 0 or -1. */
int dd_prof_objects_copy(struct dd_prof_objects *dst, const struct dd_prof_objects *src);

/* The value of the dynamic symbol `name` in the ELF file, or 0. */
uint64_t dd_prof_elf_dynamic_symbol(int fd, const char *name);

/* Whether the ELF file is glibc's dynamic loader, with the debugger's
 * hook: *offset is the file offset of _dl_debug_state, *to_state the
 * distance from it to _r_debug.r_state in memory. */
bool dd_prof_elf_loader_hook(int fd, uint64_t *offset, int64_t *to_state);

struct dd_prof_elf_symbol {
    uint64_t value, size; /* link-time address (0: not found) and size */
};

/* The symbols names[0..n) of the ELF file fd, from its dynamic symbol
 * table, else its full one (out[k].value 0 if in neither). */
bool dd_prof_elf_symbols(int fd, const char *const *names, size_t n,
                         struct dd_prof_elf_symbol *out);
/* len bytes of the file as loaded at link-time address vaddr (initialised
 * data, before any relocation); false if not all of them are in the file. */
bool dd_prof_elf_read(int fd, uint64_t vaddr, void *buf, size_t len);

#endif

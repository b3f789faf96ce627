/*
 * Where a USDT probe sits in an ELF file, as uprobes want it: the file
 * offsets of its instruction and of its semaphore, from .note.stapsdt.
 * ddheap-prof places one uprobe per site (attach.c) and reads the arguments from the registers the probe
 * contract fixes (docs/probes.md): a note whose arguments are elsewhere
 * is refused, not misread.
 */
#ifndef DDHEAP_PROF_PROBE_SITES_H
#define DDHEAP_PROF_PROBE_SITES_H

#include <stddef.h>
#include <stdint.h>

struct dd_prof_probe_site {
    uint64_t offset;           /* of the probe's instruction in the file */
    uint64_t semaphore_offset; /* of its semaphore in the file; 0: none */
    uint64_t semaphore_addr;   /* its link-time address (add the load bias); 0: none */
};

enum { DD_PROF_MAX_SITES = 8 };

/* The sites of provider:name in the ELF file open as fd, whose nargs
 * arguments must be 64-bit values in the SysV argument registers (rdi,
 * rsi, rdx; x0, x1, x2), in order. Returns how many (up to max; 0: no
 * such probe), or -1 with the reason in why. */
int dd_prof_probe_sites(int fd, const char *provider, const char *name, unsigned nargs,
                        struct dd_prof_probe_site *out, size_t max, char *why, size_t why_len);

#endif

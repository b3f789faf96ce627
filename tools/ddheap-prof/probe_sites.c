/*
 * .note.stapsdt (sys/sdt.h): each note's description holds three
 * addresses, the probe's, the link-time address of .stapsdt.base and the
 * semaphore's, then provider, name and argument spec as C strings. A
 * prelinked or otherwise moved file tells by its .stapsdt.base section's
 * address differing from the recorded one: both addresses move by the
 * difference. Addresses become file offsets through the PT_LOAD segment
 * that holds them (the uprobe is placed by file offset, and so is the
 * semaphore, the kernel's ref_ctr_offset).
 */
#include "probe_sites.h"

#include <gelf.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define NT_STAPSDT 3

#if defined(__aarch64__)
static const char *const arg_registers[] = {"x0", "x1", "x2"};
#else
static const char *const arg_registers[] = {"%rdi", "%rsi", "%rdx"};
#endif

/* Whether spec is "8@R1 8@R2 ..." (or -8@: a sign changes nothing for a
 * 64-bit register) with the contract's registers, nargs of them. */
static bool args_in_registers(const char *spec, unsigned nargs)
{
    for (unsigned i = 0; i < nargs; i++) {
        spec += strspn(spec, " ");
        if (*spec == '-')
            spec++;
        if (strncmp(spec, "8@", 2) != 0)
            return false;
        spec += 2;
        size_t len = strlen(arg_registers[i]);
        if (strncmp(spec, arg_registers[i], len) != 0 || (spec[len] != ' ' && spec[len] != '\0'))
            return false;
        spec += len;
    }
    return spec[strspn(spec, " ")] == '\0';
}

/* The file offset of address addr, through the PT_LOAD segment holding
 * it; false if none does. */
static bool file_offset_of(Elf *elf, uint64_t addr, uint64_t *offset)
{
    size_t n;
    if (elf_getphdrnum(elf, &n) != 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        GElf_Phdr ph;
        if (gelf_getphdr(elf, (int)i, &ph) && ph.p_type == PT_LOAD && addr >= ph.p_vaddr &&
            addr < ph.p_vaddr + ph.p_memsz) {
            *offset = addr - ph.p_vaddr + ph.p_offset;
            return true;
        }
    }
    return false;
}

/* The address of .stapsdt.base, or 0. */
static uint64_t stapsdt_base(Elf *elf)
{
    size_t shstrndx;
    if (elf_getshdrstrndx(elf, &shstrndx) != 0)
        return 0;
    Elf_Scn *scn = NULL;
    while ((scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        const char *name;
        if (gelf_getshdr(scn, &sh) && (name = elf_strptr(elf, shstrndx, sh.sh_name)) &&
            strcmp(name, ".stapsdt.base") == 0)
            return sh.sh_addr;
    }
    return 0;
}

/* One note: its site into out[*n] if it is provider:name. -1 (why
 * filled) for a note of the probe that cannot be used. */
static int take_note(Elf *elf, uint64_t base_now, const char *desc, size_t len,
                     const char *provider, const char *name, unsigned nargs,
                     struct dd_prof_probe_site *out, size_t max, size_t *n, char *why,
                     size_t why_len)
{
    size_t at = 3 * sizeof(uint64_t);
    if (len <= at || gelf_getclass(elf) != ELFCLASS64)
        return 0;
    uint64_t addr[3];
    memcpy(addr, desc, sizeof addr);
    const char *strings[3];
    for (int i = 0; i < 3; i++) {
        if (at >= len)
            return 0;
        strings[i] = desc + at;
        size_t l = strnlen(strings[i], len - at);
        if (at + l >= len)
            return 0; /* not terminated */
        at += l + 1;
    }
    if (strcmp(strings[0], provider) != 0 || strcmp(strings[1], name) != 0)
        return 0;
    if (!args_in_registers(strings[2], nargs)) {
        snprintf(why, why_len,
                 "%s:%s's arguments are \"%s\", not the %u registers of the probe contract "
                 "(docs/probes.md)",
                 provider, name, strings[2], nargs);
        return -1;
    }
    uint64_t shift = base_now && addr[1] ? base_now - addr[1] : 0;
    struct dd_prof_probe_site s = {0, 0, addr[2] ? addr[2] + shift : 0};
    if (!file_offset_of(elf, addr[0] + shift, &s.offset) ||
        (addr[2] && !file_offset_of(elf, addr[2] + shift, &s.semaphore_offset))) {
        snprintf(why, why_len, "%s:%s: its address is in no loaded segment", provider, name);
        return -1;
    }
    if (*n < max)
        out[(*n)++] = s;
    return 0;
}

int dd_prof_probe_sites(int fd, const char *provider, const char *name, unsigned nargs,
                        struct dd_prof_probe_site *out, size_t max, char *why, size_t why_len)
{
    if (elf_version(EV_CURRENT) == EV_NONE) {
        snprintf(why, why_len, "libelf: %s", elf_errmsg(-1));
        return -1;
    }
    Elf *elf = elf_begin(fd, ELF_C_READ, NULL);
    if (elf == NULL || elf_kind(elf) != ELF_K_ELF) {
        snprintf(why, why_len, "not an ELF file");
        if (elf)
            elf_end(elf);
        return -1;
    }
    uint64_t base_now = stapsdt_base(elf);
    size_t n = 0;
    int rc = 0;
    Elf_Scn *scn = NULL;
    while (rc == 0 && (scn = elf_nextscn(elf, scn)) != NULL) {
        GElf_Shdr sh;
        Elf_Data *data;
        if (gelf_getshdr(scn, &sh) == NULL || sh.sh_type != SHT_NOTE ||
            (data = elf_getdata(scn, NULL)) == NULL)
            continue;
        size_t off = 0, name_off, desc_off;
        GElf_Nhdr nh;
        while (rc == 0 && (off = gelf_getnote(data, off, &nh, &name_off, &desc_off)) > 0)
            if (nh.n_type == NT_STAPSDT && nh.n_namesz == 8 &&
                memcmp((const char *)data->d_buf + name_off, "stapsdt", 8) == 0)
                rc = take_note(elf, base_now, (const char *)data->d_buf + desc_off, nh.n_descsz,
                               provider, name, nargs, out, max, &n, why, why_len);
    }
    elf_end(elf);
    return rc < 0 ? -1 : (int)n;
}

/*
 * ddheap-run-check EXECUTABLE < LIBRARIES: what ddheap-run says, before it
 * execs a program, when libddheap_preload.so will not be in charge of the
 * program's malloc (tools/ddheap-run.in, docs/interpose.md). Reads the
 * dynamic symbol tables of the executable and of the libraries it loads
 * (their paths on stdin, one a line, as ldd resolves them) and prints at
 * most one line on stdout:
 *   - the executable defines malloc: the dynamic linker binds every
 *     object's malloc to it, ahead of any preloaded library;
 *   - an object defines an allocator with prefixed names only (je_malloc):
 *     its callers never go through malloc.
 * A symbol `malloc` that is UNDEFINED (st_shndx == SHN_UNDEF) is no
 * definition, whatever its value: a non-PIE executable that takes
 * malloc's address (Debian's python3) has one whose value is its PLT
 * entry (a canonical PLT entry), which jumps to the real binding, the
 * preloaded library's malloc.
 *
 * Runs in ddheap-run's process, never in the program: nothing inside a
 * profiled process writes on its streams. Files it cannot read (not ELF,
 * another class, no section headers) say nothing.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NATIVE_CLASS (__ELF_NATIVE_CLASS == 64 ? ELFCLASS64 : ELFCLASS32)

static const char *const prefixed_names[] = {"je_malloc", "_rjem_malloc", "je_mallocx"};

struct defines {
    bool malloc;
    const char *prefixed; /* the first prefixed name defined, or NULL */
};

/* The names `path` defines in its dynamic symbol table. */
static struct defines read_defines(const char *path)
{
    struct defines d = {false, NULL};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return d;
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size >= sizeof(ElfW(Ehdr)))
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return d;
    const unsigned char *file = map;
    size_t size = (size_t)st.st_size;
    const ElfW(Ehdr) *eh = map;
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != NATIVE_CLASS ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(ElfW(Shdr)) < eh->e_shnum)
        goto out;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(file + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_entsize != sizeof(ElfW(Sym)) ||
            sh[i].sh_link >= eh->e_shnum || sh[i].sh_offset > size ||
            size - sh[i].sh_offset < sh[i].sh_size)
            continue;
        const ElfW(Shdr) *strtab = &sh[sh[i].sh_link];
        if (strtab->sh_offset > size || size - strtab->sh_offset < strtab->sh_size)
            continue;
        const char *names = (const char *)file + strtab->sh_offset;
        const ElfW(Sym) *sym = (const ElfW(Sym) *)(file + sh[i].sh_offset);
        size_t count = sh[i].sh_size / sizeof(ElfW(Sym));
        for (size_t k = 0; k < count; k++) {
            unsigned bind = ELF64_ST_BIND(sym[k].st_info); /* the same as ELF32_ST_BIND */
            if (sym[k].st_shndx == SHN_UNDEF || sym[k].st_name >= strtab->sh_size ||
                (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE))
                continue;
            const char *name = names + sym[k].st_name;
            if (strnlen(name, strtab->sh_size - sym[k].st_name) == strtab->sh_size - sym[k].st_name)
                continue; /* not terminated inside the table */
            if (strcmp(name, "malloc") == 0)
                d.malloc = true;
            for (size_t p = 0; p < sizeof prefixed_names / sizeof *prefixed_names; p++)
                if (d.prefixed == NULL && strcmp(name, prefixed_names[p]) == 0)
                    d.prefixed = prefixed_names[p];
        }
    }
out:
    munmap(map, size);
    return d;
}

static void say_prefixed(const char *path, const char *name)
{
    printf("%s allocates through %s (an allocator with prefixed names only), which ddheap "
           "cannot wrap: those allocations are not profiled\n", path, name);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fputs("usage: ddheap-run-check EXECUTABLE < LIBRARIES\n", stderr);
        return 2;
    }
    struct defines exe = read_defines(argv[1]);
    if (exe.malloc) {
        printf("malloc is defined by %s, ahead of libddheap_preload.so: the program runs with "
               "it, unprofiled\n", argv[1]);
        return 0;
    }
    if (exe.prefixed != NULL) {
        say_prefixed(argv[1], exe.prefixed);
        return 0;
    }
    /* A library that defines malloc too is wrapped: it comes after
     * libddheap_preload.so, which forwards to it. */
    char line[4096];
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        struct defines lib = read_defines(line);
        if (lib.prefixed != NULL && !lib.malloc) {
            say_prefixed(line, lib.prefixed);
            return 0;
        }
    }
    return 0;
}

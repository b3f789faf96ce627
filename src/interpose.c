/*
 * In-process interposition of libc's malloc family: dd_heap_interpose_libc()
 * points the malloc-family entries of every loaded object's GOT at wrappers
 * that run the ddheap hooks around glibc's own functions, for a process
 * that cannot be restarted under LD_PRELOAD (an agent, a plugin, a Python
 * extension module). docs/interpose.md says what it covers and what not.
 *
 * How. dl_iterate_phdr lists the loaded objects; each one's dynamic section
 * leads to its symbol and string tables and to its relocations: the PLT
 * ones (DT_JMPREL, JUMP_SLOT: calls) and the others (DT_RELA, GLOB_DAT:
 * function pointers, and calls under -fno-plt or -z now). A relocation
 * against an undefined symbol named malloc, free, ... names a GOT slot
 * that the dynamic linker filled (or, under lazy binding, left pointing
 * into the object's own PLT); that slot gets the wrapper's address. Slots
 * under RELRO are read-only after start-up: they are made writable with
 * mprotect for the write and read-only again. dlopen and dlmopen are
 * rewritten too, so that an object loaded later is rewritten as soon as it
 * is loaded.
 *
 * The wrappers never call through a slot they replaced: they call glibc's
 * __libc_* entry points (src/libc_family.h), so a slot that still pointed
 * into a lazy PLT needs nothing, and restoring a slot cannot leave a
 * wrapper calling itself.
 *
 * Only the pointer-preserving (shadow) scheme may do this (DESIGN §9):
 * blocks allocated before the rewrite, or in objects it never reached,
 * are freed through the wrappers, and blocks the wrappers sampled are
 * freed past them after stop. An archive built with another scheme
 * refuses, with ENOTSUP and a line on stderr.
 *
 * Unloading. Every write happens inside a dl_iterate_phdr callback, to an
 * object that callback reports: the dynamic linker holds its list lock,
 * so the object cannot be unmapped during the write. Each saved entry
 * remembers its object (load address and name); stop restores an entry
 * only into an object that is loaded now under the same name at the same
 * address and whose slot still holds the wrapper. An object unloaded in
 * the meantime is skipped (its slots are gone with it); one reloaded at
 * another address is a new object, rewritten when it was loaded and
 * restored through its own entries.
 */
#define _GNU_SOURCE

#include "internal.h"

#include <ddheap.h>

#include <errno.h>
#include <string.h>
#include <unistd.h>

#if DDHEAP_MARK_SHADOW

#include "libc_family.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__x86_64__)
#define DDHEAP_R_JUMP_SLOT R_X86_64_JUMP_SLOT
#define DDHEAP_R_GLOB_DAT R_X86_64_GLOB_DAT
#elif defined(__aarch64__)
#define DDHEAP_R_JUMP_SLOT R_AARCH64_JUMP_SLOT
#define DDHEAP_R_GLOB_DAT R_AARCH64_GLOB_DAT
#endif

/* --- the replacements --- */

static void *wrap_malloc(size_t size)
{
    return ddheap_libc_malloc(size);
}

static void wrap_free(void *ptr)
{
    ddheap_libc_free(ptr);
}

static void *wrap_calloc(size_t count, size_t size)
{
    return ddheap_libc_calloc(count, size);
}

static void *wrap_realloc(void *ptr, size_t size)
{
    return ddheap_libc_realloc(ptr, size);
}

static void *wrap_reallocarray(void *ptr, size_t count, size_t size)
{
    return ddheap_libc_reallocarray(ptr, count, size);
}

static int wrap_posix_memalign(void **out, size_t alignment, size_t size)
{
    return ddheap_libc_posix_memalign(out, alignment, size);
}

static void *wrap_memalign(size_t alignment, size_t size)
{
    return ddheap_libc_memalign(alignment, size);
}

static void *wrap_valloc(size_t size)
{
    return ddheap_libc_valloc(size);
}

static void *wrap_pvalloc(size_t size)
{
    return ddheap_libc_pvalloc(size);
}

static void rescan_after_load(void);

/* The real dlopen is called through this object's own GOT, which is never
 * rewritten. glibc takes the caller's identity from the return address:
 * names without a slash are searched with the RUNPATH of the object that
 * holds ddheap, not the caller's, and the namespace is ddheap's
 * (docs/interpose.md, "Limits"). */
static void *wrap_dlopen(const char *file, int mode)
{
    void *handle = dlopen(file, mode);
    if (handle != NULL) {
        int saved = errno;
        rescan_after_load();
        errno = saved;
    }
    return handle;
}

static void *wrap_dlmopen(Lmid_t namespace_id, const char *file, int mode)
{
    void *handle = dlmopen(namespace_id, file, mode);
    if (handle != NULL) {
        int saved = errno;
        rescan_after_load();
        errno = saved;
    }
    return handle;
}

struct replacement {
    const char *name;
    void *wrapper;
    void *real; /* glibc's own definition of `name` (libc.so.6), or NULL */
};

/* Function pointers as data pointers: POSIX guarantees the conversion
 * (dlsym relies on it); ISO C does not, hence the union. */
union fn_as_data {
    void (*fn)(void);
    void *data;
};
#define AS_DATA(f) (((union fn_as_data){.fn = (void (*)(void))(f)}).data)

static struct replacement replacements[] = {
    {"malloc", NULL, NULL},
    {"free", NULL, NULL},
    {"calloc", NULL, NULL},
    {"realloc", NULL, NULL},
    {"reallocarray", NULL, NULL},
    {"posix_memalign", NULL, NULL},
    {"aligned_alloc", NULL, NULL},
    {"memalign", NULL, NULL},
    {"valloc", NULL, NULL},
    {"pvalloc", NULL, NULL},
    {"dlopen", NULL, NULL},
    {"dlmopen", NULL, NULL},
};
#define N_REPLACEMENTS (sizeof replacements / sizeof replacements[0])

/* Binds the glibc functions the wrappers call, once, outside any malloc:
 * the object that holds ddheap is never rewritten and need not be linked
 * -z now, and a lazy binding must not run inside a hooked malloc. All but
 * pvalloc: it is obsolete, and valgrind aborts the program that calls it,
 * so it alone is bound at its first call. */
static void bind_glibc_entry_points(void)
{
    __libc_free(__libc_malloc(1));
    __libc_free(__libc_calloc(1, 1));
    __libc_free(__libc_realloc(NULL, 1));
    __libc_free(__libc_memalign(16, 1));
    __libc_free(__libc_valloc(1));
    (void)ddheap_libc_page_size();
}

/* Fills in the wrappers and glibc's own definitions, looked up in
 * libc.so.6 itself: in an executable built without -fPIE, the address of a
 * function taken there is the executable's PLT entry, not glibc's. False
 * if libc.so.6 is not loaded (a static program, another C library). */
static bool fill_replacements(void)
{
    void *wrappers[N_REPLACEMENTS] = {
        AS_DATA(wrap_malloc),         AS_DATA(wrap_free),     AS_DATA(wrap_calloc),
        AS_DATA(wrap_realloc),        AS_DATA(wrap_reallocarray),
        AS_DATA(wrap_posix_memalign), AS_DATA(wrap_memalign), AS_DATA(wrap_memalign),
        AS_DATA(wrap_valloc),         AS_DATA(wrap_pvalloc),  AS_DATA(wrap_dlopen),
        AS_DATA(wrap_dlmopen),
    };
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libc == NULL)
        return false;
    for (size_t i = 0; i < N_REPLACEMENTS; i++) {
        replacements[i].wrapper = wrappers[i];
        replacements[i].real = dlsym(libc, replacements[i].name);
    }
    dlclose(libc); /* RTLD_NOLOAD took a reference: give it back */
    return true;
}

static const struct replacement *replacement_for(const char *name)
{
    for (size_t i = 0; i < N_REPLACEMENTS; i++)
        if (strcmp(replacements[i].name, name) == 0)
            return &replacements[i];
    return NULL;
}

static bool is_wrapper(uintptr_t value)
{
    for (size_t i = 0; i < N_REPLACEMENTS; i++)
        if ((uintptr_t)replacements[i].wrapper == value)
            return true;
    return false;
}

/* --- saved entries (mmap'ed: nothing here may use the heap it hooks) --- */

struct saved_slot {
    uintptr_t slot;     /* address of the GOT entry */
    uintptr_t original; /* what it held before the rewrite */
    uintptr_t base;     /* dlpi_addr of its object */
    uint64_t name_hash; /* of dlpi_name: the object's identity with base */
};

#define MAX_SAVED 32768u
static struct saved_slot *saved;
static size_t n_saved;
static bool active;
static int failure; /* first error met by a callback (errno value) */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t hash_name(const char *name)
{
    uint64_t h = UINT64_C(1469598103934665603); /* FNV-1a */
    for (; name != NULL && *name; name++)
        h = (h ^ (unsigned char)*name) * UINT64_C(1099511628211);
    return h;
}

static bool ensure_table(void)
{
    if (saved != NULL)
        return true;
    void *p = mmap(NULL, MAX_SAVED * sizeof *saved, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return false;
    saved = p;
    return true;
}

/* --- one object --- */

struct object {
    uintptr_t base;
    const char *name;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const ElfW(Rela) *tables[2]; /* DT_JMPREL, DT_RELA */
    size_t sizes[2];
    uintptr_t relro_start, relro_end; /* 0, 0 when none */
    const struct dl_phdr_info *info;
};

/* glibc relocates the address entries of a loaded object's dynamic section
 * in place (to absolute addresses) except where the section is read-only
 * (the vDSO, some architectures); an entry below the load address is still
 * relative. */
static uintptr_t dyn_address(uintptr_t base, uintptr_t value)
{
    return value < base ? base + value : value;
}

static bool read_object(const struct dl_phdr_info *info, struct object *o)
{
    memset(o, 0, sizeof *o);
    o->info = info;
    o->base = info->dlpi_addr;
    o->name = info->dlpi_name;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(o->base + ph->p_vaddr);
        else if (ph->p_type == PT_GNU_RELRO) {
            o->relro_start = o->base + ph->p_vaddr;
            o->relro_end = o->relro_start + ph->p_memsz;
        }
    }
    if (dyn == NULL)
        return false;
    bool rela = true;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        switch (dyn->d_tag) {
        case DT_SYMTAB: o->symtab = (const ElfW(Sym) *)dyn_address(o->base, dyn->d_un.d_ptr); break;
        case DT_STRTAB: o->strtab = (const char *)dyn_address(o->base, dyn->d_un.d_ptr); break;
        case DT_JMPREL: o->tables[0] = (const ElfW(Rela) *)dyn_address(o->base, dyn->d_un.d_ptr); break;
        case DT_PLTRELSZ: o->sizes[0] = dyn->d_un.d_val; break;
        case DT_RELA: o->tables[1] = (const ElfW(Rela) *)dyn_address(o->base, dyn->d_un.d_ptr); break;
        case DT_RELASZ: o->sizes[1] = dyn->d_un.d_val; break;
        case DT_PLTREL: rela = dyn->d_un.d_val == DT_RELA; break;
        default: break;
        }
    }
    /* x86-64 and aarch64 use RELA only; anything else is not ours to edit. */
    return rela && o->symtab != NULL && o->strtab != NULL;
}

static bool contains(const struct dl_phdr_info *info, uintptr_t address)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && address >= start && address - start < ph->p_memsz)
            return true;
    }
    return false;
}

static bool skipped(const struct dl_phdr_info *info)
{
    /* ddheap's own object keeps the real functions (the wrappers' dlopen
     * goes through its GOT); the vDSO has no GOT to speak of. */
    if (contains(info, (uintptr_t)AS_DATA(wrap_malloc)))
        return true;
    return info->dlpi_name != NULL && strncmp(info->dlpi_name, "linux-vdso", 10) == 0;
}

/* Stores `value` into a GOT slot, making a RELRO page writable for the
 * write. The store is one aligned word: a thread calling through the slot
 * sees the old or the new function, never a torn address. */
static int write_slot(const struct object *o, uintptr_t slot, uintptr_t value)
{
    /* The dynamic linker protects whole pages from the start of RELRO
     * rounded down to its end rounded down: a slot in a last partial page
     * stays writable, and must not be made read-only here. */
    uintptr_t page_size = (uintptr_t)ddheap_libc_page_size();
    uintptr_t relro_start = o->relro_start & ~(page_size - 1);
    uintptr_t relro_end = o->relro_end & ~(page_size - 1);
    bool relro = slot >= relro_start && slot < relro_end;
    void *page = (void *)(slot & ~(page_size - 1));
    if (relro && mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0)
        return errno;
    __atomic_store_n((uintptr_t *)slot, value, __ATOMIC_RELEASE);
    if (relro && mprotect(page, page_size, PROT_READ) != 0)
        return errno;
    return 0;
}

/* Calls `visit` on every GOT slot of `o` that belongs to a replaced
 * function imported (not defined) by it. */
static void for_each_slot(const struct object *o,
                          void (*visit)(const struct object *, uintptr_t slot,
                                        const struct replacement *r))
{
    for (int t = 0; t < 2; t++) {
        const ElfW(Rela) *rel = o->tables[t];
        size_t n = o->sizes[t] / sizeof *rel;
        for (size_t i = 0; rel != NULL && i < n; i++) {
            uint32_t type = (uint32_t)ELF64_R_TYPE(rel[i].r_info);
            if (type != DDHEAP_R_JUMP_SLOT && type != DDHEAP_R_GLOB_DAT)
                continue;
            const ElfW(Sym) *sym = &o->symtab[ELF64_R_SYM(rel[i].r_info)];
            if (ELF64_ST_TYPE(sym->st_info) == STT_OBJECT)
                continue;
            const struct replacement *r = replacement_for(o->strtab + sym->st_name);
            if (r == NULL)
                continue;
            /* An object that defines the function itself keeps it, unless
             * the definition is glibc's own: libc.so's calls to its malloc
             * (strdup, fopen, ...) go through such slots. */
            if (sym->st_shndx != SHN_UNDEF &&
                (r->real == NULL || o->base + sym->st_value != (uintptr_t)r->real))
                continue;
            visit(o, o->base + rel[i].r_offset, r);
        }
    }
}

/* --- rewrite --- */

static void rewrite_slot(const struct object *o, uintptr_t slot, const struct replacement *r)
{
    uintptr_t current = __atomic_load_n((uintptr_t *)slot, __ATOMIC_ACQUIRE);
    if (is_wrapper(current))
        return; /* rewritten already (a rescan) */
    /* Only a slot bound to glibc's function, or not bound yet (a lazy slot
     * points into its own object's PLT), is ours to rewrite. A slot bound
     * elsewhere (jemalloc in an RTLD_DEEPBIND or local scope, a copy of the
     * function, an object ld.so has not relocated yet) keeps its binding:
     * a wrapper over glibc there would hand glibc blocks it never made. */
    if (current != (uintptr_t)r->real && !contains(o->info, current))
        return;
    if (n_saved == MAX_SAVED) {
        if (failure == 0)
            failure = ENOMEM;
        return;
    }
    int err = write_slot(o, slot, (uintptr_t)r->wrapper);
    if (err != 0) {
        if (failure == 0)
            failure = err;
        return;
    }
    saved[n_saved++] = (struct saved_slot){slot, current, o->base, hash_name(o->name)};
}

static int rewrite_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    (void)ctx;
    struct object o;
    if (!skipped(info) && read_object(info, &o))
        for_each_slot(&o, rewrite_slot);
    return 0;
}

static void rescan_after_load(void)
{
    pthread_mutex_lock(&lock);
    if (active)
        dl_iterate_phdr(rewrite_object, NULL);
    pthread_mutex_unlock(&lock);
}

/* --- restore --- */

static int restore_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    (void)ctx;
    struct object o;
    if (skipped(info) || !read_object(info, &o))
        return 0;
    uint64_t name_hash = hash_name(o.name);
    for (size_t i = 0; i < n_saved; i++) {
        struct saved_slot *s = &saved[i];
        if (s->slot == 0 || s->base != o.base || s->name_hash != name_hash || !contains(info, s->slot))
            continue;
        if (is_wrapper(__atomic_load_n((uintptr_t *)s->slot, __ATOMIC_ACQUIRE))) {
            int err = write_slot(&o, s->slot, s->original);
            if (err != 0 && failure == 0)
                failure = err;
        }
        s->slot = 0; /* done (or no longer ours to touch) */
    }
    return 0;
}

/* malloc & co. as the process binds them must be glibc's: if another
 * allocator (jemalloc, tcmalloc, libddheap_preload.so) serves the
 * process, wrappers over glibc's functions would mix two heaps. */
static bool process_uses_glibc_malloc(void)
{
    static const char *const names[] = {"malloc", "free", "calloc", "realloc"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const struct replacement *r = replacement_for(names[i]);
        if (r->real == NULL || dlsym(RTLD_DEFAULT, names[i]) != r->real)
            return false;
    }
    return true;
}

/* A child forked while another thread held the lock would wait for it for
 * ever at its first dlopen (the rescan): only the forking thread is left. */
static void reset_lock_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
}

static void say(const char *line)
{
    ssize_t ignored = write(STDERR_FILENO, line, strlen(line));
    (void)ignored;
}

int dd_heap_interpose_libc(void)
{
    static bool atfork_registered;
    pthread_mutex_lock(&lock);
    int result = 0;
    if (!atfork_registered)
        atfork_registered = pthread_atfork(NULL, NULL, reset_lock_in_child) == 0;
    if (!fill_replacements() || !process_uses_glibc_malloc()) {
        say("ddheap: dd_heap_interpose_libc: malloc in this process is not glibc's "
            "(another allocator, or libddheap_preload.so, is loaded); nothing rewritten\n");
        result = EBUSY;
    } else if (!ensure_table()) {
        result = ENOMEM;
    } else {
        ddheap_process_init();
        bind_glibc_entry_points();
        failure = 0;
        active = true;
        dl_iterate_phdr(rewrite_object, NULL);
        result = failure;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

int dd_heap_interpose_libc_stop(void)
{
    pthread_mutex_lock(&lock);
    int result = 0;
    if (active) {
        failure = 0;
        active = false;
        dl_iterate_phdr(restore_object, NULL);
        n_saved = 0;
        result = failure;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

#else /* not the shadow scheme */

static void refuse(void)
{
    static const char line[] =
        "ddheap: dd_heap_interpose_libc: this libddheap.a marks sampled blocks in a way that "
        "frees past the hooks would corrupt; rebuild it with meson -Dmarking=shadow "
        "(docs/interpose.md)\n";
    ssize_t ignored = write(STDERR_FILENO, line, sizeof line - 1);
    (void)ignored;
}

int dd_heap_interpose_libc(void)
{
    refuse();
    return ENOTSUP;
}

int dd_heap_interpose_libc_stop(void)
{
    return 0; /* nothing was ever rewritten */
}

#endif

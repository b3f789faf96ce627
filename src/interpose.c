/*
 * In-process interposition of the malloc family: dd_heap_interpose_libc()
 * points the malloc-family entries of every loaded object's GOT at wrappers
 * that run the ddheap hooks around the function the entry was bound to,
 * for a process that cannot be restarted under LD_PRELOAD (an agent, a
 * plugin, a Python extension module). docs/interpose.md says what it
 * covers and what not. The names come from src/malloc_family.def.
 *
 * How. dl_iterate_phdr lists the loaded objects; each one's dynamic section
 * leads to its symbol and string tables and to its relocations: the PLT
 * ones (DT_JMPREL, JUMP_SLOT: calls) and the others (DT_RELA, GLOB_DAT:
 * function pointers, and calls under -fno-plt or -z now). A relocation
 * against a symbol named malloc, free, ... names a GOT slot that the
 * dynamic linker filled (or, under lazy binding, left pointing into the
 * object's own PLT); that slot gets the wrapper's address. Slots under
 * RELRO are read-only after start-up: they are made writable with mprotect
 * for the write and read-only again. dlopen and dlmopen are rewritten too,
 * so that an object loaded later is rewritten as soon as it is loaded.
 *
 * Which allocator. Each wrapper forwards to what the process's global
 * scope binds its name to (glibc's malloc, or jemalloc's, tcmalloc's, the
 * executable's own), looked up once; reallocarray goes through the realloc
 * wrapper. Only a slot bound to exactly that function, or a lazy slot of
 * an object whose own scope resolves the name to it, is rewritten: a slot
 * bound elsewhere (an RTLD_DEEPBIND or local-scope object over an
 * allocator of its own) keeps its binding, so no allocator is ever handed
 * another's block. The wrappers call through the pointers they were given,
 * never through a slot, so a lazy slot needs nothing and restoring a slot
 * cannot leave a wrapper calling itself.
 *
 * Locks. dlopen, dlsym, dladdr and dlinfo take the dynamic linker's lock,
 * which a thread inside dlopen holds while constructors run; such a
 * constructor may call the wrapped dlopen, whose rescan takes ddheap's
 * lock. So ddheap's lock is never held while calling any of them: every
 * lookup (the bindings, then each object opened again by name to learn
 * that it is fully loaded and what its scope resolves) happens first,
 * without the lock; under it only dl_iterate_phdr runs (its own lock is
 * not held by a thread running constructors) and slots are written.
 *
 * Only the pointer-preserving (shadow) scheme may do this
 * (docs/interpose.md): blocks allocated before the rewrite, or in objects
 * it never reached, are freed through the wrappers, and blocks the
 * wrappers sampled are freed past them after stop. An archive built with
 * another scheme refuses, with ENOTSUP and a line on stderr.
 *
 * Protection. Each saved entry keeps, with the slot's address and the
 * value it held, the protection its page had (read-only under RELRO,
 * writable otherwise): stop writes the value back and gives the page that
 * protection again, so the object is as it was, byte for byte.
 *
 * Two users: dd_heap_interpose_libc() (a program's own call) and the
 * injected agent (src/agent/), both through ddheap_interpose_begin/end.
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

/* Where each wrapper hands its call: the function the process's global
 * scope binds the name to (glibc's, or jemalloc's, tcmalloc's, the
 * program's own), found once by find_bindings() before any slot points at
 * a wrapper, and never changed afterwards. reallocarray goes through
 * wrap_realloc (glibc's reallocarray is realloc with an overflow check). */
static struct ddheap_family_targets target;

#define DDHEAP_FAMILY(name, class, via)                                                \
    static DDHEAP_##class##_TYPE(wrap_##name)                                          \
    {                                                                                  \
        DDHEAP_##class##_RETURN(ddheap_family_##class(target.name, DDHEAP_##class##_ARGS)) \
    }
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23

static void rescan_after_load(void);

/* The real dlopen is called through this object's own GOT, which is never
 * rewritten. glibc takes the caller's identity from the return address:
 * names without a slash are searched with the RUNPATH of the object that
 * holds ddheap, not the caller's, and the namespace is ddheap's
 * (docs/interpose.md, "Limits"). The rescan runs after dlopen returned,
 * outside the loader's lock, but possibly inside a constructor that holds
 * it (a library whose constructor dlopens): rescan_after_load takes
 * ddheap's lock only around work that never waits for the loader's. */
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
    void *bound; /* what the global scope binds `name` to, or NULL */
    void *real;  /* the definition behind it: `bound`, or past a PLT stub */
};

/* Function pointers as data pointers: POSIX guarantees the conversion
 * (dlsym relies on it); ISO C does not, hence the union. */
union fn_as_data {
    void (*fn)(void);
    void *data;
};
#define AS_DATA(f) (((union fn_as_data){.fn = (void (*)(void))(f)}).data)
#define AS_FN(type, d) ((type *)((union fn_as_data){.data = (d)}).fn)

/* The malloc family (src/malloc_family.def), then dlopen and dlmopen. */
static struct replacement replacements[] = {
#define DDHEAP_FAMILY(name, class, via) {#name, NULL, NULL, NULL},
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
    {"dlopen", NULL, NULL, NULL},
    {"dlmopen", NULL, NULL, NULL},
};
#define N_REPLACEMENTS (sizeof replacements / sizeof replacements[0])
_Static_assert(N_REPLACEMENTS <= 32, "lazy_ok in struct scanned is a 32-bit mask");

static bool bindings_known; /* under `lock`: replacements and target filled */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The object that defines `fn` holds a copy of ddheap (it exports the
 * state every copy shares): libddheap_preload.so, or a program that wires
 * the hooks into its own malloc. Wrappers there would count every block
 * twice. */
static bool defined_next_to_ddheap(void *fn)
{
    Dl_info info;
    if (fn == NULL || dladdr(fn, &info) == 0)
        return false;
    /* The executable is not found by its path (its link map has no name):
     * its handle is the global scope's, searched from it first. */
    void *handle = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        handle = dlopen(NULL, RTLD_LAZY);
    if (handle == NULL)
        return false;
    void *state = dlsym(handle, "ddheap_shared_v3");
    Dl_info state_info;
    bool same = state != NULL && dladdr(state, &state_info) != 0 &&
                state_info.dli_fbase == info.dli_fbase;
    dlclose(handle);
    return same;
}

/* A non-PIE executable that takes the address of a function it imports
 * (python3 takes malloc's) gets a canonical PLT entry: the global scope
 * binds the name to that stub in the executable, which jumps through the
 * executable's own GOT slot to the definition. A wrapper must call the
 * definition: through the stub it would come back to that slot, rewritten
 * to the wrapper itself. On x86-64 the stub is `[endbr64] [bnd] jmp
 * *slot(%rip)`; the slot is read here, before any rewrite. Returns `fn`
 * when it is no such stub, NULL when its slot is not bound yet (lazy: it
 * points back into the executable's PLT). Elsewhere, `fn`. */
static void *past_plt_stub(void *fn)
{
#if defined(__x86_64__)
    const unsigned char *code = fn;
    if (code == NULL)
        return fn;
    size_t at = 0;
    if (code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && code[3] == 0xfa)
        at = 4; /* endbr64 */
    if (code[at] == 0xf2)
        at++; /* bnd */
    if (code[at] != 0xff || code[at + 1] != 0x25)
        return fn;
    int32_t displacement;
    memcpy(&displacement, code + at + 2, sizeof displacement);
    uintptr_t slot = (uintptr_t)(code + at + 6) + (uintptr_t)(intptr_t)displacement;
    void *real = (void *)__atomic_load_n((uintptr_t *)slot, __ATOMIC_ACQUIRE);
    Dl_info stub_info, real_info;
    if (dladdr(fn, &stub_info) == 0 || dladdr(real, &real_info) == 0 ||
        stub_info.dli_fbase == real_info.dli_fbase)
        return NULL;
    return real;
#else
    return fn;
#endif
}

/* Finds, once, what the global scope binds every name to, and so where
 * each wrapper forwards. Called without ddheap's lock: dlopen, dlsym and
 * dladdr take the loader's lock, which a thread inside dlopen holds while
 * it reaches wrap_dlopen (constructors run under it); holding ddheap's
 * lock here would invert the order. Publishes under the lock; a second
 * caller racing this one computes the same values and keeps the first.
 * Returns 0, or EBUSY when malloc is already hooked by ddheap, or ENOSYS
 * when there is no dynamic linker to ask (a static program), or EAGAIN
 * when a name is bound to a PLT stub whose slot is still lazy. */
static int find_bindings(void)
{
    pthread_mutex_lock(&lock);
    bool known = bindings_known;
    pthread_mutex_unlock(&lock);
    if (known)
        return 0;
    /* The main program's handle searches the global scope: what every
     * object not loaded with RTLD_DEEPBIND binds these names to. */
    void *global = dlopen(NULL, RTLD_LAZY);
    if (global == NULL)
        return ENOSYS;
    void *bound[N_REPLACEMENTS], *real[N_REPLACEMENTS];
    bool unbound = false;
    for (size_t i = 0; i < N_REPLACEMENTS; i++) {
        bound[i] = dlsym(global, replacements[i].name);
        real[i] = past_plt_stub(bound[i]);
        unbound = unbound || (bound[i] != NULL && real[i] == NULL);
    }
    struct ddheap_family_targets found;
#define DDHEAP_FAMILY(name, class, via)                                                \
    found.name = strcmp(#class, "reallocarray") == 0                                  \
                     ? AS_FN(ddheap_##class##_via, AS_DATA(wrap_##via))                \
                     : AS_FN(ddheap_##class##_via, past_plt_stub(dlsym(global, #via)));
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
    /* A sanitizer's runtime owns malloc and keeps its own records of every
     * block and of who allocated it: it is left alone, as is a malloc that
     * already runs ddheap's hooks. */
    static const char *const sanitizers[] = {"__asan_init", "__tsan_init", "__msan_init",
                                             "__hwasan_init"};
    bool sanitized = false;
    for (size_t i = 0; i < sizeof sanitizers / sizeof sanitizers[0]; i++)
        sanitized = sanitized || dlsym(global, sanitizers[i]) != NULL;
    dlclose(global);
    if (unbound)
        return EAGAIN; /* a stub whose slot the program has not bound yet */
    if (bound[0] == NULL || sanitized || defined_next_to_ddheap(real[0]))
        return EBUSY;
    void *wrappers[N_REPLACEMENTS] = {
#define DDHEAP_FAMILY(name, class, via) AS_DATA(wrap_##name),
#define DDHEAP_FAMILY_C23 DDHEAP_FAMILY
#include "malloc_family.def"
#undef DDHEAP_FAMILY
#undef DDHEAP_FAMILY_C23
        AS_DATA(wrap_dlopen),
        AS_DATA(wrap_dlmopen),
    };
    pthread_mutex_lock(&lock);
    if (!bindings_known) {
        target = found;
        for (size_t i = 0; i < N_REPLACEMENTS; i++) {
            replacements[i].wrapper = wrappers[i];
            replacements[i].bound = bound[i];
            replacements[i].real = real[i];
        }
        bindings_known = true;
    }
    pthread_mutex_unlock(&lock);
    return 0;
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
    int prot;           /* its page's protection, given back after each write;
                           -1: a writable page, never changed */
};

#define MAX_SAVED 32768u
static struct saved_slot *saved;
static size_t n_saved;
static bool active;
static int failure; /* first error met by a callback (errno value) */

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

/* --- which objects may be rewritten, and which of their lazy slots ---
 *
 * Before a rewrite, without ddheap's lock, each loaded object is opened
 * again by name (RTLD_NOLOAD) and asked what its own lookup scope binds
 * each name to. Two things are learnt:
 *  - the object is complete: dlopen takes the loader's lock, so an object
 *    another thread is still loading (relocating, with its RELRO pages
 *    still writable for the dynamic linker) is waited for, or gone. Only
 *    objects found complete here are rewritten;
 *  - a lazy slot (still pointing into the object's own PLT) will resolve,
 *    at its first call, to the global binding only if the object's own
 *    scope gives the same answer: an object opened with RTLD_DEEPBIND
 *    searches its own scope first, any other object the global scope
 *    first, so agreement of both means the slot is bound to the function
 *    the wrapper forwards to whichever way it is resolved. Where they
 *    disagree the slot is left alone.
 * The list lives in an mmap'ed area of its own for each scan: two threads
 * may scan at once (a rescan inside a constructor, a call from another
 * thread), and nothing here may use the heap it hooks. */

struct scanned {
    uintptr_t base;
    uint64_t name_hash;
    uint32_t lazy_ok;  /* bit i: replacements[i] resolves to its binding */
    uint32_t name_at;  /* offset of the object's name in the name area */
    bool complete;     /* found loaded, at `base`, by open_again() */
};

struct scan {
    struct scanned *objects;
    size_t count, capacity;
    char *names;
    size_t names_used, names_capacity;
    size_t mapped; /* bytes of the one mapping, 0 if none */
};

static int count_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct scan *scan = ctx;
    scan->capacity++;
    scan->names_capacity += strlen(info->dlpi_name != NULL ? info->dlpi_name : "") + 1;
    return 0;
}

static int list_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct scan *scan = ctx;
    const char *name = info->dlpi_name != NULL ? info->dlpi_name : "";
    size_t length = strlen(name) + 1;
    if (scan->count == scan->capacity || scan->names_capacity - scan->names_used < length)
        return 0; /* loaded since the count: rewritten at the next scan */
    memcpy(scan->names + scan->names_used, name, length);
    scan->objects[scan->count++] = (struct scanned){info->dlpi_addr, hash_name(name), 0,
                                                    (uint32_t)scan->names_used, false};
    scan->names_used += length;
    return 0;
}

/* The object as the loader knows it now, if it is the one at `base`. */
static void *open_again(const char *name, uintptr_t base)
{
    void *handle = name[0] == '\0' ? dlopen(NULL, RTLD_LAZY) /* the executable */
                                   : dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
    struct link_map *map = NULL;
    if (handle != NULL && (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map->l_addr != base)) {
        dlclose(handle);
        return NULL;
    }
    return handle;
}

static bool scan_objects(struct scan *scan)
{
    memset(scan, 0, sizeof *scan);
    dl_iterate_phdr(count_object, scan);
    scan->capacity += 8; /* a few loaded between the two walks */
    scan->names_capacity += 8 * 256;
    size_t objects_bytes = scan->capacity * sizeof *scan->objects;
    size_t bytes = objects_bytes + scan->names_capacity;
    void *area = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED)
        return false;
    scan->mapped = bytes;
    scan->objects = area;
    scan->names = (char *)area + objects_bytes;
    dl_iterate_phdr(list_object, scan);
    for (size_t i = 0; i < scan->count; i++) {
        struct scanned *o = &scan->objects[i];
        void *handle = open_again(scan->names + o->name_at, o->base);
        if (handle == NULL)
            continue; /* gone, replaced, or not openable (the vDSO): not ours */
        o->complete = true;
        for (size_t r = 0; r < N_REPLACEMENTS; r++)
            if (replacements[r].bound != NULL) {
                void *fn = dlsym(handle, replacements[r].name);
                if (fn == replacements[r].bound || fn == replacements[r].real)
                    o->lazy_ok |= UINT32_C(1) << r;
            }
        dlclose(handle);
    }
    return true;
}

static void scan_done(struct scan *scan)
{
    if (scan->mapped != 0)
        munmap(scan->objects, scan->mapped);
    scan->mapped = 0;
}

static const struct scanned *scanned_object(const struct scan *scan, uintptr_t base,
                                            uint64_t name_hash)
{
    for (size_t i = 0; i < scan->count; i++)
        if (scan->objects[i].complete && scan->objects[i].base == base &&
            scan->objects[i].name_hash == name_hash)
            return &scan->objects[i];
    return NULL;
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
    const struct scanned *scanned; /* what the scan learnt of it (rewrite only) */
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

/* The protection of the page that holds a GOT slot, as the dynamic
 * linker left it: read-only under RELRO, which it applies to whole pages
 * from the start of PT_GNU_RELRO rounded down to its end rounded down (a
 * slot in a last partial page stays writable); -1 for a writable page. */
static int slot_protection(const struct object *o, uintptr_t slot)
{
    uintptr_t page_size = (uintptr_t)ddheap_family_page_size();
    uintptr_t relro_start = o->relro_start & ~(page_size - 1);
    uintptr_t relro_end = o->relro_end & ~(page_size - 1);
    return slot >= relro_start && slot < relro_end ? PROT_READ : -1;
}

/* Stores `value` into a GOT slot whose page has protection `prot` (-1:
 * writable), making it writable for the write and giving `prot` back. The
 * store is one aligned word: a thread calling through the slot sees the
 * old or the new function, never a torn address. */
static int write_slot(uintptr_t slot, uintptr_t value, int prot)
{
    uintptr_t page_size = (uintptr_t)ddheap_family_page_size();
    void *page = (void *)(slot & ~(page_size - 1));
    if (prot != -1 && mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0)
        return errno;
    __atomic_store_n((uintptr_t *)slot, value, __ATOMIC_RELEASE);
    if (prot != -1 && mprotect(page, page_size, prot) != 0)
        return errno;
    return 0;
}

/* Calls `visit` on every GOT slot of `o` that belongs to a replaced
 * function: imported by it, or (in the allocator itself, glibc's libc.so
 * with strdup, fopen, ...) called by it through its own GOT. Whether the
 * slot is bound to what the wrapper forwards to is visit's to check. */
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
            if (r != NULL)
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
    /* Only a slot bound to exactly the function the wrapper forwards to,
     * or lazy (pointing into its own object's PLT) in an object whose
     * scope resolves the name to that function, is ours to rewrite. A slot
     * bound elsewhere (an allocator of its own in an RTLD_DEEPBIND or
     * local scope, a copy of the function) keeps its binding: a wrapper
     * there would hand one allocator's blocks to another. */
    uint32_t bit = UINT32_C(1) << (r - replacements);
    bool bound = r->bound != NULL &&
                 (current == (uintptr_t)r->bound || current == (uintptr_t)r->real);
    bool lazy = contains(o->info, current) && (o->scanned->lazy_ok & bit) != 0;
    if (!bound && !lazy)
        return;
    if (n_saved == MAX_SAVED) {
        if (failure == 0)
            failure = ENOMEM;
        return;
    }
    int prot = slot_protection(o, slot);
    int err = write_slot(slot, (uintptr_t)r->wrapper, prot);
    if (err != 0) {
        if (failure == 0)
            failure = err;
        return;
    }
    saved[n_saved++] = (struct saved_slot){slot, current, o->base, hash_name(o->name), prot};
}

static int rewrite_object(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    const struct scan *scan = ctx;
    struct object o;
    if (skipped(info) || !read_object(info, &o))
        return 0;
    o.scanned = scanned_object(scan, o.base, hash_name(o.name));
    if (o.scanned != NULL)
        for_each_slot(&o, rewrite_slot);
    return 0;
}

/* Scans (without the lock), then rewrites under it if interposition is
 * (still) on. Returns the first error, as dd_heap_interpose_libc(). */
static int scan_and_rewrite(bool turn_on)
{
    struct scan scan;
    if (!scan_objects(&scan))
        return ENOMEM;
    pthread_mutex_lock(&lock);
    int result = 0;
    if (turn_on && !ensure_table()) {
        result = ENOMEM;
    } else if (turn_on || active) {
        failure = 0;
        __atomic_store_n(&active, true, __ATOMIC_RELAXED);
        dl_iterate_phdr(rewrite_object, &scan);
        result = failure;
    }
    pthread_mutex_unlock(&lock);
    scan_done(&scan);
    return result;
}

static void rescan_after_load(void)
{
    if (__atomic_load_n(&active, __ATOMIC_RELAXED))
        (void)scan_and_rewrite(false);
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
            int err = write_slot(s->slot, s->original, s->prot);
            if (err != 0 && failure == 0)
                failure = err;
        }
        s->slot = 0; /* done (or no longer ours to touch) */
    }
    return 0;
}

/* A child forked while another thread held the lock would wait for it for
 * ever at its first dlopen (the rescan): only the forking thread is left. */
static void reset_lock_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
}

int ddheap_interpose_begin(void)
{
    static int atfork_registered;
    if (__atomic_exchange_n(&atfork_registered, 1, __ATOMIC_ACQ_REL) == 0)
        (void)pthread_atfork(NULL, NULL, reset_lock_in_child);
    /* EBUSY: malloc already runs the ddheap hooks (libddheap_preload.so, or
     * a program that wires them itself) or is a sanitizer's; nothing is
     * rewritten. Said by the return value only: nothing in a profiled
     * process writes on its streams (docs/interpose.md). */
    int result = find_bindings();
    if (result != 0)
        return result;
    ddheap_process_init();
    return scan_and_rewrite(true);
}

int ddheap_interpose_end(void)
{
    pthread_mutex_lock(&lock);
    int result = 0;
    if (active) {
        failure = 0;
        __atomic_store_n(&active, false, __ATOMIC_RELAXED);
        dl_iterate_phdr(restore_object, NULL);
        n_saved = 0;
        result = failure;
    }
    pthread_mutex_unlock(&lock);
    return result;
}

/* In a child just forked (an atfork handler), whose one thread is the
 * forking one: every object is mapped exactly as in the parent when it
 * forked, so each saved slot is written back directly, without
 * dl_iterate_phdr (whose loader lock another thread of the parent may have
 * held at the fork). Call after reset_lock_in_child. */
void ddheap_interpose_end_in_child(void)
{
    if (!active)
        return;
    active = false;
    for (size_t i = 0; i < n_saved; i++)
        if (saved[i].slot != 0 && is_wrapper(*(uintptr_t *)saved[i].slot))
            (void)write_slot(saved[i].slot, saved[i].original, saved[i].prot);
    n_saved = 0;
}

int dd_heap_interpose_libc(void)
{
    return ddheap_interpose_begin();
}

int dd_heap_interpose_libc_stop(void)
{
    return ddheap_interpose_end();
}

#else /* not the shadow scheme */

/* This libddheap.a marks sampled blocks in a way that frees past the hooks
 * would corrupt: ENOTSUP, and nothing written on the program's streams;
 * the remedy (meson -Dmarking=shadow) is in docs/interpose.md and
 * <ddheap.h>. */
int dd_heap_interpose_libc(void)
{
    return ENOTSUP;
}

int dd_heap_interpose_libc_stop(void)
{
    return 0; /* nothing was ever rewritten */
}

int ddheap_interpose_begin(void)
{
    return ENOTSUP;
}

int ddheap_interpose_end(void)
{
    return 0;
}

void ddheap_interpose_end_in_child(void)
{
}

#endif

/*
 * The executable of ddheap-prof's dlopen test (test_prof.py, 'dlopen'):
 * it allocates through its own copy of ddheap, then, when told on stdin,
 * dlopens the plugin (tests/lib/ddheap_plugin.c, built with
 * -DDDHEAP_PLUGIN_EXAMPLE_LIBC) and, when told again, has the
 * plugin allocate. Prints its ground truth in the workload's format.
 *
 *   prof-dlopen PLUGIN_PATH COUNT
 */
#include <dd_example_libc.h>
#include <ddheap.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static void *site_main_blocks(unsigned count)
{
    void *kept = NULL;
    for (unsigned i = 0; i < count; i++) {
        void **block = dd_example_malloc(2000);
        if (block == NULL)
            exit(2);
        memset(block, 0x11, 2000);
        *block = kept;
        kept = block;
    }
    return kept;
}

static void wait_line(void)
{
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL)
        exit(3);
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    unsigned count = (unsigned)strtoul(argv[2], NULL, 10);
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *main_kept = site_main_blocks(count);
    printf("dlopen: ready\n");
    wait_line();
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    /* dlsym returns an object pointer; POSIX's way to a function one. */
    void *(*work)(unsigned);
    void *sym = dlsym(lib, "ddheap_plugin_work");
    memcpy(&work, &sym, sizeof work);
    if (sym == NULL)
        return 2;
    printf("dlopen: loaded\n");
    wait_line();
    void *plugin_kept = work(count);
    printf("site site_main_blocks alloc_bytes %u alloc_count %u live_bytes %u live_count %u\n",
           2000 * count, count, 2000 * count, count);
    printf("site site_plugin_blocks alloc_bytes %u alloc_count %u live_bytes %u live_count %u\n",
           1500 * count, 2 * count, 1000 * count, count);
    printf("total alloc_bytes %u live_bytes %u\n", 3500 * count, 3000 * count);
    printf("dlopen: done %p %p\n", main_kept, plugin_kept);
    return 0;
}

/*
 * A program without ddheap for ddheap-prof's --all test (test_fleet.py,
 * 'all'): told on stdin, it dlopens a library that carries ddheap (the
 * test plugin, tests/lib/ddheap_plugin.c), then, told again, has it keep
 * COUNT blocks of 1000 bytes (site_plugin_blocks), then waits to exit.
 * The agent must find it at the dlopen, never before.
 *
 *   prof-fleet-dlopen PLUGIN_PATH COUNT
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Waits for one line on stdin; false at its end. */
static int next_line(void)
{
    char line[64];
    return fgets(line, sizeof line, stdin) != NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("fleet-dlopen: ready\n");
    if (!next_line())
        return 1;
    void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    void *(*work)(unsigned) = NULL;
    if (plugin)
        *(void **)&work = dlsym(plugin, "ddheap_plugin_work");
    if (work == NULL) {
        fprintf(stderr, "fleet-dlopen: %s\n", dlerror());
        return 1;
    }
    printf("fleet-dlopen: loaded\n");
    if (!next_line())
        return 1;
    void *kept = work((unsigned)strtoul(argv[2], NULL, 10));
    printf("fleet-dlopen: worked %s\n", kept ? "ok" : "failed");
    next_line();
    return 0;
}

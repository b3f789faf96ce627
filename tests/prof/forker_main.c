/*
 * The fork-and-exec workload of ddheap-prof's follow test (test_follow.py,
 * 'follow'): a parent that allocates, forks a child that allocates without
 * exec'ing, forks another that execs this program again as a child image
 * that allocates, waits for both, and exits with the status it was given.
 * The exec'd child is made once the forked one holds its blocks, and the
 * forked child exits only after the exec'd one has: all three hold their
 * blocks at once then, which is the peak.
 * Each process prints its pid and its site's truth (at DD_HEAP_SAMPLING_
 * INTERVAL=1 the profile must hold exactly that, under that pid).
 *
 *   prof-forker COUNT EXIT_STATUS      (PROF_FORKER_WAIT=1: waits for a
 *                                       line on stdin first)
 *   prof-forker --exec-child COUNT     (what the second child runs)
 */
#define _POSIX_C_SOURCE 200809L

#include <dd_example_libc.h>
#include <ddheap.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Each site keeps its blocks until its process exits. */
#define SITE(name, size)                                                                      \
    __attribute__((noinline)) static void *name(unsigned count)                               \
    {                                                                                         \
        void *kept = NULL;                                                                    \
        for (unsigned i = 0; i < count; i++) {                                                \
            void **block = dd_example_malloc(size);                                           \
            if (block == NULL)                                                                \
                exit(2);                                                                      \
            memset(block, 0x5a, size);                                                        \
            *block = kept;                                                                    \
            kept = block;                                                                     \
        }                                                                                     \
        __asm__ volatile("" ::: "memory");                                                    \
        return kept;                                                                          \
    }

SITE(site_parent, 1000)
SITE(site_forked_child, 2000)
SITE(site_exec_child, 3000)

static void print_site(const char *site, unsigned size, unsigned count)
{
    printf("pid %d site %s alloc_bytes %u alloc_count %u\n", (int)getpid(), site, size * count,
           count);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--exec-child") == 0) {
        unsigned count = (unsigned)strtoul(argv[2], NULL, 10);
        void *kept = site_exec_child(count);
        print_site("site_exec_child", 3000, count);
        return kept == NULL;
    }
    if (argc != 3)
        return 2;
    unsigned count = (unsigned)strtoul(argv[1], NULL, 10);
    int status = atoi(argv[2]);
    if (getenv("PROF_FORKER_WAIT")) {
        /* For a profiler attaching with -p: starts when told. */
        char line[16];
        printf("forker: ready\n");
        fflush(stdout);
        if (fgets(line, sizeof line, stdin) == NULL)
            return 2;
    }
    /* The forked child is made before the parent's first allocation and
     * waits for it: Linux 6.18 optimises a uprobe on a 5-byte nop into a
     * call to a trampoline page after its first hit, and a child forked
     * after that inherits the call but not the page (SIGSEGV at the
     * probe, with or without ddheap-prof following it). */
    int go[2], done[2], held[2];
    if (pipe(go) != 0 || pipe(done) != 0 || pipe(held) != 0)
        return 2;
    pid_t forked = fork();
    if (forked == 0) {
        char byte;
        close(go[1]);
        close(done[1]);
        close(held[0]);
        if (read(go[0], &byte, 1) != 1)
            _exit(2);
        void *mine = site_forked_child(count);
        print_site("site_forked_child", 2000, count);
        /* Its blocks are held: the exec'd child may come. */
        if (write(held[1], "h", 1) != 1)
            _exit(2);
        /* Until the parent has seen the exec'd child exit (end of file). */
        while (read(done[0], &byte, 1) > 0)
            ;
        _exit(mine == NULL);
    }
    close(go[0]);
    close(done[0]);
    close(held[1]);
    void *kept = site_parent(count);
    print_site("site_parent", 1000, count);
    char byte;
    if (write(go[1], "g", 1) != 1 || read(held[0], &byte, 1) != 1)
        return 2;
    pid_t execed = fork();
    if (execed == 0) {
        char *args[] = {argv[0], (char *)"--exec-child", argv[1], NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int st1 = 1, st2 = 1;
    if (execed < 0 || waitpid(execed, &st2, 0) != execed)
        return 2;
    close(done[1]);
    if (forked < 0 || waitpid(forked, &st1, 0) != forked || st1 != 0 || st2 != 0)
        return 2;
    return kept ? status : 2;
}

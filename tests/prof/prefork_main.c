/*
 * A prefork server in miniature, for ddheap-prof's tests of many short
 * processes (test_server.py): the parent keeps PARENT_BLOCKS blocks
 * (parent_keep) for its whole life, then forks WORKERS workers, at most
 * AT_ONCE alive at a time; each worker keeps WORKER_BLOCKS blocks
 * (worker_keep) and exits without freeing them, as a worker that ends
 * does. Built by the test with plain `cc -O2`: no frame pointers.
 *
 *     prefork WORKERS AT_ONCE TRUTH_FILE
 *
 * TRUTH_FILE gets "site size count" lines, the sizes and counts of the
 * blocks each site allocated over the whole run, "alive N", the most
 * workers that were alive at once, and "cpu_us N", the CPU time of this
 * process and its workers (what a profiler that ran it may subtract from
 * its own total).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK 16384
#define WORKER_BLOCKS 128 /* 2 MiB */
#define PARENT_BLOCKS 64  /* 1 MiB */

static void *kept[WORKER_BLOCKS];

/* Not inlined and not ending in a call: each site is its own frame, and
 * the caller's frame stays on the stack (a tail call would remove it). */
__attribute__((noinline)) static unsigned worker_keep(void)
{
    unsigned n = 0;
    for (unsigned i = 0; i < WORKER_BLOCKS; i++) {
        kept[i] = malloc(BLOCK);
        if (kept[i] != NULL) {
            ((volatile char *)kept[i])[0] = (char)i;
            n++;
        }
    }
    return n;
}

__attribute__((noinline)) static unsigned parent_keep(void)
{
    unsigned n = 0;
    for (unsigned i = 0; i < PARENT_BLOCKS && i < WORKER_BLOCKS; i++) {
        kept[i] = malloc(BLOCK);
        n += kept[i] != NULL;
    }
    return n;
}

__attribute__((noinline)) static int worker(void)
{
    unsigned n = worker_keep();
    usleep(2000); /* a short request */
    return n == WORKER_BLOCKS ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: prefork WORKERS AT_ONCE TRUTH_FILE\n");
        return 2;
    }
    int workers = atoi(argv[1]), at_once = atoi(argv[2]);
    if (parent_keep() != PARENT_BLOCKS)
        return 1;
    int alive = 0, most = 0, failed = 0;
    for (int started = 0; started < workers || alive > 0;) {
        if (started < workers && alive < at_once) {
            pid_t pid = fork();
            if (pid < 0) {
                perror("fork");
                return 1;
            }
            if (pid == 0)
                _exit(worker());
            started++;
            if (++alive > most)
                most = alive;
            continue;
        }
        int status;
        if (wait(&status) < 0) {
            perror("wait");
            return 1;
        }
        alive--;
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &children);
    long long cpu_us = 0;
    const struct rusage *ru[2] = {&self, &children};
    for (int i = 0; i < 2; i++)
        cpu_us += (ru[i]->ru_utime.tv_sec + ru[i]->ru_stime.tv_sec) * 1000000LL +
                  ru[i]->ru_utime.tv_usec + ru[i]->ru_stime.tv_usec;
    FILE *f = fopen(argv[3], "w");
    if (f == NULL ||
        fprintf(f, "worker_keep %d %d\nparent_keep %d %d\nalive %d\ncpu_us %lld\n", BLOCK,
                workers * WORKER_BLOCKS, BLOCK, PARENT_BLOCKS, most, cpu_us) < 0 ||
        fclose(f) != 0) {
        perror(argv[3]);
        return 1;
    }
    return failed ? 1 : 0;
}

/*
 * A traced program that forks without exec (tests/tracer/test_tracer.py,
 * case 'fork'): the parent allocates through ddheap's hooks with a tracer
 * attached, so the probe sites have been hit, then forks children that
 * allocate too and exit. Every child must exit normally: a kernel that
 * rewrites a hit uprobe into a call to a trampoline page (Linux 6.18, on a
 * 5-byte nop) leaves a forked child calling a page it does not have
 * (src/probes.c says why the probe site is a 1-byte nop).
 *
 *   tracer-fork    prints "fork: pid=N", waits for "go" on stdin, then
 *                  "fork: children=C crashed=K" and exits 1 if K > 0
 */
#include <ddheap.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { CHILDREN = 5, PARENT_BLOCKS = 2000, CHILD_BLOCKS = 2000 };

static void *traced_malloc(size_t size)
{
    dd_alloc_req_t req = dd_allocation_requested(size, 0);
    return dd_allocation_created(malloc(req.size), req);
}

static void traced_free(void *ptr)
{
    dd_alloc_freed_t f = dd_allocation_freed(ptr, 0, 0);
    free(f.ptr);
}

static void churn(int blocks)
{
    for (int i = 0; i < blocks; i++) {
        char *volatile block = traced_malloc(64 + (size_t)(i % 64));
        block[0] = 1;
        traced_free(block);
    }
}

int main(void)
{
    printf("fork: pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    if (fgets(line, sizeof line, stdin) == NULL || strncmp(line, "go", 2) != 0)
        return 2;
    churn(PARENT_BLOCKS);
    int crashed = 0;
    for (int k = 0; k < CHILDREN; k++) {
        fflush(stdout);
        pid_t child = fork();
        if (child < 0)
            return 2;
        if (child == 0) {
            churn(CHILD_BLOCKS);
            _exit(0);
        }
        int status;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            printf("fork: child %d ended with wait status 0x%x\n", k, status);
            crashed++;
        }
        churn(PARENT_BLOCKS / 10);
    }
    printf("fork: children=%d crashed=%d attached=%d\n", CHILDREN, crashed,
           (int)dd_heap_profiler_attached());
    return crashed > 0;
}

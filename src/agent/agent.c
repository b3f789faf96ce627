/*
 * libddheap_agent.so: ddheap inside a process that was started without it
 * (docs/attach.md). ddheap-prof -p PID loads it with the process's own
 * dlopen (tools/ddheap-prof/inject.c) and calls ddheap_agent_start(),
 * which rewrites the malloc-family GOT slots of every loaded object, and
 * of every object loaded later, to wrappers around exactly the function
 * each slot was bound to (src/interpose.c: the same machinery as
 * dd_heap_interpose_libc()), and hands back the write end of a pipe.
 *
 * Detach: a thread of the agent waits on the read end. When the last write
 * end closes (ddheap-prof exits, is stopped by Ctrl-C or -d, or is killed
 * with SIGKILL: the kernel closes its descriptors) the thread wakes at
 * once, puts every slot back as it was (value and page protection) and
 * exits. The library stays loaded: a thread may still be inside a wrapper,
 * or return into one. It is inert then, and ddheap_agent_start() may be
 * called again. Blocks sampled while attached are marked in the shadow
 * bitmap only (pointer-preserving): after detach they are plain blocks to
 * the allocator, which gets them back unchanged.
 *
 * A child forked while attached inherits the rewritten slots but not the
 * thread: it puts them back at once (an atfork handler), so a process
 * ddheap-prof was not pointed at is left as it would be without it.
 */
#define _GNU_SOURCE

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <unistd.h>

#define DDHEAP_AGENT_API __attribute__((visibility("default")))

DDHEAP_AGENT_API int ddheap_agent_start(void);

/* 1 from a start to the end of its detach: one profiler at a time. */
static int attached;
static int watched_fd = -1;

static void detach(void)
{
    (void)ddheap_interpose_end();
    int fd = __atomic_exchange_n(&watched_fd, -1, __ATOMIC_ACQ_REL);
    if (fd >= 0)
        close(fd);
    __atomic_store_n(&attached, 0, __ATOMIC_RELEASE);
}

/* Waits for the profiler's end: every write end of the pipe closed (a
 * read of 0, or POLLHUP). Nothing is ever written to it. */
static void *watch(void *arg)
{
    int fd = (int)(intptr_t)arg;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ready = poll(&pfd, 1, -1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0 || (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)))
            break;
        char byte;
        ssize_t got = read(fd, &byte, 1);
        if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN))
            break;
    }
    detach();
    return NULL;
}

/* The child of a fork while attached: one thread (not ours), the slots of
 * the parent. They go back at once; the read end is the parent's. */
static void forget_in_child(void)
{
    if (!__atomic_load_n(&attached, __ATOMIC_ACQUIRE))
        return;
    ddheap_interpose_end_in_child();
    int fd = __atomic_exchange_n(&watched_fd, -1, __ATOMIC_ACQ_REL);
    if (fd >= 0)
        close(fd);
    __atomic_store_n(&attached, 0, __ATOMIC_RELEASE);
}

/* Returns the write end of the pipe whose closing detaches the agent
 * (the caller takes a copy and closes this one in the process), or
 * -errno: -EBUSY when attached already or when malloc already runs
 * ddheap's hooks or a sanitizer's, -ENOSYS without a dynamic linker. */
int ddheap_agent_start(void)
{
    int expected = 0;
    if (!__atomic_compare_exchange_n(&attached, &expected, 1, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return -EBUSY;
    static int atfork_registered;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        int err = errno;
        __atomic_store_n(&attached, 0, __ATOMIC_RELEASE);
        return -err;
    }
    int err = ddheap_interpose_begin();
    /* After interpose.c's own handler, which resets its lock first. */
    if (err == 0 && !atfork_registered)
        err = pthread_atfork(NULL, NULL, forget_in_child);
    atfork_registered = atfork_registered || err == 0;
    __atomic_store_n(&watched_fd, fds[0], __ATOMIC_RELEASE);
    if (err == 0) {
        /* The thread takes no signal of the process's: each goes to one
         * of the program's own threads, as without the agent. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 * 1024);
        pthread_t thread;
        pthread_sigmask(SIG_SETMASK, &all, &old);
        err = pthread_create(&thread, &attr, watch, (void *)(intptr_t)fds[0]);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    if (err != 0) {
        detach();
        close(fds[1]);
        return -err;
    }
    return fds[1];
}

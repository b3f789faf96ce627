/*
 * Part of a test run in a forked child, what it writes on stdout and
 * stderr read back: for what must not touch the test's own process
 * (environment read once per process, a report that aborts it).
 *
 * The child's stdout is read to its end before its stderr: a child that
 * writes more than a pipe holds (64 KiB on Linux) to stderr before it
 * closes stdout would block. The children here write a few lines.
 */
#ifndef DDHEAP_TEST_CHILD_H
#define DDHEAP_TEST_CHILD_H

#include <errno.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

struct child_output {
    int status;     /* as waitpid() reports it */
    char out[512];  /* what the child wrote on stdout, cut to fit, NUL-terminated */
    char err[8192]; /* and on stderr */
};

/* Reads fd to its end, or until buf is full; NUL-terminates. */
static inline size_t child_read_all(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (n += (size_t)r) == cap - 1)
            break;
    }
    buf[n] = '\0';
    return n;
}

/* Runs body(arg) in a forked child, which exits with what body returns. */
static inline void run_child(int (*body)(void *), void *arg, struct child_output *o)
{
    int out[2], err[2];
    assert_int_equal(pipe(out), 0);
    assert_int_equal(pipe(err), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(err[0]);
        _exit(body(arg));
    }
    close(out[1]);
    close(err[1]);
    child_read_all(out[0], o->out, sizeof o->out);
    child_read_all(err[0], o->err, sizeof o->err);
    close(out[0]);
    close(err[0]);
    assert_int_equal(waitpid(pid, &o->status, 0), pid);
}

#endif /* DDHEAP_TEST_CHILD_H */

/*
 * The timer program of ddheap-prof's follow test (test_follow.py,
 * 'signals'): takes a SIGALRM every millisecond (setitimer) for SECONDS,
 * allocating a block at each, and prints how many it got. Under a profiler
 * that lets it run free the count is the same as without one; a profiler
 * that holds its signals (ptrace signal-delivery stops) loses most of them.
 *
 *   prof-alarm SECONDS
 */
#define _POSIX_C_SOURCE 200809L

#include <dd_example_libc.h>
#include <ddheap.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    double seconds = strtod(argv[1], NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    sigset_t alrm, old;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_BLOCK, &alrm, &old);
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &every_ms, NULL);
    double end = now() + seconds;
    void *kept = NULL;
    unsigned long blocks = 0;
    while (now() < end) {
        sigsuspend(&old); /* returns after each SIGALRM's handler */
        void **block = dd_example_malloc(64);
        if (block == NULL)
            return 2;
        *block = kept;
        kept = block;
        blocks++;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("alarm: signals %d blocks %lu\n", (int)alarms, blocks);
    return kept ? 0 : 2;
}

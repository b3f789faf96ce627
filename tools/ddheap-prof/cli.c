/*
 * ddheap-prof's command line: what each option means and what it accepts.
 * Bad input exits with status 2 and the usage; nothing has been started or
 * attached by then.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prof.h"

static void usage(FILE *to)
{
    fputs("usage: ddheap-prof [-p PID | -- CMD ARGS...] [-d SECONDS] [-o FILE.pb.gz]\n"
          "                   [--svg FILE] [--folded FILE] [--provider ddheap|otel_memory]\n"
          "                   [--value inuse_space|alloc_space|inuse_objects|alloc_objects]\n"
          "                   [--ringbuf-kb KB] [-v]\n"
          "                   [--peak FILE.pb.gz] [--every SECONDS [--max-files N]]\n"
          "                   [--report FILE]\n"
          "Profiles the heap of a ddheap-instrumented process; writes a gzipped pprof\n"
          "profile (default ddheap-prof.pb.gz) on Ctrl-C, after -d SECONDS, or when CMD\n"
          "exits. --svg and --folded show --value (default inuse_space); for a CMD that\n"
          "freed everything, they show the heap at its peak. --peak writes the profile\n"
          "at the peak. --every writes a numbered profile every SECONDS (-o's name with\n"
          "a number, or -o as a pattern with %d or %04d), as does SIGUSR1; --max-files\n"
          "keeps the newest N; --svg with a %d writes a flame graph with each. --report\n"
          "writes lifetimes per site and leak suspects.\n",
          to);
}

static void die_usage(const char *what)
{
    fprintf(stderr, "ddheap-prof: %s\n", what);
    usage(stderr);
    exit(2);
}

void dd_prof_parse_options(int argc, char **argv, struct options *o)
{
    enum { OPT_SVG = 256, OPT_FOLDED, OPT_PROVIDER, OPT_VALUE, OPT_RINGBUF, OPT_HELP, OPT_PEAK,
           OPT_EVERY, OPT_MAX_FILES, OPT_REPORT };
    static const struct option longs[] = {
        {"pid", required_argument, NULL, 'p'},       {"duration", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},    {"svg", required_argument, NULL, OPT_SVG},
        {"folded", required_argument, NULL, OPT_FOLDED},
        {"provider", required_argument, NULL, OPT_PROVIDER},
        {"value", required_argument, NULL, OPT_VALUE},
        {"ringbuf-kb", required_argument, NULL, OPT_RINGBUF},
        {"verbose", no_argument, NULL, 'v'},         {"help", no_argument, NULL, OPT_HELP},
        {"peak", required_argument, NULL, OPT_PEAK}, {"every", required_argument, NULL, OPT_EVERY},
        {"max-files", required_argument, NULL, OPT_MAX_FILES},
        {"report", required_argument, NULL, OPT_REPORT},
        {NULL, 0, NULL, 0}};
    *o = (struct options){.out_path = "ddheap-prof.pb.gz", .provider = "ddheap",
                          .value = DD_PROF_INUSE_SPACE, .ringbuf_kb = 16384};
    int c;
    char *end;
    /* '+': stop at the first non-option, so CMD's own options stay its own. */
    while ((c = getopt_long(argc, argv, "+p:d:o:v", longs, NULL)) != -1) {
        switch (c) {
        case 'p': {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || v <= 0 || v > INT_MAX)
                die_usage("-p needs a process id");
            o->pid = (pid_t)v;
            break;
        }
        case 'd':
            errno = 0;
            o->duration = strtod(optarg, &end);
            if (errno || *end || end == optarg || !(o->duration > 0))
                die_usage("-d needs a positive number of seconds");
            break;
        case 'o': o->out_path = optarg; break;
        case OPT_SVG: o->svg_path = optarg; break;
        case OPT_FOLDED: o->folded_path = optarg; break;
        case OPT_PROVIDER:
            if (strcmp(optarg, "ddheap") != 0 && strcmp(optarg, "otel_memory") != 0)
                die_usage("--provider is ddheap or otel_memory");
            o->provider = optarg;
            break;
        case OPT_VALUE: {
            int found = -1;
            for (int i = 0; i < 4; i++)
                if (strcmp(optarg, dd_prof_value_names[i]) == 0)
                    found = i;
            if (found < 0)
                die_usage("--value is inuse_space, alloc_space, inuse_objects or alloc_objects");
            o->value = (enum dd_prof_value)found;
            break;
        }
        case OPT_RINGBUF:
            errno = 0;
            o->ringbuf_kb = strtoul(optarg, &end, 10);
            if (errno || *end || end == optarg || o->ringbuf_kb < 4 || o->ringbuf_kb > (1ul << 21))
                die_usage("--ringbuf-kb needs a size in KiB, 4 to 2097152");
            break;
        case 'v': o->verbose = true; break;
        case OPT_PEAK: o->peak_path = optarg; break;
        case OPT_REPORT: o->report_path = optarg; break;
        case OPT_EVERY:
            errno = 0;
            o->every = strtod(optarg, &end);
            /* Under 10 ms a snapshot (symbolising every stack) would be
             * the whole of ddheap-prof's work. */
            if (errno || *end || end == optarg || !(o->every >= 0.01) || o->every > 1e6)
                die_usage("--every needs a number of seconds, 0.01 or more");
            break;
        case OPT_MAX_FILES: {
            errno = 0;
            unsigned long v = strtoul(optarg, &end, 10);
            if (errno || *end || end == optarg || v == 0 || v > 1000000)
                die_usage("--max-files needs a count, 1 or more");
            o->max_files = (unsigned)v;
            break;
        }
        case OPT_HELP: usage(stdout); exit(0);
        default: usage(stderr); exit(2);
        }
    }
    if (optind < argc)
        o->cmd = argv + optind;

    if ((o->pid != 0) == (o->cmd != NULL))
        die_usage(o->pid ? "give -p PID or -- CMD, not both" : "give -p PID or -- CMD");
}

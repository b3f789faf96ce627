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
#include <sys/socket.h>

#include <linux/types.h>

#include "ddheap_prof.h"
#include "prof.h"

static void usage(FILE *to)
{
    fputs("usage: ddheap-prof [-p PID | -- CMD ARGS... | --all] [-f | --no-follow] [-d SECONDS]\n"
          "                   [--only GLOB] [--http ADDR] [--max-blocks N] [--max-stacks N]\n"
          "                   [-o FILE.pb.gz] [--svg FILE] [--folded FILE]\n"
          "                   [--provider ddheap|otel_memory]\n"
          "                   [--value inuse_space|alloc_space|inuse_objects|alloc_objects]\n"
          "                   [--ringbuf-kb KB] [--unwind dwarf|fp] [--stack-bytes N] [-v]\n"
          "                   [--peak FILE.pb.gz] [--every SECONDS [--max-files N]]\n"
          "                   [--report FILE] [--python on|off]\n"
          "                   [--no-preload] [--no-inject]\n"
          "Profiles the heap of a ddheap-instrumented process; writes a gzipped pprof\n"
          "profile (default ddheap-prof.pb.gz) on Ctrl-C, after -d SECONDS, or when CMD\n"
          "exits, with the pid of each sample as its label `pid`. -f follows the\n"
          "processes it forks (the default with -- CMD; --no-follow: not). Exits with\n"
          "CMD's status. --svg and --folded show --value (default inuse_space); for a CMD\n"
          "that freed everything, they show the heap at its peak. --peak writes the\n"
          "profile at the peak of all the processes' live bytes together. --every writes a\n"
          "numbered profile every SECONDS (-o's name with a number, or -o as a pattern\n"
          "with %d or %04d), as does SIGUSR1; --max-files keeps the newest N; --svg with a\n"
          "%d writes a flame graph with each. --report writes lifetimes per site and leak\n"
          "suspects. Freed blocks are samples labelled `lifetime` (log2 bucket, ns).\n"
          "Stacks are unwound by DWARF CFI from a copy of the top N bytes of the user\n"
          "stack (--stack-bytes, default 16384, at most 65536); --unwind=fp walks frame\n"
          "pointers in the kernel instead (cheaper; wrong for code built without them).\n"
          "In a CPython 3.10-3.13 process, each sample's Python frames are walked too and\n"
          "shown where the interpreter's eval loop is, as `function (file:line)`;\n"
          "--python=off: native frames only.\n"
          "--http ADDR serves the profile as Go's net/http/pprof does, until stopped:\n"
          "/debug/pprof/heap, /debug/pprof/allocs, ?seconds=N for a delta (docs/fleet.md);\n"
          "a bare PORT or :PORT listens on 127.0.0.1 only. --all profiles every process on\n"
          "the host whose objects carry the probes, as they come and go, each by its pid;\n"
          "--only GLOB: only those whose executable's path matches (fnmatch).\n"
          "With --http or --all, no file is written unless asked for (-o, --svg...).\n"
          "--max-blocks and --max-stacks cap the live blocks and stacks kept (with --all\n"
          "1000000 and 100000 by default): samples beyond are dropped, and counted.\n"
          "A CMD without ddheap's probes runs under libddheap_preload.so (--no-preload:\n"
          "not); a -p PID without them gets ddheap's agent injected (--no-inject: not).\n",
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
    enum { OPT_SVG = 256, OPT_FOLDED, OPT_PROVIDER, OPT_VALUE, OPT_RINGBUF, OPT_UNWIND, OPT_STACK_BYTES,
           OPT_HELP, OPT_NO_FOLLOW, OPT_PEAK, OPT_EVERY, OPT_MAX_FILES, OPT_REPORT,
           OPT_PYTHON, OPT_HTTP, OPT_ALL, OPT_MAX_BLOCKS, OPT_MAX_STACKS, OPT_ONLY,
           OPT_NO_PRELOAD, OPT_NO_INJECT };
    static const struct option longs[] = {
        {"pid", required_argument, NULL, 'p'},       {"duration", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},    {"svg", required_argument, NULL, OPT_SVG},
        {"folded", required_argument, NULL, OPT_FOLDED},
        {"provider", required_argument, NULL, OPT_PROVIDER},
        {"value", required_argument, NULL, OPT_VALUE},
        {"ringbuf-kb", required_argument, NULL, OPT_RINGBUF},
        {"unwind", required_argument, NULL, OPT_UNWIND},
        {"stack-bytes", required_argument, NULL, OPT_STACK_BYTES},
        {"verbose", no_argument, NULL, 'v'},         {"help", no_argument, NULL, OPT_HELP},
        {"follow", no_argument, NULL, 'f'},
        {"no-follow", no_argument, NULL, OPT_NO_FOLLOW},
        {"peak", required_argument, NULL, OPT_PEAK}, {"every", required_argument, NULL, OPT_EVERY},
        {"max-files", required_argument, NULL, OPT_MAX_FILES},
        {"report", required_argument, NULL, OPT_REPORT},
        {"python", required_argument, NULL, OPT_PYTHON},
        {"http", required_argument, NULL, OPT_HTTP}, {"all", no_argument, NULL, OPT_ALL},
        {"max-blocks", required_argument, NULL, OPT_MAX_BLOCKS},
        {"max-stacks", required_argument, NULL, OPT_MAX_STACKS},
        {"only", required_argument, NULL, OPT_ONLY},
        {"no-preload", no_argument, NULL, OPT_NO_PRELOAD},
        {"no-inject", no_argument, NULL, OPT_NO_INJECT},
        {NULL, 0, NULL, 0}};
    *o = (struct options){.out_path = "ddheap-prof.pb.gz", .provider = "ddheap",
                          .value = DD_PROF_INUSE_SPACE, .ringbuf_kb = 16384,
                          .stack_bytes = DD_PROF_DEFAULT_STACK, .python = true};
    int c, follow = -1;
    long max_blocks = -1, max_stacks = -1;
    char *end;
    /* '+': stop at the first non-option, so CMD's own options stay its own. */
    while ((c = getopt_long(argc, argv, "+p:d:o:vf", longs, NULL)) != -1) {
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
            /* bounded: the deadline is computed in int64 nanoseconds */
            if (errno || *end || end == optarg || !(o->duration > 0) || o->duration > 1e9)
                die_usage("-d needs a positive number of seconds, at most 1e9");
            break;
        case 'o': o->out_path = optarg; o->files_asked = true; break;
        case OPT_SVG: o->svg_path = optarg; o->files_asked = true; break;
        case OPT_FOLDED: o->folded_path = optarg; o->files_asked = true; break;
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
        case OPT_UNWIND:
            if (strcmp(optarg, "dwarf") != 0 && strcmp(optarg, "fp") != 0)
                die_usage("--unwind is dwarf or fp");
            o->unwind_fp = strcmp(optarg, "fp") == 0;
            break;
        case OPT_PYTHON:
            if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
                die_usage("--python is on or off");
            o->python = strcmp(optarg, "on") == 0;
            break;
        case OPT_STACK_BYTES:
            errno = 0;
            o->stack_bytes = strtoul(optarg, &end, 10);
            if (errno || *end || end == optarg || o->stack_bytes < 64 ||
                o->stack_bytes > DD_PROF_MAX_STACK)
                die_usage("--stack-bytes needs a number of bytes, 64 to 65536");
            break;
        case 'v': o->verbose = true; break;
        case 'f': follow = 1; break;
        case OPT_NO_FOLLOW: follow = 0; break;
        case OPT_PEAK: o->peak_path = optarg; o->files_asked = true; break;
        case OPT_REPORT: o->report_path = optarg; o->files_asked = true; break;
        case OPT_HTTP: {
            struct sockaddr_storage ss;
            unsigned len;
            if (!dd_prof_http_parse_addr(optarg, &ss, &len))
                die_usage("--http needs PORT, :PORT, IP:PORT or [IPV6]:PORT");
            o->http_addr = optarg;
            break;
        }
        case OPT_ALL: o->all = true; break;
        case OPT_ONLY: o->only = optarg; break;
        case OPT_MAX_BLOCKS:
        case OPT_MAX_STACKS: {
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno || *end || end == optarg || v < 0 || v > INT_MAX)
                die_usage("--max-blocks and --max-stacks need a count (0: no cap)");
            *(c == OPT_MAX_BLOCKS ? &max_blocks : &max_stacks) = v;
            break;
        }
        case OPT_NO_PRELOAD: o->no_preload = true; break;
        case OPT_NO_INJECT: o->no_inject = true; break;
        case OPT_EVERY:
            o->files_asked = true;
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
    if (o->only && !o->all)
        die_usage("--only chooses among the processes of --all");
    if (o->all && (o->pid != 0 || o->cmd != NULL))
        die_usage("--all profiles every process with probes: no -p PID or -- CMD with it");
    if (!o->all && (o->pid != 0) == (o->cmd != NULL))
        die_usage(o->pid ? "give -p PID or -- CMD, not both" : "give -p PID or -- CMD, or --all");
    /* A host agent runs for days: what it keeps is bounded by default. */
    o->max_live = max_blocks >= 0 ? (size_t)max_blocks : o->all ? 1000000 : 0;
    o->max_stacks = max_stacks >= 0 ? (size_t)max_stacks : o->all ? 100000 : 0;
    /* A command's work is often done by the processes it starts (make,
     * git, a shell script), and with ddheap-run or LD_PRELOAD they carry
     * the probes too: following is the default. A running service's
     * children are its own business unless asked for. */
    o->follow = follow >= 0 ? follow == 1 : o->cmd != NULL;
    /* --all: a profiled process's children are followed, each attached
     * for its own pid (host.c). */
    if (o->all)
        o->follow = true;
}

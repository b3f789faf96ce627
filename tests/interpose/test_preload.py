#!/usr/bin/env python3
"""libddheap_preload.so on real programs: Debian's python3, a C++ program
(containers, threads, sized and aligned new, a library dlopen'ed after
start) and a shell pipeline of coreutils (fork and exec).

    test_preload.py TEST BUILD_INFO...   (see main() for the arguments)

Tests that need no tracer (suite 'unit'):
  exports    the library exports the malloc family and the shared state only
  run        ddheap-run: the library put first in LD_PRELOAD, what was there
             kept after it; the PID it prints
             is the program's; the exit status passes through
  same       each program prints the same with and without the library,
             sampling on (interval 1 and default) or off; blocks of the
             library's bootstrap arena (its first and last page) freed
             from python3 with the library loaded: never handed to glibc
             (which would abort), untraced and with a block sampled
Tests with bpftrace (suite 'tracer', root; never skipped when root):
  python     the shipped ddheap-alloc.bt / ddheap-live.bt, given the
             library's path, estimate the known allocation within 5 sd;
             at interval 1, under ddheap-run, it is seen exactly and
             ddheap-run says nothing of an unprofiled malloc (python3's
             canonical PLT entry for malloc is no definition)
  cxx, pipeline
             traced at the default interval and at interval 1: same output
             as untraced, and every free follows an alloc of the same
             pointer in the same process image (balance.bt)
"""

import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
import harness
from harness import Failure, Tracer, Workload

PY_COUNT, PY_SIZE = 20000, 4000
# bpftrace preallocates every map at this size (memory and start-up time
# grow with it): enough for the blocks live at once at interval 1.
BIG_MAPS = {"BPFTRACE_MAP_KEYS_MAX": "262144"}
STOP_TIMEOUT = 300  # seconds for bpftrace to print its maps and exit
ESTIMATE_INTERVAL = 65536  # ~1230 samples of the known allocation: 5 sd = 14 %
PIPELINE = ("seq 1 40000 | sort -rn | tr 0-9 a-j | sort | uniq -c | sort -k2 | "
            "awk '{n += $1; s = s substr($2, 1, 1)} END {print n, length(s)}' | md5sum")


class Build:
    def __init__(self, args):
        self.lib, self.run, self.cxx, self.plugin, self.tools, self.nm = args[:6]
        self.free_sized = args[6] == "1"
        # Cross builds (aarch64 under qemu-user): the emulator, which gets
        # the program's LD_PRELOAD through -E so that it does not apply to
        # the emulator itself. Only the C++ program exists for aarch64 here
        # (no arm64 python3 or coreutils are installed).
        self.wrapper = args[7]
        self.providers = [p for p in args[8].split(",") if p]
        self.cpu = args[9]
        self.family = family_names(args[10])
        self.notes = harness.stapsdt.read(self.lib)
        sites = {n.name: n.location for n in self.notes if n.provider == "ddheap"}
        self.sites = [str(sites["alloc"]), str(sites["free"])]

    def balance(self, size=0):
        """balance.bt and its arguments for this library."""
        return os.path.join(HERE, "balance.bt"), [self.lib, str(size)] + self.sites


def family_names(family_def):
    """(name, c23) for each entry point of the malloc family's table."""
    with open(family_def) as f:
        return [(m.group(2), m.group(1) == "_C23")
                for m in map(re.compile(r"^DDHEAP_FAMILY(_C23)?\((\w+),").match, f) if m]


def python_cmd():
    return ["/usr/bin/python3", os.path.join(HERE, "known_alloc.py"), str(PY_COUNT), str(PY_SIZE)]


def env_with(b, preload, extra=None):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["PYTHONMALLOC"] = "malloc"
    if preload:
        env["LD_PRELOAD"] = b.lib
    env.update(extra or {})
    return env


def run_once(cmd, env, stdin_text="", wrapper=""):
    if wrapper:
        preload = env.pop("LD_PRELOAD", None)
        cmd = [wrapper] + (["-E", f"LD_PRELOAD={preload}"] if preload else []) + cmd
    p = subprocess.run(cmd, input=stdin_text, capture_output=True, text=True, env=env, timeout=120)
    if p.returncode != 0:
        raise Failure(f"{cmd[0]} exited {p.returncode}: {p.stderr.strip()[:500]}")
    return p.stdout


def result_lines(text):
    return [l for l in text.splitlines() if ": result " in l or re.match(r"^[0-9a-f]{32}\s", l)]


def programs(b):
    """name -> (command, stdin) for the untraced comparisons."""
    if b.wrapper:
        return {"cxx (emulated)": ([b.cxx, b.plugin], "")}
    return {
        "python3": (python_cmd(), "go\nexit\n"),
        "cxx": ([b.cxx, b.plugin], ""),
        "pipeline": (["/bin/sh", "-c", PIPELINE], ""),
    }


def test_exports(c, b):
    out = subprocess.run([b.nm, "-D", "--defined-only", b.lib], capture_output=True, text=True,
                         check=True).stdout
    got = sorted(l.split()[-1] for l in out.splitlines() if l.strip())
    # The table's names (the C23 ones when the C library has them), and
    # nothing the allocator alone answers for (malloc_usable_size & co.).
    want = [name for name, c23 in b.family if b.free_sized or not c23]
    state = ("ddheap_shared_v", "ddheap_rate_v")
    family = [s for s in got if not s.startswith(state)]
    c.equal(family, sorted(want), "exported functions")
    shared = [s for s in got if s.startswith(state)]
    c.check(len(shared) == 2, f"shared state exported (layout and rate limit): {shared}")
    # Its own probes, both providers, each once, arguments in the SysV
    # registers, each with a semaphore (a tracer names the library).
    harness.stapsdt.check_each_probe_once(b.notes, b.providers, b.cpu, c.check, linked=True)
    dyn = subprocess.run(["readelf", "-d", b.lib], capture_output=True, text=True, check=True).stdout
    c.check("BIND_NOW" in dyn or re.search(r"FLAGS.*NOW", dyn) is not None,
            "linked -z now (no lazy binding inside malloc)")


def test_run(c, b):
    env = env_with(b, False, {"LD_PRELOAD": b.plugin})
    # The command only echoes its environment: under a cross build the
    # host's sh ignores the foreign library (with a warning from ld.so).
    p = subprocess.run([b.run, "/bin/sh", "-c", 'echo "$$ $LD_PRELOAD"; exit 3'],
                       capture_output=True, text=True, env=env, timeout=60)
    c.equal(p.returncode, 3, "exit status of the command")
    pid, preload = p.stdout.split()
    c.equal(preload, f"{b.lib}:{b.plugin}", "LD_PRELOAD seen by the command: the library first")
    m = re.search(r"pid (\d+)", p.stderr)
    c.check(m is not None and m.group(1) == pid, f"printed pid = the command's ({p.stderr!r})")
    c.check(f"ddheap-live.bt {b.lib} -p {pid}" in p.stderr, "prints the bpftrace line to attach")
    usage = subprocess.run([b.run], capture_output=True, text=True)
    c.equal(usage.returncode, 2, "no command: usage, status 2")


def test_same(c, b):
    for name, (cmd, stdin) in programs(b).items():
        plain = run_once(cmd, env_with(b, False), stdin, b.wrapper)
        c.check(len(result_lines(plain)) == 1, f"{name}: prints its result ({plain.strip()[-80:]})")
        for extra in ({}, {"DD_HEAP_SAMPLING_INTERVAL": "1"}, {"DD_HEAP_SAMPLING_ENABLED": "0"}):
            got = run_once(cmd, env_with(b, True, extra), stdin, b.wrapper)
            c.equal(result_lines(got), result_lines(plain), f"{name} with the library {extra}")
    if not b.wrapper:  # (no python3 of the emulated machine)
        check_arena_free(c, b)


# Frees two addresses of the library's bootstrap arena (the symbol
# `arena`, at an offset given in argv from the library's own symbol table,
# from where /proc/self/maps says the library starts). The library sends
# such a free nowhere; glibc would abort on it.
ARENA_FREE = """
import ctypes, sys
lib, offset, size = sys.argv[1], int(sys.argv[2], 16), int(sys.argv[3], 16)
base = min(int(l.split("-")[0], 16) for l in open("/proc/self/maps") if l.rstrip().endswith(lib))
libc = ctypes.CDLL(None)
libc.free.argtypes = [ctypes.c_void_p]
libc.malloc.restype = ctypes.c_void_p
keep = libc.malloc(1 << 20)  # sampled at interval 1: a mark is live, every gate open
for at in (16, size - 64):
    libc.free(base + offset + at)
libc.free(keep)
print("arena frees: done")
"""


def check_arena_free(c, b):
    syms = subprocess.run([b.nm, "-S", b.lib], capture_output=True, text=True,
                          check=True).stdout
    m = re.search(r"^([0-9a-f]+) ([0-9a-f]+) b arena$", syms, re.M)
    if m is None:
        raise Failure("no symbol `arena` in the library (stripped?)")
    for extra in ({}, {"DD_HEAP_SAMPLING_INTERVAL": "1"}):
        out = run_once(["/usr/bin/python3", "-c", ARENA_FREE, os.path.realpath(b.lib),
                        m.group(1), m.group(2)], env_with(b, True, extra))
        c.check("arena frees: done" in out, f"arena blocks freed through the library {extra}")


def sigma_equal_blocks(count, size, interval):
    p = -math.expm1(-size / interval)
    return math.sqrt(count * size * size * (1 - p) / p)


def python_traced(b, scripts, interval, via_run=False):
    """Runs known_alloc.py with the library (LD_PRELOAD, or through
    ddheap-run), tracers attached by pid between its two waits. Returns
    (outputs of the tracers, stdout, stderr)."""
    extra = {} if interval is None else {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}
    if via_run:
        w = Workload(b.run, python_cmd(), env_with(b, False, extra))
    else:
        w = Workload(python_cmd()[0], python_cmd()[1:], env_with(b, True, extra))
    tracers = []
    try:
        w.wait_line("python: pid")
        for script, args, marker in scripts:
            tracers.append(Tracer(script, args, w.pid))
            tracers[-1].wait_ready(marker)
        w.send("go")
        w.wait_line("python: built")
        # Printing symbolises every stack through python3's symbol table:
        # on a loaded 2-core machine that took bpftrace over a minute once.
        # A hang guard, not a timing check.
        outs = [t.stop(timeout=STOP_TIMEOUT) for t in tracers]
        w.send("exit")
        if w.finish() != 0:
            raise Failure(f"python3 failed: {w.stderr.strip()[:500]}")
    finally:
        w.kill()
        harness.stop_quietly(*tracers)
    return outs, "\n".join(w.lines), w.stderr


def test_python(c, b):
    plain = result_lines(run_once(python_cmd(), env_with(b, False), "go\nexit\n"))
    # Interval 1: every block reported; the known one seen exactly.
    os.environ.update(BIG_MAPS)
    block = PY_SIZE + 33  # CPython 3.11's bytes header on 64-bit: checked exactly below
    # Through ddheap-run: Debian's python3 is a non-PIE executable that
    # takes malloc's address, so its dynamic symbol `malloc` is undefined
    # with a value (a canonical PLT entry), not a definition. ddheap-run
    # says nothing of it, and its mallocs are ddheap's (every block seen).
    (out,), text, err = python_traced(b, [b.balance(block) + ("READY",)], 1, via_run=True)
    c.check(re.search(r"unprofiled|cannot wrap|not profiled|malloc is defined", err) is None,
            f"ddheap-run python3: no notice that it runs unprofiled ({err.strip()!r})")
    r = harness.results(out)
    c.equal(result_lines(text), plain, "interval 1, traced: same output as without the library")
    c.equal(r["size_allocs"], PY_COUNT, f"interval 1: alloc events of {block} bytes = objects built")
    c.equal(r["unmatched"], 0, f"interval 1: frees with no prior alloc (of {r['frees']} frees)")
    c.equal(r["alloc_of_live"], 0, "interval 1: allocs of a live pointer")
    # The shipped scripts, as a user runs them: with bpftrace's default map
    # sizes (a stack map of 262144 entries made ddheap-live.bt hang at exit).
    os.environ.pop("BPFTRACE_MAP_KEYS_MAX", None)
    outs, text, _ = python_traced(b, [
        (os.path.join(b.tools, "ddheap-alloc.bt"), [b.lib], "ddheap-alloc: tracing"),
        (os.path.join(b.tools, "ddheap-live.bt"), [b.lib], "ddheap-live: tracing")], ESTIMATE_INTERVAL)
    c.equal(result_lines(text), plain, f"interval {ESTIMATE_INTERVAL}, traced: same output")
    truth = PY_COUNT * block
    sd = sigma_equal_blocks(PY_COUNT, block, ESTIMATE_INTERVAL)
    for what, est in (("allocated (ddheap-alloc.bt)", harness.results(outs[0])["total_bytes"]),
                      ("live (ddheap-live.bt)", harness.results(outs[1])["total_live_bytes"])):
        c.check(abs(est - truth) <= 5 * sd,
                f"bytes {what}: estimated {est}, true {truth}, |diff| {abs(est - truth)} "
                f"<= 5 sd = {5 * sd:.0f}")


def check_balance(c, out, what):
    r = harness.results(out)
    c.check(r["allocs"] > 0, f"{what}: alloc events: {r['allocs']}")
    c.equal(r["unmatched"], 0, f"{what}: frees with no prior alloc in the image "
                               f"(of {r['frees']}; {r['inherited']} inherited through fork)")
    c.equal(r["alloc_of_live"], 0, f"{what}: allocs of a pointer still live")
    return r


def test_cxx(c, b):
    plain = result_lines(run_once([b.cxx, b.plugin], env_with(b, False)))
    os.environ.update(BIG_MAPS)
    for interval in (None, 1):
        extra = {} if interval is None else {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}
        with Workload(b.cxx, [b.plugin, "--wait"], env_with(b, True, extra)) as w:
            w.wait_line("cxx: pid")
            t = w.attach(*b.balance(), "READY")
            w.send("go")
            w.wait_line("cxx: done")
            out = t.stop(timeout=STOP_TIMEOUT)
            c.equal(w.exit(), 0, f"interval {interval or 'default'}: exit status")
        c.equal(result_lines("\n".join(w.lines)), plain,
                f"interval {interval or 'default'}, traced: same output")
        r = check_balance(c, out, f"interval {interval or 'default'}")
        if interval == 1:
            c.equal((r["otel_allocs"], r["otel_frees"]), (r["allocs"], r["frees"]),
                    "interval 1: otel_memory events = ddheap events")


def test_pipeline(c, b):
    """Every process of the pipeline loads the library (LD_PRELOAD is
    inherited through fork and exec): the tracer attaches to the library
    file itself, without -p, so it sees all of them."""
    cmd = ["/bin/sh", "-c", PIPELINE]
    plain = result_lines(run_once(cmd, env_with(b, False)))
    os.environ.update(BIG_MAPS)
    for interval in (None, 1):
        extra = {} if interval is None else {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}
        t = Tracer(*b.balance(), None)
        try:
            t.wait_ready("READY")
            got = result_lines(run_once(cmd, env_with(b, True, extra)))
            out = t.stop(timeout=STOP_TIMEOUT)
        finally:
            harness.stop_quietly(t)
        what = f"interval {interval or 'default'}"
        c.equal(got, plain, f"{what}, traced: same output")
        r = check_balance(c, out, what)
        if interval == 1:
            c.check(r["procs"] >= 5, f"{what}: processes that reported allocations: {r['procs']}")


TESTS = {"exports": test_exports, "run": test_run, "same": test_same,
         "python": test_python, "cxx": test_cxx, "pipeline": test_pipeline}
NEEDS_TRACER = {"python", "cxx", "pipeline"}


def main():
    if len(sys.argv) != 13 or sys.argv[1] not in TESTS:
        print(__doc__)
        return 2
    name = sys.argv[1]
    b = Build(sys.argv[2:])
    return harness.run_checks(name, lambda c: TESTS[name](c, b),
                              require=harness.require_root_and_bpftrace if name in NEEDS_TRACER
                              else None)


if __name__ == "__main__":
    sys.exit(main())

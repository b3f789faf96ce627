#!/usr/bin/env python3
"""libddheap_preload.so with programs that bring their own allocator: the
allocator must keep serving them, whatever they call, and nothing may
change in what they do (docs/interpose.md, "Which allocator serves the
program").

    test_allocators.py TEST LIB DDHEAP_RUN TOOLS missing=LIBS agent=LIB NAME=PROGRAM...

Tests that need no tracer (suite 'unit'):
  jemalloc, tcmalloc, mimalloc, glibc
             the C and the C++ program of that allocator (alloc_workload.c,
             alloc_workload_cxx.cpp; they check themselves that every
             block, from every entry point and from the allocator's own
             API, is the allocator's and that malloc_usable_size agrees
             with it) under ddheap-run, by default, at interval 1 and with
             sampling off: same output as without ddheap, what the
             allocator's own statistics saw of a 48 MiB block within 10 %
             of it without ddheap, and no "unprofiled" notice (the
             library is in charge of malloc). mimalloc also preloaded
             ahead of ddheap: same output, nothing on its stderr.
  own        a program that defines its own malloc family: same output,
             every block its own (reallocarray and glibc's strdup too);
             ddheap-run says once that it runs unprofiled, and nothing
             is said when a shell under ddheap-run runs it (the notice is
             ddheap-run's, never the program's)
  unwrappable  a statically linked jemalloc, an allocator with prefixed
             names only, a static executable: each runs as without ddheap
             and ddheap-run says why it is unprofiled
  redis      Debian's redis-server (jemalloc) under ddheap-run, driven by
             redis-benchmark and redis-cli on 127.0.0.1: the same replies,
             INFO memory says jemalloc and allocator_allocated within 10 %
Tests with bpftrace (suite 'tracer', root; never skipped when root):
  traced-jemalloc, traced-tcmalloc, traced-mimalloc
             both programs traced (balance.bt) at interval 1 and by
             default: same output; alloc events seen; every free follows
             an alloc of the same pointer, no alloc of a live pointer
  traced-redis  redis-server traced by ddheap-live.bt (the stacks name
             redis's own z*alloc functions) and balance.bt at interval 1
             during the benchmark: same replies, balanced stream
"""

import ctypes.util
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
import harness
from harness import Failure, Tracer, free_port

BIG_MAPS = {"BPFTRACE_MAP_KEYS_MAX": "262144"}
STOP_TIMEOUT = 300  # seconds for bpftrace to print its maps and exit
STAT_TOLERANCE = 0.10
MIMALLOC = "libmimalloc.so.2"
UNPROFILED = re.compile(r"^ddheap-run: .*(?:unprofiled|cannot wrap|not profiled).*$", re.M)


class Build:
    def __init__(self, args):
        self.lib, self.run, self.tools = args[:3]
        self.missing = [m for m in args[3].split("=", 1)[1].split(",") if m]
        self.agent = args[4].split("=", 1)[1]  # '' unless the archive is shadow
        self.programs = dict(a.split("=", 1) for a in args[5:])
        self.notes = harness.stapsdt.read(self.lib)
        sites = {n.name: n.location for n in self.notes if n.provider == "ddheap"}
        self.sites = [str(sites["alloc"]), str(sites["free"])]

    def program(self, name):
        if name not in self.programs:
            lib = name.split("_")[0]
            raise Failure(f"{name} was not built: {lib} is missing ({', '.join(self.missing)}); "
                          f"scripts/install-deps installs it")
        return self.programs[name]

    def balance(self):
        return os.path.join(HERE, "balance.bt"), [self.lib, "0"] + self.sites


def base_env(allocator):
    """The environment a program of `allocator` runs in without ddheap."""
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "DD_HEAP_SAMPLING_INTERVAL", "DD_HEAP_SAMPLING_ENABLED"):
        env.pop(k, None)
    env["DD_HEAP_SAMPLES_PER_SECOND"] = "0"  # no rate limit: interval 1 means every block
    if allocator == "mimalloc":
        if ctypes.util.find_library("mimalloc") is None:
            raise Failure("libmimalloc is not installed (scripts/install-deps installs it)")
        env["LD_PRELOAD"] = MIMALLOC
    return env


def run(cmd, env, what):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if p.returncode != 0:
        raise Failure(f"{what}: exit status {p.returncode}: {(p.stderr + p.stdout).strip()[-800:]}")
    return p


def result_lines(text):
    return [l for l in text.splitlines() if ": result " in l or l.startswith("alloc: allocator")]


def stat(text, name):
    m = re.search(rf"^alloc: stat {name} (\d+)$", text, re.M)
    if m is None:
        raise Failure(f"no 'alloc: stat {name}' line in:\n{text}")
    return int(m.group(1))


def within(c, got, want, what):
    c.check(abs(got - want) <= STAT_TOLERANCE * max(want, 1),
            f"{what}: {got} with ddheap, {want} without (within {STAT_TOLERANCE:.0%})")


SETTINGS = ({}, {"DD_HEAP_SAMPLING_INTERVAL": "1"}, {"DD_HEAP_SAMPLING_ENABLED": "0"})


def test_allocator(c, b, allocator):
    for program in (allocator, allocator + "_cxx"):
        path = b.program(program)
        env = base_env(allocator)
        plain = run([path], env, f"{program} without ddheap").stdout
        c.check(len(result_lines(plain)) == 2, f"{program}: prints its allocator and result")
        # jemalloc lacks pvalloc: under ddheap it is built from jemalloc's
        # own aligned allocation, and the program then calls it too.
        env_ddheap = {**env, "DDHEAP_TEST_PVALLOC_FROM_SIBLINGS": "1"}
        for extra in SETTINGS:
            p = run([b.run, path], {**env_ddheap, **extra}, f"{program} under ddheap-run {extra}")
            what = f"{program} under ddheap-run {extra or '(default)'}"
            c.equal(result_lines(p.stdout), result_lines(plain), f"{what}: same output")
            # What the allocator's own statistics saw of one 48 MiB block
            # (the program checks it is at least that): the block was
            # served by the allocator, with ddheap as without.
            within(c, stat(p.stdout, "big_seen"), stat(plain, "big_seen"),
                   f"{what}: {allocator}'s own statistics, growth for one 48 MiB block")
            print(f"NOTE - {what}: {allocator}'s own count of allocated bytes at exit "
                  f"{stat(p.stdout, 'allocated')}, without ddheap {stat(plain, 'allocated')}")
            c.check(UNPROFILED.search(p.stderr) is None,
                    f"{what}: the library is in charge of malloc (no notice: {p.stderr.strip()!r})")
        if b.agent and program == allocator:
            # In process: the agent's dd_heap_interpose_libc() at start,
            # every block reported (the program checks some were).
            p = run([path], {**env, "DDHEAP_TEST_AGENT": b.agent}, f"{program} in process")
            c.equal(result_lines(p.stdout), result_lines(plain),
                    f"{program}, dd_heap_interpose_libc() at interval 1: same output "
                    f"({p.stderr.strip()})")
            within(c, stat(p.stdout, "big_seen"), stat(plain, "big_seen"),
                   f"{program} in process: {allocator}'s own statistics, growth for one "
                   f"48 MiB block")
        if allocator == "mimalloc":
            # Preloaded ahead of ddheap (not what ddheap-run does): mimalloc's
            # functions win the lookup, the library forwards nothing, and
            # writes nothing on the program's streams (it records it in
            # the status word ddheap-prof reads).
            ahead = {**env, "LD_PRELOAD": f"{MIMALLOC}:{b.lib}", "DD_HEAP_SAMPLING_INTERVAL": "1"}
            p = run([path], ahead, f"{program} with mimalloc ahead of ddheap")
            c.equal(result_lines(p.stdout), result_lines(plain),
                    f"{program}, mimalloc preloaded ahead of ddheap: same output")
            c.equal(p.stderr, "", f"{program}, mimalloc ahead: nothing on the program's stderr")


def test_own(c, b):
    path = b.program("own")
    plain = run([path], base_env("glibc"), "own_malloc without ddheap").stdout
    c.check("calls to the program's malloc: all" in plain, "own_malloc: its malloc serves it")
    for extra in SETTINGS:
        p = run([b.run, path], {**base_env("glibc"), **extra}, f"own_malloc under ddheap-run {extra}")
        c.equal(p.stdout.splitlines(), plain.splitlines(),
                f"own_malloc under ddheap-run {extra or '(default)'}: same output")
        notice = UNPROFILED.findall(p.stderr)
        c.check(len(notice) == 1 and "malloc is defined by" in notice[0],
                f"own_malloc {extra or '(default)'}: said once to run with its own malloc, "
                f"unprofiled ({p.stderr.strip()!r})")
    # Said by ddheap-run before exec, in its own process, never by the
    # program: two runs of it from a shell under ddheap-run (which checks
    # the shell, whose malloc is wrapped) print nothing at all of it.
    p = run([b.run, "/bin/sh", "-c", f'"{path}" && "{path}"'], base_env("glibc"),
            "own_malloc twice from a shell under ddheap-run")
    c.equal(p.stdout.splitlines(), plain.splitlines() * 2, "own_malloc twice from a shell: same output")
    c.equal(UNPROFILED.findall(p.stderr), [],
            f"own_malloc from a shell: nothing said inside the processes ({p.stderr.strip()!r})")
    # A script whose interpreter (#!) is the program: ddheap-run checks the
    # interpreter, the executable the dynamic linker loads.
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "script")
        with open(script, "w") as f:
            f.write(f"#!{path}\n")
        os.chmod(script, 0o755)
        p = run([b.run, script], base_env("glibc"), "a script run by own_malloc under ddheap-run")
    notice = UNPROFILED.findall(p.stderr)
    c.check(len(notice) == 1 and f"malloc is defined by {path}" in notice[0],
            f"a script whose interpreter is own_malloc: said once ({p.stderr.strip()!r})")


def test_unwrappable(c, b):
    cases = [("jemalloc_static", "malloc is defined by"), ("prefixed", "je_malloc"),
             ("static", "statically linked")]
    for name, said in cases:
        path = b.program(name)
        plain = run([path], base_env("glibc"), f"{name} without ddheap").stdout
        p = run([b.run, path], {**base_env("glibc"), "DD_HEAP_SAMPLING_INTERVAL": "1"},
                f"{name} under ddheap-run")
        c.equal(result_lines(p.stdout), result_lines(plain), f"{name}: same output")
        notice = UNPROFILED.findall(p.stderr)
        c.check(any(said in line for line in notice) and len(notice) == 1,
                f"{name}: ddheap-run says why it runs unprofiled ({p.stderr.strip()!r})")


# --- redis-server ---

REDIS_SCRIPT = [
    "SET greeting hello", "APPEND greeting ,world", "GET greeting", "STRLEN greeting",
    "RPUSH list a b c d e f", "LRANGE list 0 -1", "LPOP list", "LLEN list",
    "HSET h f1 v1 f2 v2 f3 v3", "HGET h f2", "HLEN h", "SADD s x y z", "SCARD s",
    "ZADD z 1 one 2 two 3 three", "ZRANGE z 0 -1 WITHSCORES", "INCRBY counter 41", "INCR counter",
    "DEBUG POPULATE 60000 pop 200", "DBSIZE", "SCARD myset", "HLEN myhash", "EXISTS key:000000000999",
    "DEBUG DIGEST", "DEBUG DIGEST-VALUE greeting list h s z",
]


class Redis:
    """Our own redis-server on 127.0.0.1 and a port of its own, stopped
    (SHUTDOWN NOSAVE, else killed) on exit: never the system's service."""

    def __init__(self, b, under_ddheap, extra_env=None):
        for tool in ("redis-server", "redis-cli", "redis-benchmark"):
            if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
                raise Failure(f"{tool} is not installed (scripts/install-deps installs "
                              f"redis-server and redis-tools)")
        self.port = free_port()
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--daemonize", "no", "--enable-debug-command", "local"]
        if under_ddheap:
            cmd = [b.run] + cmd
        env = {**base_env("glibc"), **(extra_env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while self.cli("PING") != "PONG":
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise Failure(f"redis-server did not start: {self.proc.stderr.read()[-800:]}")
            time.sleep(0.1)

    def cli(self, command):
        p = subprocess.run(["redis-cli", "-p", str(self.port)] + command.split(),
                           capture_output=True, text=True, timeout=60)
        return p.stdout.strip()

    def benchmark(self):
        # Random keys over a keyspace of 1000, 20000 requests per test: every
        # key is hit (all but surely), and every value is the same, so the
        # dataset is the same whatever the order (DEBUG DIGEST checks it).
        p = subprocess.run(["redis-benchmark", "-p", str(self.port), "-q", "-n", "20000", "-c", "8",
                            "-r", "1000", "-d", "64", "-t", "set,get,sadd,hset"],
                           capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise Failure(f"redis-benchmark failed: {p.stderr.strip()[-500:]}")

    def memory(self):
        info = self.cli("INFO memory")
        return dict(l.split(":", 1) for l in info.splitlines() if ":" in l)

    def stop(self):
        if self.proc.poll() is None:
            self.cli("SHUTDOWN NOSAVE")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode


def redis_session(r):
    """Replies to the script, after the benchmark; INFO memory at the end."""
    r.benchmark()
    replies = [f"{cmd} -> {r.cli(cmd)}" for cmd in REDIS_SCRIPT]
    return replies, r.memory()


def redis_plain(b):
    r = Redis(b, False)
    try:
        return redis_session(r)
    finally:
        r.stop()


def same_replies(c, replies, plain, what):
    diff = [(got, want) for got, want in zip(replies, plain) if got != want]
    c.check(replies == plain, f"{what}: the same {len(plain)} replies (DEBUG DIGEST included)"
                              + (f"; first difference: {diff[0]}" if diff else ""))


def check_redis_memory(c, mem, plain_mem, what):
    c.check(mem.get("mem_allocator", "").startswith("jemalloc"),
            f"{what}: mem_allocator {mem.get('mem_allocator')} (jemalloc)")
    within(c, int(mem["allocator_allocated"]), int(plain_mem["allocator_allocated"]),
           f"{what}: INFO memory allocator_allocated")


def test_redis(c, b):
    plain, plain_mem = redis_plain(b)
    print(f"NOTE - without ddheap: mem_allocator {plain_mem['mem_allocator']}, "
          f"allocator_allocated {plain_mem['allocator_allocated']}")
    for extra in SETTINGS[:2]:
        r = Redis(b, True, extra)
        try:
            replies, mem = redis_session(r)
        finally:
            status = r.stop()
        what = f"redis-server under ddheap-run {extra or '(default)'}"
        print(f"NOTE - {what}: mem_allocator {mem['mem_allocator']}, "
              f"allocator_allocated {mem['allocator_allocated']}")
        c.equal(status, 0, f"{what}: exit status after SHUTDOWN")
        same_replies(c, replies, plain, what)
        check_redis_memory(c, mem, plain_mem, what)
        c.check(UNPROFILED.search(r.stderr) is None, f"{what}: the library is in charge of malloc")


def traced_redis_session(b, interval, script, args, ready):
    """One server under ddheap-run with one tracer attached by pid for the
    whole session: (replies, INFO memory, the tracer's output, status)."""
    extra = {} if interval is None else {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}
    r = Redis(b, True, extra)
    t = None
    try:
        t = Tracer(script, args, r.pid)
        t.wait_ready(ready)
        replies, mem = redis_session(r)
        out = t.stop(timeout=STOP_TIMEOUT)
    finally:
        harness.stop_quietly(t)
        status = r.stop()
    return replies, mem, out, status


def test_traced_redis(c, b):
    plain, plain_mem = redis_plain(b)
    # Interval 1, every block: the stream per address (balance.bt keeps no
    # stacks, so its maps can be big).
    os.environ.update(BIG_MAPS)
    replies, mem, out, status = traced_redis_session(b, 1, *b.balance(), "READY")
    what = "redis-server traced at interval 1 (balance.bt)"
    c.equal(status, 0, f"{what}: exit status after SHUTDOWN")
    same_replies(c, replies, plain, what)
    check_redis_memory(c, mem, plain_mem, what)
    check_balance(c, out, what)
    # The default interval, as a user runs it: the shipped ddheap-live.bt
    # with bpftrace's default map sizes, and the stacks it prints.
    for k in BIG_MAPS:
        os.environ.pop(k, None)
    replies, mem, out, status = traced_redis_session(
        b, None, os.path.join(b.tools, "ddheap-live.bt"), [b.lib], "ddheap-live: tracing")
    what = "redis-server traced by default (ddheap-live.bt)"
    c.equal(status, 0, f"{what}: exit status after SHUTDOWN")
    same_replies(c, replies, plain, what)
    check_redis_memory(c, mem, plain_mem, what)
    names = sorted(set(re.findall(r"\b(z(?:try)?(?:malloc|calloc|realloc)\w*)\+", out)))
    c.check(len(names) > 0, f"{what}: the stacks name redis's allocation functions: {names}")


# --- traced programs ---

def check_balance(c, out, what):
    r = harness.results(out)
    c.check(r["allocs"] > 0, f"{what}: alloc events: {r['allocs']}")
    c.equal(r["unmatched"], 0, f"{what}: frees with no prior alloc (of {r['frees']})")
    c.equal(r["alloc_of_live"], 0, f"{what}: allocs of a pointer still live")
    return r


def test_traced(c, b, allocator):
    os.environ.update(BIG_MAPS)
    for program in (allocator, allocator + "_cxx"):
        path = b.program(program)
        env = base_env(allocator)
        plain = result_lines(run([path], env, f"{program} without ddheap").stdout)
        for extra in SETTINGS[:2]:
            what = f"{program} traced {extra or '(default)'}"
            t = Tracer(*b.balance(), None)
            try:
                t.wait_ready("READY")
                p = run([b.run, path], {**env, **extra}, what)
                out = t.stop(timeout=STOP_TIMEOUT)
            finally:
                harness.stop_quietly(t)
            c.equal(result_lines(p.stdout), plain, f"{what}: same output")
            check_balance(c, out, what)


TESTS = {
    "jemalloc": lambda c, b: test_allocator(c, b, "jemalloc"),
    "tcmalloc": lambda c, b: test_allocator(c, b, "tcmalloc"),
    "mimalloc": lambda c, b: test_allocator(c, b, "mimalloc"),
    "glibc": lambda c, b: test_allocator(c, b, "glibc"),
    "own": test_own,
    "unwrappable": test_unwrappable,
    "redis": test_redis,
    "traced-jemalloc": lambda c, b: test_traced(c, b, "jemalloc"),
    "traced-tcmalloc": lambda c, b: test_traced(c, b, "tcmalloc"),
    "traced-mimalloc": lambda c, b: test_traced(c, b, "mimalloc"),
    "traced-redis": test_traced_redis,
}


def main():
    if len(sys.argv) < 7 or sys.argv[1] not in TESTS:
        print(__doc__)
        return 2
    name = sys.argv[1]
    b = Build(sys.argv[2:])
    return harness.run_checks(name, lambda c: TESTS[name](c, b),
                              require=harness.require_root_and_bpftrace if name.startswith("traced-")
                              else None)


if __name__ == "__main__":
    sys.exit(main())

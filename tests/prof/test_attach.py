#!/usr/bin/env python3
"""ddheap-prof -p on processes started without ddheap (docs/attach.md): the
agent injected by ptrace, a known allocation measured, and the process
left as it was: every malloc-family GOT slot (of the executable, of libc,
of the allocator) read back from /proc/PID/mem equal to its value before,
every block intact, every thread still running.

    test_attach.py TEST DDHEAP_PROF ARTIFACT_DIR [EXTRA...]

Tests: c (EXTRA: the program built several ways, tests/prof/meson.build),
cycles (EXTRA: the program; DDHEAP_ATTACH_CYCLES cycles, default 12),
sigkill, in-malloc (EXTRA: the program), namespace (EXTRA: the program and
the agent), refusals (EXTRA: the program,
dynamic and static), python, redis. Needs root; exits 77 (skipped) only when not root.
Prints the attach latency and the longest stop of the target as NOTE lines.
"""

import ctypes
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from harness import Failure, free_port, run_prof_test
from pprof_read import read_raw

TIMEOUT = 120
INTERVAL = 65536
FAMILY = {"malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign",
          "aligned_alloc", "memalign", "valloc", "pvalloc", "free_sized",
          "free_aligned_sized", "dlopen", "dlmopen"}


def note(text):
    print(f"NOTE - {text}", flush=True)


# --- the GOT slots of a process, from /proc/PID/mem ---

def relocations(path, family_only):
    """[(offset, name)] of the JUMP_SLOT and GLOB_DAT relocations of an ELF
    file, and whether it is position-independent."""
    out = subprocess.run(["readelf", "-rhW", path], capture_output=True, text=True,
                         check=True).stdout
    dyn = re.search(r"Type:\s+DYN", out) is not None
    slots = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 5 and f[2] in ("R_X86_64_JUMP_SLOT", "R_X86_64_GLOB_DAT"):
            name = f[4].split("@")[0]
            if not family_only or name in FAMILY:
                slots.append((int(f[0], 16), name))
    return slots, dyn


def mapped_objects(pid):
    """{path: address of its offset-0 mapping}."""
    objs = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            p = line.split()
            if len(p) >= 6 and p[5].startswith("/") and int(p[2], 16) == 0:
                objs.setdefault(p[5], int(p[0].split("-")[0], 16))
    return objs


def got_slots(pid, names):
    """{(object, symbol, offset): value} of the relocated slots of the
    mapped objects whose base name starts with one of `names`: every slot
    of the executable (the first name), the malloc family's of the others."""
    values = {}
    objs = mapped_objects(pid)
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for i, want in enumerate(names):
            for path, start in objs.items():
                if not os.path.basename(path).startswith(want):
                    continue
                slots, dyn = relocations(path, family_only=i > 0)
                base = start if dyn else 0
                for offset, name in slots:
                    mem.seek(base + offset)
                    values[(os.path.basename(path), name, offset)] = mem.read(8).hex()
    return values


def wait_restored(pid, names, before, what, c):
    """Polls the slots until they equal `before` (the agent restores them
    when ddheap-prof's descriptor closes); checks that they do and returns
    the seconds it took."""
    start = time.monotonic()
    now = got_slots(pid, names)
    while now != before and time.monotonic() - start < 20:
        time.sleep(0.01)
        now = got_slots(pid, names)
    took = time.monotonic() - start
    diff = {k: (before.get(k), now.get(k)) for k in set(before) | set(now)
            if before.get(k) != now.get(k)}
    c.check(not diff and before, f"{what}: {len(before)} GOT slots as before "
            f"(after {took:.3f} s){'' if not diff else ': ' + str(sorted(diff.items())[:5])}")
    return took


# --- ddheap-prof ---

class Prof:
    """ddheap-prof -p PID as a child, its stderr in a file."""

    def __init__(self, prof, pid, out, extra=()):
        self.err = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-attach-", suffix=".txt")
        self.proc = subprocess.Popen([prof, "-p", str(pid), "-o", out] + list(extra),
                                     stderr=self.err, text=True)

    def text(self):
        with open(self.err.name) as f:
            return f.read()

    def wait_profiling(self):
        deadline = time.monotonic() + TIMEOUT
        while "profiling pid" not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise Failure(f"ddheap-prof did not start profiling:\n{self.text()}")
            time.sleep(0.01)

    def stop(self, sig=signal.SIGINT):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Failure(f"ddheap-prof did not stop:\n{self.text()}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def injection_costs(text):
    """(attach latency ms, longest stop ms) from ddheap-prof's line."""
    m = re.search(r"attach ([\d.]+) ms, a thread of it held ([\d.]+) ms at most", text)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


class Target:
    """A program that takes commands on stdin and answers a line each.
    Every command is run once first (fork: that one too), so that the
    slots of lazy binding are bound before the test reads them."""

    def __init__(self, argv, env=None, stderr=None, fork=False):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, text=True,
                                     env=dict(os.environ, **(env or {})))
        self.expect("ready")
        for command, answer in (("keep 1 64", "kept"), ("check", "ok"), ("free", "freed")):
            if self.ask(command) != answer:
                raise Failure(f"the target does not answer {command!r}")
        if fork:
            os.kill(int(self.ask("fork").split()[1]), signal.SIGKILL)

    @property
    def pid(self):
        return self.proc.pid

    def expect(self, want):
        line = self.proc.stdout.readline().strip()
        if line != want:
            raise Failure(f"the target said {line!r}, not {want!r} (exit {self.proc.poll()})")

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def finish(self, c):
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = "hung"
        c.equal(rc, 0, "the target exits normally at the end")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def target_env():
    """The target's sampling interval (the agent reads the process's own
    environment), and no ddheap left from the test's."""
    env = {"DD_HEAP_SAMPLING_INTERVAL": str(INTERVAL)}
    return env


def sigma(count, size, interval):
    p = -math.expm1(-size / interval)
    return math.sqrt(count * size * size * (1 - p) / p)


def per_site(raw, sample_type, prefix="site_"):
    k = raw["types"].index(sample_type)
    sums = {}
    for values, ids in raw["samples"]:
        site = next((f for i in ids for f in raw["locs"][i]["functions"]
                     if f.startswith(prefix)), "?")
        sums[site] = sums.get(site, 0) + values[k]
    return sums


def detach_and_check(c, p, pid, names, before, what):
    """Stops ddheap-prof (Ctrl-C): it ends well, its line gives the
    injection's costs (a NOTE), and the slots come back as they were."""
    rc = p.stop()
    err = p.text()
    c.equal(rc, 0, f"{what}: ddheap-prof ends well ({err.strip()[-300:]})")
    latency, stop = injection_costs(err)
    c.check(latency is not None, f"{what}: the injection line ({err.strip()[:300]})")
    note(f"{what}: attach latency {latency} ms, longest stop {stop} ms")
    wait_restored(pid, names, before, what, c)


# --- the C program ---

def free_check_finish(c, t, what):
    """After the detach: the blocks kept while attached (some sampled)
    freed past the hooks, the rest intact, the threads running, a normal
    exit."""
    c.equal(t.ask("free"), "freed", f"{what}: blocks sampled while attached freed after")
    c.equal(t.ask("check"), "ok", f"{what}: still running")
    t.finish(c)


def attach_c_once(c, prof, artifacts, program, what):
    """One program: attach, a known allocation, detach."""
    names = [os.path.basename(program), "libc.so"]
    t = Target([program], target_env())
    p = None
    try:
        c.equal(t.ask("check"), "ok", f"{what}: the program runs before")
        before = got_slots(t.pid, names)
        pb = os.path.join(artifacts, f"attach-{what}.pb.gz")
        p = Prof(prof, t.pid, pb)
        p.wait_profiling()
        count, size = 400, 32768
        c.equal(t.ask(f"keep {count} {size}"), "kept", f"{what}: allocated while attached")
        detach_and_check(c, p, t.pid, names, before, what)
        c.equal(t.ask("check"), "ok", f"{what}: blocks intact, threads running after detach")
        raw = read_raw(pb)
        got = per_site(raw, "inuse_space").get("site_kept", 0)
        truth = count * size
        sd = sigma(count, size, INTERVAL)
        c.check(abs(got - truth) <= 5 * sd,
                f"{what}: site_kept inuse_space {got}, true {truth}, within 5 sd = {5 * sd:.0f}")
        free_check_finish(c, t, what)
    finally:
        if p:
            p.kill()
        t.kill()


def test_c(c, prof, artifacts, extra):
    """The program of attach_target.c, PIE, non-PIE, full RELRO, lazy
    binding and -fno-plt, each attached to while its threads churn, read,
    wait on a futex and sleep."""
    for program in extra:
        attach_c_once(c, prof, artifacts, program, os.path.basename(program))


def test_namespace(c, prof, artifacts, extra):
    """A target whose mount namespace does not see the agent at ddheap-prof's
    path (a container's view): a private mount namespace with an empty
    tmpfs over the agent's folder. The agent reaches it through an
    anonymous file it makes itself; nothing is left in its file system."""
    program, built_agent = extra
    hidden = tempfile.mkdtemp(prefix="ddheap-ns-agent-", dir=artifacts)
    agent = os.path.join(hidden, "libddheap_agent.so")
    shutil.copy(built_agent, agent)
    names = [os.path.basename(program), "libc.so"]
    t = p = None
    saved = os.environ.get("DDHEAP_AGENT_LIB")
    try:
        t = Target(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount -t tmpfs ddheap-test "$1" && exec "$2"', "sh", hidden, program],
                   target_env())
        c.check(not os.path.exists(f"/proc/{t.pid}/root{agent}"),
                "the target's mount namespace does not see the agent's path")
        before = got_slots(t.pid, names)
        os.environ["DDHEAP_AGENT_LIB"] = agent
        p = Prof(prof, t.pid, os.path.join(artifacts, "attach-namespace.pb.gz"))
        p.wait_profiling()
        maps = open(f"/proc/{t.pid}/maps").read()
        c.check("/memfd:ddheap-agent" in maps,
                "the agent is mapped from an anonymous file in the target")
        count, size = 400, 32768
        c.equal(t.ask(f"keep {count} {size}"), "kept", "namespace: allocated while attached")
        detach_and_check(c, p, t.pid, names, before, "namespace")
        raw = read_raw(os.path.join(artifacts, "attach-namespace.pb.gz"))
        got = per_site(raw, "inuse_space").get("site_kept", 0)
        truth, sd = count * size, sigma(count, size, INTERVAL)
        c.check(abs(got - truth) <= 5 * sd,
                f"namespace: site_kept inuse_space {got}, true {truth}, within 5 sd = {5 * sd:.0f}")
        c.equal(os.listdir(f"/proc/{t.pid}/root{hidden}"), [],
                "nothing was written into the target's file system")
        free_check_finish(c, t, "namespace")
    finally:
        if saved is None:
            os.environ.pop("DDHEAP_AGENT_LIB", None)
        else:
            os.environ["DDHEAP_AGENT_LIB"] = saved
        if p:
            p.kill()
        if t:
            t.kill()
        shutil.rmtree(hidden, ignore_errors=True)


def test_cycles(c, prof, artifacts, extra):
    """Attach and detach again and again on one process; blocks kept
    before, allocated while attached and freed after detach, or allocated
    before and freed while attached, all intact; the slots as before after
    each cycle."""
    (program,) = extra
    cycles = int(os.environ.get("DDHEAP_ATTACH_CYCLES", "12"))
    names = [os.path.basename(program), "libc.so"]
    t = Target([program], target_env())
    try:
        c.equal(t.ask("keep 100 4096"), "kept", "blocks kept before the first attach")
        c.equal(t.ask("check"), "ok", "the program runs")
        before = got_slots(t.pid, names)
        latencies, stops, restore_times, bad = [], [], [], []
        for i in range(cycles):
            pb = os.path.join(artifacts, "attach-cycles.pb.gz")
            p = Prof(prof, t.pid, pb)
            try:
                p.wait_profiling()
                answers = [t.ask("free"), t.ask("keep 50 4096"), t.ask("check")]
                rc = p.stop()
            finally:
                p.kill()
            latency, stop = injection_costs(p.text())
            latencies.append(latency or 0)
            stops.append(stop or 0)
            took_start = time.monotonic()
            now = got_slots(t.pid, names)
            while now != before and time.monotonic() - took_start < 20:
                time.sleep(0.01)
                now = got_slots(t.pid, names)
            restore_times.append(time.monotonic() - took_start)
            if rc != 0 or answers != ["freed", "kept", "ok"] or now != before or latency is None:
                bad.append((i, rc, answers, now == before, p.text()[-300:]))
        c.check(not bad, f"{cycles} cycles, each well: {bad[:2]}")
        c.equal(t.ask("check"), "ok", "blocks intact after the cycles")
        note(f"cycles: {cycles}; attach latency median {sorted(latencies)[len(latencies) // 2]} ms, "
             f"max {max(latencies)} ms; longest stop {max(stops)} ms; restored after "
             f"{max(restore_times):.3f} s at most")
        t.finish(c)
    finally:
        t.kill()


def test_sigkill(c, prof, artifacts, extra):
    """ddheap-prof killed with SIGKILL mid-run: the agent notices the pipe
    closed on its own and puts every slot back. Before that, a child the
    program forks while attached has its slots as before the attach."""
    (program,) = extra
    names = [os.path.basename(program), "libc.so"]
    t = Target([program], target_env(), fork=True)
    p = None
    try:
        c.equal(t.ask("check"), "ok", "the program runs")
        before = got_slots(t.pid, names)
        p = Prof(prof, t.pid, os.path.join(artifacts, "attach-sigkill.pb.gz"))
        p.wait_profiling()
        c.equal(t.ask("keep 100 4096"), "kept", "allocated while attached")
        c.check(got_slots(t.pid, names) != before, "the slots are rewritten while attached")
        child = int(t.ask("fork").split()[1])
        try:
            # (its own first calls bind lazy slots of its own: the family's
            # are the ones to compare)
            family = {k: v for k, v in before.items() if k[1] in FAMILY}
            c.equal({k: v for k, v in got_slots(child, names).items() if k[1] in FAMILY},
                    family, "a child forked while attached has its slots back at once")
        finally:
            os.kill(child, signal.SIGKILL)  # the program's child: it reaps nothing, the zombie goes with it
        p.stop(signal.SIGKILL)
        took = wait_restored(t.pid, names, before, "after SIGKILL", c)
        note(f"sigkill: slots restored {took:.3f} s after ddheap-prof was killed")
        free_check_finish(c, t, "after SIGKILL")
    finally:
        if p:
            p.kill()
        t.kill()


def test_in_malloc(c, prof, artifacts, extra):
    """The main thread inside the allocator at the moment of attach: in
    malloc_stats(), blocked writing to a full stderr while it holds the
    main arena's lock. Borrowing it would deadlock the process on its own
    lock; the injector passes it over (more than one stop) and borrows
    another thread; once stderr is read, everything runs on."""
    (program,) = extra
    names = [os.path.basename(program), "libc.so"]
    t = Target([program], target_env(), stderr=subprocess.PIPE)
    p = None
    try:
        t.proc.stdin.write("stall\n")
        t.proc.stdin.flush()
        t.expect("stalling")
        before = got_slots(t.pid, names)  # write and malloc_stats bound by now
        p = Prof(prof, t.pid, os.path.join(artifacts, "attach-in-malloc.pb.gz"))
        deadline = time.monotonic() + TIMEOUT
        while "injected" not in p.text() and "cannot" not in p.text():
            if time.monotonic() > deadline or p.proc.poll() is not None:
                break
            time.sleep(0.01)
        t.proc.stderr.read(65536 + 100)  # lets malloc_stats finish
        t.expect("unstalled")
        p.wait_profiling()
        m = re.search(r"(\d+) stops?\)", p.text())
        c.check(m and int(m.group(1)) >= 2,
                f"the thread inside the allocator was passed over: {p.text().strip()[:300]}")
        c.equal(t.ask("keep 50 4096"), "kept", "allocates while attached")
        c.equal(p.stop(), 0, "ddheap-prof ends well")
        wait_restored(t.pid, names, before, "after a stall inside malloc", c)
        free_check_finish(c, t, "after a stall inside malloc")
    finally:
        if p:
            p.kill()
        t.kill()


def refused(c, prof, artifacts, pid, want, what, extra=()):
    """ddheap-prof -p PID refuses with `want` in its message, and the
    process is untouched: not traced, no agent mapped."""
    r = subprocess.run([prof, "-p", str(pid), "-o", os.path.join(artifacts, "refused.pb.gz")] +
                       list(extra), capture_output=True, text=True, timeout=TIMEOUT)
    c.check(r.returncode == 1 and want in r.stderr,
            f"{what}: refused ({r.returncode}) saying {want!r}: {r.stderr.strip()[:300]}")
    with open(f"/proc/{pid}/maps") as f:
        c.check("libddheap_agent" not in f.read(), f"{what}: no agent mapped")


def test_refusals(c, prof, artifacts, extra):
    """Refused, with the reason, without touching the process: --no-inject,
    a static executable, a process traced already, a seccomp filter."""
    dynamic, static = extra
    for argv, extra_args, want, what in (
            ([dynamic], ["--no-inject"], "--no-inject forbids", "--no-inject"),
            ([static], [], "statically linked", "a static executable"),
            ([dynamic, "seccomp"], [], "seccomp filter", "a seccomp filter")):
        t = Target(argv, target_env())
        try:
            refused(c, prof, artifacts, t.pid, want, what, extra_args)
            c.equal(t.ask("check"), "ok", f"{what}: the process runs on")
            t.finish(c)
        finally:
            t.kill()
    # A tracer already there: this script seizes the process itself (and
    # waits for nothing: no timer signals, which would stop it for us).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    t = Target([dynamic, "notimer"], target_env())
    try:
        c.equal(libc.ptrace(0x4206, t.pid, None, None), 0, "this test traces the process")
        refused(c, prof, artifacts, t.pid, "traced already", "a traced process")
        c.equal(t.ask("check"), "ok", "a traced process: runs on")
    finally:
        t.kill()


# --- Debian's python3 and redis-server ---

PYTHON_TARGET = r"""
import sys
kept = []
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "keep":
        kept = [bytearray(b"%c" % (i % 250 + 1)) * int(cmd[2]) for i in range(int(cmd[1]))]
        print("kept", flush=True)
    elif cmd[0] == "check":
        good = all(b[0] == i % 250 + 1 and b[-1] == b[0] for i, b in enumerate(kept))
        print("ok" if good else "bad", flush=True)
    elif cmd[0] == "free":
        kept = []
        print("freed", flush=True)
    elif cmd[0] == "quit":
        break
"""


def test_python(c, prof, artifacts, extra):
    """Debian's python3 started plainly: attached to, 300 bytearrays of
    32 KiB kept while attached (the estimate of the live heap holds them),
    detached with its slots as before."""
    python = os.path.realpath("/usr/bin/python3")
    names = [os.path.basename(python), "libc.so"]
    t = Target([python, "-c", PYTHON_TARGET], target_env())
    p = None
    try:
        before = got_slots(t.pid, names)
        pb = os.path.join(artifacts, "attach-python.pb.gz")
        p = Prof(prof, t.pid, pb)
        p.wait_profiling()
        count, size = 300, 32768
        c.equal(t.ask(f"keep {count} {size}"), "kept", "python allocated while attached")
        detach_and_check(c, p, t.pid, names, before, "python3")
        raw = read_raw(pb)
        k = raw["types"].index("inuse_space")
        total = sum(v[k] for v, _ in raw["samples"])
        truth, sd = count * size, sigma(count, size, INTERVAL)
        c.check(total >= truth - 5 * sd,
                f"python3: inuse_space {total} holds the {truth} kept (5 sd = {5 * sd:.0f})")
        c.equal(t.ask("check"), "ok", "python3's objects intact")
        c.equal(t.ask("free"), "freed", "python3 frees them after detach")
        t.finish(c)
    finally:
        if p:
            p.kill()
        t.kill()


def redis_cmd(port, *args):
    cmd = ["redis-cli", "-h", "127.0.0.1", "-p", str(port)] + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout


def redis_run(c, prof, artifacts, attach):
    """Starts redis-server, fills it (attached or not), returns its INFO
    memory's allocator_allocated after the detach."""
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ, **target_env()))
    p = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if redis_cmd(port, "ping").strip() == "PONG":
                    break
            except subprocess.CalledProcessError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise Failure("redis-server did not start")
            time.sleep(0.05)
        # (Debian's redis-server is a link to redis-check-rdb, the name
        # in the maps)
        exe = os.path.basename(os.path.realpath(shutil.which("redis-server")))
        names = [exe, "libc.so", "libjemalloc"]
        before = got_slots(server.pid, names)
        if attach:
            p = Prof(prof, server.pid, os.path.join(artifacts, "attach-redis.pb.gz"))
            p.wait_profiling()
        script = "".join(f"SET key:{i} {'v' * 4000}{i}\n" for i in range(3000))
        subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(port)], input=script,
                       capture_output=True, text=True, timeout=60, check=True)
        if attach:
            detach_and_check(c, p, server.pid, names, before, "redis-server")
        c.equal(redis_cmd(port, "get", "key:2999").strip(), "v" * 4000 + "2999",
                f"redis keeps its data ({'attached' if attach else 'plain'})")
        # INFO's allocator figures are jemalloc's stats as redis's cron last
        # refreshed them (10 times a second): read until two agree.
        readings = []
        while len(readings) < 2 or readings[-1] != readings[-2]:
            if len(readings) > 50:
                raise Failure(f"redis's allocator_allocated does not settle: {readings}")
            time.sleep(0.2)
            info = redis_cmd(port, "info", "memory")
            readings.append(int(re.search(r"allocator_allocated:(\d+)", info).group(1)))
        return readings[-1]
    finally:
        if p:
            p.kill()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_redis(c, prof, artifacts, extra):
    """Debian's redis-server (linked with jemalloc) started plainly and
    attached to while it takes 3000 keys: jemalloc keeps the heap (its
    allocator_allocated within 10 % of a run without ddheap), its slots
    are as before after detach."""
    plain = redis_run(c, prof, artifacts, attach=False)
    attached = redis_run(c, prof, artifacts, attach=True)
    c.check(abs(attached - plain) <= 0.1 * plain,
            f"jemalloc's allocator_allocated {attached} within 10 % of {plain} without ddheap")


TESTS = {"c": test_c, "cycles": test_cycles, "namespace": test_namespace, "sigkill": test_sigkill, "python": test_python,
         "redis": test_redis, "in-malloc": test_in_malloc, "refusals": test_refusals}


if __name__ == "__main__":
    sys.exit(run_prof_test(__doc__, TESTS, 2, extra=True))

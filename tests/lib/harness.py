"""Helpers for the tracer tests: run the workload, attach bpftrace to it in
step with it, read its probe semaphores from outside, and parse what both
print.

Synchronisation never relies on sleeping for "long enough": the workload
waits for a line on stdin before its traced phase, and the tests send it
only after bpftrace has printed from its BEGIN probe, which bpftrace runs
after every probe is attached. The workload's alloc semaphore alone is not
enough: it is raised when the first uprobe is attached, possibly before the
free probe is.
"""

import math
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import stapsdt

TIMEOUT = 60  # seconds for any single wait; a hang fails, it never blocks CI


class Failure(Exception):
    pass


class StacksLost(Failure):
    """bpftrace 0.17 sometimes cannot read its own stack map back when it
    prints at exit ("failed to look up stack id N (pid P): -9", EBADF:
    the map's descriptor is gone). Seen in roughly one run in fifteen on
    this machine, with any script that prints stacks, never under strace.
    Nothing about the traced program is learnt from such a run."""


def need(program, package="it"):
    """The path of `program`, which scripts/install-deps installs (from
    `package`): missing, it is a Failure (a broken machine), never a skip."""
    path = shutil.which(program)
    if path is None:
        raise Failure(f"{program} is not installed (scripts/install-deps installs {package})")
    return path


def require_root_and_bpftrace():
    """Returns an exit code to use instead of running (77: skip), or None."""
    if os.geteuid() != 0:
        print("SKIP: the tracer tests attach bpftrace and need root "
              "(CI runs them as root; run `sudo meson test --suite tracer`)")
        return 77
    need("bpftrace")  # root but no bpftrace: a broken CI machine
    return None


class Workload:
    """The example workload, its stdout read line by line in the background."""

    def __init__(self, binary, args, env=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen([binary] + args, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=full_env)
        self.lines = []
        self.tracers = []  # attached through attach(): stopped when the `with` ends
        self._queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.pid = self.proc.pid

    # `with Workload(...) as w:` kills the workload and stops every tracer
    # attached through w.attach() however the block ends, so a failed check
    # never leaves a process or a bpftrace behind (stop_quietly: the
    # failure being handled is the one to report).
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()
        stop_quietly(*self.tracers)
        return False

    def attach(self, script, positional, ready=None):
        """bpftrace `script` attached to this workload, returned once BEGIN
        has printed `ready`, i.e. once every probe is attached (ready None:
        at once; the caller waits, and several tracers compile at once)."""
        t = Tracer(script, positional, self.pid)
        self.tracers.append(t)
        if ready is not None:
            t.wait_ready(ready)
        return t

    def _pump(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_line(self, prefix, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure(f"workload: no line starting {prefix!r} within {timeout} s")
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                err = self.proc.stderr.read()
                raise Failure(f"workload exited before printing {prefix!r}: {err.strip()}")
            self.lines.append(line)
            if line.startswith(prefix):
                return line

    def send(self, text="go"):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout=TIMEOUT):
        """Waits for exit; returns the exit code. Drains the rest of stdout."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Failure("workload did not exit in time")
        while True:
            line = self._queue.get(timeout=TIMEOUT)
            if line is None:
                break
            self.lines.append(line)
        self.stderr = self.proc.stderr.read()
        return rc

    def exit(self, timeout=TIMEOUT):
        """Tells a workload that waits for it to exit; returns its exit code."""
        self.send("exit")
        return self.finish(timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Tracer:
    """bpftrace attached to a running process with -p (or, pid None, to
    every process that maps the probed files), output in a file."""

    def __init__(self, script, positional, pid):
        self.out = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-bt-", suffix=".txt")
        target = ["-p", str(pid)] if pid is not None else []
        self.proc = subprocess.Popen(["bpftrace", script] + positional + target,
                                     stdout=self.out, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.nudges = 0  # times stop() found the SIGINT lost (see lost_sigint)

    def text(self):
        with open(self.out.name) as f:
            return f.read()

    def wait_ready(self, marker, timeout=TIMEOUT):
        """Waits until BEGIN has printed `marker`: every probe is attached."""
        try:
            wait_for_output(self.proc, self.text, marker, "bpftrace", timeout)
        except Failure:
            stop_quietly(self)
            raise

    def stop(self, timeout=TIMEOUT):
        """Ctrl-C: bpftrace runs END, prints its maps, detaches, exits.

        bpftrace 0.17 can lose the SIGINT (see lost_sigint): then it is
        nudged out of its wait, at most NUDGES times, each said on stdout."""
        if self.proc.poll() is None:
            attached = perf_event_fds(self.proc.pid)
            self.proc.send_signal(signal.SIGINT)
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                try:
                    self.proc.wait(timeout=max(0, min(left, LOST_SIGINT_LOOK)))
                    break
                except subprocess.TimeoutExpired:
                    pass
                if left <= LOST_SIGINT_LOOK:
                    state = describe(self.proc.pid)
                    self.proc.kill()
                    self.proc.wait()
                    raise Failure(f"bpftrace did not exit after SIGINT ({self.nudges} nudges); "
                                  f"it was: {state}\n{self.text()[-2000:]}")
                if self.nudges < NUDGES and lost_sigint(self.proc.pid, attached):
                    self.nudges += 1
                    print(f"NOTE - bpftrace {self.proc.pid} lost its SIGINT (asleep in "
                          f"epoll_wait, all {attached} perf events still open, nothing pending): "
                          f"SIGSTOP+SIGCONT, nudge {self.nudges} of {NUDGES}", flush=True)
                    os.kill(self.proc.pid, signal.SIGSTOP)
                    os.kill(self.proc.pid, signal.SIGCONT)
        text = self.text()
        if "failed to look up stack id" in text:
            # bpftrace itself could not read its stack map back (seen once
            # in many runs): the stacks are lost, which no check may hide.
            raise StacksLost("bpftrace failed to read back its stacks:\n" + text[:2000])
        return text


def free_port():
    """A TCP port free on 127.0.0.1 now, for a server the test starts
    (which may still lose it to another process before it binds)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_output(proc, text, marker, who, timeout=TIMEOUT):
    """Waits until text() (what `proc` printed so far) contains `marker`;
    fails if proc exits first or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while marker not in text():
        if proc.poll() is not None:
            raise Failure(f"{who} exited before printing {marker!r}:\n{text()}")
        if time.monotonic() > deadline:
            raise Failure(f"{who} did not print {marker!r} within {timeout} s:\n{text()}")
        time.sleep(0.05)


# bpftrace 0.17 loses a SIGINT (or SIGTERM) that is handled while it is not
# asleep in epoll_wait. Its handler only sets a flag, and its main loop
# reads that flag only when epoll_wait fails with EINTR: it never does for
# a signal handled while the loop runs its own code, or while it waits for
# the CPU after a 100 ms epoll_wait timeout expired (the kernel then
# returns 0, not EINTR). It then polls on, probes attached, forever. Seen
# about once in 50 stops on a loaded machine (docs/reliability.md).
#
# The symptom is exact: SIGINT handled (not pending), the process asleep in
# epoll_wait, and every perf event it had open before the SIGINT still
# open (leaving the loop would have closed those of its probes first). A
# stop and continue makes that epoll_wait fail with EINTR, and bpftrace
# then sees the flag its handler set. The nudge is harmless in any other
# state (an EINTR without the flag only makes bpftrace wait again), so a
# wrong reading could cost nothing but a NOTE line. A nudge can itself land
# in the window that lost the SIGINT (epoll_wait then returns 0, not
# EINTR), as likely as the SIGINT was lost: hence a few, one a second.
LOST_SIGINT_LOOK = 1  # seconds between looks at a bpftrace that has not exited
NUDGES = 5
SIGINT_BIT = 1 << (signal.SIGINT - 1)


def perf_event_fds(pid):
    """How many perf events the process has open (its attached probes among
    them), or None if it is gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    n = 0
    for fd in fds:
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            pass
    return n


def proc_status(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
        with open(f"/proc/{pid}/wchan") as f:
            status["wchan"] = f.read()
    except OSError:
        return None
    return status


def lost_sigint(pid, attached):
    status = proc_status(pid)
    if status is None or not attached:
        return False
    pending = int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)
    return (status["State"].startswith("S") and status["wchan"] == "do_epoll_wait"
            and not pending & SIGINT_BIT and (perf_event_fds(pid) or 0) >= attached)


def describe(pid):
    status = proc_status(pid)
    if status is None:
        return "gone"
    return (f"state {status['State']}, wchan {status['wchan']}, pending "
            f"{status['SigPnd']}/{status['ShdPnd']}, perf events open {perf_event_fds(pid)}")


def stop_quietly(*tracers):
    """For `finally:` blocks: stops every tracer still running, whatever
    went wrong (the failure being handled is the one to report)."""
    for t in tracers:
        if t is not None:
            try:
                t.stop()
            except Failure:
                pass


def semaphores(binary):
    """{(provider, probe): link-time address} from the binary's stapsdt notes."""
    found = {(n.provider, n.name): n.semaphore for n in stapsdt.read(binary) if n.semaphore}
    if not found:
        raise Failure(f"no stapsdt semaphores in {binary}")
    return found


def is_pie(binary):
    out = subprocess.run(["readelf", "-h", binary], capture_output=True, text=True,
                         check=True).stdout
    return re.search(r"Type:\s+DYN", out) is not None


def read_semaphores(pid, binary):
    """Reads every probe semaphore of a live process from /proc/PID/mem:
    what the kernel's uprobe reference counter (or bpftrace) has put there."""
    base = 0
    if is_pie(binary):
        real = os.path.realpath(binary)
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and os.path.realpath(fields[5]) == real and \
                        int(fields[2], 16) == 0:
                    base = int(fields[0].split("-")[0], 16)
                    break
        if base == 0:
            raise Failure(f"{binary} is not mapped in process {pid}")
    values = {}
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for key, addr in semaphores(binary).items():
            mem.seek(base + addr)
            values[key] = int.from_bytes(mem.read(2), "little")
    return values


def parse_truth(lines):
    """The workload's ground truth: sites, per-size counts, totals, checks."""
    truth = {"site": {}, "size": {}, "total": {}, "check": {}}
    for line in lines:
        f = line.split()
        if not f:
            continue
        if f[0] == "site":
            truth["site"][f[1]] = {f[i]: int(f[i + 1]) for i in range(2, len(f), 2)}
        elif f[0] == "size":
            truth["size"][(f[1], int(f[2]))] = {f[i]: int(f[i + 1]) for i in range(3, len(f), 2)}
        elif f[0] in ("total", "check"):
            truth[f[0]] = {f[i]: int(f[i + 1]) for i in range(1, len(f), 2)}
    if not truth["site"] or not truth["total"]:
        raise Failure("the workload printed no ground truth")
    return truth


def parse_maps(text):
    """bpftrace's printed maps: {name: [(stack_frames or None, extra_key, value)]}.
    Stack keys span lines:  @m[\\n  frame\\n  frame\\n, 24]: 5"""
    maps = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^@(\w*)\[$", line)
        if m:
            frames = []
            i += 1
            while i < len(lines):
                end = re.match(r"^(?:, (.*))?\]: (-?\d+)$", lines[i])
                if end:
                    break
                if lines[i].strip():
                    frames.append(re.sub(r"\+\d+$", "", lines[i].strip()))
                i += 1
            if i == len(lines):
                raise Failure(f"truncated map entry for @{m.group(1)}")
            maps.setdefault(m.group(1), []).append((frames, end.group(1), int(end.group(2))))
        i += 1
    return maps


def site_of(frames):
    """The workload call site in a stack (innermost frame named site_*)."""
    for f in frames:
        if f.startswith("site_"):
            return f.split(".")[0]  # a compiler suffix (.part.0) is not part of the name
    return None


def results(text):
    """The scalar maps bpftrace printed at exit (`@name: value`), as a dict
    that reads 0 for a counter that never fired (bpftrace prints no line)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^@(\w+): (-?\d+)$", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return Counters(out)


class Counters(dict):
    def __missing__(self, key):
        return 0


class Checker:
    """Collects named checks; each prints one line; the caller reports."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0

    def check(self, ok, what):
        print(f"{'ok' if ok else 'FAIL'} - {self.name}: {what}")
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok

    def equal(self, got, want, what):
        return self.check(got == want, f"{what}: got {got}, want {want}")

    def summary(self):
        """Prints the closing "N passed, N failed" line; returns the exit
        code: a run with no passed check fails too."""
        print(f"{self.passed} passed, {self.failed} failed")
        return 1 if self.failed or not self.passed else 0


def run_checks(name, body, require=require_root_and_bpftrace, attempts=1):
    """The end of a test script's main(): `require()` says whether the test
    can run here (None; or an exit code, 77 to skip; or raises Failure),
    then body(checker) runs. A Failure it raises is one failed check. A run
    in which bpftrace lost its own stack map (StacksLost) says nothing about
    ddheap: it is run again, at most `attempts` times in all, and said so.
    Returns the exit code."""
    if require is not None:
        try:
            skip = require()
        except Failure as e:
            print(f"FAIL - {name}: {e}\n0 passed, 1 failed")
            return 1
        if skip is not None:
            return skip
    for attempt in range(1, attempts + 1):
        c = Checker(name)
        try:
            body(c)
        except StacksLost as e:
            print(f"NOTE - {name}: attempt {attempt} of {attempts}: {str(e).splitlines()[0]}")
            if attempt < attempts:
                continue
            c.check(False, str(e))
        except Failure as e:
            c.check(False, str(e))
        break
    return c.summary()


def run_prof_test(doc, tests, nargs, extra=False, absolute=(), programs=None):
    """The whole main() of a ddheap-prof test script (tests/prof/test_*.py),
    called as tests/prof/meson.build calls it:

        test_X.py TEST ARG... ARTIFACT_DIR [EXTRA...]

    TEST is a key of `tests`; exactly `nargs` arguments follow it, the last
    the folder for the test's artifacts (created); then, only if `extra`,
    any number more. A wrong command line prints `doc` and returns 2.

    Not root: one SKIP line, 77, the only skip (BPF needs root; CI runs
    the suite as root). Root but one of `programs` ({program: the Debian
    package scripts/install-deps installs it from}) missing: one failed
    check. Then tests[TEST](checker, ARG..., [EXTRA list]) runs under
    run_checks (a Failure it raises is one failed check); the ARGs at the
    0-based positions in `absolute` are made absolute paths first. Returns
    the exit code: 0 passed, 1 failed, 2 usage, 77 skipped."""
    argv = sys.argv
    count_ok = len(argv) >= nargs + 2 if extra else len(argv) == nargs + 2
    if not count_ok or argv[1] not in tests:
        print(doc)
        return 2
    name, args, more = argv[1], argv[2:nargs + 2], argv[nargs + 2:]
    args = [os.path.abspath(a) if i in absolute else a for i, a in enumerate(args)]
    if extra:
        args.append(more)

    def require():
        if os.geteuid() != 0:
            print("SKIP: ddheap-prof loads BPF programs and needs root "
                  "(CI runs this suite as root; run `sudo meson test --suite prof`)")
            return 77
        for program, package in (programs or {}).items():
            need(program, package)
        os.makedirs(args[nargs - 1], exist_ok=True)
        return None
    return run_checks(name, lambda c: tests[name](c, *args), require=require)


# The call sites of examples/workload.c, in its own order.
SITES = ["site_request_buffers", "site_grow_log", "site_cache_pages", "site_aligned_tiles",
         "site_session_objects", "site_index_nodes"]


def sigma(truth_sizes, site, field, interval):
    """Standard deviation of a site's summed weights (docs/design.md, "Sampling"): a block of
    S bytes is sampled with p = 1 - e^(-S/R) and then weighs S/p, so its
    weight has variance S^2 (1-p)/p; blocks are independent."""
    var = 0.0
    for (s, size), v in truth_sizes.items():
        if s == site and v[field]:
            p = -math.expm1(-size / interval)
            var += v[field] * size * size * (1 - p) / p
    return math.sqrt(var)

#!/usr/bin/env python3
"""CPython's own regression tests (Debian's libpython3.11-testsuite) run by
Debian's /usr/bin/python3 bare and under ddheap, module by module: every
module must end as it ends bare (docs/interpose.md, "What the program
sees"). A profiled program prints exactly what it prints without ddheap,
and so do the processes it starts: many of these modules compare a
child's stderr with what they expect.

    test_cpython.py DDHEAP_RUN DDHEAP_PROF

Configurations, each module in a process of its own:
  bare      /usr/bin/python3 -m test MODULE
  run       under ddheap-run, at the defaults (no tracer: nothing sampled)
  interval1 under ddheap-run, DD_HEAP_SAMPLING_INTERVAL=1 and no rate
            limit (DD_HEAP_SAMPLES_PER_SECOND=0): every block through the
            sampler's slow path once a tracer attaches, and without one
  prof      ddheap-prof -- ddheap-run ...: a tracer attached to every
            process of the module (root; fails, never skips, without)

Every run starts with every signal at its default action and none blocked
(a CI runner may start processes with some ignored, which CPython's tests
notice), stdin from /dev/null, in a temporary directory removed at the
end. Two runs at a time, longest first. A module that fails is
run again once by regrtest itself (-w), in every configuration alike, so a
test that is flaky on a loaded machine does not fail the comparison; what
ddheap breaks fails both times. Prints each module's time per
configuration.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"  # Debian's, whatever python3 is first on PATH
# Modules that compare what a child process prints with what they expect:
# each failed when the library wrote a line on every process's stderr.
# Longest first. Measured on 2 cores shared with other work (load ~7;
# seconds, bare / run / interval1 / prof): subprocess 36/37/49/49,
# threading 14/14/17/49, json 5/4/7/21, gc 2/3/2/13, sys 2/3/4/40 (the
# prof column pays ddheap-prof's cost for every process a module starts).
# Left out for time: test_faulthandler (20 s bare, 64 s under ddheap-prof),
# test_tracemalloc (1 s bare, 21 s under ddheap-prof), test_fork1,
# test_os, test_signal (48 s bare).
MODULES = ["test_subprocess", "test_threading", "test_json", "test_gc", "test_sys"]
CONFIGS = ["bare", "run", "interval1", "prof"]
PARALLEL = 2
MODULE_TIMEOUT = 600  # seconds, one module in one configuration
RESULT = re.compile(r"^Tests result: (.+)$", re.M)
CLEARED = ("LD_PRELOAD", "DD_HEAP_SAMPLING_ENABLED", "DD_HEAP_SAMPLING_INTERVAL",
           "DD_HEAP_SAMPLES_PER_SECOND", "PYTHONPATH", "PYTHONHOME",
           "PYTHONSTARTUP", "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONMALLOC")


def default_signals():
    """Every signal at its default action and none blocked, in this process
    and so in every process it starts (handlers are reset by exec; ignored
    signals and the mask are inherited)."""
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # signals the C library reserves for itself (NPTL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


class Run:
    def __init__(self, module, config, work, ddheap_run, ddheap_prof):
        self.module, self.config = module, config
        self.dir = os.path.join(work, f"{config}-{module}")
        os.mkdir(self.dir)
        test = [PYTHON, "-m", "test", "-w", "--timeout", str(MODULE_TIMEOUT - 60), module]
        env = {k: v for k, v in os.environ.items() if k not in CLEARED}
        env["TMPDIR"] = self.dir
        if config == "bare":
            self.cmd = test
        elif config == "run":
            self.cmd = [ddheap_run] + test
        elif config == "interval1":
            self.cmd = [ddheap_run] + test
            env.update(DD_HEAP_SAMPLING_INTERVAL="1", DD_HEAP_SAMPLES_PER_SECOND="0")
        else:
            self.cmd = [ddheap_prof, "-o", os.path.join(self.dir, "profile.pb.gz"), "--",
                        ddheap_run] + test
        self.out = open(os.path.join(self.dir, "output"), "w+")
        self.start = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=self.dir, env=env, stdin=subprocess.DEVNULL,
                                     stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.seconds = None
        self.result = None

    def poll(self):
        if self.proc.poll() is None:
            if time.monotonic() - self.start < MODULE_TIMEOUT:
                return False
            self.kill()
            self.proc.wait()
            self.result = "TIMEOUT (killed by test_cpython.py)"
        self.seconds = time.monotonic() - self.start
        self.out.seek(0)
        self.text = self.out.read()
        self.out.close()
        if self.result is None:
            found = RESULT.findall(self.text)
            # regrtest's own words; a module failed, then passed when run
            # again (-w), ends "FAILURE then SUCCESS": flaky, not broken.
            self.result = found[-1].split(" then ")[-1] if found else \
                f"no result (exit status {self.proc.returncode})"
        return True

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_all(ddheap_run, ddheap_prof, work):
    # Longest first, so the two slots end together: the modules in their
    # order, each under ddheap-prof (the dearest) first.
    jobs = [(m, c) for m in MODULES for c in reversed(CONFIGS)]
    running, done = [], []
    try:
        while jobs or running:
            while jobs and len(running) < PARALLEL:
                running.append(Run(*jobs.pop(0), work, ddheap_run, ddheap_prof))
            time.sleep(0.1)
            still = []
            for r in running:
                (done if r.poll() else still).append(r)
            running = still
    finally:
        for r in running:
            r.kill()
            r.proc.wait()
    return done


def main():
    ddheap_run, ddheap_prof = (os.path.abspath(a) for a in sys.argv[1:3])
    default_signals()
    if os.geteuid() != 0:
        print("FAIL - cpython: ddheap-prof needs root (CI runs this suite as root)\n"
              "0 passed, 1 failed")
        return 1
    if subprocess.run([PYTHON, "-c", "import test.test_json"], stdin=subprocess.DEVNULL,
                      capture_output=True).returncode != 0:
        print("FAIL - cpython: CPython's tests are missing: scripts/install-deps installs "
              "libpython3.11-testsuite\n0 passed, 1 failed")
        return 1
    # Killed (meson's timeout): the runs go too, and their directory.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: sys.exit(128 + s))
    work = tempfile.mkdtemp(prefix="ddheap-cpython-")
    wall = time.monotonic()
    try:
        done = run_all(ddheap_run, ddheap_prof, work)
        wall = time.monotonic() - wall
        by = {(r.module, r.config): r for r in done}
        passed = failed = 0
        print(f"{'module':20}" + "".join(f"{c:>12}" for c in CONFIGS) + "   (seconds)")
        for m in MODULES:
            print(f"{m:20}" + "".join(f"{by[m, c].seconds:12.1f}" for c in CONFIGS))
        print(f"{'total':20}" + "".join(f"{sum(by[m, c].seconds for m in MODULES):12.1f}"
                                        for c in CONFIGS) + f"   wall {wall:.1f}")
        for m in MODULES:
            bare = by[m, "bare"]
            for c in CONFIGS[1:]:
                r = by[m, c]
                ok = r.result == bare.result
                print(f"{'ok' if ok else 'FAIL'} - cpython: {m} {c}: {r.result} "
                      f"(bare: {bare.result})")
                if ok:
                    passed += 1
                    continue
                failed += 1
                print("    " + " ".join(r.cmd))
                print("    " + "\n    ".join(r.text.splitlines()[-40:]))
        print(f"{passed} passed, {failed} failed")
        return 1 if failed or not passed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

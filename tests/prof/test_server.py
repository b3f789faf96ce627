#!/usr/bin/env python3
"""ddheap-prof and servers made of many short processes: a prefork
program (prefork_main.c, built here with plain `cc -O2`) and Debian's
PostgreSQL driven by `pgbench -C` (a new backend per transaction), each
under `ulimit -n 256`, through the preload library.

What must hold: a process's blocks leave the live heap when it exits (the
end holds only processes alive then, the peak is bounded by what was
alive at once), every object is read once whoever maps it (frames named,
descriptors bounded), and the estimates stay within 5 sigma of the truth.
ddheap-prof's CPU time per process and its most open descriptors are
printed (not checked: no timing thresholds in tests).

    test_server.py TEST DDHEAP_PROF DDHEAP_RUN ARTIFACT_DIR

TEST is one of the keys of TESTS. Needs root (BPF); exits 77 (skipped)
only when not root; fails when cc, go or PostgreSQL is missing. Ends with
"N passed, N failed".
"""

import glob
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from harness import Failure, free_port, need, run_prof_test, sigma
from pprof_read import read_raw

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120
NOFILE = 256
MIB = 1048576.0


class Profiler:
    """ddheap-prof ARGS, started under RLIMIT_NOFILE = NOFILE, with its most
    open descriptors sampled every 20 ms, and its own resource usage from
    wait4 (its reaped children's included)."""

    def __init__(self, prof, args, env=None):
        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
        self.err_path = tempfile.mktemp(prefix="ddheap-prof-err-")
        self.err = open(self.err_path, "w+")
        self.proc = subprocess.Popen([prof] + args, stdout=subprocess.DEVNULL, stderr=self.err,
                                     preexec_fn=limit, env={**os.environ, **(env or {})})
        self.max_fds = 0
        self.rusage = None
        self.status = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._done.is_set():
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.status, self.rusage = status, ru
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                break
            try:
                self.max_fds = max(self.max_fds, len(os.listdir(f"/proc/{self.proc.pid}/fd")))
            except OSError:
                pass
            time.sleep(0.02)
        self._done.set()

    def interrupt(self):
        self.proc.send_signal(signal.SIGINT)

    def wait(self, timeout=TIMEOUT):
        if not self._done.wait(timeout):
            self.kill()
            raise Failure(f"ddheap-prof did not end within {timeout} s")
        self.err.seek(0)
        text = self.err.read()
        self.err.close()
        os.unlink(self.err_path)
        print("--- ddheap-prof's stderr (its last lines)\n" + "\n".join(text.splitlines()[-12:]))
        return self.proc.returncode, text

    def kill(self):
        if not self._done.is_set():
            self.proc.kill()
            self._done.wait(10)
        if not self.err.closed:
            self.err.close()
            os.unlink(self.err_path)

    def cpu_so_far(self):
        """Its own CPU time until now (/proc/PID/stat), children excluded."""
        try:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def cpu(self):
        ru = self.rusage
        return ru.ru_utime + ru.ru_stime if ru else float("nan")


_read = {}


def samples(pb, sample_type):
    """[(value, pid, [function names, innermost first])] of the profile
    (`go tool pprof -raw` run once per file: a long one takes seconds)."""
    if pb not in _read:
        raw = read_raw(pb)
        _read[pb] = (raw["types"], [
            (values, int(labels.get("pid", -1)), [f for i in ids for f in raw["locs"][i]["functions"]])
            for (values, ids), labels in zip(raw["samples"], raw["labels"])])
    types, rows = _read[pb]
    k = types.index(sample_type)
    return [(values[k], pid, names) for values, pid, names in rows]


def by_pid(sts):
    sums = {}
    for v, pid, _ in sts:
        if v:
            sums[pid] = sums.get(pid, 0) + v
    return sums


def share(sts, pred):
    total = sum(v for v, _, _ in sts)
    return sum(v for v, _, n in sts if pred(n)) / total if total else 0.0


def named(name):
    return "+0x" not in name and name != "[unknown]"


def own_cpu_line(err):
    m = re.search(r"^ddheap-prof: (\d+) processes .*own CPU ([\d.]+) s, ([\d.]+) ms per process",
                  err, re.M)
    return (int(m.group(1)), float(m.group(2)), float(m.group(3))) if m else None


def check_common(c, what, rc, err, prof):
    """What every run must say and not say."""
    c.equal(rc, 0, f"{what}: ddheap-prof's exit status")
    c.check("LOST" not in err, f"{what}: no event lost")
    unread = [l for l in err.splitlines() if l.startswith("ddheap-prof: could not read")]
    c.check(not unread, f"{what}: every object read (no 'could not read' line): {unread[:3]}")
    c.check(prof.max_fds < NOFILE,
            f"{what}: ddheap-prof's open descriptors at most {prof.max_fds} (< ulimit -n {NOFILE})")
    cost = own_cpu_line(err)
    c.check(cost is not None, f"{what}: stderr says ddheap-prof's own CPU per process ({cost})")
    return cost


INTERVAL = 65536
WORKERS, AT_ONCE = 400, 4


def read_truth(path):
    sizes, totals, facts = {}, {}, {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                site, size, count = parts[0], int(parts[1]), int(parts[2])
                sizes[(site, size)] = {"alloc_count": count}
                totals[site] = size * count
            else:
                facts[parts[0]] = int(parts[1])
    return sizes, totals, facts


def test_prefork(c, prof, run, artifacts):
    """400 workers, 4 at a time, each keeping 2 MiB (worker_keep) until it
    exits; the parent keeps 1 MiB (parent_keep) to its end. worker_keep's
    bytes over all workers within 5 sigma of the truth (sigma as for
    independent workers: until each child draws its own countdown at fork,
    the workers sample in lockstep and this check fails more often than
    5 sigma allows), each worker's within 5 sigma of 2 MiB; at the end only
    the parent's blocks are live; the peak at most the true peak (the
    parent and the most workers alive at once) + 5 sigma, with no more
    processes than that; >= 99 % of the bytes under a named site, its
    caller and main, every frame named."""
    exe = os.path.join(artifacts, "prefork")
    r = subprocess.run([need("cc"), "-O2", "-o", exe, os.path.join(HERE, "prefork_main.c")],
                       capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        raise Failure(f"cc -O2 prefork_main.c failed:\n{r.stderr}")
    pb, peak, report, truth_path = (os.path.join(artifacts, f"prefork{x}") for x in
                                    (".pb.gz", "-peak.pb.gz", "-report.txt", ".truth"))
    p = Profiler(prof, ["-o", pb, "--peak", peak, "--report", report, "--stack-bytes", "8192",
                        "--ringbuf-kb", "65536", "--", run, exe, str(WORKERS), str(AT_ONCE),
                        truth_path], {"DD_HEAP_SAMPLING_INTERVAL": str(INTERVAL)})
    rc, err = p.wait()
    cost = check_common(c, "prefork", rc, err, p)
    sizes, totals, facts = read_truth(truth_path)

    sts = samples(pb, "alloc_space")
    workers = {pid: v for pid, v in by_pid([x for x in sts if "worker_keep" in x[2]]).items()}
    c.equal(len(workers), WORKERS, "worker_keep's samples come from each worker, by pid label")
    est = sum(workers.values())
    sd = sigma(sizes, "worker_keep", "alloc_count", INTERVAL)
    c.check(abs(est - totals["worker_keep"]) <= 5 * sd,
            f"worker_keep over all workers: estimated {est}, true {totals['worker_keep']}, "
            f"|diff| {abs(est - totals['worker_keep'])} <= 5 sigma = {5 * sd:.0f}")
    one = {("worker_keep", s): {"alloc_count": v["alloc_count"] // WORKERS}
           for (site, s), v in sizes.items() if site == "worker_keep"}
    sd1, true1 = sigma(one, "worker_keep", "alloc_count", INTERVAL), totals["worker_keep"] / WORKERS
    off = {pid: v for pid, v in workers.items() if abs(v - true1) > 5 * sd1}
    c.check(not off, f"each worker's worker_keep within 5 sigma ({5 * sd1:.0f}) of {true1:.0f}: "
                     f"{len(off)} not ({list(off.items())[:3]})")
    distinct = len(set(workers.values()))
    print(f"distinct worker estimates: {distinct} of {len(workers)} (1: lockstep sampling)")
    parent_sd = sigma(sizes, "parent_keep", "alloc_count", INTERVAL)

    end = samples(pb, "inuse_space")
    live = by_pid(end)
    parent = [pid for pid, v in by_pid([x for x in sts if "parent_keep" in x[2]]).items()]
    c.check(len(parent) == 1 and set(live) <= set(parent),
            f"the end: only the parent ({parent}) has live blocks: {live}")
    end_total = sum(live.values())
    c.check(abs(end_total - totals["parent_keep"]) <= 5 * parent_sd,
            f"the end: {end_total} live, the parent's {totals['parent_keep']} within 5 sigma "
            f"({5 * parent_sd:.0f})")

    at_peak = by_pid(samples(peak, "inuse_space"))
    true_peak = totals["parent_keep"] + facts["alive"] * true1
    peak_sd = math.sqrt(parent_sd ** 2 + facts["alive"] * sd1 ** 2)
    got = sum(at_peak.values())
    c.check(got <= true_peak + 5 * peak_sd,
            f"the peak: {got / MIB:.1f} MiB <= the true peak {true_peak / MIB:.1f} MiB "
            f"+ 5 sigma ({5 * peak_sd / MIB:.1f} MiB)")
    c.check(len(at_peak) <= facts["alive"] + 1,
            f"the peak holds {len(at_peak)} processes, at most the {facts['alive']} workers "
            f"alive at once and the parent")

    sites = share(sts, lambda n: bool(n) and n[0] in ("worker_keep", "parent_keep") and
                  "main" in n)
    c.check(sites >= 0.99, f"a named site on top, with main below: {sites:.4f} of alloc_space "
                           f"(>= 0.99)")
    every = share(sts, lambda n: all(named(x) or x == "[truncated]" for x in n))
    c.check(every >= 0.99, f"every frame named: {every:.4f} of alloc_space (>= 0.99)")
    with open(report) as f:
        m = re.search(r"^EXITED PROCESSES: (\d+) exited", f.read(), re.M)
    c.check(m and int(m.group(1)) >= WORKERS,
            f"--report lists the processes that exited ({m and m.group(1)}: the {WORKERS} "
            f"workers, and ddheap-run's)")

    own = p.cpu() - facts["cpu_us"] / 1e6
    print(f"RESULT prefork: peak {got / MIB:.1f} MiB (true {true_peak / MIB:.1f}), end "
          f"{end_total / MIB:.2f} MiB, named {every:.4f}, ddheap-prof CPU {own:.3f} s by wait4 "
          f"minus the program's = {1e3 * own / (cost[0] if cost else 1):.2f} ms per process (its own "
          f"getrusage: {cost}), most descriptors {p.max_fds}")


PGBENCH_SECONDS = 15
CLIENTS = 4


def postgres_bin():
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not dirs or not os.path.exists(os.path.join(dirs[-1], "postgres")):
        raise Failure("PostgreSQL is not installed (scripts/install-deps installs postgresql)")
    return dirs[-1]


class Cluster:
    """A PostgreSQL cluster in a temporary directory, owned by the user
    postgres, listening on 127.0.0.1:PORT and a socket in that directory;
    stopped and removed by close() whatever happened (and on SIGTERM,
    which meson sends at a timeout)."""

    def __init__(self):
        self.bin = postgres_bin()
        self.dir = tempfile.mkdtemp(prefix="ddheap-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.pids = []  # postmasters started, stopped at close
        shutil.chown(self.dir, "postgres", "postgres")
        self.as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups",
                            "--"]
        r = subprocess.run(self.as_postgres + [os.path.join(self.bin, "initdb"), "-D", self.data,
                                               "-A", "trust", "-U", "postgres", "--no-sync",
                                               "-E", "UTF8", "--locale=C"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        if r.returncode != 0:
            raise Failure(f"initdb failed:\n{r.stderr}")

    def server_command(self):
        return [os.path.join(self.bin, "postgres"), "-D", self.data, "-k", self.dir,
                "-p", str(self.port), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                "-c", "autovacuum=off"]

    def client(self, program, *args, timeout=TIMEOUT):
        return subprocess.run([os.path.join(self.bin, program), "-h", self.dir, "-p",
                               str(self.port), "-U", "postgres", *args],
                              capture_output=True, text=True, timeout=timeout)

    def wait_ready(self, postmaster=None):
        deadline = time.monotonic() + 60
        while self.client("pg_isready", "-d", "postgres").returncode != 0:
            if postmaster is not None and postmaster.poll() is not None:
                raise Failure("the server ended before accepting connections")
            if time.monotonic() > deadline:
                raise Failure("the server did not accept connections within 60 s")
            time.sleep(0.1)
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            pid = int(f.readline())
        self.pids.append(pid)
        return pid

    def processes(self, postmaster):
        """The postmaster and its children now."""
        r = subprocess.run(["ps", "-o", "pid=", "--ppid", str(postmaster)], capture_output=True,
                           text=True)
        return {postmaster} | {int(x) for x in r.stdout.split()}

    @staticmethod
    def gone(pid):
        """Exited (a zombie included: its parent may be slow to reap it)."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] == "Z"
        except OSError:
            return True

    def stop(self, pid):
        """Fast shutdown; SIGQUIT, then SIGKILL, if it lingers."""
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGQUIT, 10), (signal.SIGKILL, 10)):
            if self.gone(pid):
                return
            os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and not self.gone(pid):
                time.sleep(0.05)

    def close(self):
        for pid in self.pids:
            self.stop(pid)
        shutil.rmtree(self.dir, ignore_errors=True)


T0 = time.monotonic()


def step(what):
    print(f"[{time.monotonic() - T0:6.2f} s] {what}")


def terminated(*_):
    raise Failure("terminated (meson's timeout?): cleaning up")


def test_pgbench(c, prof, run, artifacts):
    """A cluster of the user postgres, its tables made by pgbench -i before
    profiling, then the server started under ddheap-prof (as postgres,
    through setpriv and ddheap-run: the profiler follows the exec chain)
    and driven for 15 s by pgbench -C (4 clients, a new backend per
    transaction); the run ended with SIGINT while the server lives. The
    end profile holds only processes alive then; the peak holds at most
    the server's own processes and twice the clients' backends (one may
    still be exiting as the next starts), and its bytes at most what the
    live ones hold at the end plus that many backends of the largest size
    seen at an exit, + 5 sigma; >= 99 % of the bytes in stacks unwound to
    main, no object unread; thousands of exits listed by --report."""
    need("setpriv")
    step("initdb")
    pg = Cluster()
    step("initdb done")
    prof_run = None
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        pb, peak, report = (os.path.join(artifacts, f"pgbench{x}") for x in
                            (".pb.gz", "-peak.pb.gz", "-report.txt"))
        # pgbench -i on a server of its own first: the profile is of -C only.
        plain = subprocess.Popen(pg.as_postgres + pg.server_command(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        pg.wait_ready(plain)
        step("pgbench -i")
        r_init = pg.client("pgbench", "-i", "-s", "1", "-q", "postgres")
        step("stop")
        pg.stop(pg.pids.pop())
        plain.wait(30)
        step("stopped")
        if r_init.returncode != 0:
            raise Failure(f"pgbench -i failed:\n{r_init.stderr}")

        prof_run = Profiler(prof, ["-o", pb, "--peak", peak, "--report", report, "--"] +
                            pg.as_postgres + [run] + pg.server_command())
        postmaster = pg.wait_ready(prof_run.proc)
        step("pgbench -C")
        r = pg.client("pgbench", "-C", "-S", "-c", str(CLIENTS), "-j", "2", "-T",
                      str(PGBENCH_SECONDS), "postgres", timeout=PGBENCH_SECONDS + 60)
        c.equal(r.returncode, 0, f"pgbench -C ran ({r.stderr.strip()[-300:]})")
        m = re.search(r"number of transactions actually processed: (\d+)", r.stdout)
        transactions = int(m.group(1)) if m else 0
        alive = pg.processes(postmaster)
        cpu_running = prof_run.cpu_so_far()
        step("SIGINT")
        prof_run.interrupt()
        rc, err = prof_run.wait()
        step("ddheap-prof ended")
    finally:
        signal.signal(signal.SIGTERM, previous)
        if prof_run is not None:
            prof_run.kill()
        pg.close()
        step("closed")
    c.check(not os.path.exists(pg.dir), "the cluster is stopped and its directory removed")
    cost = check_common(c, "pgbench -C", rc, err, prof_run)
    c.check(transactions > 100, f"pgbench -C made {transactions} connections (> 100)")

    live = by_pid(samples(pb, "inuse_space"))
    # (At the default interval the server's own processes hold a few
    # samples at most: none at all is possible, and not a failure.)
    dead = sorted(set(live) - alive)
    c.check(not dead,
            f"the end: every process with live blocks ({len(live)}) was alive at the end "
            f"({sorted(alive)}); not: {len(dead)} {dead[:10]}")
    end_total = sum(live.values())
    with open(report) as f:
        text = f.read()
    m = re.search(r"^EXITED PROCESSES: (\d+) exited", text, re.M)
    exited = int(m.group(1)) if m else 0
    c.check(exited >= transactions,
            f"--report: {exited} processes exited (>= the {transactions} connections)")
    m = re.search(r"^pid \d+ \(.*\): ([\d.]+) (B|KiB|MiB) in \d+ sampled blocks at exit$", text,
                  re.M)
    largest = float(m.group(1)) * {"B": 1, "KiB": 1024, "MiB": MIB}[m.group(2)] if m else 0
    at_peak = by_pid(samples(peak, "inuse_space"))
    most = len(alive) + 2 * CLIENTS
    c.check(len(at_peak) <= most,
            f"the peak holds {len(at_peak)} processes, at most the {len(alive)} of the server "
            f"and twice the {CLIENTS} clients' backends ({most})")
    bound = end_total + 2 * CLIENTS * largest
    sd = math.sqrt(512 * 1024 * bound)  # sum of S over blocks <= bound: Var <= R * bound
    got = sum(at_peak.values())
    c.check(got <= bound + 5 * sd,
            f"the peak: {got / MIB:.1f} MiB <= the end's {end_total / MIB:.1f} MiB + "
            f"{2 * CLIENTS} backends of the largest seen at an exit ({largest / MIB:.1f} MiB) "
            f"+ 5 sigma ({5 * sd / MIB:.1f} MiB)")

    sts = samples(pb, "alloc_space")
    to_main = share(sts, lambda n: "main" in n)
    top = share(sts, lambda n: bool(n) and named(n[0]))
    c.check(to_main >= 0.99, f"stacks unwound to main: {to_main:.4f} of alloc_space (>= 0.99)")
    print(f"RESULT pgbench -C: {transactions} connections, {exited} exits; peak {got / MIB:.1f} "
          f"MiB, end {end_total / MIB:.2f} MiB; to main {to_main:.4f}, innermost frame named "
          f"{top:.4f} (postgres's static functions have no symbol in Debian's binary); "
          f"ddheap-prof CPU {prof_run.cpu():.3f} s by wait4 = "
          f"{1e3 * prof_run.cpu() / max(1, cost[0] if cost else 1):.2f} ms per process (its own "
          f"getrusage: {cost}; {cpu_running:.3f} s of it before the end's outputs), most "
          f"descriptors {prof_run.max_fds}")


TESTS = {"prefork": test_prefork, "pgbench": test_pgbench}


if __name__ == "__main__":
    sys.exit(run_prof_test(__doc__, TESTS, 3))

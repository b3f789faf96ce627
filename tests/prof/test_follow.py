#!/usr/bin/env python3
"""ddheap-prof and processes: following forks and execs (each sample
labelled with its pid), passing the command's exit status on, leaving the
command's signals alone, attaching to a process in its own mount
namespace and to a library deleted after loading, and failing cleanly
(no empty or partial output files).

    test_follow.py TEST DDHEAP_PROF ARTIFACT_DIR [EXTRA...]

TEST is one of the keys of TESTS. Needs root (BPF); exits 77 (skipped)
only when not root, and fails when go is missing. Ends with
"N passed, N failed".
"""

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

from harness import Failure, need, run_prof_test
from pprof_read import pprof as go_pprof

TIMEOUT = 120


def traces(profile, sample_index):
    """The profile's samples as `pprof -traces` prints them: a list of
    (labels {name: value}, value, frames innermost first)."""
    out = []
    for block in go_pprof(profile, "-traces", "-unit=byte",
                          f"-sample_index={sample_index}").split("-----------+")[1:]:
        labels, value, frames = {}, None, []
        for line in block.splitlines()[1:]:
            m = re.match(r"^\s+(\w+):\s+(\S+)$", line)
            if m and value is None:
                labels[m.group(1)] = m.group(2)
                continue
            m = re.match(r"^\s+(\d+)\S*\s+(\S+)", line)
            if m and value is None:
                value = int(m.group(1))
                frames.append(m.group(2))
            elif line.strip():
                frames.append(line.split()[0])
        if value is not None:
            out.append((labels, value, frames))
    return out


def per_pid(samples):
    """{pid: total value} over the samples."""
    sums = {}
    for labels, value, _ in samples:
        pid = int(labels.get("pid", -1))
        sums[pid] = sums.get(pid, 0) + value
    return sums


def parent_pid(truth):
    """The pid of the forker's parent process in its output's truth."""
    return next((pid for pid, (site, _, _) in truth.items() if site == "site_parent"), None)


def kill_running(*procs):
    """Kills and reaps those of the processes (None allowed) still running."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def run(prof, args, env=None, **kw):
    return subprocess.run([prof] + args, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, **(env or {})}, **kw)


def test_follow(c, prof, artifacts, extra):
    """A parent, a forked child and an exec'd child, at R = 1: every
    process's allocations are in the profile, exactly, under its own pid
    label; the parent's exit status 3 is ddheap-prof's, with the program
    named. The peak (the three hold their blocks at once before the
    children exit) is that of the three together, each under its pid; at
    the end the children have exited and only the parent's blocks are
    live; the report names each site's pid and what each child held at
    its exit. --no-follow keeps the parent only."""
    (forker,) = extra
    pb = os.path.join(artifacts, "follow.pb.gz")
    peak = os.path.join(artifacts, "follow-peak.pb.gz")
    report = os.path.join(artifacts, "follow-report.txt")
    count = 40
    r = run(prof, ["-o", pb, "--peak", peak, "--report", report, "--", forker, str(count), "3"],
            {"DD_HEAP_SAMPLING_INTERVAL": "1"})
    c.equal(r.returncode, 3, f"ddheap-prof passes the command's exit status on ({r.stderr.strip()[-300:]})")
    c.check(re.search(r"prof-forker \(pid \d+\) exited with status 3", r.stderr) is not None,
            "stderr names the program and its status")
    truth = {}  # pid -> (site, bytes, count)
    for line in r.stdout.splitlines():
        m = re.match(r"pid (\d+) site (\S+) alloc_bytes (\d+) alloc_count (\d+)", line)
        if m:
            truth[int(m.group(1))] = (m.group(2), int(m.group(3)), int(m.group(4)))
    c.equal(sorted(s for s, _, _ in truth.values()),
            ["site_exec_child", "site_forked_child", "site_parent"],
            f"the workload ran its three processes ({r.stdout.strip()})")
    space = per_pid(traces(pb, "alloc_space"))
    objects = per_pid(traces(pb, "alloc_objects"))
    for pid, (site, nbytes, n) in truth.items():
        c.equal((space.get(pid, 0), objects.get(pid, 0)), (nbytes, n),
                f"{site}: alloc_space and alloc_objects under pid label {pid}")
    c.check(set(space) == set(truth), f"only those pids carry samples: {sorted(space)}")
    # Each sample names its process's command: comm and the executable's
    # path (the exec'd child runs the same file, as /proc/self/exe).
    forker_real = os.path.realpath(forker)
    commands = {int(labels.get("pid", -1)): (labels.get("comm"), labels.get("exe"))
                for labels, _, _ in traces(pb, "alloc_space")}
    for pid, (site, _, _) in truth.items():
        comm, exe = commands.get(pid, (None, None))
        c.equal(exe, forker_real, f"{site}: label exe")
        c.check(comm in ("prof-forker", "exe"), f"{site}: label comm is the kernel's ({comm})")
    c.equal(commands.get(parent_pid(truth), (None,))[0], "prof-forker",
            "the parent's comm is its program's name")
    c.check(re.search(r"sampled allocations by command: .*prof-forker \d+", r.stderr) is not None,
            f"stderr names the commands ({r.stderr.strip()[-300:]!r})")
    c.equal(per_pid(traces(peak, "inuse_space")), {pid: b for pid, (_, b, _) in truth.items()},
            "--peak: the peak of all the processes together, each under its pid label")
    c.equal({pid: v for pid, v in per_pid(traces(pb, "inuse_space")).items() if v},
            {pid: b for pid, (site, b, _) in truth.items() if site == "site_parent"},
            "the end: the exited children's blocks are not live, the parent's are")
    with open(report) as f:
        text = f.read()
    c.check(f"processes: {len(truth)}" in text and
            all(f"[pid {pid} {commands.get(pid, ('?',))[0]}]" in text for pid in truth),
            f"--report: each site's process and command named ({sorted(truth)})")
    for pid, (site, nbytes, _) in truth.items():
        if site != "site_parent":
            c.check(re.search(rf"^pid {pid} \(.*\): .* at exit$", text, re.M) is not None,
                    f"--report: what {site} (pid {pid}) held at its exit is listed")
    # The parent's objects are read at its loader stop, and a forked child
    # has its parent's: their frames are named. (An exec'd grandchild that
    # lives a millisecond may end before its mappings are read.)
    named = {int(labels["pid"]) for labels, _, frames in traces(pb, "alloc_objects")
             for f in frames if f.startswith("site_")}
    for pid, (site, _, _) in truth.items():
        if site != "site_exec_child":
            c.check(pid in named, f"{site}'s frames are named")

    pb1 = os.path.join(artifacts, "no-follow.pb.gz")
    r = run(prof, ["--no-follow", "-o", pb1, "--", forker, str(count), "0"],
            {"DD_HEAP_SAMPLING_INTERVAL": "1"})
    c.equal(r.returncode, 0, "--no-follow: exit status")
    parent = [int(m.group(1)) for m in re.finditer(r"pid (\d+) site site_parent", r.stdout)]
    c.equal(sorted(per_pid(traces(pb1, "alloc_space"))), parent,
            "--no-follow: the command's own pid only")


def test_pid_follow(c, prof, artifacts, extra):
    """-p PID -f: a running process, and the processes it forks from then
    on, each under its pid; without -f, the process alone."""
    (forker,) = extra
    for follow in (True, False):
        what = "-p -f" if follow else "-p"
        pb = os.path.join(artifacts, "pid-follow.pb.gz" if follow else "pid-alone.pb.gz")
        err = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-follow-")
        w = subprocess.Popen([forker, "30", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PROF_FORKER_WAIT": "1",
                                             "DD_HEAP_SAMPLING_INTERVAL": "1"})
        p = None
        try:
            if w.stdout.readline().strip() != "forker: ready":
                raise Failure("prof-forker did not start")
            p = subprocess.Popen([prof, "-p", str(w.pid), "-o", pb] + (["-f"] if follow else []),
                                 stderr=err, text=True)
            wait_for_text(err.name, "profiling pid", p)
            w.stdin.write("go\n")
            w.stdin.flush()
            out = w.stdout.read()
            c.equal(w.wait(timeout=TIMEOUT), 0, f"{what}: the program's exit status")
            c.equal(p.wait(timeout=TIMEOUT), 0, f"{what}: ddheap-prof's exit status")
        finally:
            kill_running(w, p)
        truth = {int(m.group(1)): int(m.group(2)) for m in re.finditer(
            r"pid (\d+) site \S+ alloc_bytes (\d+)", out)}
        want = truth if follow else {w.pid: truth.get(w.pid)}
        c.equal(per_pid(traces(pb, "alloc_space")), want,
                f"{what}: alloc_space per pid label")


def test_git(c, prof, artifacts, extra):
    """`ddheap-prof -f -- ddheap-run git gc` on a small repository: git gc
    does its work in children (pack-objects, repack, ...), which carry the
    preload library too; their samples are in the profile under their own
    pid labels. A failing git's status is ddheap-prof's."""
    (ddheap_run,) = extra
    need("git")
    repo = tempfile.mkdtemp(prefix="ddheap-follow-git-")
    try:
        env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org",
               "GIT_CONFIG_NOSYSTEM": "1", "HOME": repo}
        git = lambda *a: subprocess.run(["git", "-C", repo, *a], check=True, capture_output=True,
                                        env={**os.environ, **env}, timeout=TIMEOUT)
        git("init", "-q")
        for i in range(30):
            with open(os.path.join(repo, f"f{i % 7}.txt"), "a") as f:
                f.write(f"line {i}\n" * 200)
            git("add", "-A")
            git("commit", "-q", "-m", f"c{i}")
        pb = os.path.join(artifacts, "git-gc.pb.gz")
        r = run(prof, ["-f", "-o", pb, "--", ddheap_run, "git", "-C", repo, "gc", "-q"],
                {**env, "DD_HEAP_SAMPLING_INTERVAL": "4096"})
        c.equal(r.returncode, 0, f"ddheap-prof -- git gc ({r.stderr.strip()[-400:]})")
        m = re.search(r"profiling pid (\d+)", r.stderr)
        top = int(m.group(1)) if m else None
        pids = per_pid(traces(pb, "alloc_space"))
        c.check(top in pids, f"git's own samples, pid {top}: {sorted(pids)}")
        children = sorted(p for p in pids if p != top and p > 0)
        c.check(len(children) >= 1, f"samples of git gc's children, each under its pid: {children}")
        c.check(-1 not in pids, "every sample has a pid label")

        r = run(prof, ["-o", os.path.join(artifacts, "git-fail.pb.gz"), "--", ddheap_run, "git",
                       "-C", repo, "no-such-command"], env)
        c.equal(r.returncode, 1, "a failing git's exit status is ddheap-prof's")
        c.check(re.search(r"git \(pid \d+\) exited with status 1", r.stderr) is not None,
                f"the program is named, not the wrapper: {r.stderr.strip()[-200:]}")
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def alarm_count(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                       env={**os.environ, "DD_HEAP_SAMPLING_INTERVAL": "64"})
    m = re.search(r"alarm: signals (\d+) blocks (\d+)", r.stdout)
    if r.returncode != 0 or not m:
        raise Failure(f"{cmd} failed ({r.returncode}): {r.stdout} {r.stderr}")
    return int(m.group(1)), r.stderr


def test_signals(c, prof, artifacts, extra):
    """A program taking a SIGALRM every millisecond for 2 s (setitimer),
    sampling every block: under ddheap-prof it gets about as many as
    without (within 20 %): nothing holds its signals. The machine is
    shared (a run loaded by others' builds got 8 % fewer), so a pair of
    runs out of range is tried again, up to three pairs; a profiler that
    holds signals loses most of them in every pair."""
    (alarm,) = extra
    pb = os.path.join(artifacts, "signals.pb.gz")
    for attempt in range(3):
        bare, _ = alarm_count([alarm, "2"])
        traced, err = alarm_count([prof, "-o", pb, "--", alarm, "2"])
        close = abs(traced - bare) <= 0.20 * bare
        print(f"# attempt {attempt + 1}: {bare} signals bare, {traced} under ddheap-prof")
        if close:
            break
    c.check(close, f"signals under ddheap-prof {traced}, without {bare}: within 20 %")
    c.check("attached to" in err, "ddheap-prof attached to the program")
    c.check(sum(per_pid(traces(pb, "alloc_objects")).values()) > 0,
            "the profile has the program's samples")


def drive_dlopen(proc, wait_attached, lines):
    """prof-dlopen's protocol: ready, load, loaded, (attach), work, done."""
    def expect(prefix):
        line = proc.stdout.readline()
        lines.append(line.rstrip("\n"))
        if not line.startswith(prefix):
            raise Failure(f"wanted {prefix!r} from prof-dlopen, got {line!r}")
    expect("dlopen: ready")
    proc.stdin.write("load\n")
    proc.stdin.flush()
    expect("dlopen: loaded")
    wait_attached()
    proc.stdin.write("work\n")
    proc.stdin.flush()
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))


def wait_for_text(path, text, proc):
    deadline = time.monotonic() + TIMEOUT
    while True:
        with open(path) as f:
            err = f.read()
        if text in err:
            return err
        if proc.poll() is not None or time.monotonic() > deadline:
            raise Failure(f"ddheap-prof never printed {text!r}:\n{err}")
        time.sleep(0.02)


def check_plugin(c, pb, lines, library, what):
    """At R = 1 the plugin's site holds exactly its truth, named from the
    library's symbols, with the library (as the process names it) among
    the profile's mappings."""
    m = re.search(r"site site_plugin_blocks alloc_bytes (\d+) alloc_count (\d+)", "\n".join(lines))
    if not m:
        raise Failure(f"no truth from prof-dlopen: {lines}")
    samples = traces(pb, "alloc_space")
    got = sum(v for _, v, frames in samples if "site_plugin_blocks" in frames)
    c.equal(got, int(m.group(1)), f"{what}: site_plugin_blocks (named) alloc_space")
    mappings = go_pprof(pb, "-raw").split("\nMappings\n")[-1]
    c.check(library in mappings, f"{what}: {library} is a mapping of the profile")


def test_namespace(c, prof, artifacts, extra):
    """A command in its own mount namespace (`unshare -m`) loads a copy of
    the plugin from a tmpfs mounted there: the path exists only in that
    namespace, so it can be attached only through /proc/PID/map_files."""
    dlopen_main, plugin = extra
    where = tempfile.mkdtemp(prefix="ddheap-follow-ns-")
    library = os.path.join(where, "libprof-ns.so")
    pb = os.path.join(artifacts, "namespace.pb.gz")
    err = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-follow-")
    script = 'mount -t tmpfs tmpfs "$1" && cp "$2" "$3" && exec "$4" "$3" 50'
    p = subprocess.Popen([prof, "-o", pb, "--", "unshare", "-m", "sh", "-c", script, "sh", where,
                          plugin, library, dlopen_main], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=err, text=True,
                         env={**os.environ, "DD_HEAP_SAMPLING_INTERVAL": "1"})
    lines = []
    try:
        def attached():
            wait_for_text(err.name, "attached to " + library, p)
            c.check(not os.path.exists(library),
                    "the library's path does not exist outside the namespace")
        drive_dlopen(p, attached, lines)
        c.equal(p.wait(timeout=TIMEOUT), 0, "ddheap-prof's exit status")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(where, ignore_errors=True)
    check_plugin(c, pb, lines, library, "own mount namespace")


def test_deleted(c, prof, artifacts, extra):
    """A running process (-p) whose plugin was deleted after it was
    loaded: attached through /proc/PID/map_files, symbolised from the
    descriptor ddheap-prof keeps, named as the process's maps name it."""
    dlopen_main, plugin = extra
    where = tempfile.mkdtemp(prefix="ddheap-follow-del-")
    library = os.path.join(where, "libprof-deleted.so")
    shutil.copy(plugin, library)
    pb = os.path.join(artifacts, "deleted.pb.gz")
    err = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-follow-")
    w = subprocess.Popen([dlopen_main, library, "50"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "DD_HEAP_SAMPLING_INTERVAL": "1"})
    p = None
    lines = []
    try:
        def attach():
            nonlocal p
            os.unlink(library)
            p = subprocess.Popen([prof, "-p", str(w.pid), "-o", pb], stderr=err, text=True)
            wait_for_text(err.name, f"attached to {library} (deleted)", p)
        drive_dlopen(w, attach, lines)
        c.equal(w.wait(timeout=TIMEOUT), 0, "the program's exit status")
        c.equal(p.wait(timeout=TIMEOUT), 0, "ddheap-prof's exit status (it ends with the process)")
    finally:
        kill_running(w, p)
        shutil.rmtree(where, ignore_errors=True)
    check_plugin(c, pb, lines, library, "deleted library")


def test_outputs(c, prof, artifacts, extra):
    """Bad runs: a clear message, a non-zero status where something
    failed, and no output file (empty, partial or temporary) left."""
    (forker,) = extra

    def case(what, args, rc, message, outputs=("x.pb.gz",)):
        where = tempfile.mkdtemp(prefix="ddheap-follow-out-", dir=artifacts)
        try:
            paths = []
            for name, flag in zip(outputs, ("-o", "--svg", "--folded")):
                paths += [flag, name if name.startswith("/") else os.path.join(where, name)]
            r = run(prof, paths + args)
            c.check(r.returncode == rc and message in r.stderr,
                    f"{what}: exit {r.returncode} (want {rc}), stderr {r.stderr.strip()[-200:]!r}")
            c.equal(os.listdir(where), [], f"{what}: no file left")
        finally:
            shutil.rmtree(where, ignore_errors=True)

    case("no probes ever mapped", ["--no-preload", "--", "true"], 1,
         "never mapped an object with ddheap:alloc probes")
    case("no probes, the command failing", ["--no-preload", "--", "sh", "-c", "exit 3"], 3,
         "exited with status 3")
    case("the command killed by a signal", ["--no-preload", "--", "sh", "-c", "kill -TERM $$"], 128 + 15,
         "was killed by signal 15")
    case("a command that does not exist", ["--", "/nonexistent-program"], 127,
         "cannot run /nonexistent-program")
    not_executable = os.path.join(artifacts, "not-executable.txt")
    with open(not_executable, "w") as f:
        f.write("data\n")
    os.chmod(not_executable, 0o644)
    case("a command that is not executable", ["--", not_executable], 126,
         f"cannot run {not_executable}: Permission denied")
    case("an --svg that cannot be written", ["--", forker, "1", "0"], 1,
         "cannot write /nonexistent-dir/x.svg", ("x.pb.gz", "/nonexistent-dir/x.svg"))
    case("a --folded that is a directory", ["--", forker, "1", "0"], 1,
         f"cannot write {artifacts}", ("x.pb.gz", "x.svg", artifacts))
    # And a good run leaves exactly its outputs.
    where = tempfile.mkdtemp(prefix="ddheap-follow-out-", dir=artifacts)
    try:
        r = run(prof, ["-o", os.path.join(where, "x.pb.gz"), "--svg", os.path.join(where, "x.svg"),
                       "--", forker, "5", "0"], {"DD_HEAP_SAMPLING_INTERVAL": "1"})
        c.equal((r.returncode, sorted(os.listdir(where))), (0, ["x.pb.gz", "x.svg"]),
                "a good run: its outputs and nothing else")
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_output_targets(c, prof, artifacts, extra):
    """-o onto what is not a new regular file: a character device (made
    with mknod: /dev/null's numbers) and a FIFO are written through, never
    replaced; a symlink (and a dangling one) has its target written, in
    the target's directory, and stays a link; an immutable file is refused
    at the start with a non-zero exit, its name, no "wrote", and is left
    as it was. No temporary file is left anywhere."""
    (forker,) = extra
    where = tempfile.mkdtemp(prefix="ddheap-follow-targets-", dir=artifacts)
    other = os.path.join(where, "other")
    os.mkdir(other)
    immutable = os.path.join(where, "immutable.pb.gz")
    try:
        def profile(out):
            return run(prof, ["-o", out, "--", forker, "2", "0"],
                       {"DD_HEAP_SAMPLING_INTERVAL": "1"})

        def wrote(r, name):
            return r.returncode == 0 and f"ddheap-prof: wrote {name} (" in r.stderr

        device = os.path.join(where, "null")
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        r = profile(device)
        c.check(wrote(r, device), f"a character device: written ({r.stderr.strip()[-200:]!r})")
        c.check(stat.S_ISCHR(os.lstat(device).st_mode), "the device is still a device")

        fifo = os.path.join(where, "fifo")
        os.mkfifo(fifo)
        got = {}
        reader = threading.Thread(target=lambda: got.update(data=open(fifo, "rb").read()))
        reader.start()
        r = profile(fifo)
        if reader.is_alive():  # ddheap-prof failed before opening it: unblock the reader
            os.close(os.open(fifo, os.O_WRONLY))
        reader.join()
        copy = os.path.join(artifacts, "targets-fifo.pb.gz")
        with open(copy, "wb") as f:
            f.write(got.get("data", b""))
        c.check(wrote(r, fifo), f"a FIFO: written ({r.stderr.strip()[-200:]!r})")
        c.check(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO is still a FIFO")
        c.check(len(traces(copy, "alloc_space")) > 0, "what came through the FIFO is the profile")

        for name, dest in (("link", "kept.pb.gz"), ("dangling", "new.pb.gz")):
            link = os.path.join(where, name)
            target = os.path.join(other, dest)
            if name == "link":
                with open(target, "w") as f:
                    f.write("old\n")
            os.symlink(os.path.join("other", dest), link)
            r = profile(link)
            c.check(wrote(r, link), f"a {name} symlink: written ({r.stderr.strip()[-200:]!r})")
            c.check(os.path.islink(link) and os.readlink(link) == os.path.join("other", dest),
                    f"the {name} symlink is still the same link")
            c.check(os.path.isfile(target) and len(traces(target, "alloc_space")) > 0,
                    f"its target {dest} holds the profile")

        with open(immutable, "w") as f:
            f.write("old\n")
        chattr = subprocess.run(["chattr", "+i", immutable], capture_output=True, text=True)
        if chattr.returncode != 0:
            raise Failure(f"chattr +i failed: {chattr.stderr.strip()}")
        r = profile(immutable)
        c.check(r.returncode != 0 and f"cannot write {immutable}" in r.stderr and
                "wrote" not in r.stderr,
                f"an immutable file: refused, exit {r.returncode}, {r.stderr.strip()[-200:]!r}")
        with open(immutable) as f:
            c.equal(f.read(), "old\n", "the immutable file is as it was")
        c.equal(sorted(os.listdir(where)),
                ["dangling", "fifo", "immutable.pb.gz", "link", "null", "other"],
                "no temporary file left beside the outputs")
        c.equal(sorted(os.listdir(other)), ["kept.pb.gz", "new.pb.gz"],
                "no temporary file left beside the symlinks' targets")
    finally:
        if os.path.exists(immutable):
            subprocess.run(["chattr", "-i", immutable], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def alloc_semaphore_address(library):
    """The link-time address of the ddheap:alloc semaphore in the library
    (readelf -n: its stapsdt note)."""
    notes = subprocess.run(["readelf", "-n", library], capture_output=True, text=True,
                           check=True).stdout
    m = re.search(r"Provider: ddheap\s+Name: alloc\s+Location: \S+, Base: \S+, "
                  r"Semaphore: (0x[0-9a-f]+)", notes)
    if m is None:
        raise Failure(f"no ddheap:alloc semaphore in {library}")
    return int(m.group(1), 16)


def semaphore_of(pid, library, address):
    """The ddheap:alloc semaphore as the process holds it in its memory
    (/proc/PID/mem), None while it does not map the library's writable
    segment there (before the loader has mapped it, the address reads the
    file's bytes)."""
    real = os.path.realpath(library)
    base = None
    writable = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 6 or fields[5] != real:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if int(fields[2], 16) == 0 and base is None:
                base = start
            if "w" in fields[1]:
                writable.append((start, end))
    if base is None or not any(s <= base + address < e for s, e in writable):
        return None
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(base + address)
        return int.from_bytes(mem.read(2), "little")


def wait_for_semaphore(pid, library, address, proc_to_watch):
    deadline = time.time() + 30
    while time.time() < deadline:
        value = semaphore_of(pid, library, address)
        if value is not None:
            return value
        if proc_to_watch.poll() is not None:
            raise Failure("the bystander ended early")
        time.sleep(0.02)
    raise Failure(f"pid {pid} never mapped {library}")


def foreign_uprobes(ours):
    """Names the other processes holding uprobes (bpftool perf list), which
    a check of the whole host cannot tell from ours: another profiler run
    at the same time, say. "" if there are none."""
    try:
        out = subprocess.run(["bpftool", "perf", "list"], capture_output=True, text=True,
                             timeout=30).stdout
    except OSError:
        return ""
    owners = {int(m.group(1)) for m in re.finditer(r"^pid (\d+) .* uprobe ", out, re.M)}
    others = sorted(owners - set(ours))
    return f"; uprobes of other processes on the host: pids {others}" if others else ""


def test_isolation(c, prof, artifacts, extra):
    """Isolation (issue 27): while ddheap-prof profiles a command (-- CMD,
    and -p PID -f), a bystander running the preload library (one started
    before, one after it attached) keeps its alloc semaphore at 0, read
    from its memory, and `valgrind /bin/true` runs (a uprobe for every
    process put a breakpoint into every ld.so, and valgrind died of
    SIGTRAP). The profiled shell's semaphore is raised (the reading is
    right), and the program it forks and execs is profiled exactly. Once
    ddheap-prof has ended, by SIGINT or SIGKILL (-p -f), the shell's
    semaphore is back at 0."""
    preload, plain = extra
    preload = os.path.abspath(preload)
    address = alloc_semaphore_address(preload)
    env = {**os.environ, "LD_PRELOAD": preload, "DD_HEAP_SAMPLING_INTERVAL": "1"}
    bystanders = []

    def bystander():
        b = subprocess.Popen(["sleep", "60"], env=env)
        bystanders.append(b)
        return b

    ours = []

    def check_host(what, target_pid):
        for i, b in enumerate(bystanders):
            c.equal(wait_for_semaphore(b.pid, preload, address, b), 0,
                    f"{what}: bystander {i + 1}'s semaphore stays 0")
        c.check((semaphore_of(target_pid, preload, address) or 0) >= 1,
                f"{what}: the profiled shell's semaphore is raised")
        v = subprocess.run(["valgrind", "-q", "/bin/true"], capture_output=True, text=True,
                           timeout=TIMEOUT)
        c.check(v.returncode == 0 and "SIGTRAP" not in v.stderr,
                f"{what}: valgrind /bin/true runs (exit {v.returncode}, "
                f"{v.stderr.strip()[-120:]!r}){foreign_uprobes(ours)}")

    script = f"read go; {plain} \"$1\" 50; read done"
    try:
        bystander()
        for mode in ("cmd", "pid", "kill"):
            truth_file = os.path.join(artifacts, f"isolation-{mode}.truth")
            pb = os.path.join(artifacts, f"isolation-{mode}.pb.gz")
            err = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-isolation-")
            target = p = None
            shell = ["sh", "-c", script, "sh", truth_file]
            try:
                if mode == "cmd":
                    p = subprocess.Popen([prof, "-o", pb, "--", "env", f"LD_PRELOAD={preload}",
                                          "DD_HEAP_SAMPLING_INTERVAL=1"] + shell,
                                         stdin=subprocess.PIPE, stderr=err, text=True)
                    feed = p.stdin
                    wait_for_text(err.name, "attached to", p)
                    with open(err.name) as f:
                        m = re.search(r"profiling pid (\d+)", f.read())
                    target_pid = int(m.group(1)) if m else -1
                else:
                    target = subprocess.Popen(shell, stdin=subprocess.PIPE, env=env, text=True)
                    wait_for_semaphore(target.pid, preload, address, target)
                    p = subprocess.Popen([prof, "-p", str(target.pid), "-f", "-o", pb],
                                         stderr=err, text=True)
                    feed = target.stdin
                    target_pid = target.pid
                    wait_for_text(err.name, "profiling pid", p)
                ours[:] = [p.pid]
                if len(bystanders) == 1:
                    bystander()  # started while ddheap-prof is attached
                check_host(f"{mode}, attached", target_pid)
                feed.write("go\n")
                feed.flush()
                deadline = time.time() + TIMEOUT
                while not os.path.exists(truth_file) and time.time() < deadline:
                    time.sleep(0.02)
                check_host(f"{mode}, after a forked child", target_pid)
                if mode == "pid":
                    # ddheap-prof ends first: what it raised in the shell is lowered
                    p.send_signal(signal.SIGINT)
                    c.equal(p.wait(timeout=TIMEOUT), 0, f"{mode}: ddheap-prof's exit status")
                    c.equal(semaphore_of(target.pid, preload, address), 0,
                            f"{mode}: the shell's semaphore is 0 once ddheap-prof has ended")
                elif mode == "kill":
                    # killed, its guardian lowers what it raised
                    p.kill()
                    p.wait(timeout=TIMEOUT)
                    deadline = time.time() + TIMEOUT
                    while (semaphore_of(target.pid, preload, address) != 0 and
                           time.time() < deadline):
                        time.sleep(0.02)
                    c.equal(semaphore_of(target.pid, preload, address), 0,
                            f"{mode}: the shell's semaphore is 0 once ddheap-prof was SIGKILLed")
                feed.write("done\n")
                feed.flush()
                feed.close()
                if target is not None:
                    c.equal(target.wait(timeout=TIMEOUT), 0, f"{mode}: the shell's exit status")
                else:
                    c.equal(p.wait(timeout=TIMEOUT), 0, f"{mode}: ddheap-prof's exit status")
            finally:
                kill_running(target, p)
            if mode == "kill":
                continue
            with open(truth_file) as f:
                truth = sum(int(m.group(1)) for m in
                            re.finditer(r"^site \S+ alloc_bytes (\d+)", f.read(), re.M))
            got = sum(v for labels, v, frames in traces(pb, "alloc_space")
                      if any(f.startswith("site_plain_") for f in frames))
            with open(err.name) as f:
                said = f.read().strip()[-400:]
            c.equal(got, truth, f"{mode}: the forked and exec'd program's bytes, exactly "
                                f"({said!r})")
    finally:
        for b in bystanders:
            b.kill()
            b.wait()


TESTS = {"follow": test_follow, "pid-follow": test_pid_follow, "git": test_git, "signals": test_signals,
         "namespace": test_namespace, "deleted": test_deleted, "outputs": test_outputs,
         "output-targets": test_output_targets, "isolation": test_isolation}


if __name__ == "__main__":
    sys.exit(run_prof_test(__doc__, TESTS, 2, extra=True))

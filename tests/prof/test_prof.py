#!/usr/bin/env python3
"""The ddheap-prof suite: the profiler (tools/ddheap-prof) attached to the
tracer suite's workload, its profile read back by Debian's `go tool pprof`
and checked against the workload's own ground truth; the flame graph opened
in headless chromium; lost events; attaching with -p; bad inputs; what the
library records in its status word (test_status).

    test_prof.py TEST DDHEAP_PROF WORKLOAD ARTIFACT_DIR [EXTRA]

TEST is one of the keys of TESTS. Needs root (BPF); exits 77 (skipped)
only when not root, and fails when go or chromium is missing. Ends with
"N passed, N failed".
"""

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import harness
from harness import SITES, Failure, Workload, sigma
from pprof_read import pprof, read_raw

TIMEOUT = 120
SEED = "20261129"


def per_site(raw, sample_type):
    """Sum of one sample type per workload call site (the innermost frame
    named site_*, inlined ones included); '?' for stacks that name none."""
    k = raw["types"].index(sample_type)
    sums = {}
    for values, ids in raw["samples"]:
        site = next((f for i in ids for f in raw["locs"][i]["functions"]
                     if f.startswith("site_")), "?")
        sums[site] = sums.get(site, 0) + values[k]
    return sums


class Prof:
    """ddheap-prof as a child process, its stderr in a file."""

    def __init__(self, binary, args, env=None, stdin=None, stdout=None):
        self.err = tempfile.NamedTemporaryFile(mode="w+", prefix="ddheap-prof-", suffix=".txt")
        self.proc = subprocess.Popen([binary] + args, stdin=stdin, stdout=stdout,
                                     stderr=self.err, text=True,
                                     env=dict(os.environ, **(env or {})))

    def text(self):
        with open(self.err.name) as f:
            return f.read()

    def wait_for(self, marker, timeout=TIMEOUT):
        harness.wait_for_output(self.proc, self.text, marker, "ddheap-prof", timeout)

    def finish(self, sig=None, timeout=TIMEOUT):
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Failure("ddheap-prof did not finish in time:\n" + self.text())
        return rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_cmd(prof, args, cmd, env, artifacts, name):
    """ddheap-prof ARGS -- CMD..., where CMD names the truth file as
    {truth}: returns (truth, raw profile, stderr, paths)."""
    paths = {"pb": os.path.join(artifacts, f"{name}.pb.gz"),
             "svg": os.path.join(artifacts, f"{name}.svg"),
             "folded": os.path.join(artifacts, f"{name}.folded"),
             "truth": os.path.join(artifacts, f"{name}.truth")}
    for p in paths.values():
        if os.path.exists(p):
            os.unlink(p)
    p = Prof(prof, ["-o", paths["pb"], "--svg", paths["svg"], "--folded", paths["folded"]] + args +
             ["--"] + [a.format(truth=paths["truth"]) for a in cmd],
             env=env, stdout=subprocess.DEVNULL)
    try:
        rc = p.finish()
    finally:
        p.kill()
    err = p.text()
    if rc != 0:
        raise Failure(f"ddheap-prof exited with {rc}:\n{err}")
    with open(paths["truth"]) as f:
        truth = harness.parse_truth(f.read().splitlines())
    return truth, read_raw(paths["pb"]), err, paths


def within(c, est, true, sd, what):
    bound = 5 * sd
    c.check(abs(est - true) <= bound,
            f"{what}: estimated {est}, true {true}, |diff| {abs(est - true)} "
            f"<= 5 sigma = {bound:.0f}")


def check_estimates(c, truth, raw, interval):
    """Per call site: alloc_space and final inuse_space within 5 sigma of
    the truth (the tracer suite's sigma), and the totals."""
    alloc = per_site(raw, "alloc_space")
    inuse = per_site(raw, "inuse_space")
    c.equal(alloc.get("?", 0), 0, "alloc_space whose stack names no call site")
    for site in SITES:
        t = truth["site"][site]
        within(c, alloc.get(site, 0), t["alloc_bytes"],
               sigma(truth["size"], site, "alloc_count", interval), f"alloc_space of {site}")
        within(c, inuse.get(site, 0), t["live_bytes"],
               sigma(truth["size"], site, "live_count", interval), f"inuse_space of {site}")
    sd = math.sqrt(sum(sigma(truth["size"], s, "alloc_count", interval) ** 2 for s in SITES))
    within(c, sum(alloc.values()), truth["total"]["alloc_bytes"], sd, "alloc_space, all sites")
    sd = math.sqrt(sum(sigma(truth["size"], s, "live_count", interval) ** 2 for s in SITES))
    within(c, sum(inuse.values()), truth["total"]["live_bytes"], sd, "inuse_space, all sites")
    return alloc, inuse


def folded_per_site(path):
    sums = {}
    with open(path) as f:
        for line in f:
            stack, _, value = line.rstrip("\n").rpartition(" ")
            site = next((fr for fr in stack.split(";") if fr.startswith("site_")), "?")
            sums[site] = sums.get(site, 0) + int(value)
    return sums


def readelf_build_id(binary):
    out = subprocess.run(["readelf", "-n", binary], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"Build ID: ([0-9a-f]+)", out)
    return m.group(1) if m else ""


def has_line_table(binary):
    out = subprocess.run(["readelf", "-S", "-W", binary], capture_output=True, text=True,
                         check=True).stdout
    return ".debug_line" in out


# ------------------------------------------------------------------ tests

def test_cmd(c, prof, workload, artifacts, extra):
    """-- CMD at R = 64 KiB over ~512 MiB: go tool pprof reads the profile;
    the four sample types are Go's; each site's alloc_space and final
    inuse_space are within 5 sigma of the truth; the executable's mapping
    carries its build id; frames have file:line; --folded carries the same
    inuse_space per site; no event was lost (the ring buffer holds the
    whole run, as in test_exact)."""
    interval = 65536
    truth, raw, err, paths = run_cmd(
        prof, ["--ringbuf-kb", "131072"], [workload, "--truth={truth}", "--threads=2", "--rounds=2000", f"--seed={SEED}"],
        {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}, artifacts, "cmd")
    c.equal(raw["types"], ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"],
            "sample types")
    alloc, inuse = check_estimates(c, truth, raw, interval)
    real = os.path.realpath(workload)
    exe = [m for m in raw["mappings"] if os.path.realpath(m["file"]) == real]
    c.check(len(exe) == 1 and exe[0]["build_id"] == readelf_build_id(workload),
            f"the workload's mapping with its build id: {exe}")
    site_lines = {l["file"] for l in raw["locs"].values() if l["function"].startswith("site_")}
    if has_line_table(workload):
        c.check(site_lines and all(re.search(r"workload\.c:\d+$", f) for f in site_lines),
                f"site frames carry workload.c:LINE ({sorted(site_lines)[:3]})")
    else:  # a release build: no debug info, so no file and line either
        c.check(site_lines == {":0"}, f"site frames carry no file:line ({sorted(site_lines)})")
    c.check(any("lost events: 0 " in x for x in raw["comments"]),
            f"profile comment says no event was lost: {raw['comments']}")
    c.check("LOST" not in err, "no lost events reported on stderr")
    folded = folded_per_site(paths["folded"])
    c.equal(folded, {k: v for k, v in inuse.items() if v > 0},
            "--folded inuse_space per site = the profile's")
    # The top site by estimated bytes is the one that truly allocates most.
    true_top = max(SITES, key=lambda s: truth["site"][s]["alloc_bytes"])
    c.equal(max(alloc, key=alloc.get), true_top, "top site of alloc_space")
    top = pprof(paths["pb"], "-top", "-cum", "-sample_index=alloc_space")
    c.check(true_top in top, "pprof -top -sample_index=alloc_space names the top site")


def test_exact(c, prof, workload, artifacts, extra):
    """R = 1 (every allocation reported, weight = size) through the
    otel_memory provider: per site, alloc_space and alloc_objects equal
    the bytes and allocations made, inuse_space and inuse_objects the
    bytes and blocks still live at exit, exactly. The command is `env
    VAR=1 WORKLOAD`, so the probes appear only at the second exec (the
    way wrappers and LD_PRELOAD runs start), and the period comes from
    the environment of the program that has them. The ring buffer holds
    the whole run (about 3 400 alloc events of up to 16 KiB of stack
    each): counting exactly must not depend on ddheap-prof being scheduled
    in time on a busy machine (losing events when it is not is what
    prof-lost tests)."""
    truth, raw, err, _ = run_cmd(
        prof, ["--provider", "otel_memory", "--ringbuf-kb", "131072"],
        ["env", "DD_HEAP_SAMPLING_INTERVAL=1", workload, "--truth={truth}", "--threads=2",
         "--rounds=30"], {}, artifacts, "exact")
    c.check("no otel_memory probes in env yet" in err, "the wrapper had no probes (said so)")
    c.check("(otel_memory:alloc, free)" in err, "attached through otel_memory at the second exec")
    c.check(any("interval 1" in x for x in raw["comments"]),
            f"interval read from the program's environment: {raw['comments'][:1]}")
    first = raw["mappings"][0]["file"] if raw["mappings"] else None
    c.check(first and os.path.realpath(first) == os.path.realpath(workload),
            f"the first mapping (pprof's main binary) is the workload, not env: {first}")
    c.check("LOST" not in err, f"no lost events ({err.strip().splitlines()[-2:]})")
    check_plain_truth(c, truth, raw, SITES)


def profile_lingering(c, prof, workload, args, env, prof_args, settle_s=0.0):
    """ddheap-prof PROF_ARGS -p on the workload, which allocates once it is
    attached and then lingers; after settle_s, SIGINT; both exit codes
    checked. Returns (the workload, ddheap-prof)."""
    w = Workload(workload, args + ["--go", "--linger=stdin"], env)
    p = None
    try:
        w.wait_line("workload: pid=")
        p = Prof(prof, prof_args + ["-p", str(w.pid)])
        p.wait_for("ddheap-prof: profiling pid")
        w.send("go")
        w.wait_line("workload: lingering")
        time.sleep(settle_s)
        c.equal(p.finish(signal.SIGINT), 0, "ddheap-prof exit code after SIGINT")
        w.send("exit")
        c.equal(w.finish(), 0, "workload exit code")
    finally:
        w.kill()
        if p:
            p.kill()
    return w, p


def test_pid(c, prof, workload, artifacts, extra):
    """-p PID: attach to a running workload (which then allocates), stop
    with SIGINT while it lingers; estimates within 5 sigma of its truth,
    blocks allocated before the attach (--pre) not in the profile."""
    interval = 65536
    pb = os.path.join(artifacts, "pid.pb.gz")
    w, _ = profile_lingering(c, prof, workload,
                             ["--threads=2", "--rounds=1500", f"--seed={SEED}", "--pre=500"],
                             {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}, ["-o", pb])
    truth = harness.parse_truth(w.lines)
    c.equal(truth["check"]["attached_at_start"], 1, "profiler attached when the workload started")
    raw = read_raw(pb)
    check_estimates(c, truth, raw, interval)
    c.check("site_pre_attach" not in per_site(raw, "alloc_space"),
            "no block allocated before the attach")


NAMED = re.compile(r"addresses named: (\d+) while running \(the longest stack [\d.]+ ms\), "
                   r"(\d+) when writing")


def named_split(text):
    """(named while running, named when writing) from -v's line."""
    m = NAMED.search(text)
    if not m:
        raise Failure(f"-v said nothing of naming:\n{text[-1500:]}")
    return int(m.group(1)), int(m.group(2))


def test_naming(c, prof, workload, artifacts, extra):
    """The reader names stacks between its reads while the program runs,
    so that the end has nothing left to name: -p on the workload at the
    library's own rate limit (3000 samples a second), stopped while it
    lingers, names every address while running. Then exact mode (no
    limit: a burst can fill the buffer while a stack is named) leaves all
    the naming for the end, and loses no event."""
    # The reader wakes every 50 ms; a handful of stacks take well under a
    # second to name, 50-60 ms the first libc frame with libc6-dbg.
    _, p = profile_lingering(c, prof, workload, ["--threads=1", "--rounds=300", f"--seed={SEED}"],
                             {"DD_HEAP_SAMPLING_INTERVAL": "65536",
                              "DD_HEAP_SAMPLES_PER_SECOND": "3000"},
                             ["-v", "-o", os.path.join(artifacts, "naming.pb.gz")], settle_s=2)
    running, writing = named_split(p.text())
    c.check(running > 0 and writing == 0,
            f"at a limited rate, every address named while running: {running}, {writing}")
    _, _, err, _ = run_cmd(prof, ["-v", "--ringbuf-kb", "131072"],
                           ["env", "DD_HEAP_SAMPLING_INTERVAL=1", "DD_HEAP_SAMPLES_PER_SECOND=0",
                            workload, "--truth={truth}", "--threads=2", "--rounds=30"],
                           {}, artifacts, "naming-exact")
    running, writing = named_split(err)
    c.check(running == 0 and writing > 0,
            f"with no limit, naming left for the end: {running}, {writing}")
    c.check("LOST" not in err, "no event lost in exact mode")


def test_duration(c, prof, workload, artifacts, extra):
    """-p with -d: ddheap-prof stops by itself, writes a readable profile
    and detaches; the workload sees the detach (its semaphores drop),
    then frees every block it kept, sampled ones included, intact."""
    pb = os.path.join(artifacts, "duration.pb.gz")
    w = Workload(workload, ["--threads=2", "--rounds=300", "--go", "--hold=detach"],
                 {"DD_HEAP_SAMPLING_INTERVAL": "4096"})
    p = None
    try:
        w.wait_line("workload: pid=")
        p = Prof(prof, ["-p", str(w.pid), "-d", "2", "-o", pb])
        p.wait_for("ddheap-prof: profiling pid")
        w.send("go")
        c.equal(p.finish(), 0, "ddheap-prof exit code at the end of -d")
        c.equal(w.wait_line("workload: freed"), "workload: freed marked=0 corrupt=0 attached=0",
                "the workload after the profiler left")
        c.equal(w.finish(), 0, "workload exit code")
    finally:
        w.kill()
        if p:
            p.kill()
    raw = read_raw(pb)
    c.check(len(raw["samples"]) > 0 and any(l["function"].startswith("site_")
                                            for l in raw["locs"].values()),
            f"the profile has samples at the call sites ({len(raw['samples'])} samples)")


def test_sigint(c, prof, workload, artifacts, extra):
    """Ctrl-C on `ddheap-prof -- CMD` in a terminal: SIGINT to the whole
    process group. The profile is written, and the command gets its
    SIGINT too (ptrace must hand it on, not swallow it when the profiler
    lets go): the workload, waiting on stdin, dies of it."""
    pb = os.path.join(artifacts, "sigint.pb.gz")
    p = subprocess.Popen([prof, "-o", pb, "--", workload, "--threads=2", "--rounds=200", "--go",
                          "--linger=stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env=dict(os.environ, DD_HEAP_SAMPLING_INTERVAL="65536"))
    child = None
    try:
        line = p.stdout.readline()
        m = re.match(r"workload: pid=(\d+) ready", line)
        if not m:
            raise Failure(f"no ready line from the workload: {line!r}")
        child = int(m.group(1))
        p.stdin.write("go\n")
        p.stdin.flush()
        while not p.stdout.readline().startswith("workload: lingering"):
            pass
        os.killpg(p.pid, signal.SIGINT)
        rc = p.wait(timeout=TIMEOUT)
        err = p.stderr.read()
        c.equal(rc, 0, f"ddheap-prof exit code after SIGINT ({err.strip().splitlines()[-1:]})")
        deadline = time.monotonic() + TIMEOUT
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        gone = not os.path.exists(f"/proc/{child}")
        if not gone:
            with open(f"/proc/{child}/stat") as f:
                gone = f.read().rsplit(")", 1)[1].split()[0] == "Z"
        c.check(gone, "the command died of its SIGINT")
    finally:
        if p.poll() is None:
            p.kill()
        if child and os.path.exists(f"/proc/{child}"):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    raw = read_raw(pb)
    c.check(any(l["function"].startswith("site_") for l in raw["locs"].values()),
            "the profile has the call sites")


def chromium(args, timeout=TIMEOUT):
    harness.need("chromium")
    with tempfile.TemporaryDirectory(prefix="ddheap-chromium-") as profile_dir:
        r = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                            "--enable-logging=stderr", "--v=0", "--no-first-run",
                            f"--user-data-dir={profile_dir}"] + args,
                           capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, HOME=profile_dir))
    return r


def script_errors(stderr):
    return [l for l in stderr.splitlines() if "Uncaught" in l or
            ("CONSOLE" in l and "ERROR" in l) or "SyntaxError" in l]


def test_svg(c, prof, workload, artifacts, extra):
    """The flame graph (inuse_space) opens in headless chromium with no
    script error: its script ran (it marks the root element), the live
    sites are named, and zooming into a site and searching work (driven
    by a probe script appended to a copy). The screenshot is kept."""
    truth, raw, err, paths = run_cmd(
        prof, [], [workload, "--truth={truth}", "--threads=2", "--rounds=500", f"--seed={SEED}"],
        {"DD_HEAP_SAMPLING_INTERVAL": "65536"}, artifacts, "svg")
    svg = paths["svg"]
    with open(svg) as f:
        text = f.read()
    c.check(text.startswith("<?xml") and "<script" in text and "http" not in
            text.replace('xmlns="http://www.w3.org/2000/svg"', ""),
            "one self-contained SVG file (script inside, nothing fetched)")
    r = chromium(["--dump-dom", "file://" + svg])
    dom = r.stdout
    m = re.search(r'data-ddheap-ready="(\d+)"', dom)
    c.check(m is not None and int(m.group(1)) > 0,
            f"the viewer's script ran in chromium ({m.group(0) if m else 'no marker'})")
    c.equal(script_errors(r.stderr), [], "script errors in chromium's console")
    live_sites = [s for s in SITES if truth["site"][s]["live_bytes"] > 0]
    for site in live_sites:
        c.check(f"<title>{site} (" in dom, f"the flame graph names {site}")

    # Drive the viewer: zoom into one site, then search for another.
    probe = svg.replace(".svg", "-probe.svg")
    target = live_sites[0]
    other = live_sites[-1]
    driver = f"""<script type="text/ecmascript"><![CDATA[
const f = window.ddheapFlame;
const g = f.frames.find(g => g.querySelector('title').textContent.startsWith('{target} ('));
f.zoom(g);
const w = parseFloat(g.querySelector('rect').getAttribute('width'));
const hidden = f.frames.filter(x => x.style.display === 'none').map(x => x.querySelector('title').textContent);
f.reset();
f.search(new RegExp('^{other}$'));
document.documentElement.setAttribute('data-probe', JSON.stringify({{
  zoomed_width: w, hidden_other: hidden.some(t => t.startsWith('{other} (')),
  hits: f.frames.filter(x => x.classList.contains('hit')).length,
  matched: document.getElementById('matched').textContent}}));
]]></script>
</svg>"""
    with open(probe, "w") as f:
        f.write(text.rsplit("</svg>", 1)[0] + driver + "\n")
    r = chromium(["--dump-dom", "file://" + probe])
    m = re.search(r'data-probe="([^"]*)"', r.stdout)
    import html
    import json
    res = json.loads(html.unescape(m.group(1))) if m else {}
    c.equal(script_errors(r.stderr), [], "script errors while zooming and searching")
    c.check(res.get("zoomed_width", 0) > 1100,
            f"zoom: {target} fills the width ({res.get('zoomed_width')})")
    c.check(res.get("hidden_other") is True, f"zoom: {other} is hidden")
    c.check(res.get("hits", 0) >= 1 and res.get("matched", "").startswith("Matched: "),
            f"search: {other} highlighted ({res.get('hits')}, {res.get('matched')!r})")

    shot = os.path.join(artifacts, "flamegraph.png")
    if os.path.exists(shot):
        os.unlink(shot)
    r = chromium([f"--screenshot={shot}", "--window-size=1200,700", "file://" + svg])
    c.check(os.path.exists(shot) and os.path.getsize(shot) > 10000,
            f"screenshot kept at {shot}")


def test_lost(c, prof, workload, artifacts, extra):
    """A one-page ring buffer at R = 1 cannot hold the stream: events are
    lost, stderr says how many, and the profile's comment says the same."""
    truth, raw, err, _ = run_cmd(
        prof, ["--ringbuf-kb", "4"], [workload, "--truth={truth}", "--threads=2", "--rounds=200"],
        {"DD_HEAP_SAMPLING_INTERVAL": "1"}, artifacts, "lost")
    m = re.search(r"LOST (\d+) events \(alloc (\d+), free (\d+)\)", err)
    c.check(m is not None and int(m.group(1)) > 0, f"stderr reports lost events: "
            f"{m.group(0) if m else err.strip()}")
    if m:
        want = f"lost events: {m.group(1)} (alloc {m.group(2)}, free {m.group(3)};"
        c.check(any(want in x for x in raw["comments"]),
                f"the profile's comment says the same: {raw['comments']}")
        n_alloc = sum(s["alloc_count"] for s in truth["site"].values())
        seen = re.search(r"alloc events (\d+)", err)
        c.check(seen and int(seen.group(1)) + int(m.group(2)) == n_alloc,
                f"alloc events seen + lost = allocations made ({n_alloc})")


def run_prof(prof, args, **kw):
    return subprocess.run([prof] + args, capture_output=True, text=True, timeout=TIMEOUT, **kw)


def free_pid():
    with open("/proc/sys/kernel/pid_max") as f:
        pid = int(f.read()) - 1
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_errors(c, prof, workload, artifacts, extra):
    """Bad inputs fail clearly, with a non-zero exit, before attaching."""
    def expect(args, rc, message, what, **kw):
        r = run_prof(prof, args, **kw)
        c.check(r.returncode == rc and message in r.stderr and "attached to" not in r.stderr,
                f"{what}: exit {r.returncode} (want {rc}), stderr {r.stderr.strip()[:160]!r}")

    out = os.path.join(artifacts, "errors.pb.gz")
    expect([], 2, "give -p PID or -- CMD", "no target")
    expect(["-p", "1", "--", "true"], 2, "not both", "both -p and a command")
    expect(["-p", "x"], 2, "-p needs a process id", "a pid that is not a number")
    expect(["-d", "soon", "-p", "1"], 2, "-d needs", "a bad duration")
    for endless in ("inf", "nan", "1e300"):
        expect(["-d", endless, "-p", "1"], 2, "-d needs", f"a duration of {endless} seconds")
    expect(["--provider", "jemalloc", "-p", "1"], 2, "--provider is", "an unknown provider")
    expect(["--value", "bytes", "-p", "1"], 2, "--value is", "an unknown --value")
    expect(["--no-such-option"], 2, "usage:", "an unknown option")
    expect(["-p", str(free_pid()), "-o", out], 1, "no process with pid", "a pid that does not exist")
    expect(["-o", "/nonexistent-dir/x.pb.gz", "--", workload], 1, "cannot write /nonexistent-dir",
           "an output that cannot be written")
    expect(["-o", out, "--svg", artifacts, "--", workload], 1, f"cannot write {artifacts}",
           "an --svg that cannot be written (a directory)")

    def as_nobody():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    # A copy nobody can reach: the build tree may sit under a directory
    # only root may enter (/root is 0700 on Debian).
    nobody_dir = tempfile.mkdtemp(prefix="ddheap-prof-nobody-")
    try:
        os.chmod(nobody_dir, 0o755)
        nobody_prof = os.path.join(nobody_dir, "ddheap-prof")
        shutil.copy2(prof, nobody_prof)
        os.chmod(nobody_prof, 0o755)
        r = run_prof(nobody_prof, ["-o", os.path.join(nobody_dir, "x.pb.gz"), "--", "/bin/true"],
                     preexec_fn=as_nobody)
        c.check(r.returncode == 1 and "must run as root" in r.stderr and "attached to" not in r.stderr,
                f"not root: exit {r.returncode} (want 1), stderr {r.stderr.strip()[:160]!r}")
    finally:
        shutil.rmtree(nobody_dir, ignore_errors=True)

    # A process without probes, running and started.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        expect(["-p", str(sleeper.pid), "--no-inject", "-o", out], 1,
               "has no ddheap:alloc probe", "-p --no-inject of a process without probes")
        c.equal(sleeper.poll(), None, "the process without probes still runs")
    finally:
        sleeper.kill()
        sleeper.wait()
    expect(["-o", out, "--no-preload", "--", "true"], 1,
           "never mapped an object with ddheap:alloc probes", "-- a command without probes")
    expect(["-o", out, "--", "/nonexistent-program"], 127, "cannot run /nonexistent-program",
           "-- a command that does not exist")


def test_thread_id(c, prof, workload, artifacts, extra):
    """-p with the id of a thread that is not its process's first (what ps
    -L, top -H and gettid() show): ddheap-prof says so and profiles the
    process, instead of attaching to nothing. python3 with the preload
    library, one thread waiting. (Registered where the preload library is
    built.)"""
    preload, = extra
    out = os.path.join(artifacts, "thread-id.pb.gz")
    script = ("import os, sys, threading\n"
              "ready = threading.Event()\n"
              "def wait():\n"
              "    print(threading.get_native_id(), flush=True)\n"
              "    ready.wait()\n"
              "t = threading.Thread(target=wait)\n"
              "t.start()\n"
              "sys.stdin.readline()\n"
              "ready.set()\n")
    proc = subprocess.Popen(["python3", "-c", script], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, LD_PRELOAD=os.path.abspath(preload)))
    try:
        tid = int(proc.stdout.readline())
        c.check(tid != proc.pid, f"the thread's id {tid} is not the process's {proc.pid}")
        r = run_prof(prof, ["-p", str(tid), "-d", "0.3", "-o", out])
        c.equal(r.returncode, 0, f"exit code ({r.stderr.strip()[-200:]!r})")
        c.check(f"{tid} is a thread of process {proc.pid}; profiling the process" in r.stderr,
                f"says whose thread it is: {r.stderr.strip()[:300]!r}")
        c.check(f"profiling pid {proc.pid}" in r.stderr, "profiles the process")
        c.check(os.path.getsize(out) > 0, "writes a profile")
    finally:
        proc.stdin.close()
        proc.wait(timeout=TIMEOUT)


def test_dlopen(c, prof, workload, artifacts, extra):
    """A library dlopen'ed after the start is found by a rescan and
    attached; at R = 1 its allocations are in the profile exactly, with
    its own mapping (and build id) and file:line from its debug info; the
    executable's are there too."""
    main, plugin = extra
    pb = os.path.join(artifacts, "dlopen.pb.gz")
    count = 300
    p = Prof(prof, ["-o", pb, "--", main, os.path.abspath(plugin), str(count)],
             env={"DD_HEAP_SAMPLING_INTERVAL": "1"}, stdin=subprocess.PIPE,
             stdout=subprocess.PIPE)
    lines = []
    try:
        def expect_line(prefix):
            line = p.proc.stdout.readline()
            lines.append(line.rstrip("\n"))
            if not line.startswith(prefix):
                raise Failure(f"wanted {prefix!r} from the program, got {line!r}:\n{p.text()}")
        expect_line("dlopen: ready")
        p.proc.stdin.write("load\n")
        p.proc.stdin.flush()
        expect_line("dlopen: loaded")
        p.wait_for("attached to " + os.path.realpath(plugin))
        p.proc.stdin.write("work\n")
        p.proc.stdin.flush()
        for line in p.proc.stdout:
            lines.append(line.rstrip("\n"))
        c.equal(p.finish(), 0, "ddheap-prof exit code")
    finally:
        p.kill()
    truth = harness.parse_truth(lines)
    raw = read_raw(pb)
    got = {t: per_site(raw, t) for t in raw["types"]}
    for site in ("site_main_blocks", "site_plugin_blocks"):
        t = truth["site"][site]
        c.equal((got["alloc_space"].get(site, 0), got["alloc_objects"].get(site, 0),
                 got["inuse_space"].get(site, 0), got["inuse_objects"].get(site, 0)),
                (t["alloc_bytes"], t["alloc_count"], t["live_bytes"], t["live_count"]),
                f"{site}: alloc_space, alloc_objects, inuse_space, inuse_objects")
    real = os.path.realpath(plugin)
    maps = [m for m in raw["mappings"] if os.path.realpath(m["file"]) == real]
    c.check(len(maps) == 1 and maps[0]["build_id"] == readelf_build_id(plugin),
            f"the plugin's mapping with its build id: {maps}")
    files = {l["file"] for l in raw["locs"].values() if l["function"] == "site_plugin_blocks"}
    want = r"plugin\.c:\d+$" if has_line_table(plugin) else r"^:0$"
    c.check(files and all(re.search(want, f) for f in files),
            f"plugin frames carry {want} ({sorted(files)})")


def check_plain_truth(c, truth, raw, sites=None):
    """At R = 1, each site's four values equal the truth: each of `sites`
    (one missing from the truth is an error), by default each it has."""
    got = {t: per_site(raw, t) for t in raw["types"]}
    for site in sites or truth["site"]:
        t = truth["site"][site]
        c.equal((got["alloc_space"].get(site, 0), got["alloc_objects"].get(site, 0),
                 got["inuse_space"].get(site, 0), got["inuse_objects"].get(site, 0)),
                (t["alloc_bytes"], t["alloc_count"], t["live_bytes"], t["live_count"]),
                f"{site}: alloc_space, alloc_objects, inuse_space, inuse_objects")


def test_preload(c, prof, workload, artifacts, extra):
    """A program without ddheap, run with the LD_PRELOAD library through
    `env`: the library is named by the loader's --list at the program's
    exec and attached before it runs; at R = 1 each site's four values
    equal the truth. (Registered in meson.build only where the preload
    library is built.)"""
    preload, plain = extra
    truth, raw, err, _ = run_cmd(
        prof, [], ["env", f"LD_PRELOAD={os.path.abspath(preload)}", "DD_HEAP_SAMPLING_INTERVAL=1",
                   plain, "{truth}", "400"], {}, artifacts, "preload")
    c.check("attached to " + os.path.realpath(preload) in err,
            f"attached to the preload library: {err.strip()[:300]}")
    check_plain_truth(c, truth, raw)


def test_auto_preload(c, prof, workload, artifacts, extra):
    """`ddheap-prof -- PROGRAM` on a program without probes runs it under
    the preload library of the build tree, saying so in one line; at R = 1
    the values equal the truth. With --no-preload it runs as it is and
    nothing is written. Through ddheap-run it works as before, with no
    line (ddheap-run preloads the library itself); through env too."""
    preload, plain, run = extra
    env = {"DD_HEAP_SAMPLING_INTERVAL": "1"}
    truth, raw, err, _ = run_cmd(prof, [], [plain, "{truth}", "400"], env, artifacts, "auto")
    said = [l for l in err.splitlines() if "carries no ddheap probes: running it with" in l]
    c.check(len(said) == 1 and said[0].endswith(f"{os.path.realpath(preload)} (--no-preload: not)"),
            f"one line names the preload library: {err.strip()[:400]}")
    check_plain_truth(c, truth, raw)
    out = os.path.join(artifacts, "auto-none.pb.gz")
    r = subprocess.run([prof, "--no-preload", "-o", out, "--", plain,
                        os.path.join(artifacts, "auto-none.truth"), "50"],
                       capture_output=True, text=True, timeout=TIMEOUT, env=dict(os.environ, **env))
    c.check(r.returncode == 1 and "never mapped an object" in r.stderr and
            "running it with" not in r.stderr and not os.path.exists(out),
            f"--no-preload: no probes, no profile (rc {r.returncode}): {r.stderr.strip()[:300]}")
    truth, raw, err, _ = run_cmd(prof, [], [run, plain, "{truth}", "400"], env, artifacts,
                                 "auto-run")
    c.check("running it with" not in err, f"ddheap-run is not preloaded twice: {err[:300]}")
    check_plain_truth(c, truth, raw)
    # A wrapper running a program without probes: preloaded, exact. (One
    # running a program with probes is not: prof-exact, prof-namespace.)
    truth, raw, err, _ = run_cmd(prof, [], ["env", "X=1", plain, "{truth}", "400"], env,
                                 artifacts, "auto-env")
    c.check("env carries no ddheap probes: running it with" in err,
            f"env running a program without probes: preloaded ({err.strip()[:300]})")
    check_plain_truth(c, truth, raw)
    # An LD_PRELOAD the user set stays, after the library (so a preloaded
    # allocator is the one it forwards to), as ddheap-run does.
    theirs = "/lib/x86_64-linux-gnu/libm.so.6"
    if os.path.exists(theirs):
        r = subprocess.run([prof, "-o", os.path.join(artifacts, "auto-ld.pb.gz"), "--", "sh",
                            "-c", 'echo "$LD_PRELOAD"'], capture_output=True, text=True,
                           timeout=TIMEOUT, env=dict(os.environ, LD_PRELOAD=theirs))
        c.equal(r.stdout.strip(), f"{os.path.realpath(preload)}:{theirs}",
                f"the user's LD_PRELOAD after the library ({r.stderr.strip()[:200]})")


STATUS_LINE = re.compile(r"^ddheap-prof: pid (\d+) \((\S+)\): (.*)$", re.M)


def test_status(c, prof, workload, artifacts, extra):
    """What the library finds wrong inside a process, it records in its
    status word and never writes on the program's streams; ddheap-prof
    reads the word and says it, once per kind. mimalloc preloaded ahead of
    the library and a bad interval: one line each, naming the process;
    the library alone with good values: none."""
    preload = os.path.abspath(extra[0])
    pb = os.path.join(artifacts, "status.pb.gz")
    cases = [
        ({"LD_PRELOAD": f"libmimalloc.so.2:{preload}", "DD_HEAP_SAMPLING_INTERVAL": "12q"},
         ["malloc is bound to a definition ahead", "DD_HEAP_SAMPLING_INTERVAL is not"]),
        ({"LD_PRELOAD": preload, "DD_HEAP_SAMPLING_INTERVAL": "64k"}, []),
    ]
    for env, want in cases:
        # The program lives 1 s: the word is read at each rescan (0.2 s).
        r = subprocess.run([prof, "-o", pb, "--", "env"] + [f"{k}={v}" for k, v in env.items()] +
                           ["sleep", "1"], capture_output=True, text=True, timeout=120)
        what = " ".join(f"{k}={v}" for k, v in env.items())
        c.equal(r.returncode, 0, f"{what}: exit status ({r.stderr.strip()[-300:]})")
        said = STATUS_LINE.findall(r.stderr)
        c.equal(sorted(w for w in want if any(text.startswith(w) for _, _, text in said)),
                sorted(want), f"{what}: what ddheap-prof says of the library ({said})")
        c.equal(len(said), len(want), f"{what}: one line per kind")
        c.check(all(name == "sleep" for _, name, _ in said), f"{what}: the process named")
        c.equal([l for l in r.stderr.splitlines() if not l.startswith("ddheap-prof: ")], [],
                f"{what}: nothing else on stderr (the program's own, shared with ddheap-prof)")


def test_inline(c, prof, workload, artifacts, extra):
    """A helper always inlined into its call site (-O2 -g): the location
    of the return address carries two lines, the helper inlined into the
    site, each with its own file:line; the folded stacks show the helper
    below the site; at R = 1 the values equal the truth."""
    (program,) = extra
    truth, raw, err, paths = run_cmd(prof, [], [program, "{truth}", "500"],
                                     {"DD_HEAP_SAMPLING_INTERVAL": "1"}, artifacts, "inline")
    text = pprof(paths["pb"], "-raw")
    m = re.search(r"^\s*\d+: 0x[0-9a-f]+ M=\d+ inlined_helper (\S+) s=\d+\n"
                  r"\s+site_with_inlined_helper (\S+) s=\d+$", text, re.M)
    c.check(m is not None, "a location with inlined_helper inlined into site_with_inlined_helper")
    if m:
        c.check(re.search(r"inline_main\.c:\d+$", m.group(1)) and
                re.search(r"inline_main\.c:\d+$", m.group(2)) and m.group(1) != m.group(2),
                f"each with its own line: {m.group(1)}, {m.group(2)}")
    with open(paths["folded"]) as f:
        folded = f.read()
    # (The allocator below it has no frame of its own in a release build
    # of ddheap, and then the helper is the innermost frame.)
    c.check(re.search(r";site_with_inlined_helper;inlined_helper[; ]", folded) is not None,
            f"folded: the helper below the site ({folded.strip()[:200]})")
    got = {t: per_site(raw, t) for t in raw["types"]}
    t = truth["site"]["site_with_inlined_helper"]
    site = "site_with_inlined_helper"
    c.equal((got["alloc_space"].get(site, 0), got["inuse_objects"].get(site, 0)),
            (t["alloc_bytes"], t["live_count"]), "alloc_space and inuse_objects of the site")


TESTS = {"inline": test_inline, "sigint": test_sigint, "duration": test_duration, "preload": test_preload, "status": test_status, "auto-preload": test_auto_preload, "dlopen": test_dlopen, "cmd": test_cmd, "exact": test_exact, "pid": test_pid, "svg": test_svg,
         "lost": test_lost, "errors": test_errors, "thread-id": test_thread_id,
         "naming": test_naming}


if __name__ == "__main__":
    sys.exit(harness.run_prof_test(__doc__, TESTS, 3, extra=True))

#!/usr/bin/env python3
"""ddheap-prof as a scrape target and a host agent (docs/fleet.md):
--http served to Debian's `go tool pprof` (a real client of Go's
net/http/pprof protocol) and to clients that misbehave; --all finding
the instrumented processes of the host, and only those.

    test_fleet.py TEST DDHEAP_PROF WORKLOAD ARTIFACT_DIR [DLOPENER PLUGIN]

TEST: http (go tool pprof twice, allocs, a delta), robust (50 fetches at
once, then garbage, oversized, half-sent and never-read requests with
hundreds of idle connections held, and a fetch meanwhile), all (--all:
two workloads started before the agent, one after, a program without
ddheap untouched). Servers listen on 127.0.0.1, port 0 (a free port the
kernel picks, which ddheap-prof prints). Root only (BPF).
"""

import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import harness
from harness import SITES, Failure, Workload, sigma
from pprof_read import _fields, pprof, read_raw, read_samples
from test_prof import Prof, check_estimates, within

SEED = "20261203"
INTERVAL = 65536
IDLE_TIMEOUT = 10  # http.c's IDLE_TIMEOUT_S: a fetch must not need it to pass


def serving_url(p):
    """The base URL ddheap-prof printed once listening."""
    p.wait_for("ddheap-prof: serving http://")
    m = re.search(r"serving (http://127\.0\.0\.1:\d+)/debug/pprof/", p.text())
    if not m:
        raise Failure("no address in: " + p.text())
    return m.group(1)


def fetch(url, timeout=30, source=None):
    """(status, body, seconds) of one GET."""
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read(), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.monotonic() - t0


def profile_of(body, scratch):
    """The profile of a response body as read_samples reads it, and its
    default sample type (profile.proto field 14, a string index)."""
    path = os.path.join(scratch, "body.pb.gz")
    with open(path, "wb") as f:
        f.write(body)
    prof = read_samples(path)
    import gzip
    data = gzip.decompress(body)
    strings = [v.decode("utf-8", "replace") for n, w, v in _fields(data) if n == 6 and w == 2]
    dflt = next((v for n, w, v in _fields(data) if n == 14 and w == 0), 0)
    prof["default"] = strings[dflt] if dflt < len(strings) else "?"
    return prof


def start_workload(workload, seed, extra=()):
    return Workload(workload, ["--threads=2", "--rounds=1500", f"--seed={seed}", "--go",
                               "--linger=stdin"] + list(extra),
                    {"DD_HEAP_SAMPLING_INTERVAL": str(INTERVAL)})


def test_http(c, prof, workload, artifacts, extra):
    """-p PID --http: go tool pprof fetches /debug/pprof/heap twice in a
    row, each within 5 sigma of the workload's truth, labelled as the file
    written at the end (-o) is; /allocs is the same
    profile with alloc_space the default; a delta over the workload's run
    (started before it allocates) holds its allocations, and a plain fetch
    made meanwhile is answered before the delta ends; bad paths, methods
    and seconds are refused."""
    w = start_workload(workload, SEED)
    p = None
    scratch = tempfile.mkdtemp(prefix="ddheap-fleet-")
    try:
        w.wait_line("workload: pid=")
        # (A ring buffer that holds the whole run: the estimates must not
        # depend on how fast a loaded machine lets ddheap-prof drain it.)
        # -o as well: the file written at the end is the served profile's
        # twin, its labels (pid, and whatever else files carry) the same.
        pb = os.path.join(artifacts, "fleet-http.pb.gz")
        p = Prof(prof, ["-p", str(w.pid), "--http", "127.0.0.1:0", "--ringbuf-kb", "131072",
                        "-o", pb])
        base = serving_url(p)
        p.wait_for("ddheap-prof: profiling pid")
        delta = {}
        t = threading.Thread(target=lambda: delta.update(
            r=fetch(base + "/debug/pprof/allocs?seconds=5")))
        t.start()
        time.sleep(0.5)  # the delta's start is recorded before the workload allocates
        w.send("go")
        w.wait_line("workload: lingering")
        truth = harness.parse_truth(w.lines)
        c.check(truth["check"]["attached_at_start"] == 1, "attached before the workload ran")
        for i in range(2):
            raw = read_raw(base + "/debug/pprof/heap")
            c.equal(raw["types"], ["alloc_objects", "alloc_space", "inuse_objects",
                                   "inuse_space"], f"fetch {i + 1}: Go's four heap sample types")
            check_estimates(c, truth, raw, INTERVAL)
            c.check(all(l.get("pid") == str(w.pid) for l in raw["labels"]),
                    f"fetch {i + 1}: every sample labelled pid {w.pid}")
            served_keys = {k for l in raw["labels"] for k in l}
        top = pprof(base + "/debug/pprof/heap", "-top")
        print(top)
        status, body, _ = fetch(base + "/debug/pprof/allocs")
        allocs = profile_of(body, scratch)
        c.equal((status, allocs["default"]), (200, "alloc_space"), "/allocs: alloc_space first")
        status, body, _ = fetch(base + "/debug/pprof/heap")
        c.equal(profile_of(body, scratch)["default"], "inuse_space", "/heap: inuse_space first")

        t.join()  # (the fetches above were made while it waited)
        status, body, _ = delta["r"]
        c.equal(status, 200, "the delta profile's status")
        d = profile_of(body, scratch)
        c.equal(d["default"], "alloc_space", "the delta of /allocs: alloc_space first")
        k = d["types"].index("alloc_space")
        per = {}
        for names, values, _ in d["samples"]:
            site = next((n for n in names if n.startswith("site_")), "?")
            per[site] = per.get(site, 0) + values[k]
        sd = math.sqrt(sum(sigma(truth["size"], s, "alloc_count", INTERVAL) ** 2 for s in SITES))
        within(c, sum(per.values()), truth["total"]["alloc_bytes"], sd,
               "the delta's alloc_space: the whole run, which it spans")
        # A delta over the linger, when nothing is allocated: every value
        # of every stack is now minus then, exactly zero.
        status, body, _ = fetch(base + "/debug/pprof/heap?seconds=1")
        idle = profile_of(body, scratch)
        c.equal((status, sorted({v for _, values, _ in idle["samples"] for v in values})),
                (200, [0]), "a delta over an idle second: every value 0")

        for path, want in [("/debug/pprof/", 200), ("/debug/pprof/nothing", 404), ("/", 404),
                           ("/debug/pprof/heap?seconds=0", 400),
                           ("/debug/pprof/heap?seconds=301", 400),
                           ("/debug/pprof/heap?seconds=x", 400),
                           ("/debug/pprof/heap/../../../etc/passwd", 404)]:
            c.equal(fetch(base + path)[0], want, f"GET {path}")
        req = urllib.request.Request(base + "/debug/pprof/heap", data=b"x", method="POST")
        try:
            code = urllib.request.urlopen(req, timeout=30).status
        except urllib.error.HTTPError as e:
            code = e.code
        c.equal(code, 405, "POST")
        # -- CMD: served on after the command's end (the workload itself:
        # stopped at its exec, so attached before it runs; a process it
        # started would race its own exec); then a command that fails:
        # its status is ddheap-prof's once stopped.
        for cmd, rc in [([workload, "--rounds=100", f"--seed={SEED}"], 0),
                        (["sh", "-c", "exit 3"], 3)]:
            q = Prof(prof, ["--http", "127.0.0.1:0", "--"] + cmd,
                     env={"DD_HEAP_SAMPLING_INTERVAL": str(INTERVAL)}, stdout=subprocess.DEVNULL)
            try:
                qbase = serving_url(q)
                q.wait_for("has ended; its profile is served")
                if rc == 0:
                    raw = read_raw(qbase + "/debug/pprof/allocs")
                    c.check(len(raw["samples"]) > 0, "-- CMD: its profile served after its end")
                c.equal(q.finish(signal.SIGTERM), rc,
                        f"-- {' '.join(cmd[-2:])}: exit code (the command's) once stopped")
            finally:
                q.kill()
        c.check(not os.path.exists("ddheap-prof.pb.gz"),
                "-- CMD with --http: no file written unless asked for")

        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        bad = [(["--http", "127.0.0.1:x"], 2, "--http needs PORT"),
               (["--http", "1.2.3:80"], 2, "--http needs PORT"),
               (["--http", "70000"], 2, "--http needs PORT"),
               (["--http", str(taken.getsockname()[1])], 1, "cannot listen there"),
               (["--only", "*"], 2, "--only chooses among the processes of --all"),
               (["--all", "--http", "0"], 2, "no -p PID or -- CMD with it")]
        for args, rc, message in bad:
            full = args + (["-p", str(w.pid)] if rc == 1 or "--all" in args else
                           ["--", "true"])
            r = subprocess.run([prof] + full, capture_output=True, text=True, timeout=60)
            c.check(r.returncode == rc and message in r.stderr,
                    f"ddheap-prof {' '.join(full)}: exit {r.returncode} (want {rc}), "
                    f"says {message!r}: {r.stderr.strip()[:120]!r}")
        taken.close()
        c.equal(p.finish(signal.SIGINT), 0, "ddheap-prof's exit code after SIGINT")
        file_keys = {k for l in read_raw(pb)["labels"] for k in l}
        c.check("pid" in served_keys and served_keys - {"lifetime"} == file_keys - {"lifetime"},
                f"the served samples' labels are the file's: {sorted(served_keys)}, "
                f"{sorted(file_keys)} (lifetime: where blocks were freed)")
        c.equal(w.exit(), 0, "workload exit code")
    finally:
        w.kill()
        if p:
            p.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def hold(ip, port, n, payload=None):
    """n connections from source address ip, each sent payload (if any)
    and never read; returns those the server accepted."""
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that never reads
        try:
            s.bind((ip, 0))
            s.settimeout(5)
            s.connect(("127.0.0.1", port))
            if payload:
                s.sendall(payload)
            held.append(s)
        except OSError:
            s.close()
    return held


def answer_of(port, payload):
    """What the server answers to payload within 1 s (its status line;
    "(closed)" if it closes without one; what the socket says else: a
    request that never completes is held until the idle time-out, which
    the test does not wait for)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        try:
            s.sendall(payload)
            data = s.recv(200)
        except OSError as e:
            data = str(e).encode()
        line = data.split(b"\r\n", 1)[0].decode("latin-1") or "(closed)"
        return f"{line} after {time.monotonic() - t0:.3f} s"


def test_robust(c, prof, workload, artifacts, extra):
    """--max-stacks 4 keeps 4 and says so; 50 fetches at once, all valid
    profiles; then 300 idle connections
    (from 127.0.0.2-4: per client address under the limit), 20 half-sent
    requests, 20 clients that never read, garbage and an oversized header:
    a fetch from 127.0.0.1 made meanwhile is answered before the idle
    time-out, and ddheap-prof runs on."""
    w = start_workload(workload, SEED, ["--rounds=300"])
    p = None
    scratch = tempfile.mkdtemp(prefix="ddheap-fleet-")
    held, pending = [], None
    try:
        w.wait_line("workload: pid=")
        # (--max-stacks: the cap is checked here too, on the side.)
        p = Prof(prof, ["-p", str(w.pid), "--http", ":0", "--max-stacks", "4"])
        base = serving_url(p)
        port = int(base.rsplit(":", 1)[1])
        p.wait_for("ddheap-prof: profiling pid")
        w.send("go")
        w.wait_line("workload: lingering")
        status, body, _ = fetch(base + "/debug/pprof/heap")
        capped = profile_of(body, scratch)
        stacks = {tuple(names) for names, _, _ in capped["samples"]}
        dropped = [x for x in capped["comments"] if "DROPPED" in x]
        c.check(len(stacks) <= 4 and dropped and "a cap is reached" in p.text(),
                f"--max-stacks 4: {len(stacks)} stacks, said in the profile ({dropped}) "
                "and on stderr")

        results = [None] * 50
        start = threading.Barrier(50)

        def one(i):
            start.wait()
            results[i] = fetch(base + "/debug/pprof/heap")
        threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        good = 0
        for status, body, _ in results:
            if status == 200:
                prof_ = profile_of(body, scratch)
                good += len(prof_["types"]) == 4 and len(prof_["samples"]) > 0
        slowest = max(r[2] for r in results)
        c.equal(good, 50, f"50 concurrent fetches, valid profiles (slowest {slowest:.3f} s)")

        # A delta request is suspended, not waited for: a fetch made while
        # one is pending is answered; the pending one is still pending when
        # ddheap-prof is stopped at the end (its connection then closed).
        pending = socket.create_connection(("127.0.0.1", port), timeout=5)
        pending.sendall(b"GET /debug/pprof/heap?seconds=300 HTTP/1.1\r\nHost: a\r\n\r\n")
        status, _, took = fetch(base + "/debug/pprof/heap", timeout=IDLE_TIMEOUT - 2)
        pending.setblocking(False)
        try:
            early = pending.recv(100)
        except BlockingIOError:
            early = None
        c.check(status == 200 and early is None,
                f"a fetch while a 300 s delta is pending: {status} in {took:.3f} s; "
                f"the delta unanswered ({early!r})")

        # Delta requests hold memory until their end: 16 at once, more 503.
        deltas = [None] * 20
        def delta(i):
            deltas[i] = fetch(base + "/debug/pprof/heap?seconds=2")[0]
        threads = [threading.Thread(target=delta, args=(i,)) for i in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c.equal(sorted(deltas), [200] * 15 + [503] * 5,
                "20 delta requests at once (with the one pending: 16 in all)")

        for i, ip in enumerate(["127.0.0.2", "127.0.0.3", "127.0.0.4"]):
            held += hold(ip, port, 100)
        idle = len(held)
        half = hold("127.0.0.5", port, 20, b"GET /debug/pprof/heap HTTP/1.1\r\nHost: a\r\n")
        never = hold("127.0.0.6", port, 20, b"GET /debug/pprof/heap HTTP/1.1\r\nHost: a\r\n\r\n" * 8)
        held += half + never
        garbage = [os.urandom(2048), b"\x00" * 100 + b"\r\n\r\n", b"GET\r\n\r\n",
                   b"GET /debug/pprof/heap HTTP/9.9\r\n\r\n",
                   b"GET /debug/pprof/heap HTTP/1.1\r\nHost: a\r\nX: " + b"a" * 65536 + b"\r\n\r\n",
                   b"GET /" + b"a" * 40000 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
                   b"GET /debug/pprof/heap HTTP/1.1\r\nContent-Length: 99999999\r\n\r\nxx"]
        answers = [answer_of(port, g) for g in garbage]
        print("answers to the bad requests:", answers)
        c.check(all(not a.startswith("HTTP/1.1 200") for a in answers),
                "no bad request answered 200")
        status, body, took = fetch(base + "/debug/pprof/heap", timeout=IDLE_TIMEOUT - 2)
        print(f"held {idle} idle, {len(half)} half-sent, {len(never)} never-read connections; "
              f"sent {len(garbage)} bad requests; a fetch meanwhile took {took:.3f} s")
        c.equal(status, 200, f"a fetch with {len(held)} connections held (took {took:.3f} s)")
        c.check(len(profile_of(body, scratch)["samples"]) > 0, "and a valid profile")
        c.check(idle >= 300, f"the idle connections were accepted ({idle} of 300)")
        c.check(p.proc.poll() is None, "ddheap-prof still running")
        for s in held:
            s.close()
        held = []
        c.equal(fetch(base + "/debug/pprof/heap")[0], 200, "a fetch once they are closed")
        c.equal(p.finish(signal.SIGTERM), 0,
                "ddheap-prof's exit code after SIGTERM, a delta still pending")
        c.equal(w.exit(), 0, "workload exit code")
    finally:
        for s in held + ([pending] if pending else []):
            s.close()
        w.kill()
        if p:
            p.kill()
        shutil.rmtree(scratch, ignore_errors=True)


def text_pages(pid):
    """{mapping: Anonymous kB} of the process's executable file mappings:
    a uprobe's breakpoint makes its page a private copy (anonymous)."""
    out, current = {}, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                current = line.strip() if len(parts) >= 6 and "x" in parts[1] else None
            elif current and parts[0] == "Anonymous:":
                out[current] = int(parts[1])
    return out


def test_all(c, prof, workload, artifacts, extra):
    """--all --only DIR/*: two workloads (copies in DIR) started before the
    agent and one after, all three found and in the served profile, each
    within 5 sigma of its own truth; the third's exit drops its live
    blocks. A program without ddheap (DIR/prof-fleet-dlopen) found when it
    dlopens a library that has it, not before, and its blocks counted
    exactly (sampling interval 1). Left alone: a program without ddheap in DIR (a copy of sleep),
    never profiled, its code pages unchanged; and the same workload file
    run through a hard link outside DIR (the same inode, so a uprobe on
    the file for every process would reach it): its probes' semaphores
    never raised, no block marked."""
    dlopener, plugin = extra  # the EXTRA of tests/prof/meson.build
    scratch = tempfile.mkdtemp(prefix="ddheap-fleet-")
    base_dir = os.path.join(artifacts, "fleet-all")
    shutil.rmtree(base_dir, ignore_errors=True)
    progs, outside = os.path.join(base_dir, "in"), os.path.join(base_dir, "out")
    os.makedirs(progs)
    os.makedirs(outside)
    wl = os.path.join(progs, "fleet-workload")
    shutil.copy(workload, wl)
    wl_outside = os.path.join(outside, "fleet-workload")
    os.link(wl, wl_outside)
    sleeper = os.path.join(progs, "fleet-sleep")
    shutil.copy(shutil.which("sleep"), sleeper)
    dl = os.path.join(progs, "prof-fleet-dlopen")
    shutil.copy(dlopener, dl)
    ws, p, plain, excluded, late_dl = [], None, None, None, None
    try:
        plain = subprocess.Popen([sleeper, "600"])
        late_dl = Workload(dl, [os.path.abspath(plugin), "300"], {"DD_HEAP_SAMPLING_INTERVAL": "1"})
        late_dl.wait_line("fleet-dlopen: ready")
        excluded = start_workload(wl_outside, SEED + "9")
        ws = [start_workload(wl, SEED + str(i)) for i in range(2)]
        for w in ws + [excluded]:
            w.wait_line("workload: pid=")
        time.sleep(0.2)  # the sleeper's loader is done
        before = text_pages(plain.pid)
        p = Prof(prof, ["--all", "--only", progs + "/*", "--http", "127.0.0.1:0",
                        "--ringbuf-kb", "131072"])
        base = serving_url(p)
        for w in ws:
            p.wait_for(f"ddheap-prof: profiling pid {w.pid} ")
        late = start_workload(wl, SEED + "2")
        ws.append(late)
        late.wait_line("workload: pid=")
        p.wait_for(f"ddheap-prof: profiling pid {late.pid} ")
        c.check(f"profiling pid {late_dl.pid} " not in p.text(),
                "the program without ddheap: not profiled before its dlopen")
        late_dl.send("load")
        late_dl.wait_line("fleet-dlopen: loaded")
        t0 = time.monotonic()
        p.wait_for(f"ddheap-prof: profiling pid {late_dl.pid} ", timeout=30)
        print(f"found {time.monotonic() - t0:.2f} s after its dlopen")
        late_dl.send("work")
        late_dl.wait_line("fleet-dlopen: worked ok")
        # One after another: three at once would outrun the ring buffer
        # on a loaded 2-core machine (each event carries a stack copy).
        for w in ws + [excluded]:
            w.send("go")
            w.wait_line("workload: lingering")
        raw = read_raw(base + "/debug/pprof/heap")
        print("\n".join(raw["comments"]))
        pids = {l.get("pid") for l in raw["labels"]}
        c.equal(pids, {str(w.pid) for w in ws + [late_dl]},
                "the pid labels: the three workloads and the program that dlopened ddheap")
        k = raw["types"].index("inuse_space")
        plugin_live = sum(v[k] for (v, ids), l in zip(raw["samples"], raw["labels"])
                          if l.get("pid") == str(late_dl.pid) and any(
                              "site_plugin_blocks" in f for i in ids
                              for f in raw["locs"][i]["functions"]))
        c.equal(plugin_live, 300 * 1000, "its live blocks after the dlopen (interval 1: exact)")
        for w in ws:
            print(f"pid {w.pid}:")
            truth = harness.parse_truth(w.lines)
            c.check(truth["check"]["marked_max"] > 0, f"pid {w.pid}: its blocks were marked")
            idx = [i for i, l in enumerate(raw["labels"]) if l.get("pid") == str(w.pid)]
            one = dict(raw, samples=[raw["samples"][i] for i in idx],
                       labels=[raw["labels"][i] for i in idx])
            check_estimates(c, truth, one, INTERVAL)
        truth = harness.parse_truth(excluded.lines)
        c.equal((truth["check"]["attached_at_start"], truth["check"]["marked_max"]), (0, 0),
                "the workload outside --only (same file): attached at start, blocks marked")
        c.check(f"pid {plain.pid} " not in p.text() and str(plain.pid) not in pids,
                "the program without ddheap was not profiled")
        # (Its loader's pages are left out: a profiler run elsewhere on the
        # host that hooks the loader for every process would change them.)
        after = text_pages(plain.pid)
        changed = {m: (before.get(m), kb) for m, kb in after.items()
                   if before.get(m) != kb and "/ld-linux" not in m}
        c.equal(changed, {}, "its code mappings' anonymous kB (a breakpoint copies a page; "
                "a hit one adds [uprobes]) changed since the agent started")
        c.equal(late.exit(), 0, "the late workload's exit code")
        # Its exit dropped its live blocks once its events were read.
        deadline = time.monotonic() + 30
        while True:
            raw = read_raw(base + "/debug/pprof/heap")
            k = raw["types"].index("inuse_space")
            live = sum(v[k] for (v, _), l in zip(raw["samples"], raw["labels"])
                       if l.get("pid") == str(late.pid))
            if live == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        c.equal(live, 0, "an exited process's inuse_space")
        c.equal(p.finish(signal.SIGINT), 0, "ddheap-prof's exit code after SIGINT")
        for w in ws[:2] + [excluded, late_dl]:
            c.equal(w.exit(), 0, "workload exit code")
    finally:
        for w in ws + [x for x in (excluded, late_dl) if x]:
            w.kill()
        if p:
            p.kill()
        if plain:
            plain.kill()
            plain.wait()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(base_dir, ignore_errors=True)


TESTS = {"http": test_http, "robust": test_robust, "all": test_all}


if __name__ == "__main__":
    sys.exit(harness.run_prof_test(__doc__, TESTS, 3, extra=True,
                                   programs={"go": "golang-go"}))

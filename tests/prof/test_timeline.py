#!/usr/bin/env python3
"""ddheap-prof's views of the heap over time, against a program with a
known history (timeline.c, which prints its own truth): the peak profile
(--peak), the snapshots (--every), lifetimes per site (the pprof label and
--report), the leak ranking, and the flame graphs of the end and of the
peak in headless chromium.

    test_timeline.py TEST DDHEAP_PROF TIMELINE ARTIFACT_DIR

TEST is 'timeline' (the program keeps its cache and its leak) or
'timeline-free' (it frees everything; then one that allocates nothing).
Needs root (BPF); exits 77 only when not root, and fails when go or
chromium is missing. Profiles are decoded exactly (pprof_read.read_samples), and
read back with `go tool pprof` where what matters is what a user sees.
"""

import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from harness import Failure, need, run_prof_test
from pprof_read import pprof, read_samples

TIMEOUT = 120
PERIOD_MS = 500
INTERVAL = 8192
ENV = {"DD_HEAP_SAMPLING_INTERVAL": str(INTERVAL), "DD_HEAP_SAMPLES_PER_SECOND": "0"}
SITES = ["site_cache", "site_peak", "site_leak", "site_short", "site_medium"]


# --- the profile, decoded -----------------------------------------------------

def decode(path):
    """{types, samples: [(site, values, labels)], comments}; a sample's site
    is the innermost function named site_* ('?' if none)."""
    prof = read_samples(path)
    prof["samples"] = [(next((n for n in names if n.startswith("site_")), "?"), values, labels)
                       for names, values, labels in prof["samples"]]
    return prof


def site_sums(prof, sample_type):
    k = prof["types"].index(sample_type)
    sums = {}
    for site, values, _ in prof["samples"]:
        sums[site] = sums.get(site, 0) + values[k]
    return sums


def check_labels(c, prof, what):
    """Every sample carries the pid label, the program's (the one process
    here); a sample with the lifetime label holds freed blocks (alloc_*
    only) and carries the pid too. Returns how many have a lifetime."""
    pid = next((int(m.group(1)) for m in (re.match(r"ddheap-prof: pid (\d+),", x)
                                          for x in prof["comments"]) if m), None)
    pids = {labels.get("pid") for _, _, labels in prof["samples"]}
    c.check(pid is not None and pids <= {pid},
            f"{what}: every sample's pid label is the program's "
            f"({len(prof['samples'])} samples: {pids}, pid {pid})")
    inuse = [prof["types"].index(t) for t in ("inuse_objects", "inuse_space")]
    freed = [values for _, values, labels in prof["samples"] if "lifetime" in labels]
    c.check(all(v[k] == 0 for v in freed for k in inuse),
            f"{what}: its {len(freed)} samples labelled lifetime hold no inuse_* value")
    return len(freed)


# --- the truth ---------------------------------------------------------------

def read_truth(path):
    t = {"size": {}, "phase": {}, "state": {}, "life": {}, "peak": None, "at": {}, "across": {},
         "end": None}
    with open(path) as f:
        for line in f:
            w = line.split()
            if w[0] == "size":
                t["size"][w[1]] = int(w[2])
            elif w[0] == "phase":
                t["phase"][int(w[1])] = (int(w[2]), int(w[3]))
            elif w[0] == "state":
                t["state"].setdefault(int(w[1]), {})[w[2]] = (int(w[3]), int(w[4]))
            elif w[0] == "life":
                t["life"].setdefault(w[1], {})[int(w[2])] = int(w[3])
            elif w[0] == "peak":
                t["peak"] = int(w[1])
            elif w[0] == "at":
                t["at"].setdefault(int(w[1]), {})[w[2]] = (int(w[3]), int(w[4]))
            elif w[0] == "across":
                t["across"].setdefault(int(w[1]), []).append((w[2], int(w[3])))
            elif w[0] == "end":
                t["end"] = int(w[1])
    return t


def state_at(truth, instant):
    """(counts, across): the block counts (live, allocated) per site at a
    CLOCK_MONOTONIC instant, from the program's record of every call, and
    the calls that ran across it [(site, +1|-1)], whose blocks may be on
    either side."""
    if instant > truth["end"]:
        return truth["at"][max(truth["at"])], []
    if instant < min(truth["at"]):
        return {s: (0, 0) for s in SITES}, []
    if instant not in truth["at"]:
        raise Failure(f"a snapshot at {instant}, not a multiple of the period during the run")
    return truth["at"][instant], truth["across"].get(instant, [])
def sd_of(count, size):
    """A site's summed weights for `count` blocks of `size` bytes:
    tests/lib/harness.py's sigma (each weighs size/p, p = 1 - e^(-size/R))."""
    p = -math.expm1(-size / INTERVAL)
    return math.sqrt(count * size * size * (1 - p) / p)


def check_state(c, prof, counts, truth, what, across=()):
    inuse = site_sums(prof, "inuse_space")
    alloc = site_sums(prof, "alloc_space")
    for site in SITES:
        size = truth["size"][site]
        live, allocated = counts[site]
        # A call running across the instant: its block may count or not.
        pending = [d for s, d in across if s == site]
        lives = {live + sum(d for d in pending if d < 0) * k + sum(d for d in pending if d > 0) * j
                 for k in (0, 1) for j in (0, 1)}
        allocs = {allocated + sum(d for d in pending if d > 0) * j for j in (0, 1)}
        for name, est, options in (("inuse_space", inuse.get(site, 0), lives),
                                   ("alloc_space", alloc.get(site, 0), allocs)):
            n = min(options, key=lambda x: abs(est - x * size))
            true, bound = n * size, 5 * sd_of(n, size)
            c.check(abs(est - true) <= bound,
                    f"{what}: {name} of {site}: estimated {est}, true {true}, "
                    f"|diff| {abs(est - true)} <= 5 sd = {bound:.0f}"
                    + (f" (calls across the instant: {pending})" if pending else ""))


# --- tools -------------------------------------------------------------------

def svg_in_chromium(c, svg, names, shot):
    """The SVG opens in headless chromium, its script runs (it marks the
    root element), it names each of `names`; a screenshot is kept."""
    need("chromium")
    with tempfile.TemporaryDirectory(prefix="ddheap-chromium-") as profile_dir:
        base = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                f"--user-data-dir={profile_dir}"]
        env = dict(os.environ, HOME=profile_dir)
        dom = subprocess.run(base + ["--dump-dom", "file://" + svg], capture_output=True,
                             text=True, timeout=TIMEOUT, env=env).stdout
        if os.path.exists(shot):
            os.unlink(shot)
        subprocess.run(base + [f"--screenshot={shot}", "--window-size=1200,700", "file://" + svg],
                       capture_output=True, text=True, timeout=TIMEOUT, env=env)
    c.check('data-ddheap-ready="' in dom, f"{os.path.basename(svg)}: its script ran in chromium")
    for name in names:
        c.check(f"<title>{name} (" in dom, f"{os.path.basename(svg)} names {name}")
    c.check(os.path.exists(shot) and os.path.getsize(shot) > 5000, f"screenshot kept at {shot}")
    return dom


def run(prof, artifacts, name, mode, args):
    """ddheap-prof ARGS -- prof-timeline TRUTH PERIOD MODE; returns
    (truth, stderr)."""
    truth_path = os.path.join(artifacts, f"{name}.truth")
    for f in os.listdir(artifacts):
        if f.startswith(name + ".") or f.startswith(name + "-"):
            os.unlink(os.path.join(artifacts, f))
    with tempfile.TemporaryFile(mode="w+") as err:
        r = subprocess.run([args[0]] + args[1:] + ["--", prof, truth_path, str(PERIOD_MS), mode],
                           stdout=subprocess.DEVNULL, stderr=err, timeout=TIMEOUT,
                           env=dict(os.environ, **ENV))
        err.seek(0)
        text = err.read()
    if r.returncode != 0:
        raise Failure(f"ddheap-prof exited with {r.returncode}:\n{text}")
    return read_truth(truth_path), text


def snapshot_instant(prof):
    for comment in prof["comments"]:
        m = re.search(r"snapshot \d+ at CLOCK_MONOTONIC (\d+) ns", comment)
        if m:
            return int(m.group(1))
    raise Failure(f"no snapshot instant among the comments {prof['comments']}")


# --- the tests ---------------------------------------------------------------

def report_sites(text):
    """From --report: {site: {"suspect": bool, "buckets": {k: sampled}}},
    summed over the stacks that name the site, and the suspects in rank
    order (the site_* each names)."""
    sites, ranked, current = {}, [], None
    section = None
    for line in text.splitlines():
        if line.startswith("LEAK SUSPECTS"):
            section = "leaks"
        elif line.startswith("SITES"):
            section = "sites"
        m = re.search(r"\b(site_\w+)", line)
        if section == "leaks" and line.startswith("#") and m:
            ranked.append(m.group(1))
        elif section == "sites" and m and not line.startswith(" "):
            current = sites.setdefault(m.group(1), {"suspect": False, "buckets": {}})
        elif section == "sites" and current is not None:
            if "LEAK SUSPECT" in line:
                current["suspect"] = True
            b = re.search(r"(\d+) sampled .*\[bucket (\d+)\]", line)
            if b:
                # A site reached through several stacks (two return
                # addresses in its caller) has a section for each: summed.
                k = int(b.group(2))
                current["buckets"][k] = current["buckets"].get(k, 0) + int(b.group(1))
    return sites, ranked


def test_timeline(c, prof, timeline, artifacts):
    """The program keeps its cache and leak to the end. Every --every
    snapshot and the peak profile within 5 sd of the truth per site; the
    leaking site first in the leak ranking, the cache not flagged;
    lifetimes in the program's log2 bucket for >= 90 % of freed samples;
    a flame graph per snapshot (--svg a pattern), in chromium."""
    out = os.path.join(artifacts, "tl.pb.gz")
    peak = os.path.join(artifacts, "tl-peak.pb.gz")
    report = os.path.join(artifacts, "tl-report.txt")
    svgs = os.path.join(artifacts, "tl.%04d.svg")
    truth, err = run(timeline, artifacts, "tl", "keep",
                     [prof, "-o", out, "--every", str(PERIOD_MS / 1000), "--peak", peak,
                      "--report", report, "--svg", svgs])

    snaps = sorted(f for f in os.listdir(artifacts) if re.fullmatch(r"tl\.\d{4}\.pb\.gz", f))
    c.check(len(snaps) >= 11, f"--every {PERIOD_MS / 1000}: {len(snaps)} snapshots ({snaps[:2]}...)")
    c.equal([int(f[3:7]) for f in snaps], list(range(1, len(snaps) + 1)), "snapshot numbers")
    states, with_lifetimes = [], 0
    for f in snaps:
        p = decode(os.path.join(artifacts, f))
        counts, across = state_at(truth, snapshot_instant(p))
        states.append(counts)
        check_state(c, p, counts, truth, f, across)
        with_lifetimes += check_labels(c, p, f) > 0
    c.check(with_lifetimes >= len(snaps) // 2,
            f"{with_lifetimes} of {len(snaps)} snapshots have samples with pid and lifetime labels")
    distinct = {tuple(sorted(s.items())) for s in states}
    c.check(len(distinct) >= 10, f"the snapshots saw {len(distinct)} distinct states")
    # Each readable alone, and as the base of the next: an interval where
    # site_peak grew by at least 256 blocks shows it first.
    grew = [i for i in range(1, len(snaps))
            if states[i]["site_peak"][0] - states[i - 1]["site_peak"][0] >= 256]
    if not grew:
        raise Failure("no interval between two snapshots where site_peak grew")
    i = grew[0]
    top = pprof(os.path.join(artifacts, snaps[i]), "-top", "-cum", "-sample_index=inuse_space",
                "-base", os.path.join(artifacts, snaps[i - 1]))
    first_site = re.search(r"\b(site_\w+)$", top, re.M)
    c.check(first_site is not None and first_site.group(1) == "site_peak",
            f"go tool pprof -base {snaps[i - 1]} {snaps[i]}: the interval's growth is site_peak's "
            f"({first_site.group(0) if first_site else top[-300:]})")

    p = decode(peak)
    check_state(c, p, truth["state"][truth["peak"]], truth, "the peak profile")
    c.check(any("the peak:" in x for x in p["comments"]), "the peak profile says it is the peak")
    c.equal(check_labels(c, p, "the peak profile"), 0,
            "the peak profile: no lifetime label (its freed blocks are in alloc_*)")
    c.check("wrote " + peak in err and "the peak:" in err, "stderr names the peak profile")

    with open(report) as f:
        text = f.read()
    sites, ranked = report_sites(text)
    c.check(ranked[:1] == ["site_leak"], f"leak ranking: site_leak first ({ranked})")
    c.check("site_cache" not in ranked and not sites.get("site_cache", {}).get("suspect", True),
            "leak ranking: site_cache (filled once, kept) not flagged")
    for site in ["site_leak", "site_peak", "site_short", "site_medium"]:
        true = truth["life"].get(site, {})
        got = sites.get(site, {}).get("buckets", {})
        nt, ng = sum(true.values()), sum(got.values())
        if not nt or not ng:
            c.check(False, f"{site}: lifetimes (truth {true}, report {got})")
            continue
        # The share of sampled frees in the program's bucket, summed over
        # buckets the program's blocks fell into (in proportion).
        right = sum(min(got.get(k, 0) / ng, n / nt) for k, n in true.items())
        c.check(right >= 0.9, f"{site}: {right:.1%} of {ng} freed samples in the right log2 "
                              f"bucket (truth {true}, sampled {got})")
    # What go tool pprof shows: the lifetime label, in time units.
    tags = pprof(out, "-tags", "-sample_index=alloc_space")
    c.check(re.search(r"lifetime: Total", tags) is not None and "131.07us" in tags
            and "8.39ms" in tags,
            "go tool pprof -tags shows the lifetime label (131.07us for site_short, "
            "8.39ms for site_medium)")
    final = decode(out)
    check_labels(c, final, "the final profile")
    lab = {}
    for site, values, labels in final["samples"]:
        if "lifetime" in labels:
            lab.setdefault(site, set()).add(labels["lifetime"])
    c.check(131072 in lab.get("site_short", set()) and 8388608 in lab.get("site_medium", set()),
            f"lifetime labels in nanoseconds per site ({ {s: sorted(v) for s, v in lab.items()} })")

    # --svg as a pattern: a flame graph with each snapshot. The one after
    # a growth step shows site_peak; the last one (the end) does not.
    c.equal(sorted(f for f in os.listdir(artifacts) if re.fullmatch(r"tl\.\d{4}\.svg", f)),
            [f.replace(".pb.gz", ".svg") for f in snaps], "a flame graph per snapshot")
    svg_in_chromium(c, svgs % (i + 1), ["site_peak", "site_cache", "site_leak"],
                    os.path.join(artifacts, "tl-growth.png"))
    dom = svg_in_chromium(c, svgs % len(snaps), ["site_cache", "site_leak"],
                          os.path.join(artifacts, "tl-end.png"))
    c.check("site_peak (" not in dom, "the end's flame graph: site_peak freed, not shown")


def test_timeline_free(c, prof, timeline, artifacts):
    """The program frees everything: the default flame graph is the peak
    and its title says so; the final profile says why it is empty;
    --max-files keeps the newest snapshots. SIGUSR1 writes a snapshot.
    Then a program that allocates nothing: the SVG and the profile say so."""
    out = os.path.join(artifacts, "tf.pb.gz")
    svg = os.path.join(artifacts, "tf.svg")
    truth, err = run(timeline, artifacts, "tf", "free",
                     [prof, "-o", out, "--svg", svg, "--every", str(PERIOD_MS / 1000),
                      "--max-files", "3"])
    with open(svg) as f:
        text = f.read()
    c.check("inuse_space at the peak" in text and "freed everything by its end" in text,
            "the SVG's title: the peak, and that everything was freed")
    c.check("flame graph shows the heap at its peak" in err, "stderr: the SVG shows the peak")
    svg_in_chromium(c, svg, ["site_peak", "site_cache", "site_leak"],
                    os.path.join(artifacts, "tf-peak.png"))
    p = decode(out)
    c.check(any("nothing to show: every sampled block" in x and "--peak" in x
                for x in p["comments"]),
            f"the empty profile says why in a comment ({p['comments'][-1]!r})")
    c.check(re.search(r"inuse_space.* is empty: nothing to show: every sampled block", err),
            "stderr says why the profile is empty")
    check_state(c, p, truth["state"][10], truth, "the end")
    snaps = sorted(f for f in os.listdir(artifacts) if re.fullmatch(r"tf\.\d{4}\.pb\.gz", f))
    c.check(len(snaps) == 3 and int(snaps[-1][3:7]) >= 11,
            f"--max-files 3: the newest 3 snapshots kept ({snaps})")

    # SIGUSR1: a numbered snapshot at once, without --every.
    out = os.path.join(artifacts, "ts.pb.gz")
    for f in os.listdir(artifacts):
        if f.startswith("ts."):
            os.unlink(os.path.join(artifacts, f))
    with tempfile.NamedTemporaryFile(mode="w+") as err:
        text = lambda: open(err.name).read()  # noqa: E731
        proc = subprocess.Popen([prof, "-o", out, "--", timeline,
                                 os.path.join(artifacts, "ts.truth"), "100", "keep"],
                                stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ, **ENV))
        try:
            deadline = time.monotonic() + TIMEOUT
            while "profiling pid" not in text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise Failure("ddheap-prof did not start profiling:\n" + text())
                time.sleep(0.01)
            proc.send_signal(signal.SIGUSR1)
            rc = proc.wait(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    numbered = sorted(f for f in os.listdir(artifacts) if re.fullmatch(r"ts\.\d{4}\.pb\.gz", f))
    c.check(rc == 0 and numbered == ["ts.0001.pb.gz"],
            f"SIGUSR1 wrote one numbered snapshot ({numbered}, exit {rc})")
    if numbered:
        snap = decode(os.path.join(artifacts, numbered[0]))
        c.check(any(x.startswith("ddheap-prof: snapshot 1 at") for x in snap["comments"]),
                "its comments say snapshot 1 and its instant")

    none_svg = os.path.join(artifacts, "tn.svg")
    none_out = os.path.join(artifacts, "tn.pb.gz")
    _, err = run(timeline, artifacts, "tn", "none", [prof, "-o", none_out, "--svg", none_svg])
    with open(none_svg) as f:
        text = f.read()
    c.check("nothing to show: no sampled allocation was seen" in text,
            "an empty SVG says why in its title")
    c.check(re.search(r"is empty: nothing to show: no sampled allocation", err), "and on stderr")
    c.check(any("no sampled allocation was seen" in x for x in decode(none_out)["comments"]),
            "and in the profile's comments")


TESTS = {"timeline": test_timeline, "timeline-free": test_timeline_free}


if __name__ == "__main__":
    sys.exit(run_prof_test(__doc__, TESTS, 3))

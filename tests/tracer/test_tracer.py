#!/usr/bin/env python3
"""The tracer suite: a real bpftrace attached to the real example workload,
checked against the workload's own ground truth.

    test_tracer.py TEST WORKLOAD TOOLS_DIR

TEST is one of: no_tracer, exact, sampled, detach, events, live_full, live_seeds,
stacks (one meson test each; stacks runs tests/tracer/stack_sites.c as WORKLOAD).
Needs root (bpftrace); exits 77 (skipped) only when not root, and fails when
root but bpftrace is missing. Ends with "N passed, N failed".
"""

import math
import os
import subprocess
import sys
import time

import harness
from harness import SITES, Failure, Workload, sigma

HERE = os.path.dirname(os.path.abspath(__file__))


def all_equal(c, values, want, what):
    c.check(values and all(v == want for v in values.values()),
            f"{what}: {sorted(values.items())} all == {want}")


def test_no_tracer(c, workload, tools):
    """No tracer: semaphores read 0 from outside, and with the interval at
    1 byte (every allocation would be sampled if sampling ran) no block is
    ever marked, before, during or after the workload's allocations."""
    with Workload(workload, ["--threads=2", "--rounds=50", "--pre=100", "--go", "--hold=stdin"],
                  {"DD_HEAP_SAMPLING_INTERVAL": "1"}) as w:
        w.wait_line("workload: pid=")
        all_equal(c, harness.read_semaphores(w.pid, workload), 0, "semaphores before the run")
        w.send("go")
        held = w.wait_line("workload: holding")
        all_equal(c, harness.read_semaphores(w.pid, workload), 0, "semaphores after the run")
        truth = harness.parse_truth(w.lines)
        c.equal(truth["check"]["attached_at_start"], 0, "dd_heap_profiler_attached() at start")
        c.equal(truth["check"]["marked_max"], 0, "most marked blocks seen live by any worker")
        c.equal(held, "workload: holding marked=0", "marked blocks while holding")
        w.send("release")
        c.equal(w.wait_line("workload: freed"), "workload: freed marked=0 corrupt=0 attached=0",
                "after freeing everything")
        c.equal(w.finish(), 0, "workload exit code")


def test_exact(c, workload, tools):
    """R = 1: every allocation reported with weight = size, every free
    matches a live reported block, per call site and size the counts equal
    the truth, the probe arguments sit in rdi/rsi/rdx/rcx, and the
    otel_memory provider carries the same stream."""
    with Workload(workload, ["--threads=2", "--rounds=40", "--pre=50", "--go", "--hold=stdin",
                             "--linger=stdin"], {"DD_HEAP_SAMPLING_INTERVAL": "1"}) as w:
        w.wait_line("workload: pid=")
        t = w.attach(os.path.join(HERE, "exact.bt"), [workload], "READY")
        w.send("go")
        w.wait_line("workload: holding")
        # Exactly the probes exact.bt attaches have their semaphore raised.
        sem = harness.read_semaphores(w.pid, workload)
        want = {k: 0 if k == ("otel_memory", "realloc") else 1 for k in sem}
        c.equal(sem, want, "semaphores while attached")
        w.send("release")  # frees every kept block, pre-attach ones included
        c.equal(w.wait_line("workload: freed"), "workload: freed marked=0 corrupt=0 attached=1",
                "after freeing everything with the tracer attached")
        w.wait_line("workload: lingering")
        out = t.stop()
        c.equal(w.exit(), 0, "workload exit code")

    truth = harness.parse_truth(w.lines)
    r = harness.results(out)
    if not c.check(r["allocs"] > 0, "bpftrace printed its counters"):
        print(out)
        return
    n_alloc = sum(s["alloc_count"] for s in truth["site"].values())
    n_realloc = sum(v["alloc_count"] for (site, size), v in truth["size"].items()
                    if site == "site_grow_log" and size > 256)
    c.equal(truth["check"]["attached_at_start"], 1, "tracer attached when the workload started")
    c.equal(r["allocs"], n_alloc, "alloc events = allocations")
    c.equal(r["alloc_bytes"], truth["total"]["alloc_bytes"], "sum of sizes = bytes allocated")
    c.equal(r["weight_not_size"], 0, "events whose weight != size")
    c.equal(r["frees"], n_alloc, "free events = allocations (all freed, pre-attach not reported)")
    c.equal(r["unmatched_free"], 0, "frees without a prior alloc of the same pointer")
    c.equal(r["alloc_of_live_ptr"], 0, "allocs of a pointer still live in the stream")
    c.equal(r["freed_bytes"], r["alloc_bytes"], "bytes of matched frees = bytes allocated")
    c.equal(r["reallocs"], n_realloc, "realloc events = reallocs")
    c.equal(r["realloc_inconsistent"], 0, "realloc events disagreeing with alloc/free")
    c.equal(r["reg_mismatch"], 0, "probe arguments not in rdi/rsi/rdx/rcx")
    c.equal(r["reg_checked"], r["allocs"] + r["frees"] + r["reallocs"], "events checked")
    c.equal((r["otel_allocs"], r["otel_alloc_bytes"], r["otel_frees"]),
            (r["allocs"], r["alloc_bytes"], r["frees"]), "otel_memory stream = ddheap stream")

    seen = {}
    unattributed = 0
    for frames, size, count in harness.parse_maps(out).get("by_stack_size", []):
        site = harness.site_of(frames)
        if site is None:
            unattributed += count
            continue
        key = (site, int(size))
        seen[key] = seen.get(key, 0) + count
    c.equal(unattributed, 0, "alloc events whose stack names no call site")
    want = {k: v["alloc_count"] for k, v in truth["size"].items()}
    c.check(seen == want, f"alloc events per (call site, size) = truth "
                          f"({len(want)} pairs; differing: "
                          f"{sorted(set(seen.items()) ^ set(want.items()))[:6]})")


def per_site(maps, name):
    sums = {}
    for frames, _, value in maps.get(name, []):
        site = harness.site_of(frames) or "?"
        sums[site] = sums.get(site, 0) + value
    return sums


def test_sampled(c, workload, tools):
    """R = 64 KiB over ~512 MiB: the shipped scripts' estimates (summed
    weights) are within 5 standard deviations of the true bytes, overall
    and per call site, allocated and live at the end; the top site by
    estimated bytes is the one that truly allocates most. Seeds are fixed,
    so a run is repeatable; 5 sigma is exceeded by chance with
    probability < 1e-6 per check."""
    interval = 65536
    with Workload(workload, ["--threads=2", "--rounds=2000", "--seed=20261129", "--go",
                             "--linger=stdin"], {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}) as w:
        w.wait_line("workload: pid=")
        # Both scripts at once: attaches nest (the semaphore counts 2).
        tracers = [w.attach(os.path.join(tools, f"ddheap-{kind}.bt"), [workload])
                   for kind in ("alloc", "live")]
        for kind, t in zip(("alloc", "live"), tracers):
            t.wait_ready(f"ddheap-{kind}: tracing")
        # The kernel counts installed breakpoints, not tracers: 1 for both.
        sem = harness.read_semaphores(w.pid, workload)
        c.equal(sem[("ddheap", "alloc")], 1, "alloc semaphore with two tracers attached")
        w.send("go")
        w.wait_line("workload: lingering")
        outs = [tracers[0].stop()]
        # One tracer left: the other still holds the probe, sampling goes on.
        sem = harness.read_semaphores(w.pid, workload)
        c.equal(sem[("ddheap", "alloc")], 1, "alloc semaphore after one of two tracers left")
        outs.append(tracers[1].stop())
        c.equal(w.exit(), 0, "workload exit code (contents checked)")

    truth = harness.parse_truth(w.lines)
    alloc = per_site(harness.parse_maps(outs[0]), "bytes")
    live = per_site(harness.parse_maps(outs[1]), "live_bytes")
    c.equal(alloc.get("?", 0), 0, "estimated bytes whose stack names no call site")

    def within(est, true, sd, what):
        bound = 5 * sd
        c.check(abs(est - true) <= bound,
                f"{what}: estimated {est}, true {true}, |diff| {abs(est - true)} "
                f"<= 5 sigma = {bound:.0f} ({100 * bound / max(true, 1):.1f}%)")

    total_sd = math.sqrt(sum(sigma(truth["size"], s, "alloc_count", interval) ** 2 for s in SITES))
    within(sum(alloc.values()), truth["total"]["alloc_bytes"], total_sd, "bytes allocated, all sites")
    for site in SITES:
        within(alloc.get(site, 0), truth["site"][site]["alloc_bytes"],
               sigma(truth["size"], site, "alloc_count", interval), f"bytes allocated by {site}")
    live_sd = math.sqrt(sum(sigma(truth["size"], s, "live_count", interval) ** 2 for s in SITES))
    within(sum(v for k, v in live.items()), truth["total"]["live_bytes"], live_sd,
           "bytes live at the end, all sites")
    for site in SITES:
        if truth["site"][site]["live_bytes"] or live.get(site):
            within(live.get(site, 0), truth["site"][site]["live_bytes"],
                   sigma(truth["size"], site, "live_count", interval), f"bytes live from {site}")

    true_top = max(SITES, key=lambda s: truth["site"][s]["alloc_bytes"])
    est_top = max(alloc, key=alloc.get)
    c.equal(est_top, true_top, "top site of the allocation profile")

    # The folded output of the same profile carries the same per-site sums.
    folded = subprocess.run([os.path.join(tools, "ddheap-fold")], input=outs[0], text=True,
                            capture_output=True, check=True).stdout
    fsums = {}
    for line in folded.splitlines():
        stack, _, value = line.rpartition(" ")
        site = next((f for f in stack.split(";") if f.startswith("site_")), "?")
        fsums[site] = fsums.get(site, 0) + int(value)
    c.equal(fsums, alloc, "ddheap-fold per-site sums = the profile's")


def test_detach(c, workload, tools):
    """Attach after the program allocated, detach while sampled blocks are
    live, keep freeing: every block (pre-attach, sampled, unsampled) is
    freed after the detach with its contents checked, every marked block
    is recognised (the process-wide count of marked blocks returns to 0)
    and nothing crashes. The tracer's count of live sampled blocks equals
    the process's own count of marked blocks at the moment of the detach.
    A second tracer checks the probe argument registers of both providers
    while sizes and weights differ."""
    with Workload(workload, ["--threads=2", "--rounds=300", "--pre=2000", "--go",
                             "--hold=detach"], {"DD_HEAP_SAMPLING_INTERVAL": "4096"}) as w:
        w.wait_line("workload: pid=")  # the --pre blocks are allocated by now
        t = w.attach(os.path.join(tools, "ddheap-live.bt"), [workload])
        regs = w.attach(os.path.join(HERE, "regs.bt"), [workload])
        t.wait_ready("ddheap-live: tracing")
        regs.wait_ready("READY")
        w.send("go")
        held = w.wait_line("workload: holding")
        marked = int(held.split("marked=")[1])
        c.check(marked > 100, f"sampled blocks live at the detach: {marked} > 100")
        regs_out = regs.stop()
        out = t.stop()  # detaches; the workload sees it and frees everything
        c.equal(w.wait_line("workload: freed"), "workload: freed marked=0 corrupt=0 attached=0",
                "after freeing everything with no tracer")
        c.equal(w.finish(), 0, "workload exit code")
        all_gone = "ERROR" not in w.stderr and "dd_slab" not in w.stderr
        c.check(all_gone, f"no allocator complaint on stderr: {w.stderr.strip()!r}")
    r = harness.results(regs_out)
    c.check(r["size_differs_from_weight"] > 100 and r["realloc_checked"] > 100,
            f"register check saw alloc events with size != weight ({r['size_differs_from_weight']})"
            f" and realloc events ({r['realloc_checked']})")
    c.equal(r["mismatch"], 0, f"probe arguments not in rdi/rsi/rdx/rcx (of {r['checked']} events)")
    c.equal(harness.results(out)["total_live_blocks"], marked,
            "tracer's live sampled blocks = the process's marked blocks")


def event_lines(text):
    return [l for l in text.splitlines() if l.split(" ", 1)[0] in ("alloc", "free", "realloc")]


def test_events(c, workload, tools):
    """tools/ddheap-events.bt at R = 1 on a short run: one line per event,
    as many alloc/free/realloc lines as the workload made allocations,
    frees and reallocs, weight = size on every alloc, and per address as
    many frees as allocs. (Text order across CPUs is not guaranteed, so
    pairing is checked per address, not line by line.)

    bpftrace prints these lines from per-CPU buffers that it polls, and
    does not drain them when it is stopped: a line still buffered at
    Ctrl-C is never printed. The test therefore waits, before stopping
    it, until bpftrace has printed as many lines as the truth says were
    emitted (or 30 s have passed: then the counts below fail)."""
    with Workload(workload, ["--threads=2", "--rounds=5", "--go", "--hold=stdin",
                             "--linger=stdin"], {"DD_HEAP_SAMPLING_INTERVAL": "1"}) as w:
        w.wait_line("workload: pid=")
        t = w.attach(os.path.join(tools, "ddheap-events.bt"), [workload], "ddheap-events: tracing")
        w.send("go")
        w.wait_line("workload: holding")
        truth = harness.parse_truth(w.lines)
        w.send("release")
        w.wait_line("workload: lingering")
        n_alloc = sum(s["alloc_count"] for s in truth["site"].values())
        n_realloc = sum(v["alloc_count"] for (site, size), v in truth["size"].items()
                        if site == "site_grow_log" and size > 256)
        deadline = time.monotonic() + 30
        while len(event_lines(t.text())) < 2 * n_alloc + n_realloc and time.monotonic() < deadline:
            time.sleep(0.05)
        out = t.stop()
        c.equal(w.exit(), 0, "workload exit code")
    c.check("Lost" not in out, "bpftrace lost no events")
    balance = {}
    kinds = {"alloc": 0, "free": 0, "realloc": 0}
    bad_weight = 0
    for line in event_lines(out):
        f = line.split()
        kinds[f[0]] += 1
        fields = dict(x.split("=", 1) for x in f[1:])
        if f[0] == "alloc":
            balance[fields["ptr"]] = balance.get(fields["ptr"], 0) + 1
            bad_weight += fields["size"] != fields["weight"]
        elif f[0] == "free":
            balance[fields["ptr"]] = balance.get(fields["ptr"], 0) - 1
    c.equal(kinds, {"alloc": n_alloc, "free": n_alloc, "realloc": n_realloc},
            "alloc/free/realloc lines")
    c.equal(bad_weight, 0, "alloc lines with weight != size")
    c.equal(sum(1 for v in balance.values() if v != 0), 0, "addresses with allocs != frees")


# tests/tracer/stack_sites.c: the size of an alloc event names its site.
STACK_SITE_OF_SIZE = {40: "site_malloc", 700: "site_malloc", 3000: "site_malloc",
                      1500: "site_aligned", 8192: "site_aligned",
                      2400: "site_realloc", 6000: "site_realloc"}
STACK_PATH_OF_SITE = {"site_malloc": "malloc", "site_aligned": "aligned",
                      "site_realloc": "realloc"}
STACK_FREE_SITES = ("site_free", "site_realloc")  # realloc frees the old block
STACK_MIN_SAMPLES = 1000  # per path, so that 99.9 % allows at most one miss in a thousand


def frame_names(frames):
    """Function names of a symbolised stack, compiler suffixes (.part.0) cut."""
    return [f.split(".")[0] for f in frames]


def test_stacks(c, workload, tools):
    """A workload built the way users build (-O2, frame pointers, wrappers
    ending in `return dd_allocation_created(...)` and `return
    dd_allocation_realloc_commit(...)`, which become jumps), linked with
    the library as built in this directory: bpftrace's ustack, a
    frame-pointer walk from the probe, names the site that called the
    wrapper in at least 99.9 % of sampled stacks, for the malloc, aligned
    and realloc paths, and every free's stack names the site that freed.
    The wrapper's own frame is rightly missing (it jumped away); the site's
    can only be found through a frame that ddheap's probe function set up
    (docs/probes.md, "Stacks")."""
    with Workload(workload, ["--rounds=20000", "--seed=20261201"],
                  {"DD_HEAP_SAMPLING_INTERVAL": "4096"}) as w:
        w.wait_line("stacks: pid=")
        t = w.attach(os.path.join(HERE, "stacks.bt"), [workload], "READY")
        w.send("go")
        w.wait_line("stacks: done")
        out = t.stop()
        c.equal(w.exit(), 0, "workload exit code")

    maps = harness.parse_maps(out)
    seen = {path: [0, 0] for path in STACK_PATH_OF_SITE.values()}  # [events, naming the site]
    stray = {}
    example_miss = {}
    for frames, size, count in maps.get("alloc", []):
        site = STACK_SITE_OF_SIZE.get(int(size))
        if site is None:
            stray[int(size)] = stray.get(int(size), 0) + count
            continue
        path = STACK_PATH_OF_SITE[site]
        seen[path][0] += count
        if site in frame_names(frames):
            seen[path][1] += count
        else:
            example_miss.setdefault(path, frames)
    c.equal(stray, {}, "alloc events of sizes no site allocates")
    for path, (events, named) in seen.items():
        c.check(events >= STACK_MIN_SAMPLES, f"{path}: {events} sampled allocs >= {STACK_MIN_SAMPLES}")
        share = named / events if events else 0.0
        c.check(share >= 0.999, f"{path}: {named} of {events} alloc stacks ({100 * share:.2f} %) "
                                f"name the site, >= 99.9 %"
                                + (f"; e.g. {' <- '.join(example_miss[path][:5])}"
                                   if path in example_miss else ""))
    frees = named = 0
    miss = None
    for frames, _, count in maps.get("free", []):
        frees += count
        if any(s in frame_names(frames) for s in STACK_FREE_SITES):
            named += count
        elif miss is None:
            miss = frames
    c.check(frees >= STACK_MIN_SAMPLES, f"free: {frees} sampled frees >= {STACK_MIN_SAMPLES}")
    share = named / frees if frees else 0.0
    c.check(share >= 0.999, f"free: {named} of {frees} free stacks ({100 * share:.2f} %) name "
                            f"site_free or site_realloc, >= 99.9 %"
                            + (f"; e.g. {' <- '.join(miss[:5])}" if miss else ""))


def run_live_script(workload, tools, args, interval, map_keys=None, release=False):
    """One run of the workload under tools/ddheap-live.bt alone. `map_keys`
    sets BPFTRACE_MAP_KEYS_MAX for bpftrace (None: bpftrace's default, 4096
    keys); `release`: the kept blocks are freed before the tracer prints.
    Returns (truth, the script's output, the process's count of marked
    blocks when the tracer printed)."""
    saved = os.environ.pop("BPFTRACE_MAP_KEYS_MAX", None)
    if map_keys is not None:
        os.environ["BPFTRACE_MAP_KEYS_MAX"] = str(map_keys)
    hold = ["--hold=stdin"] if release else []
    try:
        with Workload(workload, ["--threads=2", "--go", "--linger=stdin"] + hold + args,
                      {"DD_HEAP_SAMPLING_INTERVAL": str(interval)}) as w:
            w.wait_line("workload: pid=")
            t = w.attach(os.path.join(tools, "ddheap-live.bt"), [workload], "ddheap-live: tracing")
            w.send("go")
            if release:
                w.wait_line("workload: holding")
                w.send("release")
            marked = int(w.wait_line("workload: lingering").split("marked=")[1])
            out = t.stop()
            if w.exit() != 0:
                raise Failure(f"workload failed: {w.stderr.strip()}")
    finally:
        os.environ.pop("BPFTRACE_MAP_KEYS_MAX", None)
        if saved is not None:
            os.environ["BPFTRACE_MAP_KEYS_MAX"] = saved
    return harness.parse_truth(w.lines), out, marked


def test_live_full(c, workload, tools):
    """More sampled blocks live at once than bpftrace's maps hold (4096 keys
    by default; R = 1, 4800 blocks kept). A block the script cannot
    remember must not stay in the live heap for ever: once everything is
    freed, tools/ddheap-live.bt reports nothing live, and says that its
    maps were full. With BPFTRACE_MAP_KEYS_MAX raised, the live heap at the
    end (the kept blocks, every one sampled with weight = size) is exact."""
    truth, out, marked = run_live_script(workload, tools, ["--rounds=600"], 1, release=True)
    r = harness.results(out)
    kept = sum(s["live_count"] for s in truth["site"].values())
    c.check(kept > 4096, f"blocks kept live at once: {kept} > 4096 (bpftrace's default map size)")
    c.equal(marked, 0, "marked blocks after freeing everything")
    c.equal((r["total_live_blocks"], r["total_live_bytes"]), (0, 0),
            "live blocks and bytes the script reports once everything was freed")
    c.check("maps were full" in out and r["untracked_blocks"] > 0,
            f"the script says its maps were full ({r['untracked_blocks']} blocks untracked)")

    truth, out, marked = run_live_script(workload, tools, ["--rounds=600"], 1, map_keys=16384)
    r = harness.results(out)
    c.equal(r["total_live_blocks"], marked, "BPFTRACE_MAP_KEYS_MAX=16384: live blocks = marked blocks")
    c.equal(r["total_live_bytes"], truth["total"]["live_bytes"],
            "BPFTRACE_MAP_KEYS_MAX=16384: live bytes = the kept bytes")
    c.check("maps were full" not in out, "BPFTRACE_MAP_KEYS_MAX=16384: no warning")


LIVE_SEEDS = [1000 * k for k in range(1, 17)]  # fixed up front; each run draws from seed, seed + 1


def test_live_seeds(c, workload, tools):
    """tools/ddheap-live.bt is unbiased: over 16 short runs with fixed,
    distinct seeds (R = 64 KiB, ~100 sampled blocks live at the end of
    each), the mean of the runs' live errors, each in units of its own
    standard deviation (docs/design.md, "Sampling"), lies within +-0.5. Were the estimate
    unbiased by chance alone, the mean of 16 such errors would be N(0, 1/16):
    outside +-0.5 with probability 4.6 % for a given set of seeds, and the
    seeds are fixed, so the outcome repeats. In every run the script's
    count of live sampled blocks also equals the process's own count of
    marked blocks (nothing lost or left over), and no run is off by more
    than 5 sd."""
    interval = 65536
    errors = []
    for seed in LIVE_SEEDS:
        truth, out, marked = run_live_script(workload, tools,
                                             ["--rounds=500", f"--seed={seed}"], interval)
        r = harness.results(out)
        c.equal(r["total_live_blocks"], marked, f"seed {seed}: live sampled blocks = marked blocks")
        live = sum(per_site(harness.parse_maps(out), "live_bytes").values())
        true = truth["total"]["live_bytes"]
        sd = math.sqrt(sum(sigma(truth["size"], s, "live_count", interval) ** 2 for s in SITES))
        errors.append((live - true) / sd)
        print(f"       seed {seed}: live estimated {live}, true {true}, sd {sd:.0f}, "
              f"error {errors[-1]:+.2f} sd")
    c.check(max(abs(e) for e in errors) <= 5, f"largest error {max(errors, key=abs):+.2f} sd, within 5 sd")
    mean = sum(errors) / len(errors)
    c.check(abs(mean) <= 0.5, f"mean live error over {len(errors)} seeds {mean:+.2f} sd, within +-0.5 sd "
                              f"(standard error of the mean {1 / math.sqrt(len(errors)):.2f})")


def test_fork(c, workload, tools):
    """A traced program forks children that allocate without exec: every
    child exits normally (a probe site a kernel rewrote into a call to a
    trampoline page would crash them), and the parent's events arrive."""
    with Workload(workload, [], {"DD_HEAP_SAMPLING_INTERVAL": "1"}) as w:
        w.wait_line("fork: pid=")
        t = w.attach(os.path.join(tools, "ddheap-alloc.bt"), [workload], "ddheap-alloc: tracing")
        w.send("go")
        done = w.wait_line("fork: children=")
        out = t.stop()
        code = w.finish()
    for line in w.lines:
        if "ended with wait status" in line:
            print(line)
    c.equal(done, "fork: children=5 crashed=0 attached=1", "every forked child exited normally")
    c.equal(code, 0, "exit code")
    # Interval 1: every block of the parent (2000, then 200 after each of 5
    # forks) is one sample; -p leaves the children's out.
    c.equal(harness.results(out)["samples"], 3000, "samples of the parent")


TESTS = {"no_tracer": test_no_tracer, "events": test_events, "exact": test_exact, "sampled": test_sampled,
         "fork": test_fork, "detach": test_detach, "stacks": test_stacks, "live_full": test_live_full,
         "live_seeds": test_live_seeds}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in TESTS:
        print(__doc__)
        return 2
    name, workload, tools = sys.argv[1:]
    # A run in which bpftrace lost its own stack map is run again, at most
    # twice (harness.run_checks).
    return harness.run_checks(name, lambda c: TESTS[name](c, workload, tools), attempts=3)


if __name__ == "__main__":
    sys.exit(main())

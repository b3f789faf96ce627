#!/usr/bin/env python3
"""ddheap-prof's Python frames (tools/ddheap-prof/python/): the workload
python_work.py, run under the preload library by Debian's python3 and by
every other CPython 3.10-3.13 this machine has (pyenv's, under
/root/.pyenv/versions), profiled and read back with `go tool pprof -raw`.

    test_python.py TEST DDHEAP_PROF PRELOAD_LIB DDHEAP_RUN ARTIFACT_DIR

TEST is one of:
  frames  per interpreter: each function's bytes within 10 % of what it
          allocated, at its file and line exactly, the Python callers in
          order (a caller chain, threads, recursion 200 deep, a generator,
          sorted() calling a key function, code from exec gone before the
          profile is written); --python=off shows no Python frame; a
          CPython 3.9 (if pyenv has one) native frames and one warning.
  cost    the BPF program's time per sample with the walk and without
          (kernel.bpf_stats_enabled, set for the run and restored): printed,
          not judged (no timing thresholds in tests); both runs must count.

Needs root (BPF); exits 77 (skipped) only when not root. Ends with
"N passed, N failed".
"""

import glob
import os
import re
import subprocess
import sys

from harness import Failure, run_prof_test
from pprof_read import pprof, read_raw

TIMEOUT = 240
HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "python_work.py")
K = 48                      # blocks per unit of the workload
N = 65536                   # bytearray(N): N + 1 bytes each
# Blocks of 64 KiB at a mean interval of 8 KiB: each is sampled with
# probability 1 - e^-8, so an estimate is within a fraction of a percent.
INTERVAL = 8192
# Interpreter frames stand in the profile at addresses of the kernel's
# half (tools/ddheap-prof/interp.c), with no mapping.
PY_LO, PY_HI = 0xffffc00000000000, 0xffffd00000000000


def interpreters():
    """[(label, path)]: Debian's python3, then each pyenv CPython 3.10-3.13."""
    found = [("debian-" + os.path.basename(os.path.realpath("/usr/bin/python3")),
              "/usr/bin/python3")]
    for d in sorted(glob.glob("/root/.pyenv/versions/3.1[0-3].*")):
        exe = os.path.join(d, "bin", "python3")
        if os.access(exe, os.X_OK):
            found.append(("pyenv-" + os.path.basename(d), exe))
    return found


def markers():
    """{marker: line} of python_work.py's `# @marker` comments."""
    out = {}
    with open(WORK) as f:
        for n, line in enumerate(f, 1):
            m = re.search(r"# @(\w+)$", line.rstrip())
            if m:
                out[m.group(1)] = n
    return out


def profile(prof, preload, run, python, artifacts, name, args=(), env=None):
    """ddheap-prof -v ARGS -o NAME.pb.gz -- ddheap-run PYTHON python_work.py;
    returns (pb, stderr, truth {function: blocks})."""
    pb = os.path.join(artifacts, f"{name}.pb.gz")
    truth = os.path.join(artifacts, f"{name}.truth")
    for p in (pb, truth):
        if os.path.exists(p):
            os.unlink(p)
    r = subprocess.run([prof, "-v", "-o", pb, "--folded", os.path.join(artifacts, f"{name}.folded"),
                        "--value", "alloc_space"] + list(args) +
                       ["--", run, python, WORK, str(K), truth],
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, DD_HEAP_SAMPLING_INTERVAL=str(INTERVAL),
                                DDHEAP_PRELOAD_LIB=preload, **(env or {})))
    err = "\n".join(l for l in r.stderr.splitlines() if not l.startswith("libbpf:"))
    if r.returncode != 0:
        raise Failure(f"ddheap-prof exited with {r.returncode}:\n{err[-3000:]}")
    blocks = {}
    with open(truth) as f:
        for line in f:
            fn, n = line.split()
            blocks[fn] = int(n)
    return pb, err, blocks


def samples(c, pb):
    """[(alloc_space, frames innermost first)], a frame being
    ("py", function, file, line) or ("native", function, None, None); that
    every function has a name is checked."""
    raw = read_raw(pb, c)
    k = raw["types"].index("alloc_space")
    out = []
    for values, ids in raw["samples"]:
        frames = []
        for i in ids:
            loc = raw["locs"][i]
            if PY_LO <= loc["addr"] < PY_HI:
                file, _, line = loc["file"].rpartition(":")
                frames.append(("py", loc["function"], file, int(line)))
            else:
                frames += [("native", f, None, None) for f in loc["functions"]]
        out.append((values[k], frames))
    return out


def py_chain(frames):
    return [(f[1], f[2], f[3]) for f in frames if f[0] == "py"]


def at(name, line, file=WORK):
    return (name, file, line)


def check_bytes(c, who, sts, fn, want_frames, blocks, caller=None):
    """The bytes of samples whose innermost Python frame is one of
    want_frames (and the next one caller, if given), within 10 % of
    blocks * (N + 1)."""
    got = sum(v for v, fr in sts if py_chain(fr)[:1] and py_chain(fr)[0] in want_frames and
              (caller is None or py_chain(fr)[1:2] == [caller]))
    want = blocks * (N + 1)
    c.check(abs(got - want) <= 0.10 * want,
            f"{who}: {fn}: {got} bytes at {want_frames[0][1]}:{want_frames[0][2]}, "
            f"allocated {want} (within 10 %)")
    return got


def chain_share(sts, first, pred):
    """The share of the bytes whose innermost Python frame is `first` for
    which pred(frames) holds."""
    mine = [(v, fr) for v, fr in sts if py_chain(fr)[:1] == [first]]
    total = sum(v for v, _ in mine)
    return sum(v for v, fr in mine if pred(fr)) / total if total else 0.0


def check_interpreter(c, prof, preload, run, artifacts, label, python):
    ln = markers()
    pb, err, blocks = profile(prof, preload, run, python, artifacts, f"python-{label}")
    for line in err.splitlines():
        if "CPython" in line:
            c.check(False, f"{label}: ddheap-prof said: {line}")
    sts = samples(c, pb)
    module = at("<module>", ln["module"])
    main_ = lambda m: at("main", ln[m])
    # Each function's bytes, at its line.
    sites = {"leaf": [at("leaf", ln["leaf"])], "direct": [at("direct", ln["direct"])],
             "thread_a": [at("thread_a", ln["thread_a"])],
             "thread_b": [at("thread_b", ln["thread_b"])],
             "during_threads": [at("during_threads", ln["during_threads"])],
             "recurse": [at("recurse", ln["recurse_leaf"])], "gen": [at("gen", ln["gen"])],
             "key_fn": [at("key_fn", ln["key_fn"])],
             "dynamic": [("dynamic", "<dynamic>", 3), ("<unknown>", "", 1)]}
    for fn, frames in sites.items():
        # (exec'd code gone before it was read is "<unknown>" at its first
        # line, as a module's top-level code run at an import is: only
        # the frames called from run_dynamic are its.)
        check_bytes(c, label, sts, fn, frames, blocks[fn],
                    at("run_dynamic", ln["run_dynamic"]) if fn == "dynamic" else None)
    # The callers, in order.
    chains = {"leaf": [at("leaf", ln["leaf"]), at("middle", ln["middle"]), main_("main_middle"),
                       module],
              "direct": [at("direct", ln["direct"]), main_("main_direct"), module],
              "during_threads": [at("during_threads", ln["during_threads"]),
                                 main_("main_threads"), module],
              "gen": [at("gen", ln["gen"]), at("consume", ln["consume"]),
                      main_("main_consume"), module],
              "key_fn": [at("key_fn", ln["key_fn"]), at("sort_with_key", ln["sort"]),
                         main_("main_sort"), module]}
    for fn, want in chains.items():
        s = chain_share(sts, want[0], lambda fr: py_chain(fr) == want)
        c.check(s == 1.0, f"{label}: {fn}: Python callers "
                          f"{' <- '.join(f'{n}:{l}' for n, _, l in want)}: {s:.4f} of its bytes")
    # sorted() is C: its frames are between the key function and its
    # caller. Named "...sort..." where the interpreter has a symbol table;
    # Debian's python3.11 has none (list.sort is static: without its debug
    # package it is an address in the executable, "python3.11+0x...").
    exe = os.path.basename(os.path.realpath(python))
    def sort_between(fr):
        names = [f[1] for f in fr]
        i, j = names.index("key_fn"), names.index("sort_with_key")
        return any("sort" in f[1] or f[1].startswith(exe + "+0x")
                   for f in fr[i + 1:j] if f[0] == "native")
    s = chain_share(sts, sites["key_fn"][0], sort_between)
    c.check(s == 1.0, f"{label}: key_fn: a native frame of sorted() (or unnamed code of {exe}) "
                      f"between key_fn and sort_with_key: {s:.4f} of its bytes")
    # Threads: their own frames, never the main thread's.
    for fn in ("thread_a", "thread_b"):
        s = chain_share(sts, sites[fn][0],
                        lambda fr: all(f[1] != WORK for f in py_chain(fr)[1:]) and
                        any(f[0].endswith("run") for f in py_chain(fr)))
        c.check(s == 1.0, f"{label}: {fn}: called from threading's run(), nothing of the "
                          f"main thread: {s:.4f} of its bytes")
    # Recursion 200 deep: the walk's 128 frames, and a mark where it stopped.
    def deep(fr):
        ch = py_chain(fr)
        rec = sum(1 for f in ch if f == at("recurse", ln["recurse"]))
        return rec >= 100 and any(f[1] == "[truncated]" for f in fr)
    s = chain_share(sts, sites["recurse"][0], deep)
    depths = sorted({sum(1 for f in py_chain(fr) if f[0] == "recurse")
                     for _, fr in sts if py_chain(fr)[:1] == sites["recurse"][:1]})
    c.check(s == 1.0, f"{label}: recursion 200 deep: >= 100 frames of recurse:{ln['recurse']} "
                      f"and [truncated]: {s:.4f} of its bytes (recurse frames seen: {depths})")
    # exec'd code, gone before the end: named as it was, or "<unknown>" at
    # its first line; never the code made at its address later.
    s = chain_share(sts, sites["dynamic"][0], lambda fr: py_chain(fr)[1:2] ==
                    [at("run_dynamic", ln["run_dynamic"])])
    c.check(s == 1.0, f"{label}: dynamic: called from run_dynamic:{ln['run_dynamic']}: {s:.4f} "
                      f"of its bytes")
    named = sum(v for v, fr in sts if py_chain(fr)[:1] == [sites["dynamic"][0]])
    print(f"NOTE - {label}: exec'd `dynamic` named in {named} bytes (read before it was gone; "
          f"the rest <unknown> at its first line)")
    other = sum(v for v, fr in sts if py_chain(fr)[:1] and py_chain(fr)[0][0] == "other")
    c.check(other == 0, f"{label}: no bytes at `other` (which allocates nothing): {other}")
    if label.startswith("debian"):
        print(f"--- {label}: go tool pprof -top, Python frames on")
        print("\n".join(pprof(pb, "-sample_index=alloc_space", "-top").splitlines()[:22]))
    return sts


def test_frames(c, prof, preload, run, artifacts):
    found = interpreters()
    print("interpreters: " + ", ".join(f"{l} ({p})" for l, p in found))
    if len(found) == 1:
        print("NOTE - no other CPython 3.10-3.13 under /root/.pyenv/versions")
    for label, python in found:
        check_interpreter(c, prof, preload, run, artifacts, label, python)
    # A CPython it has no layout for (pyenv's 3.9, if there): native
    # frames and one line saying so.
    older = sorted(glob.glob("/root/.pyenv/versions/3.9.*/bin/python3"))
    if older:
        pb, err, _ = profile(prof, preload, run, older[-1], artifacts, "python-3.9")
        said = [l for l in err.splitlines() if "CPython 3.9 is not one" in l]
        py = sum(1 for _, fr in samples(c, pb) for f in fr if f[0] == "py")
        c.check(len(said) == 1 and py == 0,
                f"{older[-1]}: said once ({len(said)}), no Python frame ({py})")
    else:
        print("NOTE - no CPython 3.9 under /root/.pyenv/versions: the unknown version "
              "is not tried")
    # --python=off: native frames only.
    pb, _, _ = profile(prof, preload, run, "/usr/bin/python3", artifacts, "python-off",
                       ["--python=off"])
    py = sum(1 for _, fr in samples(c, pb) for f in fr if f[0] == "py")
    c.check(py == 0, f"--python=off: Python frames in the profile: {py}")
    print("--- debian python3, --python=off: go tool pprof -top")
    print("\n".join(pprof(pb, "-sample_index=alloc_space", "-top").splitlines()[:22]))


def costs(err):
    """{program: (runs, us each)} from ddheap-prof -v."""
    return {m.group(1): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"ddheap-prof: (on_\w+): (\d+) runs, ([\d.]+) us each", err)}


def test_cost(c, prof, preload, run, artifacts):
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        before = f.read().strip()
    try:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write("1")
        got = {}
        for mode in ("on", "off"):
            _, err, _ = profile(prof, preload, run, "/usr/bin/python3", artifacts,
                                f"python-cost-{mode}", [f"--python={mode}"])
            got[mode] = costs(err).get("on_alloc")
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(before)
    for mode in ("on", "off"):
        c.check(got[mode] is not None and got[mode][0] > 0,
                f"--python={mode}: on_alloc counted by the kernel: {got[mode]}")
    if got["on"] and got["off"]:
        print(f"BPF on_alloc per sample: {got['on'][1]:.2f} us with the Python walk, "
              f"{got['off'][1]:.2f} us without ({got['on'][1] - got['off'][1]:+.2f} us)")
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        c.equal(f.read().strip(), before, "kernel.bpf_stats_enabled restored")


TESTS = {"frames": test_frames, "cost": test_cost}


if __name__ == "__main__":
    # PRELOAD_LIB and DDHEAP_RUN are handed on to other programs (in
    # LD_PRELOAD or DDHEAP_PRELOAD_LIB, after `--`): made absolute, so
    # that no working directory matters.
    sys.exit(run_prof_test(__doc__, TESTS, 4, absolute=(1, 2), programs={"go": "golang-go"}))

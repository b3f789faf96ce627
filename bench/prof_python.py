#!/usr/bin/env python3
"""What a Python program's profile shows and costs with CPython's default
allocator (pymalloc: objects of 512 bytes and less come from its own
arenas, which it maps itself, so malloc never sees them) and with
PYTHONMALLOC=malloc (every object through malloc), with ddheap-prof's
Python frames on and off. The workload is bench/python_json.py (a JSON
service: many small dicts and strings, one large string per batch),
configurations interleaved round by round, medians of R rounds.

    sudo bench/prof_python.py BUILD_DIR [--python PYTHON] [--rounds N] [--reps R]

BUILD_DIR is a release build with tools/ddheap-prof/ddheap-prof,
tools/ddheap-run-uninstalled and src/preload/libddheap_preload.so.
Turns on kernel.bpf_stats_enabled for the run (restored after). Per
configuration:

  CPU s        the workload's own CPU in its loop (the probe's BPF program
               runs in its context and counts here), and its ratio to the
               default allocator without ddheap
  samples      alloc events ddheap-prof received
  MB seen      the profile's alloc_space: the bytes the samples stand for
  build_dict   the share of those bytes under build_dict
  BPF us       on_alloc's mean time in the kernel per sample

Nothing here is a test; it prints a markdown table for docs/ddheap-prof.md.
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "python_json.py")


def run(cmd, env, cwd):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{r.stderr[-2000:]}")
    return r


def one(build, python, rounds, allocator, prof, tmp):
    env = dict(os.environ)
    if allocator == "malloc":
        env["PYTHONMALLOC"] = "malloc"
    cmd = [python, WORK, str(rounds)]
    out = {}
    if prof:
        folded = os.path.join(tmp, "p.folded")
        env["DDHEAP_PRELOAD_LIB"] = os.path.join(build, "src/preload/libddheap_preload.so")
        cmd = [os.path.join(build, "tools/ddheap-prof/ddheap-prof"), "-v",
               "-o", os.path.join(tmp, "p.pb.gz"), "--folded", folded, "--value", "alloc_space",
               f"--python={prof}", "--", os.path.join(build, "tools/ddheap-run-uninstalled")] + cmd
    r = run(cmd, env, tmp)
    out["cpu"] = float(re.search(r"CPU_S ([\d.]+)", r.stdout).group(1))
    if prof:
        out["samples"] = int(re.search(r"alloc events (\d+)", r.stderr).group(1))
        m = re.search(r"on_alloc: \d+ runs, ([\d.]+) us each", r.stderr)
        out["bpf"] = float(m.group(1)) if m else float("nan")
        total = mine = 0
        with open(folded) as f:
            for line in f:
                stack, _, v = line.rpartition(" ")
                total += int(v)
                if "build_dict" in stack:
                    mine += int(v)
        out["mb"] = total / 1e6
        out["build_dict"] = mine / total if total else 0.0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    configs = [(alloc, prof) for alloc in ("pymalloc", "malloc") for prof in (None, "off", "on")]
    got = {c: [] for c in configs}
    stats = "/proc/sys/kernel/bpf_stats_enabled"
    with open(stats) as f:
        before = f.read().strip()
    try:
        with open(stats, "w") as f:
            f.write("1")
        with tempfile.TemporaryDirectory(prefix="ddheap-prof-python-") as tmp:
            for _ in range(a.reps):
                for c in configs:
                    got[c].append(one(build, a.python, a.rounds, c[0], c[1], tmp))
    finally:
        with open(stats, "w") as f:
            f.write(before)

    def med(c, k):
        return statistics.median(x[k] for x in got[c])

    print("| allocator | ddheap-prof | CPU s | ratio to pymalloc alone | samples | MB seen "
          "| build_dict | BPF us |")
    print("|---|---|---|---|---|---|---|---|")
    base = med(("pymalloc", None), "cpu")
    for c in configs:
        row = [c[0], f"--python={c[1]}" if c[1] else "none", f"{med(c, 'cpu'):.2f}",
               f"{med(c, 'cpu') / base:.2f}"]
        if c[1]:
            row += [f"{med(c, 'samples'):.0f}", f"{med(c, 'mb'):.0f}",
                    f"{100 * med(c, 'build_dict'):.0f} %", f"{med(c, 'bpf'):.1f}"]
        else:
            row += ["", "", "", ""]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What ddheap-prof's stack capture costs: the end-to-end workload
(bench/e2e.c, through ddheap, at the default rate limit of 3000 samples a
second) with no tracer, under ddheap-prof --unwind=fp and under
--unwind=dwarf (the default: 16 KiB of stack copied per sample), the
three interleaved round by round in one run.

    sudo bench/prof_unwind.py BUILD_DIR [--count N] [--reps R] [--stack-bytes N]

BUILD_DIR holds bench/dd_bench_e2e and tools/ddheap-prof/ddheap-prof (a
release build). Turns on kernel.bpf_stats_enabled for the run (restored
after) so the kernel times the BPF program. Per configuration, the median
round of:

  loop CPU     the e2e loop's user + system time (the probe's BPF program
               runs in the workload's context and counts here), and its
               ratio to no tracer
  samples/s    alloc events ddheap-prof received per second of loop
  BPF us       on_alloc's mean run time in the kernel (the stack copy)
  unwind us    user-space DWARF unwinding per sample
  RB MB/s      ring-buffer bytes per second of loop
  lost         events the ring buffer had no room for
  prof CPU     ddheap-prof's own user + system time, start to exit

Nothing here is a test; it prints a markdown table for docs/ddheap-prof.md.
"""
import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile


def e2e_line(text):
    m = re.search(r"E2E .*ns=(\d+) cpu_ns=(\d+)", text)
    if not m:
        raise SystemExit(f"no E2E line in:\n{text[-2000:]}")
    return int(m.group(1)), int(m.group(2))


def run_round(build, config, count, stack_bytes, tmp):
    e2e = [os.path.join(build, "bench", "dd_bench_e2e"), "--mode", "ddheap", "--count",
           str(count)]
    prof = os.path.join(build, "tools", "ddheap-prof", "ddheap-prof")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    if config == "none":
        r = subprocess.run(e2e, capture_output=True, text=True, check=True)
        err = ""
    else:
        args = [prof, "-v", "-o", os.path.join(tmp, "p.pb.gz"), f"--unwind={config}"]
        if config == "dwarf":
            args += ["--stack-bytes", str(stack_bytes)]
        r = subprocess.run(args + ["--"] + e2e, capture_output=True, text=True, check=True)
        err = r.stderr
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, cpu = e2e_line(r.stdout)
    children = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e9
    row = {"wall": wall, "cpu": cpu, "prof_cpu": max(0.0, children - cpu) if err else 0.0}

    def num(pattern, default=0.0):
        m = re.search(pattern, err)
        return float(m.group(1)) if m else default

    row["allocs"] = num(r"alloc events (\d+)")
    row["bpf_us"] = num(r"on_alloc: \d+ runs, ([\d.]+) us each")
    row["unwind_us"] = num(r"frames and ([\d.]+) us each")
    row["rb_bytes"] = num(r"ring buffer: \d+ events, (\d+) bytes")
    row["lost"] = num(r"LOST (\d+) events")
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--count", type=int, default=20000000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--stack-bytes", type=int, default=16384)
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (BPF)")
    stats = "/proc/sys/kernel/bpf_stats_enabled"
    old = open(stats).read().strip()
    rows = {c: [] for c in ("none", "fp", "dwarf")}
    try:
        with open(stats, "w") as f:
            f.write("1")
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(a.reps):
                for config in rows:
                    rows[config].append(run_round(a.build, config, a.count, a.stack_bytes, tmp))
                    print(f"round {rep + 1}/{a.reps} {config}: {rows[config][-1]}",
                          file=sys.stderr)
    finally:
        with open(stats, "w") as f:
            f.write(old)
    base = statistics.median(r["cpu"] for r in rows["none"])
    print(f"e2e: {a.count} allocations through ddheap, {a.reps} interleaved rounds, medians")
    print("| tracer | loop CPU ms | ratio | samples/s | BPF us | unwind us | RB MB/s | lost "
          "| prof CPU ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for config, rs in rows.items():
        m = sorted(rs, key=lambda r: r["cpu"])[len(rs) // 2]
        secs = m["wall"] / 1e9
        print(f"| {config} | {m['cpu'] / 1e6:.0f} | {m['cpu'] / base:.3f} | "
              f"{m['allocs'] / secs:.0f} | {m['bpf_us']:.2f} | {m['unwind_us']:.1f} | "
              f"{m['rb_bytes'] / secs / 1e6:.1f} | {m['lost']:.0f} | {m['prof_cpu'] / 1e6:.0f} |")


if __name__ == "__main__":
    main()

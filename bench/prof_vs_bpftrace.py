#!/usr/bin/env python3
"""ddheap-prof against bpftrace with tools/ddheap-live.bt on the end-to-end
workload (bench/e2e.c), at the same sampling intervals, in one run.

    sudo bench/prof_vs_bpftrace.py BUILD_DIR [--count N] [--intervals 524288,32768,4096]
                                   [--reps 3]

BUILD_DIR must hold bench/dd_bench_e2e and tools/ddheap-prof/ddheap-prof
(e.g. a release build: meson setup build-rel -Dbuildtype=release). For each
interval, three runs of the same allocation sequence: no tracer, ddheap-prof
-p, bpftrace -p (each tracer attached before the loop starts: e2e waits for
the probe's semaphore, so attaching is never timed), repeated --reps times
in turn; each row is the run with the median loop time. Reported:

  loop ms      the e2e loop's wall time, and its overhead against no tracer
  events/s     alloc + free events the tracer received per second of loop
               (ddheap-prof counts them; bpftrace's script does not, so its
               row repeats ddheap-prof's count for the same interval)
  lost         events ddheap-prof's ring buffer had no room for (bpftrace
               aggregates in kernel maps: nothing to lose, but nothing is
               streamed either)
  tracer CPU   user + system time of the tracer process, start to exit
               (bpftrace's includes compiling its script)
  max RSS      the tracer's peak resident memory

Nothing here is a test; it prints a markdown table for docs/performance.md.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_tracer_run(e2e, count, interval, tracer_cmd):
    """Starts e2e (waiting for a tracer if tracer_cmd), the tracer on its
    pid; returns (e2e loop ns, tracer stderr+stdout, tracer rusage)."""
    env = dict(os.environ, DD_HEAP_SAMPLING_INTERVAL=str(interval))
    args = [e2e, "--mode", "ddheap", "--count", str(count)]
    if tracer_cmd is None:
        out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
        return loop_ns(out), "", None
    w = subprocess.Popen(args + ["--wait-tracer"], env=env, stdout=subprocess.PIPE, text=True)
    log = open(f"/tmp/ddheap-bench-tracer-{os.getpid()}.txt", "w+")
    t = subprocess.Popen(tracer_cmd(w.pid), stdout=log, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    out = w.communicate(timeout=600)[0]
    t.send_signal(signal.SIGINT)
    _, status, ru = os.wait4(t.pid, 0)
    t.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    text = log.read()
    log.close()
    os.unlink(log.name)
    if w.returncode != 0 or t.returncode != 0:
        raise RuntimeError(f"run failed (e2e {w.returncode}, tracer {t.returncode}):\n{text[-2000:]}")
    return loop_ns(out), text, ru


def loop_ns(out):
    m = re.search(r"E2E .* ns=(\d+)", out)
    if not m:
        raise RuntimeError("e2e printed no result: " + out)
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--count", type=int, default=5000000)
    ap.add_argument("--intervals", default="524288,32768,4096")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    e2e = os.path.join(a.build, "bench", "dd_bench_e2e")
    prof = os.path.join(a.build, "tools", "ddheap-prof", "ddheap-prof")
    live = os.path.join(ROOT, "tools", "ddheap-live.bt")
    out_pb = f"/tmp/ddheap-bench-{os.getpid()}.pb.gz"
    rows = []

    def prof_cmd(pid):
        return [prof, "-p", str(pid), "-o", out_pb]

    def bpftrace_cmd(pid):
        return ["bpftrace", live, e2e, "1", "-p", str(pid)]

    for interval in [int(x) for x in a.intervals.split(",")]:
        runs = {"none": [], "prof": [], "bt": []}
        for _ in range(a.reps):
            runs["none"].append(wait_tracer_run(e2e, a.count, interval, None))
            runs["prof"].append(wait_tracer_run(e2e, a.count, interval, prof_cmd))
            runs["bt"].append(wait_tracer_run(e2e, a.count, interval, bpftrace_cmd))

        def median(kind):
            return sorted(runs[kind], key=lambda r: r[0])[len(runs[kind]) // 2]
        base = median("none")
        rows.append((interval, "no tracer", base[0], None, None, None))
        ns, text, ru = median("prof")
        m = re.search(r"alloc events (\d+), free events (\d+)", text)
        lost = re.search(r"LOST (\d+)", text)
        events = int(m.group(1)) + int(m.group(2)) if m else 0
        rows.append((interval, "ddheap-prof", ns, events, int(lost.group(1)) if lost else 0, ru))
        ns_bt, _, ru_bt = median("bt")
        rows.append((interval, "bpftrace ddheap-live.bt", ns_bt, events, None, ru_bt))
        print(f"interval {interval}: done", file=sys.stderr, flush=True)
    if os.path.exists(out_pb):
        os.unlink(out_pb)

    print(f"e2e: {a.count} allocations of 16..4096 bytes through a FIFO window of 1000, "
          f"`{os.path.basename(e2e)} --mode ddheap`; median of {a.reps} runs\n")
    print("| interval | tracer | loop ms | overhead | events/s | lost | tracer CPU s | max RSS MiB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    base_of = {r[0]: r[2] for r in rows if r[1] == "no tracer"}
    for interval, tool, ns, events, lost, ru in rows:
        over = "" if tool == "no tracer" else f"{100 * (ns / base_of[interval] - 1):+.1f}%"
        eps = "" if events is None else f"{events / (ns / 1e9):,.0f}"
        if tool.startswith("bpftrace") and events is not None:
            eps = f"≈ {eps}"
        lost_s = "" if tool == "no tracer" else ("—" if lost is None else f"{lost}")
        cpu = "" if ru is None else f"{ru.ru_utime + ru.ru_stime:.2f}"
        rss = "" if ru is None else f"{ru.ru_maxrss / 1024:.0f}"
        print(f"| {interval} | {tool} | {ns / 1e6:.0f} | {over} | {eps} | {lost_s} | {cpu} | {rss} |")


if __name__ == "__main__":
    main()

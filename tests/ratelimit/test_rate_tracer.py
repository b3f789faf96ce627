#!/usr/bin/env python3
"""The sampling-rate limit under a real bpftrace (suite 'tracer'):

    test_rate_tracer.py THREADS WORKLOAD

rate_workload steps its allocation rate x100 up and down with THREADS
threads sharing one limit; bpftrace (rate.bt) counts, per millisecond,
the alloc events, their weights, and the events weighing anything but a
block at the configured interval. The checks are those of
test_rate_steps.c, from what the tracer received:

  - every sample the workload took reached the tracer, once;
  - after the first second of each step, samples per second within +-25%
    of min(limit, the step's achieved demand at the configured interval);
  - no 100 ms window above the burst (one second's worth, LIMIT samples)
    plus 2x the limit's share (checked on 101 one-millisecond buckets,
    which contain any 100 ms window: stricter);
  - summed weights within 5 sd of the true bytes per step and overall;
  - below the limit, after the first second: no event weighing other than
    the configured interval's weight, and the effective interval back.

Needs root; exits 77 (skipped) only when not root, fails when root but
bpftrace is missing (tests/lib/harness.py).
"""
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
import harness
from harness import Failure, Workload

LIMIT = 8000
INTERVAL = 65536
BLOCK = 16384
MS = 1000000


def parse_steps(lines):
    steps = []
    for line in lines:
        f = line.split()
        if f and f[0] == "step":
            d = {f[i]: float(f[i + 1]) for i in range(2, len(f), 2)}
            d["index"] = int(f[1])
            steps.append(d)
    if not steps:
        raise Failure("the workload printed no steps")
    return steps


def parse_buckets(text):
    maps = {"n": {}, "w": {}, "off": {}}
    for line in text.splitlines():
        m = re.match(r"^@(n|w|off)\[(\d+)\]: (\d+)$", line)
        if m:
            maps[m.group(1)][int(m.group(2))] = int(m.group(3))
    return maps


def in_range(bucket_map, first, last):
    return sum(v for k, v in bucket_map.items() if first <= k <= last)


def run(c, threads, workload):
    with Workload(workload, [str(threads), str(LIMIT), str(INTERVAL), str(BLOCK)]) as w:
        weight_at_r = int(w.wait_line("rate-workload: weight_at_interval=").split("=")[1])
        w.wait_line("rate-workload: pid=")
        os.environ["BPFTRACE_MAP_KEYS_MAX"] = "65536"  # one key per millisecond of the run
        t = w.attach(os.path.join(HERE, "rate.bt"), [workload, str(weight_at_r)], "READY")
        w.wait_line("rate-workload: attached")
        w.send("go")
        w.wait_line("rate-workload: done", timeout=120)
        out = t.stop()
        c.equal(w.exit(), 0, "workload exit code")

    steps = parse_steps(w.lines)
    b = parse_buckets(out)
    if not c.check(b["n"], "bpftrace printed its buckets"):
        print(out[:2000])
        return
    p = -math.expm1(-BLOCK / INTERVAL)
    c.equal(sum(b["n"].values()), int(sum(s["samples"] for s in steps)),
            "alloc events seen by bpftrace = samples the workload took")
    c.equal(int(sum(s["mismatch"] for s in steps)), 0,
            "samples not weighted with their own countdown's interval")

    all_w = all_bytes = all_var = all_samples = 0.0
    for s in steps:
        i = s["index"]
        first, last = int(s["start"]) // MS, int(s["end"]) // MS
        weight = in_range(b["w"], first, last)
        sd = math.sqrt(s["variance"])
        all_w += weight
        all_bytes += s["bytes"]
        all_var += s["variance"]
        all_samples += s["samples"]
        c.check(abs(weight - s["bytes"]) <= 5 * sd + 0.5 * s["samples"] + 1,
                f"step {i}: traced weights / bytes = {weight / s['bytes']:.4f}, "
                f"|diff| = {abs(weight - s['bytes']) / sd:.2f} sd (<= 5)")
        measured = (s["end"] - s["start"]) / 1e9 - 1.0
        if measured <= 0.2:
            continue
        # Whole milliseconds after the first second.
        m_first = (int(s["start"]) + 1000 * MS) // MS + 1
        got = in_range(b["n"], m_first, last - 1) / ((last - m_first) / 1000.0)
        demand = s["measured_blocks"] / measured * p
        want = min(demand, LIMIT)
        c.check(abs(got - want) <= 0.25 * want,
                f"step {i}: {got:.0f} samples/s after the first second, want {want:.0f} +-25% "
                f"(demand {demand:.0f}/s at the configured interval, limit {LIMIT})")
        if demand < 0.8 * LIMIT:
            off = in_range(b["off"], m_first - 1, last)
            c.equal(off, 0, f"step {i} (below the limit): events after the first second "
                            f"weighing other than the configured interval's {weight_at_r}")
            c.equal(int(s["effective_1s"]), INTERVAL,
                    f"step {i} (below the limit): effective interval 1 s in")
        elif demand > 2 * LIMIT:
            c.check(s["effective_end"] > INTERVAL,
                    f"step {i} (above the limit): effective interval {int(s['effective_end'])} "
                    f"raised")
        else:
            print(f"NOTE - step {i}: demand {demand:.0f}/s too close to the limit to tell the "
                  f"regimes apart (a loaded machine?)")
    sd = math.sqrt(all_var)
    c.check(abs(all_w - all_bytes) <= 5 * sd + 0.5 * all_samples + 1,
            f"whole run: traced weights / bytes = {all_w / all_bytes:.4f}, "
            f"|diff| = {abs(all_w - all_bytes) / sd:.2f} sd (<= 5)")
    keys = sorted(b["n"])
    busiest = 0
    for k in keys:
        busiest = max(busiest, sum(b["n"].get(j, 0) for j in range(k, k + 101)))
    # One burst (the bucket: a second's worth, LIMIT samples) plus twice
    # the limit's share of 100 ms.
    bound = LIMIT + 2 * LIMIT // 10
    c.check(busiest <= bound,
            f"busiest 101 ms (covers any 100 ms window): {busiest} samples <= {bound}")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    threads, workload = int(sys.argv[1]), sys.argv[2]
    return harness.run_checks(f"rate-{threads}", lambda c: run(c, threads, workload))


if __name__ == "__main__":
    sys.exit(main())

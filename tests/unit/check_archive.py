#!/usr/bin/env python3
"""Checks the built libddheap.a from the outside, the way a tracer and a
linker see it:

- `readelf -n`: every probe (alloc, free, realloc) appears exactly once per
  configured provider, with its arguments described as exactly the SysV
  argument registers, in order (what a consumer reading pt_regs assumes);
- the two alloc semaphores are adjacent halves of one aligned word (the
  fast path's single load);
- `nm`: every global symbol is in the dd_/ddheap_ namespace.

Prints one line per check and a closing "N passed, N failed" line.
"""
import argparse
import os
import subprocess
import sys

import harness
import stapsdt

# sys/sdt.h itself defines this weak, hidden anchor in every object with a
# probe; hidden symbols never reach a user's dynamic symbol table.
ALLOWED_FOREIGN = {"_.stapsdt.base"}


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    ap.add_argument("--providers", required=True)
    ap.add_argument("--cpu", required=True)
    ap.add_argument("--scheme", choices=["header", "tbi", "shadow"],
                    help="check that the archive marks with this scheme")
    args = ap.parse_args()
    providers = [p for p in args.providers.split(",") if p]
    c = harness.Checker("archive")
    check = c.check

    probes = stapsdt.read(args.archive)
    stapsdt.check_each_probe_once(probes, providers, args.cpu, check)
    check(len(probes) == 3 * len(providers), f"{len(probes)} probes in total")
    # The fast path reads both alloc semaphores as one 32-bit word.
    sems = {p.provider: p.semaphore for p in probes if p.name == "alloc"}
    if len(sems) == 2:
        check(sems["otel_memory"] == sems["ddheap"] + 2 and sems["ddheap"] % 4 == 0,
              "the two alloc semaphores form one aligned 32-bit word")

    symbols = run("nm", "-g", "--defined-only", args.archive)
    bad = []
    for line in symbols.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name = parts[2]
        if name.startswith(("dd_", "ddheap_")) or name in ALLOWED_FOREIGN:
            continue
        bad.append(name)
    check(not bad, "every global symbol is prefixed dd_/ddheap_" + (f" (not: {', '.join(sorted(set(bad)))})" if bad else ""))
    unique = [l for l in symbols.splitlines() if l.endswith(" ddheap_shared_v3")]
    check(any(" u " in l for l in unique), "ddheap_shared_v3 is a GNU unique symbol")
    unique = [l for l in symbols.splitlines() if l.endswith(" ddheap_rate_v2")]
    check(any(" u " in l for l in unique), "ddheap_rate_v2 is a GNU unique symbol")

    # Each scheme's own cold-path entry points: a library built with the
    # wrong ddheap/config.h would lack them (the shadow archive is built
    # with a generated configuration of its own).
    scheme_symbols = {"header": "ddheap_table_insert", "tbi": "ddheap_tbi_thread_ready_slow",
                      "shadow": "ddheap_shadow_metadata_bytes"}
    if args.scheme:
        defined = {l.split()[-1] for l in symbols.splitlines() if len(l.split()) == 3}
        for scheme, symbol in scheme_symbols.items():
            want = scheme == args.scheme
            check((symbol in defined) == want,
                  f"{symbol} {'defined' if want else 'absent'}: {args.scheme} marking")

    return c.summary()


if __name__ == "__main__":
    sys.exit(main())

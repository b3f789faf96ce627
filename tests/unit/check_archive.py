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
import re
import subprocess
import sys

REGS = {
    "x86_64": ["%rdi", "%rsi", "%rdx", "%rcx"],
    "aarch64": ["x0", "x1", "x2", "x3"],
}
ARITY = {"alloc": 3, "free": 1, "realloc": 4}

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
    args = ap.parse_args()
    providers = [p for p in args.providers.split(",") if p]
    regs = REGS[args.cpu]
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print(("ok     " if ok else "FAILED ") + what)
        if ok:
            passed += 1
        else:
            failed += 1

    notes = run("readelf", "-n", args.archive)
    probes = re.findall(
        r"Provider: (\S+)\s+Name: (\S+)\s+Location: .*?Semaphore: (0x[0-9a-f]+)\s+Arguments: ([^\n]*)",
        notes,
    )
    for provider in ["ddheap", "otel_memory"]:
        for name, arity in ARITY.items():
            found = [p for p in probes if p[0] == provider and p[1] == name]
            want = 1 if provider in providers else 0
            check(len(found) == want, f"{provider}:{name} appears {len(found)} time(s), expected {want}")
            for _, _, sem, arguments in found:
                expected = " ".join(f"8@{r}" for r in regs[:arity])
                check(arguments.strip() == expected, f"{provider}:{name} arguments '{arguments.strip()}' == '{expected}'")
    check(len(probes) == 3 * len(providers), f"{len(probes)} probes in total")
    # The fast path reads both alloc semaphores as one 32-bit word.
    sems = {p[0]: int(p[2], 16) for p in probes if p[1] == "alloc"}
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
    unique = [l for l in symbols.splitlines() if l.endswith(" ddheap_shared_v2")]
    check(any(" u " in l for l in unique), "ddheap_shared_v2 is a GNU unique symbol")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

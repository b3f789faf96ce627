#!/usr/bin/env python3
"""Checks the USDT notes of a program linked with libddheap.a on aarch64.

The OpenTelemetry profiler reads probe arguments straight from pt_regs, so
each note must describe them as exactly x0, x1, x2 (and x3 for realloc), in
order, 64-bit (`8@x0 ...`); each probe of each configured provider must
appear exactly once (a second copy means a tracer attaches twice), and each
must name a semaphore (non-zero address once linked), or the tracer cannot
switch sampling on. Prints one line per check, exits 1 on any failure.

usage: check_probe_notes.py READELF PROGRAM PROVIDER[,PROVIDER...]
"""
import re
import subprocess
import sys

EXPECTED = {
    "alloc": "8@x0 8@x1 8@x2",
    "free": "8@x0",
    "realloc": "8@x0 8@x1 8@x2 8@x3",
}


def main():
    readelf, program, providers = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    out = subprocess.run([readelf, "-n", "-W", program], check=True,
                         capture_output=True, text=True).stdout
    notes = re.findall(r"Provider: (\S+)\s+Name: (\S+)\s+Location: [^\n]*?"
                       r"Semaphore: (0x[0-9a-f]+)\s+Arguments: ([^\n]*)", out)
    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("ok     " if ok else "FAILED ") + what)
        failures += not ok

    check(len(notes) > 0, f"{program} has USDT notes")
    for provider in ["ddheap", "otel_memory"]:
        for name, args in EXPECTED.items():
            found = [n for n in notes if n[0] == provider and n[1] == name]
            want = 1 if provider in providers else 0
            check(len(found) == want, f"{provider}:{name} appears {len(found)} time(s), want {want}")
            for _, _, semaphore, got in found:
                check(got.strip() == args, f"{provider}:{name} arguments '{got.strip()}', want '{args}'")
                check(int(semaphore, 16) != 0, f"{provider}:{name} semaphore at {semaphore}")
    unknown = [n for n in notes if n[0] not in ("ddheap", "otel_memory")]
    check(not unknown, f"no probes of other providers ({len(unknown)} found)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

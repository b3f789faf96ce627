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
import os
import sys

import stapsdt


def main():
    readelf, program, providers = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    notes = stapsdt.read(program, readelf)
    failures = 0

    def check(ok, what):
        nonlocal failures
        print(("ok     " if ok else "FAILED ") + what)
        failures += not ok

    check(len(notes) > 0, f"{program} has USDT notes")
    stapsdt.check_each_probe_once(notes, providers, "aarch64", check, linked=True)
    unknown = [n for n in notes if n.provider not in stapsdt.PROVIDERS]
    check(not unknown, f"no probes of other providers ({len(unknown)} found)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

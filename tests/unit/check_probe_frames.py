#!/usr/bin/env python3
"""Checks, in the disassembly of the built libddheap.a, that every probe
site runs inside a frame of its probe function's own (docs/probes.md,
"Stacks"): a tracer's frame-pointer walk from the probe must find the
return address on top of the stack, the one into the allocation site when
the user's wrapper and ddheap's cold path reach the probe by tail calls.

    check_probe_frames.py ARCHIVE --cpu=x86_64|aarch64 [--objdump=PROGRAM]

For each probe note, its function must set up the frame record in its
entry block, before any branch or call, so on every path (`push %rbp; mov
%rsp,%rbp` on x86-64, `stp x29, x30, [sp, ...]; mov x29, sp` or `add x29,
sp, #N` on aarch64), and nothing between there and the probe site may take
it down again. This is the static half of the guarantee, so that it is checked
in every build, aarch64 under emulation included, where bpftrace cannot run;
tests/tracer (test "stacks") checks the walk itself.

Prints one line per check and a closing "N passed, N failed" line.
"""
import argparse
import os
import re
import subprocess
import sys

import harness
import stapsdt

FUNCTION = re.compile(r"^([0-9a-f]+) <([^>]+)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")

# What sets the frame record up, what takes it down, what ends the entry
# block (the setup must come before it, to be on every path).
X86 = {
    "setup": [lambda m, a: m == "push" and a == "%rbp",
              lambda m, a: m == "mov" and a == "%rsp,%rbp"],
    "teardown": lambda m, a: (m == "pop" and a == "%rbp") or m == "leave",
    "branch": lambda m, a: m.startswith(("j", "ret", "call")),
    "site": lambda m, a: m.startswith("nop"),
    "comment": "#",
}
AARCH64 = {
    "setup": [lambda m, a: m == "stp" and a.startswith("x29, x30, [sp"),
              lambda m, a: (m == "mov" and a == "x29, sp") or
                           (m == "add" and a.startswith("x29, sp, #"))],
    "teardown": lambda m, a: m == "ldp" and a.startswith("x29, x30,"),
    "branch": lambda m, a: m in ("b", "bl", "br", "blr", "ret", "cbz", "cbnz", "tbz", "tbnz")
                           or m.startswith("b."),
    "site": lambda m, a: m == "nop",
    "comment": "//",
}


MEMBER = re.compile(r"^\S+:\s+file format \S+$")


def text_of_probe_object(archive, objdump, comment):
    """{function: [(address, mnemonic, operands)]} of the .text of the one
    archive member that defines the probe functions; each list starts with
    the entry address (mnemonic None). `comment` starts objdump's comments
    on an instruction line ('#' on x86-64, '//' on aarch64)."""
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-j", ".text", archive],
                         check=True, capture_output=True, text=True).stdout
    members, current, func = [], None, None
    for line in out.splitlines():
        if MEMBER.match(line):
            current = {}
            members.append(current)
            func = None
            continue
        m = FUNCTION.match(line)
        if m and current is not None:
            func = current.setdefault(m.group(2), [(int(m.group(1), 16), None, None)])
            continue
        m = INSN.match(line)
        if m and func is not None:
            operands = m.group(3).split(comment)[0].strip()
            func.append((int(m.group(1), 16), m.group(2), operands))
    found = [mem for mem in members if "ddheap_fire_alloc" in mem]
    if len(found) != 1:
        raise SystemExit(f"expected one member defining ddheap_fire_alloc, found {len(found)}")
    return found[0]


def function_at(functions, address):
    """The function whose code holds `address`, and its instructions."""
    best = None
    for name, insns in functions.items():
        start = insns[0][0]
        end = insns[-1][0]
        if start <= address <= end and (best is None or start > functions[best][0][0]):
            best = name
    return best


def frame_at(insns, address, arch):
    """None if the frame record is set up in the function's entry block
    (before any branch or call, so on every path) and not taken down
    anywhere between there and the probe site at `address`; else what is
    wrong. Branches after the setup are allowed (sanitizers add some)."""
    steps = arch["setup"]
    done = 0
    for addr, mnemonic, operands in insns[1:]:
        if addr == address:
            if not arch["site"](mnemonic, operands):
                return f"the instruction at the probe site is {mnemonic} {operands}, not a nop"
            return None if done == len(steps) else "no frame record set up before the probe site"
        if addr > address:
            break
        if done < len(steps):
            if steps[done](mnemonic, operands):
                done += 1
            elif arch["branch"](mnemonic, operands):
                return f"{mnemonic} {operands} at {addr:#x}, before the frame record is set up"
        elif arch["teardown"](mnemonic, operands):
            return f"the frame record is taken down at {addr:#x}, before the probe site"
    return "no instruction at the probe site"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("archive")
    ap.add_argument("--cpu", required=True, choices=["x86_64", "aarch64"])
    ap.add_argument("--objdump", default="objdump")
    args = ap.parse_args()
    arch = X86 if args.cpu == "x86_64" else AARCH64
    c = harness.Checker("probe-frames")
    check = c.check

    functions = text_of_probe_object(args.archive, args.objdump, arch["comment"])
    notes = stapsdt.read(args.archive)
    check(len(notes) > 0, f"{len(notes)} probe notes in the archive")
    for note in notes:
        name = function_at(functions, note.location)
        what = f"{note.provider}:{note.name} at {note.location:#x}"
        if name is None:
            check(False, f"{what}: in no function of .text")
            continue
        problem = frame_at(functions[name], note.location, arch)
        check(problem is None, f"{what} in {name}: " + (problem or "inside its own frame"))
    return c.summary()


if __name__ == "__main__":
    sys.exit(main())

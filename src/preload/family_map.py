#!/usr/bin/env python3
"""Writes libddheap_preload.so's version script from the malloc family's
table (src/malloc_family.def): the family's names, and the state every copy
of ddheap in a process shares. Run by meson (src/preload/meson.build).

    family_map.py FAMILY_DEF OUTPUT
"""
import re
import sys

ENTRY = re.compile(r"^DDHEAP_FAMILY(?:_C23)?\((\w+),")


def main():
    family_def, output = sys.argv[1:3]
    with open(family_def) as f:
        names = [m.group(1) for m in map(ENTRY.match, f) if m]
    if not names:
        sys.exit(f"{family_def}: no DDHEAP_FAMILY lines")
    with open(output, "w") as out:
        out.write("/* Generated from src/malloc_family.def by src/preload/family_map.py.\n"
                  " * Exported: the malloc family and the state every copy of ddheap in a\n"
                  " * process shares (src/shared.c, src/rate.c); ddheap's own functions\n"
                  " * stay local. */\n{\n  global:\n")
        out.write("".join(f"    {n};\n" for n in names))
        out.write("    ddheap_shared_v*; ddheap_rate_v*;\n  local: *;\n};\n")


if __name__ == "__main__":
    main()

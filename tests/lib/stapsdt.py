"""The USDT probes of an ELF file (an object, an archive or a linked
program) as `readelf -n` describes them, and the one check every consumer
of ddheap's probe contract relies on (docs/probes.md).

Used by tests/unit/check_archive.py (the archive), tests/tbi/
check_probe_notes.py (a linked aarch64 program), tests/lib/harness.py
(semaphore addresses) and bench/run (where each probe site sits).
"""
import collections
import re
import subprocess

Note = collections.namedtuple("Note", "provider name location semaphore arguments")

_NOTE = re.compile(r"Provider: (\S+)\s+Name: (\S+)\s+Location: (0x[0-9a-f]+), Base: 0x[0-9a-f]+, "
                   r"Semaphore: (0x[0-9a-f]+)\s+Arguments: ([^\n]*)")

# The contract: each probe's arguments in the SysV argument registers, in
# order, 64-bit, because the OpenTelemetry profiler reads them from pt_regs.
REGISTERS = {
    "x86_64": ["%rdi", "%rsi", "%rdx", "%rcx"],
    "aarch64": ["x0", "x1", "x2", "x3"],
}
ARITY = {"alloc": 3, "free": 1, "realloc": 4}
PROVIDERS = ("ddheap", "otel_memory")


def read(path, readelf="readelf"):
    """Every stapsdt note of `path`, addresses as integers."""
    out = subprocess.run([readelf, "-n", "-W", path], check=True, capture_output=True,
                         text=True).stdout
    return [Note(p, n, int(loc, 16), int(sem, 16), args.strip())
            for p, n, loc, sem, args in _NOTE.findall(out)]


def check_each_probe_once(notes, providers, cpu, check, linked=False):
    """Each probe of each configured provider appears exactly once (a second
    copy makes a tracer attach twice), with its arguments in the argument
    registers; in a linked program (`linked`) each also names a semaphore,
    or a tracer could not switch sampling on. `check(ok, what)` reports."""
    regs = REGISTERS[cpu]
    for provider in PROVIDERS:
        for name, arity in ARITY.items():
            found = [n for n in notes if n.provider == provider and n.name == name]
            want = 1 if provider in providers else 0
            check(len(found) == want, f"{provider}:{name} appears {len(found)} time(s), expected {want}")
            expected = " ".join(f"8@{r}" for r in regs[:arity])
            for n in found:
                check(n.arguments == expected, f"{provider}:{name} arguments '{n.arguments}' == '{expected}'")
                if linked:
                    check(n.semaphore != 0, f"{provider}:{name} semaphore at {n.semaphore:#x}")

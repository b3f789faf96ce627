#!/usr/bin/env python3
"""ddheap-prof's DWARF unwinding and names, on programs built the way
Debian builds them (no frame pointers): a plain `cc -O2` C program, a plain
`g++ -O2` C++ program (both built here, by the test, with nothing but -O2),
and Debian's own python3 and sqlite3, all run under the preload library.
Read back with `go tool pprof` and the profile's own Function table.

    test_unwind.py TEST DDHEAP_PROF PRELOAD_LIB DDHEAP_RUN ARTIFACT_DIR

TEST is one of the keys of TESTS. Needs root (BPF); exits 77 (skipped)
only when not root; fails when a compiler, go, python3, sqlite3 or
heaptrack is missing. Ends with "N passed, N failed".
"""

import os
import re
import subprocess
import sys

from harness import Failure, need, run_prof_test, sigma
from pprof_read import pprof, read_functions, read_raw

TIMEOUT = 300
HERE = os.path.dirname(os.path.abspath(__file__))
INTERVAL = 65536

# The allocator's frames, which must never be on top of a stack (the
# profiler's names.c; a sample of the rule, as the user sees the names).
ALLOCATOR_NAMES = {"malloc", "calloc", "realloc", "free", "posix_memalign", "aligned_alloc",
                   "memalign", "valloc", "pvalloc", "reallocarray"}
ALLOCATOR_PREFIXES = ("ddheap_", "dd_", "operator new", "operator delete", "__libc_malloc",
                      "_int_malloc")


def is_allocator(name):
    return name in ALLOCATOR_NAMES or name.startswith(ALLOCATOR_PREFIXES)


def compile_program(compiler, source, out, *more):
    """Builds SOURCE with `COMPILER -O2` and nothing else (Debian's default
    flags leave frame pointers out and sibling calls on), or with MORE
    arguments where a test says so."""
    r = subprocess.run([need(compiler), "-O2", "-o", out, source] + list(more),
                       capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        raise Failure(f"{compiler} -O2 {source} failed:\n{r.stderr}")
    return out


def quick_walk_agrees(c, err, name):
    """The quick walk (tools/ddheap-prof/unwind.c) unwound some of the
    run's stacks, each to exactly the frames and end libdwfl's walk gave."""
    m = re.search(r"unwinding checked on (\d+) stacks: (\d+) differ", err)
    checked, differ = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    c.check(checked > 0 and differ == 0,
            f"{name}: quick walk checked against libdwfl's on {checked} stacks, "
            f"{differ} differ (some checked, none differ)")


def profile_built(prof, preload, artifacts, compiler, source, name, scale):
    """Builds tests/prof/SOURCE with `COMPILER -O2` and profiles it through
    the preload library: returns (pb path, paths, truth file)."""
    exe = compile_program(compiler, os.path.join(HERE, source),
                          os.path.join(artifacts, source.replace(".", "_")))
    truth = os.path.join(artifacts, f"{name}.truth")
    pb, _, paths = profile(prof, [], [exe, truth, scale], artifacts, name,
                           {"LD_PRELOAD": preload})
    return pb, paths, truth


def profile(prof, args, cmd, artifacts, name, env=None, check=True):
    """ddheap-prof -v ARGS -o NAME.pb.gz --folded --svg -- CMD; returns
    (pb path, stderr, paths). Every DWARF walk is made twice, the quick
    one by cached rules and libdwfl's (DDHEAP_PROF_CHECK_UNWIND=1), the
    profile keeping libdwfl's: quick_walk_agrees() reads the comparison."""
    paths = {k: os.path.join(artifacts, f"{name}.{k}") for k in ("pb.gz", "folded", "svg")}
    for p in paths.values():
        if os.path.exists(p):
            os.unlink(p)
    r = subprocess.run([prof, "-v", "-o", paths["pb.gz"], "--folded", paths["folded"],
                        "--svg", paths["svg"], "--value", "alloc_space"] + args + ["--"] + cmd,
                       capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, DD_HEAP_SAMPLING_INTERVAL=str(INTERVAL),
                                DDHEAP_PROF_CHECK_UNWIND="1", **(env or {})))
    err = "\n".join(l for l in r.stderr.splitlines() if not l.startswith("libbpf:"))
    if check and r.returncode != 0:
        raise Failure(f"ddheap-prof exited with {r.returncode}:\n{err[-3000:]}")
    return paths["pb.gz"], err, paths


def stacks(raw, sample_type="alloc_space"):
    """[(value, [function names, innermost first, inlined ones included])]."""
    k = raw["types"].index(sample_type)
    out = []
    for values, ids in raw["samples"]:
        names = [f for i in ids for f in raw["locs"][i]["functions"]]
        out.append((values[k], names))
    return out


def share(sts, pred):
    total = sum(v for v, _ in sts)
    return sum(v for v, names in sts if pred(names)) / total if total else 0.0


def read_truth(path):
    """'site size count' lines: {(site, size): {"alloc_count": n}}, {site: bytes}."""
    sizes, totals = {}, {}
    with open(path) as f:
        for line in f:
            site, size, count = line.split()
            sizes[(site, int(size))] = {"alloc_count": int(count)}
            totals[site] = totals.get(site, 0) + int(size) * int(count)
    return sizes, totals


def check_sites(c, raw, sizes, totals, name_of):
    """Per site: alloc_space of the stacks naming it within 5 sigma of the
    program's own count."""
    for site, true in totals.items():
        est = sum(v for v, names in stacks(raw) if any(name_of(n) == site for n in names))
        sd = sigma(sizes, site, "alloc_count", INTERVAL)
        c.check(abs(est - true) <= 5 * sd,
                f"alloc_space of {site}: estimated {est}, true {true}, |diff| "
                f"{abs(est - true)} <= 5 sigma = {5 * sd:.0f}")


def show(pb, what):
    """The profile as a user reads it, in the test's log."""
    print(f"--- {what}: go tool pprof -top")
    print("\n".join(pprof(pb, "-sample_index=alloc_space", "-top").splitlines()[:18]))
    print(f"--- {what}: go tool pprof -traces (first stacks)")
    print("\n".join(pprof(pb, "-sample_index=alloc_space", "-traces").splitlines()[:40]))


C_SITES = ["site_small", "site_medium", "site_large"]


def test_c_o2(c, prof, preload, run, artifacts):
    """A plain -O2 C program: every site named, with its caller and main
    (>= 99 % of alloc_space), on top, its bytes within 5 sigma; the
    frame-pointer walk (--unwind=fp) of the same program does not reach
    main, which shows the program really has no frame pointers."""
    pb, paths, truth = profile_built(prof, preload, artifacts, "cc", "unwind_sites.c", "c-o2",
                                     "1000")
    exe = os.path.join(artifacts, "unwind_sites_c")
    show(pb, "plain -O2 C, --unwind=dwarf")
    raw = read_raw(pb)
    sts = stacks(raw)
    sizes, totals = read_truth(truth)
    for site in C_SITES:
        s = share([x for x in sts if site in x[1]],
                  lambda n: n[0] == site and "run_sites" in n and "main" in n)
        mine = sum(v for v, n in sts if site in n) / max(1, sum(v for v, _ in sts))
        c.check(mine > 0 and s >= 0.99,
                f"{site}: on top, under run_sites and main, in {s:.4f} of its alloc_space "
                f"(>= 0.99)")
    named = share(sts, lambda n: any(x in n for x in C_SITES) and "main" in n)
    c.check(named >= 0.99, f"stacks naming a site and main: {named:.4f} of alloc_space (>= 0.99)")
    check_sites(c, raw, sizes, totals, lambda n: n)
    c.check("[truncated]" not in open(paths["folded"]).read(), "no stack truncated at 16 KiB")

    pb, err, _ = profile(prof, ["--unwind=fp"], [exe, truth, "1000"], artifacts, "c-o2-fp",
                         {"LD_PRELOAD": preload})
    show(pb, "plain -O2 C, --unwind=fp")
    fp = share(stacks(read_raw(pb)), lambda n: "main" in n)
    c.check(fp < 0.5, f"--unwind=fp reaches main in {fp:.4f} of alloc_space (< 0.5: the "
                      f"program has no frame pointers, so only CFI names its callers)")


def test_c_children(c, prof, preload, run, artifacts):
    """Two runs of the plain -O2 C program at once, forked and exec'd by a
    shell (ddheap-prof follows it): each process's stacks are unwound with
    its own objects (ASLR puts each run's program and libraries at their
    own addresses), so in each, under its own pid label, every site is on
    top under run_sites and main, and the sites' bytes over both runs are
    within 5 sigma of the truth."""
    exe = compile_program("cc", os.path.join(HERE, "unwind_sites.c"),
                          os.path.join(artifacts, "unwind_sites_children"))
    truths = [os.path.join(artifacts, f"c-children-{i}.truth") for i in (1, 2)]
    script = f'"$0" {truths[0]} 1000 & "$0" {truths[1]} 1000 & wait'
    # Both runs together send about 25 MB of stack copies in a fraction of
    # a second: a ring buffer that holds them all, so that no event is lost
    # whatever the reader's speed (a debug build unwinds slower).
    pb, err, _ = profile(prof, ["--ringbuf-kb", "65536"], ["sh", "-c", script, exe], artifacts,
                         "c-children", {"LD_PRELOAD": preload})
    print("--- ddheap-prof's stderr\n" + err)
    raw = read_raw(pb)
    k = raw["types"].index("alloc_space")
    by_pid = {}
    for (values, ids), labels in zip(raw["samples"], raw["labels"]):
        names = [f for i in ids for f in raw["locs"][i]["functions"]]
        if any(site in names for site in C_SITES):
            by_pid.setdefault(labels.get("pid"), []).append((values[k], names))
    c.check("LOST" not in err, "no event lost")
    c.check(len(by_pid) == 2 and None not in by_pid,
            f"the sites' samples come from two pids, each labelled: {sorted(map(str, by_pid))}")
    for pid, sts in sorted(by_pid.items(), key=lambda x: str(x[0])):
        s = share(sts, lambda n: n[0] in C_SITES and "run_sites" in n and "main" in n)
        c.check(s >= 0.99, f"pid {pid}: a site on top, under run_sites and main, in {s:.4f} of "
                           f"the sites' alloc_space (>= 0.99)")
    sizes, totals = {}, {}
    for truth in truths:
        one_sizes, one_totals = read_truth(truth)
        for key, v in one_sizes.items():
            sizes.setdefault(key, {"alloc_count": 0})["alloc_count"] += v["alloc_count"]
        for site, v in one_totals.items():
            totals[site] = totals.get(site, 0) + v
    check_sites(c, raw, sizes, totals, lambda n: n)


def test_c_truncated(c, prof, preload, run, artifacts):
    """A site under 24 frames of 2 KiB: with --stack-bytes 4096 the copy
    ends long before main, and every stack says so ("[truncated]"
    outermost) instead of ending quietly; with 65536 they reach main."""
    exe = compile_program("cc", os.path.join(HERE, "unwind_sites.c"),
                          os.path.join(artifacts, "unwind_sites_deep"))
    truth = os.path.join(artifacts, "c-deep.truth")
    pb, err, _ = profile(prof, ["--stack-bytes", "4096"], [exe, truth, "deep"], artifacts,
                         "c-deep-4k", {"LD_PRELOAD": preload})
    quick_walk_agrees(c, err, "--stack-bytes 4096")
    sts = [x for x in stacks(read_raw(pb)) if "site_deep" in x[1]]
    marked = share(sts, lambda n: n[-1] == "[truncated]")
    c.check(sts and marked == 1.0,
             f"--stack-bytes 4096: stacks of site_deep ending in [truncated]: {marked:.4f} (1.0)")
    pb, err, _ = profile(prof, ["--stack-bytes", "65536"], [exe, truth, "deep"], artifacts,
                         "c-deep-64k", {"LD_PRELOAD": preload})
    quick_walk_agrees(c, err, "--stack-bytes 65536")
    sts = [x for x in stacks(read_raw(pb)) if "site_deep" in x[1]]
    full = share(sts, lambda n: "main" in n and n.count("recurse") == 25)
    c.check(sts and full >= 0.99,
            f"--stack-bytes 65536: site_deep under 25 recurse frames and main: {full:.4f}")


def test_c_nocfi(c, prof, preload, run, artifacts):
    """A frame without CFI between two with it (unwind_nocfi.c): libdwfl
    takes that one step by the frame pointer and goes on by CFI, so the
    site's stacks reach main through nocfi_middle."""
    mid = os.path.join(artifacts, "unwind_nocfi_mid.o")
    compile_program("cc", os.path.join(HERE, "unwind_nocfi_mid.c"), mid, "-c",
                    "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables",
                    "-fno-unwind-tables")
    exe = compile_program("cc", os.path.join(HERE, "unwind_nocfi.c"),
                          os.path.join(artifacts, "unwind_nocfi"), mid, "-fno-omit-frame-pointer")
    frames = subprocess.run(["readelf", "--debug-dump=frames", mid], capture_output=True,
                            text=True).stdout
    c.check("FDE" not in frames, "nocfi_middle has no CFI (no FDE in its object)")
    pb, err, _ = profile(prof, [], [exe, "3000"], artifacts, "c-nocfi", {"LD_PRELOAD": preload})
    show(pb, "a frame without CFI")
    sts = [x for x in stacks(read_raw(pb)) if "nocfi_site" in x[1]]
    through = share(sts, lambda n: n[:3] == ["nocfi_site", "nocfi_middle", "main"])
    c.check(sts and through >= 0.99,
            f"nocfi_site, nocfi_middle, main on top of the stacks: {through:.4f} (>= 0.99)")


CXX_FUNCTIONS = ["make_vectors", "make_maps", "make_strings", "make_records", "make_arrays"]


def test_cxx(c, prof, preload, run, artifacts):
    """A plain g++ -O2 program: the five functions that allocate (through
    vector, map, string, new, new[]) each named, demangled (pprof's name
    demangled, system_name mangled; the same names in the folded stacks
    and the SVG), on every stack of its bytes, within 5 sigma of the
    program's own count; no allocator frame on top."""
    pb, paths, truth = profile_built(prof, preload, artifacts, "g++", "unwind_sites.cc", "cxx",
                                     "20000")
    show(pb, "plain g++ -O2")
    funcs = read_functions(pb)
    by_name = {f["name"]: f for f in funcs}
    folded = open(paths["folded"]).read()
    svg = open(paths["svg"]).read()
    for fn in CXX_FUNCTIONS:
        want = f"{fn}(int)"
        f = by_name.get(want)
        c.check(f is not None and f["system_name"].startswith("_Z") and fn in f["system_name"],
                f"{want}: demangled name, mangled system_name "
                f"({f['system_name'] if f else 'not in the profile'})")
        c.check(f";{want};" in folded or folded.count(want) > 0,
                f"{want} in the folded stacks")
        c.check(want in svg, f"{want} in the SVG")
    mangled = [f["name"] for f in funcs if f["name"].startswith("_Z")]
    c.check(not mangled, f"no mangled name shown: {mangled[:5]}")
    raw = read_raw(pb)
    sts = stacks(raw)
    top = share(sts, lambda n: not is_allocator(n[0]))
    c.check(top == 1.0, f"no allocator frame on top: {top:.4f} of alloc_space")
    reach = share(sts, lambda n: any(f"{fn}(int)" in n for fn in CXX_FUNCTIONS) and "main" in n)
    c.check(reach >= 0.99, f"stacks naming one of the five functions and main: {reach:.4f}")
    sizes, totals = read_truth(truth)
    check_sites(c, raw, sizes, totals, lambda n: n[:-5] if n.endswith("(int)") else None)


PYTHON_CODE = """
import json
rows = [{"id": i, "name": "row %d" % i, "tags": [str(i)] * 4} for i in range(150000)]
text = json.dumps(rows)
back = json.loads(text)
print(len(text), len(back))
"""

SQLITE_SQL = """
CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, blob BLOB);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)
INSERT INTO t SELECT x, printf('row %d', x), randomblob(200) FROM c;
CREATE INDEX t_name ON t(name);
SELECT count(*), sum(length(blob)) FROM t GROUP BY id % 7;
"""


def heaptrack_report(c, cmd, artifacts, name, stdin=None):
    """The same workload under heaptrack (libunwind, in process, every
    call): its stack depth and top frames, for the log. Returns (mean
    depth, top frames by allocations), or None."""
    need("heaptrack")
    need("heaptrack_print")
    out = os.path.join(artifacts, f"{name}.heaptrack")
    for f in os.listdir(artifacts):
        if f.startswith(f"{name}.heaptrack"):
            os.unlink(os.path.join(artifacts, f))
    r = subprocess.run(["heaptrack", "-o", out] + cmd, input=stdin, capture_output=True,
                       text=True, timeout=TIMEOUT)
    data = [f for f in os.listdir(artifacts) if f.startswith(f"{name}.heaptrack")]
    if r.returncode != 0 or not data:
        c.check(False, f"heaptrack ran: {r.stderr[-500:]}")
        return None
    folded = os.path.join(artifacts, f"{name}.heaptrack.folded")
    subprocess.run(["heaptrack_print", "-f", os.path.join(artifacts, data[0]), "-F", folded,
                    "--flamegraph-cost-type", "allocations"], capture_output=True,
                   timeout=TIMEOUT)
    total = reach = depth = 0
    tops = {}
    with open(folded) as f:
        for line in f:
            stack, _, value = line.rstrip("\n").rpartition(" ")
            frames = stack.rstrip(";").split(";")  # root first, a ';' after the leaf
            n = int(value)
            total += n
            depth += n * len(frames)
            reach += n if any(fr.startswith(("__libc_start_main", "__libc_start_call_main"))
                              for fr in frames) else 0
            tops[frames[-1]] = tops.get(frames[-1], 0) + n
    if not total:
        c.check(False, f"heaptrack recorded allocations of {name}")
        return None
    top = sorted(tops.items(), key=lambda kv: -kv[1])[:5]
    print(f"heaptrack ({name}): {total} allocations, mean depth {depth / total:.1f}, "
          f"reaching main {reach / total:.4f}; top frames "
          f"{[(t, round(n / total, 3)) for t, n in top]}")
    return depth / total, [t for t, _ in top]


def report_depth(sts, name):
    """Prints and returns (mean depth, top frames by alloc_space)."""
    total = sum(v for v, _ in sts) or 1
    depth = sum(v * len(n) for v, n in sts) / total
    tops = {}
    for v, n in sts:
        tops[n[0]] = tops.get(n[0], 0) + v
    top = sorted(tops.items(), key=lambda kv: -kv[1])[:5]
    print(f"ddheap-prof ({name}): mean depth {depth:.1f} (alloc_space weighted); top frames "
          f"{[(t, round(v / total, 3)) for t, v in top]}")
    return depth, [t for t, _ in top]


def reaches_main(names):
    """main's frame was unwound: its caller, glibc's __libc_start_call_main
    (named from libc6-dbg's symbols) or __libc_start_main (exported), is
    on the stack. A program's main itself is unnamed when it is stripped."""
    return "__libc_start_call_main" in names or "__libc_start_main" in names


def check_real_program(c, sts, name, through):
    reach = share(sts, reaches_main)
    c.check(reach >= 0.95, f"{name}: stacks reaching main (main's caller in glibc on the "
                           f"stack): {reach:.4f} of alloc_space (>= 0.95)")
    for fn in through:
        s = share(sts, lambda n: fn in n)
        c.check(s >= 0.95, f"{name}: stacks through {fn}: {s:.4f} (>= 0.95)")
    top = share(sts, lambda n: not is_allocator(n[0]))
    c.check(top == 1.0, f"{name}: no allocator frame on top: {top:.4f} of alloc_space")


def test_python(c, prof, preload, run, artifacts):
    """Debian's python3 (stripped, no frame pointers) under ddheap-run:
    stacks reach main through Py_RunMain and the interpreter's
    _PyEval_EvalFrameDefault; heaptrack's view of the same workload is
    printed beside it."""
    python = need("python3")
    # A script file, not -c: heaptrack cannot parse a command line with
    # newlines in it.
    script = os.path.join(artifacts, "workload.py")
    with open(script, "w") as f:
        f.write(PYTHON_CODE)
    pb, err, _ = profile(prof, [], [run, python, script], artifacts, "python",
                         {"DDHEAP_PRELOAD_LIB": preload})
    show(pb, "python3")
    quick_walk_agrees(c, err, "python3")
    sts = stacks(read_raw(pb, c))
    check_real_program(c, sts, "python3", ["Py_RunMain", "_PyEval_EvalFrameDefault"])
    report_depth(sts, "python3")
    heaptrack_report(c, [python, script], artifacts, "python")


def test_sqlite(c, prof, preload, run, artifacts):
    """Debian's sqlite3 (the program and libsqlite3 stripped, no frame
    pointers) under ddheap-run. Its shell keeps 17-24 KiB of stack between
    main and sqlite's allocator: with the default 16 KiB copy, a stack
    either reaches main or says "[truncated]" (never ends quietly short);
    with --stack-bytes 32768 stacks reach main. heaptrack beside it."""
    sqlite = need("sqlite3")
    script = os.path.join(artifacts, "sqlite.sql")
    with open(script, "w") as f:
        f.write(SQLITE_SQL)
    cmd = [sqlite, ":memory:", f".read {script}"]
    pb, err, _ = profile(prof, [], [run] + cmd, artifacts, "sqlite",
                         {"DDHEAP_PRELOAD_LIB": preload})
    show(pb, "sqlite3, --stack-bytes 16384 (the default)")
    quick_walk_agrees(c, err, "sqlite3")
    sts = stacks(read_raw(pb))
    marked = share(sts, lambda n: reaches_main(n) or n[-1] == "[truncated]")
    c.check(marked == 1.0, f"sqlite3, 16 KiB: stacks reaching main or marked [truncated]: "
                           f"{marked:.4f} (1.0); reaching main {share(sts, reaches_main):.4f}")
    top = share(sts, lambda n: not is_allocator(n[0]))
    c.check(top == 1.0, f"sqlite3: no allocator frame on top: {top:.4f} of alloc_space")
    pb, err, _ = profile(prof, ["--stack-bytes", "32768"], [run] + cmd, artifacts, "sqlite-32k",
                         {"DDHEAP_PRELOAD_LIB": preload})
    show(pb, "sqlite3, --stack-bytes 32768")
    sts = stacks(read_raw(pb))
    check_real_program(c, sts, "sqlite3 (32 KiB)", [])
    depth, top = report_depth(sts, "sqlite3")
    ht = heaptrack_report(c, cmd, artifacts, "sqlite")
    if ht:
        # Both unwind every stack by CFI, so they agree on what is robust:
        # how deep the stacks are, and the code that calls malloc most
        # (unnamed in stripped libsqlite3: compared by its page offset,
        # the last three hex digits of the address).
        c.check(abs(depth - ht[0]) <= 0.25 * ht[0],
                f"sqlite3: mean depth {depth:.1f}, heaptrack's {ht[0]:.1f} (within 25 %)")
        ours = {t[-3:] for t in top[:2]}
        c.check(ht[1][0][-3:] in ours,
                f"sqlite3: heaptrack's top frame {ht[1][0]} is one of ours {top[:2]}")


TESTS = {"c-o2": test_c_o2, "c-truncated": test_c_truncated, "c-nocfi": test_c_nocfi,
         "c-children": test_c_children,
         "cxx": test_cxx,
         "python": test_python, "sqlite": test_sqlite}


if __name__ == "__main__":
    # PRELOAD_LIB and DDHEAP_RUN are handed on to other programs (in
    # LD_PRELOAD or DDHEAP_PRELOAD_LIB, after `--`): made absolute, so
    # that no working directory matters.
    sys.exit(run_prof_test(__doc__, TESTS, 4, absolute=(1, 2)))

"""Reading ddheap-prof's profiles back: Debian's `go tool pprof` (-raw,
-top, -traces, -tags), run offline with its caches in a scratch directory,
and a small reader of the gzipped profile.proto itself for what pprof does
not print (Function.system_name) or prints rounded (sample values and
numeric labels, exactly).
"""

import gzip
import os
import re
import subprocess
import tempfile

from harness import Failure, need

TIMEOUT = 120


def pprof(profile, *args):
    """`go tool pprof`, offline, with its caches in a scratch directory."""
    need("go", "golang-go")
    with tempfile.TemporaryDirectory(prefix="ddheap-go-") as home:
        env = dict(os.environ, HOME=home, GOCACHE=os.path.join(home, "cache"),
                   GOPATH=os.path.join(home, "path"), GOTOOLCHAIN="local", GOPROXY="off",
                   PPROF_TMPDIR=home)
        r = subprocess.run(["go", "tool", "pprof", "-symbolize=none"] + list(args) + [profile],
                           capture_output=True, text=True, env=env, timeout=TIMEOUT)
    if r.returncode != 0:
        raise Failure(f"go tool pprof {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


def read_raw(profile, checker=None):
    """`pprof -raw`: sample types, samples (values, location ids) and
    their labels ({name: value} each), the function (and file:line) of
    each location, mappings and comments. A function pprof shows with an
    empty name is read as "" and its location listed in "unnamed"; with a
    checker (harness), that no location is unnamed is one of its checks."""
    text = pprof(profile, "-raw")
    out = {"types": [], "samples": [], "labels": [], "locs": {}, "mappings": [], "comments": [],
           "unnamed": []}
    section = None
    for line in text.splitlines():
        if line.startswith("Comment: "):
            out["comments"].append(line[len("Comment: "):])
        elif line == "Samples:":
            section = "samples-head"
        elif line == "Locations":
            section = "locs"
        elif line == "Mappings":
            section = "maps"
        elif section == "samples-head":
            out["types"] = [t.split("/")[0] for t in line.replace("[dflt]", "").split()]
            section = "samples"
        elif section == "samples":
            if re.match(r"^\s+(\w+:\[[^\]]*\]\s*)+$", line):
                # the labels of the sample above, on one line:
                # lifetime:[131072 nanoseconds] pid:[1234]
                out["labels"][-1].update(re.findall(r"(\w+):\[([^\]]*)\]", line))
                continue
            values, _, ids = line.partition(":")
            out["samples"].append(([int(v) for v in values.split()], [int(i) for i in ids.split()]))
            out["labels"].append({})
        elif section == "locs":
            # "ID: ADDR [M=MAPPING] NAME FILE:LINE s=START[(SYSTEM_NAME)]", then
            # one "NAME FILE:LINE ..." line per function inlined there; an
            # empty NAME leaves two spaces.
            m = re.match(r"^\s*(\d+): (0x[0-9a-f]+)(?: M=(\d+))? (.*) (\S+) s=\d+(?:\(.*\))?$",
                         line)
            if m:
                name = m.group(4)
                last = out["locs"][int(m.group(1))] = {
                    "addr": int(m.group(2), 16), "mapping": int(m.group(3) or 0),
                    "function": name, "file": m.group(5), "functions": [name]}
            else:
                m = re.match(r"^\s+(.*) (\S+) s=\d+(?:\(.*\))?$", line)
                if not m:
                    continue
                name = m.group(1)
                last["functions"].append(name)
            if name == "":
                out["unnamed"].append(line.strip())
        elif section == "maps":
            m = re.match(r"^(\d+): (0x[0-9a-f]+)/(0x[0-9a-f]+)/(0x[0-9a-f]+) (\S+) ?(\S*)", line)
            if m:
                out["mappings"].append({"id": int(m.group(1)), "file": m.group(5),
                                        "build_id": m.group(6)})
    if not out["types"]:
        raise Failure("pprof -raw printed no sample types:\n" + text[:2000])
    if checker is not None:
        checker.check(not out["unnamed"],
                      f"{os.path.basename(profile)}: every location's function has a name in "
                      f"pprof -raw: {len(out['unnamed'])} without"
                      + "".join(f"\n    {l}" for l in out["unnamed"][:10]))
    return out


def _varint(buf, at):
    value, shift = 0, 0
    while True:
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, at


def _fields(buf):
    """(field number, wire type, value) of one protobuf message; value is an
    int for varints, bytes for length-delimited fields."""
    at = 0
    while at < len(buf):
        key, at = _varint(buf, at)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 2:
            n, at = _varint(buf, at)
            value, at = buf[at:at + n], at + n
        elif wire == 1:
            value, at = buf[at:at + 8], at + 8
        elif wire == 5:
            value, at = buf[at:at + 4], at + 4
        else:
            raise Failure(f"profile.proto: wire type {wire} not understood")
        yield num, wire, value


def read_functions(profile):
    """Every Function of the profile as {"name", "system_name", "filename"}
    (profile.proto: Profile.function = 5, string_table = 6; Function.name =
    2, system_name = 3, filename = 4, all string-table indices)."""
    with gzip.open(profile, "rb") as f:
        data = f.read()
    strings, funcs = [], []
    for num, wire, value in _fields(data):
        if num == 6 and wire == 2:
            strings.append(value.decode("utf-8", "replace"))
        elif num == 5 and wire == 2:
            fn = {2: 0, 3: 0, 4: 0}
            for n, w, v in _fields(value):
                if n in fn and w == 0:
                    fn[n] = v
            funcs.append(fn)
    return [{"name": strings[f[2]], "system_name": strings[f[3]], "filename": strings[f[4]]}
            for f in funcs]


def _ints(wire, value):
    """A repeated integer field's numbers: packed (length-delimited) or one
    varint."""
    if wire == 0:
        return [value]
    out, at = [], 0
    while at < len(value):
        x, at = _varint(value, at)
        out.append(x)
    return out


def _signed(x):
    return x - (1 << 64) if x >= 1 << 63 else x


def read_samples(profile):
    """The samples of the profile as it is stored: {"types": [sample type],
    "samples": [(functions innermost first, values, labels {key: num or
    str})], "comments": [...]} (profile.proto: Profile.sample_type = 1,
    sample = 2, location = 4, function = 5, string_table = 6, comment = 13;
    Sample.location_id = 1, value = 2, label = 3; Label.key = 1, str = 2,
    num = 3; Location.id = 1, line = 4; Line.function_id = 1; Function.id =
    1, name = 2; ValueType.type = 1)."""
    with gzip.open(profile, "rb") as f:
        data = f.read()
    strings, types, raw, locs, funcs, comments = [], [], [], {}, {}, []
    for num, wire, value in _fields(data):
        if num == 6 and wire == 2:
            strings.append(value.decode("utf-8", "replace"))
        elif num == 1 and wire == 2:
            types.append(dict((n, v) for n, _, v in _fields(value)).get(1, 0))
        elif num == 2 and wire == 2:
            ids, values, labels = [], [], []
            for n, w, v in _fields(value):
                if n == 1:
                    ids += _ints(w, v)
                elif n == 2:
                    values += [_signed(x) for x in _ints(w, v)]
                elif n == 3 and w == 2:
                    labels.append({k: x for k, _, x in _fields(v)})
            raw.append((ids, values, labels))
        elif num == 4 and wire == 2:
            loc_id, lines = 0, []
            for n, w, v in _fields(value):
                if n == 1:
                    loc_id = v
                elif n == 4 and w == 2:
                    lines.append({k: x for k, _, x in _fields(v)}.get(1, 0))
            locs[loc_id] = lines
        elif num == 5 and wire == 2:
            fn = {n: v for n, _, v in _fields(value)}
            funcs[fn.get(1, 0)] = fn.get(2, 0)
        elif num == 13:
            comments += _ints(wire, value)
    samples = []
    for ids, values, labels in raw:
        names = [strings[funcs[f]] for i in ids for f in locs.get(i, [])]
        samples.append((names, values,
                        {strings[l.get(1, 0)]: strings[l[2]] if l.get(2) else l.get(3, 0)
                         for l in labels}))
    return {"types": [strings[t] for t in types], "samples": samples,
            "comments": [strings[c] for c in comments]}

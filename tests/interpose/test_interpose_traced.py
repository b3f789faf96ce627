#!/usr/bin/env python3
"""dd_heap_interpose_libc() under a real tracer (suite 'tracer', shadow
builds): bpftrace attached by pid to the probes of the library that holds
ddheap (tests/interpose/got_agent.c) while test_interpose_got --traced
turns the rewrite on after start, allocates from the executable (1001
bytes), from a library linked before start (1002) and from one dlopen'ed
after the rewrite, turns it off and allocates again (1003 bytes, which no
tracer may see). At interval 1 every allocation through the wrappers is
reported: exactly 100 of 1001 and of 1002 bytes, none of 1003, at least
the plugin's own count besides, and every free follows an alloc of the
same pointer.

    test_interpose_traced.py PROGRAM AGENT_LIBRARY
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
import harness
from harness import Workload

SCRIPT = """
BEGIN { printf("READY\\n"); }
usdt:$1:ddheap:alloc
{
	if (@live[arg0]) { @alloc_of_live = count(); }
	@live[arg0] = 1;
	@allocs = count();
	if (arg1 == 1001) { @exe = count(); }
	if (arg1 == 1002) { @linked = count(); }
	if (arg1 == 1003) { @after_stop = count(); }
	if (arg1 != arg2) { @weight_not_size = count(); }
}
usdt:$1:ddheap:free
{
	if (@live[arg0]) { delete(@live[arg0]); @frees = count(); }
	else { @unmatched = count(); }
}
END { clear(@live); }
"""


def run(c, program, agent):
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"got-{os.getpid()}.bt"), "w") as f:
        f.write(SCRIPT)
        script = f.name
    try:
        with Workload(program, ["--traced"], {"DD_HEAP_SAMPLING_INTERVAL": "1"}) as w:
            w.wait_line("got: pid")
            t = w.attach(script, [agent], "READY")
            w.send("go")
            done = w.wait_line("got: done")
            out = t.stop()
            c.equal(w.exit(), 0, "exit status")
    finally:
        os.unlink(script)
    plugin = int(done.split("plugin_allocs=")[1].split()[0])
    r = harness.results(out)
    c.equal(r["exe"], 100, "alloc events of the executable's 1001-byte blocks")
    c.equal(r["linked"], 100, "alloc events of the linked library's 1002-byte blocks")
    c.equal(r["after_stop"], 0, "alloc events after stop (1003-byte blocks)")
    c.check(r["allocs"] >= 200 + plugin,
            f"alloc events: {r['allocs']} >= 200 + the dlopen'ed plugin's {plugin}")
    c.check(r["frees"] >= 200 + plugin, f"matched free events: {r['frees']} >= {200 + plugin}")
    c.equal(r["unmatched"], 0, "frees with no prior alloc of the same pointer")
    c.equal(r["alloc_of_live"], 0, "allocs of a pointer still live")
    c.equal(r["weight_not_size"], 0, "events with weight != size at interval 1")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    return harness.run_checks("interpose-traced", lambda c: run(c, *sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""tracer-lost_sigint: the harness stops a bpftrace that lost its SIGINT.

    test_stop.py WORKLOAD TOOLS_DIR

bpftrace 0.17 loses a SIGINT that is handled while it is not asleep in
epoll_wait (harness.py, above lost_sigint). On a loaded machine that
happens by chance; here it is made to happen every time. gdb holds
bpftrace just after one of its epoll_wait calls has returned, the
harness's Tracer.stop sends its SIGINT (it stays pending while gdb holds
the process), and gdb lets go: the handler then runs in the loop's own
code, where bpftrace never looks at the flag it sets.

Checks: bpftrace was left in exactly the state Tracer.stop recognises (so
the test is about the real cause, and says so if a later bpftrace stops
losing the signal), Tracer.stop brought it out with its nudges, and the
profile it printed is complete. Needs root, bpftrace and gdb; fails,
never skips, when root lacks either tool.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import harness
from harness import Failure, Workload


def hold_after_epoll_wait(pid, release):
    """gdb attached to pid, stopped at the return of its next epoll_wait
    call, until the file `release` exists; then it detaches. Returns
    (gdb process, file that exists once it holds the process there)."""
    held = release + ".held"
    gdb = subprocess.Popen(
        ["gdb", "-p", str(pid), "-batch", "-nx",
         # bpftrace 0.17 calls epoll_wait from one place, its poll loop.
         "-ex", "break epoll_wait", "-ex", "continue", "-ex", "delete", "-ex", "finish",
         "-ex", f"shell touch {held}; while [ ! -e {release} ]; do sleep 0.05; done",
         "-ex", "detach"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return gdb, held


def wait_for(what, ready, timeout=harness.TIMEOUT):
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise Failure(f"{what} within {timeout} s")
        time.sleep(0.02)


def sigint_pending(pid):
    status = harness.proc_status(pid)
    return status is not None and \
        (int(status["SigPnd"], 16) | int(status["ShdPnd"], 16)) & harness.SIGINT_BIT


def test_lost_sigint(c, workload, tools):
    gdb = None
    scratch = tempfile.mkdtemp(prefix="ddheap-stop-")
    release = os.path.join(scratch, "release")
    stopped = {}
    with Workload(workload, ["--threads=2", "--rounds=20", "--go", "--linger=stdin"],
                  {"DD_HEAP_SAMPLING_INTERVAL": "4096"}) as w:
        try:
            w.wait_line("workload: pid=")
            t = w.attach(os.path.join(tools, "ddheap-live.bt"), [workload], "ddheap-live: tracing")
            w.send("go")
            w.wait_line("workload: lingering")
            gdb, held = hold_after_epoll_wait(t.proc.pid, release)
            wait_for("gdb did not stop bpftrace after an epoll_wait",
                     lambda: os.path.exists(held) or gdb.poll() is not None)
            if not os.path.exists(held):
                raise Failure(f"gdb could not hold bpftrace: {gdb.communicate()[0][-2000:]}")

            def stop():
                try:
                    stopped["out"] = t.stop()
                except Failure as e:
                    stopped["error"] = e
            stopper = threading.Thread(target=stop)
            stopper.start()
            wait_for("the harness's SIGINT did not reach bpftrace",
                     lambda: sigint_pending(t.proc.pid))
            open(release, "w").close()
            gdb_out = gdb.communicate(timeout=harness.TIMEOUT)[0]
            c.check(gdb.returncode == 0 and "detached" in gdb_out,
                    f"gdb held bpftrace after epoll_wait and let go (exit {gdb.returncode})")
            stopper.join()
            c.equal(w.exit(), 0, "workload exit code")
        finally:
            open(release, "w").close()  # a gdb still holding bpftrace lets go
            if gdb is not None and gdb.poll() is None:
                gdb.kill()
                gdb.wait()
            shutil.rmtree(scratch, ignore_errors=True)

    if "error" in stopped:
        c.check(False, f"Tracer.stop: {stopped['error']}")
        return
    # At least one nudge: the state was recognised. More than one when a
    # nudge itself landed where epoll_wait returns 0 (harness.NUDGES).
    c.check(1 <= t.nudges <= harness.NUDGES,
            f"bpftrace 0.17 lost this SIGINT and Tracer.stop recognised it: "
            f"{t.nudges} nudges (1..{harness.NUDGES})")
    out = stopped["out"]
    c.check("=== ddheap-live: totals" in out and harness.results(out)["total_live_blocks"] > 0,
            "bpftrace ran END and printed the live heap after the nudge")
    c.check(harness.parse_maps(out).get("live_bytes"), "the live heap has stacks")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    workload, tools = sys.argv[1:]

    def require():
        skip = harness.require_root_and_bpftrace()
        if skip is None:
            harness.need("gdb")
        return skip
    return harness.run_checks("lost_sigint", lambda c: test_lost_sigint(c, workload, tools),
                              require=require)


if __name__ == "__main__":
    sys.exit(main())

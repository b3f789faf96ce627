"""The workload of test_python.py: Python functions that allocate known
bytes, each block a bytearray(N) (N + 1 bytes asked of malloc: over
pymalloc's 512, so malloc sees it whatever the allocator). Each allocating
line carries a marker comment `# @name`, by which the test finds its line.

    python_work.py K TRUTH_FILE

writes "function blocks" lines to TRUTH_FILE: how many blocks each
function allocated.
"""
import gc
import sys
import threading
import time

N = 65536
keep = []
counts = {}


def count(name, k):
    counts[name] = counts.get(name, 0) + k


def leaf(k):
    for _ in range(k):
        keep.append(bytearray(N))  # @leaf


def middle(k):
    leaf(k)  # @middle


def direct(k):
    for _ in range(k):
        keep.append(bytearray(N))  # @direct


def thread_a(k, go):
    go.wait()
    for _ in range(k):
        keep.append(bytearray(N))  # @thread_a


def thread_b(k, go):
    go.wait()
    for _ in range(k):
        keep.append(bytearray(N))  # @thread_b


def during_threads(k, go):
    go.set()
    for _ in range(k):
        keep.append(bytearray(N))  # @during_threads


def recurse(depth, k):
    if depth == 0:
        for _ in range(k):
            keep.append(bytearray(N))  # @recurse_leaf
        return
    recurse(depth - 1, k)  # @recurse


def gen(k):
    for _ in range(k):
        yield bytearray(N)  # @gen


def consume(k):
    for block in gen(k):  # @consume
        keep.append(block)


def key_fn(x):
    keep.append(bytearray(N))  # @key_fn
    return -x


def sort_with_key(k):
    return sorted(range(k), key=key_fn)  # @sort


# Line 3 of "<dynamic>" allocates.
DYNAMIC = "def dynamic(k, keep, n):\n    for _ in range(k):\n        keep.append(bytearray(n))\n"
OTHER = "def other(k, keep, n):\n    return None\n"


def run_dynamic(k):
    ns = {}
    exec(compile(DYNAMIC, "<dynamic>", "exec"), ns)
    ns["dynamic"](k, keep, N)  # @run_dynamic
    # The profiler names code as its records arrive; then the code goes,
    # and other code is made where it may have been.
    time.sleep(0.3)
    del ns
    gc.collect()
    for _ in range(200):
        other = {}
        exec(compile(OTHER, "<other>", "exec"), other)
        other["other"](0, keep, N)


def main(k):
    middle(k)  # @main_middle
    count("leaf", k)
    keep.clear()
    direct(2 * k)  # @main_direct
    count("direct", 2 * k)
    keep.clear()
    go = threading.Event()
    threads = [threading.Thread(target=thread_a, args=(3 * k, go)),
               threading.Thread(target=thread_b, args=(k, go))]
    for t in threads:
        t.start()
    during_threads(2 * k, go)  # @main_threads
    for t in threads:
        t.join()
    count("thread_a", 3 * k)
    count("thread_b", k)
    count("during_threads", 2 * k)
    keep.clear()
    recurse(200, k)  # @main_recurse
    count("recurse", k)
    keep.clear()
    consume(k)  # @main_consume
    count("gen", k)
    keep.clear()
    sort_with_key(k)  # @main_sort
    count("key_fn", k)
    keep.clear()
    run_dynamic(k)  # @main_dynamic
    count("dynamic", k)
    keep.clear()


if __name__ == "__main__":
    main(int(sys.argv[1]))  # @module
    with open(sys.argv[2], "w") as f:
        for name, blocks in counts.items():
            f.write(f"{name} {blocks}\n")

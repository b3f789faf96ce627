"""A malloc-heavy python3 program for the interposition benchmark
(bench/run-interpose). Run with PYTHONMALLOC=malloc, every object is a
malloc: it builds and drops dicts of strings, lists and bytes of mixed
sizes, keeping a window of them alive, then prints the time its loop took
(wall and CPU; start-up, imports and attaching a tracer are not timed) and a checksum.

    PYTHONMALLOC=malloc python3 malloc_heavy.py [ROUNDS]
"""
import collections
import sys
import time


def work(rounds):
    window = collections.deque()
    check = 0
    for i in range(rounds):
        record = {"id": i, "name": "item-%d" % i, "tags": [str(j) for j in range(i % 7)],
                  "blob": bytes(64 + (i * 37) % 2000)}
        window.append(record)
        if len(window) > 5000:
            old = window.popleft()
            check += len(old["name"]) + len(old["blob"])
    return check + sum(len(r["blob"]) for r in window)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 150000
    start, cpu_start = time.perf_counter(), time.process_time()
    check = work(rounds)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(f"malloc_heavy: rounds={rounds} wall_s={elapsed:.4f} cpu_s={cpu:.4f} check={check}",
          flush=True)


if __name__ == "__main__":
    main()

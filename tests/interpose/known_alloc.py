"""A Python program with one known allocation, for the preload tests.

    PYTHONMALLOC=malloc python3 known_alloc.py COUNT SIZE

Prints "python: pid N" and waits for a line on stdin; then build() makes
COUNT bytes objects of SIZE zero bytes and keeps them (with
PYTHONMALLOC=malloc each is one calloc of SIZE + the object's header, which
the test learns exactly at sampling interval 1); prints "python: built"
and a checksum, waits for another line, and exits. Between the two waits
nothing else of note is allocated: itertools.repeat yields no new objects.
"""
import hashlib
import itertools
import os
import sys


def build(count, size):
    return [bytes(size) for _ in itertools.repeat(None, count)]


def main():
    count, size = int(sys.argv[1]), int(sys.argv[2])
    print(f"python: pid {os.getpid()}", flush=True)
    sys.stdin.readline()
    kept = build(count, size)
    print("python: built", flush=True)
    sys.stdin.readline()
    digest = hashlib.sha256(b"".join(kept[:50])).hexdigest()[:16]
    print(f"python: result {len(kept)} {sum(map(len, kept))} {digest}", flush=True)


if __name__ == "__main__":
    main()

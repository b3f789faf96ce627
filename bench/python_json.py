"""A JSON service's work, for bench/prof_python.py: build_dict makes one
record (small objects: pymalloc's, under 512 bytes), make_json a batch and
its text (large strings: malloc's).

    python_json.py ROUNDS

prints "CPU_S <seconds of this process's CPU in the loop>".
"""
import json
import sys
import time


def build_dict(i):
    return {"id": i, "name": f"user{i}", "email": f"user{i}@example.com",
            "tags": [f"tag{j}" for j in range(8)], "score": i * 0.5}


def make_json(n):
    return json.dumps([build_dict(i) for i in range(n)])


def main(rounds):
    t0 = time.process_time()
    total = 0
    for _ in range(rounds):
        total += len(make_json(2000))
    print(f"CPU_S {time.process_time() - t0:.4f} BYTES {total}")


if __name__ == "__main__":
    main(int(sys.argv[1]))

"""Added start-up time of `python -c pass` with the sm12x mount on PYTHONPATH.

Runs the two variants interleaved (N runs each, default 40) and prints the medians and their
difference. Target (issue 2): at most 3 ms added. Usage: python scripts/bench_startup.py [N] [MOUNT]
"""
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one(env) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return (time.perf_counter() - t0) * 1e3


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    mount = sys.argv[2] if len(sys.argv) > 2 else REPO
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SM12X_")}
    with_mount = dict(base, PYTHONPATH=mount)
    one(base), one(with_mount)  # warm the page cache and write .pyc files
    a, b = [], []
    for _ in range(n):
        a.append(one(base))
        b.append(one(with_mount))
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"date {time.strftime('%Y-%m-%d')}, python {platform.python_version()} "
          f"({sys.executable}), {os.cpu_count()} cores, {n} runs each")
    print(f"| variant | median ms |\n|---|---|\n| python -c pass | {ma:.2f} |\n"
          f"| with sm12x mount | {mb:.2f} |\n| added | {mb - ma:+.2f} |")


if __name__ == "__main__":
    main()

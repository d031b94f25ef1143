"""What the runtime guard (sm12x.guard) costs: the first call of each op (its known-answer check),
the calls after it (one extra Python frame), and the import of a watched module (the apply loop
imports ``sm12x.guard``; nothing is imported at interpreter start-up).

On a GPU (``SM12X_FORCE=1`` off SM12x) each op's check runs twice: cold (Triton compiles the small
shapes' kernels unless its disk cache has them) and warm (the check itself); on the CPU the checks
run under the Triton interpreter and their times mean nothing. Target: the warm check a few ms per
op, the per-call overhead well under 1 µs. Usage: python scripts/bench_guard.py [--ops a,b]
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import timeit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def per_call_overhead_ns():
    """ns per call of a guarded no-op once decided, minus the bare no-op's."""
    from sm12x import guard
    from sm12x.frontends.deep_gemm.gemm_wrappers import FACTORIES
    from sm12x.patches import Patch

    def bare(x):
        return x

    patch = Patch(name="bench.fp8_gemm_nt", target="bench:fp8_gemm_nt", make=FACTORIES["fp8_gemm_nt"], why="",
                  upstream="", library="*", versions="*", versions_note="bench", retire_when="bench")
    guarded = guard.wrap(patch, bare, bare)
    assert guard.ops_for(patch) == ("fp8_gemm_nt",)
    guard._ROUTES[("fp8_gemm_nt",)] = (True, "")  # decided: what every call after the first sees
    guard._call_device = lambda args, kwargs: "cpu"
    guarded(1)
    n = 200_000
    t_bare = min(timeit.repeat(lambda: bare(1), number=n, repeat=5)) / n
    t_guarded = min(timeit.repeat(lambda: guarded(1), number=n, repeat=5)) / n
    return (t_guarded - t_bare) * 1e9


def import_ms():
    """Median ms that importing sm12x.guard adds to the apply loop's other imports, in fresh
    interpreters (the apply loop runs when a watched module is imported, never at start-up)."""
    code = ("import sm12x.platform, sm12x.patches, logging, functools, importlib, time; "
            "t = time.perf_counter(); import sm12x.guard; print((time.perf_counter() - t) * 1e3)")
    env = dict(os.environ, PYTHONPATH=REPO, SM12X_DISABLE="1")
    return statistics.median(float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                                  text=True, check=True).stdout) for _ in range(9))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated op names (default: every guarded op)")
    args = parser.parse_args()
    import torch

    from sm12x import guard

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = "cuda:0" if on_gpu else "cpu"
    ops = [o for o in args.ops.split(",") if o] or sorted({op for ops in guard.ops_by_factory().values()
                                                           for op in ops} | set(guard.TOPK))
    import triton

    gpu = torch.cuda.get_device_name(0) if on_gpu else "CPU (Triton interpreter)"
    print(f"date {time.strftime('%Y-%m-%d')}, {gpu}, torch {torch.__version__}, triton {triton.__version__}, "
          f"python {platform.python_version()}")
    print("| op | check | cold ms | warm ms |\n|---|---|---|---|")
    for op in ops:
        cold = guard.check_op(op, device)
        warm = guard.check_op(op, device)
        state = "ok" if cold["ok"] and warm["ok"] else f"FAILED: {warm['detail'] or cold['detail']}"
        print(f"| {op} | {state} | {cold['ms']:.1f} | {warm['ms']:.1f} |")
    print(f"\nper call once decided: +{per_call_overhead_ns():.0f} ns (one Python frame)")
    print(f"import of sm12x.guard by the apply loop: {import_ms():.2f} ms, once per process when a watched "
          f"module is imported; at interpreter start-up: nothing (scripts/bench_startup.py)")


if __name__ == "__main__":
    main()

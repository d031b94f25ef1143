"""Benchmark sm12x's sparse MLA prefill (FlashMLA ``flash_mla_sparse_fwd``, bf16 rows) side by side
with FlashMLA, on the same inputs in one process.

Cases: FlashMLA's prefill performance set (``tests/test_flash_mla_sparse_prefill.py``): s_q 4096
with an attention sink; V3.2 (d_qk 576, h_q 128, top-2048, s_kv 8K-128K), MODEL1 CONFIG1 (d_qk
512, h_q 64, top-512, s_kv 8K-64K) and CONFIG2 (h_q 128, top-1024); and one call of 16 query
tokens (the split path's case). Inputs from ``reference.make_prefill_case``.

Timing: CUDA-graph replay of 10 calls, median of 5 (L2 warm: the inputs exceed it except the
16-token case). Each of sm12x's paths (``--paths``: the shape's default, ``split`` = the decode
kernel, ``pipelined``) is timed; with FlashMLA importable (built from source; run with
SM12X_DISABLE=1) the ratio is FlashMLA µs / sm12x µs of the default path (> 1: sm12x faster), with
the geomean. TFLOPS as FlashMLA counts them: 2 * s_q * h_q * topk * (d_qk + d_v).

  SM12X_DISABLE=1 python scripts/bench_sparse_mla_prefill.py [--quick] [--arch sm_120] [--ref]
      [--paths default,split,pipelined]
"""
import argparse
import datetime
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (name, d_qk, s_q, h_q, topk, s_kv, topk_length)
CASES = ([("V3.2 h128 top-2048", 576, 4096, 128, 2048, s_kv, False)
          for s_kv in (8192, 32768, 65536, 98304, 131072)]
         + [("MODEL1 h64 top-512", 512, 4096, 64, 512, s_kv, False)
            for s_kv in (8192, 32768, 49152, 65536)]
         + [("MODEL1 h128 top-1024", 512, 4096, 128, 1024, s_kv, False)
            for s_kv in (8192, 32768, 49152, 65536)]
         + [("V4 h64 640, 16 query tokens", 512, 16, 64, 640, 65536, True)])
QUICK = [CASES[0], CASES[4], CASES[5], CASES[9], CASES[13]]


def geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one case per FlashMLA template")
    ap.add_argument("--ref", action="store_true", help="check against the PyTorch reference")
    ap.add_argument("--no-flashmla", action="store_true", help="time sm12x alone")
    ap.add_argument("--arch", help="force a config set (sets SM12X_KERNEL_CONFIGS)")
    ap.add_argument("--paths", default="default", help="comma-separated: default, split, pipelined")
    args = ap.parse_args()
    if args.arch:
        os.environ["SM12X_KERNEL_CONFIGS"] = args.arch

    import torch
    import triton

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_sparse_mla_prefill: needs a CUDA GPU; nothing was measured.", file=sys.stderr)
        return 2

    from gpu_timing import time_us
    from sm12x.kernels.common import configs
    from sm12x.kernels.common.tolerance import failures, flashmla_prefill_close
    from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill, use_pipelined
    from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill

    flash_mla = None
    if not args.no_flashmla:
        try:
            import flash_mla
            if "sm12x" in getattr(flash_mla.flash_mla_sparse_fwd, "__module__", ""):
                flash_mla = None
        except Exception:
            flash_mla = None
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    dev = torch.device("cuda")
    print("# sm12x sparse MLA prefill" + (" against FlashMLA" if flash_mla else "") + "\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"- GPU: {torch.cuda.get_device_name()} ({configs.sm_count(dev)} SMs, config set "
          f"{configs.arch_key(dev)}); torch {torch.__version__}, triton {triton.__version__}")
    print("- timing: CUDA-graph replay of 10 calls, median of 5, L2 warm; same inputs, one "
          "process; ratio: FlashMLA µs / sm12x µs (default path)\n")
    cols = " | ".join(f"sm12x {p} µs" for p in paths)
    print(f"| case | s_kv | FlashMLA µs | FlashMLA TFLOPS | {cols} | sm12x TFLOPS | ratio | "
          "matches ref | max diff vs FlashMLA |")
    print("|---|---|---|---|" + "---|" * len(paths) + "---|---|---|---|")
    failed = False
    ratios = []
    forced = os.environ.get("SM12X_SPARSE_MLA_PREFILL")
    for name, d_qk, s_q, h_q, topk, s_kv, with_len in (QUICK if args.quick else CASES):
        case = make_prefill_case(d_qk, s_q, h_q, topk, s_kv, with_len, device="cuda", seed=1)
        fl = 2 * s_q * h_q * topk * (d_qk + 512)
        times = {}
        for p in paths:
            if p == "default":
                os.environ.pop("SM12X_SPARSE_MLA_PREFILL", None)
                if forced:
                    os.environ["SM12X_SPARSE_MLA_PREFILL"] = forced
            else:
                os.environ["SM12X_SPARSE_MLA_PREFILL"] = p
            times[p] = time_us(lambda: sparse_mla_prefill(**case), iters=10)
        us = times[paths[0]]
        fm_us, diff = float("nan"), "-"
        if flash_mla is not None:
            fm = lambda: flash_mla.flash_mla_sparse_fwd(  # noqa: E731
                case["q"], case["kv"], case["indices"], case["sm_scale"], 512,
                case.get("attn_sink"), case.get("topk_length"))
            fm_us = time_us(fm, iters=10)
            o_fm = fm()[0]
            o = sparse_mla_prefill(**case)[0]
            diff = f"{(o.float() - o_fm.float()).abs().nan_to_num(0.0).max().item():.2g}"
            ratios.append(fm_us / us)
        ok = "-"
        if args.ref:
            bad = failures(flashmla_prefill_close(sparse_mla_prefill(**case),
                                                  ref_sparse_mla_prefill(**case)))
            ok = f"NO ({bad})" if bad else "yes"
            failed |= bool(bad)
        path = "pipelined" if use_pipelined(s_q, h_q, d_qk, dev) else "split"
        cells = " | ".join(f"{times[p]:.0f}" for p in paths)
        print(f"| {name} ({path}) | {s_kv} | {fm_us:.0f} | {fl / fm_us / 1e6:.0f} | {cells} | "
              f"{fl / us / 1e6:.0f} | {fm_us / us:.2f}x | {ok} | {diff} |", flush=True)
        del case
        torch.cuda.empty_cache()
    if ratios:
        print(f"\n- geomean {geomean(ratios):.2f}x over {len(ratios)} cases, lowest "
              f"{min(ratios):.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Benchmark the sm12x sparse MLA decode (FlashMLA ``flash_mla_with_kvcache`` with ``indices``)
side by side with FlashMLA, on the same inputs in one process.

Cases: FlashMLA's production decode set (``tests/test_flash_mla_sparse_decoding.py``): MODEL1
CONFIG1-4 (s_q 2; h_q 64 top-k 128+512, h_q 128 128+1024 in 64-token extra pages, and both with
1024 extra candidates in 2-token pages with per-request extra lengths) x batch {2, 64, 74, 128,
148, 256}, and V3.2 (656 B cache, h_q 128, s_q 2, top-k 2048) x batch {2, 64, 74, 128}. Inputs
come from ``reference.make_case`` (FlashMLA's byte layout and value distribution).

Timing: median of ``--iters`` calls, CUDA events around a CUDA-graph replay of one call (the
split and combine kernels; no host work), L2 flushed before every call unless --warm-l2.
With FlashMLA importable (built from source; run with SM12X_DISABLE=1 so that sm12x does not
patch it) every case is timed on both and the table gives FlashMLA µs / sm12x µs (> 1: sm12x
faster) and the geomean per cache format; without it sm12x alone. Correctness: sm12x against
the PyTorch reference at FlashMLA's tolerances (--no-ref skips it), and the largest difference
from FlashMLA's output.

  SM12X_DISABLE=1 python scripts/bench_sparse_mla_decode.py [--quick] [--warm-l2] [--no-ref]
      [--arch sm_120] [--config BLOCK_H=32,BLOCK_N=16,num_warps=8] [--only v32|model1]
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

# (name, fmt, h_q, main top-k, main page, extra top-k, extra page, extra lengths, batches)
PRODUCTION = [
    ("MODEL1 CONFIG1", "model1", 64, 128, 256, 512, 64, False, (2, 64, 74, 128, 148, 256)),
    ("MODEL1 CONFIG2", "model1", 128, 128, 256, 1024, 64, False, (2, 64, 74, 128, 148, 256)),
    ("MODEL1 CONFIG3", "model1", 64, 128, 256, 1024, 2, True, (2, 64, 74, 128, 148, 256)),
    ("MODEL1 CONFIG4", "model1", 128, 128, 256, 1024, 2, True, (2, 64, 74, 128, 148, 256)),
    ("V3.2", "v32", 128, 2048, 64, None, None, False, (2, 64, 74, 128)),
]


def cases(quick, only=None):
    """(name, make_case kwargs)"""
    out = []
    for name, fmt, h_q, topk, page, xtopk, xpage, xlen, batches in PRODUCTION:
        if only and fmt != only:
            continue
        for b in ((2, 64, 128) if quick else batches):
            kw = dict(fmt=fmt, b=b, s_q=2, h_q=h_q, topk=topk, page=page)
            if xtopk:
                kw.update(extra_topk=xtopk, extra_page=xpage, extra_topk_length=xlen)
            out.append((name, kw))
    return out


def flops(case):
    """2 * h_q * attended tokens * (d_qk + d_v), FlashMLA's count."""
    import torch

    b, s_q, h_q, d_qk = case["q"].shape
    attended = 0
    for idx_key, len_key in (("indices", "topk_length"), ("extra_indices", "extra_topk_length")):
        idx = case.get(idx_key)
        if idx is None:
            continue
        length = case.get(len_key)
        attended += (int(length.clamp(max=idx.shape[-1]).sum()) * s_q if length is not None
                     else b * s_q * idx.shape[-1])
    del torch
    return 2 * h_q * attended * (d_qk + 512)


def flashmla_fn(flash_mla, case):
    """A call of FlashMLA's decode on ``case`` (its scheduler metadata made by a first call)."""
    sched, _ = flash_mla.get_mla_metadata()

    def run():
        return flash_mla.flash_mla_with_kvcache(
            case["q"], case["k_cache"], None, None, 512, sched, None, case["softmax_scale"],
            False, True, indices=case["indices"], attn_sink=case.get("attn_sink"),
            extra_k_cache=case.get("extra_k_cache"),
            extra_indices_in_kvcache=case.get("extra_indices"),
            topk_length=case.get("topk_length"), extra_topk_length=case.get("extra_topk_length"))
    run()
    return run


def import_flashmla():
    """FlashMLA's module when it is importable and is FlashMLA's own code, else None."""
    try:
        import flash_mla
    except Exception:
        return None
    from sm12x.kernels.sparse_mla.decode import sparse_mla_decode

    fn = getattr(flash_mla, "flash_mla_with_kvcache", None)
    if fn is None or "sm12x" in getattr(fn, "__module__", "") or fn is sparse_mla_decode:
        print("bench_sparse_mla_decode: flash_mla is sm12x's replacement (set SM12X_DISABLE=1); "
              "timing sm12x alone", file=sys.stderr)
        return None
    return flash_mla


def geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="batches 2, 64, 128 only")
    ap.add_argument("--warm-l2", action="store_true", help="do not flush L2 between calls")
    ap.add_argument("--no-ref", action="store_true", help="skip the PyTorch reference check")
    ap.add_argument("--no-flashmla", action="store_true", help="time sm12x alone")
    ap.add_argument("--only", choices=("model1", "v32"), help="one cache format")
    ap.add_argument("--arch", help="force a config set (sets SM12X_KERNEL_CONFIGS)")
    ap.add_argument("--config", help="force one launch config (sets SM12X_SPARSE_MLA_CONFIG)")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    if args.arch:
        os.environ["SM12X_KERNEL_CONFIGS"] = args.arch
    if args.config:
        os.environ["SM12X_SPARSE_MLA_CONFIG"] = args.config

    import torch
    import triton

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_sparse_mla_decode: needs a CUDA GPU (torch.cuda.is_available() is False "
              "or TRITON_INTERPRET is set); nothing was measured.", file=sys.stderr)
        return 2

    from gpu_timing import graphed, median_us
    from sm12x.kernels.common import configs
    from sm12x.kernels.common.tolerance import failures, flashmla_decode_close
    from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
    from sm12x.kernels.sparse_mla.decode_plan import plan
    from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode

    flash_mla = None if args.no_flashmla else import_flashmla()
    dev = torch.device("cuda")
    flush = not args.warm_l2
    print("# sm12x sparse MLA decode" + (" against FlashMLA" if flash_mla else "") + "\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"- GPU: {torch.cuda.get_device_name()} ({configs.sm_count(dev)} SMs, config set "
          f"{configs.arch_key(dev)}); torch {torch.__version__}, triton {triton.__version__}")
    print(f"- timing: median of {args.iters} calls, CUDA events around a CUDA-graph replay of "
          f"one call, {'L2 flushed before each call' if flush else 'warm L2'}; both on the "
          "same inputs in this process")
    print("- ratio: FlashMLA µs / sm12x µs (> 1: sm12x faster); TFLOPS: sm12x, FlashMLA's "
          "count (2 h_q attended (d_qk + d_v))\n")
    print("| case | b | h_q | top-k | sm12x config | programs | FlashMLA µs | sm12x µs | ratio | "
          "TFLOPS | matches ref | max diff vs FlashMLA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    ratios = {}
    for name, kw in cases(args.quick, args.only):
        case = make_case(device="cuda", seed=1, **kw)
        b, s_q, h_q, _ = case["q"].shape
        xtopk = case["extra_indices"].shape[-1] if "extra_indices" in case else 0
        ragged = any(case.get(k) is not None for k in ("topk_length", "extra_topk_length"))
        p = plan(b, s_q, h_q, case["indices"].shape[-1], xtopk, dev, fmt=kw["fmt"],
                 ragged=ragged)
        ours = lambda: sparse_mla_decode(**case)  # noqa: E731
        us = median_us(graphed(ours), args.iters, flush)
        fm_us, diff = float("nan"), "-"
        if flash_mla is not None:
            fm = flashmla_fn(flash_mla, case)
            fm_us = median_us(graphed(fm), args.iters, flush)
            o_fm, lse_fm = fm()
            o, lse = ours()
            diff = (f"out {(o.float() - o_fm.float()).abs().max().item():.2g}, lse "
                    f"{(lse - lse_fm).abs().nan_to_num(0.0).max().item():.2g}")
            ratios.setdefault(kw["fmt"], []).append(fm_us / us)
        ok = "-"
        if not args.no_ref:
            bad = failures(flashmla_decode_close(ours(), ref_sparse_mla_decode(**case)))
            ok = f"NO ({bad})" if bad else "yes"
            failed |= bool(bad)
        cfg = p.cfg
        cfg_s = (f"H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}"
                 f" pf{cfg.get('PREFETCH', 1)}")
        topk = f"{kw['topk']}" + (f"+{xtopk}p{kw['extra_page']}" if xtopk else "")
        print(f"| {name} | {b} | {h_q} | {topk} | {cfg_s} | {p.programs} | {fm_us:.1f} | "
              f"{us:.1f} | {fm_us / us:.2f}x | {flops(case) / us / 1e6:.0f} | {ok} | {diff} |",
              flush=True)
        del case
        torch.cuda.empty_cache()
    for fmt, rs in ratios.items():
        print(f"\n- {fmt}: geomean {geomean(rs):.2f}x over {len(rs)} cases, lowest {min(rs):.2f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

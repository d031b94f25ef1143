#!/usr/bin/env python
"""Benchmark the sm12x sparse MLA decode kernel (FlashMLA sparse_decode_fwd replacement) on a GPU.

Cases: DeepSeek-V4 production decode shapes (FlashMLA's MODEL1 CONFIG1-4: h_q 64/128, s_q 2,
main top-k 128 in 256-token pages + extra top-k 512/1024 in 64-token pages, or in 2-token pages
with per-request extra_topk_length; batch 2..256) and a TP-sharded single request (h_q 16,
batch 1) with 128K-context-like extra top-k.

Reports per case: median µs per call (CUDA events around a CUDA-graph replay of one call; L2
flushed before every call unless --warm-l2); the kernel span (first kernel's start to last
kernel's end in a profiler trace, mean of the calls, L2 flushed the same way), which is how
FlashMLA's own harness times it and so the figure to hold against FlashMLA's; of the span, GB/s
counted as FlashMLA does (576 B per unique MODEL1 token read + Q + O bytes) and TFLOPS (2 * h_q *
attended tokens * (d_qk + d_v)); time of the PyTorch reference and the ratio (per-call µs), and
whether the output matches the reference within FlashMLA's tolerances.
Prints a markdown table. Needs a CUDA GPU.

  python scripts/bench_sparse_mla_decode.py [--quick] [--warm-l2] [--no-ref]
      [--arch sm_120] [--config BLOCK_H=32,BLOCK_N=16,num_warps=8]
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))


def cases(quick):
    """(name, make_case kwargs)"""
    out = []
    batches = (2, 64, 128) if quick else (2, 64, 74, 128, 148, 256)
    for h_q, xtopk in ((64, 512), (128, 1024)):
        for b in batches:
            out.append((f"V4 h{h_q} 128+{xtopk}p64", dict(b=b, h_q=h_q, extra_topk=xtopk,
                                                           extra_page=64)))
    if not quick:
        for h_q in (64, 128):
            for b in batches:
                out.append((f"V4 h{h_q} 128+1024p2 len", dict(b=b, h_q=h_q, extra_topk=1024,
                                                              extra_page=2,
                                                              extra_topk_length=True)))
    for s_q in (1, 2):  # TP8 shard of V4-Flash, one request at ~128K context
        out.append((f"V4 h16 1req 128+1024p2 (HCA@128K)",
                    dict(b=1, s_q=s_q, h_q=16, extra_topk=1024, extra_page=2)))
        out.append((f"V4 h16 1req 128+512p64 (CSA)",
                    dict(b=1, s_q=s_q, h_q=16, extra_topk=512, extra_page=64)))
    for c in out:
        c[1].setdefault("s_q", 2)
    return out


def bytes_and_flops(case):
    import torch

    q, b, s_q, h_q, d_qk = case["q"], *case["q"].shape
    retrieved = attended = 0
    for idx_key, len_key in (("indices", "topk_length"), ("extra_indices", "extra_topk_length")):
        idx = case.get(idx_key)
        if idx is None:
            continue
        topk = idx.shape[-1]
        length = case.get(len_key)
        if length is not None:
            idx = idx.masked_fill(torch.arange(topk, device=idx.device) >= length.view(-1, 1, 1), -1)
            attended += int(length.sum()) * s_q
        else:
            attended += b * s_q * topk
        u = idx.unique()
        retrieved += int((u >= 0).sum())
    token_bytes = 576 if d_qk == 512 else 656
    mem = 2 * b * s_q * h_q * d_qk + retrieved * token_bytes + 2 * b * s_q * h_q * 512
    flops = 2 * h_q * attended * (d_qk + 512)
    return mem, flops


def time_fn(fn, iters, flush, graph=False):
    """Median µs of ``fn`` between CUDA events. With ``graph`` the call is captured once in a CUDA
    graph and replayed, so host launch overhead is excluded (as in CUDA-graph decode)."""
    import torch
    from gpu_timing import graphed, median_us

    fn()  # compile / warm up
    torch.cuda.synchronize()
    return median_us(graphed(fn) if graph else fn, iters, flush)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases and iterations")
    ap.add_argument("--warm-l2", action="store_true", help="do not flush L2 between calls")
    ap.add_argument("--no-ref", action="store_true", help="skip the PyTorch reference")
    ap.add_argument("--arch", help="force a config set (sets SM12X_KERNEL_CONFIGS)")
    ap.add_argument("--config", help="force one launch config (sets SM12X_SPARSE_MLA_CONFIG)")
    ap.add_argument("--iters", type=int, default=None)
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

    from gpu_timing import kernel_span_us
    from sm12x.kernels.common import configs
    from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
    from sm12x.kernels.sparse_mla.decode import plan, sparse_mla_decode
    from sm12x.kernels.common.tolerance import failures, flashmla_decode_close

    iters = args.iters or (20 if args.quick else 50)
    dev = torch.device("cuda")
    flush = not args.warm_l2
    print(f"# sm12x sparse MLA decode benchmark\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"- GPU: {torch.cuda.get_device_name()} ({configs.sm_count(dev)} SMs, config set "
          f"{configs.arch_key(dev)})")
    print(f"- torch {torch.__version__}, triton {triton.__version__}")
    print(f"- timing: median of {iters} calls, CUDA events around a CUDA-graph replay of one "
          f"call (split + combine kernels, no host overhead), "
          f"{'L2 flushed before each call' if flush else 'warm L2 (no flush)'}; the PyTorch "
          f"reference is timed eagerly; span: kernel span in a profiler trace, mean of {iters} calls")
    print(f"- GB/s, TFLOPS: of the span; FlashMLA's count (Q + O bytes + 576 B per unique MODEL1 token)\n")
    print("| case | b | s_q | h_q | config | programs/rows | µs | span µs | GB/s | TFLOPS | ref µs | "
          "speed-up | matches ref |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    failed = False
    for name, kw in cases(args.quick):
        case = make_case("model1", device="cuda", seed=1, **kw)
        b, s_q, h_q, _ = case["q"].shape
        xtopk = case["extra_indices"].shape[-1] if "extra_indices" in case else 0
        ragged = any(case.get(k) is not None for k in ("topk_length", "extra_topk_length"))
        p = plan(b, s_q, h_q, case["indices"].shape[-1], xtopk, dev, ragged=ragged)
        cfg = p.cfg
        us = time_fn(lambda: sparse_mla_decode(**case), iters, flush, graph=True)
        span = kernel_span_us(lambda: sparse_mla_decode(**case), iters, flush)
        mem, flops = bytes_and_flops(case)
        ref_us, ok = float("nan"), "-"
        if not args.no_ref:
            ref_us = time_fn(lambda: ref_sparse_mla_decode(**case), max(3, iters // 10), flush)
            bad = failures(flashmla_decode_close(sparse_mla_decode(**case),
                                                 ref_sparse_mla_decode(**case)))
            ok = f"NO ({bad})" if bad else "yes"
            failed |= bool(bad)
        cfg_s = f"H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}{' pdl' if p.pdl else ''}"
        rows = b * s_q * p.head_blocks
        print(f"| {name} | {b} | {s_q} | {h_q} | {cfg_s} | {p.programs}/{rows} | {us:.1f} | {span:.1f} | "
              f"{mem / span / 1e3:.0f} | {flops / span / 1e6:.1f} | {ref_us:.0f} | "
              f"{ref_us / us:.1f}x | {ok} |", flush=True)
        del case
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""Benchmark the sm12x MoE grouped GEMMs on a CUDA GPU, DeepSeek-V4-Flash expert shapes (hidden
4096, moe_intermediate_size 2048, 256 experts; gate+up is N=4096 x K=4096, down N=4096 x K=2048).

    python scripts/bench_moe.py [--quick]

- decode: m_grouped_fp8_fp4_gemm_nt_masked, tokens routed top-6 / top-8 at random so that an
  expert gets 6-24 rows on average (masked_m from the routing, M_max 64). Byte model: the weights
  and scales of every expert with rows, read once (FP4: N*K/2 + N*K/32 bytes per expert; FP8:
  N*K + N*K/128). Reported as achieved GB/s and as a fraction of a plain device copy
  (torch copy_ of 4 GiB, read + write bytes) measured in the same run. FP8 weights on the same
  kernel for comparison with DeepGEMM's FP8 masked kernel.
- prefill: m_grouped_fp8_fp4_gemm_nt_contiguous, 4096-16384 tokens x top-6 rows, 128-row aligned
  segments. Useful TFLOPS = 2 * routed rows * N * K / time. Floors in the same run: the weights
  dequantised to bf16 once, then torch._grouped_mm (bf16) on the same rows; and the dequantising
  itself (what a framework without an FP4 kernel pays per call if it does not keep bf16 copies).
Times: CUDA-graph replay (scripts/gpu_timing.time_us; the 1-4 GB of weights exceed L2).
Prints markdown tables with the date, GPU, torch / triton versions.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch

HIDDEN, INTER, EXPERTS = 4096, 2048, 256
SHAPES = {"gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}  # (N, K)


def routed_counts(tokens: int, top_k: int, experts: int = EXPERTS, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.rand(tokens, experts, generator=g).topk(top_k, dim=1).indices.flatten()
    return torch.bincount(ids, minlength=experts)


def copy_bandwidth(time_us) -> tuple:
    """(GB/s of a plain device copy of 4 GiB, read + written bytes; GB/s of a read-only pass, a
    float32 sum over 4 GiB)."""
    n = 4 << 30
    src = torch.ones(n // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy_us = time_us(lambda: dst.copy_(src), iters=5)
    out = torch.empty((), dtype=torch.float32, device="cuda")
    read_us = time_us(lambda: torch.sum(src, dim=0, out=out), iters=5)
    del src, dst
    return 2 * n / copy_us / 1e3, n / read_us / 1e3


def random_weights(n, k, fp4: bool, experts: int = EXPERTS):
    """Expert weights made on the GPU (the test builders quantise on the host: too slow for 256
    experts): packed e2m1 (every byte is a valid pair) with UE8M0 scales per 32 as packed int32,
    or e4m3 (|w| <= 0.25) with per-row UE8M0 scales per 128 as packed int32."""
    gran = 32 if fp4 else 128
    exps = torch.randint(118, 124, (experts, n, k // gran), dtype=torch.uint8, device="cuda")
    sf = exps.view(torch.int32)  # 4 K-blocks per word, K-major words
    if fp4:
        return torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, device="cuda").view(torch.int8), sf
    b = torch.empty(experts, n, k, dtype=torch.float8_e4m3fn, device="cuda")
    for e in range(0, experts, 32):
        b[e:e + 32] = (torch.rand(min(32, experts - e), n, k, device="cuda") - 0.5).mul_(0.5).to(torch.float8_e4m3fn)
    return b, sf


def weight_bytes(n, k, fp4: bool) -> int:
    return n * k // 2 + n * k // 32 if fp4 else n * k + n * k // 128


def decode_table(time_us, copy_gbs, quick: bool):
    from sm12x.frontends.deep_gemm import moe as api
    from sm12x.kernels.moe.cases import make_masked

    rows = ["| weights | GEMM | top-k | tokens | mean rows/expert | active experts | us | GB/s | of copy |",
            "|---|---|---|---|---|---|---|---|---|"]
    cases = [(6, 256), (6, 1024), (8, 192), (8, 768)] if not quick else [(6, 256), (8, 768)]
    for fp4 in (True, False):
        for name, (n, k) in SHAPES.items():
            b, sb = random_weights(n, k, fp4)
            for top_k, tokens in cases:
                counts = routed_counts(tokens, top_k)
                m_max = 64
                masked = counts.clamp(max=m_max)
                a, sa, masked_m = make_masked(EXPERTS, m_max, k, masked.tolist(), fmt="packed", device="cuda")
                d = torch.empty(EXPERTS, m_max, n, dtype=torch.bfloat16, device="cuda")
                expected = max(1, round(tokens * top_k / EXPERTS))
                us = time_us(lambda: api.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (b, sb), d, masked_m, expected))
                active = int((masked > 0).sum())
                gbs = active * weight_bytes(n, k, fp4) / us / 1e3
                rows.append(f"| {'FP4' if fp4 else 'FP8'} | {name} {n}x{k} | {top_k} | {tokens} | {expected} | {active} "
                            f"| {us:.1f} | {gbs:.0f} | {gbs / copy_gbs:.0%} |")
                del a, sa, d
            del b, sb
            torch.cuda.empty_cache()
    return rows


def dequant_bf16(b, sb, out=None, chunk: int = 16):
    """Packed FP4 weights [G, N, K/2] + UE8M0 scale bytes (int32 words, K-major) -> bf16 [G, N, K]
    with torch ops, ``chunk`` experts at a time (what a framework without an FP4 GEMM would run)."""
    from sm12x.kernels.moe.fp4 import E2M1_VALUES

    g, n, kh = b.shape
    k = kh * 2
    out = torch.empty(g, n, k, dtype=torch.bfloat16, device=b.device) if out is None else out
    table = torch.tensor(E2M1_VALUES, dtype=torch.bfloat16, device=b.device)
    for e in range(0, g, chunk):
        codes = b[e:e + chunk].view(torch.uint8).int()
        vals = torch.stack((table[codes & 15], table[codes >> 4]), -1)
        exps = sb[e:e + chunk].contiguous().view(torch.uint8).int()
        scale = (exps << 23).view(torch.float32).to(torch.bfloat16)
        out[e:e + chunk] = (vals.view(-1, n, k // 32, 32) * scale[..., None]).view(-1, n, k)
    return out


def prefill_table(time_us, quick: bool):
    from sm12x.frontends.deep_gemm import moe as api
    from sm12x.kernels.moe.cases import make_contiguous

    rows = ["| weights | GEMM | tokens x top-6 | routed rows | ours us | ours TFLOPS | bf16 grouped_mm us | "
            "bf16 TFLOPS | dequant us | ours vs mm | ours vs dequant+mm |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    token_list = (4096, 16384) if quick else (4096, 8192, 16384)
    for fp4 in (True, False):
        for name, (n, k) in SHAPES.items():
            b, sb = random_weights(n, k, fp4)
            wbf = dequant_bf16(b, sb) if fp4 else None
            for tokens in token_list:
                counts = routed_counts(tokens, 6)
                a, sa, layout, m = make_contiguous(counts.tolist(), k, alignment=128, fmt="fp32", device="cuda")
                d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                us = time_us(lambda: api.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sa), (b, sb), d, layout))
                flops = 2.0 * int(counts.sum()) * n * k
                mm_us = dq_us = float("nan")
                if wbf is not None and hasattr(torch, "_grouped_mm"):
                    aligned = ((counts + 127) // 128 * 128).cumsum(0).to(torch.int32).cuda()
                    abf = a.to(torch.bfloat16)
                    wt = wbf.transpose(1, 2)
                    try:
                        mm_us = time_us(lambda: torch._grouped_mm(abf, wt, offs=aligned))
                    except Exception as e:  # noqa: BLE001  (a torch without this form: no floor)
                        print(f"torch._grouped_mm: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
                    dq_us = eager_us(lambda: dequant_bf16(b, sb, out=wbf))
                rows.append(f"| {'FP4' if fp4 else 'FP8'} | {name} {n}x{k} | {tokens} | {int(counts.sum())} | "
                            f"{us:.0f} | {flops / us / 1e6:.0f} | {mm_us:.0f} | {flops / mm_us / 1e6:.0f} | {dq_us:.0f} | "
                            f"{mm_us / us:.2f}x | {(mm_us + dq_us) / us:.2f}x |")
                del a, sa, d
            del b, sb, wbf
            torch.cuda.empty_cache()
    return rows


def sweep(time_us, copy_gbs):
    """Candidate configurations side by side: FP4 decode (masked, top-6, 256 tokens, gate_up), FP4
    and FP8 prefill (contiguous, 16384 tokens x top-6, gate_up). Each output is compared with the
    first candidate's (the default configuration's, checked against the reference by the tests)."""
    from sm12x.frontends.deep_gemm import moe as api
    from sm12x.kernels.common.tolerance import calc_diff
    from sm12x.kernels.moe import grouped_contiguous as gc
    from sm12x.kernels.moe import grouped_masked as gm
    from sm12x.kernels.moe.cases import make_contiguous, make_masked

    rows = ["| case | config | us | GB/s or TFLOPS | diff |", "|---|---|---|---|---|"]
    n, k = SHAPES["gate_up"]
    # decode
    b, sb = random_weights(n, k, True)
    counts = routed_counts(256, 6).clamp(max=64)
    a, sa, masked_m = make_masked(EXPERTS, 64, k, counts.tolist(), fmt="packed", device="cuda")
    d = torch.empty(EXPERTS, 64, n, dtype=torch.bfloat16, device="cuda")
    first = None
    active = int((counts > 0).sum())
    base = dict(swap=True, num_stages=4, per_sm=2)
    for mode, bn, warps, stages in (("bf16", 128, 4, 4), ("mixed", 128, 4, 4), ("mixed", 64, 4, 4), ("mixed", 128, 8, 4),
                                    ("bf16", 128, 8, 4), ("scaled", 128, 4, 4), ("scaled", 128, 8, 4), ("bf16", 64, 4, 6)):
        cfg = dict(base, mode=mode, BN=bn, num_warps=warps, num_stages=stages, BM=16)
        call = lambda: gm.grouped_masked(api._operands.read_operands("bench", (a, sa), (b, sb), a_dims=3),
                                         d, masked_m, 6, config=cfg)
        try:
            us = time_us(call)
        except Exception as e:  # noqa: BLE001
            rows.append(f"| decode FP4 | {mode} BN{bn} w{warps} s{stages} | failed: {type(e).__name__} | | |")
            continue
        out = d.float()[torch.arange(64, device="cuda")[None, :] < masked_m[:, None]]  # rows written
        first = out if first is None else first
        gbs = active * weight_bytes(n, k, True) / us / 1e3
        rows.append(f"| decode FP4 top-6 256 tok | {mode} BN{bn} w{warps} s{stages} | {us:.0f} | {gbs:.0f} GB/s "
                    f"({gbs / copy_gbs:.0%} of copy) | {calc_diff(out, first):.1e} |")
    del a, sa, d, b, sb, first
    # prefill
    counts = routed_counts(16384, 6)
    for fp4 in (True, False):
        b, sb = random_weights(n, k, fp4)
        a, sa, layout, m = make_contiguous(counts.tolist(), k, alignment=128, fmt="fp32", device="cuda")
        d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        flops = 2.0 * int(counts.sum()) * n * k
        first = None
        cands = ((("bf16", 128, 128, 8, 3), ("mixed", 128, 128, 8, 3), ("scaled", 128, 128, 8, 3),
                  ("mixed", 128, 256, 8, 3), ("bf16", 128, 256, 8, 3)) if fp4 else
                 (("fp8", 128, 128, 8, 4), ("fp8", 128, 256, 8, 3), ("fp8", 256, 128, 8, 3), ("fp8", 64, 256, 4, 4),
                  ("scaled", 128, 128, 8, 3)))
        for mode, bm, bn, warps, stages in cands:
            cfg = dict(BM=bm, BN=bn, GROUP_M=8, mode=mode, swap=False, num_warps=warps, num_stages=stages)
            ops = api._operands.read_operands("bench", (a, sa), (b, sb), a_dims=2)
            call = lambda: gc.grouped_contiguous(ops, d, layout, alignment=128, config=cfg)
            try:
                us = time_us(call, iters=5)
            except Exception as e:  # noqa: BLE001
                rows.append(f"| prefill {'FP4' if fp4 else 'FP8'} | {mode} {bm}x{bn} w{warps} s{stages} | failed: "
                            f"{type(e).__name__} | | |")
                continue
            out = d.float().clone()
            first = out if first is None else first
            rows.append(f"| prefill {'FP4' if fp4 else 'FP8'} 16384x6 | {mode} {bm}x{bn} w{warps} s{stages} | {us:.0f} | "
                        f"{flops / us / 1e6:.0f} TFLOPS | {calc_diff(out, first):.1e} |")
            del out
        del a, sa, d, b, sb, first
        torch.cuda.empty_cache()
    return rows


def eager_us(fn, iters: int = 3) -> float:
    """Median µs of eager calls after one warm-up (for work that allocates)."""
    from gpu_timing import median_us

    fn()
    return median_us(fn, iters, flush=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sweep", action="store_true", help="also time candidate configurations (tuning)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("bench_moe: needs a CUDA GPU", file=sys.stderr)
        sys.exit(2)
    import triton
    from gpu_timing import time_us

    from sm12x.kernels.common import configs

    dev = torch.device("cuda")
    print(f"# MoE grouped GEMMs: {datetime.date.today()}, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, triton {triton.__version__}, configs {configs.arch_key(dev)}")
    copy_gbs, read_gbs = copy_bandwidth(time_us)
    print(f"\nplain device copy: {copy_gbs:.0f} GB/s (read + write); read-only pass (sum): {read_gbs:.0f} GB/s\n")
    if args.sweep:
        print("## configuration sweep (sm_90 tile / MMA mode candidates; diff: calc_diff to the first row)\n")
        print("\n".join(sweep(time_us, copy_gbs)), flush=True)
    print("\n## decode (masked layout)\n")
    print("\n".join(decode_table(time_us, copy_gbs, args.quick)), flush=True)
    print("\n## prefill (contiguous layout)\n")
    print("\n".join(prefill_table(time_us, args.quick)), flush=True)


if __name__ == "__main__":
    main()

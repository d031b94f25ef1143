#!/usr/bin/env python
"""Benchmark the sm12x dense GEMM ops on a CUDA GPU, side by side with what torch offers there.

    SM12X_FORCE=1 python scripts/bench_gemm.py [--quick] [--ue8m0]

Cases:
- fp8_gemm_nt (DeepGEMM's block-scaled FP8 GEMM, 1x128 activation / 128x128 weight scales,
  bf16 out) on DeepSeek-V4-Flash's linear shapes (N, K) in {(1024, 4096), (512, 4096),
  (32768, 1024), (8192, 1024), (4096, 8192), (4096, 4096), (4096, 2048)} x M in {1, 16, 64, 128,
  4096}, against
  * torch's block-scaled FP8 GEMM when the installed torch takes 1x128 / 128x128 scales
    (``torch.nn.functional.scaled_mm`` blockwise recipes, or ``torch._scaled_mm``), else "n/a";
  * tensor-wise ``torch._scaled_mm`` (cuBLASLt FP8 with one scale per tensor): less work than a
    block-scaled GEMM, so a ceiling;
  * ``torch.matmul`` in bf16 of the dequantised operands (dequantisation not timed).
- fp8_einsum "bhr,hdr->bhd" at DeepSeek-V4-Flash's wo_a (H, R, D) = (8, 4096, 1024) for B in
  {1, 8, 64, 128, 2048}, against ``torch.bmm`` in bf16 of the dequantised operands.
- tf32_hc_prenorm_gemm at (N, K) = (24, 16384) for M in {1, 16, 64, 137, 1024, 4096}, two ways:
  without num_splits (our kernel picks its split and sums the partials) and with num_splits 16
  (split-K partials out, summed by the caller: how vLLM's mHC pre-norm calls it), against torch:
  float32 ``a @ b.T`` with TF32 allowed plus the square sum.

Times: GPU time per call as DeepGEMM's and FlashMLA's harnesses take it: the call replayed from a
CUDA graph under the profiler, L2 flushed before each, first kernel start to last kernel end
(``gpu_timing.kernel_span_us``; host work is not counted, as in the frameworks' CUDA-graph decode).
"eager µs" is one call of ours outside a graph, L2 warm, host work included (argument checks and
Triton's launch): what a call costs when the host is the limit. TFLOPS = 2MNK / GPU time. Every
case of ours is checked against the PyTorch reference (calc_diff, DeepGEMM's metric) in the same
run.
Prints markdown tables with the date, GPU, torch / triton versions, ratios and geomeans.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

V4_NK = [(1024, 4096), (512, 4096), (32768, 1024), (8192, 1024), (4096, 8192), (4096, 4096), (4096, 2048)]
MS = [1, 16, 64, 128, 4096]


def fail(msg: str) -> None:
    print(f"bench_gemm: {msg}", file=sys.stderr)
    sys.exit(2)


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fmt(x, nd=1):
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def gpu_us(fn):
    """GPU µs per call: CUDA-graph replay under the profiler, L2 flushed before each call."""
    from gpu_timing import kernel_span_us

    return kernel_span_us(fn, iters=20, flush=True)


def eager_us(fn):
    """µs per call outside a graph, L2 warm, host work included."""
    from gpu_timing import median_us

    return median_us(fn, 20, flush=False)


def torch_block_scaled(a, sa, b, sb):
    """A call of torch's block-scaled FP8 GEMM for these operands, or (None, why)."""
    errors = []
    sa_t = sa.t().contiguous().t()  # M-major 1x128 scales, as cuBLASLt takes them
    f = getattr(torch.nn.functional, "scaled_mm", None)
    if f is not None:
        try:
            from torch.nn.functional import ScalingType

            def run():
                return f(a, b.t(), sa_t, ScalingType.BlockWise1x128, sb, ScalingType.BlockWise128x128,
                         output_dtype=torch.bfloat16)
            run()
            return run, "F.scaled_mm blockwise"
        except Exception as e:  # noqa: BLE001 - any refusal means "not offered"
            errors.append(f"F.scaled_mm: {type(e).__name__}: {str(e)[:80]}")
    try:
        def run2():
            return torch._scaled_mm(a, b.t(), scale_a=sa_t, scale_b=sb.t(), out_dtype=torch.bfloat16)
        run2()
        return run2, "_scaled_mm blockwise"
    except Exception as e:  # noqa: BLE001
        errors.append(f"_scaled_mm: {type(e).__name__}: {str(e)[:80]}")
    return None, "; ".join(errors)


def bench_gemm(ms, nks, ue8m0, gpu_us, eager_us):
    from sm12x.frontends.deep_gemm.gemm import fp8_gemm_nt
    from sm12x.kernels.common.tolerance import calc_diff
    from sm12x.kernels.gemm.cases import gemm_inputs
    from sm12x.kernels.gemm.reference import ref_fp8_gemm_nt

    rows, notes = [], set()
    one = torch.ones((), device="cuda")
    for n, k in nks:
        for m in ms:
            a, sfa, b, sfb, sa, sb = gemm_inputs(m, n, k, "cuda", ue8m0=ue8m0, seed=m + n + k)
            d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            ours = lambda: fp8_gemm_nt((a, sfa), (b, sfb), d)  # noqa: E731
            ours()
            diff = calc_diff(d.float(), ref_fp8_gemm_nt(a, sa, b, sb))
            t_ours = gpu_us(ours)
            t_eager = eager_us(ours)
            blk, why = torch_block_scaled(a, sa, b, sb)
            if blk is None:
                notes.add(f"torch block-scaled FP8 GEMM not offered: {why}")
            t_blk = gpu_us(blk) if blk is not None else None
            tw = lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
            t_tw = gpu_us(tw)
            from sm12x.kernels.gemm.reference import dequant

            ab, bb = dequant(a, sa).bfloat16(), dequant(b, sb).bfloat16()
            t_bf16 = gpu_us(lambda: torch.matmul(ab, bb.t()))
            flop = 2.0 * m * n * k
            rows.append(dict(m=m, n=n, k=k, ours=t_ours, eager=t_eager, blk=t_blk, tw=t_tw, bf16=t_bf16,
                             tflops=flop / t_ours / 1e6, diff=diff))
            del a, b, ab, bb
    return rows, sorted(notes)


def bench_einsum(bs, gpu_us):
    from sm12x.frontends.deep_gemm.gemm import fp8_einsum
    from sm12x.kernels.common.tolerance import calc_diff
    from sm12x.kernels.gemm.cases import einsum_inputs
    from sm12x.kernels.gemm.reference import dequant, ref_fp8_einsum_bhr_hdr

    rows = []
    h, r, nd = 8, 4096, 1024
    for nb in bs:
        a, sa, b, sb = einsum_inputs(nb, h, r, nd, "cuda", seed=nb)
        d = torch.empty(nb, h, nd, dtype=torch.bfloat16, device="cuda")
        ours = lambda: fp8_einsum("bhr,hdr->bhd", (a, sa), (b, sb), d)  # noqa: E731
        ours()
        diff = calc_diff(d.float(), ref_fp8_einsum_bhr_hdr(a, sa, b, sb))
        t_ours = gpu_us(ours)
        ab = dequant(a.transpose(0, 1), sa.transpose(0, 1), groups=h).bfloat16()  # [H, B, R]
        bb = dequant(b, sb, groups=h).bfloat16()  # [H, D, R]
        t_bf16 = gpu_us(lambda: torch.bmm(ab, bb.transpose(1, 2)))
        rows.append(dict(b=nb, ours=t_ours, bf16=t_bf16, diff=diff,
                         gbs=(h * nd * r + nb * h * r) / t_ours / 1e3))
    return rows


def bench_prenorm(ms, gpu_us):
    from sm12x.frontends.deep_gemm.gemm import tf32_hc_prenorm_gemm
    from sm12x.kernels.common.tolerance import calc_diff
    from sm12x.kernels.gemm.reference import ref_tf32_hc_prenorm_gemm

    rows = []
    n, k = 24, 16384
    torch.backends.cuda.matmul.allow_tf32 = True
    for m in ms:
        g = torch.Generator(device="cuda").manual_seed(m)
        a = torch.randn(m, k, device="cuda", generator=g).bfloat16()
        b = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
        d, sq = torch.empty(m, n, device="cuda"), torch.empty(m, device="cuda")
        ours = lambda: tf32_hc_prenorm_gemm(a, b, d, sq)  # noqa: E731
        ours()
        rd, rs = ref_tf32_hc_prenorm_gemm(a, b)
        diff = max(calc_diff(d, rd), calc_diff(sq, rs))
        t_ours = gpu_us(ours)
        d16, sq16 = torch.empty(16, m, n, device="cuda"), torch.empty(16, m, device="cuda")
        ours16 = lambda: tf32_hc_prenorm_gemm(a, b, d16, sq16, num_splits=16)  # noqa: E731
        ours16()
        diff = max(diff, calc_diff(d16.sum(0), rd), calc_diff(sq16.sum(0), rs))
        t_ours16 = gpu_us(ours16)

        def torch_version():
            af = a.float()
            return af @ b.t(), (af * af).sum(-1)
        t_torch = gpu_us(torch_version)
        rows.append(dict(m=m, ours=t_ours, ours16=t_ours16, torch=t_torch, diff=diff,
                         gbs=(m * k * 2 + n * k * 4) / t_ours / 1e3))
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="M in {1, 128, 4096} on three shapes")
    ap.add_argument("--ue8m0", action="store_true",
                    help="power-of-two scales in DeepGEMM's packed SM100/SM120 layout (default: SM90 float32)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU")
    import triton

    ms = [1, 128, 4096] if args.quick else MS
    nks = V4_NK[:3] if args.quick else V4_NK
    from sm12x.kernels.common import configs

    arch = configs.arch_key(torch.device("cuda"))
    print(f"# bench_gemm {datetime.date.today()} on {torch.cuda.get_device_name()} "
          f"(configs {arch}), torch {torch.__version__}, triton {triton.__version__}, "
          f"scales {'packed UE8M0' if args.ue8m0 else 'float32 (SM90 layout)'}")
    print()
    rows, notes = bench_gemm(ms, nks, args.ue8m0, gpu_us, eager_us)
    print("## fp8_gemm_nt (bf16 out), µs; ratios = their time / ours (> 1: ours faster)")
    print()
    print("| M | N | K | ours µs | TFLOPS | torch block-scaled µs | tensor-wise _scaled_mm µs | bf16 matmul µs "
          "| vs block | vs tensor-wise | vs bf16 | ours eager µs | calc_diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        vb = r["blk"] / r["ours"] if r["blk"] else None
        print(f"| {r['m']} | {r['n']} | {r['k']} | {r['ours']:.1f} | {r['tflops']:.0f} | {fmt(r['blk'])} | "
              f"{r['tw']:.1f} | {r['bf16']:.1f} | {fmt(vb, 2)} | {r['tw'] / r['ours']:.2f} | "
              f"{r['bf16'] / r['ours']:.2f} | {r['eager']:.0f} | {r['diff']:.1e} |")
    print()
    for label, sel in (("M <= 16", lambda r: r["m"] <= 16), ("M = 64", lambda r: r["m"] == 64),
                       ("M >= 128", lambda r: r["m"] >= 128), ("all", lambda r: True)):
        sub = [r for r in rows if sel(r)]
        if not sub:
            continue
        print(f"- geomean {label}: vs tensor-wise {geomean([r['tw'] / r['ours'] for r in sub]):.2f}x, "
              f"vs bf16 matmul {geomean([r['bf16'] / r['ours'] for r in sub]):.2f}x, "
              f"min vs tensor-wise {min(r['tw'] / r['ours'] for r in sub):.2f}x"
              + (f", vs torch block-scaled {geomean([r['blk'] / r['ours'] for r in sub if r['blk']]):.2f}x"
                 if any(r["blk"] for r in sub) else ""))
    for note in notes:
        print(f"- {note}")
    print()
    erows = bench_einsum([1, 8, 64, 128] if args.quick else [1, 8, 64, 128, 2048], gpu_us)
    print("## fp8_einsum bhr,hdr->bhd, (H, R, D) = (8, 4096, 1024), bf16 out")
    print()
    print("| B | ours µs | GB/s | bf16 bmm µs | vs bf16 | calc_diff |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in erows:
        print(f"| {r['b']} | {r['ours']:.1f} | {r['gbs']:.0f} | {r['bf16']:.1f} | {r['bf16'] / r['ours']:.2f} | "
              f"{r['diff']:.1e} |")
    print()
    prows = bench_prenorm([1, 16, 64, 137, 1024, 4096], gpu_us)
    print("## tf32_hc_prenorm_gemm, (N, K) = (24, 16384), float32 out + sqr_sum")
    print()
    print("| M | ours µs | GB/s | ours, num_splits 16 (partials) µs | torch (TF32 matmul + square sum) µs | "
          "vs torch | calc_diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in prows:
        print(f"| {r['m']} | {r['ours']:.1f} | {r['gbs']:.0f} | {r['ours16']:.1f} | {r['torch']:.1f} | "
              f"{r['torch'] / r['ours']:.2f} | {r['diff']:.1e} |")
    bad = [r for r in rows + erows if r["diff"] > 1e-5] + [r for r in prows if r["diff"] > 1e-5]
    if bad:
        fail(f"{len(bad)} cases differ from the reference (calc_diff > 1e-5)")


if __name__ == "__main__":
    main()

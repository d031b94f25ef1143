"""The self-test cases of the dense GEMM ops (declared in :mod:`sm12x.kernels.manifest`):
DeepGEMM-compatible block-scaled FP8 GEMM, FP8 einsum and the mHC pre-norm GEMM (V4-Flash shapes
on a GPU, tiny ones under the interpreter)."""
from __future__ import annotations

from sm12x.kernels.common.timing import time_us

# DeepGEMM's tests accept calc_diff < 1e-3 against unquantised data; against the dequantised
# reference (same quantised inputs) only output rounding is left: bf16 output ~1e-6.
DIFF_TOL = 1e-5


def gemm_inputs(m, n, k, device, ue8m0=False, seed=0):
    """(a, sfa, b, sfb, sa_fp32, sb_fp32): per-token / per-block quantised operands; with ``ue8m0``
    the scales are powers of two and sfa / sfb are DeepGEMM's packed SM100/SM120 layout, else
    SM90's float32 (sfa MN-major, sfb per 128x128 block)."""
    import torch

    from sm12x.kernels.gemm.reference import per_block_cast_to_fp8, per_token_cast_to_fp8
    from sm12x.kernels.gemm.scales import mn_major_tma_aligned, pack_ue8m0, rows_from_blocks

    g = torch.Generator(device=device).manual_seed(seed)
    a, sa = per_token_cast_to_fp8(torch.randn(m, k, device=device, generator=g), ue8m0)
    b, sb = per_block_cast_to_fp8(torch.randn(n, k, device=device, generator=g), ue8m0)
    if ue8m0:
        sfa, sfb = pack_ue8m0(sa), pack_ue8m0(rows_from_blocks(sb, n, 128))
    else:
        sfa, sfb = mn_major_tma_aligned(sa), sb
    return a, sfa, b, sfb, sa, sb


def _diff(out, ref):
    from sm12x.kernels.common.tolerance import calc_diff

    return calc_diff(out.float(), ref.float()), float((out.float() - ref.float()).abs().max())


def check_fp8_gemm(device, full):
    import torch

    from sm12x.kernels.gemm.fp8_gemm import fp8_gemm
    from sm12x.kernels.gemm.reference import ref_fp8_gemm_nt

    if device != "cuda":
        cases = [(1, 256, 256, False), (37, 384, 256, True)]
    else:
        cases = [(1, 1024, 4096, True), (16, 4096, 4096, False), (128, 4096, 4096, True), (4096, 8192, 1024, False)]
        if full:
            cases += [(m, n, k, ue) for m in (1, 64, 4096) for n, k in ((512, 4096), (32768, 1024), (4096, 8192))
                      for ue in (False, True)]
    for m, n, k, ue8m0 in cases:
        a, sfa, b, sfb, sa, sb = gemm_inputs(m, n, k, device, ue8m0)
        d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        run = lambda: fp8_gemm(a, sfa, b, sfb, d)  # noqa: E731
        run()
        diff, max_abs = _diff(d, ref_fp8_gemm_nt(a, sa, b, sb))
        us = time_us(run, device)
        yield dict(op="fp8_gemm_nt", case=f"M={m} N={n} K={k} {'ue8m0' if ue8m0 else 'fp32'} scales",
                   ok=diff < DIFF_TOL, max_abs=max_abs, max_rel=diff, detail="", us=us,
                   throughput=f"{2.0 * m * n * k / us / 1e6:.0f} TFLOPS")


def check_fp8_einsum(device, full):
    import torch

    from sm12x.kernels.gemm.fp8_einsum import fp8_einsum_bhr_hdr
    from sm12x.kernels.gemm.reference import ref_fp8_einsum_bhr_hdr

    shapes = [(3, 2, 256, 256)] if device != "cuda" else [(1, 8, 4096, 1024), (128, 8, 4096, 1024)]
    if full and device == "cuda":
        shapes.append((2048, 8, 4096, 1024))
    for nb, h, r, nd in shapes:
        a, sfa, b, sfb = einsum_inputs(nb, h, r, nd, device)
        d = torch.empty(nb, h, nd, dtype=torch.bfloat16, device=device)
        run = lambda: fp8_einsum_bhr_hdr(a, sfa, b, sfb, d)  # noqa: E731
        run()
        diff, max_abs = _diff(d, ref_fp8_einsum_bhr_hdr(a, sfa, b, sfb))
        us = time_us(run, device)
        yield dict(op="fp8_einsum", case=f"bhr,hdr->bhd B={nb} H={h} R={r} D={nd}", ok=diff < DIFF_TOL,
                   max_abs=max_abs, max_rel=diff, detail="", us=us,
                   throughput=f"{(h * nd * r + nb * h * r) / us / 1e3:.0f} GB/s")


def einsum_inputs(nb, h, r, nd, device, ue8m0=False, seed=0):
    """(a [B, H, R], sfa [B, H, R/128], b [H, D, R], sfb [H, D/128, R/128]) with float32 scales."""
    import torch

    from sm12x.kernels.gemm.reference import per_block_cast_to_fp8, per_token_cast_to_fp8

    g = torch.Generator(device=device).manual_seed(seed)
    a, sa = per_token_cast_to_fp8(torch.randn(nb * h, r, device=device, generator=g), ue8m0)
    a, sa = a.view(nb, h, r), sa.view(nb, h, -1)
    blocks = [per_block_cast_to_fp8(torch.randn(nd, r, device=device, generator=g), ue8m0) for _ in range(h)]
    b = torch.stack([x for x, _ in blocks])
    sb = torch.stack([s for _, s in blocks])
    return a, sa, b, sb


def check_hc_prenorm(device, full):
    import torch

    from sm12x.kernels.gemm.hc_prenorm_gemm import hc_prenorm_gemm
    from sm12x.kernels.gemm.reference import ref_tf32_hc_prenorm_gemm

    cases = [(7, 24, 512, None), (5, 24, 512, 3)] if device != "cuda" else \
        [(1, 24, 16384, None), (137, 24, 16384, None), (137, 24, 16384, 16), (4096, 24, 16384, None)]
    for m, n, k, splits in cases:
        g = torch.Generator(device=device).manual_seed(m)
        a = torch.randn(m, k, device=device, generator=g).bfloat16()
        b = torch.randn(n, k, device=device, generator=g) / k ** 0.5
        lead = () if splits is None else (splits,)
        d = torch.empty(*lead, m, n, device=device)
        sq = torch.empty(*lead, m, device=device)
        run = lambda: hc_prenorm_gemm(a, b, d, sq, splits)  # noqa: E731
        run()
        ref_d, ref_sq = ref_tf32_hc_prenorm_gemm(a, b)
        got_d, got_sq = (d, sq) if splits is None else (d.sum(0), sq.sum(0))
        diff_d, max_abs = _diff(got_d, ref_d)
        diff_sq, _ = _diff(got_sq, ref_sq)
        us = time_us(run, device)
        yield dict(op="tf32_hc_prenorm_gemm", case=f"M={m} N={n} K={k} splits={splits}",
                   ok=diff_d < DIFF_TOL and diff_sq < 1e-7, max_abs=max_abs, max_rel=max(diff_d, diff_sq),
                   detail="" if diff_sq < 1e-7 else f"sqr_sum diff {diff_sq:.2g}", us=us,
                   throughput=f"{(m * k * 2 + n * k * 4) / us / 1e3:.0f} GB/s")

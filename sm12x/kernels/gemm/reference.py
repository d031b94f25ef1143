"""PyTorch references for the dense GEMM ops (the source of truth the kernels are checked against).

Everything is dequantised to float32 and multiplied in float32 (float64 where asked): per-K-block
fp32 promotion, as DeepGEMM does it, equals this up to float32 rounding of the partial sums.
"""
from __future__ import annotations

import torch

from sm12x.kernels.gemm.scales import read_scales, unpack_scales


def dequant(x: torch.Tensor, sf, *, gran_mn=None, gran_k=None, groups=None) -> torch.Tensor:
    """FP8 operand [*G, MN, K] with DeepGEMM-format scales -> float32 values."""
    mn, k = x.shape[-2], x.shape[-1]
    s = read_scales("reference", "sf", sf, mn, k, groups=groups, gran_mn=gran_mn, gran_k=gran_k)
    scale = unpack_scales(s, mn, k).repeat_interleave(s.gran_k, dim=-1)[..., :k]
    return x.float() * scale


def ref_fp8_gemm_nt(a, sfa, b, sfb, c=None, *, gran_a=(None, None), gran_b=(None, None),
                    dtype=torch.float32) -> torch.Tensor:
    """D = C + A @ B^T for A [M, K], B [N, K] float8 with their scales; ``gran_a`` / ``gran_b``
    = (gran_mn, gran_k) or Nones to read from the shapes. Returns ``dtype`` [M, N]."""
    af = dequant(a, sfa, gran_mn=gran_a[0], gran_k=gran_a[1]).to(dtype)
    bf = dequant(b, sfb, gran_mn=gran_b[0], gran_k=gran_b[1]).to(dtype)
    d = af @ bf.T
    if c is not None:
        d = d + c.to(dtype)
    return d


def ref_fp8_einsum_bhr_hdr(a, sfa, b, sfb, c=None, dtype=torch.float32) -> torch.Tensor:
    """d[b, h, d] = c + sum_r A[b, h, r] B[h, d, r]: A [B, H, R] float8 with per-token 1x128
    scales [B, H, R/128] (any DeepGEMM format), B [H, D, R] float8 with per-block scales
    [H, D/128, R/128] or per-row [H, D, R/128]."""
    nb, h, r = a.shape
    af = dequant(a.transpose(0, 1), sfa.transpose(0, 1), groups=h).to(dtype)  # [H, B, R]
    bf = dequant(b, sfb, groups=h).to(dtype)  # [H, D, R]
    d = torch.bmm(af, bf.transpose(1, 2)).transpose(0, 1)  # [B, H, D]
    if c is not None:
        d = d + c.to(dtype)
    return d


def ref_tf32_hc_prenorm_gemm(a, b) -> tuple:
    """(d [M, N], sqr_sum [M]) in float32: d = a . b^T (a bf16 [M, K], b float32 [N, K]),
    sqr_sum = sum_k a^2."""
    af = a.float()
    return af @ b.float().T, (af * af).sum(-1)


# ----------------------------------------------------------------------------------------------
# quantisers (DeepGEMM's deep_gemm.utils casts), to build inputs for tests, self-test and benchmarks


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128):
    """x [M, K] -> (float8 [M, K], float32 scales [M, ceil(K/gran_k)]): amax per 1 x gran_k
    clamped to >= 1e-4, scale amax / 448 (rounded up to a power of two with ``use_ue8m0``)."""
    m, k = x.shape
    pad = (-k) % gran_k
    v = torch.nn.functional.pad(x.float(), (0, pad)).view(m, -1, gran_k)
    sf = v.abs().amax(-1).clamp(min=1e-4) / 448.0
    if use_ue8m0:
        from sm12x.kernels.gemm.scales import ceil_to_ue8m0
        sf = ceil_to_ue8m0(sf)
    q = (v / sf[..., None]).to(torch.float8_e4m3fn).view(m, -1)[:, :k].contiguous()
    return q, sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran: int = 128):
    """x [N, K] -> (float8 [N, K], float32 scales [ceil(N/gran), ceil(K/gran)]) per gran x gran
    block."""
    n, k = x.shape
    pn, pk = (-n) % gran, (-k) % gran
    v = torch.nn.functional.pad(x.float(), (0, pk, 0, pn)).view((n + pn) // gran, gran, (k + pk) // gran, gran)
    sf = v.abs().amax(dim=(1, 3)).clamp(min=1e-4) / 448.0
    if use_ue8m0:
        from sm12x.kernels.gemm.scales import ceil_to_ue8m0
        sf = ceil_to_ue8m0(sf)
    q = (v / sf[:, None, :, None]).to(torch.float8_e4m3fn).view(n + pn, k + pk)[:n, :k].contiguous()
    return q, sf


def ref_fp8_einsum_bhd_hdr(a, sfa, b, sfb, c=None, dtype=torch.float32) -> torch.Tensor:
    """d[b, h, r] = c + sum_d A[b, h, d] B[h, d, r]: A [B, H, D] with per-token scales
    [B, H, D/128]; B [H, D, R] with per-block scales [H, D/128, R/128] (as stored)."""
    h = a.shape[1]
    af = dequant(a.transpose(0, 1), sfa.transpose(0, 1), groups=h).to(dtype)  # [H, B, D]
    bt = b.permute(0, 2, 1)  # [H, R, D]
    bf = dequant(bt, sfb.permute(0, 2, 1), groups=h).to(dtype)
    d = torch.bmm(af, bf.transpose(1, 2)).transpose(0, 1)  # [B, H, R]
    if c is not None:
        d = d + c.to(dtype)
    return d

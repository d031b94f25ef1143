"""PyTorch references for the grouped MoE GEMMs (the source of truth the kernels are checked
against).

Math, per expert g and output row r of that expert:

    D[r, n] = sum_k A[r, k] * sa(r, k) * B[g, n, k] * sb(g, n, k)

A is e4m3 with scales per row and K-block (gran_k_a 128, or 32 for MXFP8 activations); B is e4m3
(scales per 128x128 block or per row and K-block) or packed e2m1 (scales per row and 32 K). Scale
formats are read by :mod:`sm12x.kernels.gemm.scales` (float32, packed UE8M0 int32, UE8M0 bytes).
Scales at the 32-element granularity are UE8M0 by contract: float32 ones are read by their
exponent byte, as DeepGEMM casts them (``get_mn_major_tma_aligned_packed_ue8m0_tensor``).
Everything is computed in float32 on the dequantised operands.

Layouts (DeepGEMM's):
- contiguous, default: ``layout`` int32 [M] = expert of each row, -1 for padding rows; each
  expert's segment starts at a multiple of the M alignment. Padding rows come out 0.
- contiguous, psum: ``layout`` int32 [G] = cumulative unaligned end of each expert's rows; expert g
  owns rows [align(layout[g-1], alignment), layout[g]). Rows in the gaps come out 0 with
  ``ensure_zero_padding`` and are left alone otherwise; rows past the last expert are left alone.
- masked: A [G, M_max, K], D [G, M_max, N]; only the first masked_m[g] rows of group g are
  computed, the rest of D is left alone.
"""
from __future__ import annotations

import torch

from sm12x.kernels.gemm.scales import SF_FP32, OperandScales, unpack_scales
from sm12x.kernels.moe.fp4 import unpack_e2m1


def scale_grid(s: OperandScales, mn: int, k: int) -> torch.Tensor:
    """Scale of every element [*G, MN, K] (float32). 32-granular float32 scales are read as UE8M0
    (their exponent)."""
    per_block = unpack_scales(s, mn, k)
    if s.kind == SF_FP32 and s.gran_k == 32:
        per_block = ((per_block.contiguous().view(torch.int32) >> 23) << 23).view(torch.float32)
    return per_block.repeat_interleave(s.gran_k, dim=-1)[..., :k]


def dequant(values: torch.Tensor, s: OperandScales, fp4: bool) -> torch.Tensor:
    """Operand values (e4m3 [*G, MN, K] or packed e2m1 [*G, MN, K/2]) times their scales, float32."""
    v = unpack_e2m1(values) if fp4 else values.float()
    mn, k = v.shape[-2], v.shape[-1]
    return v * scale_grid(s, mn, k)


def psum_segments(psum: torch.Tensor, alignment: int) -> list:
    """[(start, end)] rows of each expert in the psum layout."""
    out, prev = [], 0
    for end in psum.tolist():
        start = -(-prev // alignment) * alignment
        out.append((start, end))
        prev = end
    return out


def ref_grouped_contiguous(a, sa: OperandScales, b, sb: OperandScales, layout, *, fp4: bool,
                           psum: bool = False, alignment: int = 128, ensure_zero_padding: bool = True):
    """(D float32 [M, N], defined [M] bool): the expected output and the rows it defines."""
    af = dequant(a, sa, False)
    bf = dequant(b, sb, fp4)
    m, n = a.shape[0], bf.shape[1]
    d = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    defined = torch.zeros(m, dtype=torch.bool, device=a.device)
    if psum:
        for g, (start, end) in enumerate(psum_segments(layout.cpu(), alignment)):
            if end > start:
                d[start:end] = af[start:end] @ bf[g].T
                defined[start:end] = True
            gap_end = min(-(-end // alignment) * alignment, m)
            if ensure_zero_padding and gap_end > end:
                defined[end:gap_end] = True
        return d, defined
    ids = layout.long().cpu()
    for g in ids.unique().tolist():
        rows = (ids == g).nonzero().flatten().to(a.device)
        if g >= 0:
            d[rows] = af[rows] @ bf[g].T
    defined[:] = True  # padding rows are zero
    return d, defined


def ref_grouped_masked(a, sa: OperandScales, b, sb: OperandScales, masked_m, *, fp4: bool):
    """(D float32 [G, M_max, N], defined [G, M_max] bool)."""
    af = dequant(a, sa, False)
    bf = dequant(b, sb, fp4)
    d = torch.einsum("gmk,gnk->gmn", af, bf)
    rows = torch.arange(a.shape[1], device=a.device)
    defined = rows[None, :] < masked_m.to(a.device).long()[:, None]
    return d * defined[..., None], defined

"""DeepGEMM scale-factor formats: reading every one of them as the block-scaled kernels consume it,
and the host helpers that produce DeepGEMM's layouts.

An FP8 operand X [MN, K] (or [G, MN, K]) comes with scale factors ``sf`` such that the real value is
``X[r, k] * scale(r, k)`` where ``scale(r, k) = sf[r // gran_mn, k // gran_k]``. DeepGEMM passes them
in four storage formats, all of which :func:`read_scales` accepts without copying:

- float32 ``[*G, ceil(MN/gran_mn), ceil(K/gran_k)]``, any strides (SM90 style: sfa per token
  [M, K/128] in either major-ness; sfb per 128x128 block [N/128, K/128] or per row [N, K/128]);
- packed UE8M0 int32 ``[*G, ceil(MN/gran_mn), ceil(ceil(K/gran_k)/4)]``: byte ``j`` (little
  endian) of word ``w`` is the biased exponent of K-block ``4w + j``, scale = 2**(byte - 127)
  (SM100/SM120 style, MN-major with a TMA-aligned stride; any strides are read);
- uint8 (or ``torch.float8_e8m0fnu``) exponents ``[*G, ceil(MN/gran_mn), ceil(K/gran_k)]``, one
  byte per K-block, scale = 2**(byte - 127).

A UE8M0 byte of 0 is read as scale 0 by the fp32-promotion path and as 2**-127 by the hardware
block-scaled MMA (``tl.dot_scaled``); quantisers never write it (amax is clamped to >= 1e-4).

The kernels see one :class:`OperandScales` per operand: the tensor plus a ``kind``, the
granularities and three element strides; ``scale_offsets`` in :mod:`block_scaled` turns (row,
K-block) into an address with them.
"""
from __future__ import annotations

import dataclasses

import torch

from sm12x.kernels.common.checks import bad, require

# kinds of scale storage, as the kernels' SF_KIND constexpr
SF_FP32 = 0  # float32, one value per (scale row, K-block)
SF_UE8M0_PACKED = 1  # int32 words of 4 UE8M0 bytes along K
SF_UE8M0_BYTES = 2  # uint8 UE8M0, one byte per (scale row, K-block)

GRAN_KS = (32, 128)
TMA_ALIGN_ELEMS = 4  # DeepGEMM aligns an MN-major scale column to 16 bytes (4 x 4-byte elements)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclasses.dataclass(frozen=True)
class OperandScales:
    """One operand's scale factors as the kernels read them (no copy of the caller's tensor).

    data: float32 (``SF_FP32``), int32 (``SF_UE8M0_PACKED``) or uint8 (``SF_UE8M0_BYTES``; a
        float8_e8m0fnu tensor is viewed as uint8).
    kind: one of ``SF_FP32``, ``SF_UE8M0_PACKED``, ``SF_UE8M0_BYTES``.
    gran_mn: operand rows per scale row (1: per token / per output row; 128: per 128x128 block).
    gran_k: K elements per scale (128; 32 for MXFP4-style operands).
    stride_g: elements of ``data`` between groups (0 when the scales are shared by all groups).
    stride_mn: elements of ``data`` between scale rows.
    stride_k: elements of ``data`` between K-blocks (``SF_UE8M0_PACKED``: between int32 words,
        i.e. 4 K-blocks).
    """

    data: torch.Tensor
    kind: int
    gran_mn: int
    gran_k: int
    stride_g: int
    stride_mn: int
    stride_k: int

    @property
    def ue8m0(self) -> bool:
        return self.kind != SF_FP32

    def args(self) -> tuple:
        """(data, stride_g, stride_mn, stride_k): the launch arguments, in the order the kernels
        in this package take them (``SF_KIND``, ``GRAN_MN``, ``GRAN_K`` go as constexprs)."""
        return self.data, self.stride_g, self.stride_mn, self.stride_k


def _k_blocks(kind: int, cols: int, k: int, gran_k, prefer_k: int = 32):
    """The gran_k a scale tensor with ``cols`` K-columns has for a K of ``k`` (None: none fits);
    where both granularities fit (K <= 128 with packed UE8M0 words, K <= 32 otherwise), ``prefer_k``."""
    order = (prefer_k,) + tuple(g for g in GRAN_KS if g != prefer_k)
    for g in ((gran_k,) if gran_k else order):
        blocks = ceil_div(k, g)
        if cols == (ceil_div(blocks, 4) if kind == SF_UE8M0_PACKED else blocks):
            return g
    return None


def read_scales(op: str, arg: str, sf, mn: int, k: int, *, groups: int | None = None,
                gran_mn: int | None = None, gran_k: int | None = None, prefer_k: int = 32) -> OperandScales:
    """Read ``sf``, the scales of an operand with ``mn`` rows and ``k`` columns (``groups`` of
    them when given), as an :class:`OperandScales`. ``gran_mn`` / ``gran_k`` come from the
    caller's recipe; left None they are read from the shape (rows == mn -> 1, rows ==
    ceil(mn/128) -> 128; K columns for gran_k 128, else 32; where both fit, ``prefer_k``: FP8
    operands' callers pass 128, DeepGEMM's FP8 default, e2m1 weights keep 32). Every mismatch is a
    ValueError naming ``op`` and ``arg``."""
    require(isinstance(sf, torch.Tensor), op, arg, type(sf).__name__, "a scale tensor")
    if sf.dtype == torch.float32:
        kind, data = SF_FP32, sf
    elif sf.dtype == torch.int32:
        kind, data = SF_UE8M0_PACKED, sf
    elif sf.dtype == torch.uint8 or sf.dtype == getattr(torch, "float8_e8m0fnu", None):
        kind, data = SF_UE8M0_BYTES, sf.view(torch.uint8)
    else:
        raise bad(op, arg, f"dtype {sf.dtype}",
                  "float32 scales, int32 packed UE8M0 (4 per int) or uint8 / float8_e8m0fnu UE8M0")
    want_dim = 2 if groups is None else 3
    if sf.dim() == 2 and groups is not None:  # one set of scales shared by every group
        pass
    elif sf.dim() != want_dim:
        raise bad(op, arg, f"shape {list(sf.shape)}",
                  f"{want_dim} dims ([{'G, ' if groups is not None else ''}rows, K-blocks])")
    if groups is not None and sf.dim() == 3:
        require(sf.shape[0] == groups, op, arg, lambda: f"shape {list(sf.shape)}", f"{groups} groups first")
    rows, cols = sf.shape[-2], sf.shape[-1]
    if gran_mn is None:
        gran_mn = 1 if rows == mn else 128
    require(gran_mn in (1, 128), op, arg, f"granularity {gran_mn} along MN", "1 or 128")
    require(rows == ceil_div(mn, gran_mn), op, arg, lambda: f"shape {list(sf.shape)}",
            lambda: f"{ceil_div(mn, gran_mn)} scale rows for {mn} rows at granularity {gran_mn}"
                    + ("" if gran_mn == 128 else f" (or {ceil_div(mn, 128)} per 128-row block)"))
    require(gran_k is None or gran_k in GRAN_KS, op, arg, f"granularity {gran_k} along K",
            " or ".join(map(str, GRAN_KS)))
    found = _k_blocks(kind, cols, k, gran_k, prefer_k)
    if found is None:
        per = "int32 words of 4 K-blocks" if kind == SF_UE8M0_PACKED else "K-blocks"
        raise bad(op, arg, f"shape {list(sf.shape)}",
                  lambda: " or ".join(f"{(ceil_div(ceil_div(k, g), 4) if kind == SF_UE8M0_PACKED else ceil_div(k, g))}"
                                      f" {per} (gran_k {g}) for K = {k}" for g in ((gran_k,) if gran_k else GRAN_KS)))
    stride_g = data.stride(0) if data.dim() == 3 else 0
    return OperandScales(data, kind, gran_mn, found, stride_g, data.stride(-2), data.stride(-1))


# ----------------------------------------------------------------------------------------------
# DeepGEMM's host helpers (the layouts its own kernels want), for front ends and tests


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """|x| rounded up to a power of two (exponent + 1 where any mantissa bit is set, biased
    exponent clamped to [1, 254]), float32: DeepGEMM's ``deep_gemm.utils.ceil_to_ue8m0``."""
    bits = x.abs().float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).ne(0).int()
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def mn_major_tma_aligned(sf: torch.Tensor) -> torch.Tensor:
    """``sf`` [*G, MN, KB] as an MN-major tensor whose column stride is MN rounded up to 4
    elements (DeepGEMM's ``get_mn_major_tma_aligned_tensor``); returned as is when it already is."""
    mn, kb = sf.shape[-2], sf.shape[-1]
    aligned = align(mn, TMA_ALIGN_ELEMS)
    if sf.stride(-2) == 1 and (kb == 1 or sf.stride(-1) == aligned) and \
            (sf.dim() == 2 or sf.stride(0) == aligned * kb):
        return sf
    batch = sf.shape[:-2]
    out = torch.empty_strided((*batch, mn, kb), (*([aligned * kb] if batch else []), 1, aligned),
                              dtype=sf.dtype, device=sf.device)
    out.copy_(sf)
    return out


def pack_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """float32 power-of-two scales [*G, MN, KB] -> int32 [*G, MN, ceil(KB/4)], MN-major with a
    TMA-aligned stride, byte j of word w = the exponent byte of K-block 4w+j (DeepGEMM's
    ``get_mn_major_tma_aligned_packed_ue8m0_tensor``: the exponent is taken as stored, so a scale
    that is not a power of two loses its mantissa)."""
    kb = sf.shape[-1]
    words = ceil_div(kb, 4)
    exp = (sf.float().contiguous().view(torch.int32) >> 23) & 0xFF
    if kb % 4:
        exp = torch.nn.functional.pad(exp, (0, words * 4 - kb))
    exp = exp.view(*sf.shape[:-1], words, 4)
    packed = exp[..., 0] | (exp[..., 1] << 8) | (exp[..., 2] << 16) | (exp[..., 3] << 24)
    return mn_major_tma_aligned(packed.int())


def rows_from_blocks(sf: torch.Tensor, mn: int, gran_mn: int) -> torch.Tensor:
    """Scales per ``gran_mn``-row block [*G, ceil(MN/gran_mn), KB] broadcast to per row
    [*G, MN, KB]."""
    if gran_mn == 1:
        return sf
    idx = torch.arange(mn, device=sf.device) // gran_mn
    return sf.index_select(-2, idx)


def unpack_scales(s: OperandScales, mn: int, k: int) -> torch.Tensor:
    """The float32 scale of every (row, K-block of gran_k): [*G, MN, ceil(K/gran_k)] (for
    references and tests; UE8M0 byte 0 reads as 0)."""
    blocks = ceil_div(k, s.gran_k)
    data = s.data
    if s.kind == SF_UE8M0_PACKED:
        words = data.to(torch.int64)
        exp = torch.stack([(words >> (8 * j)) & 0xFF for j in range(4)], dim=-1)
        exp = exp.flatten(-2)[..., :blocks]
    elif s.kind == SF_UE8M0_BYTES:
        exp = data.to(torch.int64)
    else:
        return rows_from_blocks(data.float(), mn, s.gran_mn)
    values = (exp.int() << 23).view(torch.float32)
    return rows_from_blocks(values, mn, s.gran_mn)

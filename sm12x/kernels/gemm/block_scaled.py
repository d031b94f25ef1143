"""The block-scaled FP8 K-loop every GEMM of this package (and the MoE grouped GEMMs) is built on,
plus the per-architecture tile configurations and the split-K choice.

Contract of :func:`block_scaled_dot` (a ``@triton.jit`` helper, inlined into the caller's kernel):

    acc[r, c] += sum over K-tiles t in [t_begin, t_end) of
                 (X[x_rows[r], tile t] . Y[y_rows[c], tile t]) * sx(x_rows[r], t) * sy(y_rows[c], t)

X and Y are float8_e4m3fn operands, both "row x K" (X [R, K], Y [C, K], any strides; the caller
offsets the pointers ``x_src`` / ``y_src`` to its group or expert; with the ``TMA`` constexpr they
are tensor descriptors whose tiles start at rows ``x_row0`` / ``y_row0``). ``x_rows`` / ``y_rows`` are the tile's row
indices (int32 or int64 vectors of length BLOCK_R / BLOCK_C, any values: a grouped kernel passes
its own expert-local rows), ``x_mask`` / ``y_mask`` mark the valid ones (masked rows read 0). The
scales are read straight from the caller's DeepGEMM-format tensor (see :mod:`scales`): pointer
(offset to the group), ``stride_mn``, ``stride_k`` and the constexprs ``*S_KIND`` (``SF_FP32``,
``SF_UE8M0_PACKED``, ``SF_UE8M0_BYTES``), ``*S_GRAN_MN`` (1 or 128: scale row = row // gran) and
``*S_GRAN_K`` (32 or 128). The scale row is the operand row divided by the granularity, so a caller
whose scales start at the group's first row passes group-local rows.

Two ways to apply the scales, chosen by the caller's ``SCALED_MMA`` constexpr:

- ``SCALED_MMA=False`` (fp32 promotion, DeepGEMM's SM90 math): one product per K-tile into a
  fresh fp32 tile, multiplied by ``sx[:, None] * sy[None, :]`` and added to ``acc``; needs
  gran_k to be a multiple of BLOCK_K. The product is ``tl.dot`` on sm_90 (there ``tl.dot_scaled``
  is emulated) and, with ``UNIT_MX`` (sm_120, sm_121 from Triton 3.8), ``tl.dot_scaled`` with unit
  UE8M0 scales (:func:`sm12x.kernels.common.fp8_dot.fp8_dot`): the same float32 tile from the
  full-rate block-scaled MMA. Float32 scales that are not powers of two cannot go into the MMA,
  so they stay in this promotion.
- ``SCALED_MMA=True`` (both scales UE8M0): one ``tl.dot_scaled(e4m3, e4m3)`` per K-tile with the
  exponents replicated to one per 32 K (scale_vec::1X), accumulating into ``acc`` in the MMA: the
  full-rate block-scaled ``mma.sync ... kind::mxf8f6f4`` on sm_120 (and on sm_121 with Triton >=
  3.8), where plain FP8 ``mma.sync`` runs at half rate. gran_k may be 32 or 128.

K: ``K`` is the operands' K; ``EVEN_K`` (K % BLOCK_K == 0) drops the K mask. Tiles are
BLOCK_K wide (64 or 128; 128 = DeepGEMM's promotion block).
"""
from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.common.fp8_dot import fp8_dot
from sm12x.kernels.gemm.scales import SF_FP32, SF_UE8M0_BYTES, SF_UE8M0_PACKED  # noqa: F401


@triton.jit
def _ue8m0_byte(sf_ptr, row_off, mask, kb, stride_k, SF_KIND: tl.constexpr):
    """The UE8M0 exponent (int32 0..255) of K-block ``kb`` (scalar or vector broadcast against
    ``row_off``) at scale-row offsets ``row_off``."""
    if SF_KIND == 1:  # packed: byte kb % 4 of word kb // 4
        w = tl.load(sf_ptr + row_off + (kb // 4) * stride_k, mask=mask, other=0)
        return (w >> (8 * (kb % 4))) & 0xFF
    else:
        return tl.load(sf_ptr + row_off + kb * stride_k, mask=mask, other=0).to(tl.int32) & 0xFF


@triton.jit
def load_scales_fp32(sf_ptr, rows, mask, stride_mn, stride_k, kb, SF_KIND: tl.constexpr,
                     GRAN_MN: tl.constexpr):
    """float32 scales [R] of K-block ``kb`` (units of the scales' gran_k) for operand ``rows``
    (masked rows: 0). UE8M0 bytes become 2**(byte-127) (byte 0 -> 0)."""
    row_off = (rows // GRAN_MN).to(tl.int64) * stride_mn
    if SF_KIND == 0:
        return tl.load(sf_ptr + row_off + kb * stride_k, mask=mask, other=0.0)
    else:
        return (_ue8m0_byte(sf_ptr, row_off, mask, kb, stride_k, SF_KIND) << 23).to(tl.float32, bitcast=True)


@triton.jit
def load_scales_ue8m0(sf_ptr, rows, mask, stride_mn, stride_k, k0, SF_KIND: tl.constexpr,
                      GRAN_MN: tl.constexpr, GRAN_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """UE8M0 exponents uint8 [R, BLOCK_K // 32] of the K-tile starting at element ``k0``, one per
    32 K (what ``tl.dot_scaled`` takes): a scale covering 128 K is replicated 4 times."""
    row_off = (rows // GRAN_MN).to(tl.int64) * stride_mn
    if GRAN_K >= BLOCK_K:
        e = _ue8m0_byte(sf_ptr, row_off, mask, k0 // GRAN_K, stride_k, SF_KIND)
        e = tl.broadcast_to(e[:, None], (rows.shape[0], BLOCK_K // 32))
    else:
        kb = (k0 + 32 * tl.arange(0, BLOCK_K // 32)) // GRAN_K
        e = _ue8m0_byte(sf_ptr, row_off[:, None], mask[:, None], kb[None, :], stride_k, SF_KIND)
    return e.to(tl.uint8)


@triton.jit
def block_scaled_dot(acc,
                     x_src, x_rows, x_mask, stride_xr, stride_xk,
                     xs_ptr, xs_stride_mn, xs_stride_k,
                     y_src, y_rows, y_mask, stride_yr, stride_yk,
                     ys_ptr, ys_stride_mn, ys_stride_k,
                     t_begin, t_end, K,
                     XS_KIND: tl.constexpr, XS_GRAN_MN: tl.constexpr, XS_GRAN_K: tl.constexpr,
                     YS_KIND: tl.constexpr, YS_GRAN_MN: tl.constexpr, YS_GRAN_K: tl.constexpr,
                     BLOCK_K: tl.constexpr, SCALED_MMA: tl.constexpr, EVEN_K: tl.constexpr,
                     TMA: tl.constexpr = False, x_row0=0, y_row0=0, UNIT_MX: tl.constexpr = False):
    """acc [BLOCK_R, BLOCK_C] fp32 += the block-scaled X . Y^T over K-tiles [t_begin, t_end)
    (see the module docstring for the full contract). Returns the new acc.
    ``x_src`` / ``y_src`` are the operands' pointers, or with TMA their tensor descriptors (TMA on
    sm_90 and sm_120: one bulk copy per tile instead of per-thread addresses and loads); a
    descriptor tile is the consecutive rows from ``x_row0`` / ``y_row0`` (``x_rows`` / ``y_rows``
    still address the scales), and rows and K past its shape read 0. ``UNIT_MX``: the
    fp32-promotion product as a unit-scale block-scaled MMA (``fp8_dot``)."""
    offs_k = tl.arange(0, BLOCK_K)
    if not TMA:
        x_ptrs = (x_src + x_rows.to(tl.int64)[:, None] * stride_xr
                  + (t_begin * BLOCK_K + offs_k)[None, :] * stride_xk)
        y_ptrs = (y_src + y_rows.to(tl.int64)[:, None] * stride_yr
                  + (t_begin * BLOCK_K + offs_k)[None, :] * stride_yk)
    for t in range(t_begin, t_end):
        k0 = t * BLOCK_K
        if TMA:
            x = x_src.load([x_row0, k0])
            y = y_src.load([y_row0, k0])
        elif EVEN_K:
            x = tl.load(x_ptrs, mask=x_mask[:, None], other=0.0)
            y = tl.load(y_ptrs, mask=y_mask[:, None], other=0.0)
        else:
            k_ok = (k0 + offs_k) < K
            x = tl.load(x_ptrs, mask=x_mask[:, None] & k_ok[None, :], other=0.0)
            y = tl.load(y_ptrs, mask=y_mask[:, None] & k_ok[None, :], other=0.0)
        if SCALED_MMA:
            sx = load_scales_ue8m0(xs_ptr, x_rows, x_mask, xs_stride_mn, xs_stride_k, k0, XS_KIND,
                                   XS_GRAN_MN, XS_GRAN_K, BLOCK_K)
            sy = load_scales_ue8m0(ys_ptr, y_rows, y_mask, ys_stride_mn, ys_stride_k, k0, YS_KIND,
                                   YS_GRAN_MN, YS_GRAN_K, BLOCK_K)
            acc = tl.dot_scaled(x, sx, "e4m3", tl.trans(y), sy, "e4m3", acc)
        else:
            sx = load_scales_fp32(xs_ptr, x_rows, x_mask, xs_stride_mn, xs_stride_k, k0 // XS_GRAN_K,
                                  XS_KIND, XS_GRAN_MN)
            sy = load_scales_fp32(ys_ptr, y_rows, y_mask, ys_stride_mn, ys_stride_k, k0 // YS_GRAN_K,
                                  YS_KIND, YS_GRAN_MN)
            part = fp8_dot(x, tl.trans(y), UNIT_MX)
            acc += part * (sx[:, None] * sy[None, :])
        if not TMA:
            x_ptrs += BLOCK_K * stride_xk
            y_ptrs += BLOCK_K * stride_yk
    return acc


# ----------------------------------------------------------------------------------------------
# tile configurations


@dataclasses.dataclass(frozen=True)
class Tile:
    """One launch configuration of a block-scaled GEMM.

    block_r x block_c: the output tile on the MMA's M x N sides (for a swap-AB launch the rows are
    the weight's N and the columns the activation's M). block_k: K per MMA step (64 or 128).
    swap_ab: put the weight rows on the MMA's M side (small M). group_r: tiles grouped along the
    rows for L2 reuse. scaled_mma: use ``tl.dot_scaled`` when both operands have UE8M0 scales.
    unit_mx: otherwise (float32 scales, promoted per K-block) each product is ``tl.dot_scaled``
    with unit scales, bit-identical to ``tl.dot`` (the full-rate block-scaled MMA on SM12x).
    tma: read the operand tiles through TMA tensor descriptors where the operands allow it
    (``block_scaled_dot`` with ``TMA``).
    """

    block_r: int
    block_c: int
    block_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False
    group_r: int = 8
    scaled_mma: bool = False
    tma: bool = False
    unit_mx: bool = False

    def describe(self) -> str:
        return (f"{'swapAB ' if self.swap_ab else ''}{self.block_r}x{self.block_c}x{self.block_k} "
                f"w{self.num_warps} s{self.num_stages}{' mx' if self.scaled_mma else ''}"
                f"{' unit-mx' if self.unit_mx else ''}"
                f"{' tma' if self.tma else ''}")


def _triton_release() -> tuple:
    parts = []
    for p in triton.__version__.split("+")[0].split(".")[:2]:
        parts.append(int("".join(ch for ch in p if ch.isdigit()) or 0))
    return tuple(parts)


# TMA on sm_120 / sm_121 from Triton 3.7: Triton 3.6's descriptor lowering leaves a stack frame
# there, which the compile check counts as a spill.
_SM12X_TMA = _triton_release() >= (3, 7)


# Per-arch tiles by M class. ``small``: M <= 64 (decode), weight rows on the MMA's M side, the
# activation's M padded to block_c; ``medium``: M <= 256, 64-row tiles so that more tiles fill the
# SMs; ``large``: the rest.
# num_stages S keeps S - 1 K steps of operands in shared memory.
# sm_90: wgmma, 227 KB of shared memory. 128x128x128 for large M: with fp32 scales the promotion
# tile doubles the accumulator's registers, and the wider or shallower tiles are slower; 128-row
# swap-AB tiles for small M (measurements: docs/performance.md, "Tuning provenance").
# sm_120 / sm_121: mma.sync and 101,376 B of shared memory: 3 K steps of 128x128x128 FP8 in flight
# (98,304 B; 101,376 with the UE8M0 scale tiles, so the large tile keeps per-thread loads: TMA's
# barriers would add 24 B); with UE8M0 scales the block-scaled MMA (scaled_mma). 8 warps for the
# 64-row tile: with 4 its fp32-promotion path spills on sm_120.
# TMA: the operand tiles as bulk copies instead of per-thread addresses and loads, which (with two
# warps per scheduler) bound the pointer-loaded K-loop.
# unit_mx: float32-scale calls on sm_120 take the same block-scaled MMA with unit scales, the
# scales promoted per K-block after it (plain FP8 mma.sync with float32 accumulation is half rate).
TILES = {
    "sm_90": {
        "small": Tile(128, 16, 128, 4, 6, swap_ab=True, tma=True),
        "medium": Tile(64, 128, 128, 4, 4, tma=True),
        "large": Tile(128, 128, 128, 8, 4, tma=True),
    },
    "sm_120": {
        "small": Tile(128, 16, 128, 4, 4, swap_ab=True, scaled_mma=True, tma=_SM12X_TMA, unit_mx=True),
        "medium": Tile(64, 128, 128, 8, 4, scaled_mma=True, tma=_SM12X_TMA, unit_mx=True),
        "large": Tile(128, 128, 128, 8, 4, scaled_mma=True, unit_mx=True),
    },
}


# sm_121 (GB10): Triton >= 3.8 emits the native FP8 and block-scaled MMAs there (triton #10010),
# so it takes the sm_120 tiles. Older Tritons upcast FP8 dots to f16 and emulate tl.dot_scaled
# with bf16 on sm_121: no block-scaled MMA (no gain, and the emulation's staging overflows
# 101,376 B), 64-wide K steps for 128x128 tiles (with 128 the f16 operands spill 8-16 B).
if _triton_release() >= (3, 8):
    TILES["sm_121"] = TILES["sm_120"]
else:
    TILES["sm_121"] = {
        "small": Tile(128, 16, 128, 4, 4, swap_ab=True, tma=_SM12X_TMA),
        "medium": Tile(64, 128, 128, 8, 4, tma=_SM12X_TMA),
        "large": Tile(128, 128, 64, 8, 4),
    }


def m_class(m: int) -> str:
    return "small" if m <= 64 else ("medium" if m <= 256 else "large")


def pick_tile(m: int, device=None, tiles: dict = TILES, arch: str | None = None) -> Tile:
    """The tile for an M-row problem on ``device`` (``SM12X_KERNEL_CONFIGS`` forces an arch), or
    for ``arch`` when given. A small-M tile's column block is M rounded up to a power of two (16
    at least); 64 columns take 8 warps (with 4 the fp32-promotion path spills on sm_120)."""
    if arch:  # a tiles dict without its own sm_121 entry serves sm_121 with sm_120's, as configs.pick
        tile = tiles.get(arch) or tiles["sm_120" if arch == "sm_121" else arch]
    else:
        tile = configs.pick(tiles, device)
    tile = tile[m_class(m)]
    if tile.swap_ab:
        block_c = max(16, min(64, triton.next_power_of_2(max(m, 1))))
        tile = dataclasses.replace(tile, block_c=block_c,
                                   num_warps=max(tile.num_warps, 8) if block_c >= 64 else tile.num_warps)
    return tile


# one M per distinct tile (small: 16, 32 and 64 columns), for compile checks and benchmarks
TILE_MS = (1, 32, 64, 256, 4096)


def split_k(out_tiles: int, k_tiles: int, m: int, k: int, device, min_tiles_per_split: int = 2,
            sms: int | None = None) -> int:
    """How many K-splits a launch of ``out_tiles`` output tiles uses: enough programs to give
    every SM one when the output alone does not, each split at least ``min_tiles_per_split``
    K-tiles, and the fp32 partials (splits x M x N x 4 B) no larger than the weight (N x K B).
    Shapes only (CUDA-graph safe). ``sms`` overrides the device's SM count."""
    sms = sms or configs.sm_count(device)
    if out_tiles >= sms or k_tiles < 2 * min_tiles_per_split:
        return 1
    splits = min(sms // out_tiles, k_tiles // min_tiles_per_split, max(1, k // (4 * max(m, 1))))
    if splits <= 1:
        return 1
    # an even share of K-tiles per split, so no split is left empty
    per = -(-k_tiles // splits)
    return -(-k_tiles // per)

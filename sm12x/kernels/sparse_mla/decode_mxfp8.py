"""Sparse MLA decode on the FP8 caches through block-scaled MXFP8 MMAs (the ``fast`` attention
precision, ``SM12X_ATTENTION_PRECISION=fast``; SM12x only).

Contract: as :func:`sm12x.kernels.sparse_mla.decode.sparse_mla_decode`: q bf16 [b, s_q, h_q,
512 | 576], caches [num_blocks, page, 1, 584 | 656] (V4 "MODEL1" | V3.2 / GLM), indices int32
[b, s_q, topk] (-1 invalid), optional topk_length, extra cache / indices / lengths and attn_sink;
-> out bf16 [b, s_q, h_q, 512] and lse (natural log) [b, s_q, h_q].

The math of one MODEL1 candidate tile (BLOCK_N tokens, BLOCK_H heads), no dequantisation of the
cache (V3.2 / GLM: ``_tile_v32``, whose float32 scales per 128 values are applied to each group's
logits after its unit-scale MMAs and folded into W, so they need not be powers of two):

- QK, no-RoPE part (448 dims = 7 chunks of 64): per chunk one ``tl.dot_scaled(e4m3, e4m3)`` of Q's
  e4m3 codes with one UE8M0 scale per 32 values against K's e4m3 bytes with the cache's UE8M0
  byte as it is (one byte per 64 values serves both k=32 steps). Q is quantised once per program
  (``mx_quantize``: per 32 values, the scale 2**(floor(log2 amax) - 7), so the largest code lies in
  [128, 256) and never saturates); with ``Q_TERMS=2`` Q is the sum of two such e4m3 terms (the
  second codes the first's residual), two MMAs per chunk, error near bf16's.
- QK, RoPE part (64 dims, bf16 in the cache): a bf16 MMA into the same logits.
- Online base-2 softmax as in the exact kernel; P is split once per tile (``_softmax_w``) as
  P = (hi + lo / 16) * 2**(bh - 7) per head, bh = floor(log2 of the head's largest P), taken from
  the tile's largest logit that the softmax step finds anyway: hi is P's e4m3 rounding (< 256),
  lo its residual (``P_TERMS=2``; with 1 term P keeps hi only).
- PV, no-RoPE part: V's scale varies per token (the MMA's K), so it cannot go into the MMA's
  scale operand; per chunk c, W = P * 2**(e[token, c] - 127) = (hi + lo / 16) * f * 2**(bh - 7 +
  e_max - 127) with f = 2**(e - e_max) <= 1 (e_max: the chunk's largest byte in the tile, a
  reduction over the tokens shared by every head). Multiplying an e4m3 value by a power of two is
  exact, so W's codes cost one multiply and one conversion per value and term, with one scale
  per head for the tile's 32 tokens (no search for W's largest value per head and chunk); then
  ``tl.dot_scaled`` against V's e4m3 bytes with unit scales into that chunk's accumulator.
  V3.2's float32 scales are no powers of two: there x * ks / 2**E is split into terms once per
  128-value group (``_pv_group``).
- PV, RoPE part: P in bf16 times the bf16 RoPE values (as the exact kernel).

Errors against the float32 reference (``scripts/bench_sparse_mla_precision.py`` measures them
beside the exact path's on the production cases): one e4m3 term keeps 4 significant bits per
value (relative error <= 2**-4), two terms about 8 (<= 2**-8, bf16's). W values whose exponent
falls more than 14 binades below the tile's bound (2**(bh + e_max - 127)) leave e4m3's normal range
and keep fewer bits (values under 2**-17 of it are flushed): P that small, or V scales that far
below the chunk's largest, add under 2**-14 of the tile's largest product.

Work split: grid (head blocks x V_PARTS, splits, b * s_q); a row (query token, head block) is cut
into ``splits`` parts of whole tiles; a part of a split row goes to the workspace that the exact
decode's combine kernel merges (its non-dealt form). With V_PARTS 2 the two programs of a head
block each compute the logits and one half of the output dims (dims [0, 256) / [256, 512)): half
the accumulator, so 32 heads share one gathered tile without spills. The plan depends on shapes
only (CUDA-graph capturable).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess
from sm12x.kernels.common.fp8_dot import native_block_scaled
from sm12x.kernels.sparse_mla.decode_kernels import (_dot, _sparse_mla_combine_kernel, _to_bf16,
                                                     _write_final)
from sm12x.kernels.sparse_mla.decode_plan import COMBINE_CONFIG, D_V, _combine_grid, split_signature
from sm12x.kernels.sparse_mla.precision import attention_precision

OP = "sparse_mla_decode"
LOG2E = 1.4426950408889634

# Configurations by head block (a call takes the smallest that covers h_q, else the largest).
# BLOCK_N: a multiple of 32 (the PV product's K is the token axis, and a block-scaled MMA step is
# 32 deep). Q_TERMS / P_TERMS: e4m3 terms per value; two each keep the error near bf16's and
# within FlashMLA's own tolerances (one P term: cosine difference 1.7e-4; one Q term: lse errors of
# 4e-4 on FlashMLA's test data, beyond its decode and prefill bounds for lse). V_PARTS 2: the
# program holds half of the 512 output dims (both halves compute the logits), which is what lets
# 32 heads share one gathered tile without spills. sm_120, Triton 3.9, 8 warps: BLOCK_H 16 whole
# rows 241 registers, 32 KB shared; BLOCK_H 32 in halves 247 registers, 40 KB; 32 heads whole
# rows, 64 heads in halves and 32 x 64 tokens in halves spill (48-72 B; with one Q term it does
# not). Per 64 heads and 32 tokens the hot loop of the 32-head halves issues 4 x 1,130
# instructions and 4 x 28 barriers, four 16-head blocks 4 x 1,121 and 4 x 50
# (scripts/isa_report.py). V3.2's 32-head halves (512 no-RoPE dims of Q in two terms) take 255
# registers and spill 16-32 B under Triton 3.7.1-3.9 (none under 3.6), so V3.2 keeps 16-head
# blocks.
_H16 = {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1, "Q_TERMS": 2, "P_TERMS": 2,
        "V_PARTS": 1}
_H32_HALVES = {"BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1, "Q_TERMS": 2,
               "P_TERMS": 2, "V_PARTS": 2}
CONFIGS = {"sm_120": {"model1": (_H16, _H32_HALVES), "v32": (_H16,)}}


def serves(d_qk: int, device) -> bool:
    """Whether this path serves a decode call: fast precision, an FP8 cache format (d_qk 512 or
    576), and an arch key whose Triton lowers ``tl.dot_scaled`` to the hardware MMA (sm_120;
    sm_121 from Triton 3.8). ``SM12X_KERNEL_CONFIGS=sm_120`` runs it elsewhere (tests on other
    GPUs, the interpreter)."""
    return (d_qk in (512, 576) and attention_precision() == "fast"
            and native_block_scaled(configs.arch_key(device)))


def pick_config(h_q: int, fmt: str = "model1") -> dict:
    """The configuration for ``h_q`` heads on cache format ``fmt`` (model1 | v32)."""
    options = CONFIGS["sm_120"][fmt]
    return next((c for c in options if c["BLOCK_H"] >= h_q), options[-1])


# ----------------------------------------------------------------------------------------------
# kernel


@triton.jit
def _e4m3(x, INTERPRET: tl.constexpr):
    """float32 -> e4m3, round to nearest even (values within e4m3's range). Triton 3.9's
    interpreter drops the carry when rounding crosses a power of two (31.8 -> 16), so there the
    value is first rounded to e4m3's grid by hand: 3 mantissa bits for normals, steps of 2**-9
    below 2**-6."""
    if INTERPRET:
        bits = x.to(tl.int32, bitcast=True)
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
        sub = ((x * 512.0 + 12582912.0) - 12582912.0) * (1.0 / 512.0)  # 1.5 * 2**23: RNE
        return tl.where(tl.abs(x) < 0.015625, sub, normal).to(tl.float8e4nv)
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def mx_quantize(x, INTERPRET: tl.constexpr):
    """float32 x [R, K] (K a multiple of 32) -> (e4m3 codes [R, K], UE8M0 bytes uint8 [R, K // 32])
    with x ~= code * 2**(byte - 127) per 32 values. The scale is 2**(floor(log2 amax) - 7): the
    group's largest code lies in [128, 256), inside e4m3's range, and power-of-two scaling is
    exact, so the only error is the e4m3 rounding (relative <= 2**-4 for normal codes)."""
    R: tl.constexpr = x.shape[0]
    K: tl.constexpr = x.shape[1]
    g = tl.reshape(x, (R, K // 32, 32))
    amax = tl.max(tl.abs(g), axis=2)
    biased = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF  # floor(log2 amax) + 127
    byte = tl.minimum(tl.maximum(biased - 7, 0), 254)
    inv = ((254 - byte) << 23).to(tl.float32, bitcast=True)  # 2**(127 - byte)
    codes = _e4m3(tl.reshape(g * inv[:, :, None], (R, K)), INTERPRET)
    return codes, byte.to(tl.uint8)


@triton.jit
def mx_dequantize(codes, byte):
    """The float32 values of ``mx_quantize``'s output."""
    R: tl.constexpr = codes.shape[0]
    K: tl.constexpr = codes.shape[1]
    scale = (byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    g = tl.reshape(codes.to(tl.float32), (R, K // 32, 32)) * scale[:, :, None]
    return tl.reshape(g, (R, K))


@triton.jit
def _mx_terms(x, TERMS: tl.constexpr, INTERPRET: tl.constexpr):
    """x ~= hi + lo (TERMS 2; lo is hi's residual in its own scales) or hi (TERMS 1; lo repeats
    hi and is never used)."""
    hi, s_hi = mx_quantize(x, INTERPRET)
    if TERMS == 2:
        lo, s_lo = mx_quantize(x - mx_dequantize(hi, s_hi), INTERPRET)
    else:
        lo = hi
        s_lo = s_hi
    return hi, s_hi, lo, s_lo


@triton.jit
def _mx_dot(a, sa, a2, sa2, b, sb, acc, TERMS: tl.constexpr):
    """acc + (a [+ a2]) @ b with block scales (b [K, N] e4m3, sb [N, K // 32])."""
    acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
    if TERMS == 2:
        acc = tl.dot_scaled(a2, sa2, "e4m3", b, sb, "e4m3", acc)
    return acc


@triton.jit
def _q_chunk(q_row, hmask, C: tl.constexpr, TERMS: tl.constexpr, INTERPRET: tl.constexpr):
    """No-RoPE dims [64C, 64C + 64) of the head block's q -> _mx_terms of them."""
    x = tl.load(q_row + C * 64 + tl.arange(0, 64)[None, :], mask=hmask[:, None], other=0.0)
    return _mx_terms(x.to(tl.float32), TERMS, INTERPRET)


@triton.jit
def _k_bytes(row, valid, C: tl.constexpr):
    """e4m3 bytes [BLOCK_N, 64] of chunk C of the gathered rows (invalid rows: 0)."""
    k = tl.load(row[:, None] + C * 64 + tl.arange(0, 64)[None, :], mask=valid[:, None], other=0)
    return k.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _k_chunk(row, sc_row, valid, C: tl.constexpr):
    """Chunk C of gathered MODEL1 rows: (e4m3 bytes [BLOCK_N, 64], its UE8M0 byte as int32
    [BLOCK_N]; invalid rows: 0 and 127)."""
    e = tl.load(sc_row + C, mask=valid, other=127).to(tl.int32) & 0xFF
    return _k_bytes(row, valid, C), e


@triton.jit
def _qk_chunk(s, qc, kc, ec, TERMS: tl.constexpr):
    """s += q_c . k_c^T for one 64-dim chunk: the cache byte serves both k=32 steps."""
    sk = tl.broadcast_to(ec.to(tl.uint8)[:, None], (kc.shape[0], 2))
    return _mx_dot(qc[0], qc[1], qc[2], qc[3], tl.trans(kc), sk, s, TERMS)


@triton.jit
def _softmax_w(s, valid, qk_scale, m_i, l_i, TERMS: tl.constexpr, INTERPRET: tl.constexpr):
    """The online-softmax step (``online_softmax_step``'s math) with P in the form every PV chunk
    quantises from: P = (hi + lo / 16) * 2**(bh - 7) per head, where bh = floor(log2 of the
    head's largest P in the tile) (the tile's largest logit against the running max, no extra
    reduction), so hi + lo / 16 < 256 and every chunk's W fits e4m3 without a search for its
    largest value. -> (p, x = P * 2**(7 - bh) = hi + lo / 16 exactly, hi, lo float32 [BLOCK_H,
    BLOCK_N], bh int32 [BLOCK_H], alpha, m_new, l_new); TERMS 1: lo repeats hi and is never
    used."""
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    s_max = tl.max(s, 1)
    m_new = tl.maximum(m_i, s_max)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoids (-inf) - (-inf) on empty tiles
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    # log2 of the head's largest P is s_max - m_safe <= 0; P below 2**-100 is taken as 0
    bh = tl.maximum(tl.floor(s_max - m_safe), -100.0).to(tl.int32)
    up = ((134 - bh) << 23).to(tl.float32, bitcast=True)  # 2**(7 - bh), exact
    x = p * up[:, None]
    hi = _e4m3(x, INTERPRET).to(tl.float32)
    if TERMS == 2:
        lo = (x - hi) * 16.0
    else:
        lo = hi
    return p, x, hi, lo, bh, alpha, m_new, l_new


@triton.jit
def _pv_codes(acc, w_hi, w_lo, byte, vc, TERMS: tl.constexpr):
    """acc [BLOCK_H, 64] + W . V_c, W = (w_hi + w_lo / 16) * 2**(byte - 127) (e4m3 codes [BLOCK_H,
    BLOCK_N]; byte int32 [BLOCK_H], one scale per head for the tile's 32 tokens); V's e4m3 bytes
    go in with unit scales."""
    G: tl.constexpr = vc.shape[0] // 32
    ones = tl.full((vc.shape[1], G), 127, tl.uint8)
    b = tl.minimum(tl.maximum(byte, 0), 254)
    s_hi = tl.broadcast_to(b.to(tl.uint8)[:, None], (w_hi.shape[0], G))
    acc = tl.dot_scaled(w_hi, s_hi, "e4m3", vc, ones, "e4m3", acc)
    if TERMS == 2:
        s_lo = tl.broadcast_to(tl.maximum(b - 4, 0).to(tl.uint8)[:, None], (w_hi.shape[0], G))
        acc = tl.dot_scaled(w_lo, s_lo, "e4m3", vc, ones, "e4m3", acc)
    return acc


@triton.jit
def _pv_chunk(acc, hi, lo, bh, valid, kc, ec, TERMS: tl.constexpr, INTERPRET: tl.constexpr):
    """MODEL1 chunk c: W = P * 2**(e[token] - 127), with f = 2**(e - e_max) <= 1 taken against
    the tile's largest byte e_max of the chunk (one small reduction over the tokens, shared by
    every head)."""
    e = tl.where(valid, ec, 0)
    e_max = tl.max(e, 0)
    f = ((tl.maximum(e - e_max, -126) + 127) << 23).to(tl.float32, bitcast=True)[None, :]
    # f is a power of two: hi * f and lo * f are hi's and lo's codes shifted, no new rounding
    w_lo = _e4m3(lo * f, INTERPRET) if TERMS == 2 else None
    return _pv_codes(acc, _e4m3(hi * f, INTERPRET), w_lo, bh - 7 + e_max, kc, TERMS)


@triton.jit
def _pv_group(acc_a, acc_b, x, ks, bh, ka, kb, TERMS: tl.constexpr, INTERPRET: tl.constexpr):
    """V3.2 group (two 64-dim chunks sharing one float32 scale per token, any value): W = P * ks
    = x * f * 2**(bh - 7 + E - 127), f = ks / 2**E < 1 (``_v32_factor``); f is no power of two,
    so x * f is split into e4m3 terms here, once for both chunks."""
    f, e = _v32_factor(ks)
    xg = x * f[None, :]
    w_hi = _e4m3(xg, INTERPRET)
    w_lo = _e4m3((xg - w_hi.to(tl.float32)) * 16.0, INTERPRET) if TERMS == 2 else None
    acc_a = _pv_codes(acc_a, w_hi, w_lo, bh - 7 + e, ka, TERMS)
    acc_b = _pv_codes(acc_b, w_hi, w_lo, bh - 7 + e, kb, TERMS)
    return acc_a, acc_b


@triton.jit
def _tile(a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q_rope,
          cache_ptr, stride0, ntok, idx, in_len, qk_scale, PAGE: tl.constexpr,
          Q_TERMS: tl.constexpr, P_TERMS: tl.constexpr, PART: tl.constexpr,
          INTERPRET: tl.constexpr):
    """One tile of candidates (cache indices ``idx``) -> the updated accumulators and softmax
    state (a0..a6: no-RoPE output chunks, a7: the RoPE dims). PART 0 / 1 updates a0..a3 / a4..a7
    only (the others pass through unchanged); -1 all."""
    valid = in_len & (idx >= 0) & (idx < ntok)
    safe = tl.where(valid, idx, 0)
    page_base = (safe // PAGE).to(tl.int64) * stride0
    off = (safe % PAGE).to(tl.int64)
    row = tl.multiple_of(cache_ptr + (page_base + off * 576), 16)
    sc_row = tl.multiple_of(cache_ptr + (page_base + PAGE * 576 + off * 8), 8)
    rope_row = tl.multiple_of((row + 448).to(tl.pointer_type(tl.bfloat16)), 16)
    k_rope = tl.load(rope_row[:, None] + tl.arange(0, 64)[None, :], mask=valid[:, None], other=0.0)
    k0, e0 = _k_chunk(row, sc_row, valid, 0)
    k1, e1 = _k_chunk(row, sc_row, valid, 1)
    k2, e2 = _k_chunk(row, sc_row, valid, 2)
    k3, e3 = _k_chunk(row, sc_row, valid, 3)
    k4, e4 = _k_chunk(row, sc_row, valid, 4)
    k5, e5 = _k_chunk(row, sc_row, valid, 5)
    k6, e6 = _k_chunk(row, sc_row, valid, 6)

    s = _dot(q_rope, tl.trans(k_rope), tl.zeros((q_rope.shape[0], idx.shape[0]), dtype=tl.float32),
             INTERPRET)
    s = _qk_chunk(s, q0, k0, e0, Q_TERMS)
    s = _qk_chunk(s, q1, k1, e1, Q_TERMS)
    s = _qk_chunk(s, q2, k2, e2, Q_TERMS)
    s = _qk_chunk(s, q3, k3, e3, Q_TERMS)
    s = _qk_chunk(s, q4, k4, e4, Q_TERMS)
    s = _qk_chunk(s, q5, k5, e5, Q_TERMS)
    s = _qk_chunk(s, q6, k6, e6, Q_TERMS)

    p, x, hi, lo, bh, alpha, m_new, l_i = _softmax_w(s, valid, qk_scale, m_i, l_i, P_TERMS, INTERPRET)
    a = alpha[:, None]
    if PART != 1:
        a0 = _pv_chunk(a0 * a, hi, lo, bh, valid, k0, e0, P_TERMS, INTERPRET)
        a1 = _pv_chunk(a1 * a, hi, lo, bh, valid, k1, e1, P_TERMS, INTERPRET)
        a2 = _pv_chunk(a2 * a, hi, lo, bh, valid, k2, e2, P_TERMS, INTERPRET)
        a3 = _pv_chunk(a3 * a, hi, lo, bh, valid, k3, e3, P_TERMS, INTERPRET)
    if PART != 0:
        a4 = _pv_chunk(a4 * a, hi, lo, bh, valid, k4, e4, P_TERMS, INTERPRET)
        a5 = _pv_chunk(a5 * a, hi, lo, bh, valid, k5, e5, P_TERMS, INTERPRET)
        a6 = _pv_chunk(a6 * a, hi, lo, bh, valid, k6, e6, P_TERMS, INTERPRET)
        a7 = _dot(_to_bf16(p, INTERPRET), k_rope, a7 * a, INTERPRET)
    return a0, a1, a2, a3, a4, a5, a6, a7, m_new, l_i


@triton.jit
def _v32_factor(ks):
    """A V3.2 group's float32 scales ks [BLOCK_N] (>= 0; invalid rows 0) -> (f = ks * 2**-E <= 1,
    exact, and the biased exponent E + 127 of the power of two 2**E > max ks)."""
    k_max = tl.max(ks, 0)
    e = tl.minimum(((k_max.to(tl.int32, bitcast=True) >> 23) & 0xFF) + 1, 254)  # 2**(e-127) > k_max
    return ks * ((254 - e) << 23).to(tl.float32, bitcast=True), e


@triton.jit
def _tile_v32(a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q7, q_rope,
              cache_ptr, stride0, ntok, idx, in_len, qk_scale, PAGE: tl.constexpr,
              Q_TERMS: tl.constexpr, P_TERMS: tl.constexpr, PART: tl.constexpr,
              INTERPRET: tl.constexpr):
    """``_tile`` for the V3.2 / GLM cache (656 B per token: 512 e4m3, 4 float32 scales per 128,
    64 bf16 RoPE; V is the 512 no-RoPE dims, a0..a7 its 64-dim chunks). The float32 scales are
    any value (no power-of-two assumption): each 128-wide group's two chunk MMAs run with unit
    K scales into a fresh tile that the group's scale multiplies per token; on the PV side the
    group's scale goes into W (quantised once per group, used for both its chunks)."""
    valid = in_len & (idx >= 0) & (idx < ntok)
    safe = tl.where(valid, idx, 0)
    page_base = (safe // PAGE).to(tl.int64) * stride0
    off = (safe % PAGE).to(tl.int64)
    row = tl.multiple_of(cache_ptr + (page_base + off * 656), 16)
    sc_row = tl.multiple_of((row + 512).to(tl.pointer_type(tl.float32)), 16)
    rope_row = tl.multiple_of((row + 528).to(tl.pointer_type(tl.bfloat16)), 16)
    k_rope = tl.load(rope_row[:, None] + tl.arange(0, 64)[None, :], mask=valid[:, None], other=0.0)
    ks0 = tl.load(sc_row + 0, mask=valid, other=0.0)
    ks1 = tl.load(sc_row + 1, mask=valid, other=0.0)
    ks2 = tl.load(sc_row + 2, mask=valid, other=0.0)
    ks3 = tl.load(sc_row + 3, mask=valid, other=0.0)
    unit = tl.full((idx.shape[0],), 127, tl.int32)
    k0 = _k_bytes(row, valid, 0)
    k1 = _k_bytes(row, valid, 1)
    k2 = _k_bytes(row, valid, 2)
    k3 = _k_bytes(row, valid, 3)
    k4 = _k_bytes(row, valid, 4)
    k5 = _k_bytes(row, valid, 5)
    k6 = _k_bytes(row, valid, 6)
    k7 = _k_bytes(row, valid, 7)

    zero = tl.zeros((q_rope.shape[0], idx.shape[0]), dtype=tl.float32)
    s = _dot(q_rope, tl.trans(k_rope), zero, INTERPRET)
    s += _qk_chunk(_qk_chunk(zero, q0, k0, unit, Q_TERMS), q1, k1, unit, Q_TERMS) * ks0[None, :]
    s += _qk_chunk(_qk_chunk(zero, q2, k2, unit, Q_TERMS), q3, k3, unit, Q_TERMS) * ks1[None, :]
    s += _qk_chunk(_qk_chunk(zero, q4, k4, unit, Q_TERMS), q5, k5, unit, Q_TERMS) * ks2[None, :]
    s += _qk_chunk(_qk_chunk(zero, q6, k6, unit, Q_TERMS), q7, k7, unit, Q_TERMS) * ks3[None, :]

    p, x, hi, lo, bh, alpha, m_new, l_i = _softmax_w(s, valid, qk_scale, m_i, l_i, P_TERMS, INTERPRET)
    a = alpha[:, None]
    if PART != 1:
        a0, a1 = _pv_group(a0 * a, a1 * a, x, ks0, bh, k0, k1, P_TERMS, INTERPRET)
        a2, a3 = _pv_group(a2 * a, a3 * a, x, ks1, bh, k2, k3, P_TERMS, INTERPRET)
    if PART != 0:
        a4, a5 = _pv_group(a4 * a, a5 * a, x, ks2, bh, k4, k5, P_TERMS, INTERPRET)
        a6, a7 = _pv_group(a6 * a, a7 * a, x, ks3, bh, k6, k7, P_TERMS, INTERPRET)
    return a0, a1, a2, a3, a4, a5, a6, a7, m_new, l_i


@triton.jit
def _cat2(x, y):
    """[R, n, 64] twice -> [R, 2n, 64] (x's chunks first)."""
    j = tl.join(x, y)  # [R, n, 64, 2]
    j = tl.permute(j, (0, 3, 1, 2))  # [R, 2, n, 64]
    return tl.reshape(j, (x.shape[0], 2 * x.shape[1], x.shape[2]))


@triton.jit
def _concat(a0, a1, a2, a3, a4, a5, a6, a7):
    """Eight [R, 64] chunks -> [R, 512]."""
    R: tl.constexpr = a0.shape[0]
    c01 = _cat2(tl.reshape(a0, (R, 1, 64)), tl.reshape(a1, (R, 1, 64)))
    c23 = _cat2(tl.reshape(a2, (R, 1, 64)), tl.reshape(a3, (R, 1, 64)))
    c45 = _cat2(tl.reshape(a4, (R, 1, 64)), tl.reshape(a5, (R, 1, 64)))
    c67 = _cat2(tl.reshape(a6, (R, 1, 64)), tl.reshape(a7, (R, 1, 64)))
    return tl.reshape(_cat2(_cat2(c01, c23), _cat2(c45, c67)), (R, 512))


@triton.jit
def _scan(a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q7, q_rope,
          cache_ptr, stride0, ntok, idx_row, length, t_lo, t_hi, qk_scale, PAGE: tl.constexpr,
          BLOCK_N: tl.constexpr, Q_TERMS: tl.constexpr, P_TERMS: tl.constexpr,
          IS_MODEL1: tl.constexpr, PART: tl.constexpr, INTERPRET: tl.constexpr):
    """Tiles [t_lo, t_hi) of one candidate list; each tile's indices are loaded one step ahead."""
    ar = tl.arange(0, BLOCK_N)
    pos = t_lo * BLOCK_N + ar
    idx = tl.load(idx_row + pos, mask=pos < tl.where(t_lo < t_hi, length, 0), other=-1)
    for t in range(t_lo, t_hi):
        pos = t * BLOCK_N + ar
        cur = idx
        nxt = pos + BLOCK_N
        idx = tl.load(idx_row + nxt, mask=nxt < tl.where(t + 1 < t_hi, length, 0), other=-1)
        if IS_MODEL1:
            a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i = _tile(
                a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q_rope,
                cache_ptr, stride0, ntok, cur, pos < length, qk_scale, PAGE, Q_TERMS, P_TERMS,
                PART, INTERPRET)
        else:
            a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i = _tile_v32(
                a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q7, q_rope,
                cache_ptr, stride0, ntok, cur, pos < length, qk_scale, PAGE, Q_TERMS, P_TERMS,
                PART, INTERPRET)
    return a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i


@triton.jit
def _concat4(a0, a1, a2, a3):
    """Four [R, 64] chunks -> [R, 256]."""
    R: tl.constexpr = a0.shape[0]
    c01 = _cat2(tl.reshape(a0, (R, 1, 64)), tl.reshape(a1, (R, 1, 64)))
    c23 = _cat2(tl.reshape(a2, (R, 1, 64)), tl.reshape(a3, (R, 1, 64)))
    return tl.reshape(_cat2(c01, c23), (R, 256))


@triton.jit
def _row(q_ptr, stride_qb, stride_qs, stride_qh,
         cache_ptr, cache_stride0, cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr,
         xcache_ptr, xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
         ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr, stride_ob, stride_os,
         stride_oh,
         S_Q, H, TOPK, XTOPK, HEAD_BLOCKS, TILES, SPLITS, TILES_PER_SPLIT, qk_scale, hb, part, query,
         PAGE: tl.constexpr, XPAGE: tl.constexpr, HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr,
         HAS_XLEN: tl.constexpr, HAS_SINK: tl.constexpr, HAS_MAX: tl.constexpr,
         BLOCK_H: tl.constexpr,
         BLOCK_N: tl.constexpr, Q_TERMS: tl.constexpr, P_TERMS: tl.constexpr,
         IS_MODEL1: tl.constexpr, PART: tl.constexpr, INTERPRET: tl.constexpr):
    """Heads [hb * BLOCK_H, ...) of query token ``query`` over tiles [part * TILES_PER_SPLIT, ...)
    of its candidates (main list, then extra list); output dims all (PART -1) or [256 PART,
    256 PART + 256)."""
    b = query // S_Q
    s_idx = query % S_Q
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    q_row = tl.multiple_of(q_ptr + b.to(tl.int64) * stride_qb + s_idx * stride_qs + heads * stride_qh,
                           16)[:, None]
    q0 = _q_chunk(q_row, hmask, 0, Q_TERMS, INTERPRET)
    q1 = _q_chunk(q_row, hmask, 1, Q_TERMS, INTERPRET)
    q2 = _q_chunk(q_row, hmask, 2, Q_TERMS, INTERPRET)
    q3 = _q_chunk(q_row, hmask, 3, Q_TERMS, INTERPRET)
    q4 = _q_chunk(q_row, hmask, 4, Q_TERMS, INTERPRET)
    q5 = _q_chunk(q_row, hmask, 5, Q_TERMS, INTERPRET)
    q6 = _q_chunk(q_row, hmask, 6, Q_TERMS, INTERPRET)
    if IS_MODEL1:  # d_qk 512: the last 64 dims are RoPE
        q7 = q6
        q_rope = tl.load(q_row + 448 + tl.arange(0, 64)[None, :], mask=hmask[:, None], other=0.0)
    else:  # d_qk 576: 512 no-RoPE dims, then 64 RoPE
        q7 = _q_chunk(q_row, hmask, 7, Q_TERMS, INTERPRET)
        q_rope = tl.load(q_row + 512 + tl.arange(0, 64)[None, :], mask=hmask[:, None], other=0.0)

    zero = tl.zeros((BLOCK_H, 64), dtype=tl.float32)
    a0, a1, a2, a3, a4, a5, a6, a7 = zero, zero, zero, zero, zero, zero, zero, zero
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)

    lo = part * TILES_PER_SPLIT
    hi = tl.minimum(lo + TILES_PER_SPLIT, TILES)
    n_main = tl.cdiv(TOPK, BLOCK_N)
    length = TOPK
    if HAS_LEN:
        length = tl.minimum(tl.load(len_ptr + b), TOPK)
    idx_row = idx_ptr + b.to(tl.int64) * stride_ib + s_idx * stride_is
    a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i = _scan(
        a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q7, q_rope,
        cache_ptr, cache_stride0, cache_ntok, idx_row, length, lo,
        tl.minimum(hi, tl.cdiv(length, BLOCK_N)), qk_scale, PAGE, BLOCK_N, Q_TERMS, P_TERMS,
        IS_MODEL1, PART, INTERPRET)
    if HAS_EXTRA:
        xlength = XTOPK
        if HAS_XLEN:
            xlength = tl.minimum(tl.load(xlen_ptr + b), XTOPK)
        xidx_row = xidx_ptr + b.to(tl.int64) * stride_xb + s_idx * stride_xs
        a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i = _scan(
            a0, a1, a2, a3, a4, a5, a6, a7, m_i, l_i, q0, q1, q2, q3, q4, q5, q6, q7, q_rope,
            xcache_ptr, xcache_stride0, xcache_ntok, xidx_row, xlength, tl.maximum(lo - n_main, 0),
            tl.minimum(hi - n_main, tl.cdiv(xlength, BLOCK_N)), qk_scale, XPAGE, BLOCK_N, Q_TERMS,
            P_TERMS, IS_MODEL1, PART, INTERPRET)

    has_any = l_i > 0.0
    inv_l = 1.0 / tl.where(has_any, l_i, 1.0)
    if PART == -1:
        acc = _concat(a0, a1, a2, a3, a4, a5, a6, a7) * inv_l[:, None]
        d0 = 0
    elif PART == 0:
        acc = _concat4(a0, a1, a2, a3) * inv_l[:, None]
        d0 = 0
    else:
        acc = _concat4(a4, a5, a6, a7) * inv_l[:, None]
        d0 = 256
    lse2 = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
    if SPLITS == 1:
        _write_final(out_ptr, lse_ptr, sink_ptr, acc, lse2, heads, hmask, query, H, stride_ob,
                     stride_os, stride_oh, S_Q, d0, max_ptr, m_i, HAS_SINK, HAS_MAX, INTERPRET)
    else:
        slot = (query * HEAD_BLOCKS + hb) * SPLITS + part
        rows = tl.cast(slot, tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
        tl.store(ows_ptr + rows[:, None] * 512 + d0 + tl.arange(0, acc.shape[1])[None, :], acc)
        tl.store(lsews_ptr + rows, lse2)
        if HAS_MAX:
            tl.store(mws_ptr + rows, m_i)


@triton.jit(do_not_specialize=["stride_qb", "stride_qs", "stride_qh", "cache_ntok", "stride_ib",
                               "stride_is", "xcache_ntok", "stride_xb", "stride_xs", "stride_ob",
                               "stride_os", "stride_oh", "S_Q", "H", "TOPK", "XTOPK",
                               "HEAD_BLOCKS", "TILES", "SPLITS", "TILES_PER_SPLIT"])
def _mxfp8_decode_kernel(
        q_ptr, stride_qb, stride_qs, stride_qh,
        cache_ptr, cache_stride0, cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr,
        xcache_ptr, xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
        ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr, stride_ob, stride_os,
         stride_oh,
        S_Q, H, TOPK, XTOPK, HEAD_BLOCKS, TILES, SPLITS, TILES_PER_SPLIT, qk_scale,
        PAGE: tl.constexpr, XPAGE: tl.constexpr, HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr,
        HAS_XLEN: tl.constexpr, HAS_SINK: tl.constexpr, HAS_MAX: tl.constexpr,
         BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr, Q_TERMS: tl.constexpr, P_TERMS: tl.constexpr,
        V_PARTS: tl.constexpr, IS_MODEL1: tl.constexpr, INTERPRET: tl.constexpr):
    """Program (hb * V_PARTS + v, part, query): heads [hb * BLOCK_H, ...) of query token
    ``query`` over tiles [part * TILES_PER_SPLIT, ...) of its candidates (main list, then extra
    list); V_PARTS 1: all 512 output dims, 2: half v of them (both halves compute the same
    logits). SPLITS 1: the row is written out; else its part goes to workspace slot (query *
    HEAD_BLOCKS + hb) * SPLITS + part for the combine kernel."""
    query = tl.program_id(2)
    part = tl.program_id(1)
    if V_PARTS == 1:
        _row(q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0, cache_ntok, idx_ptr,
             stride_ib, stride_is, len_ptr, xcache_ptr, xcache_stride0, xcache_ntok, xidx_ptr,
             stride_xb, stride_xs, xlen_ptr, ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr,
             max_ptr, stride_ob, stride_os, stride_oh, S_Q, H, TOPK, XTOPK, HEAD_BLOCKS, TILES, SPLITS,
             TILES_PER_SPLIT, qk_scale, tl.program_id(0), part, query, PAGE, XPAGE, HAS_LEN,
             HAS_EXTRA, HAS_XLEN, HAS_SINK, HAS_MAX, BLOCK_H, BLOCK_N, Q_TERMS, P_TERMS, IS_MODEL1, -1,
             INTERPRET)
    else:
        # Two copies of the row's code, one per half of V: each holds half the accumulator,
        # which is what lets 64 heads share one gathered tile without spilling.
        hb = tl.program_id(0) // 2
        if tl.program_id(0) % 2 == 0:
            _row(q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0, cache_ntok,
                 idx_ptr, stride_ib, stride_is, len_ptr, xcache_ptr, xcache_stride0, xcache_ntok,
                 xidx_ptr, stride_xb, stride_xs, xlen_ptr, ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr,
                 sink_ptr, max_ptr, stride_ob, stride_os, stride_oh, S_Q, H, TOPK, XTOPK, HEAD_BLOCKS, TILES,
                 SPLITS, TILES_PER_SPLIT, qk_scale, hb, part, query, PAGE, XPAGE, HAS_LEN,
                 HAS_EXTRA, HAS_XLEN, HAS_SINK, HAS_MAX, BLOCK_H, BLOCK_N, Q_TERMS, P_TERMS, IS_MODEL1, 0,
                 INTERPRET)
        else:
            _row(q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0, cache_ntok,
                 idx_ptr, stride_ib, stride_is, len_ptr, xcache_ptr, xcache_stride0, xcache_ntok,
                 xidx_ptr, stride_xb, stride_xs, xlen_ptr, ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr,
                 sink_ptr, max_ptr, stride_ob, stride_os, stride_oh, S_Q, H, TOPK, XTOPK, HEAD_BLOCKS, TILES,
                 SPLITS, TILES_PER_SPLIT, qk_scale, hb, part, query, PAGE, XPAGE, HAS_LEN,
                 HAS_EXTRA, HAS_XLEN, HAS_SINK, HAS_MAX, BLOCK_H, BLOCK_N, Q_TERMS, P_TERMS, IS_MODEL1, 1,
                 INTERPRET)


# ----------------------------------------------------------------------------------------------
# launcher


def splits_for(rows: int, tiles: int, sms: int) -> int:
    """Parts per row: enough programs for every SM (at least 2 tiles a part), from shapes only."""
    if rows >= sms or tiles < 4:
        return 1
    splits = min(triton.cdiv(sms, rows), tiles // 2)
    per = triton.cdiv(tiles, splits)
    return triton.cdiv(tiles, per)


def launch(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
           extra_topk_length, softmax_scale, out, lse, num_splits=None, max_logits=None,
           cache_tokens=None):
    """Run on inputs checked by ``decode.validate`` (d_qk 512 | 576): out bf16 [b, s_q, h_q, 512]
    with 16-byte aligned rows, lse contiguous fp32 [b, s_q, h_q]. ``max_logits`` (shaped like
    lse): also write each row's largest scaled logit (natural log units, the sparse prefill's
    output). ``cache_tokens``: indices at or past it are invalid (default: every slot of the
    cache's pages)."""
    b, s_q, h_q, _ = q.shape
    cfg = pick_config(h_q, "model1" if q.shape[-1] == 512 else "v32")
    bh, bn = cfg["BLOCK_H"], cfg["BLOCK_N"]
    has_extra = extra_k_cache is not None
    topk = indices.shape[-1]
    xtopk = extra_indices.shape[-1] if has_extra else 0
    tiles = triton.cdiv(topk, bn) + triton.cdiv(xtopk, bn)
    head_blocks = triton.cdiv(h_q, bh)
    rows = b * s_q * head_blocks
    if num_splits is None:
        splits = splits_for(rows * cfg["V_PARTS"], tiles, configs.sm_count(q.device))
    else:
        splits = max(1, min(int(num_splits), tiles))
        splits = triton.cdiv(tiles, triton.cdiv(tiles, splits))
    per = triton.cdiv(tiles, splits)
    if splits > 1:
        ows = torch.empty((rows * splits, bh, D_V), dtype=torch.float32, device=q.device)
        lsews = torch.empty((rows * splits, bh), dtype=torch.float32, device=q.device)
    else:
        ows = lsews = lse
    has_max = max_logits is not None
    mws = torch.empty_like(lsews) if has_max and splits > 1 else lsews
    max_logits = max_logits if has_max else lse
    cache = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
    xcache = (extra_k_cache if extra_k_cache.dtype == torch.uint8 else extra_k_cache.view(torch.uint8)
              ) if has_extra else cache
    xidx = extra_indices if has_extra else indices
    topk_length = topk_length.contiguous() if topk_length is not None else None
    extra_topk_length = extra_topk_length.contiguous() if extra_topk_length is not None else None
    sink = attn_sink.contiguous() if attn_sink is not None else lse
    ntok = lambda c: min(c.shape[0] * c.shape[1], 2**31 - 1)  # noqa: E731
    interp = interpreting()
    _mxfp8_decode_kernel[(head_blocks * cfg["V_PARTS"], splits, b * s_q)](
        q, q.stride(0), q.stride(1), q.stride(2),
        cache, cache.stride(0), ntok(cache) if cache_tokens is None else int(cache_tokens), indices,
        indices.stride(0), indices.stride(1),
        topk_length if topk_length is not None else indices,
        xcache, xcache.stride(0), ntok(xcache), xidx, xidx.stride(0), xidx.stride(1),
        extra_topk_length if extra_topk_length is not None else indices,
        ows, lsews, mws, out, lse, sink, max_logits, out.stride(0), out.stride(1), out.stride(2),
        s_q, h_q, topk, xtopk, head_blocks, tiles, splits, per, float(softmax_scale) * LOG2E,
        PAGE=k_cache.shape[1], XPAGE=xcache.shape[1], HAS_LEN=topk_length is not None,
        HAS_EXTRA=has_extra, HAS_XLEN=has_extra and extra_topk_length is not None,
        HAS_SINK=attn_sink is not None, HAS_MAX=has_max, BLOCK_H=bh, BLOCK_N=bn, Q_TERMS=cfg["Q_TERMS"],
        P_TERMS=cfg["P_TERMS"], V_PARTS=cfg["V_PARTS"], IS_MODEL1=q.shape[-1] == 512, INTERPRET=interp,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    if splits > 1:
        _sparse_mla_combine_kernel[_combine_grid(h_q, b * s_q)](
            ows, lsews, mws, out, lse, sink, max_logits, out.stride(0), out.stride(1), out.stride(2),
            s_q, h_q, b * s_q, head_blocks, 0, tiles, splits, rows * splits,
            HAS_SINK=attn_sink is not None, HAS_MAX=has_max, DEALT=False, WIDE=False, BLOCK_H=bh,
            BLOCK_HC=COMBINE_CONFIG["BLOCK_HC"], BLOCK_DC=COMBINE_CONFIG["BLOCK_DC"],
            PARTS=COMBINE_CONFIG["PARTS"], SKIP_EMPTY=False, PDL=False, INTERPRET=interp,
            num_warps=COMBINE_CONFIG["num_warps"])
    return out, lse


# ----------------------------------------------------------------------------------------------
# compile check


def _signature(cfg, page, xpage, inputs, is_model1=True, has_max=False):
    has_len, has_extra, has_xlen = inputs
    const = dict(PAGE=page, XPAGE=xpage, HAS_LEN=has_len, HAS_EXTRA=has_extra,
                 HAS_XLEN=has_xlen, HAS_SINK=True, HAS_MAX=has_max, BLOCK_H=cfg["BLOCK_H"],
                 BLOCK_N=cfg["BLOCK_N"], Q_TERMS=cfg["Q_TERMS"], P_TERMS=cfg["P_TERMS"], V_PARTS=cfg["V_PARTS"],
                 IS_MODEL1=is_model1, INTERPRET=False)
    return split_signature(_mxfp8_decode_kernel, const)


def compile_reports(targets=("sm_120", "sm_121"), prefill=False):
    """Compile every configuration for the ``targets`` whose Triton lowers ``tl.dot_scaled``
    natively: the decode's form (V4's CSA page sizes, every optional input; whole rows and row
    parts are one kernel), or with ``prefill`` the sparse prefill's (``prefill_mxfp8``: packed
    pages of 64 tokens, per-query lengths, max_logits, no extra list)."""
    from sm12x.kernels.common.compile_check import compile_kernel

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), prefill=prefill)
    reports = []
    for target in targets:
        if not native_block_scaled(target):
            continue
        for fmt, cfg in ((f, c) for f, opts in CONFIGS["sm_120"].items() for c in opts):
            if prefill:
                sig, const = _signature(cfg, 64, 64, (True, False, False), fmt == "model1",
                                        has_max=True)
                tail = "prefill p64 L M"
            else:
                sig, const = _signature(cfg, 256 if fmt == "model1" else 64, 64, (True, True, True),
                                        fmt == "model1")
                tail = f"p{const['PAGE']}/64 L X XL"
            name = (f"mxfp8 {fmt} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']} "
                    f"q{cfg['Q_TERMS']}p{cfg['P_TERMS']}v{cfg['V_PARTS']} {tail}")
            reports.append(compile_kernel(_mxfp8_decode_kernel, sig, const, target=target,
                                          num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                                          config_name=name))
    return reports

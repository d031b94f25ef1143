"""Sparse MLA decode on FP8 KV caches (FlashMLA ``sparse_decode_fwd`` semantics) in Triton.

Work: a row is BLOCK_H heads of one query token over its candidate list (main top-k tiles, then
extra top-k tiles, BLOCK_N tokens each); a unit is one tile of one row. Each program takes a
contiguous, near-equal range of units (``plan``: whole rows, rows cut into equal parts, or, to
fill every SM, units dealt out evenly with rows cut anywhere). Per tile it gathers the rows,
dequantises FP8 -> bf16 in registers (exact: the scales are powers of two), runs QK^T and PV as
bf16 x bf16 -> fp32 dots with an online base-2 softmax. The next tile's indices (PREFETCH 1) or
rows (PREFETCH 2) are loaded while the current tile computes. A whole row is written out (sink
applied, bf16 ``out``, natural-log ``lse``); the parts of a row split between programs go to a
workspace that a combine kernel merges. Where the combine's programs fit on the SMs the split
kernel leaves idle, the combine is launched as its programmatic dependent (PDL, ``Plan.pdl``): it
starts while the split kernel runs and waits for its results in ``griddepcontrol.wait``.

The plan and the workspace depend on shapes only (CUDA-graph capturable).
Formats: see ``mla_kv_cache``. The public entry point is :func:`sparse_mla_decode`.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import checks, configs
from sm12x.kernels.common.rounding import round_bf16

OP = "sparse_mla_decode"
D_V = 512
LOG2E = 1.4426950408889634

# Per-architecture launch configurations per cache format, by head-block size: a call uses the
# smallest BLOCK_H that covers h_q, else the largest, and a smaller one when that leaves SMs idle
# (``pick_config``). The fp32 accumulator is BLOCK_H x 512 and every program dequantises its
# tokens itself, so a larger BLOCK_H means less repeated dequantisation (h_q = 64 with BLOCK_H 64:
# each token is dequantised once per query). PREFETCH (default 1) is the depth of the loads issued
# ahead of the tile being computed (``_scan_list``).
# sm_120/sm_121 configs must fit 101,376 B of shared memory with no spills (``compile_reports``).
# BLOCK_H 64 fits on sm_120 for MODEL1 only (V3.2 needs an extra RoPE dot).
# SM12X_SPARSE_MLA_CONFIG="BLOCK_H=32,BLOCK_N=16,num_warps=8" overrides the choice (tuning).
_H16 = {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1}
_H32 = {"BLOCK_H": 32, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1}
_H64 = {"BLOCK_H": 64, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1}
# PREFETCH 2 (the next tile's rows held in registers) at BLOCK_H 32 and 64 compiles without
# spills on sm_120/sm_121 for MODEL1 (182-192 / 244-254 registers, 50,304 / 84,224 B) and ran
# these configs 7-13% (BLOCK_H 64) and 22-24% (BLOCK_H 32) faster on the H200 (RESULTS.md,
# seventeenth session; not measured on an SM12x GPU). At BLOCK_H 16 (N16 or N32) it spills or
# was slower. V3.2's extra RoPE dot: at BLOCK_H 32 only PREFETCH 2 compiles without spills (180
# regs; 0 and 1 spill 80-170 B). The sparse prefill's bf16 rows keep PREFETCH 1: with 2 the sm_120
# configs ran V4 prefill 4-21% slower on the H200 (4096 x h128: 5094 -> 5297 us).
_H32_PF2 = {**_H32, "PREFETCH": 2}
_H64_PF2 = {**_H64, "PREFETCH": 2}
# sm_90 model1, measured on an H200 (CUDA-graph GPU time, 2026-12-02; scripts/RESULTS.md):
# 64 tokens per tile everywhere. BLOCK_H 64 spills ~180 B (wgmma keeps the 64 x 512 fp32
# accumulator in registers) and is still the fastest for h_q >= 64 once a call fills the GPU (b64
# h64: 59.9 us vs 120.4 at BLOCK_H 32; b2 h64 takes BLOCK_H 16, see pick_config); prefetching whole
# rows (PREFETCH 2) spills ~1 KB there, but pays at BLOCK_H 16 (b1 h16: 13.8 vs 14.0 us, b2 h64:
# 14.3 vs 15.5 us, scripts/tune_sparse_mla_decode.py).
# These wide tiles exceed sm_120's 101,376 B of shared memory, so SM12x keeps the configs above.
_H16_N64 = {"BLOCK_H": 16, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1, "PREFETCH": 2}
_H32_N64 = {"BLOCK_H": 32, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1}
# PREFETCH 2 pays at BLOCK_H 32 too, spilling ~0.6 KB (triton 3.9): b64 / b256 h32 69.9 / 257.5 ->
# 64.7 / 240.0 us (seventeenth session). At BLOCK_H 64 it spills ~2 KB and takes 3.5x as long.
_H32_N64_PF2 = {**_H32_N64, "PREFETCH": 2}
_H64_N64 = {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1}
# sm_90 v32: h_q 128 takes BLOCK_H 64 x BLOCK_N 64, the tile the sparse prefill's 576-dim rows
# use there (same kernel, same RoPE dot): two head blocks gather each row instead of four, in
# 64-token tiles instead of 16. H200, V3.2 h_q 128 top-2048 s_q 2, b 2 / 64 / 128: 30.6 / 423 /
# 828 us; BLOCK_H 32 x 16 (PREFETCH 2) 52 / 1274 / 2542; 64 x 32 33 / 505 / 997 (PREFETCH 1),
# 34 / 602 / 1195 (PREFETCH 2). It spills ~460 B there (triton 3.9), like model1's 64 x 64.
# bf16_512 / bf16_576: the sparse prefill's bf16 rows (``sparse_mla_prefill``), d_qk 512 / 576.
# sm_90, H200 (2026-12-03, scripts/RESULTS.md): s_q 4096, h_q 128, top-2048 at d_qk 576 takes
# 12.8 ms with BLOCK_H 64 x BLOCK_N 64, 38.4 ms with the FP8 V3.2 config (BLOCK_N 16). sm_120
# d_qk 576 keeps BLOCK_N 16: BLOCK_N 32 ran that case in 31.9 ms on the H200 but spills 8-16 B on
# sm_120 in the programs that leave row parts to the combine step.
CONFIGS = {
    "sm_120": {"model1": (_H16, _H32_PF2, _H64_PF2), "v32": (_H16, _H32_PF2),
               "bf16_512": (_H16, _H32, _H64), "bf16_576": (_H16, _H32_PF2)},
    "sm_90": {"model1": (_H16_N64, _H32_N64_PF2, _H64_N64), "v32": (_H16, _H32_PF2, _H64_N64),
              "bf16_512": (_H16_N64, _H32_N64, _H64_N64), "bf16_576": (_H32_N64, _H64_N64)},
}
DECODE_FORMATS = ("model1", "v32")
# PARTS: parts merged per step of the combine loop; a dealt-out plan's split rows have two or
# three parts, and there 2 beat 4 on the H200 (b74 h64: 11.8 vs 13.7 us; RESULTS.md)
COMBINE_CONFIG = {"BLOCK_HC": 8, "BLOCK_DC": 128, "PARTS": 4, "DEALT_PARTS": 2, "num_warps": 4}
# The fewest candidates per program that pay for its set-up (q, the write-out, the combine):
# the head-block choice counts the programs a call can use in these (``pick_config``).
PROGRAM_TOKENS = 64
WIDE_PRODUCT = 2**31  # units x programs from here on: the unit arithmetic runs in int64


@triton.jit
def _gather_tile(cache_ptr, stride0, ntok, idx, in_len, PAGE: tl.constexpr,
                 IS_MODEL1: tl.constexpr, KV_BF16: tl.constexpr):
    """Issue the loads of one tile of candidates (cache indices ``idx``, ``in_len``: within the
    list's length) -> (raw, scale, rope, valid).
    MODEL1: raw fp8 bytes [BLOCK_N, 8, 64] (chunk 7 is the RoPE slot, not loaded), UE8M0 bytes
    [BLOCK_N, 8], RoPE bf16 [BLOCK_N, 8, 64] holding chunk 7 only (it drops into k with a select;
    a 2-D load broadcast into k measured slower and spilled).
    V3.2: raw [BLOCK_N, 4, 128], fp32 scales [BLOCK_N, 4], RoPE bf16 [BLOCK_N, 64].
    KV_BF16 (sparse prefill, PAGE 1, rows of stride0 bytes): raw = k bf16 [BLOCK_N, 512], RoPE
    bf16 [BLOCK_N, 64] (dims 512..575; zeros when IS_MODEL1, i.e. d_qk 512), no scales."""
    valid = in_len & (idx >= 0) & (idx < ntok)
    safe = tl.where(valid, idx, 0)
    page_base = (safe // PAGE).to(tl.int64) * stride0  # int64: page * stride(0) can exceed 2^31
    off = (safe % PAGE).to(tl.int64)
    # Row starts are multiples of 16 bytes (the launcher checks the cache pointer and stride(0));
    # telling the compiler lets it gather each row with 16-byte vector loads.
    if KV_BF16:
        row = tl.multiple_of((cache_ptr + page_base).to(tl.pointer_type(tl.bfloat16)), 16)
        raw = tl.load(row[:, None] + tl.arange(0, 512)[None, :], mask=valid[:, None], other=0.0)
        scale = valid
        if IS_MODEL1:
            rope = tl.zeros((idx.shape[0], 64), dtype=tl.bfloat16)
        else:
            rope = tl.load(row[:, None] + 512 + tl.arange(0, 64)[None, :], mask=valid[:, None],
                           other=0.0)
    elif IS_MODEL1:
        row = tl.multiple_of(cache_ptr + (page_base + off * 576), 16)
        c = tl.arange(0, 8)
        d = tl.arange(0, 64)
        is_nope = (c < 7)[None, :, None]
        v3 = valid[:, None, None]
        raw = tl.load(row[:, None, None] + (c * 64)[None, :, None] + d[None, None, :],
                      mask=v3 & is_nope, other=0)
        sc_row = tl.multiple_of(cache_ptr + (page_base + PAGE * 576 + off * 8), 8)
        scale = tl.load(sc_row[:, None] + c[None, :], mask=valid[:, None] & (c < 7)[None, :],
                        other=127)
        rope_row = tl.multiple_of((row + 448).to(tl.pointer_type(tl.bfloat16)), 16)
        rope = tl.load(rope_row[:, None, None] + d[None, None, :] + (c * 0)[None, :, None],
                       mask=v3 & (c == 7)[None, :, None], other=0.0)
    else:
        row = tl.multiple_of(cache_ptr + (page_base + off * 656), 16)
        c = tl.arange(0, 4)
        d = tl.arange(0, 128)
        raw = tl.load(row[:, None, None] + (c * 128)[None, :, None] + d[None, None, :],
                      mask=valid[:, None, None], other=0)
        sc_row = tl.multiple_of((row + 512).to(tl.pointer_type(tl.float32)), 16)
        scale = tl.load(sc_row[:, None] + c[None, :], mask=valid[:, None], other=0.0)
        rope_row = tl.multiple_of((row + 528).to(tl.pointer_type(tl.bfloat16)), 16)
        rope = tl.load(rope_row[:, None] + tl.arange(0, 64)[None, :], mask=valid[:, None],
                       other=0.0)
    return raw, scale, rope, valid


@triton.jit
def _dequant_tile(raw, scale, rope, IS_MODEL1: tl.constexpr, KV_BF16: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """Gathered bytes -> k bf16 [BLOCK_N, 512] (exact: the scales are powers of two). For MODEL1
    the RoPE part is the last 64 dims of k; V3.2 keeps it apart (``rope``, used as is)."""
    if KV_BF16:
        return raw
    elif IS_MODEL1:
        e = (scale.to(tl.int32) << 23).to(tl.float32, bitcast=True)   # UE8M0 -> 2^(e - 127)
        nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * e[:, :, None]
        is_nope = (tl.arange(0, 8) < 7)[None, :, None]
        return tl.reshape(tl.where(is_nope, nope.to(tl.bfloat16), rope), (BLOCK_N, 512))
    else:
        nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return tl.reshape((nope * scale[:, :, None]).to(tl.bfloat16), (BLOCK_N, 512))


@triton.jit
def _dot(a, b, acc, INTERPRET: tl.constexpr):
    """bf16 x bf16 -> fp32. Triton 3.9's interpreter gets bf16 dots wrong; it gets the (exact)
    fp32 upcast right."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc)
    else:
        return tl.dot(a, b, acc=acc)


@triton.jit
def _to_bf16(x, INTERPRET: tl.constexpr):
    """fp32 -> bf16, round to nearest even. Triton 3.9's interpreter truncates instead, so it
    gets the rounding done by hand (finite inputs)."""
    if INTERPRET:
        return round_bf16(x).to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _attend_tile(acc, m_i, l_i, q, q_rope, k, rope, valid, qk_scale, one,
                 IS_MODEL1: tl.constexpr, INTERPRET: tl.constexpr):
    """One tile of dequantised candidates -> updated (acc, m_i, l_i)."""
    # QK^T runs inside a loop of ``one`` (== 1, unknown to the compiler) iteration. Triton gives
    # a dot whose result feeds another dot all warps on the M (head) axis; with 8 warps and 64
    # heads both warpgroups would compute the whole tile. Behind the loop the QK dot gets its own
    # layout (the warpgroups split the keys): half the tensor-core and shared-memory work.
    s = tl.zeros((q.shape[0], k.shape[0]), dtype=tl.float32)
    for _ in range(0, one):
        s = _dot(q, tl.trans(k), tl.zeros((q.shape[0], k.shape[0]), dtype=tl.float32), INTERPRET)
        if not IS_MODEL1:
            s = _dot(q_rope, tl.trans(rope), s, INTERPRET)
    s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # avoids (-inf) - (-inf) on empty tiles
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _dot(_to_bf16(p, INTERPRET), k, acc * alpha[:, None], INTERPRET)
    return acc, m_new, l_i


@triton.jit
def _scan_list(acc, m_i, l_i, q, q_rope, cache_ptr, stride0, ntok, idx_row, length, t_lo, t_hi,
               qk_scale, one, PAGE: tl.constexpr, IS_MODEL1: tl.constexpr, KV_BF16: tl.constexpr,
               BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, INTERPRET: tl.constexpr):
    """Attend to tiles [t_lo, t_hi) of one candidate list (tile t = positions
    [t * BLOCK_N, (t + 1) * BLOCK_N), masked at ``length``) -> updated (acc, m_i, l_i).
    PREFETCH 1: each tile's indices are loaded one step ahead, so a step waits for one global
    round trip (the rows) instead of two. PREFETCH 2: the rows too (costs registers)."""
    ar = tl.arange(0, BLOCK_N)
    pos = t_lo * BLOCK_N + ar
    idx = tl.load(idx_row + pos, mask=pos < tl.where(t_lo < t_hi, length, 0), other=-1)
    if PREFETCH == 2:
        raw, scale, rope, valid = _gather_tile(cache_ptr, stride0, ntok, idx, pos < length, PAGE,
                                               IS_MODEL1, KV_BF16)
        pos = pos + BLOCK_N
        idx = tl.load(idx_row + pos, mask=pos < tl.where(t_lo + 1 < t_hi, length, 0), other=-1)
    for t in range(t_lo, t_hi):
        if PREFETCH == 2:
            k = _dequant_tile(raw, scale, rope, IS_MODEL1, KV_BF16, BLOCK_N)
            k_rope = rope
            k_valid = valid
            pos = (t + 1) * BLOCK_N + ar
            raw, scale, rope, valid = _gather_tile(cache_ptr, stride0, ntok, idx,
                                                   pos < tl.where(t + 1 < t_hi, length, 0), PAGE,
                                                   IS_MODEL1, KV_BF16)
            pos = pos + BLOCK_N
            idx = tl.load(idx_row + pos, mask=pos < tl.where(t + 2 < t_hi, length, 0), other=-1)
        else:
            pos = t * BLOCK_N + ar
            if PREFETCH == 1:
                cur = idx
                nxt = pos + BLOCK_N
                idx = tl.load(idx_row + nxt, mask=nxt < tl.where(t + 1 < t_hi, length, 0),
                              other=-1)
            else:
                cur = tl.load(idx_row + pos, mask=pos < length, other=-1)
            raw, scale, k_rope, k_valid = _gather_tile(cache_ptr, stride0, ntok, cur,
                                                       pos < length, PAGE, IS_MODEL1, KV_BF16)
            k = _dequant_tile(raw, scale, k_rope, IS_MODEL1, KV_BF16, BLOCK_N)
        acc, m_i, l_i = _attend_tile(acc, m_i, l_i, q, q_rope, k, k_rope, k_valid, qk_scale, one,
                                     IS_MODEL1, INTERPRET)
    return acc, m_i, l_i


@triton.jit
def _write_final(out_ptr, lse_ptr, sink_ptr, acc, lse2, heads, hmask, pid_bs, H, stride_ob,
                 stride_os, stride_oh, S_Q, d0, max_ptr, m2, HAS_SINK: tl.constexpr,
                 HAS_MAX: tl.constexpr, INTERPRET: tl.constexpr):
    """acc = normalised output fp32 [BLOCK_H, BLOCK_D] for dims [d0, d0 + BLOCK_D),
    lse2 = log2-sum-exp (-inf: no valid key). The d0 == 0 block also writes lse, and with
    HAS_MAX the largest scaled logit (m2: its base-2 form) in natural-log units."""
    lonely = lse2 == float("-inf")
    lse = tl.where(lonely, float("inf"), lse2 * 0.6931471805599453)
    factor = tl.where(lonely, 0.0, 1.0)
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=hmask, other=float("-inf"))
        factor = tl.where(lonely, 0.0, 1.0 / (1.0 + tl.exp(sink - lse)))
    o = acc * factor[:, None]
    b = pid_bs // S_Q
    s = pid_bs % S_Q
    dv = d0 + tl.arange(0, acc.shape[1])
    # Rows are 16-byte aligned (the launcher guarantees it): vector stores.
    o_row = tl.multiple_of(out_ptr + b.to(tl.int64) * stride_ob + s * stride_os + heads * stride_oh,
                           16)
    o_ptrs = o_row[:, None] + dv[None, :]
    tl.store(o_ptrs, _to_bf16(o, INTERPRET), mask=hmask[:, None])
    tl.store(lse_ptr + pid_bs.to(tl.int64) * H + heads, lse, mask=hmask & ((heads * 0 + d0) == 0))
    if HAS_MAX:
        tl.store(max_ptr + pid_bs.to(tl.int64) * H + heads, m2 * 0.6931471805599453,
                 mask=hmask & ((heads * 0 + d0) == 0))


@triton.jit
def _attend_row(q_ptr, stride_qb, stride_qs, stride_qh,
                cache_ptr, cache_stride0, cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr,
                xcache_ptr, xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
                b, s, heads, hmask, S_Q, TOPK, XTOPK, lo, hi, qk_scale,
                PAGE: tl.constexpr, XPAGE: tl.constexpr, IS_MODEL1: tl.constexpr,
                KV_BF16: tl.constexpr, HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr,
                HAS_XLEN: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                PREFETCH: tl.constexpr, INTERPRET: tl.constexpr):
    """Heads ``heads`` of query token (b, s) over candidate tiles [lo, hi) (main list tiles,
    then extra list tiles) -> (normalised output fp32 [BLOCK_H, 512], log2-sum-exp and largest
    logit in base-2 units; -inf when no valid key)."""
    # Rows are 16-byte aligned (the launcher guarantees it): vector loads.
    q_row = tl.multiple_of(q_ptr + b.to(tl.int64) * stride_qb + s * stride_qs + heads * stride_qh,
                           16)[:, None]
    q = tl.load(q_row + tl.arange(0, 512)[None, :], mask=hmask[:, None], other=0.0)
    if IS_MODEL1:
        q_rope = tl.zeros((BLOCK_H, 64), dtype=tl.bfloat16)
    else:
        q_rope = tl.load(q_row + 512 + tl.arange(0, 64)[None, :], mask=hmask[:, None], other=0.0)

    acc = tl.zeros((BLOCK_H, 512), dtype=tl.float32)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)

    n_main = tl.cdiv(TOPK, BLOCK_N)
    length = TOPK
    if HAS_LEN:
        length = tl.minimum(tl.load(len_ptr + b), TOPK)
    one = tl.minimum(S_Q, 1)  # == 1 (see _attend_tile)
    idx_row = idx_ptr + b.to(tl.int64) * stride_ib + s * stride_is
    acc, m_i, l_i = _scan_list(acc, m_i, l_i, q, q_rope, cache_ptr, cache_stride0, cache_ntok,
                               idx_row, length, lo, tl.minimum(hi, tl.cdiv(length, BLOCK_N)),
                               qk_scale, one, PAGE, IS_MODEL1, KV_BF16, BLOCK_N, PREFETCH,
                               INTERPRET)
    if HAS_EXTRA:
        xlength = XTOPK
        if HAS_XLEN:
            xlength = tl.minimum(tl.load(xlen_ptr + b), XTOPK)
        xidx_row = xidx_ptr + b.to(tl.int64) * stride_xb + s * stride_xs
        acc, m_i, l_i = _scan_list(acc, m_i, l_i, q, q_rope, xcache_ptr, xcache_stride0,
                                   xcache_ntok, xidx_row, xlength, tl.maximum(lo - n_main, 0),
                                   tl.minimum(hi - n_main, tl.cdiv(xlength, BLOCK_N)), qk_scale,
                                   one, XPAGE, IS_MODEL1, KV_BF16, BLOCK_N, PREFETCH, INTERPRET)

    has_any = l_i > 0.0
    acc = acc / tl.where(has_any, l_i, 1.0)[:, None]
    lse2 = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
    return acc, lse2, m_i


@triton.jit
def _wide(x, WIDE: tl.constexpr):
    """``x`` in int64 when units x programs can reach 2^31 (WIDE), else as is: 64-bit division is
    a long instruction sequence, on the critical path of every program."""
    if WIDE:
        return tl.cast(x, tl.int64)
    else:
        return x


@triton.jit
def _first_unit(p, UNITS, PROGRAMS, WIDE: tl.constexpr):
    """The first work unit of dealt-out program ``p`` (contiguous, near-equal unit ranges)."""
    return (_wide(p, WIDE) * UNITS // PROGRAMS).to(tl.int32)


# Integer arguments are not specialised on their values (== 1, % 16): a serving process would
# otherwise compile a new variant for many batch sizes / split counts during CUDA-graph capture.
# The alignment facts the kernel needs are stated in-kernel with tl.multiple_of instead.
_RUNTIME_INTS = ["stride_qb", "stride_qs", "stride_qh", "cache_stride0", "cache_ntok", "stride_ib",
                 "stride_is", "xcache_stride0", "xcache_ntok", "stride_xb", "stride_xs",
                 "stride_ob", "stride_os", "stride_oh", "S_Q", "H", "TOPK", "XTOPK", "QUERIES",
                 "HEAD_BLOCKS", "HEAD_MAJOR", "TILES", "SPLITS", "TILES_PER_SPLIT", "PROGRAMS"]


@triton.jit
def _row_coords(r, QUERIES, HEAD_BLOCKS, HEAD_MAJOR):
    """Row -> (query token, head block); rows are numbered query first (r = query * HEAD_BLOCKS
    + hb) or, with HEAD_MAJOR, head block first (r = hb * QUERIES + query)."""
    by_query = r // HEAD_BLOCKS
    by_head = r // QUERIES
    query = tl.where(HEAD_MAJOR != 0, r - by_head * QUERIES, by_query)
    return query, tl.where(HEAD_MAJOR != 0, by_head, r - by_query * HEAD_BLOCKS)


@triton.jit
def _segment(q_ptr, stride_qb, stride_qs, stride_qh,
             cache_ptr, cache_stride0, cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr,
             xcache_ptr, xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
             ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr, stride_ob,
             stride_os, stride_oh, S_Q, H, TOPK, XTOPK, TILES, query, hb, t0, t1, slot, qk_scale,
             PAGE: tl.constexpr, XPAGE: tl.constexpr, IS_MODEL1: tl.constexpr,
             KV_BF16: tl.constexpr, HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr,
             HAS_XLEN: tl.constexpr, HAS_SINK: tl.constexpr, HAS_MAX: tl.constexpr,
             DIRECT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
             PREFETCH: tl.constexpr, INTERPRET: tl.constexpr):
    """Tiles [t0, t1) of row (query, hb): written out when that is the whole row, else left in
    workspace ``slot`` for the combine kernel (with HAS_MAX, the part's largest logits too)."""
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    acc, lse2, m2 = _attend_row(
        q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0, cache_ntok,
        idx_ptr, stride_ib, stride_is, len_ptr, xcache_ptr, xcache_stride0, xcache_ntok,
        xidx_ptr, stride_xb, stride_xs, xlen_ptr, query // S_Q, query % S_Q, heads, hmask,
        S_Q, TOPK, XTOPK, t0, t1, qk_scale, PAGE, XPAGE, IS_MODEL1, KV_BF16, HAS_LEN,
        HAS_EXTRA, HAS_XLEN, BLOCK_H, BLOCK_N, PREFETCH, INTERPRET)
    if DIRECT:
        _write_final(out_ptr, lse_ptr, sink_ptr, acc, lse2, heads, hmask, query, H,
                     stride_ob, stride_os, stride_oh, S_Q, 0, max_ptr, m2, HAS_SINK, HAS_MAX,
                     INTERPRET)
    else:
        if (t0 == 0) & (t1 == TILES):
            _write_final(out_ptr, lse_ptr, sink_ptr, acc, lse2, heads, hmask, query, H,
                         stride_ob, stride_os, stride_oh, S_Q, 0, max_ptr, m2, HAS_SINK,
                         HAS_MAX, INTERPRET)
        else:
            part = tl.cast(slot, tl.int64) * BLOCK_H + tl.arange(0, BLOCK_H)
            tl.store(ows_ptr + part[:, None] * 512 + tl.arange(0, 512)[None, :], acc)
            tl.store(lsews_ptr + part, lse2)
            if HAS_MAX:
                tl.store(mws_ptr + part, m2)


@triton.jit(do_not_specialize=_RUNTIME_INTS)
def _sparse_mla_split_kernel(
        q_ptr, stride_qb, stride_qs, stride_qh,
        cache_ptr, cache_stride0, cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr,
        xcache_ptr, xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
        ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr, stride_ob, stride_os,
        stride_oh, S_Q, H, TOPK, XTOPK, QUERIES, HEAD_BLOCKS, HEAD_MAJOR, TILES, SPLITS,
        TILES_PER_SPLIT, PROGRAMS, qk_scale,
        PAGE: tl.constexpr, XPAGE: tl.constexpr, IS_MODEL1: tl.constexpr, KV_BF16: tl.constexpr,
        HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_XLEN: tl.constexpr,
        HAS_SINK: tl.constexpr, HAS_MAX: tl.constexpr, DIRECT: tl.constexpr,
        DEALT: tl.constexpr, WIDE: tl.constexpr, BLOCK_H: tl.constexpr,
        BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, INTERPRET: tl.constexpr):
    """A row is (query token, head block); a unit, one tile of a row (TILES per row).
    DEALT (grid (PROGRAMS,)): program p takes units [_first_unit(p), _first_unit(p + 1)) of the
    rows in ``_row_coords`` order, row segment by row segment; a part of a row goes to workspace
    slot 2p (the program's first segment) or 2p + 1 (its last). Else (grid (HEAD_BLOCKS,
    SPLITS, QUERIES)): program (hb, k, query) takes tiles [k * TILES_PER_SPLIT, ...) of one row
    (slot: its program number). DIRECT: no row is split. WIDE: see ``_wide``.
    IS_MODEL1: d_qk 512 (RoPE inside the 512 dims), else 576 (a separate RoPE dot). KV_BF16:
    the sparse prefill's bf16 rows instead of an FP8 cache. HAS_MAX: also write the largest
    logit of each row to ``max_ptr`` (a split row's parts leave theirs in ``mws_ptr``).
    PDL: let the combine kernel (launched as a programmatic dependent) start now."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if DEALT:
        # Everything a segment needs is derived from u inside the loop: with the row's
        # coordinates computed once outside, the BLOCK_H 64 variants spilled 300-550 B (sm_90).
        pid = tl.program_id(0)
        start = _first_unit(pid, QUERIES * HEAD_BLOCKS * TILES, PROGRAMS, WIDE)
        end = _first_unit(pid + 1, QUERIES * HEAD_BLOCKS * TILES, PROGRAMS, WIDE)
        u = start
        while u < end:
            r = u // TILES
            t0 = u - r * TILES
            t1 = tl.minimum(TILES, t0 + (end - u))
            query, hb = _row_coords(r, QUERIES, HEAD_BLOCKS, HEAD_MAJOR)
            _segment(q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0,
                     cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr, xcache_ptr,
                     xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
                     ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr, stride_ob,
                     stride_os, stride_oh, S_Q, H, TOPK, XTOPK, TILES, query, hb, t0, t1,
                     pid * 2 + (u != start).to(tl.int32), qk_scale, PAGE, XPAGE, IS_MODEL1,
                     KV_BF16, HAS_LEN, HAS_EXTRA, HAS_XLEN, HAS_SINK, HAS_MAX, DIRECT, BLOCK_H,
                     BLOCK_N, PREFETCH, INTERPRET)
            u += t1 - t0
    else:  # no integer division on the way to the first load
        # Inside a loop of one trip (S_Q >= 1), like the dealt case's: the compiler then
        # schedules the segment as it does there (sm_90 BLOCK_H 64 spill 168 -> 16 B).
        for _ in range(0, tl.minimum(S_Q, 1)):
            hb = tl.program_id(0)
            part = tl.program_id(1)
            query = tl.program_id(2)
            t0 = part * TILES_PER_SPLIT
            _segment(q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0,
                     cache_ntok, idx_ptr, stride_ib, stride_is, len_ptr, xcache_ptr,
                     xcache_stride0, xcache_ntok, xidx_ptr, stride_xb, stride_xs, xlen_ptr,
                     ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr, stride_ob,
                     stride_os, stride_oh, S_Q, H, TOPK, XTOPK, TILES, query, hb, t0,
                     tl.minimum(t0 + TILES_PER_SPLIT, TILES),
                     (query * HEAD_BLOCKS + hb) * SPLITS + part, qk_scale, PAGE, XPAGE,
                     IS_MODEL1, KV_BF16, HAS_LEN, HAS_EXTRA, HAS_XLEN, HAS_SINK, HAS_MAX,
                     DIRECT, BLOCK_H, BLOCK_N, PREFETCH, INTERPRET)


@triton.jit(do_not_specialize=["stride_ob", "stride_os", "stride_oh", "S_Q", "H", "QUERIES",
                               "HEAD_BLOCKS", "HEAD_MAJOR", "TILES", "SPLITS", "PROGRAMS"])
def _sparse_mla_combine_kernel(ows_ptr, lsews_ptr, mws_ptr, out_ptr, lse_ptr, sink_ptr, max_ptr,
                               stride_ob, stride_os, stride_oh, S_Q, H, QUERIES, HEAD_BLOCKS,
                               HEAD_MAJOR, TILES, SPLITS, PROGRAMS, HAS_SINK: tl.constexpr,
                               HAS_MAX: tl.constexpr,
                               DEALT: tl.constexpr, WIDE: tl.constexpr, BLOCK_H: tl.constexpr,
                               BLOCK_HC: tl.constexpr, BLOCK_DC: tl.constexpr,
                               PARTS: tl.constexpr, SKIP_EMPTY: tl.constexpr,
                               PDL: tl.constexpr, INTERPRET: tl.constexpr):
    """Merge the parts of a split row for BLOCK_HC heads x BLOCK_DC output dims of one query
    token (BLOCK_HC divides BLOCK_H), PARTS parts per step. Rows that no program split were
    written by the split kernel and are left alone. PDL: launched as the split kernel's
    programmatic dependent; waits for it to finish before reading the workspace."""
    pid_h = tl.program_id(0)
    d0 = tl.program_id(1) * BLOCK_DC
    query = tl.program_id(2)
    h0 = pid_h * BLOCK_HC
    hb = h0 // BLOCK_H
    if DEALT:
        units = QUERIES * HEAD_BLOCKS * TILES
        row = tl.where(HEAD_MAJOR != 0, hb * QUERIES + query, query * HEAD_BLOCKS + hb)
        first = _wide(row, WIDE) * TILES
        # The programs holding the row's first and last unit (inverse of _first_unit) ...
        p_first = (((first + 1) * PROGRAMS - 1) // units).to(tl.int32)
        p_last = (((first + TILES) * PROGRAMS - 1) // units).to(tl.int32)
        # ... and the slot of the first one's part: its last segment if it started earlier.
        started_before = _first_unit(p_first, units, PROGRAMS, WIDE) < first
        first_slot = 2 * p_first + started_before.to(tl.int32)
    else:
        p_first = (query * HEAD_BLOCKS + hb) * SPLITS
        p_last = p_first + SPLITS - 1
        first_slot = p_first
    p_end = tl.where(p_last > p_first, p_last + 1, p_first)  # empty: the row is not split
    heads = h0 + tl.arange(0, BLOCK_HC)
    hmask = heads < H
    in_block = heads - hb * BLOCK_H
    # One pass, an online merge, PARTS parts per step: their loads depend on no earlier part's
    # values, so they are all in flight at once (the two-pass loop this replaced, maxima first,
    # waited on the loads of one part after another: 7.5-8 of a single request's 16.4-16.9 us
    # on the H200). An empty part was written as o = 0, lse = -inf; SKIP_EMPTY does not read its o,
    # which saves bandwidth where ragged rows leave many empty parts but makes that load wait
    # on lse's (RESULTS.md, fifteenth session).
    m = tl.full((BLOCK_HC,), float("-inf"), dtype=tl.float32)
    m2 = m  # the row's largest logit (HAS_MAX)
    total = tl.zeros((BLOCK_HC,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_HC, BLOCK_DC), dtype=tl.float32)
    if PDL:
        tl.extra.cuda.gdc_wait()
    for p0 in range(p_first, p_end, PARTS):
        for j in tl.static_range(PARTS):
            p = p0 + j
            pmask = hmask & ((heads * 0 + p) < p_end)  # a vector (interpreter)
            part = _part_row(p, p_first, first_slot, DEALT, BLOCK_H) + in_block
            lse_p = tl.load(lsews_ptr + part, mask=pmask, other=float("-inf"))
            o_row = tl.multiple_of(ows_ptr + part * 512 + d0, 16)
            if SKIP_EMPTY:  # an empty part (no valid key) adds nothing: its bytes are not read
                pmask = pmask & (lse_p > float("-inf"))
            o = tl.load(o_row[:, None] + tl.arange(0, BLOCK_DC)[None, :], mask=pmask[:, None],
                        other=0.0)
            if HAS_MAX:
                m2 = tl.maximum(m2, tl.load(mws_ptr + part, mask=pmask, other=float("-inf")))
            m_new = tl.maximum(m, lse_p)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m - m_safe)
            w = tl.exp2(lse_p - m_safe)
            acc = acc * alpha[:, None] + w[:, None] * o
            total = total * alpha + w
            m = m_new
    gsafe = tl.where(m == float("-inf"), 0.0, m)
    lse2 = tl.where(total > 0.0, gsafe + tl.log2(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    acc = acc / tl.where(total > 0.0, total, 1.0)[:, None]
    split = (heads * 0 + p_end) > p_first  # a vector: the interpreter cannot `and` a scalar in
    _write_final(out_ptr, lse_ptr, sink_ptr, acc, lse2, heads, hmask & split, query, H, stride_ob,
                 stride_os, stride_oh, S_Q, d0, max_ptr, m2, HAS_SINK, HAS_MAX, INTERPRET)


@triton.jit
def _part_row(p, p_first, first_slot, DEALT: tl.constexpr, BLOCK_H: tl.constexpr):
    """First workspace row of program ``p``'s part (``first_slot``: the slot of p_first's)."""
    if DEALT:  # a later program's part is its first segment: slot 2p
        slot = tl.where(p == p_first, first_slot, 2 * p)
    else:
        slot = p
    return tl.cast(slot, tl.int64) * BLOCK_H


# ----------------------------------------------------------------------------------------------
# Launcher


# This runs on every decode call: message texts are lambdas, formatted only on failure.
def _check_cache(op, cache, name, d_qk, q):
    bpt = 584 if d_qk == 512 else 656
    checks.require_dtype(cache, (torch.uint8, torch.int8, torch.float8_e4m3fn), op, name)
    sh, st = cache.shape, cache.stride()
    checks.require(len(sh) == 4 and sh[2] == 1 and sh[3] == bpt, op, name,
                   lambda: f"shape {list(sh)}",
                   lambda: f"[num_blocks, page_block_size, 1, {bpt}] for d_qk {d_qk}")
    checks.require(st[1] == bpt and st[3] == 1, op, name, lambda: f"strides {tuple(st)}",
                   lambda: f"stride(1) == {bpt} (bytes_per_token), stride(3) == 1")
    checks.require(sh[0] <= 1 or st[0] >= sh[1] * bpt, op, name, lambda: f"stride(0) {st[0]}",
                   lambda: f">= page_block_size * {bpt}")
    # The kernel tells the compiler that rows start on 16-byte boundaries (vector loads).
    ptr = cache.data_ptr()
    checks.require(ptr % 16 == 0 and (sh[0] <= 1 or st[0] % 16 == 0), op, name,
                   lambda: f"data_ptr % 16 = {ptr % 16}, stride(0) {st[0]}",
                   "a 16-byte aligned start and stride(0) a multiple of 16 bytes")
    checks.require_same_device(op, q, **{name: cache})


def _check_indices(op, idx, name, b, s_q, q):
    checks.require_dtype(idx, (torch.int32,), op, name)
    sh = idx.shape
    checks.require(len(sh) == 3 and sh[0] == b and sh[1] == s_q and sh[2] > 0, op, name,
                   lambda: f"shape {list(sh)}", lambda: f"[{b}, {s_q}, topk > 0]")
    checks.require(idx.stride(2) == 1, op, name, lambda: f"strides {tuple(idx.stride())}",
                   "a contiguous last dimension")
    checks.require_same_device(op, q, **{name: idx})


def _check_length(op, t, name, b, q):
    if t is None:
        return
    checks.require_dtype(t, (torch.int32,), op, name)
    checks.require_shape(t, (b,), op, name)
    checks.require_same_device(op, q, **{name: t})


def validate(op, q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
             extra_topk_length, d_v):
    """Raise ValueError naming ``op`` and the argument for anything the kernel does not handle."""
    checks.require_dtype(q, (torch.bfloat16,), op, "q")
    checks.require(q.dim() == 4 and q.shape[-1] in (512, 576), op, "q",
                   lambda: f"shape {list(q.shape)}",
                   "[b, s_q, h_q, d_qk] with d_qk 512 (MODEL1) or 576 (V3.2)")
    checks.require(q.stride(-1) == 1, op, "q", lambda: f"strides {tuple(q.stride())}",
                   "a contiguous last dimension")
    checks.require(d_v == D_V, op, "head_dim_v", d_v, "512")
    b, s_q, h_q, d_qk = q.shape
    checks.require(b > 0 and s_q > 0 and h_q > 0, op, "q", lambda: f"shape {list(q.shape)}",
                   "non-empty b, s_q, h_q")
    _check_cache(op, k_cache, "k_cache", d_qk, q)
    if indices is None:
        raise checks.bad(op, "indices", None, "an int32 tensor [b, s_q, topk] (sparse decode)")
    _check_indices(op, indices, "indices", b, s_q, q)
    _check_length(op, topk_length, "topk_length", b, q)
    if attn_sink is not None:
        checks.require_dtype(attn_sink, (torch.float32,), op, "attn_sink")
        checks.require_shape(attn_sink, (h_q,), op, "attn_sink")
        checks.require_same_device(op, q, attn_sink=attn_sink)
    if (extra_k_cache is None) != (extra_indices is None):
        name = "extra_indices_in_kvcache" if extra_k_cache is not None else "extra_k_cache"
        raise checks.bad(op, name, None, "extra_k_cache and extra_indices_in_kvcache together")
    if extra_k_cache is not None:
        _check_cache(op, extra_k_cache, "extra_k_cache", d_qk, q)
        _check_indices(op, extra_indices, "extra_indices_in_kvcache", b, s_q, q)
        _check_length(op, extra_topk_length, "extra_topk_length", b, q)
    elif extra_topk_length is not None:
        raise checks.bad(op, "extra_topk_length", "a tensor without extra_k_cache",
                         "None unless extra_k_cache is given")


def _rows_aligned(t):
    """Every [..., d] row of a bf16 tensor starts on a 16-byte boundary."""
    return t.data_ptr() % 16 == 0 and all(st % 8 == 0 for st in t.stride()[:-1])


def _interpret():
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _byte_view(cache):
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def _ntok(cache):
    return min(cache.shape[0] * cache.shape[1], 2**31 - 1)


def _env_config():
    text = os.environ.get("SM12X_SPARSE_MLA_CONFIG", "").strip()
    if not text:
        return None
    cfg = {"num_stages": 1}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key.strip() not in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages", "PREFETCH"):
            raise ValueError(f"SM12X_SPARSE_MLA_CONFIG={text!r}: unknown key {key.strip()!r}")
        cfg[key.strip()] = int(value)
    return cfg


def pick_config(h_q, device, fmt="model1", queries=None, topk=0, extra_topk=0):
    """The launch configuration for ``h_q`` heads of cache format ``fmt`` ("model1" or "v32").
    Given ``queries`` (b * s_q) and the top-k sizes, a call whose head block cannot give half
    the SMs a program of PROGRAM_TOKENS candidates takes the smallest head block (more
    programs, each one cheaper). On the H200 a program costs about the same at BLOCK_H 32 as at
    64 (the gather and dequantisation dominate), so a middle step does not pay: b4 h64
    top-128+512 took 20.3 us at BLOCK_H 32 (80 programs), 16.9 at 64 (80); b1 h64 128+1024 16.1
    at BLOCK_H 16 (72), 17.3 at 64 (36). Counting 16-token tiles instead, the sm_120 configs
    kept BLOCK_H 64 for one request of h_q 64: 20.5 us against 14.2 at BLOCK_H 16 (H200;
    RESULTS.md, sixteenth session)."""
    forced = _env_config()
    if forced is not None:
        return forced
    options = sorted(configs.pick(CONFIGS, device)[fmt], key=lambda c: c["BLOCK_H"])
    cfg = next((c for c in options if c["BLOCK_H"] >= h_q), options[-1])
    if queries is None:
        return cfg
    sms = configs.sm_count(device)

    # every (query, head block, PROGRAM_TOKENS candidates) as its own program
    programs = queries * triton.cdiv(h_q, cfg["BLOCK_H"]) * (
        triton.cdiv(topk, PROGRAM_TOKENS) + triton.cdiv(extra_topk, PROGRAM_TOKENS))
    if 2 * programs < sms:
        cfg = options[0]
    return cfg


class Plan(NamedTuple):
    """A shapes-only launch plan. A row is one query token's head block; it has ``tiles``
    candidate tiles (units). Dealt (``dealt``): the units dealt out evenly to ``programs``
    programs, rows numbered query first or head block first (``head_major``); one row per
    program is the direct case. Else every row is cut into ``splits`` > 1 parts of
    ``tiles_per_split`` tiles, one program each."""
    cfg: dict
    head_blocks: int
    tiles: int
    splits: int
    tiles_per_split: int
    programs: int
    dealt: bool
    head_major: bool
    direct: bool        # no row is split between programs: no combine step
    # The combine step does not read empty parts: set for calls with per-request lengths (they
    # leave empty parts) whose programs fill the GPU, where the combine is bound by bandwidth; a
    # smaller combine is bound by latency and reads every part at once (RESULTS.md, 15th session).
    skip_empty: bool = False
    # The combine is launched as the split kernel's programmatic dependent (PDL) where its
    # programs fit beside the split kernel's (``_combine_fits_beside``) and the GPU and Triton
    # support it; SM12X_PDL=0 turns it off.
    pdl: bool = False


def plan(b, s_q, h_q, topk, extra_topk, device, num_splits=None, cfg=None, fmt="model1",
         ragged=False):
    """The launch plan of a call. ``num_splits`` forces every row into that many parts; by
    default the program count comes from a time model (``_best_program_count``; ``ragged``: the
    call has per-request top-k lengths). The sparse prefill's formats (``bf16_*``) always take the
    dealt-out form: their 576-dim config spills in the other one on sm_120 (compile check)."""
    if cfg is None:  # the common case, memoised: this runs on every decode call
        key = (b, s_q, h_q, topk, extra_topk, configs.arch_key(device), configs.sm_count(device),
               num_splits, fmt, ragged, os.environ.get("SM12X_SPARSE_MLA_CONFIG", ""))
        hit = _PLANS.get(key)
        if hit is None:
            hit = _PLANS[key] = _plan(b, s_q, h_q, topk, extra_topk, device, num_splits,
                                      pick_config(h_q, device, fmt, b * s_q, topk, extra_topk),
                                      ragged, fmt not in DECODE_FORMATS)
        return hit
    return _plan(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged,
                 fmt not in DECODE_FORMATS)


_PLANS: dict = {}


def _plan(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged, dealt_only=False):
    pl = _layout(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged, dealt_only)
    sms = configs.sm_count(device)
    return pl._replace(skip_empty=ragged and pl.programs >= sms,
                       pdl=_combine_fits_beside(pl, b * s_q, h_q, sms) and pdl_supported(device))


def _combine_fits_beside(pl, queries, h_q, sms):
    """The combine's programs, launched early (PDL), wait on the SMs the split kernel leaves idle
    and later run there: worth it only where the split kernel is one wave and they fit there,
    8 to an SM. On the H200 (RESULTS.md, sixteenth session) PDL saved 0.3-0.9 us per call where
    they fit and cost 1.2-1.4 us where 512 of them crowded onto 36-52 idle SMs."""
    groups, dims, tokens = _combine_grid(h_q, queries)
    return not pl.direct and groups * dims * tokens <= 8 * (sms - pl.programs)


def _combine_grid(h_q, queries):
    """The combine kernel's grid: (head groups of BLOCK_HC, output-dim blocks, query tokens)."""
    return (triton.cdiv(h_q, COMBINE_CONFIG["BLOCK_HC"]), D_V // COMBINE_CONFIG["BLOCK_DC"],
            queries)


def pdl_supported(device):
    """Programmatic dependent launch is possible: a CUDA GPU of compute capability >= 9.0, a
    Triton with ``launch_pdl`` and ``gdc_wait``, and SM12X_PDL is not 0."""
    if getattr(device, "type", "cpu") != "cuda" or torch.version.hip is not None:
        return False
    if os.environ.get("SM12X_PDL", "1").strip() == "0":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _pdl_supported(index)


@functools.lru_cache(maxsize=None)
def _pdl_supported(index):
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        has_option = "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}
        gdc = all(hasattr(tl.extra.cuda, n) for n in ("gdc_wait", "gdc_launch_dependents"))
    except Exception:  # another Triton layout: no PDL
        return False
    return has_option and gdc and torch.cuda.get_device_capability(index)[0] >= 9


def _layout(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged, dealt_only):
    bn, bh = cfg["BLOCK_N"], cfg["BLOCK_H"]
    tiles = triton.cdiv(topk, bn) + triton.cdiv(extra_topk, bn)
    head_blocks = triton.cdiv(h_q, bh)
    rows = b * s_q * head_blocks
    if num_splits is None:
        programs, head_major = _best_program_count(rows, tiles, configs.sm_count(device),
                                                   bh * D_V * 4 * 2, head_blocks, ragged)
    else:
        programs, head_major = rows * max(1, min(int(num_splits), tiles)), False
    if head_major or programs % rows or programs == rows or dealt_only:  # (one row each: direct)
        return Plan(cfg, head_blocks, tiles, 1, tiles, programs, True, head_major,
                    split_rows(rows, tiles, programs)[0] == 0)
    tiles_per_split = triton.cdiv(tiles, programs // rows)
    splits = triton.cdiv(tiles, tiles_per_split)  # no empty parts
    if splits == 1:
        return Plan(cfg, head_blocks, tiles, 1, tiles, rows, True, False, True)
    return Plan(cfg, head_blocks, tiles, splits, tiles_per_split, rows * splits, False, False,
                False)


def split_rows(rows, tiles, programs):
    """(rows cut between programs, row parts the programs write to the workspace)."""
    if programs % rows == 0:  # every row cut into k equal parts
        k = programs // rows
        return (rows, programs) if k > 1 else (0, 0)
    units = rows * tiles
    cuts = {p * units // programs for p in range(1, programs)}
    split = {c // tiles for c in cuts if c % tiles}
    parts = 0
    for r in split:  # a split row has one part per program that touches it
        first, last = r * tiles, r * tiles + tiles - 1
        parts += ((last + 1) * programs - 1) // units - ((first + 1) * programs - 1) // units + 1
    return len(split), parts


# The cost model, in units of one program's time for one tile. Measured on the H200
# (2026-12-02): a BLOCK_H 64 x BLOCK_N 64 tile step takes ~6.5 us per SM; splitting batch 64 in
# two adds ~17 us for 67 MB of partial outputs (written and read once): ~32 MB per tile step.
COMBINE_STEPS = 0.5
BYTES_PER_STEP = 32e6


def _best_program_count(rows, tiles, sms, part_bytes, head_blocks=1, ragged=False):
    """-> (program count, head_major) with the least modelled time: (waves of programs over the
    SMs) x (most tiles per program), plus the combine step and the traffic of the parts it
    merges (``part_bytes`` each, written and read) when a row is split. One program per SM runs
    at a time (the big head blocks fill an SM).
    Candidates: every row cut into k equal parts (query-major: the head blocks of a query token
    run side by side and share its rows in L2), and, unless ``ragged``, one to four programs per
    SM with the units dealt out evenly, rows cut anywhere (head-major with a multiple of
    ``head_blocks`` programs, so that the programs at the same place in each head block's share
    also run side by side). Ragged calls (per-request lengths) keep one program per row part:
    the hardware then balances the uneven rows, which dealt-out units cannot."""
    units = rows * tiles
    candidates = {(rows * k, False) for k in range(1, tiles + 1)}
    if not ragged:
        for w in range(1, 5):
            programs = sms * w // head_blocks * head_blocks
            if head_blocks <= programs <= units and programs % rows:
                candidates.add((programs, True))
    best, best_cost = (rows, False), triton.cdiv(rows, sms) * tiles
    for programs, head_major in sorted(candidates):
        n_split, parts = split_rows(rows, tiles, programs)
        cost = triton.cdiv(programs, sms) * triton.cdiv(units, programs)
        if n_split:
            cost += COMBINE_STEPS + parts * part_bytes / BYTES_PER_STEP
        if cost < 0.95 * best_cost:  # another count must win clearly: the model is rough
            best, best_cost = (programs, head_major), cost
    return best


def sparse_mla_decode(q, k_cache, indices, topk_length=None, attn_sink=None, extra_k_cache=None,
                      extra_indices=None, extra_topk_length=None, softmax_scale=None, d_v=D_V,
                      num_splits=None, out=None, lse=None, op=OP, validate_inputs=True):
    """FlashMLA sparse decode. q bf16 [b, s_q, h_q, 512 | 576]; caches uint8/int8/fp8 views
    [num_blocks, page, 1, 584 | 656]; indices int32 [b, s_q, topk] (-1 = invalid);
    topk_length / extra_topk_length int32 [b]; attn_sink fp32 [h_q].
    -> (out bf16 [b, s_q, h_q, 512], lse fp32 [b, h_q, s_q], a transposed view of [b, s_q, h_q]).
    ``num_splits`` cuts every row into that many parts (default: ``plan`` from shapes and SMs)."""
    if validate_inputs:
        validate(op, q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
                 extra_topk_length, d_v)
    b, s_q, h_q, d_qk = q.shape
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    topk = indices.shape[-1]
    has_extra = extra_k_cache is not None
    xtopk = extra_indices.shape[-1] if has_extra else 0
    fmt = "model1" if d_qk == 512 else "v32"
    ragged = topk_length is not None or (has_extra and extra_topk_length is not None)
    pl = plan(b, s_q, h_q, topk, xtopk, q.device, num_splits, fmt=fmt, ragged=ragged)
    if not _rows_aligned(q):
        q = q.clone(memory_format=torch.contiguous_format)
    if out is None:
        out = torch.empty((b, s_q, h_q, D_V), dtype=torch.bfloat16, device=q.device)
    checks.require(out.shape == (b, s_q, h_q, D_V) and out.dtype == torch.bfloat16
                   and out.stride(3) == 1 and _rows_aligned(out), op, "out",
                   f"{out.dtype} {list(out.shape)} strides {tuple(out.stride())}",
                   f"bf16 [{b}, {s_q}, {h_q}, 512], 16-byte aligned rows")
    if lse is None:
        lse = torch.empty((b, s_q, h_q), dtype=torch.float32, device=q.device)
    checks.require(lse.shape == (b, s_q, h_q) and lse.dtype == torch.float32
                   and lse.is_contiguous(), op, "lse", f"{lse.dtype} {list(lse.shape)}",
                   f"contiguous fp32 [{b}, {s_q}, {h_q}]")
    launch(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
           extra_topk_length, softmax_scale, pl, out, lse)
    return out, lse.transpose(1, 2)


def launch(q, k_cache, indices, topk_length, attn_sink, extra_k_cache, extra_indices,
           extra_topk_length, softmax_scale, pl, out, lse, max_logits=None, kv_bf16=False):
    """Run plan ``pl`` on checked inputs: q [b, s_q, h_q, d_qk] with 16-byte aligned rows, out
    [b, s_q, h_q, 512], lse contiguous [b, s_q, h_q]. ``kv_bf16``: ``k_cache`` is bf16 rows
    [s_kv, 1, d_qk] (sparse prefill) instead of an FP8 cache; ``max_logits`` (shaped like lse)
    receives each row's largest scaled logit."""
    b, s_q, h_q, d_qk = q.shape
    cfg, head_blocks, tiles, programs = pl.cfg, pl.head_blocks, pl.tiles, pl.programs
    direct = pl.direct
    topk = indices.shape[-1]
    has_extra = extra_k_cache is not None
    xtopk = extra_indices.shape[-1] if has_extra else 0
    wide = b * s_q * head_blocks * tiles * (programs + 1) >= WIDE_PRODUCT
    has_max = max_logits is not None
    if direct:
        ows = lsews = mws = lse  # unused
    else:  # a dealt-out program leaves up to two parts (its first and last row segments)
        slots = programs * (2 if pl.dealt else 1)
        ows = torch.empty((slots, cfg["BLOCK_H"], D_V), dtype=torch.float32, device=q.device)
        lsews = torch.empty((slots, cfg["BLOCK_H"]), dtype=torch.float32, device=q.device)
        mws = torch.empty_like(lsews) if has_max else lsews
    # [b] / [h_q] vectors: the kernel indexes them densely (a no-op unless strided).
    topk_length = topk_length.contiguous() if topk_length is not None else None
    extra_topk_length = extra_topk_length.contiguous() if extra_topk_length is not None else None
    attn_sink = attn_sink.contiguous() if attn_sink is not None else None
    cache = _byte_view(k_cache)
    xcache = _byte_view(extra_k_cache) if has_extra else cache
    xidx = extra_indices if has_extra else indices
    sink = attn_sink if attn_sink is not None else lse
    max_logits = max_logits if has_max else lse
    dummy_len = indices
    grid = (programs,) if pl.dealt else (head_blocks, pl.splits, b * s_q)
    _sparse_mla_split_kernel[grid](
        q, q.stride(0), q.stride(1), q.stride(2),
        cache, cache.stride(0), _ntok(cache), indices, indices.stride(0), indices.stride(1),
        topk_length if topk_length is not None else dummy_len,
        xcache, xcache.stride(0), _ntok(xcache), xidx, xidx.stride(0), xidx.stride(1),
        extra_topk_length if extra_topk_length is not None else dummy_len,
        ows, lsews, mws, out, lse, sink, max_logits, out.stride(0), out.stride(1), out.stride(2),
        s_q, h_q, topk, xtopk, b * s_q, head_blocks, int(pl.head_major), tiles, pl.splits,
        pl.tiles_per_split, programs, float(softmax_scale) * LOG2E,
        PAGE=k_cache.shape[1], XPAGE=xcache.shape[1], IS_MODEL1=d_qk == 512, KV_BF16=kv_bf16,
        HAS_LEN=topk_length is not None, HAS_EXTRA=has_extra,
        HAS_XLEN=has_extra and extra_topk_length is not None, HAS_SINK=attn_sink is not None,
        HAS_MAX=has_max, DIRECT=direct, DEALT=pl.dealt, WIDE=wide,
        BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"], PREFETCH=cfg.get("PREFETCH", 1),
        PDL=pl.pdl, INTERPRET=_interpret(),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if not direct:
        bhc, bdc = COMBINE_CONFIG["BLOCK_HC"], COMBINE_CONFIG["BLOCK_DC"]
        _sparse_mla_combine_kernel[_combine_grid(h_q, b * s_q)](
            ows, lsews, mws, out, lse, sink, max_logits, out.stride(0), out.stride(1),
            out.stride(2), s_q, h_q, b * s_q, head_blocks, int(pl.head_major), tiles, pl.splits,
            programs, HAS_SINK=attn_sink is not None, HAS_MAX=has_max, DEALT=pl.dealt, WIDE=wide,
            BLOCK_H=cfg["BLOCK_H"], BLOCK_HC=bhc, BLOCK_DC=bdc, INTERPRET=_interpret(),
            PARTS=COMBINE_CONFIG["DEALT_PARTS" if pl.dealt else "PARTS"], SKIP_EMPTY=pl.skip_empty,
            PDL=pl.pdl, num_warps=COMBINE_CONFIG["num_warps"],
            **({"launch_pdl": True} if pl.pdl else {}))  # older Tritons lack the option


# ----------------------------------------------------------------------------------------------
# Compile checks (no GPU needed)

_PAGE_VARIANTS = ((256, 64), (64, 2))  # (main, extra) page sizes of V4's CSA and HCA layers
# (HAS_LEN, HAS_EXTRA, HAS_XLEN): all inputs, main list only, extra list without its lengths
_INPUT_VARIANTS = ((True, True, True), (False, False, False), (False, True, False))


def _split_signature(cfg, is_model1, page, xpage, direct, dealt=False,
                     inputs=_INPUT_VARIANTS[0], prefill=False, pdl=False):
    sig = {n: "*u8" for n in ("cache_ptr", "xcache_ptr")}
    sig.update({n: "*i32" for n in ("idx_ptr", "len_ptr", "xidx_ptr", "xlen_ptr")})
    sig.update({"q_ptr": "*bf16", "ows_ptr": "*fp32", "lsews_ptr": "*fp32", "mws_ptr": "*fp32",
                "out_ptr": "*bf16", "lse_ptr": "*fp32", "sink_ptr": "*fp32", "max_ptr": "*fp32",
                "qk_scale": "fp32"})
    for n in ("stride_qb", "stride_qs", "stride_qh", "cache_ntok", "stride_ib", "stride_is",
              "xcache_ntok", "stride_xb", "stride_xs", "stride_ob", "stride_os", "stride_oh", "S_Q",
              "H", "TOPK", "XTOPK", "QUERIES", "HEAD_BLOCKS", "HEAD_MAJOR", "TILES", "SPLITS",
              "TILES_PER_SPLIT", "PROGRAMS"):
        sig[n] = "i32"
    sig["cache_stride0"] = sig["xcache_stride0"] = "i64"
    has_len, has_extra, has_xlen = inputs
    const = dict(PAGE=page, XPAGE=xpage, IS_MODEL1=is_model1, KV_BF16=prefill, HAS_LEN=has_len,
                 HAS_EXTRA=has_extra, HAS_XLEN=has_xlen, HAS_SINK=True, HAS_MAX=prefill,
                 DIRECT=direct,
                 DEALT=dealt, WIDE=False, BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"],
                 PREFETCH=cfg.get("PREFETCH", 1), PDL=pdl, INTERPRET=False)
    for k in const:
        sig[k] = "constexpr"
    names = _sparse_mla_split_kernel.arg_names
    return {n: sig[n] for n in names}, const


def compile_reports(targets=("sm_120", "sm_121"), full=False):
    """Compile every configuration of both kernels for ``targets`` -> list of CompileReport, with
    the V4 CSA page sizes and every optional input, and the sparse prefill's variants; ``full``:
    also the HCA page sizes and the calls without per-request lengths or without the extra list.
    Kernels that leave parts to the combine are built with the PDL trigger (how the small
    calls run them), and also without it when ``full``; the combine both ways.
    Under the Triton interpreter the kernels cannot be compiled in-process, so this re-runs
    itself in a subprocess without TRITON_INTERPRET."""
    from sm12x.kernels.common.compile_check import CompileReport

    if _interpret():
        import json
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))  # the repository root
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        code = ("import dataclasses, json; from sm12x.kernels.sparse_mla.decode import "
                f"compile_reports as c; print(json.dumps([dataclasses.asdict(r) for r in "
                f"c({tuple(targets)!r}, {full!r})]))")
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True)
        return [CompileReport(**d) for d in json.loads(res.stdout.strip().splitlines()[-1])]

    jobs = []
    for target in targets:
        key = target if target in CONFIGS else "sm_120"
        for fmt, options in CONFIGS[key].items():
            for cfg in options:
                if fmt not in DECODE_FORMATS:
                    # sparse prefill (sparse_mla_prefill): bf16 rows, with and without
                    # per-query lengths
                    for has_len in (True, False):
                        for direct in (False, True):  # always dealt out (``plan``)
                            for pdl in _pdl_variants(direct, full):
                                jobs.append(("prefill", target, fmt, cfg,
                                             (has_len, direct, True, pdl)))
                    continue
                for pages in (_PAGE_VARIANTS if full else _PAGE_VARIANTS[:1]):
                    for inputs in (_INPUT_VARIANTS if full else _INPUT_VARIANTS[:1]):
                        for direct, dealt in ((False, False), (False, True), (True, True)):
                            for pdl in _pdl_variants(direct, full):
                                jobs.append(("split", target, fmt, cfg,
                                             (direct, dealt, pages, inputs, pdl)))
        for block_h in sorted({c["BLOCK_H"] for opts in CONFIGS[key].values() for c in opts}):
            for dealt in (False, True):
                for has_max in (False, True):  # decode / sparse prefill
                    for skip in (False, True):
                        for pdl in (False, True):
                            jobs.append(("combine", target, None, COMBINE_CONFIG,
                                         (block_h, dealt, has_max, skip, pdl)))
    if len(jobs) > 2 and (os.cpu_count() or 1) > 1:
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(
                min(os.cpu_count(), 8), mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_compile_job, jobs))
    return [_compile_job(job) for job in jobs]


def _pdl_variants(direct, full):
    """PDL values to compile a split-kernel variant with (a direct call has no combine)."""
    return (False,) if direct else ((False, True) if full else (True,))


def _compile_job(job):
    from sm12x.kernels.common.compile_check import compile_kernel

    kind, target, fmt, cfg, variant = job
    if kind == "prefill":
        has_len, direct, dealt, pdl = variant
        sig, const = _split_signature(cfg, fmt == "bf16_512", 1, 1, direct, dealt,
                                      (has_len, False, False), prefill=True, pdl=pdl)
        name = (f"prefill {fmt} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}"
                f"{' L' if has_len else ''}{' direct' if direct else ''}"
                f"{' dealt' if dealt else ''}{' pdl' if pdl else ''}")
        return compile_kernel(_sparse_mla_split_kernel, sig, const, target=target,
                              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                              config_name=name)
    if kind == "split":
        direct, dealt, (page, xpage), inputs, pdl = variant
        sig, const = _split_signature(cfg, fmt == "model1", page, xpage, direct, dealt, inputs,
                                      pdl=pdl)
        flags = "".join(f for f, on in zip(("L", "X", "XL"), inputs) if on)
        name = (f"{fmt} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']} p{page}/{xpage}"
                f" {flags or '-'}{' direct' if direct else ''}{' dealt' if dealt else ''}"
                f"{' pdl' if pdl else ''}")
        return compile_kernel(_sparse_mla_split_kernel, sig, const, target=target,
                              num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                              config_name=name)
    sig = {"ows_ptr": "*fp32", "lsews_ptr": "*fp32", "mws_ptr": "*fp32", "out_ptr": "*bf16",
           "lse_ptr": "*fp32", "sink_ptr": "*fp32", "max_ptr": "*fp32", "stride_ob": "i32",
           "stride_os": "i32", "stride_oh": "i32",
           "S_Q": "i32", "H": "i32", "QUERIES": "i32", "HEAD_BLOCKS": "i32", "HEAD_MAJOR": "i32",
           "TILES": "i32", "SPLITS": "i32", "PROGRAMS": "i32", "HAS_SINK": "constexpr",
           "HAS_MAX": "constexpr", "DEALT": "constexpr", "WIDE": "constexpr",
           "BLOCK_H": "constexpr",
           "BLOCK_HC": "constexpr", "BLOCK_DC": "constexpr", "PARTS": "constexpr",
           "SKIP_EMPTY": "constexpr", "PDL": "constexpr", "INTERPRET": "constexpr"}
    block_h, dealt, has_max, skip, pdl = variant
    const = {"HAS_SINK": True, "HAS_MAX": has_max, "DEALT": dealt, "WIDE": False,
             "BLOCK_H": block_h, "BLOCK_HC": cfg["BLOCK_HC"], "BLOCK_DC": cfg["BLOCK_DC"],
             "PARTS": cfg["DEALT_PARTS" if dealt else "PARTS"], "SKIP_EMPTY": skip, "PDL": pdl,
             "INTERPRET": False}
    return compile_kernel(_sparse_mla_combine_kernel, sig, const, target=target,
                          num_warps=cfg["num_warps"], num_stages=1,
                          config_name=f"H{block_h} HC{cfg['BLOCK_HC']} DC{cfg['BLOCK_DC']} "
                                      f"P{const['PARTS']}{' dealt' if dealt else ''}"
                                      f"{' max' if has_max else ''}{' skip' if skip else ''}"
                                      f"{' pdl' if pdl else ''}")


if __name__ == "__main__":
    from sm12x.kernels.common.compile_check import format_reports

    print(format_reports(compile_reports(("sm_120", "sm_121", "sm_90"))))

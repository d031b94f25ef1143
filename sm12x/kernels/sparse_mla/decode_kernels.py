"""The sparse MLA decode's Triton kernels: the split kernel (each program attends its range of
units: gather a tile of cache rows, dequantise, QK^T and PV with an online base-2 softmax, write a
whole row or a part of one) and the combine kernel that merges a row's parts. The launcher, the
validation and the plan are in :mod:`decode` and :mod:`decode_plan`; ``decode``'s module
docstring describes the work split."""
from __future__ import annotations

import triton
import triton.language as tl

from sm12x.kernels.common.rounding import round_bf16
from sm12x.kernels.sparse_mla.online_softmax import online_softmax_step

# KV_FMT / XKV_FMT: the declared format of a cache (``kv_cache.V41_FORMATS``), 0 for the formats
# told apart by d_qk (V4 584 B, V3.2 656 B) and the sparse prefill's bf16 rows
FMT_V41 = tl.constexpr(1)               # 528 B, interleaved (FlashMLA 2026.09.30 and later)
FMT_V41_BLOCK_SPLIT = tl.constexpr(2)   # 528 B, B data rows then B scale rows per page
FMT_V41_FP4 = tl.constexpr(3)           # 288 B, interleaved
FMT_V41_FP4_BLOCK_SPLIT = tl.constexpr(4)


@triton.jit
def _e2m1_value(c):
    """4-bit e2m1 codes (int32; bit 3 the sign) -> float32 values, through the e4m3 of the same
    value (integer operations only: every e2m1 value is exact in e4m3)."""
    mag = c & 7  # 0, 0.5, 1, 1.5, 2, 3, 4, 6 -> e4m3 0x00, 0x30, then 0x30 + 4 * mag from 1.0 on
    bits = tl.where(mag >= 2, 0x30 + 4 * mag, mag * 0x30) | ((c & 8) << 4)
    return bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@triton.jit
def _gather_tile(cache_ptr, stride0, ntok, idx, in_len, PAGE: tl.constexpr,
                 IS_MODEL1: tl.constexpr, KV_BF16: tl.constexpr, FMT: tl.constexpr = 0):
    """Issue the loads of one tile of candidates (cache indices ``idx``, ``in_len``: within the
    list's length) -> (raw, scale, rope, valid).
    MODEL1: raw fp8 bytes [BLOCK_N, 8, 64] (chunk 7 is the RoPE slot, not loaded), UE8M0 bytes
    [BLOCK_N, 8], RoPE bf16 [BLOCK_N, 8, 64] holding chunk 7 only (it drops into k with a select;
    a 2-D load broadcast into k measured slower and spilled).
    V3.2: raw [BLOCK_N, 4, 128], fp32 scales [BLOCK_N, 4], RoPE bf16 [BLOCK_N, 64].
    KV_BF16 (sparse prefill, PAGE 1, rows of stride0 bytes): raw = k bf16 [BLOCK_N, 512], RoPE
    bf16 [BLOCK_N, 64] (dims 512..575; zeros when IS_MODEL1, i.e. d_qk 512), no scales.
    V4.1 (``FMT`` 1 / 2; d_qk 512): raw fp8 bytes [BLOCK_N, 8, 64], UE8M0 scales int16
    [BLOCK_N, 8] (each 64-value chunk's two bytes).
    V4.1 FP4 (``FMT`` 3 / 4): raw bytes [BLOCK_N, 8, 64] (value d of chunk c: byte 32 c + d // 2),
    e4m3 scales int32 [BLOCK_N, 8] (each chunk's four bytes). Neither has a RoPE part (``rope`` is a placeholder)."""
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
    elif FMT == FMT_V41 or FMT == FMT_V41_BLOCK_SPLIT:
        # the tile has MODEL1's shape ([BLOCK_N, 8, 64]: the sm_120 configs are tuned on it) with
        # two UE8M0 scales per 64-value chunk
        if FMT == FMT_V41:
            row = tl.multiple_of(cache_ptr + (page_base + off * 528), 16)
            sc_row = tl.multiple_of(row + 512, 16)
        else:
            row = tl.multiple_of(cache_ptr + (page_base + off * 512), 16)
            sc_row = tl.multiple_of(cache_ptr + (page_base + PAGE * 512 + off * 16), 16)
        c = tl.arange(0, 8)
        raw = tl.load(row[:, None, None] + (c * 64)[None, :, None] + tl.arange(0, 64)[None, None, :],
                      mask=valid[:, None, None], other=0)
        # chunk c's two scale bytes as one 16-bit word (little-endian: byte k is group 2c + k)
        scale = tl.load(sc_row.to(tl.pointer_type(tl.int16))[:, None] + c[None, :], mask=valid[:, None],
                        other=0x7F7F)
        rope = valid
    elif FMT == FMT_V41_FP4 or FMT == FMT_V41_FP4_BLOCK_SPLIT:
        # [BLOCK_N, 8, 64] values: value d of chunk c sits in byte 32 c + d // 2 (the even one
        # in the low nibble), each byte loaded twice (from L1) rather than split with join /
        # reshape (which takes the tile through shared memory); four e4m3 scales per chunk
        if FMT == FMT_V41_FP4:
            row = tl.multiple_of(cache_ptr + (page_base + off * 288), 16)
            sc_row = tl.multiple_of(row + 256, 16)
        else:
            row = tl.multiple_of(cache_ptr + (page_base + off * 256), 16)
            sc_row = tl.multiple_of(cache_ptr + (page_base + PAGE * 256 + off * 32), 16)
        c = tl.arange(0, 8)
        raw = tl.load(row[:, None, None] + (c * 32)[None, :, None] + (tl.arange(0, 64) // 2)[None, None, :],
                      mask=valid[:, None, None], other=0)
        # chunk c's four scale bytes as one 32-bit word (byte k is group 4c + k)
        scale = tl.load(sc_row.to(tl.pointer_type(tl.int32))[:, None] + c[None, :], mask=valid[:, None],
                        other=0)
        rope = valid
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
                  BLOCK_N: tl.constexpr, FMT: tl.constexpr = 0):
    """Gathered bytes -> k bf16 [BLOCK_N, 512] (exact: the scales are powers of two; an e2m1
    value times an e4m3 scale has at most 5 significant bits). For MODEL1 the RoPE part is the
    last 64 dims of k; V3.2 keeps it apart (``rope``, used as is)."""
    if KV_BF16:
        return raw
    elif FMT == FMT_V41 or FMT == FMT_V41_BLOCK_SPLIT:
        shift = (8 * (tl.arange(0, 64) // 32))[None, None, :]
        sb = (scale.to(tl.int32)[:, :, None] >> shift) & 0xFF
        e = (sb << 23).to(tl.float32, bitcast=True)   # UE8M0 -> 2^(e - 127)
        v = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * e
        return tl.reshape(v.to(tl.bfloat16), (BLOCK_N, 512))
    elif FMT == FMT_V41_FP4 or FMT == FMT_V41_FP4_BLOCK_SPLIT:
        d = tl.arange(0, 64)[None, None, :]
        v = _e2m1_value((raw.to(tl.int32) >> (4 * (d % 2))) & 15)  # odd values: the high nibble
        sb = (scale[:, :, None] >> (8 * (d // 16))) & 0xFF
        s = sb.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return tl.reshape((v * s).to(tl.bfloat16), (BLOCK_N, 512))
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
    p, alpha, m_new, l_i = online_softmax_step(s, valid, qk_scale, m_i, l_i)
    acc = _dot(_to_bf16(p, INTERPRET), k, acc * alpha[:, None], INTERPRET)
    return acc, m_new, l_i


@triton.jit
def _scan_list(acc, m_i, l_i, q, q_rope, cache_ptr, stride0, ntok, idx_row, length, t_lo, t_hi,
               qk_scale, one, PAGE: tl.constexpr, IS_MODEL1: tl.constexpr, KV_BF16: tl.constexpr,
               BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, INTERPRET: tl.constexpr,
               FMT: tl.constexpr = 0):
    """Attend to tiles [t_lo, t_hi) of one candidate list (tile t = positions
    [t * BLOCK_N, (t + 1) * BLOCK_N), masked at ``length``) -> updated (acc, m_i, l_i).
    PREFETCH 1: each tile's indices are loaded one step ahead, so a step waits for one global
    round trip (the rows) instead of two. PREFETCH 2: the rows too (costs registers)."""
    ar = tl.arange(0, BLOCK_N)
    pos = t_lo * BLOCK_N + ar
    idx = tl.load(idx_row + pos, mask=pos < tl.where(t_lo < t_hi, length, 0), other=-1)
    if PREFETCH == 2:
        raw, scale, rope, valid = _gather_tile(cache_ptr, stride0, ntok, idx, pos < length, PAGE,
                                               IS_MODEL1, KV_BF16, FMT)
        pos = pos + BLOCK_N
        idx = tl.load(idx_row + pos, mask=pos < tl.where(t_lo + 1 < t_hi, length, 0), other=-1)
    for t in range(t_lo, t_hi):
        if PREFETCH == 2:
            k = _dequant_tile(raw, scale, rope, IS_MODEL1, KV_BF16, BLOCK_N, FMT)
            k_rope = rope
            k_valid = valid
            pos = (t + 1) * BLOCK_N + ar
            raw, scale, rope, valid = _gather_tile(cache_ptr, stride0, ntok, idx,
                                                   pos < tl.where(t + 1 < t_hi, length, 0), PAGE,
                                                   IS_MODEL1, KV_BF16, FMT)
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
                                                       pos < length, PAGE, IS_MODEL1, KV_BF16, FMT)
            k = _dequant_tile(raw, scale, k_rope, IS_MODEL1, KV_BF16, BLOCK_N, FMT)
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
                PREFETCH: tl.constexpr, INTERPRET: tl.constexpr, KV_FMT: tl.constexpr = 0,
                XKV_FMT: tl.constexpr = 0):
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
                               INTERPRET, KV_FMT)
    if HAS_EXTRA:
        xlength = XTOPK
        if HAS_XLEN:
            xlength = tl.minimum(tl.load(xlen_ptr + b), XTOPK)
        xidx_row = xidx_ptr + b.to(tl.int64) * stride_xb + s * stride_xs
        acc, m_i, l_i = _scan_list(acc, m_i, l_i, q, q_rope, xcache_ptr, xcache_stride0,
                                   xcache_ntok, xidx_row, xlength, tl.maximum(lo - n_main, 0),
                                   tl.minimum(hi - n_main, tl.cdiv(xlength, BLOCK_N)), qk_scale,
                                   one, XPAGE, IS_MODEL1, KV_BF16, BLOCK_N, PREFETCH, INTERPRET,
                                   XKV_FMT)

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
             PREFETCH: tl.constexpr, INTERPRET: tl.constexpr, KV_FMT: tl.constexpr = 0,
             XKV_FMT: tl.constexpr = 0):
    """Tiles [t0, t1) of row (query, hb): written out when that is the whole row, else left in
    workspace ``slot`` for the combine kernel (with HAS_MAX, the part's largest logits too)."""
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    acc, lse2, m2 = _attend_row(
        q_ptr, stride_qb, stride_qs, stride_qh, cache_ptr, cache_stride0, cache_ntok,
        idx_ptr, stride_ib, stride_is, len_ptr, xcache_ptr, xcache_stride0, xcache_ntok,
        xidx_ptr, stride_xb, stride_xs, xlen_ptr, query // S_Q, query % S_Q, heads, hmask,
        S_Q, TOPK, XTOPK, t0, t1, qk_scale, PAGE, XPAGE, IS_MODEL1, KV_BF16, HAS_LEN,
        HAS_EXTRA, HAS_XLEN, BLOCK_H, BLOCK_N, PREFETCH, INTERPRET, KV_FMT, XKV_FMT)
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
        BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr, PDL: tl.constexpr, INTERPRET: tl.constexpr,
        KV_FMT: tl.constexpr = 0, XKV_FMT: tl.constexpr = 0):
    """A row is (query token, head block); a unit, one tile of a row (TILES per row).
    DEALT (grid (PROGRAMS,)): program p takes units [_first_unit(p), _first_unit(p + 1)) of the
    rows in ``_row_coords`` order, row segment by row segment; a part of a row goes to workspace
    slot 2p (the program's first segment) or 2p + 1 (its last). Else (grid (HEAD_BLOCKS,
    SPLITS, QUERIES)): program (hb, k, query) takes tiles [k * TILES_PER_SPLIT, ...) of one row
    (slot: its program number). DIRECT: no row is split. WIDE: see ``_wide``.
    IS_MODEL1: d_qk 512 (RoPE inside the 512 dims), else 576 (a separate RoPE dot). KV_BF16:
    the sparse prefill's bf16 rows instead of an FP8 cache. HAS_MAX: also write the largest
    logit of each row to ``max_ptr`` (a split row's parts leave theirs in ``mws_ptr``).
    KV_FMT / XKV_FMT: the main / extra cache's declared V4.1 format (0: by IS_MODEL1).
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
                     BLOCK_N, PREFETCH, INTERPRET, KV_FMT, XKV_FMT)
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
                     DIRECT, BLOCK_H, BLOCK_N, PREFETCH, INTERPRET, KV_FMT, XKV_FMT)


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
    # on lse's.
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

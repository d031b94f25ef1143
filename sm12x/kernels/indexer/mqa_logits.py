"""Prefill lightning-indexer logits (DeepGEMM ``fp8_mqa_logits`` / ``fp8_fp4_mqa_logits``) in Triton.

Contract: q [S, H, D] float8_e4m3fn (or FP4: int8 [S, H, D/2] + int32 ue8m0 [S, H]), k [S_kv, D]
float8_e4m3fn + float32 k_scale [S_kv] (or FP4: int8 [S_kv, D/2] + int32 [S_kv]), weights [S, H]
float32/bf16, ks/ke [S] int32. Returns

    logits[i, j] = sum_h weights[i, h] * relu(q[i, h] . k[j] * k_scale[j])   for ks[i] <= j < ke[i]

as [S, S_kv] (float32 or bf16), -inf elsewhere when ``clean_logits`` (undefined otherwise). With
``max_seqlen_k > 0`` the output is compressed: [S, max_seqlen_k] with logits[i, j - ks[i]]
(columns >= ke[i]-ks[i] undefined). Like DeepGEMM the result is a view of a buffer whose rows are
padded to a 1024-byte aligned stride (and the row count to a multiple of 128/H).

Tiling: one program owns BLOCK_Q queries x all H heads (a [BLOCK_Q*H, D] q tile, 128 rows) and a
chunk of N_ITERS*BLOCK_N keys; q.k^T is one tl.dot per key tile (fp8 operands; FP4 with
``fp4_mma``, as configured, is one ``tl.dot_scaled`` of the packed e2m1 tiles with their ue8m0
group scales, a block-scaled MMA in sm_120 hardware; without it FP4 is decoded to e4m3, which
holds every e2m1 value exactly, and done as one K=32 dot per group). With ``key_rows`` the dot is
k.q^T, keys on the MMA's M side, so the weighted sum over heads runs inside each warp, and the per-key scale
is applied once after that sum (relu(x * s) = s * relu(x) for the non-negative FP8 scales).
With ``head_mma`` (FP8, keys on M; the sm_90 config) that weighted sum is a second MMA: each
relu(q_h . k) is rounded to bf16 first, so a logit may differ from the float32 sum by up to 2**-8
of sum_h |w_h| relu(q_h . k) k_scale (DeepGEMM's calc_diff stays ~1e-6; top-k picks can differ
only between keys that close).
Tiles no row of the block can see are skipped (only -inf is written when cleaning). All row
offsets are int64, so S x S_kv >= 2**31 is fine.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess
from sm12x.kernels.common.fp8_dot import fp8_dot, native_block_scaled
from sm12x.kernels.common.register_budget import launch_budget
from sm12x.kernels.common.rounding import round_bf16

OP = "fp8_mqa_logits"

# rows = BLOCK_Q * H queries-x-heads per program; keys per program = BLOCK_N * N_ITERS at most
# (``configs.fit_iters`` shortens the chunk when the grid would leave SMs idle).
# key_rows: keys on the MMA's M side, so the sum over heads stays inside each warp instead of
# crossing warps (the same reduction pattern applies to sm_120's mma.sync layout).
# head_mma: the weighted head sum as a bf16 MMA (``key_tile_scores``). sm_90 only: there the
# CUDA-core epilogue is the limit (the sm_90 prefill loop 467 -> 333 SASS instructions per tile). On
# sm_120 it halves the loop too (514 -> 247) but adds a quarter to the MMA work, and SM12x parts
# have far less MMA throughput per CUDA core; which wins there is not measurable here. The paged
# kernels keep it off (it does not pay there).
# Measurements behind these choices and the sm_90 configs: docs/performance.md, "Tuning provenance".
CONFIGS = {
    "sm_120": {
        # 4 warps: with 8 the bf16-output variant spills 16 B. maxnreg: left to itself ptxas keeps
        # some variants (H16 D64 clean) at 128 registers and spills 8 B; with 192 they take 140-188
        # (triton 3.9; where another Triton's ptxas spills under 192, ``register_budget`` moves on).
        # fp8_mx: the q.k dots through tl.dot_scaled with unit scales (bit-identical to tl.dot, the
        # full-rate QMMA.SF where the plain FP8 QMMA with float32 accumulation runs at half rate).
        "fp8": {"key_rows": True, "rows": 128, "BLOCK_N": 64, "N_ITERS": 64, "num_warps": 4,
                "num_stages": 2, "maxnreg": 192, "fp8_mx": True},
        # FP4: one block-scaled e2m1 MMA per key tile (tl.dot_scaled; sm_120 has it in hardware).
        # maxnreg as for FP8 (H8 D128 bf16 clean spills 8 B without it).
        "fp4": {"fp4_mma": True, "key_rows": True, "rows": 128, "BLOCK_N": 64, "N_ITERS": 64, "num_warps": 4,
                "num_stages": 2, "maxnreg": 192},
    },
    "sm_90": {
        # Many key tiles per program amortise the program's set-up (q tile, first loads); 128
        # still gain a little over 64 on long key ranges. head_mma with BLOCK_N 64 and 4 queries
        # (256 rows) per program.
        "fp8": {"key_rows": True, "head_mma": True, "rows": 256, "BLOCK_N": 64, "N_ITERS": 128, "num_warps": 4,
                "num_stages": 3},
        # FP4 as one tl.dot_scaled per key tile (emulated on sm_90: e2m1 -> bf16 MMA), several
        # times faster than e4m3 group dots
        "fp4": {"fp4_mma": True, "key_rows": True, "rows": 128, "BLOCK_N": 128, "N_ITERS": 64, "num_warps": 4,
                "num_stages": 3},
    },
}
# sm_121 as sm_120 but FP4 in 32-key tiles (128 per program: the same keys per program): Triton
# 3.6 / 3.7 build tl.dot_scaled on sm_121 from e4m3 dots, where H16 over 64-key tiles spills 40-48 B
# (compile check); for the same reason FP8 keeps tl.dot there before Triton 3.8.
CONFIGS["sm_121"] = {"fp8": dict(CONFIGS["sm_120"]["fp8"], fp8_mx=native_block_scaled("sm_121")),
                     "fp4": dict(CONFIGS["sm_120"]["fp4"], BLOCK_N=32, N_ITERS=128)}
LOGITS_ALIGN_BYTES = 1024
BLOCK_KV_SLACK = 256  # DeepGEMM allocates S_kv + 256 columns before aligning the stride


@triton.jit
def e2m1_to_e4m3(c):
    """4-bit e2m1 codes (int32) -> float8e4nv of the same value (every e2m1 value is exact in e4m3)."""
    e = (c >> 1) & 3
    m = c & 1
    bits = tl.where(e == 0, tl.where(m == 1, 6 << 3, 0), ((e + 6) << 3) | (m << 2))
    bits = bits | (((c >> 3) & 1) << 7)
    return bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def load_fp4_group(ptr, row_off, row_mask, G: tl.constexpr):
    """Decode group G (32 values) of packed FP4 rows: bytes [16G, 16G+16) -> [rows, 32] e4m3 in
    natural element order (low nibble = even element); ``row_mask`` None loads every row."""
    offs = row_off[:, None] + G * 16 + tl.arange(0, 16)[None, :]
    if row_mask is None:
        b = tl.load(ptr + offs).to(tl.int32) & 0xFF
    else:
        b = tl.load(ptr + offs, mask=row_mask[:, None], other=0).to(tl.int32) & 0xFF
    lo = e2m1_to_e4m3(b & 15)
    hi = e2m1_to_e4m3(b >> 4)
    return tl.reshape(tl.join(lo, hi), (row_off.shape[0], 32))


@triton.jit
def ue8m0_scale(sf, G: tl.constexpr):
    """Byte G of packed int32 ue8m0 scales -> float32 2**(byte-127) (byte 0 -> 0, as DeepGEMM)."""
    return (((sf >> (8 * G)) & 0xFF) << 23).to(tl.float32, bitcast=True)


@triton.jit
def load_q_fp4(q_ptr, q_row_off, q_row_mask, qsf, D: tl.constexpr):
    """Decode a packed FP4 q tile once: (4 e4m3 group tiles [ROWS, 32], their 4 scale vectors).
    D=64 has two groups; slots 2 and 3 then repeat slot 0 and are never used."""
    q0 = load_fp4_group(q_ptr, q_row_off, q_row_mask, 0)
    q1 = load_fp4_group(q_ptr, q_row_off, q_row_mask, 1)
    if D == 128:
        q2 = load_fp4_group(q_ptr, q_row_off, q_row_mask, 2)
        q3 = load_fp4_group(q_ptr, q_row_off, q_row_mask, 3)
    else:
        q2 = q0
        q3 = q0
    return (q0, q1, q2, q3, ue8m0_scale(qsf, 0), ue8m0_scale(qsf, 1), ue8m0_scale(qsf, 2),
            ue8m0_scale(qsf, 3))


@triton.jit
def ue8m0_bytes(sf, G: tl.constexpr):
    """Packed int32 ue8m0 scales [rows] -> their first G bytes [rows, G] uint8 (byte g: group g)."""
    return ((sf[:, None] >> (8 * tl.arange(0, G))[None, :]) & 0xFF).to(tl.uint8)


@triton.jit
def load_q_fp4_packed(q_ptr, q_row_off, q_row_mask, qsf, D: tl.constexpr):
    """A packed FP4 q tile for ``tl.dot_scaled``: (e2m1 pairs [ROWS, D/2] uint8, ue8m0 bytes
    [ROWS, D/32])."""
    q = tl.load(q_ptr + q_row_off[:, None] + tl.arange(0, D // 2)[None, :], mask=q_row_mask[:, None], other=0)
    return q.to(tl.uint8, bitcast=True), ue8m0_bytes(qsf, D // 32)


@triton.jit
def load_query_rows(q_ptr, qsf_ptr, w_ptr, qrow, row_ok, stride_w, H: tl.constexpr, D: tl.constexpr,
                    IS_FP4: tl.constexpr, FP4_MMA: tl.constexpr):
    """The prologue every indexer logits kernel (and so the fused top-k) starts with: the q tile
    and weights of a block of (query, head) rows, query-major. Row i of the block is head i % H
    of query qrow[i] (int64 [ROWS]: the query's row of ``weights`` and of the logits), masked by
    ``row_ok`` [ROWS]. Returns (q, w): w float32 [ROWS] (0 where masked); q the [ROWS, D] float8
    tile, or for FP4 ``load_q_fp4_packed``'s pair (``FP4_MMA``) or ``load_q_fp4``'s tuple.
    The offsets are int64 throughout: rows x H x D may pass 2**31."""
    DB: tl.constexpr = D // 2 if IS_FP4 else D  # bytes per q row
    head = tl.arange(0, qrow.shape[0]) % H
    row = qrow * H + head  # (query, head) row of q and of its FP4 scales
    w = tl.load(w_ptr + qrow * stride_w + head, mask=row_ok, other=0.0).to(tl.float32)
    if IS_FP4:
        qsf = tl.load(qsf_ptr + row, mask=row_ok, other=0)
        if FP4_MMA:
            q = load_q_fp4_packed(q_ptr, row * DB, row_ok, qsf, D)
        else:
            q = load_q_fp4(q_ptr, row * DB, row_ok, qsf, D)
    else:
        q = tl.load(q_ptr + (row * DB)[:, None] + tl.arange(0, D)[None, :], mask=row_ok[:, None], other=0.0)
    return q, w


@triton.jit
def _fp4_group(q, qs, k_ptr, k_row_off, k_mask, ksf, G: tl.constexpr, KEY_ROWS: tl.constexpr):
    kg = load_fp4_group(k_ptr, k_row_off, k_mask, G)
    if KEY_ROWS:
        return tl.dot(kg, tl.trans(q)) * ue8m0_scale(ksf, G)[:, None] * qs[None, :]
    else:
        return tl.dot(q, tl.trans(kg)) * qs[:, None] * ue8m0_scale(ksf, G)[None, :]


@triton.jit
def load_rows(ptrs, row_mask, other):
    """Load a [rows] or [rows, cols] tile; ``row_mask`` [rows] or None (every row is in bounds)."""
    if row_mask is None:
        return tl.load(ptrs)
    elif len(ptrs.shape) == 2:
        return tl.load(ptrs, mask=row_mask[:, None], other=other)
    else:
        return tl.load(ptrs, mask=row_mask, other=other)


@triton.jit
def fp4_key_rows_mma(kt, ksf, q, D: tl.constexpr):
    """relu(k . q^T) [N, ROWS] of a packed FP4 key tile kt [N, D/2] (ue8m0 words ksf [N]) and
    load_q_fp4_packed's pair: one block-scaled e2m1 MMA."""
    acc = tl.dot_scaled(kt.to(tl.uint8, bitcast=True), ue8m0_bytes(ksf, D // 32), "e2m1", tl.trans(q[0]), q[1],
                        "e2m1")
    return tl.maximum(acc, 0.0)


@triton.jit
def qk_scores(q, k_ptr, k_row_off, k_mask, ksf_ptr, k_idx, D: tl.constexpr, IS_FP4: tl.constexpr,
              KEY_ROWS: tl.constexpr, FP4_MMA: tl.constexpr, FP8_MX: tl.constexpr = False):
    """relu(q . k^T * scale) for one key tile -> [ROWS, BLOCK_N] float32, or (FP4 only; FP8 with
    keys on M is handled in ``index_scores``) its transpose [BLOCK_N, ROWS] with ``KEY_ROWS``.

    FP8: ``q`` is the preloaded [ROWS, D] tile, k is float8 with float32 scales at ksf_ptr[k_idx];
    ``FP8_MX``: the dot as a unit-scale block-scaled MMA (``fp8_dot``: the same float32 result).
    FP4 with ``FP4_MMA``: ``q`` is load_q_fp4_packed's pair; one ``tl.dot_scaled`` (block-scaled
    e2m1 MMA on sm_120, emulated elsewhere). A ue8m0 byte of 0 scales by 2**-127 there instead
    of 0: the same logits to float32 precision.
    FP4 otherwise: ``q`` is load_q_fp4's tuple; one K=32 dot per ue8m0 group, scaled by the outer
    product of the q and k group scales (e2m1 values are exact in e4m3, so the dots are exact)."""
    if IS_FP4 and FP4_MMA:
        kt = load_rows(k_ptr + k_row_off[:, None] + tl.arange(0, D // 2)[None, :], k_mask, 0)
        ksf = load_rows(ksf_ptr + k_idx, k_mask, 0)
        if KEY_ROWS:
            s = fp4_key_rows_mma(kt, ksf, q, D)
        else:
            kt = kt.to(tl.uint8, bitcast=True)
            s = tl.maximum(tl.dot_scaled(q[0], q[1], "e2m1", tl.trans(kt), ue8m0_bytes(ksf, D // 32), "e2m1"), 0.0)
        return s
    elif IS_FP4:
        ksf = load_rows(ksf_ptr + k_idx, k_mask, 0)
        acc = _fp4_group(q[0], q[4], k_ptr, k_row_off, k_mask, ksf, 0, KEY_ROWS)
        acc += _fp4_group(q[1], q[5], k_ptr, k_row_off, k_mask, ksf, 1, KEY_ROWS)
        if D == 128:
            acc += _fp4_group(q[2], q[6], k_ptr, k_row_off, k_mask, ksf, 2, KEY_ROWS)
            acc += _fp4_group(q[3], q[7], k_ptr, k_row_off, k_mask, ksf, 3, KEY_ROWS)
        return tl.maximum(acc, 0.0)
    else:
        kt = load_rows(k_ptr + k_row_off[:, None] + tl.arange(0, D)[None, :], k_mask, 0.0)
        ks = load_rows(ksf_ptr + k_idx, k_mask, 0.0)
        return tl.maximum(fp8_dot(q, tl.trans(kt), FP8_MX) * ks[None, :], 0.0)


@triton.jit
def head_reduce(s, w, BLOCK_Q: tl.constexpr, H: tl.constexpr, KEY_ROWS: tl.constexpr):
    """Scores from ``qk_scores`` x [BLOCK_Q*H] weights -> [BLOCK_Q, N] summed over heads."""
    if KEY_ROWS:
        sw = s * w[None, :]
        return tl.trans(tl.sum(tl.reshape(sw, (s.shape[0], BLOCK_Q, H)), axis=2))
    else:
        sw = s * w[:, None]
        return tl.sum(tl.reshape(sw, (BLOCK_Q, H, s.shape[1])), axis=1)


@triton.jit
def relu_bf16(x, ASM: tl.constexpr):
    """max(x, 0) rounded to the nearest bfloat16: with ``ASM`` as bfloat16, one
    ``cvt.rn.relu.bf16x2.f32`` per two values; else as float32 (the interpreter has no inline PTX,
    and its bfloat16 casts and dots are not exact in triton 3.9)."""
    if ASM:
        return tl.inline_asm_elementwise("cvt.rn.relu.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)
    else:
        return round_bf16(tl.maximum(x, 0.0))


@triton.jit
def head_weight_matrix(w, BLOCK_Q: tl.constexpr, H: tl.constexpr, BF16: tl.constexpr):
    """Weights [BLOCK_Q*H] float32 -> the [BLOCK_Q*H, NC] operand of the head-sum MMA: row (t, h)
    holds bf16(w) in column t and bf16(w - bf16(w)) in column BLOCK_Q + t (zeros elsewhere), so the
    MMA sums over heads with w to ~16 bits. bfloat16 with ``BF16``, else float32 of those values."""
    NC: tl.constexpr = 16 if BLOCK_Q <= 8 else 2 * BLOCK_Q  # the MMA's N is at least 8 (16 keeps K tidy)
    t = tl.arange(0, BLOCK_Q * H) // H
    c = tl.arange(0, NC)
    hi = round_bf16(w)
    lo = round_bf16(w - hi)
    m = tl.where(c[None, :] == t[:, None], hi[:, None], 0.0)
    m = tl.where(c[None, :] == t[:, None] + BLOCK_Q, lo[:, None], m)
    if BF16:
        m = m.to(tl.bfloat16)
    return m


@triton.jit
def key_tile_scores(kt, ks, q, w, BLOCK_Q: tl.constexpr, H: tl.constexpr, HEAD_MMA: tl.constexpr = 0,
                    FP8_MX: tl.constexpr = False):
    """FP8, keys on the MMA's M side: loaded key tile kt [N, D] with scales ks [N], q [BLOCK_Q*H, D],
    weights [BLOCK_Q*H] -> [BLOCK_Q, N] = sum_h w * relu(q_h . k) * k_scale (the scale after the
    head sum: relu(x * s) = s * relu(x) for the non-negative FP8 scales).

    ``HEAD_MMA`` (1; 2 with inline PTX): ``w`` is ``head_weight_matrix(w)`` and the weighted sum
    over heads is a second MMA of relu(q . k) rounded to bf16 (relative error <= 2**-8 per term)
    instead of a max and an FMA per (key, head) on the CUDA cores. ``FP8_MX``: the k.q^T dot as a
    unit-scale block-scaled MMA (``fp8_dot``: the same float32 result, full rate on SM12x)."""
    qk = fp8_dot(kt, tl.trans(q), FP8_MX)
    if HEAD_MMA:
        r = relu_bf16(qk, HEAD_MMA == 2)
        if HEAD_MMA == 2:
            acc = tl.dot(r, w)  # [N, NC]: column t + j*BLOCK_Q holds query t's sum with w's part j
        else:  # interpreter: the same exact products in float32
            acc = tl.dot(r, w, input_precision="ieee")
        v = tl.sum(tl.reshape(acc, (kt.shape[0], w.shape[1] // BLOCK_Q, BLOCK_Q)), axis=1) * ks[:, None]
    else:
        sw = tl.maximum(qk, 0.0) * w[None, :]
        v = tl.sum(tl.reshape(sw, (kt.shape[0], BLOCK_Q, H)), axis=2) * ks[:, None]
    return tl.trans(v)


@triton.jit
def fp4_key_tile_scores(kt, ksf, q, w, BLOCK_Q: tl.constexpr, H: tl.constexpr, D: tl.constexpr):
    """FP4 on the block-scaled MMA, keys on M: loaded packed key tile kt [N, D/2] with its ue8m0
    words ksf [N], q = load_q_fp4_packed's pair, weights [BLOCK_Q*H] -> [BLOCK_Q, N]."""
    return head_reduce(fp4_key_rows_mma(kt, ksf, q, D), w, BLOCK_Q, H, True)


@triton.jit
def index_scores(q, w, k_ptr, k_row_off, k_mask, ksf_ptr, k_idx, BLOCK_Q: tl.constexpr,
                 H: tl.constexpr, D: tl.constexpr, IS_FP4: tl.constexpr, KEY_ROWS: tl.constexpr,
                 FP4_MMA: tl.constexpr, HEAD_MMA: tl.constexpr = 0, FP8_MX: tl.constexpr = False):
    """sum_h w[h] * relu(q_h . k * k_scale) for one key tile -> [BLOCK_Q, BLOCK_N] float32.

    FP8 with ``KEY_ROWS``: the per-key scale is applied after the head sum
    (relu(x * s) = s * relu(x) for s >= 0; FP8 k scales are amax / 448 >= 0), which takes one
    multiply per (head, key) out of the epilogue."""
    if KEY_ROWS and not IS_FP4:
        kt = load_rows(k_ptr + k_row_off[:, None] + tl.arange(0, D)[None, :], k_mask, 0.0)
        ks = load_rows(ksf_ptr + k_idx, k_mask, 0.0)
        return key_tile_scores(kt, ks, q, w, BLOCK_Q, H, HEAD_MMA, FP8_MX)
    else:
        s = qk_scores(q, k_ptr, k_row_off, k_mask, ksf_ptr, k_idx, D, IS_FP4, KEY_ROWS, FP4_MMA, FP8_MX)
        return head_reduce(s, w, BLOCK_Q, H, KEY_ROWS)


@triton.jit
def row_offsets(rows, stride):
    """Element offset of each row: int64, so rows x stride >= 2**31 does not wrap."""
    return rows.to(tl.int64) * stride


@triton.jit
def _mqa_logits_kernel(
    q_ptr, qsf_ptr, k_ptr, ksf_ptr, w_ptr, ks_ptr, ke_ptr, out_ptr,
    S, S_kv, stride_w, stride_out, col_start, num_cols, out_cols,
    H: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    N_ITERS: tl.constexpr, IS_FP4: tl.constexpr, CLEAN: tl.constexpr, COMPRESSED: tl.constexpr,
    KEY_ROWS: tl.constexpr, FP4_MMA: tl.constexpr,
    OUT_MODE: tl.constexpr,  # 0: float32, 1: bfloat16
    HEAD_MMA: tl.constexpr,  # 0, or the head sum as an MMA (``key_tile_scores``; 2: inline PTX)
    FP8_MX: tl.constexpr,  # FP8 q.k dots as unit-scale block-scaled MMAs (``fp8_dot``)
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    ROWS: tl.constexpr = BLOCK_Q * H
    DB: tl.constexpr = D // 2 if IS_FP4 else D  # bytes per k row

    qi = pid_m * BLOCK_Q + tl.arange(0, ROWS) // H  # query of each row
    q, w = load_query_rows(q_ptr, qsf_ptr, w_ptr, qi.to(tl.int64), qi < S, stride_w, H, D, IS_FP4, FP4_MMA)
    if HEAD_MMA:
        w = head_weight_matrix(w, BLOCK_Q, H, HEAD_MMA == 2)

    t = pid_m * BLOCK_Q + tl.arange(0, BLOCK_Q)
    t_ok = t < S
    ks = tl.load(ks_ptr + t, mask=t_ok, other=0)
    ke = tl.load(ke_ptr + t, mask=t_ok, other=0)
    lo = tl.min(tl.where(t_ok, ks, 2147483647))
    hi = tl.max(tl.where(t_ok, ke, 0))
    out_row = row_offsets(t, stride_out)

    # tiles of this chunk that some row of the block can see: [first, last); the rest only get
    # -inf (clean / top-k keys) so the compute loop has plain bounds and can be pipelined
    chunk0 = pid_n * N_ITERS * BLOCK_N  # first window column of the chunk
    first = tl.minimum(tl.maximum(lo - col_start - chunk0, 0) // BLOCK_N, N_ITERS)
    last = tl.minimum(tl.maximum(tl.cdiv(hi - col_start - chunk0, BLOCK_N), 0), N_ITERS)
    last = tl.maximum(last, first)
    # Key rows are clamped to the last key of the window instead of masked: a clamped row only
    # feeds columns that are never stored, and the loads need no per-row predicates.
    key_last = tl.minimum(S_kv, col_start + num_cols) - 1
    for it in range(first, last):
        c = chunk0 + it * BLOCK_N + tl.arange(0, BLOCK_N)  # column in the window
        j = col_start + c  # key index
        col_ok = (c < num_cols) & (j < S_kv)
        valid = (j[None, :] >= ks[:, None]) & (j[None, :] < ke[:, None])
        jc = tl.minimum(j, key_last)
        v = index_scores(q, w, k_ptr, row_offsets(jc, DB), None, ksf_ptr, jc, BLOCK_Q, H, D, IS_FP4,
                         KEY_ROWS, FP4_MMA, HEAD_MMA, FP8_MX)
        if COMPRESSED:
            cc = j[None, :] - ks[:, None]
            tl.store(out_ptr + out_row[:, None] + cc, v.to(out_ptr.dtype.element_ty),
                     mask=valid & t_ok[:, None] & (cc < out_cols))
        else:
            if CLEAN:
                v = tl.where(valid, v, float("-inf"))
            tl.store(out_ptr + out_row[:, None] + c[None, :], v.to(out_ptr.dtype.element_ty),
                     mask=t_ok[:, None] & col_ok[None, :])
    if (not COMPRESSED) and CLEAN:
        fill = tl.full((BLOCK_Q, BLOCK_N), float("-inf"), dtype=out_ptr.dtype.element_ty)
        for it in range(0, N_ITERS):
            if (it < first) | (it >= last):
                c = chunk0 + it * BLOCK_N + tl.arange(0, BLOCK_N)
                col_ok = (c < num_cols) & (col_start + c < S_kv)
                tl.store(out_ptr + out_row[:, None] + c[None, :], fill, mask=t_ok[:, None] & col_ok[None, :])


def _block_q(h: int, rows: int) -> int:
    return max(rows // h, 1, 16 // h)


def alloc_logits(s: int, width: int, h: int, dtype, device, extra: int = BLOCK_KV_SLACK):
    """DeepGEMM-shaped output: a [s, width] view of [align(s, 128/h), stride] with stride 1024-B aligned."""
    elem = torch.tensor([], dtype=dtype).element_size()
    align = LOGITS_ALIGN_BYTES // elem
    stride = -(-(width + extra) // align) * align
    rows = -(-s // max(128 // h, 1)) * max(128 // h, 1)
    return torch.empty((rows, stride), dtype=dtype, device=device)[:s, :width]


def launch(q, q_sf, k, k_sf, weights, ks, ke, out, *, clean, compressed, out_mode,
           col_start=0, num_cols=None, config=None):
    """Run the kernel into ``out`` (a [S, *] view with unit column stride). ``col_start``/``num_cols``
    restrict the computed key window (columns of ``out`` are then j - col_start). An explicit
    ``config`` (tuning, tests) is used as given, N_ITERS included."""
    s, h = q.shape[0], q.shape[1]
    is_fp4 = q_sf is not None
    d = q.shape[2] * 2 if is_fp4 else q.shape[2]
    s_kv = k.shape[0]
    if num_cols is None:
        num_cols = s_kv
    cfg = config or configs.pick(CONFIGS, q.device)["fp4" if is_fp4 else "fp8"]
    block_q = _block_q(h, cfg["rows"])
    if compressed:
        num_cols = s_kv
    n_iters = cfg["N_ITERS"] if config else configs.fit_iters(
        cfg["N_ITERS"], triton.cdiv(num_cols, cfg["BLOCK_N"]), triton.cdiv(s, block_q), q.device)
    grid = (triton.cdiv(s, block_q), max(triton.cdiv(num_cols, cfg["BLOCK_N"] * n_iters), 1))
    if s == 0 or num_cols == 0:
        return out
    dummy = ks  # unused pointer slot
    args = (q, q_sf if is_fp4 else dummy, k, k_sf, weights, ks, ke, out,
            s, s_kv, weights.stride(0), out.stride(0), col_start, num_cols, out.shape[1])
    kwargs = dict(H=h, D=d, BLOCK_Q=block_q, BLOCK_N=cfg["BLOCK_N"], N_ITERS=n_iters,
                  IS_FP4=is_fp4, CLEAN=clean, COMPRESSED=compressed, KEY_ROWS=cfg.get("key_rows", False),
                  FP4_MMA=uses_fp4_mma(cfg, is_fp4), OUT_MODE=out_mode, HEAD_MMA=head_mma(cfg, is_fp4),
                  FP8_MX=fp8_mx(cfg, is_fp4), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    budget = {} if interpreting() else launch_budget(_mqa_logits_kernel, args, kwargs, cfg.get("maxnreg"),
                                                     q.device)
    _mqa_logits_kernel[grid](*args, **kwargs, **budget)
    return out


def head_mma(cfg: dict, is_fp4: bool) -> int:
    """HEAD_MMA for a call: the config's ``head_mma`` applies to FP8 with keys on M; 2 (inline PTX)
    on the GPU, 1 under the interpreter."""
    if is_fp4 or not (cfg.get("head_mma") and cfg.get("key_rows")):
        return 0
    return 1 if interpreting() else 2


def fp8_mx(cfg: dict, is_fp4: bool) -> bool:
    """FP8_MX for a call: the config's ``fp8_mx`` (FP8 q.k dots through ``tl.dot_scaled`` with unit
    scales: bit-identical, the full-rate block-scaled MMA on SM12x)."""
    return (not is_fp4) and bool(cfg.get("fp8_mx", False))


def uses_fp4_mma(cfg: dict, is_fp4: bool) -> bool:
    """FP4 through ``tl.dot_scaled`` (the config's ``fp4_mma``) rather than decoded e4m3 dots."""
    return is_fp4 and bool(cfg.get("fp4_mma", False))


def mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, clean_logits=True, max_seqlen_k=0,
               logits_dtype=torch.float32):
    """Logits as described in the module docstring (inputs assumed validated by the caller)."""
    s, h = q.shape[0], q.shape[1]
    compressed = max_seqlen_k > 0
    width = max_seqlen_k if compressed else k.shape[0]
    extra = 0 if compressed else BLOCK_KV_SLACK
    if compressed:
        width_alloc = -(-max_seqlen_k // BLOCK_KV_SLACK) * BLOCK_KV_SLACK
        out = alloc_logits(s, width_alloc, h, logits_dtype, q.device, extra=0)[:, :max_seqlen_k]
    else:
        out = alloc_logits(s, width, h, logits_dtype, q.device, extra=extra)
    out_mode = 1 if logits_dtype == torch.bfloat16 else 0
    return launch(q, q_sf, k, k_sf, weights, ks, ke, out, clean=clean_logits and not compressed,
                  compressed=compressed, out_mode=out_mode)


# ----------------------------------------------------------------------------------------------
# compile check


def _signature(is_fp4: bool, out_mode: int):
    out_t = {0: "*fp32", 1: "*bf16"}[out_mode]
    sig = {
        "q_ptr": "*i8" if is_fp4 else "*fp8e4nv", "qsf_ptr": "*i32",
        "k_ptr": "*i8" if is_fp4 else "*fp8e4nv", "ksf_ptr": "*i32" if is_fp4 else "*fp32",
        "w_ptr": "*fp32", "ks_ptr": "*i32", "ke_ptr": "*i32", "out_ptr": out_t,
        "S": "i32", "S_kv": "i32", "stride_w": "i32", "stride_out": "i64", "col_start": "i32",
        "num_cols": "i32", "out_cols": "i32",
    }
    for name in ("H", "D", "BLOCK_Q", "BLOCK_N", "N_ITERS", "IS_FP4", "CLEAN", "COMPRESSED", "KEY_ROWS",
                 "FP4_MMA", "OUT_MODE", "HEAD_MMA", "FP8_MX"):
        sig[name] = "constexpr"
    return sig


VARIANTS = ((0, True, False), (0, False, False), (0, False, True), (1, True, False))


def compile_reports(targets=("sm_120", "sm_121"), heads=(8, 64), dims=(128,),
                    variants=VARIANTS, fp4=(False, True)):
    """Compile the configurations for ``targets`` (every head count, head dim, FP8/FP4 and output
    variant (out_mode, clean, compressed) given) and return CompileReports. The defaults cover each
    per-arch config at the production shape (H=64, D=128) and the smallest head count; pass
    heads=(8, 16, 32, 64), dims=(64, 128) for the full sweep."""
    from sm12x.kernels.common.compile_check import compile_kernel

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), heads=tuple(heads), dims=tuple(dims),
                                     variants=tuple(variants), fp4=tuple(fp4))

    reports = []
    for target in targets:
        for is_fp4 in fp4:
            cfg = configs.for_target(CONFIGS, target)["fp4" if is_fp4 else "fp8"]
            for h in heads:
                for d in dims:
                    for out_mode, clean, comp in variants:
                        bq = _block_q(h, cfg["rows"])
                        const = dict(H=h, D=d, BLOCK_Q=bq, BLOCK_N=cfg["BLOCK_N"], N_ITERS=cfg["N_ITERS"],
                                     IS_FP4=is_fp4, CLEAN=clean, COMPRESSED=comp,
                                     KEY_ROWS=cfg.get("key_rows", False),
                                     FP4_MMA=uses_fp4_mma(cfg, is_fp4), OUT_MODE=out_mode,
                                     HEAD_MMA=head_mma(cfg, is_fp4), FP8_MX=fp8_mx(cfg, is_fp4))
                        name = (f"{'fp4' if is_fp4 else 'fp8'}{' mx' if fp8_mx(cfg, is_fp4) else ''} H{h} D{d} out{out_mode}"
                                f"{' clean' if clean else ''}{' comp' if comp else ''}")
                        reports.append(compile_kernel(
                            _mqa_logits_kernel, _signature(is_fp4, out_mode), const, target=target,
                            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], config_name=name,
                            maxnreg=cfg.get("maxnreg"), register_ladder=True))
    return reports

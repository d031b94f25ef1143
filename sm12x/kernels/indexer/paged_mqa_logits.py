"""Decode lightning-indexer logits over a paged cache (DeepGEMM ``fp8_paged_mqa_logits`` /
``fp8_fp4_paged_mqa_logits``) in Triton.

Contract: q [B, next_n, H, D] float8_e4m3fn (FP4: int8 [B, next_n, H, D/2] + int32 ue8m0
[B, next_n, H]); kv_cache fused uint8 [num_blocks, block_kv, 1, D+4] (FP4: D/2+4; layout in
``indexer_cache``; stride(0) may be padded); weights [B*next_n, H]; context_lens int32 [B, next_n]
(row (b, t) sees positions < context_lens[b, t]) or [B] (old API: row (b, t) sees positions
< ctx - next_n + t + 1); block_table int32 [B, max_blocks]. Returns [B*next_n, max_context_len]
(float32 or bf16, row stride padded to 1024 B like DeepGEMM) with

    logits[b*next_n + t, p] = sum_h w[b*next_n + t, h] * relu(q[b, t, h] . k(b, p) * scale(b, p))

for visible positions; others are -inf with ``clean_logits`` and undefined otherwise.

CUDA-graph safe: the grid depends only on shapes and ``max_context_len`` (each program takes an
even part of its request's live cache blocks, read from ``context_lens`` on the device), nothing
reads device values on the host, and the output is allocated from shapes. ``schedule_meta`` is
accepted for API compatibility; this kernel does not need it.
"""
from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.indexer.mqa_logits import (LOGITS_ALIGN_BYTES, fp4_key_tile_scores, fp8_mx, head_mma,
                                              head_weight_matrix, index_scores, key_tile_scores, load_query_rows,
                                              row_offsets, uses_fp4_mma)
from sm12x.kernels.common.compile_check import interpreting
from sm12x.kernels.common.fp8_dot import native_block_scaled
from sm12x.kernels.common.register_budget import launch_budget

OP = "fp8_paged_mqa_logits"
PROGRAMS_PER_SM = 40
MIN_PART = 4
SPLIT_ALIGN = 256  # DeepGEMM rounds the logits row to a multiple of 256 before the 1024-B alignment

# rows = BLOCK_T * H (query tokens x heads) per program. The grid has ``columns`` programs per
# (request, token group): enough for PROGRAMS_PER_SM programs per SM, as this memory-bound kernel
# keeps ~8 programs resident per SM and ragged requests need several waves to even out (short
# parts of 8 blocks per program beat long ones of 32). Each program
# takes an even part of its request's live blocks (at least MIN_PART: each program loads its q
# tile) and walks it N_ITERS blocks at a time. The grid is not sized by max_context_len, which
# vLLM sets to the model's limit: most programs would find no live block. A config's ``per_sm``, ``min_part`` and ``columns`` override these, for tuning and tests.
# key_rows as in mqa_logits.
# pair: with next_n > BLOCK_T, two token groups per program share each key tile (``pair_tokens``),
# so one load of a key tile serves both.
# Measurements behind these choices and the configs: docs/performance.md, "Tuning provenance".
CONFIGS = {
    "sm_120": {
        # pair_stages 3 (as sm_90): with 2 stages Triton keeps one key-tile buffer, so the next
        # tile's copy cannot overlap the current tile's MMA. The pair variant takes 136 registers,
        # 3 programs per SM either way, and 3 x 33 KB of shared memory still fits an SM12x SM's
        # 100 KB. Its gain was timed on the H200 only, not on an SM12x GPU. One-token programs
        # keep 2 stages (a third costs them one of 4 programs per SM there).
        # fp8_mx: the q.k dots through tl.dot_scaled with unit scales, as in mqa_logits
        # (bit-identical, the full-rate block-scaled MMA).
        "fp8": {"key_rows": True, "pair": True, "rows": 64, "SUB_N": 64, "N_ITERS": 16, "num_warps": 4,
                "num_stages": 2, "pair_stages": 3, "fp8_mx": True},
        # FP4: one block-scaled e2m1 MMA per 64-token slice (tl.dot_scaled, in hardware on sm_120);
        # rows 128: two query tokens share each key slice
        "fp4": {"fp4_mma": True, "key_rows": True, "rows": 128, "SUB_N": 64, "N_ITERS": 16, "num_warps": 4,
                "num_stages": 2},
    },
    "sm_90": {
        # Up to 32 blocks per program. maxnreg 64 (dropped for the variants that spill with it,
        # token pairs among them): 8 instead of 7 one-token programs per SM.
        # tma: key tiles by TMA copies, 2 stages: a little faster than pointer loads with 3 stages;
        # sm_120 keeps pointer loads (not measured there)
        # pair_stages: token pairs take 3 stages (a second key tile in flight while one is
        # computed); one token per program loses with them, so it keeps 2
        "fp8": {"key_rows": True, "pair": True, "rows": 64, "SUB_N": 64, "N_ITERS": 32, "num_warps": 4,
                "num_stages": 2, "pair_stages": 3, "maxnreg": 64, "tma": True},
        # FP4 as tl.dot_scaled (emulated on sm_90): far more bandwidth than e4m3 group dots
        "fp4": {"fp4_mma": True, "key_rows": True, "rows": 128, "SUB_N": 64, "N_ITERS": 32, "num_warps": 4,
                "num_stages": 3},
    },
}

# sm_121 as sm_120 but FP4 in 32-token slices: Triton 3.6 / 3.7 build tl.dot_scaled on sm_121 from
# e4m3 dots, where two query tokens over a 64-token slice spill 8-24 B (compile check); half slices
# fit in 200 registers. FP8 keeps tl.dot there before Triton 3.8 for the same reason.
CONFIGS["sm_121"] = {"fp8": dict(CONFIGS["sm_120"]["fp8"], fp8_mx=native_block_scaled("sm_121")),
                     "fp4": dict(CONFIGS["sm_120"]["fp4"], SUB_N=32)}


@triton.jit
def _token_group(q_ptr, qsf_ptr, w_ptr, ctx_ptr, b, t0, next_n, max_context_len, stride_w, stride_out,
                 H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, IS_FP4: tl.constexpr,
                 CTX_2D: tl.constexpr, FP4_MMA: tl.constexpr):
    """Query tokens t0 .. t0+BLOCK_T-1 of request b: (q tile, weights, token in range, visible end,
    logits row offset). Rows of the q tile are (token, head), token-major."""
    tok = t0 + tl.arange(0, BLOCK_T * H) // H  # query token of each q row (its logits row: b * next_n + tok)
    q, w = load_query_rows(q_ptr, qsf_ptr, w_ptr, b.to(tl.int64) * next_n + tok, tok < next_n, stride_w, H, D,
                           IS_FP4, FP4_MMA)
    t = t0 + tl.arange(0, BLOCK_T)
    t_ok = t < next_n
    if CTX_2D:
        end = tl.load(ctx_ptr + b.to(tl.int64) * next_n + t, mask=t_ok, other=0)
    else:
        end = tl.load(ctx_ptr + b) - next_n + t + 1
    end = tl.where(t_ok, tl.minimum(end, max_context_len), 0)
    return q, w, t_ok, end, row_offsets(b.to(tl.int64) * next_n + t, stride_out)


@triton.jit
def _entry(blocks, j):
    """Element j of the block-table slice ``blocks`` (0 past its end) as int64, without a load."""
    return tl.sum(tl.where(tl.arange(0, blocks.shape[0]) == j, blocks, 0)).to(tl.int64)


@triton.jit
def _store_scores(out_ptr, out_row, v, p, c, t_ok, end, num_cols, max_context_len, CLEAN: tl.constexpr):
    """Store one token group's scores for positions p (out columns c)."""
    m = t_ok[:, None] & ((c < num_cols) & (p < max_context_len))[None, :]
    if CLEAN:
        v = tl.where(p[None, :] < end[:, None], v, float("-inf"))
    tl.store(out_ptr + out_row[:, None] + c[None, :], v.to(out_ptr.dtype.element_ty), mask=m)


@triton.jit
def _part(span, col_start, num_cols, max_context_len, want_parts, BLOCK_KV: tl.constexpr, N_ITERS: tl.constexpr,
          MIN_PART: tl.constexpr):
    """This program's blocks [lo, hi). The window's blocks [col_start, col_start + num_cols) that
    hold a visible position for some row of the request are cut into even parts, one per program
    along grid axis 1: ``want_parts`` of at least MIN_PART blocks, more where that leaves parts
    longer than a chunk (N_ITERS blocks), at most the grid's columns. The grid does not depend on
    how long requests are (max_context_len may be the model's limit), and no program runs past its
    request's end."""
    first = col_start // BLOCK_KV
    stop = tl.minimum(col_start + num_cols, max_context_len)
    n_req = tl.maximum(tl.minimum(tl.cdiv(span, BLOCK_KV), tl.cdiv(stop, BLOCK_KV)) - first, 0)
    parts = tl.maximum(tl.cdiv(n_req, N_ITERS), tl.minimum(want_parts, n_req // MIN_PART))
    parts = tl.minimum(tl.num_programs(1), tl.maximum(parts, 1))
    pid_n = tl.program_id(1)
    lo = first + (tl.minimum(pid_n, parts).to(tl.int64) * n_req // parts).to(tl.int32)
    hi = first + (tl.minimum(pid_n + 1, parts).to(tl.int64) * n_req // parts).to(tl.int32)
    return lo, hi


@triton.jit
def _chunk(q_ptr, kv_ptr, kvf_ptr, bt_ptr, out_ptr, b, blk0, n_live, q, w, t_ok, end, out_row,
           q2, w2, t_ok2, end2, out_row2, max_context_len, stride_kv, stride_bt, col_start, num_cols,
           H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_KV: tl.constexpr, SUB_N: tl.constexpr,
           SLOTS: tl.constexpr, IS_FP4: tl.constexpr, CLEAN: tl.constexpr, KEY_ROWS: tl.constexpr,
           PAIR: tl.constexpr, FP4_MMA: tl.constexpr, KV_DESC: tl.constexpr, HEAD_MMA: tl.constexpr,
           FP8_MX: tl.constexpr):
    """Scores of cache blocks blk0 .. blk0 + n_live - 1 of request b (n_live <= SLOTS)."""
    # values of block n start at n*stride_kv bytes; scales (4 B each) after BLOCK_KV*DB value bytes
    DB: tl.constexpr = D // 2 if IS_FP4 else D  # bytes per token row
    slots = tl.arange(0, SLOTS)
    # The chunk's block-table entries are loaded once, before the loop: a key tile whose address
    # came from a load inside the loop was fetched only one block ahead (Triton gives such an
    # indirect load chain one stage), so every block waited for its own copy.
    blocks = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + blk0 + slots, mask=slots < n_live, other=0)
    # Keys on M, whole blocks: FP8, and FP4 on the block-scaled MMA for up to 2 tokens per program
    # (with 4, H32 spilled 8 B on sm_120 in the variant for unaligned inputs). SUB_N slices only
    # the other paths, where it bounds register use.
    if KEY_ROWS and ((not IS_FP4) or (FP4_MMA and SUB_N == BLOCK_KV and BLOCK_T <= 2)):
        i = tl.arange(0, BLOCK_KV)
        # The k scales are loaded one block ahead: Triton pipelines the key tile but not these, and
        # a load right before its use stalled every block on memory latency.
        ks_next = tl.load(kvf_ptr + (_entry(blocks, 0) * stride_kv + BLOCK_KV * DB) // 4 + i,
                          mask=i < n_live * BLOCK_KV, other=0)
        for it in range(0, n_live):
            phys = _entry(blocks, it)
            ks = ks_next
            ks_next = tl.load(kvf_ptr + (_entry(blocks, it + 1) * stride_kv + BLOCK_KV * DB) // 4 + i,
                              mask=i < (n_live - 1 - it) * BLOCK_KV, other=0)
            p = (blk0 + it) * BLOCK_KV + i  # positions
            c = p - col_start
            if KV_DESC:  # block n's keys are rows n * stride_kv / D .. + BLOCK_KV of the descriptor
                kt = kv_ptr.load([(phys * (stride_kv // D)).to(tl.int32), 0])
            else:
                kt = tl.load(kv_ptr + (phys * stride_kv + i * DB)[:, None] + tl.arange(0, DB)[None, :])
            if IS_FP4:
                v = fp4_key_tile_scores(kt, ks, q, w, BLOCK_T, H, D)
            else:
                v = key_tile_scores(kt, ks, q, w, BLOCK_T, H, HEAD_MMA, FP8_MX)
            _store_scores(out_ptr, out_row, v, p, c, t_ok, end, num_cols, max_context_len, CLEAN)
            if PAIR:
                v2 = key_tile_scores(kt, ks, q2, w2, BLOCK_T, H, HEAD_MMA, FP8_MX)
                _store_scores(out_ptr, out_row2, v2, p, c, t_ok2, end2, num_cols, max_context_len, CLEAN)
    else:
        for it in range(0, n_live):
            phys = _entry(blocks, it)
            for sub in tl.static_range(BLOCK_KV // SUB_N):  # SUB_N-token slices bound register use (FP4)
                i = sub * SUB_N + tl.arange(0, SUB_N)  # token in the block
                p = (blk0 + it) * BLOCK_KV + i  # positions
                c = p - col_start
                tok_off = phys * stride_kv + i * DB
                sf_idx = (phys * stride_kv + BLOCK_KV * DB) // 4 + i
                v = index_scores(q, w, kv_ptr, tok_off, i < BLOCK_KV, kvf_ptr, sf_idx, BLOCK_T, H, D,
                                 IS_FP4, KEY_ROWS, FP4_MMA, HEAD_MMA, FP8_MX)
                _store_scores(out_ptr, out_row, v, p, c, t_ok, end, num_cols, max_context_len, CLEAN)


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr, qsf_ptr, kv_ptr, kvf_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
    next_n, max_context_len, stride_kv, stride_bt, stride_w, stride_out, col_start, num_cols, want_parts,
    H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_KV: tl.constexpr, SUB_N: tl.constexpr,
    N_ITERS: tl.constexpr, SLOTS: tl.constexpr,  # SLOTS: N_ITERS rounded up to a power of 2
    MIN_PART: tl.constexpr,  # fewest cache blocks a program is given while it has a part of its own
    MULTI: tl.constexpr,  # parts may be longer than N_ITERS blocks (``grid_columns``)
    IS_FP4: tl.constexpr, CTX_2D: tl.constexpr, CLEAN: tl.constexpr,
    KEY_ROWS: tl.constexpr, PAIR: tl.constexpr, FP4_MMA: tl.constexpr,
    OUT_MODE: tl.constexpr,  # 0: float32, 1: bfloat16
    KV_DESC: tl.constexpr,  # kv_ptr is a TMA descriptor of the cache as D-byte rows (``tma_cache``)
    HEAD_MMA: tl.constexpr,  # 0, or the head sum as an MMA (``key_tile_scores``; 2: inline PTX)
    FP8_MX: tl.constexpr,  # FP8 q.k dots as unit-scale block-scaled MMAs (``fp8_dot``)
):
    pid_r = tl.program_id(0)  # (request, group of query tokens)
    pid_n = tl.program_id(1)  # part of the request's live cache blocks
    # PAIR: a second group of BLOCK_T tokens shares every key tile (its own dot, same k in smem)
    TOKENS: tl.constexpr = 2 * BLOCK_T if PAIR else BLOCK_T
    t_groups = tl.cdiv(next_n, TOKENS)
    b = pid_r // t_groups
    t0 = (pid_r % t_groups) * TOKENS

    q, w, t_ok, end, out_row = _token_group(q_ptr, qsf_ptr, w_ptr, ctx_ptr, b, t0, next_n, max_context_len,
                                            stride_w, stride_out, H, D, BLOCK_T, IS_FP4, CTX_2D, FP4_MMA)
    span = tl.max(end)
    if PAIR:
        q2, w2, t_ok2, end2, out_row2 = _token_group(q_ptr, qsf_ptr, w_ptr, ctx_ptr, b, t0 + BLOCK_T, next_n,
                                                     max_context_len, stride_w, stride_out, H, D, BLOCK_T,
                                                     IS_FP4, CTX_2D, FP4_MMA)
        span = tl.maximum(span, tl.max(end2))
        if HEAD_MMA:
            w2 = head_weight_matrix(w2, BLOCK_T, H, HEAD_MMA == 2)
    if HEAD_MMA:
        w = head_weight_matrix(w, BLOCK_T, H, HEAD_MMA == 2)

    lo, hi = _part(span, col_start, num_cols, max_context_len, want_parts, BLOCK_KV, N_ITERS, MIN_PART)
    if MULTI:  # parts may be longer than a chunk
        for blk0 in range(lo, hi, N_ITERS):
            _chunk(q_ptr, kv_ptr, kvf_ptr, bt_ptr, out_ptr, b, blk0, tl.minimum(hi - blk0, N_ITERS), q, w, t_ok,
                   end, out_row, q2 if PAIR else q, w2 if PAIR else w, t_ok2 if PAIR else t_ok,
                   end2 if PAIR else end, out_row2 if PAIR else out_row, max_context_len, stride_kv, stride_bt,
                   col_start, num_cols, H, D, BLOCK_T, BLOCK_KV, SUB_N, SLOTS, IS_FP4, CLEAN, KEY_ROWS, PAIR,
                   FP4_MMA, KV_DESC, HEAD_MMA, FP8_MX)
    else:  # the launcher made every part at most N_ITERS blocks
        _chunk(q_ptr, kv_ptr, kvf_ptr, bt_ptr, out_ptr, b, lo, hi - lo, q, w, t_ok, end, out_row,
               q2 if PAIR else q, w2 if PAIR else w, t_ok2 if PAIR else t_ok, end2 if PAIR else end,
               out_row2 if PAIR else out_row, max_context_len, stride_kv, stride_bt, col_start, num_cols,
               H, D, BLOCK_T, BLOCK_KV, SUB_N, SLOTS, IS_FP4, CLEAN, KEY_ROWS, PAIR, FP4_MMA, KV_DESC, HEAD_MMA,
               FP8_MX)
    if CLEAN:
        # the window's blocks past every row's end get -inf, cut across the same programs
        stop = tl.minimum(col_start + num_cols, max_context_len)
        dead = tl.minimum(tl.cdiv(span, BLOCK_KV), tl.cdiv(stop, BLOCK_KV))
        dead = tl.maximum(dead, col_start // BLOCK_KV)
        n_dead = tl.maximum(tl.cdiv(stop, BLOCK_KV) - dead, 0)
        cols = tl.num_programs(1)
        fill = tl.full((BLOCK_T, BLOCK_KV), float("-inf"), dtype=out_ptr.dtype.element_ty)
        for blk in range(dead + (pid_n.to(tl.int64) * n_dead // cols).to(tl.int32),
                         dead + ((pid_n + 1).to(tl.int64) * n_dead // cols).to(tl.int32)):
            p = blk * BLOCK_KV + tl.arange(0, BLOCK_KV)
            c = p - col_start
            m = (p < stop)[None, :]
            tl.store(out_ptr + out_row[:, None] + c[None, :], fill, mask=t_ok[:, None] & m)
            if PAIR:
                tl.store(out_ptr + out_row2[:, None] + c[None, :], fill, mask=t_ok2[:, None] & m)


def key_rows(cfg: dict, bt: int, h: int) -> bool:
    """Keys on the MMA's M side only for >= 32 query-head rows: narrower tiles (H=8 with two
    tokens) gain nothing from it and spill on sm_120 (compile check)."""
    return bool(cfg.get("key_rows", False)) and bt * h >= 32


def pair_tokens(cfg: dict, bt: int, h: int, next_n: int, is_fp4: bool) -> bool:
    """Two groups of ``bt`` query tokens per program sharing each key tile (FP8 with keys on M,
    when next_n has more than one group): the k tile is loaded once for both dots."""
    return (bool(cfg.get("pair", False)) and not is_fp4 and key_rows(cfg, bt, h)
            and next_n > bt)


def block_t(h: int, next_n: int, rows: int) -> int:
    """Query tokens per program: fill ``rows`` MMA rows but at least 16 rows (H=8 -> 2 tokens)."""
    bt = max(1, rows // h)
    bt = min(bt, triton.next_power_of_2(max(next_n, 1)))
    return max(bt, 16 // h, 1)


def alloc_logits(rows: int, max_context_len: int, dtype, device):
    elem = torch.tensor([], dtype=dtype).element_size()
    align = LOGITS_ALIGN_BYTES // elem
    width = -(-max_context_len // SPLIT_ALIGN) * SPLIT_ALIGN
    width = -(-width // align) * align
    return torch.empty((rows, max(width, align)), dtype=dtype, device=device)[:, :max_context_len]


def cache_pointers(kv_cache: torch.Tensor, fp4: bool):
    """(values, 4-byte view) of the same storage: element offsets are bytes / 4-byte words."""
    vals = kv_cache if fp4 else kv_cache.view(torch.float8_e4m3fn)
    words = kv_cache.view(torch.int32 if fp4 else torch.float32)
    return vals, words


def launch(q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, out, *,
           clean, out_mode, col_start=0, num_cols=None, config=None):
    """Run the kernel into ``out`` ([B*next_n, *] view, unit column stride); ``col_start`` (a multiple
    of block_kv) / ``num_cols`` restrict the positions computed (out column = p - col_start).
    An explicit ``config`` (tuning, tests) replaces the GPU's; its ``columns``, ``per_sm`` and
    ``min_part`` steer the grid (``grid_columns``)."""
    bsz, next_n, h = q.shape[0], q.shape[1], q.shape[2]
    is_fp4 = q_sf is not None
    d = q.shape[3] * 2 if is_fp4 else q.shape[3]
    block_kv = kv_cache.shape[1]
    if num_cols is None:
        num_cols = max_context_len
    cfg = config or configs.pick(CONFIGS, q.device)["fp4" if is_fp4 else "fp8"]
    bt = block_t(h, next_n, cfg["rows"])
    pair = pair_tokens(cfg, bt, h, next_n, is_fp4)
    row_programs = bsz * triton.cdiv(next_n, 2 * bt if pair else bt)
    min_part = cfg.get("min_part", MIN_PART)
    cols, want_parts, multi = grid_columns(triton.cdiv(num_cols, block_kv), row_programs, q.device, cfg)
    grid = (row_programs, cols)
    if bsz == 0 or num_cols <= 0:
        return out
    vals, words = cache_pointers(kv_cache, is_fp4)
    kv_desc = tma_cache(cfg, vals, is_fp4, key_rows(cfg, bt, h))
    args = (q, q_sf if is_fp4 else context_lens, vals if kv_desc is None else kv_desc, words, weights,
            context_lens, block_table, out,
            next_n, max_context_len, kv_cache.stride(0), block_table.stride(0), weights.stride(0),
            out.stride(0), col_start, num_cols, want_parts)
    kwargs = dict(H=h, D=d, BLOCK_T=bt, BLOCK_KV=block_kv, SUB_N=min(cfg["SUB_N"], block_kv),
                  N_ITERS=cfg["N_ITERS"], SLOTS=triton.next_power_of_2(cfg["N_ITERS"]), MIN_PART=min_part,
                  MULTI=multi,
                  IS_FP4=is_fp4, CTX_2D=context_lens.dim() == 2, CLEAN=clean, KEY_ROWS=key_rows(cfg, bt, h),
                  PAIR=pair, FP4_MMA=uses_fp4_mma(cfg, is_fp4), OUT_MODE=out_mode,
                  KV_DESC=kv_desc is not None, HEAD_MMA=head_mma(cfg, is_fp4) if key_rows(cfg, bt, h) else 0,
                  FP8_MX=fp8_mx(cfg, is_fp4), num_warps=cfg["num_warps"], num_stages=stages(cfg, pair))
    budget = {} if interpreting() else launch_budget(_paged_mqa_logits_kernel, args, kwargs, cfg.get("maxnreg"),
                                                     q.device)
    _paged_mqa_logits_kernel[grid](*args, **kwargs, **budget)
    return out


def grid_columns(window_blocks: int, row_programs: int, device, cfg: dict) -> tuple[int, int, bool]:
    """(grid columns: programs per request and token group, parts wanted per request, whether a
    program's part may take several chunks).

    ``per_sm`` programs per SM over the grid are wanted; a request gets that many parts of at
    least ``min_part`` blocks, or more where that leaves parts longer than one chunk (N_ITERS
    blocks). While at most twice the wanted columns give a window-long request parts of one chunk,
    the grid takes them and each program runs one chunk: the kernel variant without a loop over
    chunks, which keeps the sm_90 config within its 64 registers. A window far longer than the
    requests in it (vLLM passes the model's length limit as max_context_len) gets the wanted
    count, and parts may take several chunks. A config's ``columns`` fixes the count (tests)."""
    n_iters, min_part = cfg["N_ITERS"], cfg.get("min_part", MIN_PART)
    most = max(-(-window_blocks // min_part), 1)  # more columns than this only add empty programs
    want = -(-cfg.get("per_sm", PROGRAMS_PER_SM) * configs.sm_count(device) // max(row_programs, 1))
    one_chunk = -(-window_blocks // n_iters)  # columns that make every part one chunk
    if "columns" in cfg:
        cols = want = cfg["columns"]
    elif one_chunk <= 2 * want:
        cols = min(max(want, one_chunk), most)
    else:
        cols = min(want, most)
    # parts are at least cdiv(blocks, N_ITERS) unless the grid's columns cap them
    return cols, min(want, cols), -(-window_blocks // cols) > n_iters


def stages(cfg: dict, pair: bool) -> int:
    """Pipeline depth: the config's ``pair_stages`` for token pairs when it sets one."""
    return cfg.get("pair_stages", cfg["num_stages"]) if pair else cfg["num_stages"]


def tma_cache(cfg: dict, vals, is_fp4: bool, keys_on_m: bool):
    """A TMA descriptor of the FP8 cache's values as rows of D bytes (block n's keys are rows
    n * stride(0) / D onwards, one BLOCK_KV-row box per block) when the config asks for it (``tma``)
    and the layout allows: keys on M, stride(0) a multiple of D and 16 bytes, 16-byte aligned base,
    rows addressable with int32. Else None (pointer loads)."""
    if not (cfg.get("tma") and keys_on_m and not is_fp4):
        return None
    num_blocks, block_kv, d = vals.shape[0], vals.shape[1], vals.shape[3] - 4
    stride = vals.stride(0)
    if num_blocks == 0 or stride % d or stride % 16 or vals.data_ptr() % 16:
        return None
    rows = (num_blocks - 1) * (stride // d) + block_kv
    if rows >= 2**31:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(vals, [rows, d], [d, 1], [block_kv, d])


def paged_mqa_logits(q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len,
                     clean_logits=False, logits_dtype=torch.float32):
    """Logits as in the module docstring (inputs assumed validated by the caller)."""
    rows = q.shape[0] * q.shape[1]
    out = alloc_logits(rows, max_context_len, logits_dtype, q.device)
    return launch(q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, out,
                  clean=clean_logits, out_mode=1 if logits_dtype == torch.bfloat16 else 0)


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices=None) -> torch.Tensor:
    """[num_sms+1, 2] int32 schedule: row i = (request, first block) where SM i's share of the total
    cache blocks starts (an even split of sum_b cdiv(len_b, block_kv)); the last row is (B, 0).
    Computed with device ops only (no host sync). Our kernels use a shape-only grid and ignore it."""
    bsz = context_lens.shape[0]
    ctx = context_lens.reshape(bsz, -1).max(dim=1).values.clamp(min=0).long()
    blocks = (ctx + block_kv - 1) // block_kv
    cum = torch.cumsum(blocks, 0)  # inclusive
    total = cum[-1:].sum() if bsz else torch.zeros((), dtype=torch.long, device=ctx.device)
    starts = torch.arange(num_sms + 1, device=ctx.device) * total // num_sms
    req = torch.searchsorted(cum, starts, right=True)  # first request whose blocks reach past start
    first = (cum - blocks)[req.clamp(max=max(bsz - 1, 0))] if bsz else starts
    done = req >= bsz
    meta = torch.stack([req, torch.where(done, 0, starts - first)], dim=1).to(torch.int32)
    return meta


# ----------------------------------------------------------------------------------------------
# compile check


def _signature(is_fp4: bool, out_mode: int, kv_box=None):
    out_t = {0: "*fp32", 1: "*bf16"}[out_mode]
    kv_t = f"tensordesc<fp8e4nv[{kv_box[0]}, {kv_box[1]}]>" if kv_box else ("*u8" if is_fp4 else "*fp8e4nv")
    sig = {
        "q_ptr": "*i8" if is_fp4 else "*fp8e4nv", "qsf_ptr": "*i32",
        "kv_ptr": kv_t, "kvf_ptr": "*i32" if is_fp4 else "*fp32",
        "w_ptr": "*fp32", "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": out_t,
        "next_n": "i32", "max_context_len": "i32", "stride_kv": "i64", "stride_bt": "i32",
        "stride_w": "i32", "stride_out": "i64", "col_start": "i32", "num_cols": "i32", "want_parts": "i32",
    }
    for name in ("H", "D", "BLOCK_T", "BLOCK_KV", "SUB_N", "N_ITERS", "SLOTS", "MIN_PART", "MULTI", "IS_FP4", "CTX_2D",
                 "CLEAN", "KEY_ROWS", "PAIR", "FP4_MMA", "OUT_MODE", "KV_DESC", "HEAD_MMA", "FP8_MX"):
        sig[name] = "constexpr"
    return sig


VARIANTS = ((0, False, True), (0, True, False), (1, False, True))  # (out, clean, 2-D)


def compile_reports(targets=("sm_120", "sm_121"), heads=(8, 64), dims=(128,), block_kvs=(32, 64),
                    next_ns=(1, 2), variants=VARIANTS[:2], fp4=(False, True), multis=(False, True)):
    """Compile the configurations for ``targets`` and return CompileReports. The defaults cover each
    per-arch config at the production shape (H=64, D=128, next_n 1/2, both block sizes), the
    smallest head count, and both kernel forms (one chunk per program, several); widen heads / dims
    / next_ns / variants for the full sweep."""
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), heads=tuple(heads), dims=tuple(dims),
                                     block_kvs=tuple(block_kvs), next_ns=tuple(next_ns),
                                     variants=tuple(variants), fp4=tuple(fp4), multis=tuple(multis))

    reports = []
    seen = set()
    for target in targets:
        for is_fp4 in fp4:
            cfg = configs.for_target(CONFIGS, target)["fp4" if is_fp4 else "fp8"]
            for h in heads:
                for d in dims:
                    for bkv in block_kvs:
                        for nn in next_ns:
                            bt = block_t(h, nn, cfg["rows"])
                            pair = pair_tokens(cfg, bt, h, nn, is_fp4)
                            for (out_mode, clean, ctx2d), multi in itertools.product(variants, multis):
                                key = (target, is_fp4, h, d, bkv, bt, pair, out_mode, clean, ctx2d, multi)
                                if key in seen:
                                    continue
                                seen.add(key)
                                kv_desc = bool(cfg.get("tma")) and key_rows(cfg, bt, h) and not is_fp4
                                const = dict(H=h, D=d, BLOCK_T=bt, BLOCK_KV=bkv, SUB_N=min(cfg["SUB_N"], bkv),
                                             N_ITERS=cfg["N_ITERS"],
                                             SLOTS=triton.next_power_of_2(cfg["N_ITERS"]), MIN_PART=MIN_PART,
                                             MULTI=multi,
                                             IS_FP4=is_fp4, CTX_2D=ctx2d, CLEAN=clean,
                                             KEY_ROWS=key_rows(cfg, bt, h), PAIR=pair,
                                             FP4_MMA=uses_fp4_mma(cfg, is_fp4), OUT_MODE=out_mode,
                                             KV_DESC=kv_desc,
                                             HEAD_MMA=head_mma(cfg, is_fp4) if key_rows(cfg, bt, h) else 0,
                                             FP8_MX=fp8_mx(cfg, is_fp4))
                                name = (f"{'fp4' if is_fp4 else 'fp8'}{' mx' if fp8_mx(cfg, is_fp4) else ''} H{h} D{d} bkv{bkv} T{bt}"
                                        f"{'x2' if pair else ''} out{out_mode}"
                                        f"{' clean' if clean else ''}{' ctx2d' if ctx2d else ' ctx1d'}"
                                        f"{' multi-chunk' if multi else ''}")
                                reports.append(compile_kernel(
                                    _paged_mqa_logits_kernel,
                                    _signature(is_fp4, out_mode, (bkv, d) if kv_desc else None), const,
                                    target=target, num_warps=cfg["num_warps"],
                                    num_stages=stages(cfg, pair), config_name=name, maxnreg=cfg.get("maxnreg"),
                                    register_ladder=True))
    return reports

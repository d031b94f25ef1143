"""Candidate-only paged lightning-indexer logits (DeepGEMM ``get_paged_sparse_mqa_logits_metadata`` +
``fp8_fp4_paged_sparse_mqa_logits``, DeepSeek-V4.1's two-level indexer) in Triton, FP4 keys.

A candidate source layer publishes, per query row, ``topk_blocks`` blocks of ``block_size`` (8 or 16)
compressed positions; a consumer layer scores only those positions. The schedule holds, per row,
the length of its sparse logits row and the pool slot of each published block's first position,
so the logits call reads nothing else of the table.

``build_schedule(seq_lens, page_table, blocks, page_size, block_size)``: seq_lens int32 [rows]
(compressed positions row r sees), page_table int32 [rows, pages] (index-K pool pages of
``page_size`` slots; position p of row r sits in slot ``page_table[r, p // page_size] * page_size +
p % page_size``), blocks int32 [rows, topk_blocks] (logical block ids, ascending; only the first
``kept = min(topk_blocks, ceil(seq_lens[r] / block_size))`` are read, as DeepGEMM reads them; the
newest block, the possibly partial one, must be the last of those). Returns int32
[rows, 1 + topk_blocks]: column 0 the row's valid length ``block_size * (kept - 1) +
(seq_lens[r] - 1) % block_size + 1`` (0 for an empty row), column 1 + j the pool slot of block j's
first position (-1 past ``kept``). Device ops only, allocated from shapes (CUDA-graph safe).

``paged_sparse_mqa_logits(q, q_sf, kv_cache, weights, schedule, topk_blocks, block_size)``: q int8
[rows, H, 64] packed e2m1 (D = 128) with int32 ue8m0 scales q_sf [rows, H]; kv_cache the fused FP4
index-K pool uint8 [pages, page_size, 1, 68] (per page: page_size x 64 packed bytes, then page_size
packed ue8m0 int32 words; stride(0) may be padded); weights [rows, H] float32 or bf16. Returns
[rows, topk_blocks * block_size] (bf16 as DeepGEMM, or float32) with

    logits[r, j] = sum_h w[r, h] * relu(q[r, h] . k(slot(r, j)))   for j < valid[r]

where ``slot(r, j) = schedule[r, 1 + j // block_size] + j % block_size``; -inf for j >= valid[r]
(DeepGEMM leaves those undefined; the frameworks read a row up to its valid length only). A row of
the schedule past ``rows`` is never read, so a schedule built for more rows (a CUDA-graph bucket)
serves a cut ``q``.

Each program owns one query row (all H heads: the MMA's N side) and N_ITERS tiles of BLOCK_N
columns; each key tile is one block-scaled e2m1 MMA (``tl.dot_scaled``; hardware on sm_120,
emulated with the same math elsewhere) with keys on M, summed over heads inside each warp.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.common.compile_check import interpreting
from sm12x.kernels.indexer.mqa_logits import fp4_key_tile_scores, load_q_fp4_packed, row_offsets

OP = "fp8_fp4_paged_sparse_mqa_logits"
BLOCK_SIZES = (8, 16)  # positions per candidate block (DeepGEMM accepts 8 or 16)
HEADS = (16, 32, 64)  # the MMA's N side; V4.1's indexer replicates its heads on every rank
D = 128

# A decode row publishes a few hundred blocks (V4.1: 8 positions each), so a row's logits are
# thousands of columns at most: BLOCK_N 64 keys per MMA, 8 tiles per program.
CONFIGS = {
    "sm_120": {"BLOCK_N": 64, "N_ITERS": 8, "num_warps": 4, "num_stages": 2},
    "sm_90": {"BLOCK_N": 64, "N_ITERS": 8, "num_warps": 4, "num_stages": 2},
}
# Triton 3.6 / 3.7 build tl.dot_scaled on sm_121 from e4m3 dots: half-width key tiles there keep
# the register use of the FP4 indexer kernels within budget (as mqa_logits' sm_121 config).
CONFIGS["sm_121"] = dict(CONFIGS["sm_120"], BLOCK_N=32, N_ITERS=16)


def build_schedule(seq_lens: torch.Tensor, page_table: torch.Tensor, blocks: torch.Tensor,
                   page_size: int, block_size: int) -> torch.Tensor:
    """The schedule of the module docstring (inputs assumed validated by the caller)."""
    rows, topk_blocks = blocks.shape
    lens = seq_lens[:rows].reshape(rows).long().clamp(min=0)
    kept = torch.minimum((lens + block_size - 1) // block_size, torch.full_like(lens, topk_blocks))
    valid = torch.where(lens > 0, block_size * (kept - 1) + (lens - 1) % block_size + 1, 0)
    live = torch.arange(topk_blocks, device=blocks.device)[None, :] < kept[:, None]
    pos = blocks.long().masked_fill(~live, 0).clamp(min=0) * block_size
    page_col = (pos // page_size).clamp(max=max(page_table.shape[1] - 1, 0))
    pages = page_table[:rows].long().gather(1, page_col)
    slots = (pages * page_size + pos % page_size).masked_fill(~live, -1)
    return torch.cat([valid[:, None], slots], dim=1).to(torch.int32)


@triton.jit
def _paged_sparse_mqa_logits_kernel(
    q_ptr, qsf_ptr, kv_ptr, kvf_ptr, w_ptr, sched_ptr, out_ptr,
    stride_kv, stride_w, stride_sched, stride_out, width,
    H: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr,
    N_ITERS: tl.constexpr, OUT_BF16: tl.constexpr,
):
    r = tl.program_id(0)
    col0 = tl.program_id(1) * (BLOCK_N * N_ITERS)
    sched_row = sched_ptr + row_offsets(r, stride_sched)
    valid = tl.load(sched_row)
    out_row = out_ptr + row_offsets(r, stride_out)
    heads = tl.arange(0, H)
    q_rows = r.to(tl.int64) * H + heads
    q = load_q_fp4_packed(q_ptr, q_rows * (D // 2), heads < H, tl.load(qsf_ptr + q_rows), D)
    w = tl.load(w_ptr + row_offsets(r, stride_w) + heads).to(tl.float32)
    # the scales of a page follow its PAGE x D/2 value bytes, as int32 words
    scale_words = PAGE * (D // 8)
    for it in range(N_ITERS):
        cols = col0 + it * BLOCK_N + tl.arange(0, BLOCK_N)
        live = cols < valid
        if col0 + it * BLOCK_N < valid:
            base = tl.load(sched_row + 1 + cols // BS, mask=live, other=0)
            slot = base + cols % BS
            page = (slot // PAGE).to(tl.int64)
            off = slot % PAGE
            kt = tl.load(kv_ptr + (page * stride_kv + off * (D // 2))[:, None] + tl.arange(0, D // 2)[None, :],
                         mask=live[:, None], other=0)
            ksf = tl.load(kvf_ptr + page * (stride_kv // 4) + scale_words + off, mask=live, other=0)
            v = tl.reshape(fp4_key_tile_scores(kt, ksf, q, w, 1, H, D), (BLOCK_N,))
            v = tl.where(live, v, float("-inf"))
        else:
            v = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        if OUT_BF16:
            tl.store(out_row + cols, v.to(tl.bfloat16), mask=cols < width)
        else:
            tl.store(out_row + cols, v, mask=cols < width)


def paged_sparse_mqa_logits(q, q_sf, kv_cache, weights, schedule, topk_blocks, block_size,
                            logits_dtype=torch.bfloat16, config=None):
    """Logits as in the module docstring (inputs assumed validated by the caller)."""
    rows, h = q.shape[0], q.shape[1]
    width = topk_blocks * block_size
    weights = weights if weights.dtype == torch.float32 else weights.float()  # [rows, H]: a few KiB
    out = torch.empty((rows, width), dtype=logits_dtype, device=q.device)
    if rows == 0 or width == 0:
        return out
    cfg = config or configs.pick(CONFIGS, q.device)
    grid = (rows, triton.cdiv(width, cfg["BLOCK_N"] * cfg["N_ITERS"]))
    _paged_sparse_mqa_logits_kernel[grid](
        q, q_sf, kv_cache, kv_cache.view(torch.int32), weights, schedule, out,
        kv_cache.stride(0), weights.stride(0), schedule.stride(0), out.stride(0), width,
        H=h, D=D, PAGE=kv_cache.shape[1], BS=block_size, BLOCK_N=cfg["BLOCK_N"], N_ITERS=cfg["N_ITERS"],
        OUT_BF16=logits_dtype == torch.bfloat16, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return out


# ----------------------------------------------------------------------------------------------
# compile check


def _signature(out_bf16: bool):
    sig = {"q_ptr": "*i8", "qsf_ptr": "*i32", "kv_ptr": "*u8", "kvf_ptr": "*i32", "w_ptr": "*fp32",
           "sched_ptr": "*i32", "out_ptr": "*bf16" if out_bf16 else "*fp32",
           "stride_kv": "i64", "stride_w": "i32", "stride_sched": "i32", "stride_out": "i32", "width": "i32"}
    for name in ("H", "D", "PAGE", "BS", "BLOCK_N", "N_ITERS", "OUT_BF16"):
        sig[name] = "constexpr"
    return sig


def compile_reports(targets=("sm_120", "sm_121"), heads=HEADS, pages=(64, 128), block_sizes=(8,),
                    out_bf16=(True, False)):
    """Compile the configurations for ``targets`` (V4.1's pool pages 64 and 128, every head count,
    both output dtypes) and return CompileReports."""
    from sm12x.kernels.common.compile_check import compile_kernel, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), heads=tuple(heads), pages=tuple(pages),
                                     block_sizes=tuple(block_sizes), out_bf16=tuple(out_bf16))
    reports = []
    for target in targets:
        cfg = configs.for_target(CONFIGS, target)
        for h in heads:
            for page in pages:
                for bs in block_sizes:
                    for bf16 in out_bf16:
                        const = dict(H=h, D=D, PAGE=page, BS=bs, BLOCK_N=cfg["BLOCK_N"], N_ITERS=cfg["N_ITERS"],
                                     OUT_BF16=bf16)
                        name = f"fp4 H{h} page{page} bs{bs} {'bf16' if bf16 else 'fp32'}"
                        reports.append(compile_kernel(_paged_sparse_mqa_logits_kernel, _signature(bf16), const,
                                                      target=target, num_warps=cfg["num_warps"],
                                                      num_stages=cfg["num_stages"], config_name=name))
    return reports

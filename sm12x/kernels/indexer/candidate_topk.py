"""Fused indexer top-k over DeepSeek-V4.1's candidate blocks: the two-level selection of vLLM
0.34's dense indexer (``select_candidate_blocks`` / ``apply_candidate_mask`` between the logits
and the row top-k) without the [rows, width] float32 logits.

V4.1's candidate source indexer layer publishes, per query row, the ``K`` best blocks of
``block_size`` consecutive (compressed) key positions; every later indexer layer ranks only keys
inside the row's published blocks. Positions are row-local: ``rel = j - ks[i]`` in a prefill
chunk (the flat key buffer, DeepGEMM's compressed logits column), the sequence position ``p`` in
decode. ``width`` is the framework's logits width (prefill: the chunk's ``max_seqlen_k``;
decode: ``max_model_len``), ``nblocks = ceil(width / block_size)``.

Source (``write=True``; the math of vLLM's ``select_candidate_blocks`` on FP32 logits without
DeepSelect, which is SM100-only):

    score[i, b] = max(logits[i, rel] for rel in block b, rel < min(end_i, width))  (NaN propagates)
    score[i, b] = +inf for b = (end_i - 1) // block_size when end_i > 0   (the newest block, pinned)
    score[i, b] = -inf for a block without a visible key
    values, blocks = torch.topk(score[i], min(K, nblocks))
    candidates[i, c] = blocks[c] where values[c] != -inf else -1; -1 for c >= min(K, nblocks)

``torch.topk`` runs on the same [rows, nblocks] scores (in row groups: memory O(group x nblocks),
``block_size`` times less than the logits), so its order and tie behaviour are the framework's.
The row's own top-k is the plain fused top-k (the source does not mask itself).

Consumers (``write=False``; vLLM's ``apply_candidate_mask``): a key at ``rel`` keeps its score
when its block ``rel // block_size`` is among the row's candidates (entries < 0 ignored), or when
``rel == width - 1`` and some candidate block starts at or past ``width`` (vLLM's clamp of such
candidates onto the last column); every other visible key is masked. vLLM masks with -inf and
its top-k (``top_k_per_row_prefill``, ``persistent_topk``, ``top_k_per_row_decode``) still
returns ``min(visible, topk)`` positions per row, masked ones among them when fewer than topk
keys survive (a row of at most topk keys returns all of its positions). Here masked keys score
``-FLT_MAX`` (below any real logit, which the indexer never produces): the same sets, the masked
keys tied at the bottom taken lowest position first (vLLM's kernels take an unspecified subset of
those tied keys, as of any tie at the k-th score).

Consumers whose width is at least ``candidate_gather.MIN_WIDTH_RATIO`` times their candidate keys
(V4.1 at long context: 512 blocks of 8 against 262,144 keys at 1M) rank those keys only
(:mod:`sm12x.kernels.indexer.candidate_gather`: the same scores and order, without scoring the
rest of the row); narrower ones score every visible key and mask, as below.

Index outputs and order are those of :mod:`sm12x.kernels.indexer.fused_topk`. No host sync: every
step is shaped by the call's shapes only (CUDA-graph safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common.checks import require, require_dtype
from sm12x.kernels.indexer import candidate_gather, fused_topk
from sm12x.kernels.indexer.validation import check_mqa, check_paged

OP = "candidate_topk"
MASKED = -3.4028234663852886e38  # -FLT_MAX: a masked key's score (see the module docstring)
_MASKED = tl.constexpr(MASKED)
MASK_TILE = 1024
BLOCKS_PER_PROGRAM = 16
# the row-group scratch (block scores / flags) next to the fused top-k's own workspace
GROUP_BYTES = 128 << 20


@triton.jit
def _mask_window_kernel(ws_ptr, stride_w, n_cols, col_start, base_ptr, ends_ptr, flags_ptr, stride_f, nblocks,
                        width, HAS_BASE: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """Window row r (columns col_start + c): every visible key outside the row's candidate blocks
    gets MASKED. ``flags`` row r: 1 at each candidate block, slot nblocks the edge flag."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * TILE + tl.arange(0, TILE)
    base = tl.load(base_ptr + r) if HAS_BASE else 0
    end = tl.load(ends_ptr + r)
    rel = col_start + c - base
    visible = (c < n_cols) & (rel >= 0) & (rel < end) & (rel < width)
    block = tl.where(visible, rel, 0) // BLOCK_SIZE
    keep = tl.load(flags_ptr + r * stride_f + block, mask=visible, other=0).to(tl.int32)
    edge = tl.load(flags_ptr + r * stride_f + nblocks).to(tl.int32)
    keep = keep | tl.where(rel == width - 1, edge, 0)
    tl.store(ws_ptr + r * stride_w + c, tl.full((TILE,), _MASKED, tl.float32), mask=visible & (keep == 0))


@triton.jit
def _block_max_kernel(ws_ptr, stride_w, n_cols, col_start, base_ptr, ends_ptr, scores_ptr, stride_s, nblocks,
                      width, HAS_BASE: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_P2: tl.constexpr,
                      BLOCKS: tl.constexpr):
    """Fold window row r into the row's block maxima: score[b] = max(score[b], max of the
    window's visible keys of block b), NaN propagating (as vLLM's block scores)."""
    r = tl.program_id(0).to(tl.int64)
    base = tl.load(base_ptr + r) if HAS_BASE else 0
    end = tl.minimum(tl.load(ends_ptr + r), width)
    first_rel = tl.maximum(col_start - base, 0)
    b = first_rel // BLOCK_SIZE + tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    off = tl.arange(0, BLOCK_P2)
    rel = b[:, None] * BLOCK_SIZE + off[None, :]
    c = rel + base - col_start
    m = (off[None, :] < BLOCK_SIZE) & (c >= 0) & (c < n_cols) & (rel < end)
    v = tl.load(ws_ptr + r * stride_w + c, mask=m, other=float("-inf"))
    red = tl.reduce(v, 1, _max_nan)
    live = (b < nblocks) & (b * BLOCK_SIZE < end)
    old = tl.load(scores_ptr + r * stride_s + b, mask=live, other=float("-inf"))
    tl.store(scores_ptr + r * stride_s + b, _max_nan(old, red), mask=live)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


class _Group:
    """One row group's candidate state: block scores (source) or block flags (consumer), and the
    window hook the fused top-k calls with it."""

    def __init__(self, write, candidates, ends, base, width, block_size, device):
        rows = ends.shape[0]
        self.write, self.candidates, self.ends, self.base = write, candidates, ends, base
        self.width, self.block_size = width, block_size
        self.nblocks = -(-width // block_size)
        if write:
            self.scores = torch.full((rows, self.nblocks), float("-inf"), dtype=torch.float32, device=device)
        else:
            # slot nblocks: the edge flag; nblocks + 1: where entries < 0 land, never read
            self.flags = torch.zeros((rows, self.nblocks + 2), dtype=torch.uint8, device=device)
            blk = candidates.to(torch.int64)
            blk = torch.where(blk * block_size >= width, self.nblocks, blk)
            blk = torch.where(blk < 0, self.nblocks + 1, blk)
            self.flags.scatter_(1, blk, 1)

    def hook(self, window, col_start, r0, r1):
        rows, n = window.shape
        if rows == 0 or n == 0:
            return
        base = self.base[r0:r1] if self.base is not None else window
        if self.write:
            spans = -(-n // self.block_size) + 1
            _block_max_kernel[(rows, triton.cdiv(spans, BLOCKS_PER_PROGRAM))](
                window, window.stride(0), n, col_start, base, self.ends[r0:r1], self.scores[r0:r1],
                self.scores.stride(0), self.nblocks, self.width, HAS_BASE=self.base is not None,
                BLOCK_SIZE=self.block_size, BLOCK_P2=triton.next_power_of_2(self.block_size),
                BLOCKS=BLOCKS_PER_PROGRAM)
        else:
            _mask_window_kernel[(rows, triton.cdiv(n, MASK_TILE))](
                window, window.stride(0), n, col_start, base, self.ends[r0:r1], self.flags[r0:r1],
                self.flags.stride(0), self.nblocks, self.width, HAS_BASE=self.base is not None,
                BLOCK_SIZE=self.block_size, TILE=MASK_TILE)

    def publish(self, pin_ends):
        """Source: pin each row's newest block and write the top-K blocks into ``candidates``."""
        if not self.write:
            return
        rows, k_out = self.candidates.shape
        if rows == 0 or k_out == 0:
            return
        pin = (pin_ends.to(torch.int64) - 1).clamp(min=0) // self.block_size
        pinned = (pin_ends > 0) & (pin < self.nblocks)
        col = torch.where(pinned, pin, 0)[:, None]
        current = self.scores.gather(1, col)
        self.scores.scatter_(1, col, torch.where(pinned[:, None], float("inf"), current))
        k = min(k_out, self.nblocks)
        top = self.scores.topk(k, dim=-1)
        picked = torch.where(top.values != float("-inf"), top.indices, -1)
        self.candidates[:, :k] = picked.to(self.candidates.dtype)
        if k < k_out:
            self.candidates[:, k:] = -1


def _check(candidates, rows, width, block_size, write, device):
    require(isinstance(block_size, int) and block_size >= 1, OP, "block_size", block_size, "an int >= 1")
    require(isinstance(width, int) and width >= 0, OP, "width", width, "an int >= 0")
    require(isinstance(candidates, torch.Tensor) and candidates.dim() == 2 and candidates.shape[0] == rows, OP,
            "candidates", lambda: f"{type(candidates).__name__} {list(getattr(candidates, 'shape', []))}",
            f"an integer tensor [{rows}, K]")
    require_dtype(candidates, (torch.int32, torch.int64, torch.int16), OP, "candidates")
    require(candidates.device == device, OP, "candidates", f"device {candidates.device}", f"the device of q ({device})")
    require(isinstance(write, bool), OP, "write", write, "True (the source layer) or False (a consumer)")


def _group_rows(rows, nblocks, unit=1):
    per_row = (nblocks + 2) * 4
    group = max(unit, GROUP_BYTES // per_row // unit * unit)
    return min(max(rows, 1), group)


def mqa_candidate_topk_indices(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, topk: int, *,
                               width: int, block_size: int, candidates: torch.Tensor, write: bool,
                               out: torch.Tensor | None = None,
                               workspace_bytes: int = fused_topk.DEFAULT_WORKSPACE_BYTES) -> torch.Tensor:
    """Prefill: the fused top-k of ``fused_topk.mqa_topk_indices`` (same arguments, indices
    relative to ks) with V4.1's candidate blocks: ``write`` fills ``candidates`` (int [S, K]) with
    each row's best blocks, otherwise ranks only keys in them (see the module docstring).
    ``width``: the logits width the framework would use (its ``max_seqlen_k``), >= every row's
    ke - ks."""
    qv = q[0] if isinstance(q, (tuple, list)) else q
    rows = qv.shape[0]
    _check(candidates, rows, width, block_size, write, qv.device)
    ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
    result = out if out is not None else torch.empty((rows, topk), dtype=torch.int32, device=qv.device)
    if not write and candidate_gather.worthwhile(width, candidates.shape[1], block_size):
        check_mqa(OP, qv, fused_topk.split_q(q)[1], kv[0], kv[1], weights, ks, ke)
        fused_topk.check_topk(OP, topk, out, rows, qv.device)
        return candidate_gather.flat_consumer_topk(q, kv, weights, ks, ke, topk, width, block_size, candidates,
                                                   result, workspace_bytes)
    nblocks = -(-width // block_size)
    step = _group_rows(rows, nblocks)
    for g0 in range(0, rows, step):
        g1 = min(rows, g0 + step)
        ends = (ke[g0:g1] - ks[g0:g1]).to(torch.int32)
        group = _Group(write, candidates[g0:g1], ends, ks[g0:g1].contiguous(), width, block_size, qv.device)
        sub_q = (q[0][g0:g1], None if q[1] is None else q[1][g0:g1]) if isinstance(q, (tuple, list)) else q[g0:g1]
        fused_topk.mqa_topk_indices(sub_q, kv, weights[g0:g1], ks[g0:g1], ke[g0:g1], topk, out=result[g0:g1],
                                    workspace_bytes=workspace_bytes, window_hook=group.hook)
        group.publish(ends)
    return result


def paged_mqa_candidate_topk_indices(q, kv_cache, weights, context_lens, block_table, max_context_len: int,
                                     topk: int, *, block_size: int, candidates: torch.Tensor, write: bool,
                                     out: torch.Tensor | None = None,
                                     workspace_bytes: int = fused_topk.DEFAULT_WORKSPACE_BYTES) -> torch.Tensor:
    """Decode: the fused paged top-k of ``fused_topk.paged_mqa_topk_indices`` (same arguments,
    positions) with V4.1's candidate blocks (``candidates`` int [B*next_n, K], see
    ``mqa_candidate_topk_indices``); the width is ``max_context_len``, each row's bound its own
    visible end (``fused_topk.row_ends``)."""
    qv = q[0] if isinstance(q, (tuple, list)) else q
    batch, next_n = qv.shape[0], qv.shape[1]
    rows = batch * next_n
    _check(candidates, rows, max_context_len, block_size, write, qv.device)
    result = out if out is not None else torch.empty((rows, topk), dtype=torch.int32, device=qv.device)
    if not write and candidate_gather.worthwhile(max_context_len, candidates.shape[1], block_size):
        kv_cache = check_paged(OP, qv, fused_topk.split_q(q)[1], kv_cache, weights, context_lens, block_table,
                               None, max_context_len)
        fused_topk.check_topk(OP, topk, out, rows, qv.device)
        return candidate_gather.paged_consumer_topk(q, kv_cache, weights, context_lens, block_table,
                                                    max_context_len, topk, block_size, candidates, result,
                                                    workspace_bytes)
    nblocks = -(-max_context_len // block_size)
    step = _group_rows(rows, nblocks, next_n)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        b0, b1 = r0 // next_n, r1 // next_n
        ends = fused_topk.row_ends(context_lens[b0:b1], next_n, max_context_len)
        group = _Group(write, candidates[r0:r1], ends, None, max_context_len, block_size, qv.device)
        sub_q = (q[0][b0:b1], None if q[1] is None else q[1][b0:b1]) if isinstance(q, (tuple, list)) else q[b0:b1]
        fused_topk.paged_mqa_topk_indices(sub_q, kv_cache, weights[r0:r1], context_lens[b0:b1], block_table[b0:b1],
                                          max_context_len, topk, out=result[r0:r1], workspace_bytes=workspace_bytes,
                                          window_hook=group.hook)
        group.publish(ends)
    return result


def compile_reports(targets=("sm_120", "sm_121"), block_sizes=(8, 64)):
    """Compile the window mask and the block-maximum fold for ``targets`` (block sizes of 8, as
    SGLang's V4.1 path uses, and 64), and the consumer's candidate-keys kernels
    (``candidate_gather.compile_reports``)."""
    from sm12x.kernels.common.compile_check import compile_kernel, interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), block_sizes=tuple(block_sizes))
    common = {"ws_ptr": "*fp32", "stride_w": "i64", "n_cols": "i32", "col_start": "i32", "base_ptr": "*i32",
              "ends_ptr": "*i32"}
    mask_sig = dict(common, flags_ptr="*u8", stride_f="i64", nblocks="i32", width="i32", HAS_BASE="constexpr",
                    BLOCK_SIZE="constexpr", TILE="constexpr")
    max_sig = dict(common, scores_ptr="*fp32", stride_s="i64", nblocks="i32", width="i32", HAS_BASE="constexpr",
                   BLOCK_SIZE="constexpr", BLOCK_P2="constexpr", BLOCKS="constexpr")
    reports = []
    for t in targets:
        for bs in block_sizes:
            reports.append(compile_kernel(_mask_window_kernel, mask_sig,
                                          {"HAS_BASE": True, "BLOCK_SIZE": bs, "TILE": MASK_TILE}, target=t,
                                          num_warps=4, num_stages=1, config_name=f"candidate mask B{bs}"))
            reports.append(compile_kernel(_block_max_kernel, max_sig,
                                          {"HAS_BASE": True, "BLOCK_SIZE": bs, "BLOCK_P2": triton.next_power_of_2(bs),
                                           "BLOCKS": BLOCKS_PER_PROGRAM}, target=t, num_warps=4, num_stages=1,
                                          config_name=f"candidate block max B{bs}"))
    return reports + candidate_gather.compile_reports(targets)

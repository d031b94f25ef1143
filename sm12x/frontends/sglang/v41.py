"""SGLang 0.5.23's DeepSeek-V4.1 candidate source layer (decode) done by sm12x's fused candidate
top-k.

Read from SGLang 0.5.23 ``srt/layers/attention/dsv4/v41_indexer/sparse_table.py``
(``SparseTableBackend.publish_decode``, the scheme sm12x's gate record lets SGLang build on SM12x):
the source layer computes ``deep_gemm_fp4_paged_mqa_logits((q_fp4 [B, n, H, 64] int8, q_sf [B, n, H]
int32), k_cache [pages, 64, 1, 68], weights [B*n, H], lens [B, n] or [B], page_table [B, pages],
metadata, max_compressed_seq_len)`` -> [rows, max_compressed_seq_len] FP32 logits (DeepGEMM's
MXFP4 paged logits, the index-K pool being MXFP4), then on the main stream
``topk_transform_paged_v2(logits, seq_lens, page_table, out_page_indices, page_size, plan)`` (the
layer's own top-k, as page slots) and on a second stream ``amax_topk_blocks(logits, seq_lens,
nblocks, topk_blocks)``: per row the ``topk_blocks`` blocks of 8 positions with the largest block
maximum among its first ``seq_lens`` positions, the newest block always included, ids in no
particular order, -1 past the row's count (SGLang then sorts them). No other reader sees the logits.
The chunked form (``_publish_decode_chunked``, SGLang's row chunks) makes the same call per chunk
and reads it through the DeepSeek-V4 indexer module's ``topk_transform_paged_from_metadata`` (that
module's v1 or v2 transform, sm12x's records) and ``amax_topk_blocks``, on one stream.

``deferred_source_logits`` returns a placeholder; the transform (sm12x's
``topk_transform_paged_v2`` record, :func:`sm12x.frontends.sglang.indexer.topk_transform`) runs the
fused candidate top-k (:mod:`sm12x.kernels.indexer.candidate_topk`, blocks of 8), which also
publishes the blocks; ``amax_topk_blocks`` hands them to the second stream after an event on the
first. The same sets as SGLang's kernels, equal scores aside (theirs are unordered).
"""
from __future__ import annotations

import torch

from sm12x.frontends.deferred_logits import placeholder, state
from sm12x.kernels.common.checks import require
from sm12x.kernels.indexer.candidate_topk import paged_mqa_candidate_topk_indices
from sm12x.kernels.indexer.validation import check_paged

BLOCK = 8  # SGLang's CANDIDATE_BLOCK_SIZE


def deferred_source_logits(q_fp4, k_cache, weights, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                           topk_blocks):
    """``deep_gemm_fp4_paged_mqa_logits`` as ``publish_decode`` calls it, without the logits: a
    [rows, max_seq_len] placeholder whose top-k also publishes each row's ``topk_blocks`` blocks."""
    op = "deep_gemm_fp4_paged_mqa_logits"
    require(isinstance(q_fp4, (tuple, list)) and len(q_fp4) == 2, op, "q_fp4", type(q_fp4).__name__,
            "(values int8 [B, n, H, 64], scales int32 [B, n, H])")
    require(isinstance(topk_blocks, int) and topk_blocks >= 1, op, "topk_blocks", topk_blocks, "an int >= 1")
    qv, qs = q_fp4
    lens = seq_lens.to(torch.int32)
    if lens.dim() == 1:
        lens = lens.unsqueeze(-1)
    w = weights.float()
    cache = check_paged(op, qv, qs, k_cache, w, lens, page_table, None, max_seq_len)
    rows = qv.shape[0] * qv.shape[1]
    steps = {"blocks": torch.full((rows, topk_blocks), -1, dtype=torch.int32, device=qv.device)}

    def compute(topk, ends):
        require(ends.reshape(-1).shape[0] == rows, "topk_transform_paged_v2", "seq_lens",
                lambda: f"{ends.reshape(-1).shape[0]} rows", f"the logits call's rows ({rows})")
        out = paged_mqa_candidate_topk_indices((qv, qs), cache, w, lens, page_table, max_seq_len, topk,
                                               block_size=BLOCK, candidates=steps["blocks"], write=True)
        if qv.is_cuda:  # the blocks go to SGLang's second stream (amax_topk_blocks)
            steps["ready"] = torch.cuda.Event()
            steps["ready"].record()
        steps["done"] = True
        return out

    return placeholder(rows, max_seq_len, qv.device, compute, steps)


def amax_topk_blocks(original, logits, seq_lens, nblocks, topk_blocks, max_seq_len=None):
    """SGLang's block selection: for a placeholder, the blocks its top-k published (after the
    transform, as ``publish_decode`` orders them); SGLang's kernels for real logits."""
    st = state(logits)
    if st is None or "blocks" not in st:
        return original(logits, seq_lens, nblocks, topk_blocks, max_seq_len)
    op = "amax_topk_blocks"
    blocks = st["blocks"]
    require(topk_blocks == blocks.shape[1], op, "topk_blocks", topk_blocks,
            f"the source layer's topk_blocks ({blocks.shape[1]})")
    require(st.get("done", False), op, "logits", "a placeholder its top-k transform has not read",
            "the logits after topk_transform_paged_v2 (publish_decode's order)")
    if "ready" in st:
        stream = torch.cuda.current_stream()
        stream.wait_event(st["ready"])
        blocks.record_stream(stream)
    return blocks

"""vLLM 0.34's DeepSeek-V4.1 candidate-block steps, for the indexer's placeholder logits.

vLLM 0.34's dense indexer (``sparse_attn_indexer``, the only one SM12x runs) puts a two-level
selection between the logits and the row top-k for V4.1 layers (``candidate_blocks`` given):
the candidate source layer calls ``select_candidate_blocks(logits, row_ks, row_ke, topk_blocks,
block_size, out[, row_repeat, score_dtype=])`` to publish its best blocks into ``out`` (a view of
the model's candidate buffer), every later layer ``apply_candidate_mask(logits, row_ks, row_ke,
candidate_blocks, block_size[, row_repeat])`` before its top-k
(``vllm/model_executor/kernels/attention/dsa/candidate_blocks.py``; the indexer binds them as
``_select_candidate_blocks`` / ``_apply_candidate_mask``). Prefill passes the compressed logits
(``row_ks`` None, ``row_ke`` = ke - ks), decode the [rows, max_model_len] paged logits (``row_ks``
None, ``row_ke`` the rows' lengths).

For placeholder logits (:mod:`sm12x.frontends.deferred_logits`) these functions record the step
on the placeholder; its top-k then runs the fused candidate top-k
(:mod:`sm12x.kernels.indexer.candidate_topk`), which writes the source's candidates into the
same ``out`` and ranks a consumer's keys inside its blocks, with the semantics of vLLM's kernels
(that module's docstring). Real logits go to vLLM's functions (``original``).
"""
from __future__ import annotations

import torch

from sm12x.frontends.deferred_logits import state
from sm12x.kernels.common.checks import require, require_dtype

_INT = (torch.int32, torch.int64, torch.int16)


def _record(op, logits, st, row_ks, row_ke, blocks, block_size, row_repeat, write):
    rows = logits.shape[0]
    require(row_ks is None, op, "row_ks", "row starts", "None (the indexer's row-local logits)")
    require(row_repeat == 1, op, "row_repeat", row_repeat, "1 (one bound per logits row)")
    require(isinstance(block_size, int) and block_size >= 1, op, "block_size", block_size, "an int >= 1")
    require(isinstance(row_ke, torch.Tensor) and row_ke.shape == (rows,), op, "row_ke",
            lambda: f"shape {list(getattr(row_ke, 'shape', []))}", f"a tensor [{rows}] (the logits rows)")
    require(isinstance(blocks, torch.Tensor) and blocks.dim() == 2 and blocks.shape[0] == rows, op,
            "out" if write else "candidate_blocks", lambda: f"shape {list(getattr(blocks, 'shape', []))}",
            f"an integer tensor [{rows}, K]")
    require_dtype(blocks, _INT, op, "out" if write else "candidate_blocks")
    require("candidates" not in st, op, "logits", "logits a candidate step already read",
            "one select or mask per logits call")
    st["candidates"] = (write, blocks, block_size)


def select_candidate_blocks(original, logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat=1,
                            score_dtype=None) -> None:
    """vLLM's ``select_candidate_blocks``: for placeholder logits, ``out`` ([rows, topk_blocks])
    gets the rows' best blocks when the fused top-k runs (next, in the same indexer call)."""
    st = state(logits)
    if st is None:
        return original(logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat, score_dtype=score_dtype)
    op = "select_candidate_blocks"
    require(isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[1] == topk_blocks, op, "topk_blocks",
            topk_blocks, lambda: f"the width of out ({list(getattr(out, 'shape', []))})")
    _record(op, logits, st, row_ks, row_ke, out, block_size, row_repeat, write=True)
    return None


def apply_candidate_mask(original, logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat=1) -> None:
    """vLLM's ``apply_candidate_mask``: for placeholder logits, the fused top-k ranks only keys in
    the rows' ``candidate_blocks``."""
    st = state(logits)
    if st is None:
        return original(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat)
    _record("apply_candidate_mask", logits, st, row_ks, row_ke, candidate_blocks, block_size, row_repeat,
            write=False)
    return None

"""The factories the SGLang indexer top-k records install (:mod:`sm12x.patches.indexer_topk`).
Stdlib only at import; the API module (:mod:`sm12x.frontends.sglang.indexer`) is imported when a
patch is made.

SGLang 0.5.23's DeepSeek-V4 paged indexer: the TileLang / torch paged-logits functions return a
placeholder when ``forward_c4_indexer``'s ``run_paged_indexer`` calls them and the transforms that
read it are ours; every other call (SGLang's DSA indexers, tests, a transform left as SGLang's) gets
the real logits of sm12x's DeepGEMM-route replacement (``make_sglang_paged_logits_torch``), which
these records build on: they take the same targets and are applied first.

SGLang 0.5.23's DeepSeek-V4 non-paged prefill indexer: ``C4IndexerBackendMixin._nonpaged_mqa_logits``
returns a placeholder, and the top-k transforms that ``forward_c4_indexer`` may call next (the
``sglang.srt.layers.attention.dsv4.indexer`` module's own functions and its copies of
``topk_transform_paged`` / ``_v2``) run the fused top-k for it. Only that module's names are
replaced: the transforms in ``sglang.kernels.ops.attention.dsv4`` stay SGLang's for every other
caller.
"""
from __future__ import annotations

import functools
import sys

DSV4_INDEXER = "sglang.srt.layers.attention.dsv4.indexer"
# the transforms forward_c4_indexer's run_topk_transform may call (module globals there; the
# FlashInfer ones are bound to the backend instance from these globals at construction)
TRANSFORMS = ("topk_transform_paged", "topk_transform_paged_v2", "topk_transform_pytorch_vectorized",
              "topk_transform_flashinfer_fused", "topk_transform_flashinfer_unfused")


def _api():
    from sm12x.frontends.sglang import indexer

    return indexer


def transforms_are_ours() -> bool:
    """Every transform the indexer module binds is sm12x's (each record applied)."""
    module = sys.modules.get(DSV4_INDEXER)
    if module is None:
        return False
    bound = [getattr(module, name) for name in TRANSFORMS if hasattr(module, name)]
    return all(getattr(f, "__sm12x_patch__", None) for f in bound)


def _called_from_paged_indexer(frame) -> bool:
    """Whether a paged-logits call comes from ``forward_c4_indexer``'s ``run_paged_indexer``, whose
    logits go to one top-k transform and nowhere else."""
    return (frame is not None and frame.f_code.co_name == "run_paged_indexer"
            and frame.f_globals.get("__name__") == DSV4_INDEXER)


def make_paged_logits(original):
    """SGLang's paged-logits functions of the torch fallback's signature (TileLang, torch, torch
    SM120): a placeholder for ``run_paged_indexer`` while the transforms are ours, the DeepGEMM
    record's replacement (real logits, sm12x's kernel) otherwise."""
    from sm12x.frontends.deep_gemm.wrappers import make_sglang_paged_logits_torch

    api = _api()
    dense = make_sglang_paged_logits_torch(original)

    @functools.wraps(original)
    def paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata=None,
                         max_seq_len=None, clean_logits=True):
        if (max_seq_len is None or not _called_from_paged_indexer(sys._getframe(1))
                or not transforms_are_ours()):
            return dense(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                         clean_logits)
        return api.deferred_paged_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                         max_seq_len, clean_logits)

    return paged_mqa_logits


def make_nonpaged_mqa_logits(original):
    """``_nonpaged_mqa_logits`` (a staticmethod): a placeholder while the transforms that read it
    are ours, the original DeepGEMM logits otherwise."""
    api = _api()

    @functools.wraps(original)
    def _nonpaged_mqa_logits(*, q_indexer, weights, kv, plan, rows):
        if not transforms_are_ours():
            return original(q_indexer=q_indexer, weights=weights, kv=kv, plan=plan, rows=rows)
        return api.deferred_nonpaged_mqa_logits(q_indexer=q_indexer, weights=weights, kv=kv, plan=plan, rows=rows)

    return _nonpaged_mqa_logits


def make_topk_transform(original):
    """The ``(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None)``
    transforms."""
    api = _api()

    @functools.wraps(original)
    def topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
        if not api.topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices):
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
        return None

    return topk_transform


def make_topk_transform_v2(original):
    """``topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size,
    metadata, out_raw_indices=None)``: the plan (``metadata``) only schedules SGLang's kernel."""
    api = _api()

    @functools.wraps(original)
    def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                out_raw_indices=None):
        if not api.topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices):
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, metadata, out_raw_indices)
        return None

    return topk_transform_paged_v2

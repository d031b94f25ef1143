"""vLLM's indexer top-k calls, done by sm12x's fused logits -> top-k.

Two call shapes, read from vLLM's own sources (``vllm/model_executor/layers/sparse_attn_indexer.py``):

- vLLM 0.34 has its own fused seam, ``fused_mqa_topk_prefill(q, k, scales, weights, starts, ends,
  output)`` (``vllm/model_executor/kernels/attention/dsa/fused_mqa_topk.py``, an SM100-only CUDA op
  there): q float8 [rows, H, D], k float8 [keys, D], scales float32 [keys], weights float32
  [rows, H], starts / ends int32 [rows] (row i sees keys starts[i] <= j < ends[i]), output int32
  [rows, topk] (a view of vLLM's topk_indices_buffer). ``fused_mqa_topk_prefill`` here fills it.
- vLLM 0.30.0-0.34.0 decode: ``fp8_fp4_paged_mqa_logits((q [B, next_n, H, D], q_scale),
  kv_cache, weights [B*next_n, H], seq_lens, block_table, schedule_metadata, max_model_len=,
  [clean_logits=False (0.30.0-0.32.0) | logits_dtype= (0.34.0),] indices=)`` -> [B*next_n,
  max_model_len] logits, passed (0.33.0 on through ``as_fp32_logits``, the identity on float32)
  to ``get_indexer_topk(backend)(logits, seq_lens, next_n, topk_indices, topk, max_seq_len)``.
  ``deferred_paged_mqa_logits`` returns a placeholder and ``IndexerTopkSelector`` runs the fused
  paged top-k for it. Row (b, t) sees positions p < seq_lens[b, t] for seq_lens [B, next_n],
  p < seq_lens[b] - next_n + 1 + t for [B, 1] (vLLM's ``SparseIndexerTopk._row_ends``); indices
  are those positions, -1 padded.
- vLLM 0.22.1-0.29.0 decode: the same paged logits call (with ``clean_logits=False``), then on
  CUDA ``torch.ops._C.persistent_topk(logits, seq_lens, topk_indices, workspace, topk, max_len)``
  for topk 512 / 1024 / 2048 (0.24.0-0.29.0: ``torch.ops._C.cooperative_topk``, same arguments, for
  up to 32 rows on SM90+, outside the SM12x family from 0.25.0), ``ops.top_k_per_row_decode(logits,
  next_n, seq_lens, topk_indices, rows, stride0, stride1, topk)`` otherwise. ``decode_topk`` runs
  the fused paged top-k for a placeholder in each of them; rows and indices as above.
- vLLM 0.22.1-0.32.0 prefill chunks call ``fp8_fp4_mqa_logits((q, q_scale), (k, k_scale), weights,
  ks, ke, clean_logits=False)`` and pass the [rows, keys] logits straight to
  ``ops.top_k_per_row_prefill(logits, ks, ke, out, rows, stride0, stride1, topk)``; 0.33.0-0.34.0
  call ``fp8_fp4_mqa_logits(..., ks, ke, max_seqlen_k[, logits_dtype=])`` (DeepGEMM's compressed
  [rows, max_seqlen_k] layout) and pass starts 0, ends ke - ks (``deferred_compressed_mqa_logits``).
  ``deferred_mqa_logits`` returns a placeholder (:mod:`sm12x.frontends.deferred_logits`) and
  ``top_k_per_row_prefill`` runs the fused top-k for it.

Output convention (both, vLLM's ``top_k_per_row_prefill`` contract as 0.34 documents it for the
fused op): index j - starts[i] of the key inside the row's range, -1 padded at the end when a row
sees fewer than topk keys. Order: vLLM's kernels leave a row's indices unordered; ours come sorted
by descending score, equal scores lower index first. The set is the same except where several keys
tie at the k-th score: vLLM's radix kernels keep an unspecified subset of those, we keep the lowest
indices. The sparse attention that consumes the indices is order-independent.
"""
from __future__ import annotations

import torch

from sm12x.frontends.deep_gemm.indexer import _packed_q_scale
from sm12x.frontends.deferred_logits import pending, placeholder
from sm12x.kernels.common.checks import require, require_dtype, require_shape
from sm12x.kernels.indexer.candidate_topk import mqa_candidate_topk_indices, paged_mqa_candidate_topk_indices
from sm12x.kernels.indexer.fused_topk import mqa_topk_indices, paged_mqa_topk_indices
from sm12x.kernels.indexer.validation import check_mqa, check_paged


def fused_mqa_topk_prefill(q, k, scales, weights, starts, ends, output) -> None:
    """vLLM 0.34's fused prefill top-k: writes int32 [rows, topk] indices (relative to
    ``starts``) into ``output``; topk = output.shape[1]."""
    op = "fused_mqa_topk_prefill"
    require(isinstance(output, torch.Tensor) and output.dim() == 2, op, "output",
            lambda: type(output).__name__ if not isinstance(output, torch.Tensor) else f"shape {list(output.shape)}",
            "an int32 [rows, topk] tensor")
    mqa_topk_indices(q, (k, scales), weights, starts, ends, output.shape[1], out=output)


def fused_mqa_topk_key_scales(scales: torch.Tensor) -> torch.Tensor:
    """Per-key float32 scales from the gathered indexer cache scales ([keys, 4] uint8). On SM12x
    vLLM's indexer cache stores each scale as the four bytes of a float32 (vLLM's
    ``mqa_logits_use_mx_scales()`` is true on the SM100 family only, where the bytes are UE8M0
    exponents and vLLM's own function decodes them)."""
    op = "fused_mqa_topk_key_scales"
    require(isinstance(scales, torch.Tensor), op, "scales", type(scales).__name__, "a uint8 tensor")
    require_dtype(scales, (torch.uint8,), op, "scales")
    require_shape(scales, (None, 4), op, "scales")
    require(scales.stride(1) == 1 and scales.stride(0) == 4, op, "scales", lambda: f"strides {scales.stride()}",
            "contiguous rows of 4 bytes")
    return scales.view(torch.float32).reshape(-1)


def deferred_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=True):
    """vLLM's ``fp8_fp4_mqa_logits`` as the 0.22.1-0.32.0 prefill calls it, without computing
    the logits: returns a [rows, keys] placeholder for ``top_k_per_row_prefill``. The inputs are
    checked here, so a bad call fails where it is made."""
    op = "fp8_fp4_mqa_logits"
    require(isinstance(q, (tuple, list)) and len(q) == 2, op, "q", type(q).__name__, "(values, scale or None)")
    require(isinstance(kv, (tuple, list)) and len(kv) == 2, op, "kv", type(kv).__name__, "(k, k_scale)")
    qv, qs = q[0], _packed_q_scale(q[1])
    k, k_sf = kv
    if qs is not None:
        k = k.view(torch.int8)
    check_mqa(op, qv, qs, k, k_sf, weights, cu_seqlen_ks, cu_seqlen_ke)

    def compute(topk, out, starts, ends, candidates=None, width=None):
        require(starts.shape == cu_seqlen_ks.shape and ends.shape == cu_seqlen_ke.shape,
                "top_k_per_row_prefill", "cu_seqlen_ks", lambda: f"shape {list(starts.shape)}",
                lambda: f"the logits call's rows [{qv.shape[0]}]")
        if candidates is None:
            mqa_topk_indices((qv, qs), (k, k_sf), weights, starts, ends, topk, out=out)
        else:  # DeepSeek-V4.1's candidate step recorded on the placeholder (sm12x.frontends.vllm.candidates)
            write, blocks, block_size = candidates
            mqa_candidate_topk_indices((qv, qs), (k, k_sf), weights, starts, ends, topk, width=width,
                                       block_size=block_size, candidates=blocks, write=write, out=out)

    return placeholder(qv.shape[0], k.shape[0], qv.device, compute)


def deferred_compressed_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
    """vLLM 0.33.0-0.34.0's ``fp8_fp4_mqa_logits(q, kv, weights, ks, ke, max_seqlen_k)`` without the
    logits: a [rows, max_seqlen_k] placeholder of DeepGEMM's compressed layout (row i's column c is
    key ks[i] + c). vLLM passes those logits to ``top_k_per_row_prefill`` with starts 0 and ends
    ke - ks, so its indices c are the flat layout's j - ks: the fused top-k over this call's
    [ks, ke)."""
    require(isinstance(max_seqlen_k, int) and max_seqlen_k >= 0, "fp8_fp4_mqa_logits", "max_seqlen_k",
            max_seqlen_k, "an int >= 0")
    flat = pending(deferred_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke))
    steps = {}  # a V4.1 candidate step (select / mask) between this call and the top-k

    def compute(topk, out, starts, ends):
        flat(topk, out, cu_seqlen_ks, cu_seqlen_ke, candidates=steps.get("candidates"), width=max_seqlen_k)

    return placeholder(cu_seqlen_ks.shape[0], max_seqlen_k, cu_seqlen_ks.device, compute, steps)


def top_k_per_row_prefill(original, logits, cu_seqlen_ks, cu_seqlen_ke, raw_topk_indices, num_rows,
                          stride0, stride1, topk_tokens) -> None:
    """``ops.top_k_per_row_prefill``: the fused top-k for a placeholder from
    ``deferred_mqa_logits``, vLLM's own kernel (``original``) for real logits."""
    compute = pending(logits)
    if compute is None:
        return original(logits, cu_seqlen_ks, cu_seqlen_ke, raw_topk_indices, num_rows, stride0, stride1,
                        topk_tokens)
    op = "top_k_per_row_prefill"
    require(num_rows == logits.shape[0], op, "num_rows", num_rows, lambda: f"the logits rows ({logits.shape[0]})")
    require(isinstance(topk_tokens, int) and raw_topk_indices.shape[-1] >= topk_tokens, op, "topk_tokens",
            topk_tokens, lambda: f"an int <= the index buffer's width ({raw_topk_indices.shape[-1]})")
    compute(topk_tokens, raw_topk_indices[:, :topk_tokens], cu_seqlen_ks, cu_seqlen_ke)
    return None


def decode_topk(op, compute, topk_indices, topk_tokens) -> None:
    """A decode top-k reader given placeholder logits: the fused paged top-k (``compute`` from
    ``deferred_paged_mqa_logits``) into the reader's index buffer ``topk_indices`` ([rows, >= topk])."""
    require(isinstance(topk_tokens, int) and 1 <= topk_tokens <= topk_indices.shape[-1], op, "topk_tokens",
            topk_tokens, lambda: f"an int from 1 to the index buffer's width ({topk_indices.shape[-1]})")
    compute(topk_tokens, topk_indices[:, :topk_tokens])


def top_k_per_row_decode(original, logits, next_n, seq_lens, topk_indices, num_rows, stride0, stride1,
                         topk_tokens) -> None:
    """``ops.top_k_per_row_decode`` (vLLM 0.22.1-0.29.0): the fused paged top-k for a placeholder
    from ``deferred_paged_mqa_logits``, vLLM's kernel (``original``) for real logits."""
    compute = pending(logits)
    if compute is None:
        return original(logits, next_n, seq_lens, topk_indices, num_rows, stride0, stride1, topk_tokens)
    op = "top_k_per_row_decode"
    require(num_rows == logits.shape[0], op, "num_rows", num_rows, lambda: f"the logits rows ({logits.shape[0]})")
    decode_topk(op, compute, topk_indices, topk_tokens)
    return None


def radix_topk(original, logits, seq_lens, topk_indices, workspace, topk_tokens, max_seq_len) -> None:
    """``torch.ops._C.persistent_topk`` / ``cooperative_topk`` as vLLM 0.22.1-0.29.0's decode calls
    them: the fused paged top-k for a placeholder (the workspace and ``max_seq_len``, a bound on
    the rows' lengths, are not needed: the placeholder carries the call's lengths), vLLM's kernel
    (``original``) for real logits."""
    compute = pending(logits)
    if compute is None:
        return original(logits, seq_lens, topk_indices, workspace, topk_tokens, max_seq_len)
    decode_topk(getattr(original, "__name__", "persistent_topk"), compute, topk_indices, topk_tokens)
    return None


def deferred_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len,
                              indices=None):
    """vLLM's decode ``fp8_fp4_paged_mqa_logits`` without computing the logits: a [B*next_n,
    max_model_len] placeholder for the decode top-k readers (0.30.0-0.34.0: ``IndexerTopkSelector``;
    0.22.1-0.29.0: ``radix_topk``, ``top_k_per_row_decode``). ``indices`` (SM100 varlen rows) only
    shapes DeepGEMM's schedule; the rows carry their own lengths."""
    op = "fp8_fp4_paged_mqa_logits"
    require(isinstance(q, (tuple, list)) and len(q) == 2, op, "q", type(q).__name__, "(values, scale or None)")
    qv, qs = q[0], _packed_q_scale(q[1])
    require(isinstance(context_lens, torch.Tensor), op, "context_lens", type(context_lens).__name__, "an int32 tensor")
    if qv.dim() == 4 and context_lens.dim() == 2 and context_lens.shape[1] == 1 and qv.shape[1] > 1:
        # [B, 1] with next_n > 1: each request's length, rows (b, t) ending at len - next_n + 1 + t
        context_lens = context_lens[:, 0].contiguous()
    check_paged(op, qv, qs, kv_cache, weights, context_lens, block_tables, None, max_model_len)
    rows = qv.shape[0] * qv.shape[1]
    steps = {}  # a V4.1 candidate step (select / mask) between this call and the top-k

    def compute(topk, out):
        candidates = steps.get("candidates")
        if candidates is None:
            paged_mqa_topk_indices((qv, qs), kv_cache, weights, context_lens, block_tables, max_model_len, topk,
                                   out=out)
            return
        write, blocks, block_size = candidates
        paged_mqa_candidate_topk_indices((qv, qs), kv_cache, weights, context_lens, block_tables, max_model_len,
                                         topk, block_size=block_size, candidates=blocks, write=write, out=out)

    return placeholder(rows, max_model_len, qv.device, compute, steps)


class IndexerTopkSelector:
    """vLLM's decode top-k selector (``get_indexer_topk(backend)``) as the indexer sees it:
    placeholder logits get the fused paged top-k, real ones vLLM's selector; every other
    attribute is the selector's own."""

    def __init__(self, selector):
        self.__sm12x_selector__ = selector

    def __getattr__(self, name):
        return getattr(self.__sm12x_selector__, name)

    def __call__(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len):
        compute = pending(logits)
        if compute is None:
            return self.__sm12x_selector__(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)
        decode_topk("indexer_topk", compute, topk_indices, topk_tokens)
        return None

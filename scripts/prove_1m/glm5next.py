"""GLM-5-next's pool indexer through vLLM 0.34.0's own module (``--glm5next``).

What runs as vLLM's code: ``vllm/models/glm5next/sparse_indexer.py`` (the platform switch: it
picks ``nvidia/sparse_indexer.py`` off ROCm), ``nvidia/sparse_indexer.py`` itself
(``SparseAttnIndexerKpool``: its ``forward_cuda`` and ``sparse_attn_indexer_kpool``, prefill and
decode), ``common/sparse_indexer.py`` (its shared helpers) and ``nvidia/ops/kpool_compress.py``
(its Triton pool expansion, ``expand_pools_and_append_tail``; the kernels that write the pool
cache and its tail are not run: the cache is written beforehand), beside the modules the V3.2 passes
run (``sparse_attn_indexer``: ``as_fp32_logits``, ``_merge_dcp_topk_global``; ``indexer_topk``:
``get_indexer_topk``; ``fused_mqa_topk``: the fused seam). Stand-ins, besides those listed in
:mod:`prove_1m.stand_ins`:

- ``torch.ops._C.top_k_per_row_prefill`` (vLLM's compiled top-k over a dense prefill chunk's
  logits, which this module looks up through ``torch.ops`` rather than ``_custom_ops``):
  ``logits_topk``, the same selection;
- vLLM's config is absent (``get_current_vllm_config_or_none`` answers None), so the op takes
  its defaults: top-k backend "auto", FP32 logits, no DCP;
- ``pack_seq_triton`` / ``unpack_seq_triton`` / ``pack_ue8m0_x4`` are not provided: the passes
  are uniform decode (next_n 1) with the pool cache already written (``skip_k_cache_insert``),
  so none is called.

Shapes (GLM-5-next's config is not in the wheel; the model code gives the constraints):
``--index-kpool`` tokens per pool (default 4: GLM-5.3-Flash's published ``index_kpool``), the
``--heads`` x ``--dim`` indexer (default 64 x 128, ``common/attention.py``'s comment; a 16-head
checkpoint is zero-padded to 32 heads before this op), top-``--topk`` tokens (2048, which
FlashInfer's sparse MLA requires), i.e. ``topk // kpool`` pools expanded to their tokens plus the
row's incomplete tail pool: ``topk + kpool - 1`` indices a row in a buffer ``round_up(topk +
kpool - 1, 128)`` wide (``get_sparse_topk_buffer_width``).

Keys are pools (indexer keys: one cache entry per ``kpool`` tokens). A context of ``keys``
pools is ``keys * kpool + kpool - 1`` tokens (its last row ends in a full tail): the prefill
chunk is its last ``--queries`` tokens (token p sees pools [0, (p + 1) // kpool), vLLM's
compressed row ends), decode request b is ``7 b`` tokens shorter (distinct tails).
``max_pool_len`` (the decode logits' width, ``max_model_len // kpool`` in a server) is the
context's pool count, as the V3.2 passes take ``max_model_len`` = keys.

The patched and unpatched indices must agree: the tail columns exactly, the history columns as
sets of whole pools, a differing pool allowed only where it ties with the row's (topk //
kpool)-th reference pool score (``sm12x.kernels.indexer.reference``); rows spread over each pass
are also checked against the reference alone (``compare_glm5next``). The dense-prefill pass
(``VLLM_USE_FUSED_MQA_TOPK=0``) shows the path the fused seam leaves to layers it does not take:
vLLM's top-k over real logits, patched and not.
"""
from __future__ import annotations

import sys
import types

from prove_1m.common import BLOCK, RUN, TIE_TOL, block_table, forward_context, logits_topk
from prove_1m.stand_ins import VllmDecodeMetadata, VllmIndexerMetadata

MODULE = "vllm.models.glm5next.sparse_indexer"  # the switch vLLM's model imports


def tokens_of(keys, kpool):
    """Tokens of a context of ``keys`` complete pools whose last row ends in a full tail."""
    return keys * kpool + kpool - 1


def buffer_width(topk, kpool):
    """vLLM's topk_indices_buffer width for GLM-5-next (``get_sparse_topk_buffer_width``)."""
    return -(-(topk + kpool - 1) // 128) * 128


def _register_prefill_topk():
    """torch.ops._C.top_k_per_row_prefill: vLLM's compiled top-k over dense prefill logits,
    which GLM-5-next's module calls through torch.ops (the indices relative to the row start)."""
    import torch

    if hasattr(torch.ops._C, "top_k_per_row_prefill"):
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("top_k_per_row_prefill(Tensor logits, Tensor row_starts, Tensor row_ends, Tensor(a!) indices, "
               "int num_rows, int stride0, int stride1, int topk) -> ()")

    def top_k_per_row_prefill(logits, row_starts, row_ends, indices, num_rows, stride0, stride1, topk):
        logits_topk(logits[:num_rows], topk, row_ends[:num_rows], row_starts[:num_rows], out=indices[:num_rows, :topk])

    lib.impl("top_k_per_row_prefill", top_k_per_row_prefill, "CompositeExplicitAutograd")
    _register_prefill_topk.lib = lib  # the library lives as long as the process


def _geometry(kind, keys, kpool, rows, device):
    """(token positions, pool ends) of the pass's rows: int64 [rows], int32 [rows]."""
    import torch

    tokens = tokens_of(keys, kpool)
    if kind.startswith("prefill"):
        positions = torch.arange(tokens - rows, tokens, dtype=torch.int64, device=device)
    else:
        positions = (tokens - 1 - 7 * torch.arange(rows, dtype=torch.int64, device=device)).clamp(min=0)
    return positions, ((positions + 1) // kpool).to(torch.int32)


def glm5next_pass(module, kind, inputs, keys, topk, kpool):
    """A call running GLM-5-next's ``SparseAttnIndexerKpool`` (``module``: vLLM's
    ``models/glm5next/sparse_indexer``) as its attention layer does, for ``kind``
    "prefill-glm5next" (one chunk: the context's last rows), "prefill-dense-glm5next" (the same
    with ``VLLM_USE_FUSED_MQA_TOPK=0``: the module's dense prefill, which keeps real logits
    patched too) or "decode-glm5next" (next_n 1) at ``keys`` pools; it returns the op's index
    buffer columns, int32 [rows, topk + kpool - 1] (token positions: the selected pools' tokens,
    then the row's tail tokens, -1 padded)."""
    import torch


    _register_prefill_topk()
    device = inputs.cache.device
    prefill = kind.startswith("prefill")
    q, w = (inputs.q_prefill, inputs.w_prefill) if prefill else (inputs.q_decode, inputs.w_decode)
    rows, _, dim = q.shape
    tokens = tokens_of(keys, kpool)
    positions, pool_ends = _geometry(kind, keys, kpool, rows, device)
    width = topk + kpool - 1
    buffer = torch.full((rows, buffer_width(topk, kpool)), -7, dtype=torch.int32, device=device)
    if prefill:
        chunk = types.SimpleNamespace(
            cu_seqlen_ks=torch.zeros(rows, dtype=torch.int32, device=device), cu_seqlen_ke=pool_ends,
            local_cu_seq_lens=torch.tensor([0, keys], dtype=torch.int32, device=device),
            max_local_total_seq_lens=keys, local_total_seq_lens=keys, skip_kv_gather=False,
            block_table=block_table(keys, 1, device), token_start=0, token_end=rows, pcp_deinterleave_idx=None,
            max_seqlen_k=keys)
        metadata = VllmIndexerMetadata(
            slot_mapping=torch.zeros(rows, dtype=torch.int64, device=device), num_decodes=0, num_decode_tokens=0,
            num_prefills=1, decode=None, max_seq_len=tokens,
            prefill=types.SimpleNamespace(chunks=[chunk], shardq_gather_indices=None, max_prefill_seq_len=tokens))
    else:
        from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata

        lens = pool_ends[:, None].contiguous()  # [B, 1] pools: next_n = 1
        decode = VllmDecodeMetadata(
            decode_lens=torch.ones(rows, dtype=torch.int32, device=device), requires_padding=False, seq_lens=lens,
            block_table=block_table(keys, rows, device), indices=None, per_req_decode_lens=None,
            schedule_metadata=get_paged_mqa_logits_metadata(lens, BLOCK, 132))
        metadata = VllmIndexerMetadata(slot_mapping=torch.zeros(rows, dtype=torch.int64, device=device),
                                       num_decodes=rows, num_decode_tokens=rows, num_prefills=0, prefill=None,
                                       decode=decode, max_seq_len=tokens)
    RUN.forward_context = forward_context(metadata, device)
    k_cache = types.SimpleNamespace(prefix="indexer", kv_cache=inputs.cache.squeeze(2))  # [pages, 64, dim + 4]
    op = module.SparseAttnIndexerKpool(k_cache, 128, "ue8m0", topk, dim, keys, keys, buffer,
                                       skip_k_cache_insert=True, use_fp4_cache=False, tail_cache=None)
    hidden = torch.empty(rows, 1, device=device)
    envs = sys.modules["vllm.envs"]
    fused = "dense" not in kind

    def call():
        envs.VLLM_USE_FUSED_MQA_TOPK = fused  # read by use_fused_mqa_topk (vLLM's and sm12x's) per call
        try:
            op.forward_cuda(hidden, q, None, w, index_kpool=kpool, positions=positions)
        finally:
            envs.VLLM_USE_FUSED_MQA_TOPK = True
        return buffer[:, :width]

    return call


SAMPLE_ROWS = 32  # rows of a pass (spread over it) also checked against the reference alone


def _pools(x, topk, kpool):
    """(pool ids int [rows, topk // kpool], -1 for empty slots; bool [rows]: every history column
    group is a whole pool, its ``kpool`` tokens in order, or all -1)."""
    import torch

    groups = x[:, :topk].reshape(x.shape[0], topk // kpool, kpool)
    first = groups[:, :, :1]
    offsets = torch.arange(kpool, device=x.device, dtype=x.dtype)
    whole = torch.where(first >= 0, first + offsets, torch.full_like(groups, -1))
    ok = (groups == whole).all(dim=(1, 2)) & ((first < 0) | (first % kpool == 0)).all(dim=(1, 2))
    return torch.where(first[:, :, 0] >= 0, first[:, :, 0] // kpool, -1), ok


def compare_glm5next(kind, inputs, keys, got, want, topk, kpool):
    """Rows of (sm12x's, the unpatched op's) indices [rows, topk + kpool - 1]: (same, tied,
    wrong). A row is wrong when its history columns are not whole pools (``_pools``), its tail
    columns are not its incomplete pool's tokens (``tails_wrong``) or differ from the unpatched
    run's, its pool set differs from the unpatched run's by a pool not within ``TIE_TOL`` of the
    row's (topk // kpool)-th reference pool score (``sm12x.kernels.indexer.reference``), or, for
    the rows checked against the reference alone (those that differ and ``SAMPLE_ROWS`` spread
    over the pass: what catches a fault both runs share), it does not hold min(topk // kpool,
    visible pools) visible pools all scoring at least that k-th score (less the tie tolerance and
    ``reference.HEAD_SUM_TOL``, the logits kernels' stated rounding, of the larger of those
    pools' and the k-th pool's score sizes)."""
    import torch

    from sm12x.kernels.indexer.cache import dequant_paged_cache
    from sm12x.kernels.indexer.reference import HEAD_SUM_TOL, ref_logit_sizes, ref_mqa_logits

    select, rows, device = topk // kpool, got.shape[0], got.device
    got_pools, got_ok = _pools(got, topk, kpool)
    want_pools, want_ok = _pools(want, topk, kpool)
    bad = ~got_ok | ~want_ok | tails_wrong(kind, keys, got, topk, kpool) | (got[:, topk:] != want[:, topk:]).any(1)
    differ = (torch.sort(got_pools, dim=1).values != torch.sort(want_pools, dim=1).values).any(dim=1)
    sample = torch.linspace(0, rows - 1, min(rows, SAMPLE_ROWS), device=device).round().long()
    checked = torch.zeros(rows, dtype=torch.bool, device=device)
    checked[sample] = True
    check = ((differ | checked) & ~bad).nonzero().flatten().tolist()
    q, w = (inputs.q_prefill, inputs.w_prefill) if kind.startswith("prefill") else (inputs.q_decode, inputs.w_decode)
    _, ends = _geometry(kind, keys, kpool, rows, device)
    dim = q.shape[-1]
    k = dequant_paged_cache(inputs.cache[:-(-keys // BLOCK)], dim, fp4=False).reshape(-1, dim)[:keys]
    ties = 0
    for i in range(0, len(check), 64):  # reference pool scores for 64 rows at a time
        part = check[i:i + 64]
        idx = torch.tensor(part, device=device)
        zero = torch.zeros(len(part), dtype=torch.int32, device=device)
        scores = ref_mqa_logits(q[idx].float(), k, torch.ones(keys, device=device), w[idx], zero, ends[idx])
        # sum_h |w_h| relu(q_h . k): the scale of a kernel's rounding error in a pool's score
        sizes = ref_logit_sizes(q[idx].float(), k, torch.ones(keys, device=device), w[idx], zero, ends[idx])
        for s, size, row in zip(scores, sizes, part):
            visible = int(torch.isfinite(s).sum())
            n = min(select, visible)
            top = torch.topk(s, n) if n else None
            kth = top.values[-1] if n else s.new_tensor(0.0)
            tol = TIE_TOL * kth.abs().clamp(min=1e-6)
            mine, theirs = set(got_pools[row].tolist()) - {-1}, set(want_pools[row].tolist()) - {-1}
            if not all(0 <= p < keys for p in mine | theirs):  # a pool past the cache
                bad[row] = True
                continue
            held = torch.tensor(sorted(mine), device=device, dtype=torch.long)
            # against the reference alone a kernel's picks may differ by its stated rounding
            # (HEAD_SUM_TOL of the scores' size); between the two runs only by a tie
            near = torch.cat([held, top.indices[-1:]]) if n else held
            slack = HEAD_SUM_TOL * size[near].clamp(min=0).max() if near.numel() else 0.0
            right = len(mine) == n and bool((s[held] >= kth - tol - slack).all())
            extra = torch.tensor(sorted(mine ^ theirs), device=device, dtype=torch.long)
            tied = len(mine) == len(theirs) and bool(((s[extra] - kth).abs() <= tol).all())
            if not (right and tied):
                bad[row] = True
            elif differ[row]:
                ties += 1
    return rows - int((differ | bad).sum()), ties, int(bad.sum())


def tails_wrong(kind, keys, got, topk, kpool):
    """bool [rows]: the row's tail columns are not its incomplete pool's tokens [(p + 1) //
    kpool * kpool, p + 1), -1 padded (what the op's expansion must append)."""
    import torch

    positions, ends = _geometry(kind, keys, kpool, got.shape[0], got.device)
    cols = torch.arange(kpool - 1, device=got.device)
    tail = ends.long()[:, None] * kpool + cols
    want = torch.where(tail <= positions[:, None], tail, -1).to(torch.int32)
    return (got[:, topk:] != want).any(dim=1)

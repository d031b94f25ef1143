"""SGLang's DeepSeek-V4 C4 indexer and DSA indexer done by sm12x's fused logits -> top-k.

Paged route (every batch on SM120 by default: SGLang 0.5.20-0.5.23's model hook sets
``SGLANG_OPT_USE_TILELANG_INDEXER`` and ``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH`` there, which also turns
off the logits budget's row chunking): ``forward_c4_indexer``'s ``run_paged_indexer`` calls the
TileLang or torch paged logits (DeepGEMM's ``fp8_paged_mqa_logits`` when both are turned off, then
per row chunk of the indexer metadata), ``fn(q [rows, 1, H, 128], cache [pages, 64, 1, 132], weights
[rows, H], seq_lens, page_table [rows, pages], metadata, max_compressed_seq_len, False)`` ->
[rows, max_compressed_seq_len] float32 for every query row of the batch at once (8 GiB for an
8K-token prefill chunk at a 1M-token prompt), then one top-k transform. Each row is one query
seeing positions p < seq_lens[row]. ``deferred_paged_logits`` returns a placeholder for it.

Non-paged route. Read from SGLang 0.5.21-0.5.23 ``srt/layers/attention/dsv4/indexer.py``: for an extend batch of one
request (``C4IndexerBackendMixin._get_nonpaged_indexer_plan``: the long-prompt case, on by default
through ``SGLANG_OPT_DSV4_NONPAGED_INDEXER``), ``forward_c4_indexer`` gathers the request's
compressed index keys once and, per row chunk, calls ``_nonpaged_mqa_logits(q_indexer=, weights=,
kv=(k fp8 [N, 128], scale fp32 [N]), plan=, rows=)`` -> DeepGEMM's ``fp8_mqa_logits`` ([rows,
max_seqlen_k] float32; the chunk has no row cap when the plan has no logits budget, e.g. 8,192 rows
x 262,144 keys = 8 GiB at a 1M-token prompt) and passes the logits straight to one top-k transform
(``topk_transform_paged`` / ``_v2`` / the torch or FlashInfer ones), all with the arguments
``(scores, seq_lens, page_tables, out_page_indices, page_size[, plan], out_raw_indices)``.

``deferred_nonpaged_mqa_logits`` returns a placeholder (:mod:`sm12x.frontends.deferred_logits`);
``topk_transform`` computes, for it, what SGLang's transforms write (from the vectorised torch
fallback ``_topk_transform_vectorized``): per row with seq_len > topk the topk best positions p <
seq_len; rows with seq_len <= topk take positions 0..seq_len-1 in order; -1 after them. Positions go
to ``out_raw_indices`` when given, and as page slots (page_tables[row, p // page_size] * page_size +
p % page_size, -1 kept) to ``out_page_indices`` (positions when ``page_tables`` is None, as the v2
kernel does). Order: SGLang's transforms are unordered (``sorted=False``); ours come best first,
equal scores lower position first; the set differs only among keys tied at the k-th score.

DSA (DeepSeek-V3.2 / GLM-5) ragged prefill, read from SGLang 0.5.15-0.5.23 (quoted: 0.5.23)
``srt/layers/attention/dsa/dsa_indexer.py`` (``DSAIndexer._get_topk_ragged``) and
``dsa_topk_backend.py``: per extend batch (or per row chunk under the logits budget) the indexer
calls ``resolve_fp8_mqa_logits_fn()(q [rows, H, 128] fp8, (k fp8 [N, 128], scale fp32 [N]),
weights [rows, H], ks, ke, clean_logits=False)`` -> [rows, N] float32 and passes them to
``metadata.topk_transform`` -> ``DSATopKBackend.topk_transform(logits, lengths, topk, method,
attn_metadata, cu_seqlens_q_topk, topk_indices_offset, row_starts, batch_idx_list,
force_unfused_topk)``. Row i ranks columns row_starts[i] <= j < row_starts[i] + lengths[i]; the
result is j - row_starts[i] (``_topk_unfused``, SGLang's torch top-k, -1 padded); the fused RAGGED transform adds
``topk_indices_offset[i]`` (``fast_topk_transform_ragged_fused``), the fused PAGED one maps it
through the page_size=1 table of the row's request (``fast_topk_transform_fused``).
``deferred_dsa_mqa_logits`` returns a placeholder and ``dsa_topk_transform`` computes those for
it; order and ties as above.

DSA decode and MTP verify, read from SGLang 0.5.15-0.5.23 ``DSAIndexer._get_topk_paged``: one
query row per decode request, next_n rows per request in target verify / draft extend. CUDA
computes DeepGEMM's paged logits through ``deepgemm_paged_mqa_logits_split(fn, q [rows, H, 128],
cache [pages, 64, 1, 132], weights [rows, H], ctx_lens, block_tables [rows, pages], schedule,
max_seq_len, q_offset=)`` (each row its own request: ``fn(q[:q_offset].unsqueeze(1), ...)``) or,
for verify with [B, next_n] context lengths, ``deepgemm_paged_mqa_logits_native(..., q_offset=,
B=, next_n=)`` (``fn(q.view(B, next_n, H, D), ..., block_tables[::next_n])``); 0.5.20 on passes a
``fn`` that splits the rows by SM count and concatenates. Row i's logits are positions p <
ctx_lens[i] of its request; ``metadata.topk_transform(logits, topk)`` ranks logits[i, :lengths[i]]
(lengths = ``get_seqlens_expanded()``) with the PAGED transform: sgl-kernel's v2 kernel (the
indexer's own page table: ``real_page_table[i, p // page_size] * page_size + p % page_size``) when
its shape rule holds, else ``fast_topk_transform_fused`` (``page_table_1`` row i when it has a row
per logits row, else the row's request from cu_seqlens_q), FlashInfer's page-table transform, or
the unfused top-k (positions). ``deferred_dsa_paged_logits`` returns a placeholder and
``dsa_topk_transform`` computes those for it (each row over positions < min(ctx_lens[i],
lengths[i])). sgl-kernel's transforms write a row that sees no more than topk keys as positions
0..n-1 in order, and so do ours; longer rows come best first, equal scores lower position first.
"""
from __future__ import annotations

import torch

from sm12x.frontends.deferred_logits import pending, placeholder
from sm12x.kernels.common.checks import require, require_dtype
from sm12x.kernels.indexer.fused_topk import mqa_topk_indices, paged_mqa_topk_indices, row_ends
from sm12x.kernels.indexer.validation import check_mqa, check_paged


def deferred_nonpaged_mqa_logits(*, q_indexer, weights, kv, plan, rows):
    """``C4IndexerBackendMixin._nonpaged_mqa_logits`` without the logits: a [rows, max_seqlen_k]
    placeholder for the top-k transform that follows. Inputs are checked here."""
    op = "_nonpaged_mqa_logits"
    require(isinstance(kv, (tuple, list)) and len(kv) == 2, op, "kv", type(kv).__name__, "(k, k_scale)")
    q, w = q_indexer[rows], weights[rows]
    k, k_sf = kv
    check_mqa(op, q, None, k, k_sf, w, plan.ks[rows], plan.ke[rows])

    def compute(topk, seq_lens):
        ends = seq_lens.reshape(-1)
        require(ends.shape[0] == q.shape[0], "topk_transform", "seq_lens", lambda: f"{ends.shape[0]} rows",
                lambda: f"the logits call's rows ({q.shape[0]})")
        ends = ends.to(torch.int32).clamp(0, k.shape[0]).contiguous()
        starts = torch.zeros_like(ends)
        return mqa_topk_indices(q, (k, k_sf), w, starts, ends, topk)

    return placeholder(q.shape[0], plan.max_seqlen_k, q.device, compute)


def deferred_paged_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                          clean_logits=True):
    """SGLang's paged-logits functions (TileLang, torch, torch SM120, and DeepGEMM's
    ``fp8_paged_mqa_logits`` when those are off: one argument order) without the logits: a [rows,
    max_seq_len] placeholder for the top-k transform that follows."""
    op = "paged_mqa_logits"
    require(isinstance(q_fp8, torch.Tensor) and q_fp8.dim() == 4 and q_fp8.shape[1] == 1, op, "q_fp8",
            lambda: f"shape {list(getattr(q_fp8, 'shape', []))}", "[rows, 1, heads, head_dim] (one query per row)")
    lens = seq_lens.reshape(-1).to(torch.int32).contiguous()
    cache = check_paged(op, q_fp8, None, kvcache_fp8, weight, lens, page_table, None, max_seq_len)

    def compute(topk, ends):
        ends = ends.reshape(-1)
        require(ends.shape[0] == q_fp8.shape[0], "topk_transform", "seq_lens", lambda: f"{ends.shape[0]} rows",
                lambda: f"the logits call's rows ({q_fp8.shape[0]})")
        ends = ends.to(torch.int32).clamp(0, max_seq_len).contiguous()
        return paged_mqa_topk_indices(q_fp8, cache, weight, ends, page_table, max_seq_len, topk)

    return placeholder(q_fp8.shape[0], max_seq_len, q_fp8.device, compute)


def write_page_indices(positions, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
    """SGLang's transform output from the top-k positions (int32 [rows, topk], -1 padded)."""
    op = "topk_transform"
    require_dtype(out_page_indices, (torch.int32, torch.int64), op, "out_page_indices")
    require(isinstance(page_size, int) and page_size >= 1, op, "page_size", page_size, "an int >= 1")
    topk = positions.shape[1]
    lens = seq_lens.reshape(-1, 1).to(torch.int32)
    seq = torch.arange(topk, dtype=torch.int32, device=positions.device)[None, :]
    positions = torch.where(lens <= topk, torch.where(seq < lens, seq, -1), positions)
    if out_raw_indices is not None:
        out_raw_indices.copy_(positions)
    if page_tables is None:
        out_page_indices.copy_(positions)
        return
    p = positions.clamp(min=0).long()
    slots = page_tables.gather(1, p // page_size).long() * page_size + p % page_size
    out_page_indices.copy_(torch.where(positions >= 0, slots, -1))


def topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None) -> bool:
    """One of SGLang's DeepSeek-V4 top-k transforms for placeholder ``scores``: the fused top-k and
    ``write_page_indices``; returns False (nothing done) for real logits."""
    compute = pending(scores)
    if compute is None:
        return False
    positions = compute(out_page_indices.shape[1], seq_lens)
    write_page_indices(positions, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
    return True


def deferred_dsa_mqa_logits(q, kv, weights, ks, ke):
    """DeepGEMM's ``fp8_mqa_logits`` as SGLang's DSA ragged prefill calls it, without the logits:
    a [rows, N] placeholder for ``dsa_topk_transform``. Inputs are checked here."""
    op = "fp8_mqa_logits"
    require(isinstance(kv, (tuple, list)) and len(kv) == 2, op, "kv", type(kv).__name__, "(k, k_scale)")
    k, k_sf = kv
    check_mqa(op, q, None, k, k_sf, weights, ks, ke)

    def compute(topk, row_starts, lengths):
        lengths = lengths.reshape(-1).to(torch.int32)
        require(lengths.shape == ke.shape, "topk_transform", "lengths", lambda: f"{lengths.shape[0]} rows",
                lambda: f"the logits call's rows ({q.shape[0]})")
        starts = torch.zeros_like(lengths) if row_starts is None else row_starts.reshape(-1).to(torch.int32)
        ends = starts + lengths.clamp(min=0)
        return mqa_topk_indices(q, (k, k_sf), weights, starts.contiguous(), ends.contiguous(), topk)

    return placeholder(q.shape[0], k.shape[0], q.device, compute)


def deferred_dsa_paged_logits(q, kv_cache, weights, context_lens, block_table, max_seq_len):
    """DeepGEMM's ``fp8_paged_mqa_logits`` as SGLang's DSA ``_get_topk_paged`` calls it (through
    its split / native wrappers: q [B, next_n, H, D] FP8, cache [pages, block, 1, D + 4], weights
    [B * next_n, H], context_lens [B, next_n] or [B], block_table [B, pages]), without the logits:
    a [B * next_n, max_seq_len] placeholder for ``dsa_topk_transform``. Inputs are checked here."""
    op = "fp8_paged_mqa_logits"
    cache = check_paged(op, q, None, kv_cache, weights, context_lens, block_table, None, max_seq_len)
    b, next_n = q.shape[0], q.shape[1]
    rows = b * next_n
    visible = row_ends(context_lens, next_n, max_seq_len)

    def compute(topk, row_starts, lengths):
        require(row_starts is None, "topk_transform", "row_starts", "a tensor",
                "None (paged logits: every row starts at its request's first key)")
        lengths = lengths.reshape(-1)
        require(lengths.shape[0] == rows, "topk_transform", "lengths", lambda: f"{lengths.shape[0]} rows",
                lambda: f"the logits call's rows ({rows})")
        # the logits hold positions < ctx_lens; the top-k reads the first `lengths` of them
        ends = torch.minimum(lengths.to(torch.int32).clamp(0, max_seq_len), visible)
        return paged_mqa_topk_indices(q, cache, weights, ends.view(b, next_n).contiguous(), block_table,
                                      max_seq_len, topk)

    return placeholder(rows, max_seq_len, q.device, compute)


def _in_order_when_short(local, lengths):
    """Rows that see no more than topk keys as positions 0..n-1 in order, -1 after them (what
    sgl-kernel's DSA transforms write for such rows)."""
    topk = local.shape[1]
    n = lengths.reshape(-1, 1).to(torch.int32)
    seq = torch.arange(topk, dtype=torch.int32, device=local.device)[None, :]
    return torch.where(n <= topk, torch.where(seq < n, seq, -1), local)


def dsa_topk_transform(original, logits, lengths, topk, fused, topk_transform_method, attn_metadata=None,
                       cu_seqlens_q_topk=None, topk_indices_offset=None, row_starts=None, batch_idx_list=None,
                       force_unfused_topk=False, *, backend="sgl-kernel", v2=False):
    """``DSATopKBackend.topk_transform`` for placeholder logits from ``deferred_dsa_mqa_logits`` /
    ``deferred_dsa_paged_logits`` (``fused``: SGLANG_DSA_FUSE_TOPK; ``backend``: the
    DSATopKBackend's value; ``v2``: whether SGLang's v2 kernel may take the call). The row-local
    top-k (unfused); plus ``topk_indices_offset`` (fused RAGGED); fused PAGED: through the
    indexer's page table (``real_page_table``, ``attn_metadata.page_size``) where SGLang's v2
    rule takes the call (``v2``, no row_starts / batch_idx_list, 0 < topk <= 2048, one table row
    per logits row), else through the page_size=1 table (``page_table_1``, or its
    ``batch_idx_list`` rows): row i of it when the table has a row per logits row and no
    row_starts (sgl-kernel's decode form; FlashInfer: a cu_seqlens_q_topk entry per row), else
    the row's request (cu_seqlens_q_topk[r] <= i < cu_seqlens_q_topk[r + 1]). With sgl-kernel, rows that see no more than topk keys come as
    positions in order, as its kernels write them. ``original()`` (SGLang's, with the same
    arguments) for real logits."""
    compute = pending(logits)
    if compute is None:
        return original()
    op = "topk_transform"
    require(isinstance(topk, int) and topk >= 1, op, "topk", topk, "an int >= 1")
    lengths = lengths.reshape(-1).to(torch.int32)
    local = compute(topk, row_starts, lengths)
    if backend == "sgl-kernel":
        local = _in_order_when_short(local, lengths)
    if not fused or force_unfused_topk:
        return local
    method = getattr(topk_transform_method, "name", topk_transform_method)
    if method == "RAGGED":
        require(topk_indices_offset is not None, op, "topk_indices_offset", None, "a tensor (RAGGED transform)")
        return torch.where(local >= 0, local + topk_indices_offset.reshape(-1, 1).to(torch.int32), -1)
    require(method == "PAGED", op, "topk_transform_method", method, "RAGGED or PAGED")
    rows = local.shape[0]
    table = getattr(attn_metadata, "real_page_table", None)
    if (v2 and row_starts is None and batch_idx_list is None and 0 < topk <= 2048 and table is not None
            and lengths.shape[0] == rows == table.shape[0]):
        page_size = attn_metadata.page_size
        p = local.clamp(min=0).long()
        slots = table.gather(1, p // page_size).long() * page_size + p % page_size
        return torch.where(local >= 0, slots, -1).to(torch.int32)
    table = getattr(attn_metadata, "page_table_1", None)
    require(table is not None, op, "attn_metadata", "no page_table_1", "a page_size=1 table (PAGED transform)")
    if batch_idx_list is not None:
        table = table[batch_idx_list]
    # sgl-kernel: a table row per logits row (no row_starts) is its decode form; FlashInfer: one
    # cu_seqlens entry per logits row
    per_row = table.shape[0] if backend != "flashinfer" else (
        rows if cu_seqlens_q_topk is None else cu_seqlens_q_topk.shape[0] - 1)
    if row_starts is None and per_row == rows:
        owner = torch.arange(rows, device=local.device)
    else:
        require(cu_seqlens_q_topk is not None, op, "cu_seqlens_q_topk", None,
                "a tensor (PAGED transform of rows that share a request's table row)")
        seq = torch.arange(rows, dtype=torch.int32, device=local.device)
        owner = torch.searchsorted(cu_seqlens_q_topk[1:].to(torch.int32).contiguous(), seq, right=True)
    slots = table[owner.long()[:, None], local.clamp(min=0).long()]
    return torch.where(local >= 0, slots.to(torch.int32), -1)

"""DeepGEMM-compatible candidate-only (sparse) paged indexer logits, backed by sm12x's Triton kernel
(:mod:`sm12x.kernels.indexer.paged_sparse_mqa_logits`).

DeepGEMM builds ``get_paged_sparse_mqa_logits_metadata`` / ``fp8_fp4_paged_sparse_mqa_logits`` for
SM100 only; DeepSeek-V4.1's two-level indexer in SGLang 0.5.23 (``v41_indexer/sparse_table.py``)
needs both: the candidate source publishes its blocks with this schedule, every consumer layer scores
only those blocks. Same names, parameter names and order as DeepGEMM (``deep_gemm/__init__.py``:
``(context_lens, block_table, indices, page_kv, sparse_kv_block_indices, qk_dtype,
sparse_block_kv)`` and ``(q, kv_cache, weights, metadata, num_max_sparse_blocks,
sparse_block_kv)``).

Differences from DeepGEMM: the schedule's content is sm12x's own (int32 [rows, 1 +
num_max_sparse_blocks]: each row's valid length and its blocks' pool slots; it is only ever handed
back to this module's logits function), and ``indices`` (DeepGEMM's request ids, which let it pair
two rows of a request on one KV pass) is validated and not needed; FP4 (e2m1) queries and keys only
(the MXFP8 form is refused by name: no SM12x framework path builds it); any pool page size that is a
multiple of the block size (DeepGEMM needs a 512-byte page stride, so SGLang pages its V4.1 index-K
pool at 128 slots for it; 64 serves here too); columns past a row's valid length are -inf
(DeepGEMM: undefined); the logits rows are not padded to a 1024-byte stride (nothing reads past a
row's width).
"""
from __future__ import annotations

import torch

from sm12x.kernels import manifest
from sm12x.kernels.common.checks import bad, require, require_dtype
from sm12x.kernels.indexer import paged_sparse_mqa_logits as kernel

NAMES = manifest.names_in(__name__)
HELPER_NAMES = manifest.names_in(__name__, helper=True)
META_OP = "get_paged_sparse_mqa_logits_metadata"
OP = kernel.OP


def _int32_tensor(op, name, t, ndim):
    require(isinstance(t, torch.Tensor), op, name, type(t).__name__, "a tensor")
    require_dtype(t, (torch.int32,), op, name)
    require(t.dim() == ndim, op, name, lambda: f"shape {list(t.shape)}", f"{ndim}-D")


def get_paged_sparse_mqa_logits_metadata(context_lens, block_table, indices, page_kv, sparse_kv_block_indices,
                                         qk_dtype, sparse_block_kv):
    """Schedule of ``fp8_fp4_paged_sparse_mqa_logits``: context_lens int32 [rows] (or [rows, 1]),
    block_table int32 [rows, pages] at ``page_kv`` slots per page, indices int32 [rows] (request ids),
    sparse_kv_block_indices int32 [rows, num_max_sparse_blocks] (ascending block ids), qk_dtype the
    query dtype (int8: packed FP4), sparse_block_kv 8 or 16. Contract in
    :mod:`sm12x.kernels.indexer.paged_sparse_mqa_logits` (``build_schedule``)."""
    op = META_OP
    _int32_tensor(op, "sparse_kv_block_indices", sparse_kv_block_indices, 2)
    rows = sparse_kv_block_indices.shape[0]
    require(isinstance(context_lens, torch.Tensor) and context_lens.dtype == torch.int32
            and context_lens.numel() == rows and context_lens.dim() in (1, 2), op, "context_lens",
            lambda: f"{getattr(context_lens, 'dtype', type(context_lens).__name__)} "
                    f"{list(getattr(context_lens, 'shape', []))}", f"int32 [{rows}] (one length per row)")
    _int32_tensor(op, "block_table", block_table, 2)
    require(block_table.shape[0] >= rows, op, "block_table", lambda: f"{block_table.shape[0]} rows",
            f">= {rows} (one page-table row per query row)")
    if indices is not None:
        _int32_tensor(op, "indices", indices, 1)
        require(indices.shape[0] == rows, op, "indices", lambda: f"{indices.shape[0]} entries", f"{rows}")
    require(sparse_block_kv in kernel.BLOCK_SIZES, op, "sparse_block_kv", sparse_block_kv,
            f"one of {kernel.BLOCK_SIZES}")
    require(isinstance(page_kv, int) and page_kv > 0 and page_kv % sparse_block_kv == 0, op, "page_kv",
            page_kv, f"a positive multiple of sparse_block_kv ({sparse_block_kv})")
    require(qk_dtype == torch.int8, op, "qk_dtype", qk_dtype,
            "torch.int8 (packed FP4 queries; sm12x serves the FP4 index-K pool only)")
    devices = {t.device for t in (context_lens, block_table, sparse_kv_block_indices)}
    require(len(devices) == 1, op, "context_lens", lambda: f"tensors on {sorted(map(str, devices))}",
            "every tensor on one device")
    return kernel.build_schedule(context_lens.reshape(-1), block_table, sparse_kv_block_indices, page_kv,
                                 sparse_block_kv)


def fp8_fp4_paged_sparse_mqa_logits(q, kv_cache, weights, metadata, num_max_sparse_blocks, sparse_block_kv):
    """bf16 logits [rows, num_max_sparse_blocks * sparse_block_kv] of each row's published blocks:
    q = (int8 [rows, next_n, H, 64] packed e2m1, int32 [rows, next_n, H] packed ue8m0), the rows
    being rows x next_n query rows in order; kv_cache the fused FP4 index-K pool uint8
    [pages, page_kv, 1, 68]; weights [rows * next_n, H] float32 or bf16; metadata the schedule of
    ``get_paged_sparse_mqa_logits_metadata`` for the same blocks (built for at least as many rows)."""
    op = OP
    require(isinstance(q, (tuple, list)) and len(q) == 2, op, "q", type(q).__name__, "(values, scales)")
    qv, qs = q
    require(isinstance(qv, torch.Tensor), op, "q", type(qv).__name__, "a tensor")
    if qs is None or qv.dtype == torch.float8_e4m3fn:
        raise bad(op, "q", f"{qv.dtype} values with scales {None if qs is None else qs.dtype}",
                  "packed FP4 (int8 values, int32 ue8m0 scales): sm12x serves the FP4 index-K pool only")
    require_dtype(qv, (torch.int8,), op, "q")
    require(qv.dim() == 4 and qv.shape[-1] == kernel.D // 2, op, "q", lambda: f"shape {list(qv.shape)}",
            f"[rows, next_n, H, {kernel.D // 2}] (head_dim {kernel.D})")
    rows, next_n, h = qv.shape[0] * qv.shape[1], qv.shape[1], qv.shape[2]
    require(h in kernel.HEADS, op, "q", lambda: f"{h} heads", f"one of {kernel.HEADS} heads")
    require(isinstance(qs, torch.Tensor) and qs.dtype == torch.int32 and tuple(qs.shape) == tuple(qv.shape[:3]),
            op, "q", lambda: f"scales {getattr(qs, 'dtype', None)} {list(getattr(qs, 'shape', []))}",
            f"int32 {list(qv.shape[:3])}")
    require(isinstance(kv_cache, torch.Tensor), op, "kv_cache", type(kv_cache).__name__, "a tensor")
    cache = kv_cache.view(torch.uint8) if kv_cache.dtype in (torch.int8, torch.uint8) else kv_cache
    require_dtype(cache, (torch.uint8,), op, "kv_cache")
    tok = kernel.D // 2 + 4
    require(cache.dim() == 4 and cache.shape[2] == 1 and cache.shape[3] == tok
            and cache.stride(3) == 1 and cache.stride(1) == tok and cache.stride(0) % 4 == 0
            and cache.stride(0) >= cache.shape[1] * tok, op, "kv_cache",
            lambda: f"shape {list(cache.shape)} strides {list(cache.stride())}",
            f"[pages, page_kv, 1, {tok}] with tokens packed in a page and a page stride a multiple of 4 bytes")
    require(sparse_block_kv in kernel.BLOCK_SIZES and cache.shape[1] % sparse_block_kv == 0, op,
            "sparse_block_kv", sparse_block_kv, f"one of {kernel.BLOCK_SIZES} dividing page_kv ({cache.shape[1]})")
    require(isinstance(num_max_sparse_blocks, int) and num_max_sparse_blocks >= 0, op, "num_max_sparse_blocks",
            num_max_sparse_blocks, "an int >= 0")
    require(isinstance(weights, torch.Tensor) and weights.dtype in (torch.float32, torch.bfloat16)
            and tuple(weights.shape) == (rows, h) and weights.stride(1) == 1, op, "weights",
            lambda: f"{getattr(weights, 'dtype', None)} {list(getattr(weights, 'shape', []))}",
            f"float32 or bf16 [{rows}, {h}] with unit column stride")
    require(isinstance(metadata, torch.Tensor) and metadata.dtype == torch.int32 and metadata.dim() == 2
            and metadata.shape[0] >= rows and metadata.shape[1] == num_max_sparse_blocks + 1
            and metadata.stride(1) == 1, op, "metadata",
            lambda: f"{getattr(metadata, 'dtype', None)} {list(getattr(metadata, 'shape', []))}",
            f"sm12x's schedule from get_paged_sparse_mqa_logits_metadata: int32 [>= {rows}, "
            f"{num_max_sparse_blocks + 1}]")
    devices = {t.device for t in (qv, qs, cache, weights, metadata)}
    require(len(devices) == 1, op, "q", lambda: f"tensors on {sorted(map(str, devices))}",
            "every tensor on one device")
    del next_n
    return kernel.paged_sparse_mqa_logits(qv.reshape(rows, h, kernel.D // 2).contiguous(),
                                          qs.reshape(rows, h).contiguous(), cache, weights, metadata,
                                          num_max_sparse_blocks, sparse_block_kv)

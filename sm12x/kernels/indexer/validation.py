"""Input checks shared by the indexer ops (logits, paged logits, fused top-k): the shapes, dtypes,
layouts and head counts the kernels support, each rejected by name (op, argument, what came, what
is supported)."""
from __future__ import annotations

import torch

from sm12x.kernels.common.checks import require, require_dtype, require_same_device, require_shape

HEADS = (8, 16, 32, 64)
FP8_DIMS = (32, 64, 128)
FP4_DIMS = (64, 128)
BLOCK_KVS = (32, 64)
FP4_DTYPES = (torch.int8, torch.uint8)
LOGITS_DTYPES = (torch.float32, torch.bfloat16)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


def _check_weights(op, weights, rows, h, q):
    require_dtype(weights, WEIGHT_DTYPES, op, "weights")
    require_shape(weights, (rows, h), op, "weights")
    require(weights.stride(1) == 1, op, "weights", lambda: f"stride {weights.stride()}",
            "unit stride along heads")


def _check_q(op, qv, qs, ndim):
    fp4 = qs is not None
    if fp4:
        require_dtype(qv, FP4_DTYPES, op, "q")
    else:
        require_dtype(qv, (torch.float8_e4m3fn,), op, "q")
    require(qv.dim() == ndim, op, "q", lambda: f"shape {list(qv.shape)}", lambda: f"{ndim} dims")
    require(qv.is_contiguous(), op, "q", "a non-contiguous tensor", "contiguous")
    h = qv.shape[-2]
    d = qv.shape[-1] * (2 if fp4 else 1)
    require(h in HEADS, op, "q", lambda: f"{h} heads", lambda: f"heads in {HEADS}")
    dims = FP4_DIMS if fp4 else FP8_DIMS
    require(d in dims, op, "q", lambda: f"head_dim {d}", lambda: f"head_dim in {dims}")
    if fp4:
        require_dtype(qs, (torch.int32,), op, "q_scale")
        require_shape(qs, tuple(qv.shape[:-1]), op, "q_scale")
        require(qs.is_contiguous(), op, "q_scale", "a non-contiguous tensor", "contiguous")
    return h, d


def check_mqa(op, qv, qs, k, k_sf, weights, ks, ke):
    h, d = _check_q(op, qv, qs, 3)
    s = qv.shape[0]
    fp4 = qs is not None
    if fp4:
        require_dtype(k, FP4_DTYPES, op, "kv")
        require_shape(k, (None, d // 2), op, "kv")
        require_dtype(k_sf, (torch.int32,), op, "kv_scale")
    else:
        require_dtype(k, (torch.float8_e4m3fn,), op, "kv")
        require_shape(k, (None, d), op, "kv")
        require_dtype(k_sf, (torch.float32,), op, "kv_scale")
    require(k.is_contiguous(), op, "kv", "a non-contiguous tensor", "contiguous")
    require_shape(k_sf, (k.shape[0],), op, "kv_scale")
    require(k_sf.is_contiguous(), op, "kv_scale", "a non-contiguous tensor", "contiguous")
    _check_weights(op, weights, s, h, qv)
    for name, t in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        require_dtype(t, (torch.int32,), op, name)
        require_shape(t, (s,), op, name)
        require(t.is_contiguous(), op, name, "a non-contiguous tensor", "contiguous")
    require_same_device(op, qv, q_scale=qs, kv=k, kv_scale=k_sf, weights=weights,
                        cu_seq_len_k_start=ks, cu_seq_len_k_end=ke)


def _as_u8_cache(op, kv_cache):
    require(isinstance(kv_cache, torch.Tensor), op, "kv_cache", type(kv_cache).__name__, "a uint8 tensor")
    require_dtype(kv_cache, (torch.uint8, torch.int8), op, "kv_cache")
    if kv_cache.dim() == 3:
        kv_cache = kv_cache.unsqueeze(2)
    require(kv_cache.dim() == 4 and kv_cache.shape[2] == 1, op, "kv_cache",
            lambda: f"shape {list(kv_cache.shape)}",
            "[num_blocks, block_kv, 1, bytes_per_token]")
    return kv_cache.view(torch.uint8)


def check_paged(op, qv, qs, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len):
    h, d = _check_q(op, qv, qs, 4)
    b, next_n = qv.shape[0], qv.shape[1]
    require(next_n >= 1, op, "q", lambda: f"next_n {next_n}", "next_n >= 1")
    fp4 = qs is not None
    kv_cache = _as_u8_cache(op, kv_cache)
    tok = d // 2 + 4 if fp4 else d + 4
    require(kv_cache.shape[3] == tok, op, "kv_cache", lambda: f"{kv_cache.shape[3]} bytes per token",
            lambda: f"{tok} ({'D/2' if fp4 else 'D'} + 4) for head_dim {d}")
    require(kv_cache.shape[1] in BLOCK_KVS, op, "kv_cache", lambda: f"block_kv {kv_cache.shape[1]}",
            lambda: f"block_kv in {BLOCK_KVS}")
    require(kv_cache.stride(3) == 1 and kv_cache.stride(1) == tok, op, "kv_cache",
            lambda: f"strides {kv_cache.stride()}",
            "token-major blocks (stride(1) == bytes per token, stride(3) == 1)")
    require(kv_cache.stride(0) % 4 == 0 and kv_cache.stride(0) >= kv_cache.shape[1] * tok, op, "kv_cache",
            lambda: f"stride(0) {kv_cache.stride(0)}", "a multiple of 4 bytes >= block_kv * bytes per token")
    require(kv_cache.storage_offset() % 4 == 0, op, "kv_cache",
            lambda: f"storage offset {kv_cache.storage_offset()}",
            "a multiple of 4 bytes")
    _check_weights(op, weights, b * next_n, h, qv)
    require_dtype(context_lens, (torch.int32,), op, "context_lens")
    require((context_lens.dim() == 2 and tuple(context_lens.shape) == (b, next_n)) or
            (context_lens.dim() == 1 and context_lens.shape[0] == b), op, "context_lens",
            lambda: f"shape {list(context_lens.shape)}", lambda: f"[{b}, {next_n}] or [{b}]")
    require(context_lens.is_contiguous(), op, "context_lens", "a non-contiguous tensor", "contiguous")
    require_dtype(block_table, (torch.int32,), op, "block_table")
    require_shape(block_table, (b, None), op, "block_table")
    require(block_table.stride(1) == 1, op, "block_table", lambda: f"stride {block_table.stride()}", "unit stride(1)")
    if schedule_meta is not None:
        require_dtype(schedule_meta, (torch.int32,), op, "schedule_meta")
        require_shape(schedule_meta, (None, 2), op, "schedule_meta")
    require(isinstance(max_context_len, int) and max_context_len >= 0, op, "max_context_len",
            max_context_len, "an int >= 0")
    require(max_context_len <= block_table.shape[1] * kv_cache.shape[1] or block_table.shape[1] == 0, op,
            "max_context_len", max_context_len,
            lambda: f"<= block_table columns x block_kv ({block_table.shape[1] * kv_cache.shape[1]})")
    require_same_device(op, qv, q_scale=qs, kv_cache=kv_cache, weights=weights, context_lens=context_lens,
                        block_table=block_table, schedule_meta=schedule_meta)
    return kv_cache

"""DeepGEMM-compatible lightning-indexer API backed by the sm12x Triton kernels.

Same names, parameter names, defaults and return shapes as ``deep_gemm`` (checked against
deepseek-ai/DeepGEMM v2.6.1 ``csrc/apis/attention.hpp``), so a patch can install these functions on
a ``deep_gemm`` module (see ``NAMES``) or in place of a framework's wrapper implementations. Later
front ends order and default some arguments differently (DeepGEMM 2.8 in vLLM 0.33: no
``clean_logits``, ``max_seqlen_k`` sixth; sgl-deep-gemm: ``clean_logits=False``); the patches
bind each call by the installed function's own signature (``sm12x.patches.deep_gemm``).

Differences from DeepGEMM (supersets only): 1-D and 2-D ``context_lens`` both work, also with
``clean_logits=True``; ``schedule_meta`` is validated but not needed (the kernels use a shape-only
grid; ``get_paged_mqa_logits_metadata`` still returns a real [num_sms+1, 2] int32 schedule);
``indices`` (varlen decode rows, next_n == 1) is accepted: rows already carry their own
context_lens / block_table rows, so it only affects DeepGEMM's KV-sharing schedule, not the result.
Unknown keyword arguments are accepted when None and raise NotImplementedError naming them
otherwise (they could change semantics).
"""
from __future__ import annotations

import torch

from sm12x.kernels import manifest
from sm12x.kernels.common import configs
from sm12x.kernels.common.checks import bad, require, require_dtype, require_shape, unsupported
from sm12x.kernels.indexer.validation import (BLOCK_KVS, LOGITS_DTYPES,
                                             check_mqa, check_paged)
from sm12x.kernels.indexer.mqa_logits import mqa_logits as _mqa_logits
from sm12x.kernels.indexer.paged_mqa_logits import get_paged_mqa_logits_metadata as _metadata
from sm12x.kernels.indexer.paged_mqa_logits import paged_mqa_logits as _paged_mqa_logits

# what this module implements, as the manifest declares it
NAMES = manifest.names_in(__name__)
HELPER_NAMES = manifest.names_in(__name__, helper=True)

_num_sms: int | None = None


def get_num_sms() -> int:
    """SMs used for schedules: ``set_num_sms`` value, else the current device's count (188 on CPU)."""
    if _num_sms is not None:
        return _num_sms
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return configs.sm_count(dev)


def set_num_sms(num_sms: int) -> None:
    global _num_sms
    require(isinstance(num_sms, int) and num_sms > 0, "set_num_sms", "num_sms", num_sms, "an int > 0")
    _num_sms = num_sms


def _reject_unknown(op: str, kwargs: dict) -> None:
    for name, value in kwargs.items():
        if value is not None:
            raise unsupported(op, name, repr(value)[:60], "None (unknown argument; sm12x does not implement it)")


def _packed_q_scale(qs):
    """vLLM's MXFP4 indexer passes a row's four ue8m0 scales as uint8 [..., 4]: the bytes of
    DeepGEMM's packed int32 (group g in byte g), read as that int32. Anything else as given."""
    if (isinstance(qs, torch.Tensor) and qs.dtype == torch.uint8 and qs.dim() >= 1 and qs.shape[-1] == 4
            and qs.is_contiguous()):
        return qs.view(torch.int32).squeeze(-1)
    return qs


def _split_q(op, q):
    if isinstance(q, (tuple, list)):
        require(len(q) == 2, op, "q", lambda: f"a tuple of {len(q)}", "(values, scale or None)")
        return q[0], _packed_q_scale(q[1])
    require(isinstance(q, torch.Tensor), op, "q", type(q).__name__, "a tensor or (values, scale or None)")
    return q, None


# ----------------------------------------------------------------------------------------------
# public API


def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
                       max_seqlen_k=0, logits_dtype=torch.float32, schedule_meta=None, **kwargs):
    """q = (values, scale|None): FP8 float8_e4m3fn [S, H, D] with None, or FP4 int8 [S, H, D/2]
    with int32 [S, H]; kv = (k, k_scale): float8 [S_kv, D] + float32 [S_kv], or int8 [S_kv, D/2] +
    int32 [S_kv]. Returns [S, S_kv] logits (or [S, max_seqlen_k] compressed when max_seqlen_k > 0).
    FP8 k scales must be >= 0 (amax / 448, as every quantiser writes them): the kernel applies them
    after the ReLU. ``schedule_meta`` (DeepGEMM 2.8, sgl-deep-gemm) is accepted and not needed."""
    op = "fp8_fp4_mqa_logits"
    _reject_unknown(op, kwargs)
    require(schedule_meta is None or isinstance(schedule_meta, torch.Tensor), op, "schedule_meta",
            type(schedule_meta).__name__, "a tensor or None")
    qv, qs = _split_q(op, q)
    require(isinstance(kv, (tuple, list)) and len(kv) == 2, op, "kv", type(kv).__name__, "(k, k_scale)")
    k, k_sf = kv
    check_mqa(op, qv, qs, k, k_sf, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    require(logits_dtype in LOGITS_DTYPES, op, "logits_dtype", logits_dtype, " or ".join(map(str, LOGITS_DTYPES)))
    require(isinstance(max_seqlen_k, int) and max_seqlen_k >= 0, op, "max_seqlen_k", max_seqlen_k, "an int >= 0")
    require(not (max_seqlen_k > 0 and clean_logits), op, "clean_logits", clean_logits,
            "False when max_seqlen_k > 0 (compressed logits are not cleaned)")
    return _mqa_logits(qv, qs, k.view(torch.int8) if qs is not None else k, k_sf, weights,
                       cu_seq_len_k_start, cu_seq_len_k_end, bool(clean_logits), max_seqlen_k, logits_dtype)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
                   max_seqlen_k=0, schedule_meta=None, **kwargs):
    """Legacy FP8 form: q float8 [S, H, D] (no q scale; fold it into weights). Float32 logits."""
    op = "fp8_mqa_logits"
    _reject_unknown(op, kwargs)
    if isinstance(q, (tuple, list)):
        raise bad(op, "q", "a tuple", "a float8_e4m3fn tensor (use fp8_fp4_mqa_logits for (values, scale))")
    return fp8_fp4_mqa_logits((q, None), kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                              clean_logits=clean_logits, max_seqlen_k=max_seqlen_k, schedule_meta=schedule_meta)


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None, **kwargs):
    """[num_sms+1, 2] int32 schedule for the paged kernels (device ops only; content is ours)."""
    op = "get_paged_mqa_logits_metadata"
    _reject_unknown(op, kwargs)
    require(isinstance(context_lens, torch.Tensor), op, "context_lens", type(context_lens).__name__, "a tensor")
    require_dtype(context_lens, (torch.int32,), op, "context_lens")
    require(context_lens.dim() in (1, 2), op, "context_lens", lambda: f"shape {list(context_lens.shape)}", "[B, next_n] or [B]")
    require(isinstance(block_kv, int) and block_kv in BLOCK_KVS, op, "block_kv", block_kv, lambda: f"one of {BLOCK_KVS}")
    require(isinstance(num_sms, int) and num_sms > 0, op, "num_sms", num_sms, "an int > 0")
    if indices is not None:
        require_dtype(indices, (torch.int32,), op, "indices")
        require_shape(indices, (context_lens.shape[0],), op, "indices")
    return _metadata(context_lens, block_kv, num_sms)


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, clean_logits=False, logits_dtype=torch.float32,
                             indices=None, **kwargs):
    """q = (values, scale|None): float8 [B, next_n, H, D] or FP4 int8 [B, next_n, H, D/2] + int32
    [B, next_n, H]; kv_cache fused uint8 [num_blocks, block_kv, 1, D+4 | D/2+4] (FP8 scales >= 0,
    as for ``fp8_fp4_mqa_logits``). Returns [B*next_n, max_context_len] logits (row stride
    padded)."""
    op = "fp8_fp4_paged_mqa_logits"
    _reject_unknown(op, kwargs)
    qv, qs = _split_q(op, q)
    kv_cache = check_paged(op, qv, qs, kv_cache, weights, context_lens, block_table, schedule_meta,
                            max_context_len)
    require(logits_dtype in LOGITS_DTYPES, op, "logits_dtype", logits_dtype, " or ".join(map(str, LOGITS_DTYPES)))
    if indices is not None:
        require_dtype(indices, (torch.int32,), op, "indices")
        require_shape(indices, (qv.shape[0],), op, "indices")
        require(qv.shape[1] == 1, op, "indices", "given with next_n > 1", "next_n == 1 for varlen rows")
    return _paged_mqa_logits(qv, qs, kv_cache, weights, context_lens, block_table, max_context_len,
                             bool(clean_logits), logits_dtype)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits=False, indices=None, **kwargs):
    """Legacy FP8 form: q float8 [B, next_n, H, D]; float32 logits."""
    op = "fp8_paged_mqa_logits"
    _reject_unknown(op, kwargs)
    if isinstance(q, (tuple, list)):
        raise bad(op, "q", "a tuple", "a float8_e4m3fn tensor (use fp8_fp4_paged_mqa_logits for (values, scale))")
    return fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table, schedule_meta,
                                    max_context_len, clean_logits=clean_logits, indices=indices)

"""FlashMLA-compatible Python surface for the sparse FP8 decode path, backed by the Triton kernel in
``sparse_mla_decode``, and for the sparse bf16 prefill (``flash_mla_sparse_fwd``, kernel in
``sparse_mla_prefill``). Signatures follow ``flash_mla/flash_mla_interface.py`` and
``flash_mla.cuda.sparse_decode_fwd``; of ``flash_mla_with_kvcache`` only the sparse FP8 path
(``indices`` given, ``is_fp8_kvcache=True``) is implemented; ``convention.is_sparse_fp8_call`` tells a
patch whether a call belongs here or to the original function.

Scheduling metadata is ours and depends on shapes only: the tensors handed out by
:func:`get_mla_metadata` (old API) or stored in :class:`SchedMeta` are placeholders the kernel never
reads, so any of them (or None) may be passed to any call.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from sm12x.frontends.flash_mla.convention import wants_sparse_fp8
from sm12x.kernels.common import checks, configs
from sm12x.kernels.sparse_mla.decode import LOG2E, sparse_mla_decode
from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill

OP = "flash_mla_with_kvcache"
PREFILL_OP = "flash_mla_sparse_fwd"
TILE_SCHEDULER_METADATA_SIZE = 8


@dataclasses.dataclass
class SchedMeta:
    """Like ``FlashMLASchedMeta``: records the call configuration on first use and checks that
    later calls with the same object agree."""

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional[Config] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def _old_metadata(cache_seqlens, num_q_tokens_per_head_k=None, h_k=1, h_q=None,
                  is_fp8_kvcache=False, topk=None, **_ignored):
    b = cache_seqlens.shape[0]
    parts = configs.sm_count(cache_seqlens.device)
    dev = cache_seqlens.device
    # Shapes-only placeholders (no host->device copy, so this is CUDA-graph safe).
    return (torch.zeros((parts, TILE_SCHEDULER_METADATA_SIZE), dtype=torch.int32, device=dev),
            torch.zeros((b + 1,), dtype=torch.int32, device=dev))


def get_mla_metadata(*args, **kwargs):
    """Current API (no tensor arguments): ``(SchedMeta(), None)``.
    Old API ``get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, h_k, h_q=None,
    is_fp8_kvcache=False, topk=None)``: ``(tile_scheduler_metadata int32 [num_sm_parts, 8],
    num_splits int32 [b + 1])`` placeholders."""
    first = args[0] if args else kwargs.get("cache_seqlens")
    if isinstance(first, torch.Tensor):
        kw = dict(kwargs)
        kw.pop("cache_seqlens", None)
        for old, new in (("num_heads_per_head_k", "num_q_tokens_per_head_k"),
                         ("num_heads_k", "h_k"), ("num_heads_q", "h_q")):
            if old in kw:
                kw[new] = kw.pop(old)
        return _old_metadata(first, *args[1:], **kw)
    return SchedMeta(), None


def get_mla_decoding_metadata(seqlens_k, num_q_tokens_per_head_k, h_k, h_q=None, is_fp8_kvcache=False,
                              topk=None, use_legacy=False):
    """sgl-flash-mla's tensor scheduler (its callers put the result on a ``FlashMLASchedMeta``):
    the same placeholders as the old :func:`get_mla_metadata` tensor API."""
    return _old_metadata(seqlens_k)


# Keyword arguments we accept and ignore when they are None (or False): they would change the
# semantics otherwise.
def _reject_future_kwargs(op, kwargs):
    for name, value in kwargs.items():
        if value is not None and value is not False:
            raise checks.unsupported(op, name, type(value).__name__,
                                     "None (sm12x does not implement this argument)")


def sparse_decode_fwd(q, k_cache, indices, topk_length, attn_sink, tile_scheduler_metadata,
                      num_splits, extra_k_cache, extra_indices, extra_topk_length, head_dim_v,
                      softmax_scale):
    """Mirrors ``flash_mla.cuda.sparse_decode_fwd`` -> (out bf16 [b, s_q, h_q, 512],
    lse fp32 [b, h_q, s_q] (transposed view), tile_scheduler_metadata, num_splits)."""
    out, lse = sparse_mla_decode(q, k_cache, indices, topk_length, attn_sink, extra_k_cache,
                                 extra_indices, extra_topk_length, softmax_scale, head_dim_v,
                                 op="sparse_decode_fwd")
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata = torch.empty((1, TILE_SCHEDULER_METADATA_SIZE), dtype=torch.int32,
                                              device=q.device)
    if num_splits is None:
        num_splits = torch.empty((q.shape[0] + 1,), dtype=torch.int32, device=q.device)
    return out, lse, tile_scheduler_metadata, num_splits


def _check_sched(sched, cfg):
    if not sched.have_initialized:
        sched.have_initialized = True
        sched.config = cfg
        return
    for field in dataclasses.fields(cfg):
        want, got = getattr(sched.config, field.name), getattr(cfg, field.name)
        if want != got:
            raise checks.bad(OP, "tile_scheduler_metadata", f"a SchedMeta recorded with "
                             f"{field.name}={want}", f"a call with the same {field.name} "
                             f"(this call has {got}); use one metadata object per configuration")


# sgl-flash-mla's ``kv_format`` names for the cache formats this kernel reads (bytes per token)
KV_FORMATS = {"V32": 656, "V4": 584}


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, out=None, use_legacy=None, kv_format=None,
                           **future_kwargs):
    """FlashMLA's ``flash_mla_with_kvcache``, sparse FP8 path only -> (out bf16 [b, s_q, h_q, 512],
    lse fp32 [b, h_q, s_q], a transposed view of a [b, s_q, h_q] buffer).
    ``block_table``/``cache_seqlens`` are not used in sparse mode. ``tile_scheduler_metadata`` may
    be a :class:`SchedMeta`, old-API tensors or None (or another implementation's metadata object,
    which is ignored). ``out`` (vLLM's vendored FlashMLA; its DeepSeek-V4 decode passes a view and
    drops the result): a bf16 [b, s_q, h_q, 512] tensor, unit stride on the last dimension and
    16-byte aligned rows, written in place and returned.
    sgl-flash-mla (SGLang 0.5.23): ``is_fp8_kvcache=None`` means "sparse when ``indices`` are
    given"; ``use_legacy`` picks its kernel set and is accepted either way for the V3.2 and V4
    caches; for a DeepSeek-V4.1 cache (528 bytes per token, with a 528 or 288-byte extra cache) it
    is the caller's declaration of the arrangement (SGLang passes ``not interleaved``): True
    block-split, False interleaved; without it (None, or a front end that has no such argument) a
    V4.1 cache is refused by name, never guessed. ``kv_format``, a hint of the cache's format,
    must name the format of ``k_cache`` (``KV_FORMATS``)."""
    if indices is None:
        raise checks.unsupported(OP, "indices", None, "an int32 tensor (sm12x implements the sparse "
                                 "FP8 decode path only; send dense calls to FlashMLA)")
    if not wants_sparse_fp8(indices, is_fp8_kvcache):
        raise checks.bad(OP, "is_fp8_kvcache", is_fp8_kvcache, "True (or None) when indices are given")
    return sparse_fp8_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                             num_splits, softmax_scale, causal, is_fp8_kvcache, indices, attn_sink,
                             extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length, out,
                             use_legacy, kv_format, **future_kwargs)


def sparse_fp8_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                      num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=True, indices=None,
                      attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                      extra_topk_length=None, out=None, use_legacy=None, kv_format=None, **future_kwargs):
    """:func:`flash_mla_with_kvcache` for a call already known to be the sparse FP8 path (the
    wrappers decide that with ``convention.is_sparse_fp8_call`` and come here, so the path is
    decided once per call). The kernel launcher (``sparse_mla_decode``) validates the tensors;
    this adds what only FlashMLA's API has: unknown keywords, ``kv_format``, ``causal`` and the
    scheduler metadata's configuration."""
    _reject_future_kwargs(OP, future_kwargs)
    v41_format = None
    if getattr(k_cache, "dim", lambda: 0)() == 4 and k_cache.shape[-1] in (528, 288):
        if use_legacy is None:
            raise checks.bad(OP, "use_legacy", None, f"True (block-split) or False (interleaved) with a "
                             f"{k_cache.shape[-1]}-byte DeepSeek-V4.1 k_cache: the arrangement is "
                             f"declared, never guessed from the size")
        v41_format = "v41_block_split" if use_legacy else "v41"
    if kv_format is not None:
        if kv_format not in KV_FORMATS:
            raise checks.unsupported(OP, "kv_format", kv_format,
                                     f"one of {sorted(KV_FORMATS)} or None (sm12x reads these caches)")
        if k_cache.shape[-1] != KV_FORMATS[kv_format]:
            raise checks.bad(OP, "kv_format", kv_format, f"the format of k_cache ({k_cache.shape[-1]} "
                             f"bytes per token; {kv_format} has {KV_FORMATS[kv_format]})")
    if causal:
        raise checks.bad(OP, "causal", causal, "False when indices are given (sparse decode)")
    out, lse = sparse_mla_decode(q, k_cache, indices, topk_length, attn_sink, extra_k_cache,
                                 extra_indices_in_kvcache, extra_topk_length, softmax_scale,
                                 head_dim_v, out=out, op=OP, kv_format=v41_format)
    # after the launch, whose validation gives these shapes meaning; the metadata object is not
    # read by the kernel, so a mismatch found here changed nothing but is the caller's error
    if isinstance(tile_scheduler_metadata, SchedMeta):
        _check_sched(tile_scheduler_metadata, SchedMeta.Config(
            q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1], k_cache.shape[2], causal,
            True, indices.shape[-1],
            extra_k_cache.shape[1] if extra_k_cache is not None else None,
            extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None))
    return out, lse


def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                         out=None, indexer_topk=0, use_legacy=None, return_log2_lse=None,
                         **future_kwargs):
    """FlashMLA's ``flash_mla_sparse_fwd`` as of its 2026-01 interface (vLLM's vendored copy adds
    ``out``) -> (out bf16 [s_q, h_q, 512], max_logits fp32 [s_q, h_q], lse fp32 [s_q, h_q]) in
    natural-log units; a row with no valid index gets 0, -inf, +inf. Contract:
    ``sm12x.kernels.sparse_mla.prefill``. ``indexer_topk`` (FlashMLA's nv_dev branch: > 0 adds a
    fourth result) is accepted at its default 0 only. sgl-flash-mla (SGLang 0.5.23):
    ``use_legacy`` (its kernel set) is accepted either way; ``return_log2_lse`` True returns
    max_logits and lse in base 2, False returns None for both."""
    _reject_future_kwargs(PREFILL_OP, future_kwargs)
    if indexer_topk:
        raise checks.unsupported(PREFILL_OP, "indexer_topk", indexer_topk,
                                 "0 (sm12x does not return the indexer's log-sum-exp)")
    result = sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out,
                                op=PREFILL_OP)
    if return_log2_lse is None:
        return result
    if return_log2_lse is False:
        return result[0], None, None
    return to_log2_units(result)


def to_log2_units(result, empty_lse=float("inf")):
    """``flash_mla_sparse_fwd``'s result in base-2 units, in place: what FlashMLA returned before
    2026-01 (``empty_lse`` -inf: its value for a row with no valid index) and what sgl-kernel's
    build still returns (max_logits and lse times log2(e); empty rows +inf)."""
    out, max_logits, lse = result
    max_logits.mul_(LOG2E)
    lse.mul_(LOG2E)
    if empty_lse != float("inf"):
        lse.masked_fill_(lse == float("inf"), empty_lse)
    return out, max_logits, lse

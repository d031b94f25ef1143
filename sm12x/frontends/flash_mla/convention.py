"""FlashMLA's call conventions that every route shares, written once: the positional order of
``flash_mla_with_kvcache`` and ``flash_mla_sparse_fwd``, and the rule that decides whether a decode
call is the sparse FP8 path sm12x serves. Stdlib only."""
from __future__ import annotations

# flash_mla_with_kvcache's parameters in FlashMLA's positional order; every version and copy
# agrees on the first LEADING_POSITIONAL (sgl-kernel inserts descale_q / descale_k after them)
DECODE_ORDER = ("q", "k_cache", "block_table", "cache_seqlens", "head_dim_v", "tile_scheduler_metadata",
                "num_splits", "softmax_scale", "causal", "is_fp8_kvcache", "indices")
LEADING_POSITIONAL = 6
# flash_mla_sparse_fwd's leading positional parameters (q, kv, indices, sm_scale, d_v, attn_sink,
# topk_length); after them sgl-flash-mla has use_legacy, return_log2_lse where vLLM's copy and
# sm12x have out
PREFILL_LEADING_POSITIONAL = 7


def wants_sparse_fp8(indices, is_fp8_kvcache) -> bool:
    """Whether a ``flash_mla_with_kvcache`` call is the sparse FP8 path: ``indices`` given and
    ``is_fp8_kvcache`` true, where None (sgl-flash-mla's default) means "inferred from indices"."""
    return indices is not None and (is_fp8_kvcache is None or bool(is_fp8_kvcache))


def is_sparse_fp8_call(*args, **kwargs) -> bool:
    """``wants_sparse_fp8`` of a call as the caller passed it, positional arguments read in
    FlashMLA's order; a call that does not fit that order is not ours."""
    if len(args) > len(DECODE_ORDER) or set(DECODE_ORDER[:len(args)]) & kwargs.keys():
        return False
    named = {**dict(zip(DECODE_ORDER, args)), **kwargs}
    return wants_sparse_fp8(named.get("indices"), named.get("is_fp8_kvcache", False))

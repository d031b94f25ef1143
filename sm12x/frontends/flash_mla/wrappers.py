"""How FlashMLA's callers reach sm12x: one factory per replaced FlashMLA function, each taking the
original and returning the replacement that reads a call as the original names it and decides
whether it is ours (sparse FP8 decode, sparse bf16 prefill) or the original's (anything else).

The replacements call the FlashMLA-compatible functions in :mod:`sm12x.frontends.flash_mla.api`;
the patch records that install them are in :mod:`sm12x.patches.flash_mla`. Stdlib only at import.
"""
from __future__ import annotations

import functools

from sm12x.frontends.flash_mla.convention import LEADING_POSITIONAL, PREFILL_LEADING_POSITIONAL, is_sparse_fp8_call
from sm12x.frontends.signatures import signature_of, takes_args



def _api():
    """The FlashMLA-compatible functions (imported on first patch: they need torch)."""
    from sm12x.frontends.flash_mla import api

    return api


def _named_signature(original):
    """(original's signature, the name of its ``**`` parameter or None); (None, None) when it has
    none to bind by: compiled functions and ``*args`` stubs (vLLM's, which stand for its own
    interface, in sm12x's order)."""
    signature = signature_of(original)
    if signature is None or takes_args(signature):
        return None, None
    return signature, next((p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD), None)


def _by_name(signature, var_kw, args, kwargs):
    """A call's arguments, all by name as ``signature`` reads them."""
    named = dict(signature.bind(*args, **kwargs).arguments)
    named.update(named.pop(var_kw, None) or {})
    return (), named


def make_flash_mla_with_kvcache(original):
    """Sparse FP8 calls -> sm12x; anything else -> ``original``. Arguments beyond the six common
    leading ones are bound by the original's own signature (sgl_kernel inserts descale_q/k). When
    the original's ``is_fp8_kvcache`` defaults to None (sgl-flash-mla: inferred from ``indices``),
    a call that leaves it out passes None."""
    api = _api()
    signature, var_kw = _named_signature(original)
    fp8_param = signature.parameters.get("is_fp8_kvcache") if signature is not None else None
    infers_fp8 = fp8_param is not None and fp8_param.default is None

    @functools.wraps(original)
    def flash_mla_with_kvcache(*args, **kwargs):
        if len(args) > LEADING_POSITIONAL and signature is not None:
            args, kwargs = _by_name(signature, var_kw, args, kwargs)
        if infers_fp8:
            kwargs.setdefault("is_fp8_kvcache", None)
        if is_sparse_fp8_call(*args, **kwargs):
            return api.sparse_fp8_decode(*args, **kwargs)
        return original(*args, **kwargs)

    return flash_mla_with_kvcache


def _forward_to(original, api_name):
    """A stand-in for ``original`` that calls sm12x's FlashMLA-compatible ``api_name``."""
    target = getattr(_api(), api_name)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        return target(*args, **kwargs)

    return forward


def _originals_run_here() -> bool:
    """Patches forced onto a GPU that is not SM12x (``SM12X_FORCE=1`` on an SM90 / SM100 GPU):
    FlashMLA's own scheduler runs there, and the dense calls that still go to the original decode
    need its real schedule, not sm12x's placeholders."""
    from sm12x import platform

    capability = platform.gpu_arch().capability
    return capability is not None and capability[0] != 12


def make_get_mla_metadata(original):
    """The old tensor API -> sm12x's placeholders (the original runs a CUDA kernel built for
    SM90a/SM100f). The current API (no tensor, or an original that takes ``*args`` and ignores
    them, as vLLM's dense backend calls it with tensors) -> the original's own empty metadata
    object, a plain Python object that sm12x's decode ignores and that callers may check the type
    of (SGLang 0.5.23's wrapper treats anything but a ``FlashMLASchedMeta`` as the tensor API;
    FlashMLA's dense decode asserts it); when the original raises (vLLM's stubs on SM12x),
    sm12x's own. Where the original runs (``_originals_run_here``), the tensor API too."""
    api = _api()
    native = _originals_run_here()
    ignores_arguments = takes_args(signature_of(original))  # the current API

    @functools.wraps(original)
    def get_mla_metadata(*args, **kwargs):
        first = args[0] if args else kwargs.get("cache_seqlens")
        if first is None or ignores_arguments or native:
            try:
                return original(*args, **kwargs)
            except Exception:  # a stub that says FlashMLA is missing
                pass
        return api.get_mla_metadata(*args, **kwargs)

    return get_mla_metadata


def make_get_mla_decoding_metadata(original):
    """sgl-flash-mla's tensor scheduler, which SGLang 0.5.23's ``get_mla_metadata(cache_seqlens,
    ...)`` calls: placeholders that sm12x's decode never reads; the original's own schedule where
    the original runs (``_originals_run_here``)."""
    if _originals_run_here():
        @functools.wraps(original)
        def own_schedule(*args, **kwargs):
            return original(*args, **kwargs)

        return own_schedule
    return _forward_to(original, "get_mla_decoding_metadata")


def make_sparse_decode_fwd(original):
    """``flash_mla.cuda.sparse_decode_fwd`` (12 positional arguments, 4 results)."""
    return _forward_to(original, "sparse_decode_fwd")


def make_flash_mla_with_kvcache_sm120(original):
    """SGLang's keyword-only SM120 entry (no block table, no scheduler metadata: the original
    ignores them, and so do we when a caller passes them)."""
    api = _api()

    @functools.wraps(original)
    def flash_mla_with_kvcache_sm120(q, k_cache, head_dim_v=512, **kwargs):
        kwargs.setdefault("is_fp8_kvcache", True)
        for unused in ("block_table", "cache_seqlens", "tile_scheduler_metadata"):
            kwargs.pop(unused, None)
        sched = api.get_mla_metadata()[0]
        return api.flash_mla_with_kvcache(q, k_cache, None, None, head_dim_v, sched, **kwargs)

    return flash_mla_with_kvcache_sm120


def _sparse_fwd(original, always_log2):
    """``flash_mla_sparse_fwd`` -> sm12x, in ``original``'s units: an original with named
    parameters but no ``attn_sink`` predates FlashMLA's 2026-01 interface (base 2, empty rows lse
    -inf); stubs taking ``*args, **kwargs`` (vLLM's on SM12x) count as current; ``always_log2``:
    base 2 whatever the original's era."""
    api = _api()
    read = signature_of(original)
    current = read is None or "attn_sink" in read.parameters or any(
        p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in read.parameters.values())
    log2 = always_log2 or not current
    empty_lse = float("inf") if current else float("-inf")
    signature, var_kw = _named_signature(original)

    @functools.wraps(original)
    def flash_mla_sparse_fwd(*args, **kwargs):
        if len(args) > PREFILL_LEADING_POSITIONAL and signature is not None:
            args, kwargs = _by_name(signature, var_kw, args, kwargs)
        result = api.flash_mla_sparse_fwd(*args, **kwargs)
        return api.to_log2_units(result, empty_lse) if log2 else result

    return flash_mla_sparse_fwd


def make_flash_mla_sparse_fwd(original):
    """FlashMLA's ``flash_mla_sparse_fwd`` (pip FlashMLA, sgl-flash-mla, vLLM's copies): sm12x's
    prefill in the units of the original's interface era."""
    return _sparse_fwd(original, always_log2=False)


def make_sgl_kernel_flash_mla_sparse_fwd(original):
    """sgl-kernel's ``flash_mla_sparse_fwd``: sm12x's prefill, lse and max_logits in base 2 (every
    sgl-kernel build multiplies them by log2(e) "for SGL compatibility")."""
    return _sparse_fwd(original, always_log2=True)

"""Route every FlashMLA sparse-decode and sparse-prefill entry point to sm12x's Triton kernels on
SM12x.

FlashMLA ships SM90a/SM100f code only; on SM12x its compiled op raises
``RuntimeError: Unsupported architecture for sparse decode fwd``. The replacements send the sparse
FP8 path (``indices`` given, ``is_fp8_kvcache=True``) to ``sm12x.kernels.flash_mla_api`` and every
other call (dense decode, BF16 caches) to the original function, unchanged.

Routes (see shared/research/sglang.md sections 2 and 10, vllm.md section 3):
- pip FlashMLA (SGLang's DeepSeek-V4 image: ``debug_flash_mla_adapter`` does a call-time
  ``import flash_mla`` and calls ``flash_mla.flash_mla_with_kvcache``), and the lower
  ``flash_mla.cuda.sparse_decode_fwd`` that the interface module resolves at call time. SGLang
  0.5.23 installs sgl-flash-mla as ``flash_mla`` and calls it through
  ``sglang.kernels.ops.attention.flash_mla_interface`` (call-time attribute lookups) with
  ``use_legacy``, ``kv_format`` and ``return_log2_lse``, and ``get_mla_decoding_metadata`` for
  its tensor scheduler; its ops load through ``torch.ops``, so there is no ``flash_mla.cuda``;
- ``sgl_kernel.flash_mla`` (SGLang eras B/C, non-SM120 branch);
- SGLang's own SM120 entry ``flash_mla_with_kvcache_sm120`` (eras B and C), whose FlashInfer
  default needs 64-token pages (a page-split copy every call) and lacks some head/topk shapes;
- vLLM: ``vllm.third_party.flashmla.flash_mla_interface`` and its re-export
  ``vllm.v1.attention.ops.flashmla``, which binds stubs that raise "FlashMLA is not available"
  when vLLM's FlashMLA extension does not import, and the vendored functions otherwise (whose
  CUDA op then fails on SM12x); both are patched, so either binding reaches the kernel. vLLM
  main (2026-08) sends DeepSeek-V4 and V3.2 attention on SM12x to FlashInfer instead, so these
  routes serve older builds and explicitly chosen FlashMLA backends.

Sparse prefill (``flash_mla_sparse_fwd``, bf16 rows; FlashMLA's op raises "only supported on
SM90a and SM100f", SGLang #31578) goes to sm12x on every route, in the units the route returns:
FlashMLA since 2026-01 (the version with ``attn_sink``) natural log; FlashMLA before, vLLM's old
``flash_mla_sparse_prefill`` and every sgl-kernel build base 2 (sgl-kernel multiplies the new
op's results by log2(e) "for SGL compatibility").
"""
from __future__ import annotations

import functools

from sm12x.patches import Patch, signature_of, takes_args

_API = "sm12x.kernels.flash_mla_api"
_FIXED = "none upstream (FlashMLA main has no SM12x code as of 2026-04)"
_WHY_DECODE = ("FlashMLA sparse decode has no SM120/SM121 kernel: 'RuntimeError: Unsupported "
               "architecture for sparse decode fwd' (csrc/api/sparse_decode.h)")
_WHY_META = ("the scheduler metadata must come from the same implementation as the decode call; "
             "the old tensor API runs a CUDA kernel built for SM90a/SM100f only")

# leading positional parameters shared by every FlashMLA version's flash_mla_with_kvcache
_COMMON_POSITIONAL = 6
# and of flash_mla_sparse_fwd (q, kv, indices, sm_scale, d_v, attn_sink, topk_length); after them
# sgl-flash-mla has use_legacy, return_log2_lse where vLLM's copy and sm12x have out
_PREFILL_POSITIONAL = 7


def _api():
    import importlib

    return importlib.import_module(_API)


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
        if len(args) > _COMMON_POSITIONAL and signature is not None:
            args, kwargs = _by_name(signature, var_kw, args, kwargs)
        if infers_fp8:
            kwargs.setdefault("is_fp8_kvcache", None)
        if api.is_sparse_fp8_call(*args, **kwargs):
            return api.flash_mla_with_kvcache(*args, **kwargs)
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


def _prefill_factory(always_log2):
    def make(original):
        """``flash_mla_sparse_fwd`` -> sm12x, in ``original``'s units: an original with named
        parameters but no ``attn_sink`` predates FlashMLA's 2026-01 interface (base 2, empty
        rows lse -inf); stubs taking ``*args, **kwargs`` (vLLM's on SM12x) count as current."""
        api = _api()
        read = signature_of(original)
        current = read is None or "attn_sink" in read.parameters or any(
            p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in read.parameters.values())
        log2 = always_log2 or not current
        empty_lse = float("inf") if current else float("-inf")
        signature, var_kw = _named_signature(original)

        @functools.wraps(original)
        def flash_mla_sparse_fwd(*args, **kwargs):
            if len(args) > _PREFILL_POSITIONAL and signature is not None:
                args, kwargs = _by_name(signature, var_kw, args, kwargs)
            result = api.flash_mla_sparse_fwd(*args, **kwargs)
            return api.to_log2_units(result, empty_lse) if log2 else result

        return flash_mla_sparse_fwd

    return make


make_flash_mla_sparse_fwd = _prefill_factory(always_log2=False)
make_sgl_kernel_flash_mla_sparse_fwd = _prefill_factory(always_log2=True)
_WHY_PREFILL = ("FlashMLA sparse prefill has no SM120/SM121 kernel: 'Sparse Attention Forward "
                "Kernel is only supported on SM90a and SM100f' (SGLang #31578, default since "
                "v0.5.15.post1)")


def _prefill(name, target, consumers=(), make="make_flash_mla_sparse_fwd"):
    return Patch(name=name, target=target, make=f"{__name__}:{make}", why=_WHY_PREFILL,
                 fixed_in=_FIXED, consumers=consumers)


def _decode(name, target, consumers=(), library="*", versions="*"):
    return Patch(name=name, target=target, make=f"{__name__}:make_flash_mla_with_kvcache",
                 why=_WHY_DECODE, fixed_in=_FIXED, library=library, versions=versions,
                 consumers=consumers)


def _meta(name, target, consumers=(), library="*", versions="*"):
    return Patch(name=name, target=target, make=f"{__name__}:make_get_mla_metadata",
                 why=_WHY_META, fixed_in=_FIXED, library=library, versions=versions,
                 consumers=consumers)


# modules that bind vLLM's FlashMLA functions by name at import (plugin route: rebound too)
_VLLM_CALLERS = ("vllm.models.deepseek_v4.nvidia.flashmla",
                 "vllm.models.deepseek_v4.attention.impl.flashmla",
                 "vllm.v1.attention.backends.mla.flashmla_sparse",
                 "vllm.v1.attention.backends.mla.sparse_swa",
                 # vLLM 0.33
                 "vllm.models.deepseek_v41.nvidia.flashmla",
                 "vllm.models.hy_v4.nvidia.flashmla_sparse",
                 "vllm.v1.attention.backends.mla.flashmla")
_VLLM_OPS = ("vllm.v1.attention.ops.flashmla",) + _VLLM_CALLERS

PATCHES = (
    # pip FlashMLA
    _decode("flash_mla.interface.decode", "flash_mla.flash_mla_interface:flash_mla_with_kvcache",
            consumers=("flash_mla",)),
    _decode("flash_mla.decode", "flash_mla:flash_mla_with_kvcache"),
    _meta("flash_mla.interface.metadata", "flash_mla.flash_mla_interface:get_mla_metadata",
          consumers=("flash_mla",)),
    _meta("flash_mla.metadata", "flash_mla:get_mla_metadata"),
    # sgl-flash-mla (SGLang 0.5.23): the tensor scheduler under its own name
    Patch(name="flash_mla.interface.decoding_metadata",
          target="flash_mla.flash_mla_interface:get_mla_decoding_metadata",
          make=f"{__name__}:make_get_mla_decoding_metadata", why=_WHY_META, fixed_in=_FIXED,
          consumers=("flash_mla",)),
    Patch(name="flash_mla.decoding_metadata", target="flash_mla:get_mla_decoding_metadata",
          make=f"{__name__}:make_get_mla_decoding_metadata", why=_WHY_META, fixed_in=_FIXED),
    Patch(name="flash_mla.cuda.sparse_decode_fwd", target="flash_mla.cuda:sparse_decode_fwd",
          make=f"{__name__}:make_sparse_decode_fwd", why=_WHY_DECODE, fixed_in=_FIXED),
    # sgl-kernel's copy
    _decode("sgl_kernel.flash_mla.decode", "sgl_kernel.flash_mla:flash_mla_with_kvcache",
            consumers=("sgl_kernel",)),
    _meta("sgl_kernel.flash_mla.metadata", "sgl_kernel.flash_mla:get_mla_metadata",
          consumers=("sgl_kernel",)),
    # SGLang's native SM120 entry (era C, then era B module path)
    Patch(name="sglang.flash_mla_sm120",
          target="sglang.kernels.ops.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=f"{__name__}:make_flash_mla_with_kvcache_sm120",
          why="SGLang's SM120 FlashMLA path defaults to FlashInfer, which needs 64-token pages "
              "(a page-split copy of every touched 256-token SWA page per call) and supports a "
              "fixed table of head/topk shapes (sglang.md 2.4; vLLM #56837)",
          fixed_in="none known", library="sglang", versions="*"),
    Patch(name="sglang.flash_mla_sm120.era_b",
          target="sglang.srt.layers.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=f"{__name__}:make_flash_mla_with_kvcache_sm120",
          why="as sglang.flash_mla_sm120, for the era-B module path",
          fixed_in="none known", library="sglang", versions="*"),
    # vLLM's vendored FlashMLA and the module that re-exports it (stubs on SM12x)
    _decode("vllm.third_party.flashmla.decode",
            "vllm.third_party.flashmla.flash_mla_interface:flash_mla_with_kvcache",
            consumers=_VLLM_OPS),
    _meta("vllm.third_party.flashmla.metadata",
          "vllm.third_party.flashmla.flash_mla_interface:get_mla_metadata", consumers=_VLLM_OPS),
    _decode("vllm.ops.flashmla.decode", "vllm.v1.attention.ops.flashmla:flash_mla_with_kvcache",
            consumers=_VLLM_CALLERS),
    _meta("vllm.ops.flashmla.metadata", "vllm.v1.attention.ops.flashmla:get_mla_metadata",
          consumers=_VLLM_CALLERS),
    # sparse prefill on every route
    _prefill("flash_mla.interface.sparse_fwd",
             "flash_mla.flash_mla_interface:flash_mla_sparse_fwd", consumers=("flash_mla",)),
    _prefill("flash_mla.sparse_fwd", "flash_mla:flash_mla_sparse_fwd"),
    _prefill("sgl_kernel.flash_mla.sparse_fwd", "sgl_kernel.flash_mla:flash_mla_sparse_fwd",
             consumers=("sgl_kernel",), make="make_sgl_kernel_flash_mla_sparse_fwd"),
    _prefill("vllm.third_party.flashmla.sparse_fwd",
             "vllm.third_party.flashmla.flash_mla_interface:flash_mla_sparse_fwd",
             consumers=_VLLM_OPS),
    _prefill("vllm.ops.flashmla.sparse_fwd", "vllm.v1.attention.ops.flashmla:flash_mla_sparse_fwd",
             consumers=_VLLM_CALLERS),
    _prefill("vllm.attention.ops.flashmla.sparse_prefill",
             "vllm.attention.ops.flashmla:flash_mla_sparse_prefill"),
)

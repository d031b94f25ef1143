"""Route every FlashMLA sparse-decode and sparse-prefill entry point to sm12x's Triton kernels on
SM12x.

FlashMLA ships SM90a/SM100f code only; on SM12x its compiled op raises
``RuntimeError: Unsupported architecture for sparse decode fwd``. The replacements send the sparse
FP8 path (``indices`` given, ``is_fp8_kvcache=True``) to ``sm12x.frontends.flash_mla.api`` and every
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

from sm12x.frontends.flash_mla import wrappers
from sm12x.patches import Patch

_FIXED = "none upstream (FlashMLA main has no SM12x code as of 2026-04)"
_WHY_DECODE = ("FlashMLA sparse decode has no SM120/SM121 kernel: 'RuntimeError: Unsupported "
               "architecture for sparse decode fwd' (csrc/api/sparse_decode.h)")
_WHY_META = ("the scheduler metadata must come from the same implementation as the decode call; "
             "the old tensor API runs a CUDA kernel built for SM90a/SM100f only")

_WHY_PREFILL = ("FlashMLA sparse prefill has no SM120/SM121 kernel: 'Sparse Attention Forward "
                "Kernel is only supported on SM90a and SM100f' (SGLang #31578, default since "
                "v0.5.15.post1)")


def _prefill(name, target, consumers=(), make=wrappers.make_flash_mla_sparse_fwd):
    return Patch(name=name, target=target, make=make, why=_WHY_PREFILL,
                 fixed_in=_FIXED, consumers=consumers)


def _decode(name, target, consumers=(), library="*", versions="*"):
    return Patch(name=name, target=target, make=wrappers.make_flash_mla_with_kvcache,
                 why=_WHY_DECODE, fixed_in=_FIXED, library=library, versions=versions,
                 consumers=consumers)


def _meta(name, target, consumers=(), library="*", versions="*"):
    return Patch(name=name, target=target, make=wrappers.make_get_mla_metadata,
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
          make=wrappers.make_get_mla_decoding_metadata, why=_WHY_META, fixed_in=_FIXED,
          consumers=("flash_mla",)),
    Patch(name="flash_mla.decoding_metadata", target="flash_mla:get_mla_decoding_metadata",
          make=wrappers.make_get_mla_decoding_metadata, why=_WHY_META, fixed_in=_FIXED),
    Patch(name="flash_mla.cuda.sparse_decode_fwd", target="flash_mla.cuda:sparse_decode_fwd",
          make=wrappers.make_sparse_decode_fwd, why=_WHY_DECODE, fixed_in=_FIXED),
    # sgl-kernel's copy
    _decode("sgl_kernel.flash_mla.decode", "sgl_kernel.flash_mla:flash_mla_with_kvcache",
            consumers=("sgl_kernel",)),
    _meta("sgl_kernel.flash_mla.metadata", "sgl_kernel.flash_mla:get_mla_metadata",
          consumers=("sgl_kernel",)),
    # SGLang's native SM120 entry (era C, then era B module path)
    Patch(name="sglang.flash_mla_sm120",
          target="sglang.kernels.ops.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=wrappers.make_flash_mla_with_kvcache_sm120,
          why="SGLang's SM120 FlashMLA path defaults to FlashInfer, which needs 64-token pages "
              "(a page-split copy of every touched 256-token SWA page per call) and supports a "
              "fixed table of head/topk shapes (sglang.md 2.4; vLLM #56837)",
          fixed_in="none known", library="sglang", versions="*"),
    Patch(name="sglang.flash_mla_sm120.era_b",
          target="sglang.srt.layers.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=wrappers.make_flash_mla_with_kvcache_sm120,
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
             consumers=("sgl_kernel",), make=wrappers.make_sgl_kernel_flash_mla_sparse_fwd),
    _prefill("vllm.third_party.flashmla.sparse_fwd",
             "vllm.third_party.flashmla.flash_mla_interface:flash_mla_sparse_fwd",
             consumers=_VLLM_OPS),
    _prefill("vllm.ops.flashmla.sparse_fwd", "vllm.v1.attention.ops.flashmla:flash_mla_sparse_fwd",
             consumers=_VLLM_CALLERS),
    _prefill("vllm.attention.ops.flashmla.sparse_prefill",
             "vllm.attention.ops.flashmla:flash_mla_sparse_prefill"),
)

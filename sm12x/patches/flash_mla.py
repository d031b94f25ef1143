"""Route every FlashMLA sparse-decode and sparse-prefill entry point to sm12x's Triton kernels on
SM12x.

FlashMLA ships SM90a/SM100f code only; on SM12x its compiled op raises
``RuntimeError: Unsupported architecture for sparse decode fwd``. The replacements send the sparse
FP8 path (``indices`` given, ``is_fp8_kvcache=True``) to ``sm12x.frontends.flash_mla.api`` and every
other call (dense decode, BF16 caches) to the original function, unchanged.

Routes:
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

from sm12x.kernels.manifest import factory
from sm12x.patches import Patch

# No FlashMLA release (pip flash-mla, sgl-flash-mla, the copies vendored in sgl-kernel and vLLM)
# has SM12x code, and the wrappers read each call by the installed function's own signature.
_ANY_FLASH_MLA = ("no FlashMLA build of any release has SM120/SM121 kernels; the wrapper reads each "
                  "call by the installed function's own signature, so no release needs its own code")
# No FlashMLA build has SM12x code; a release that has it gets its fixed_in per route.
_RETIRE = "FlashMLA ships SM120 / SM121 kernels for the sparse FP8 decode and the sparse prefill"
_RETIRE_SM120 = ("SGLang's SM120 FlashMLA entry serves every head / topk shape of DeepSeek-V4 without the "
                 "64-token page-split copy, measured at least as fast as sm12x (scripts/bench_framework_paths.py)")
_DECODE_ERROR = "'RuntimeError: Unsupported architecture for sparse decode fwd'"
_PREFILL_ERROR = "'Sparse Attention Forward Kernel is only supported on SM90a and SM100f'"
_FLASH_MLA_SRC = "deepseek-ai/FlashMLA csrc/api/sparse_decode.h (arch check), flash_mla_interface.py"
# checked: every vLLM release 0.22.1-0.34.0 (0.22.1-0.25.1 vendor one flash_mla_interface.py)
_VLLM = dict(library="vllm", versions=">=0.22.1,<0.35")
# checked: every release 0.4.4-0.4.10 (flash_mla.py: 0.4.4-0.4.7 one text but for formatting,
# 0.4.8-0.4.10 one text with kv_format)
_SGL_KERNEL = dict(library="sgl-kernel", versions=">=0.4.4,<0.5")
_PIP = dict(library="flash_mla", versions="*", versions_note=_ANY_FLASH_MLA)

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

# the prefill factories: FlashMLA's units (natural log since 2026-01), sgl-kernel's (base 2)
_PREFILL = factory("flash_mla.flash_mla_sparse_fwd", "make_flash_mla_sparse_fwd")
_PREFILL_BASE2 = factory("flash_mla.flash_mla_sparse_fwd", "make_sgl_kernel_flash_mla_sparse_fwd")
_SM120_ENTRY = factory("flash_mla.flash_mla_with_kvcache", "make_flash_mla_with_kvcache_sm120")

# Where a copy of FlashMLA's Python interface lives: (name prefix, module, who reaches it, range,
# upstream, modules holding `from X import f` copies, prefill factory)
_ROUTES = (
    ("flash_mla.interface", "flash_mla.flash_mla_interface",
     "pip FlashMLA / sgl-flash-mla's interface (SGLang's DeepSeek-V4 path)", _PIP, _FLASH_MLA_SRC,
     ("flash_mla",), _PREFILL),
    ("flash_mla", "flash_mla",
     "the flash_mla package re-export that SGLang's debug adapter looks up at call time", _PIP,
     "sglang srt/layers/attention/debug_flash_mla_adapter.py", (), _PREFILL),
    ("sgl_kernel.flash_mla", "sgl_kernel.flash_mla",
     "sgl-kernel's copy (SGLang's non-SM120 branch and forced backends; descale_q/k after the six "
     "common arguments; base-2 lse and max_logits 'for SGL compatibility')", _SGL_KERNEL,
     "sgl-kernel python/sgl_kernel/flash_mla.py",
     ("sgl_kernel", "sglang.srt.layers.attention.flashmla_backend"),
     _PREFILL_BASE2),
    ("vllm.third_party.flashmla", "vllm.third_party.flashmla.flash_mla_interface",
     "vLLM's vendored FlashMLA (SM90/SM100 builds only), behind its FlashMLA sparse backends", _VLLM,
     "vllm third_party/flashmla/flash_mla_interface.py", _VLLM_OPS, _PREFILL),
    ("vllm.ops.flashmla", "vllm.v1.attention.ops.flashmla",
     "vLLM's re-export, bound to stubs that raise 'FlashMLA is not available' when its FlashMLA "
     "extension does not import (SM12x builds)", _VLLM, "vllm v1/attention/ops/flashmla.py",
     _VLLM_CALLERS, _PREFILL),
)
# What each route's function does on SM12x: (record suffix, attribute, factory or None for the
# route's prefill factory, failure)
_FUNCTIONS = (
    ("decode", "flash_mla_with_kvcache", factory("flash_mla.flash_mla_with_kvcache", "make_flash_mla_with_kvcache"),
     f"the sparse FP8 decode raises {_DECODE_ERROR}"),
    ("metadata", "get_mla_metadata", factory("flash_mla.get_mla_metadata"),
     "the tensor scheduler runs a CUDA kernel built for SM90a/SM100f only"),
    ("sparse_fwd", "flash_mla_sparse_fwd", None,
     f"the sparse prefill (SGLang's default since 0.5.15.post1, #31578) raises {_PREFILL_ERROR}"),
)

PATCHES = tuple(
    Patch(name=f"{prefix}.{suffix}", target=f"{module}:{attr}", make=make or prefill_make,
          why=f"{who}: {failure}", upstream=upstream, consumers=consumers, retire_when=_RETIRE, **versions)
    for prefix, module, who, versions, upstream, consumers, prefill_make in _ROUTES
    for suffix, attr, make, failure in _FUNCTIONS
) + (
    # sgl-flash-mla's tensor scheduler under its own name (SGLang 0.5.23 calls it every batch)
    Patch(name="flash_mla.interface.decoding_metadata",
          target="flash_mla.flash_mla_interface:get_mla_decoding_metadata",
          make=factory("flash_mla.get_mla_decoding_metadata"), consumers=("flash_mla",),
          why="sgl-flash-mla's tensor scheduler (SGLang 0.5.23 calls it for every decode batch) runs "
              "a CUDA kernel with no SM12x build",
          upstream="sgl-flash-mla 1.0.0 flash_mla_interface.py; sglang 0.5.23 "
                   "kernels/ops/attention/flash_mla_interface.py", retire_when=_RETIRE, **_PIP),
    Patch(name="flash_mla.decoding_metadata", target="flash_mla:get_mla_decoding_metadata",
          make=factory("flash_mla.get_mla_decoding_metadata"),
          why="the package-level re-export of sgl-flash-mla's tensor scheduler",
          upstream="sgl-flash-mla 1.0.0 __init__.py", retire_when=_RETIRE, **_PIP),
    Patch(name="flash_mla.cuda.sparse_decode_fwd", target="flash_mla.cuda:sparse_decode_fwd",
          make=factory("flash_mla.cuda.sparse_decode_fwd"),
          why=f"FlashMLA's interface resolves the compiled op flash_mla.cuda.sparse_decode_fwd at "
              f"call time; on SM12x it raises {_DECODE_ERROR}",
          upstream=_FLASH_MLA_SRC, retire_when=_RETIRE, **_PIP),
    # SGLang's native SM120 entry (0.5.16 on, then 0.5.15.post1's module path)
    Patch(name="sglang.flash_mla_sm120",
          target="sglang.kernels.ops.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=_SM120_ENTRY,
          why="SGLang's SM120 FlashMLA path defaults to FlashInfer, which needs 64-token pages "
              "(a page-split copy of every touched 256-token SWA page per call) and supports a "
              "fixed table of head/topk shapes; its Triton / torch settings are 16-243x slower "
              "than sm12x (scripts/bench_framework_paths.py)",
          upstream="sglang kernels/ops/attention/flash_mla_sm120.py (0.5.16-0.5.19 read: deepseek_v4_backend.py "
                   "makes the same keyword call as 0.5.15.post1); vllm #56837", library="sglang",
          versions=">=0.5.16,<0.6", retire_when=_RETIRE_SM120),
    Patch(name="sglang.flash_mla_sm120.era_b",
          target="sglang.srt.layers.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=_SM120_ENTRY,
          why="the same SM120 entry at its module path before SGLang 0.5.16 moved kernels to "
              "sglang.kernels (0.5.15.post1 has it here; 0.5.16-0.5.18 only under sglang.kernels)",
          upstream="sglang 0.5.15.post1 srt/layers/attention/flash_mla_sm120.py", library="sglang",
          versions=">=0.5.15,<0.5.16", retire_when=_RETIRE_SM120),
)

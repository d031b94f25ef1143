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

# No FlashMLA release (pip flash-mla, sgl-flash-mla, the copies vendored in sgl-kernel and vLLM)
# has SM12x code, and the wrappers read each call by the installed function's own signature.
_ANY_FLASH_MLA = ("no FlashMLA build of any release has SM120/SM121 kernels; the wrapper reads each "
                  "call by the installed function's own signature, so no release needs its own code")
_DECODE_ERROR = "'RuntimeError: Unsupported architecture for sparse decode fwd'"
_PREFILL_ERROR = "'Sparse Attention Forward Kernel is only supported on SM90a and SM100f'"
_FLASH_MLA_SRC = "deepseek-ai/FlashMLA csrc/api/sparse_decode.h (arch check), flash_mla_interface.py"
_VLLM = dict(library="vllm", versions=">=0.22.1,<0.35")  # checked: 0.22.1, 0.25.1, 0.33.0, 0.34.0
_SGLANG = dict(library="sglang", versions=">=0.5.15,<0.6")  # checked: 0.5.15.post1, 0.5.19, 0.5.23
_SGL_KERNEL = dict(library="sgl-kernel", versions=">=0.4.4,<0.5")  # checked: 0.4.4, 0.4.6.post1, 0.4.10
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

PATCHES = (
    # pip FlashMLA / sgl-flash-mla (SGLang 0.5.23 installs it as ``flash_mla``)
    Patch(name="flash_mla.interface.decode",
          target="flash_mla.flash_mla_interface:flash_mla_with_kvcache",
          make=wrappers.make_flash_mla_with_kvcache, consumers=("flash_mla",),
          why=f"SGLang's DeepSeek-V4 path calls pip FlashMLA's sparse FP8 decode, which raises "
              f"{_DECODE_ERROR} on SM12x", upstream=_FLASH_MLA_SRC, **_PIP),
    Patch(name="flash_mla.decode", target="flash_mla:flash_mla_with_kvcache",
          make=wrappers.make_flash_mla_with_kvcache,
          why="the package-level re-export that SGLang's debug_flash_mla_adapter looks up at call "
              "time (flash_mla.flash_mla_with_kvcache)",
          upstream="sglang srt/layers/attention/debug_flash_mla_adapter.py", **_PIP),
    Patch(name="flash_mla.interface.metadata", target="flash_mla.flash_mla_interface:get_mla_metadata",
          make=wrappers.make_get_mla_metadata, consumers=("flash_mla",),
          why="the old tensor API runs FlashMLA's scheduler kernel, built for SM90a/SM100f only; "
              "sm12x's decode needs none of its schedule",
          upstream=_FLASH_MLA_SRC, **_PIP),
    Patch(name="flash_mla.metadata", target="flash_mla:get_mla_metadata",
          make=wrappers.make_get_mla_metadata,
          why="the package-level re-export of get_mla_metadata, called by name by SGLang's adapter",
          upstream=_FLASH_MLA_SRC, **_PIP),
    Patch(name="flash_mla.interface.decoding_metadata",
          target="flash_mla.flash_mla_interface:get_mla_decoding_metadata",
          make=wrappers.make_get_mla_decoding_metadata, consumers=("flash_mla",),
          why="sgl-flash-mla's tensor scheduler (SGLang 0.5.23 calls it for every decode batch) runs "
              "a CUDA kernel with no SM12x build",
          upstream="sgl-flash-mla 1.0.0 flash_mla_interface.py; sglang 0.5.23 "
                   "kernels/ops/attention/flash_mla_interface.py", **_PIP),
    Patch(name="flash_mla.decoding_metadata", target="flash_mla:get_mla_decoding_metadata",
          make=wrappers.make_get_mla_decoding_metadata,
          why="the package-level re-export of sgl-flash-mla's tensor scheduler",
          upstream="sgl-flash-mla 1.0.0 __init__.py", **_PIP),
    Patch(name="flash_mla.cuda.sparse_decode_fwd", target="flash_mla.cuda:sparse_decode_fwd",
          make=wrappers.make_sparse_decode_fwd,
          why=f"FlashMLA's interface resolves the compiled op flash_mla.cuda.sparse_decode_fwd at "
              f"call time; on SM12x it raises {_DECODE_ERROR}",
          upstream=_FLASH_MLA_SRC, **_PIP),
    # sgl-kernel's vendored copy
    Patch(name="sgl_kernel.flash_mla.decode", target="sgl_kernel.flash_mla:flash_mla_with_kvcache",
          make=wrappers.make_flash_mla_with_kvcache, consumers=("sgl_kernel",),
          why=f"sgl-kernel's FlashMLA copy (SGLang's non-SM120 branch, and forced backends) "
              f"raises {_DECODE_ERROR} on SM12x; it inserts descale_q/descale_k after the six "
              f"common arguments",
          upstream="sgl-kernel python/sgl_kernel/flash_mla.py", **_SGL_KERNEL),
    Patch(name="sgl_kernel.flash_mla.metadata", target="sgl_kernel.flash_mla:get_mla_metadata",
          make=wrappers.make_get_mla_metadata, consumers=("sgl_kernel",),
          why="sgl-kernel's get_mla_metadata runs the SM90a/SM100f scheduler kernel",
          upstream="sgl-kernel python/sgl_kernel/flash_mla.py", **_SGL_KERNEL),
    # SGLang's native SM120 entry (current module path, then the 0.5.15-0.5.19 one)
    Patch(name="sglang.flash_mla_sm120",
          target="sglang.kernels.ops.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=wrappers.make_flash_mla_with_kvcache_sm120,
          why="SGLang's SM120 FlashMLA path defaults to FlashInfer, which needs 64-token pages "
              "(a page-split copy of every touched 256-token SWA page per call) and supports a "
              "fixed table of head/topk shapes; its Triton / torch settings are 16-243x slower "
              "than sm12x (scripts/bench_framework_paths.py)",
          upstream="sglang kernels/ops/attention/flash_mla_sm120.py; vllm #56837", **_SGLANG),
    Patch(name="sglang.flash_mla_sm120.era_b",
          target="sglang.srt.layers.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120",
          make=wrappers.make_flash_mla_with_kvcache_sm120,
          why="the same SM120 entry at its module path before SGLang moved kernels to "
              "sglang.kernels (0.5.15-0.5.19)",
          upstream="sglang srt/layers/attention/flash_mla_sm120.py", **_SGLANG),
    # vLLM's vendored FlashMLA and the module that re-exports it (stubs on SM12x)
    Patch(name="vllm.third_party.flashmla.decode",
          target="vllm.third_party.flashmla.flash_mla_interface:flash_mla_with_kvcache",
          make=wrappers.make_flash_mla_with_kvcache, consumers=_VLLM_OPS,
          why=f"vLLM's vendored FlashMLA has SM90/SM100 builds only: {_DECODE_ERROR} for its "
              f"FlashMLA sparse backends on SM12x",
          upstream="vllm third_party/flashmla/flash_mla_interface.py", **_VLLM),
    Patch(name="vllm.third_party.flashmla.metadata",
          target="vllm.third_party.flashmla.flash_mla_interface:get_mla_metadata",
          make=wrappers.make_get_mla_metadata, consumers=_VLLM_OPS,
          why="vLLM's vendored get_mla_metadata runs the SM90a/SM100f scheduler kernel",
          upstream="vllm third_party/flashmla/flash_mla_interface.py", **_VLLM),
    Patch(name="vllm.ops.flashmla.decode",
          target="vllm.v1.attention.ops.flashmla:flash_mla_with_kvcache",
          make=wrappers.make_flash_mla_with_kvcache, consumers=_VLLM_CALLERS,
          why="vLLM's re-export binds stubs that raise 'FlashMLA is not available' when its "
              "FlashMLA extension does not import (SM12x builds)",
          upstream="vllm v1/attention/ops/flashmla.py", **_VLLM),
    Patch(name="vllm.ops.flashmla.metadata",
          target="vllm.v1.attention.ops.flashmla:get_mla_metadata",
          make=wrappers.make_get_mla_metadata, consumers=_VLLM_CALLERS,
          why="the stub get_mla_metadata of vLLM's re-export raises on SM12x builds",
          upstream="vllm v1/attention/ops/flashmla.py", **_VLLM),
    # sparse prefill on every route (units: natural log since FlashMLA's 2026-01 interface, base 2
    # before it and on every sgl-kernel build)
    Patch(name="flash_mla.interface.sparse_fwd",
          target="flash_mla.flash_mla_interface:flash_mla_sparse_fwd",
          make=wrappers.make_flash_mla_sparse_fwd, consumers=("flash_mla",),
          why=f"SGLang's default DeepSeek sparse prefill (since 0.5.15.post1) calls FlashMLA's "
              f"sparse prefill, which raises {_PREFILL_ERROR}",
          upstream="sglang #31578; FlashMLA csrc/api/sparse_fwd.h", **_PIP),
    Patch(name="flash_mla.sparse_fwd", target="flash_mla:flash_mla_sparse_fwd",
          make=wrappers.make_flash_mla_sparse_fwd,
          why="the package-level re-export of flash_mla_sparse_fwd, looked up at call time",
          upstream="sglang #31578", **_PIP),
    Patch(name="sgl_kernel.flash_mla.sparse_fwd", target="sgl_kernel.flash_mla:flash_mla_sparse_fwd",
          make=wrappers.make_sgl_kernel_flash_mla_sparse_fwd, consumers=("sgl_kernel",),
          why=f"sgl-kernel's sparse prefill raises {_PREFILL_ERROR}; it returns lse and max_logits "
              f"in base 2 ('for SGL compatibility')",
          upstream="sgl-kernel python/sgl_kernel/flash_mla.py", **_SGL_KERNEL),
    Patch(name="vllm.third_party.flashmla.sparse_fwd",
          target="vllm.third_party.flashmla.flash_mla_interface:flash_mla_sparse_fwd",
          make=wrappers.make_flash_mla_sparse_fwd, consumers=_VLLM_OPS,
          why=f"vLLM's vendored sparse prefill raises {_PREFILL_ERROR} for its FlashMLA sparse "
              f"backends on SM12x",
          upstream="vllm third_party/flashmla/flash_mla_interface.py", **_VLLM),
    Patch(name="vllm.ops.flashmla.sparse_fwd",
          target="vllm.v1.attention.ops.flashmla:flash_mla_sparse_fwd",
          make=wrappers.make_flash_mla_sparse_fwd, consumers=_VLLM_CALLERS,
          why="the stub flash_mla_sparse_fwd of vLLM's re-export raises on SM12x builds",
          upstream="vllm v1/attention/ops/flashmla.py", **_VLLM),
)

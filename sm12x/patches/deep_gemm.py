"""Route DeepGEMM's lightning-indexer functions to sm12x's Triton kernels on SM12x.

DeepGEMM main builds these kernels for SM90/SM100 only and raises "Unsupported architecture"
(attention.hpp:211) on SM12x; on stock vLLM 0.25.1 a single request past 256K dies with CUDA
error 719 in this path (seed 002). The replacements never call the original: on SM12x it is known
to fail. When no ``deep_gemm`` is installed at all, ``sm12x.shims`` provides a stand-in module with
the same functions, so vLLM's ``has_deep_gemm()`` and SGLang's ``import deep_gemm`` find them.

Consumers: vLLM's ``vllm.utils.deep_gemm`` resolves ``_fp8_fp4_*_impl`` from the module lazily
(``_lazy_init``), after our import-time patch; SGLang looks ``deep_gemm.<name>`` up at call time.
"""
from __future__ import annotations

from sm12x.frontends.deep_gemm import wrappers
from sm12x.patches import Patch

NAMES = ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata",
         "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits")
_WHY = ("DeepGEMM main has no SM120/SM121 indexer kernels: 'Unsupported architecture' "
        "(attention.hpp:211); >256K single requests crash with CUDA error 719 on vLLM 0.25.1")
_FIXED = "DeepGEMM PR #324 (nv_dev branch only, not in main as of 2026-06)"


# vLLM's wrappers resolve `_<name>_impl` globals from the module once (`_lazy_init`); when that ran
# before us (plugin route) those globals hold the originals and are rebound. The second module is
# the same wrapper file in a later vLLM source layout.
_CONSUMERS = ("vllm.utils.deep_gemm", "vllm.foundation.utilities.deep_gemm")


def _sglang_paged(name, target, why):
    """A patch that sends one of SGLang's own paged-logits functions to our kernel."""
    return Patch(name=name, target=target, make=wrappers.make_sglang_paged_logits_torch,
                 why=why, fixed_in="none known", library="sglang", versions="*")


_WHY_TORCH = ("SGLang's torch fallback for paged MQA logits asserts 1-D seq_lens but gets [T, 1] "
              "under EAGLE/MTP (crashes on the first multi-token batch), and is a slow per-request "
              "loop; on SM12x it is the path SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 selects")

PATCHES = tuple(
    Patch(name=f"{module}.{name}", target=f"{module}:{name}", make=wrappers.FACTORIES[name],
          why=_WHY, fixed_in=_FIXED, consumers=_CONSUMERS)
    for module in ("deep_gemm", "vllm.third_party.deep_gemm") for name in NAMES
) + tuple(
    _sglang_paged(f"sglang.{era}.indexer.paged_logits_torch",
                  f"sglang.srt.layers.attention.{era}.indexer:fp8_paged_mqa_logits_torch",
                  _WHY_TORCH)
    for era in ("compressed", "dsv4")
) + (
    # SGLang main (2026-07) on SM120 forces its own paged-logits paths for DeepSeek-V4 and never
    # calls DeepGEMM there: server_args sets SGLANG_OPT_USE_TILELANG_INDEXER and
    # SGLANG_FP8_PAGED_MQA_LOGITS_TORCH; dsv4/indexer.py then picks the TileLang kernel, else the
    # vectorised torch version. Both take the torch fallback's arguments.
    _sglang_paged("sglang.dsa.tilelang_paged_logits",
                  "sglang.kernels.ops.attention.dsa.tilelang_kernel:tilelang_fp8_paged_mqa_logits",
                  "SGLang's default DeepSeek-V4 paged indexer on SM120 (TileLang) asserts one query "
                  "token per row, 1-D seq_lens, head_dim 128 and 64-token blocks"),
    _sglang_paged("sglang.dsv4.indexer.paged_logits_torch_sm120",
                  "sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch_sm120",
                  "SGLang's SM120 torch paged indexer (chosen when TileLang is off) copies every "
                  "row's pages up to the longest request into bf16 (rows x max_seq_len x 128) on "
                  "each call"),
)

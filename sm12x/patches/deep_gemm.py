"""Route DeepGEMM's lightning-indexer functions to sm12x's Triton kernels on SM12x.

DeepGEMM main builds these kernels for SM90/SM100 only and raises "Unsupported architecture"
(attention.hpp:211) on SM12x; on stock vLLM 0.25.1 a single request past 256K dies with CUDA
error 719 in this path (32-bit offsets). The replacements never call the original: on SM12x it is known
to fail. When no ``deep_gemm`` is installed at all, ``sm12x.shims`` provides a stand-in module with
the same functions, so vLLM's ``has_deep_gemm()`` and SGLang's ``import deep_gemm`` find them.

Consumers: vLLM's ``vllm.utils.deep_gemm`` resolves ``_fp8_fp4_*_impl`` from the module lazily
(``_lazy_init``), after our import-time patch; SGLang looks ``deep_gemm.<name>`` up at call time.
"""
from __future__ import annotations

from sm12x.frontends.deep_gemm import wrappers
from sm12x.kernels.manifest import factory
from sm12x.patches import Patch
from sm12x.patches.indexer_topk import PAGED_LAYERS

_UNSUPPORTED = "DeepGEMM raises 'Unsupported architecture' (csrc/apis/attention.hpp) on SM12x builds"
_WHY = {
    "fp8_mqa_logits": f"the FP8 prefill indexer logits (SGLang's _nonpaged_mqa_logits, vLLM's "
                      f"sparse indexer prefill chunks): {_UNSUPPORTED}",
    "fp8_fp4_mqa_logits": f"the FP8/FP4 prefill indexer logits of DeepGEMM >= 2.6 (vLLM's MXFP4 "
                          f"indexer cache): {_UNSUPPORTED}",
    "get_paged_mqa_logits_metadata": "the paged-logits schedule must come from the implementation "
                                     "that runs the paged logits; DeepGEMM's scheduler kernel has "
                                     "no SM12x build",
    "fp8_paged_mqa_logits": f"the FP8 decode indexer logits: {_UNSUPPORTED}; a single request past "
                            f"256K dies with CUDA error 719 (32-bit offsets) on vLLM 0.25.1",
    "fp8_fp4_paged_mqa_logits": f"the FP8/FP4 decode indexer logits of DeepGEMM >= 2.6: "
                                f"{_UNSUPPORTED}; CUDA error 719 past 256K",
}
NAMES = tuple(_WHY)
# vLLM 0.33's vendored DeepGEMM 2.8 keeps only the fp8_fp4_* names of the logits functions
_VENDORED_RANGE = {"fp8_mqa_logits": ">=0.22.1,<0.33", "fp8_paged_mqa_logits": ">=0.22.1,<0.33"}
_ANY_DEEP_GEMM = ("DeepGEMM ships under several distributions with unrelated version numbers "
                  "(deep-gemm 2.x, sgl-deep-gemm 0.x); the wrapper reads each call by the installed "
                  "front end's own signature, so no release needs its own code; the FP8-only logits "
                  "names are gone from DeepGEMM 2.8 and sgl-deep-gemm 0.2.5, where they are skipped as "
                  "missing")
_UPSTREAM = "deepseek-ai/DeepGEMM csrc/apis/attention.hpp (arch check; 32-bit offsets: CUDA error 719 past 256K)"
_RETIRE_DEEP_GEMM = ("DeepGEMM ships SM120 / SM121 builds of its indexer kernels with 64-bit offsets (the record "
                     "then gets a fixed_in per distribution)")
_RETIRE_VENDORED = ("vLLM's vendored DeepGEMM indexer kernels run on SM12x past 256K keys (64-bit offsets) and "
                    "are measured at least as fast as sm12x's")
_RETIRE_SGLANG = ("SGLang's own paged-logits paths accept [T, 1] seq_lens and several query tokens per row, and "
                  "bound their memory by the logits budget on SM120")

# vLLM's wrappers resolve `_<name>_impl` globals from the module once (`_lazy_init`); when that ran
# before us (plugin route) those globals hold the originals and are rebound. The second module is
# the same wrapper file in a later vLLM source layout.
_CONSUMERS = ("vllm.utils.deep_gemm", "vllm.foundation.utilities.deep_gemm")


def _sglang_paged(name, target, why, upstream, versions=">=0.5.15,<0.6", consumers=(), layers=()):
    """A patch that sends one of SGLang's own paged-logits functions to our kernel."""
    return Patch(name=name, target=target, make=factory("sglang.fp8_paged_mqa_logits_torch"),
                 why=why, upstream=upstream, library="sglang", versions=versions, consumers=consumers,
                 retire_when=_RETIRE_SGLANG, layers=layers)


_WHY_TORCH = ("SGLang's torch fallback for paged MQA logits asserts 1-D seq_lens but gets [T, 1] "
              "under EAGLE/MTP (crashes on the first multi-token batch), and is a slow per-request "
              "loop; on SM12x it is the path SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 selects")

PATCHES = tuple(
    Patch(name=f"deep_gemm.{name}", target=f"deep_gemm:{name}", make=wrappers.FACTORIES[name],
          why=why, upstream=_UPSTREAM, library="deep_gemm", versions="*",
          versions_note=_ANY_DEEP_GEMM, consumers=_CONSUMERS, retire_when=_RETIRE_DEEP_GEMM,
          # SGLang's DeepSeek-V4 paged indexer imports this function at call time: the placeholder
          # for its top-k stacks on the real logits
          layers=(PAGED_LAYERS["deep_gemm"],) if name == "fp8_paged_mqa_logits" else ())
    for name, why in _WHY.items()
) + tuple(
    # vLLM 0.25.0 and later vendor DeepGEMM (2.5.0 with SM120 indexer kernels in 0.25.0, 2.8.1 in
    # 0.33): ``SM12X_SKIP=vllm.third_party.deep_gemm`` keeps the vendored kernels
    Patch(name=f"vllm.third_party.deep_gemm.{name}", target=f"vllm.third_party.deep_gemm:{name}",
          make=wrappers.FACTORIES[name],
          why=f"vLLM's vendored DeepGEMM: {why}",
          upstream="vllm third_party/deep_gemm; vllm utils/deep_gemm.py (_lazy_init)",
          library="vllm", versions=_VENDORED_RANGE.get(name, ">=0.22.1,<0.35"), consumers=_CONSUMERS,
          retire_when=_RETIRE_VENDORED)
    for name, why in _WHY.items()
) + (
    _sglang_paged("sglang.dsv4.indexer.paged_logits_torch",
                  "sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch",
                  _WHY_TORCH, "sglang srt/layers/attention/dsv4/indexer.py", layers=(PAGED_LAYERS["torch"],)),
    # SGLang main (2026-07) on SM120 forces its own paged-logits paths for DeepSeek-V4 and never
    # calls DeepGEMM there: server_args sets SGLANG_OPT_USE_TILELANG_INDEXER and
    # SGLANG_FP8_PAGED_MQA_LOGITS_TORCH; dsv4/indexer.py then picks the TileLang kernel, else the
    # vectorised torch version. Both take the torch fallback's arguments.
    _sglang_paged("sglang.dsa.tilelang_paged_logits",
                  "sglang.kernels.ops.attention.dsa.tilelang_kernel:tilelang_fp8_paged_mqa_logits",
                  "SGLang's default DeepSeek-V4 paged indexer on SM120 (TileLang) asserts one query "
                  "token per row, 1-D seq_lens, head_dim 128 and 64-token blocks",
                  "sglang kernels/ops/attention/dsa/tilelang_kernel.py; server_args.py (SM120 defaults)",
                  # 0.5.16 on (where SGLang moved it under sglang.kernels); the nsa module
                  # star-imports this one
                  versions=">=0.5.16,<0.6", consumers=("sglang.srt.layers.attention.nsa.tilelang_kernel",),
                  layers=(PAGED_LAYERS["tilelang"],)),
    # 0.5.15.post1's TileLang indexer, which dsv4/indexer.py imports at call time when
    # SGLANG_OPT_USE_TILELANG_INDEXER=1 (0.5.16 has only the sglang.kernels one)
    _sglang_paged("sglang.dsa.tilelang_paged_logits.srt",
                  "sglang.srt.layers.attention.dsa.tilelang_kernel:tilelang_fp8_paged_mqa_logits",
                  "SGLang 0.5.15's TileLang paged indexer asserts one query token per row, 1-D seq_lens, "
                  "head_dim 128, 64-token blocks and clean_logits=False",
                  "sglang 0.5.15.post1 srt/layers/attention/dsa/tilelang_kernel.py; dsv4/indexer.py",
                  versions=">=0.5.15,<0.5.16", consumers=("sglang.srt.layers.attention.nsa.tilelang_kernel",)),
    _sglang_paged("sglang.dsv4.indexer.paged_logits_torch_sm120",
                  "sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch_sm120",
                  "SGLang's SM120 torch paged indexer (chosen when TileLang is off) copies every "
                  "row's pages up to the longest request into bf16 (rows x max_seq_len x 128) on "
                  "each call", "sglang srt/layers/attention/dsv4/indexer.py", layers=(PAGED_LAYERS["torch_sm120"],)),
)

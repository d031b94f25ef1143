"""Patch records for DeepGEMM's grouped MoE GEMMs (FP8 and FP8 x MXFP4, contiguous and masked) on
SM12x.

Only where the installed DeepGEMM has no SM120 grouped kernel (checked in each release's wheel):
- vLLM 0.22.1 and 0.23.0 (the same MoE code on CUDA) vendor DeepGEMM 2.5.0 without SM120 kernels
  (no ``include/deep_gemm/impls/sm120_*``; its ``m_grouped_fp8_fp4_gemm_nt_contiguous`` dispatches
  SM90 / SM100 only and FP4 weights assert ``arch_major == 10``), and their
  ``DeepGemmFP4Experts._supports_current_device`` admits family 100 only, so DeepSeek-V4's MXFP4
  experts run as Marlin W4A16 there. The two records below route the
  grouped GEMM to sm12x and then admit the DeepGEMM MXFP4 experts (W4A8: FP8 activations x MXFP4
  weights on the block-scaled MMA) on SM12x; the oracle's own order (TRTLLM, DEEPGEMM_MXFP4, MARLIN)
  then picks them. SwiGLU (with DeepSeek-V4's clamp) and the activation re-quantisation stay
  vLLM's. vLLM 0.24.0 admits family 120 with the same SM120-less DeepGEMM; there the gate record
  of :mod:`sm12x.patches.deep_gemm_dense` turns DeepGEMM off on SM12x, so its experts are Marlin's
  (its DeepGemmFP4Experts, 0.25.0's, was not read for these records). vLLM 0.25.0 on (read: 0.25.0,
  0.25.1, 0.33.0, 0.34.0) vendors DeepGEMM with SM120 grouped kernels
  (``impls/sm120_fp8_fp4_gemm_1d1d.cuh`` handles the M-grouped layouts) and admits family 120: no
  record replaces them.
- sgl-deep-gemm 0.1.4 (SGLang 0.5.15.post1's pin) has no SM120 kernels; SGLang's
  ``deep_gemm_wrapper`` grouped entries (``grouped_gemm_nt_f8f8bf16_contig`` / ``_masked``) look up
  ``deep_gemm.m_grouped_fp8_gemm_nt_contiguous`` / ``deep_gemm.fp8_m_grouped_gemm_nt_masked`` at
  call time for its DeepGEMM MoE runner (``--moe-runner-backend deep_gemm``, DeepEP), which stop
  with DeepGEMM's "Unsupported architecture or scaling factor types" on SM12x. SGLang 0.5.15.post1
  itself runs no DeepGEMM on SM12x (``deep_gemm_wrapper/configurer.py`` on 12.0, and on 12.1 with
  :mod:`sm12x.patches.gb10`), so there these records serve a caller that runs this DeepGEMM anyway:
  SGLang on 12.1 where the gb10 record could not precede the configurer (plugin route), or a vLLM
  that imports it as ``deep_gemm`` (``_import_deep_gemm`` prefers it to the vendored copy).
  sgl-deep-gemm 0.1.4.post1 (SGLang 0.5.16's pin) has none either. From 0.1.5 sgl-deep-gemm
  carries SM120 kernels (``impls/sm120_*``, the file set of 0.1.7) and keeps its own: 0.1.5.post1
  (SGLang 0.5.17), 0.1.5.post3 (0.5.18), 0.1.7 (0.5.19), 0.2.3.post2 (0.5.23).

Record names are the target's dotted path, so ``SM12X_SKIP`` with a name, or with the prefix
``vllm.third_party.deep_gemm`` / ``deep_gemm``, keeps the originals (skipping the vLLM grouped GEMM
also restores vLLM's own expert choice: the device record follows it).
"""
from __future__ import annotations

from sm12x.frontends.deep_gemm import moe_wrappers
from sm12x.patches import Patch

# vLLM resolves `_grouped_*_impl` globals from the module once (`_lazy_init`); when that ran
# before us (plugin route) those globals hold the originals and are rebound. They are named
# ("module:global"): DeepGEMM binds one function under two names (sgl-deep-gemm 0.1.4:
# m_grouped_fp8_gemm_nt_contiguous is m_grouped_fp8_fp4_gemm_nt_contiguous,
# fp8_m_grouped_gemm_nt_masked is m_grouped_fp8_fp4_gemm_nt_masked), and a copy of an aliased
# function is otherwise rebound only under the target's own name.
_VLLM_MODULES = ("vllm.utils.deep_gemm", "vllm.foundation.utilities.deep_gemm")
_VLLM_CACHED = {"m_grouped_fp8_gemm_nt_contiguous": "_grouped_impl",
                "m_grouped_fp8_fp4_gemm_nt_contiguous": "_grouped_fp4_impl",
                "fp8_m_grouped_gemm_nt_masked": "_grouped_masked_impl"}


def _vllm_consumers(name: str) -> tuple:
    """The vLLM globals that cache DeepGEMM's ``name`` (none for a name vLLM does not cache)."""
    cached = _VLLM_CACHED.get(name)
    return tuple(f"{module}:{cached}" for module in _VLLM_MODULES) if cached else ()

_VENDORED = moe_wrappers.VLLM_VENDORED
_DG_UNSUPPORTED = ("deepseek-ai/DeepGEMM csrc/apis/gemm.hpp (m_grouped_fp8_fp4_gemm_nt_*: 'Unsupported "
                   "architecture or scaling factor types' outside SM90/SM100); SM120 kernels only in "
                   "nv_dev (DeepGEMM PR #324)")

PATCHES = (
    Patch(name=f"{_VENDORED}.m_grouped_fp8_fp4_gemm_nt_contiguous",
          target=f"{_VENDORED}:m_grouped_fp8_fp4_gemm_nt_contiguous",
          make=moe_wrappers.factory(_VENDORED, "m_grouped_fp8_fp4_gemm_nt_contiguous"),
          why="vLLM 0.22.1 / 0.23.0's vendored DeepGEMM 2.5.0 has no SM120 grouped FP8 x MXFP4 GEMM, which "
              "DeepGemmFP4Experts (DeepSeek-V4's MXFP4 experts, recipe_a (1, 128), recipe_b (1, 32), "
              "weights viewed as int8) calls for both expert GEMMs",
          upstream="vllm 0.22.1 model_executor/layers/fused_moe/experts/deep_gemm_moe.py "
                   "(DeepGemmFP4Experts.apply); " + _DG_UNSUPPORTED,
          library="vllm", versions=">=0.22.1,<0.24", fixed_in="0.25.0",
          consumers=_vllm_consumers("m_grouped_fp8_fp4_gemm_nt_contiguous")),
    Patch(name="vllm.fused_moe.DeepGemmFP4Experts._supports_current_device",
          target="vllm.model_executor.layers.fused_moe.experts.deep_gemm_moe:"
                 "DeepGemmFP4Experts._supports_current_device",
          make=moe_wrappers.make_supports_current_device,
          why="vLLM 0.22.1 / 0.23.0 admit the DeepGEMM MXFP4 experts on family 100 only, so DeepSeek-V4's "
              "MXFP4 MoE falls to Marlin W4A16 on SM12x; with the grouped GEMM above on sm12x the "
              "oracle (TRTLLM, DEEPGEMM_MXFP4, MARLIN) picks the W4A8 experts",
          upstream="vllm 0.22.1 model_executor/layers/fused_moe/oracle/mxfp4.py (_get_priority_backends, "
                   "select_deepseek_v4_mxfp4_moe_backend); 0.24.0 adds family 120 (vllm #43477), 0.25.0 "
                   "the SM120 kernels",
          library="vllm", versions=">=0.22.1,<0.24", fixed_in="0.25.0"),
) + tuple(
    Patch(name=f"deep_gemm.{name}", target=f"deep_gemm:{name}",
          make=moe_wrappers.FACTORIES[name],
          why=f"sgl-deep-gemm 0.1.4 has no SM120 grouped GEMM; {caller} on SM12x",
          upstream="sglang 0.5.15.post1 srt/layers/deep_gemm_wrapper/entrypoint.py; " + _DG_UNSUPPORTED,
          library="deep_gemm", versions=">=0.1.4,<0.1.5", fixed_in="0.1.5", consumers=_vllm_consumers(name))
    for name, caller in (
        ("m_grouped_fp8_gemm_nt_contiguous",
         "SGLang's DeepGEMM MoE runner (deep_gemm_wrapper.grouped_gemm_nt_f8f8bf16_contig) stops there"),
        ("m_grouped_fp8_fp4_gemm_nt_contiguous",
         "an FP8 x MXFP4 expert call (the name SGLang 0.5.23 probes for its SM120 DeepGEMM paths) stops there"),
        ("fp8_m_grouped_gemm_nt_masked",
         "SGLang's masked MoE path (deep_gemm_wrapper.grouped_gemm_nt_f8f8bf16_masked, DeepEP low "
         "latency) stops there"),
        ("m_grouped_fp8_fp4_gemm_nt_masked", "a masked FP8 / FP8 x MXFP4 expert call stops there"),
    )
)

"""Patch records for DeepGEMM's dense paths (FP8 block GEMM, FP8 einsum, mHC pre-norm GEMM) on SM12x.

Only where the installed DeepGEMM has no SM120 kernel for the call (checked in each release's
wheel); a DeepGEMM that has them (vLLM >= 0.25.0's vendored copy: ``impls/sm120_fp8_fp4_gemm_1d1d``,
``sm120_bmk_bnk_mn``, ``sm120_tf32_hc_prenorm_gemm``; sgl-deep-gemm >= 0.1.5: 0.1.5, 0.1.5.post1 and
0.1.5.post3, the pins of SGLang 0.5.17 / 0.5.18, carry the impls/sm120_* files of 0.1.7) keeps its
own.

- vLLM 0.22.1, 0.23.0 and 0.24.0 vendor the same DeepGEMM 2.5.0, without SM120 kernels. Their
  DeepSeek-V4 attention calls ``fp8_einsum("bhr,hdr->bhd", ...)`` for ``wo_a`` unconditionally
  (0.22.1: ``vllm/models/deepseek_v4/attention.py``, ``deepseek_v4_fp8_einsum``; 0.23.0 / 0.24.0:
  ``models/deepseek_v4/nvidia/ops/o_proj.py``, ``deep_gemm_fp8_o_proj``; both through
  ``vllm.utils.deep_gemm.fp8_einsum`` and the cached ``_fp8_einsum_impl``), so every DeepSeek-V4
  forward stops there on SM12x. ``fp8_gemm_nt`` and ``tf32_hc_prenorm_gemm`` are gated off on SM12x
  in 0.22.1 / 0.23.0 (``support_deep_gemm()`` is cap 9.0 / family 100), and replaced as well so
  that a user who forces them gets a working kernel.
- vLLM 0.24.0 adds the SM120 family to ``support_deep_gemm()`` (vllm #43477) but still vendors that
  DeepGEMM, so on SM12x every DeepGEMM path vLLM then takes stops: FP8 linears' weight
  post-processing (``transform_sf_into_required_layout``: "Unknown SF transformation"), the kernel
  warmup ("Unknown recipe"), the MoE experts (vllm #47130, #47436; users set
  ``VLLM_USE_DEEP_GEMM=0``). The gate record answers no there for 0.24.0 only, as 0.23.0 does, so
  0.24.0 runs as 0.23.0 on SM12x (its own CUTLASS / Triton linears, Marlin MXFP4 experts) and the
  records above serve the calls made regardless of the gate. 0.25.0 vendors DeepGEMM with SM120
  kernels and keeps the gate (no record).
- sgl-deep-gemm 0.1.4 (SGLang 0.5.15.post1's pin) and 0.1.4.post1 (0.5.16's) have no SM120 kernels: ``tf32_hc_prenorm_gemm``
  raises "Unsupported architecture" (hyperconnection.hpp, sglang#25877) and
  ``transform_sf_into_required_layout`` / ``fp8_einsum`` fail in layout.hpp. SGLang 0.5.15.post1
  turns its DeepGEMM wo_a and pre-norm options off on SM120 itself (server_args.py), so these
  records serve users and recipes that turn them back on, and SGLang's ``deep_gemm_wrapper``
  entry points (which look ``deep_gemm.<name>`` up at call time).

Record names are the target's dotted path (``vllm.third_party.deep_gemm.fp8_einsum``,
``deep_gemm.tf32_hc_prenorm_gemm``, ``vllm.platforms.cuda.support_deep_gemm``), so ``SM12X_SKIP``
with a record's name, or with the prefix ``vllm.third_party.deep_gemm`` / ``deep_gemm``, keeps the
originals.
"""
from __future__ import annotations

from sm12x.frontends.deep_gemm import gemm_wrappers
from sm12x.frontends.vllm import gates as vllm_gates
from sm12x.patches import Patch

# vLLM resolves `_<name>_impl` globals from the module once (`_lazy_init`); when that ran before
# us (plugin route) those globals hold the originals and are rebound.
_VLLM_CONSUMERS = ("vllm.utils.deep_gemm", "vllm.foundation.utilities.deep_gemm")

_VLLM_WHY = {
    "fp8_einsum": "DeepSeek-V4's wo_a projection (fp8_einsum 'bhr,hdr->bhd') is called on every "
                  "forward with no SM12x gate; the DeepGEMM 2.5.0 that vLLM 0.22.1-0.24.0 vendor has no "
                  "SM120 kernel for it",
    "fp8_gemm_nt": "the DeepGEMM 2.5.0 that vLLM 0.22.1-0.24.0 vendor has no SM120 FP8 GEMM (the linears "
                   "are gated off on SM12x, in 0.24.0 by the gate record; this serves a forced VLLM "
                   "DeepGEMM linear backend)",
    "tf32_hc_prenorm_gemm": "the DeepGEMM 2.5.0 that vLLM 0.22.1-0.24.0 vendor has no SM120 mHC pre-norm "
                            "GEMM (gated off on SM12x, in 0.24.0 by the gate record; this serves a forced "
                            "DeepGEMM pre-norm)",
}
_SGL_WHY = {
    "fp8_gemm_nt": "sgl-deep-gemm 0.1.4 has no SM120 FP8 GEMM (SGLang's DeepGEMM linear backend "
                   "and deep_gemm_wrapper.gemm_nt_f8f8bf16 stop on SM12x)",
    "fp8_gemm_nn": "sgl-deep-gemm 0.1.4 has no SM120 FP8 GEMM for a [K, N] weight (nn form)",
    "fp8_gemm_tn": "sgl-deep-gemm 0.1.4 has no SM120 FP8 GEMM for [K, M] x [K, N] operands (tn form)",
    "fp8_gemm_tt": "sgl-deep-gemm 0.1.4 has no SM120 FP8 GEMM for a [K, M] activation (tt form)",
    "fp8_einsum": "sgl-deep-gemm 0.1.4 has no SM120 fp8_einsum (SGLANG_OPT_FP8_WO_A_GEMM fails in "
                  "layout.hpp on SM120, sglang#25877)",
    "tf32_hc_prenorm_gemm": "sgl-deep-gemm 0.1.4 raises 'Unsupported architecture' in "
                            "hyperconnection.hpp on SM120 (SGLANG_OPT_DEEPGEMM_HC_PRENORM, sglang#25877)",
    "transform_sf_into_required_layout": "sgl-deep-gemm 0.1.4 has no SM120 scale layout "
                                         "('Unsupported architecture', layout.hpp; SGLang's "
                                         "_setup_fp8_wo_a_scales, sglang#25877)",
}

PATCHES = tuple(
    Patch(name=f"vllm.third_party.deep_gemm.{name}", target=f"vllm.third_party.deep_gemm:{name}",
          make=gemm_wrappers.FACTORIES[name], why=why,
          upstream="vllm 0.22.1 vllm/models/deepseek_v4/attention.py (deepseek_v4_fp8_einsum), 0.23.0 / "
                   "0.24.0 models/deepseek_v4/nvidia/ops/o_proj.py (deep_gemm_fp8_o_proj); vllm/utils/"
                   "deep_gemm.py (_lazy_init); vendored DeepGEMM 2.5.0 has no impls/sm120_* (0.25.0's has)",
          library="vllm", versions=">=0.22.1,<0.25", fixed_in="0.25.0", consumers=_VLLM_CONSUMERS)
    for name, why in _VLLM_WHY.items()
) + (
    Patch(name="vllm.platforms.cuda.support_deep_gemm",
          target="vllm.platforms.cuda:CudaPlatformBase.support_deep_gemm",
          make=vllm_gates.make_support_deep_gemm,
          why="vLLM 0.24.0 turns DeepGEMM on for the SM120 family while the DeepGEMM it vendors (2.5.0) has "
              "no SM120 kernels, so FP8 linears stop at weight loading ('Unknown SF transformation'), the "
              "kernel warmup at 'Unknown recipe' and the MoE experts in the grouped GEMM; on SM12x the gate "
              "answers no, as 0.23.0's does (vLLM's own linears and Marlin experts; the records above serve "
              "DeepSeek-V4's fp8_einsum, the indexer records its logits)",
          upstream="vllm 0.24.0 platforms/cuda.py CudaPlatformBase.support_deep_gemm (family 120, vllm #43477), "
                   "utils/deep_gemm.py is_deep_gemm_supported; cmake/external_projects/deepgemm.cmake pin "
                   "891d57b4; vllm #47130, #47436 (VLLM_USE_DEEP_GEMM=0 as the workaround)",
          library="vllm", versions=">=0.24.0,<0.25", fixed_in="0.25.0"),
) + tuple(
    Patch(name=f"deep_gemm.{name}", target=f"deep_gemm:{name}",
          make=gemm_wrappers.FACTORIES[name], why=why,
          upstream="sgl-project/sglang#25877; deepseek-ai/DeepGEMM#317 (SM120 kernels only in nv_dev, PR #324)",
          library="deep_gemm", versions="<0.1.5", fixed_in="0.1.5", consumers=_VLLM_CONSUMERS)
    for name, why in _SGL_WHY.items()
)

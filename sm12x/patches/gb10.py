"""Patch records for the frameworks' own gates that answer GB10 (sm_121, compute capability 12.1)
differently from sm_120 where sm12x serves both alike.

sm12x plans 12.1 exactly like 12.0. A gate that asks "is this SM120?" with an exact test
(``get_device_sm() == 120``, ``get_device_capability() == (12, 0)``, ``is_device_capability(120)``)
sends GB10 down a path 12.0 never takes. These records (``arch="12.1"``: applied on GB10 only) make
such a gate answer as on 12.0 for the one question it gates, and nothing else.

Patched:
- SGLang 0.5.15-0.5.20's DeepGEMM configurer (``deep_gemm_wrapper.configurer``) asks
  ``get_device_sm() == 120`` only: whether DeepGEMM is on (0.5.15-0.5.19: off on 12.0; 0.5.20:
  on with DeepGEMM's SM120 entry point) and, in 0.5.20, whether its scales are UE8M0; GB10 runs
  DeepGEMM with SM90 settings (record ``sglang.gb10.deep_gemm_gate``; from SGLang 0.5.21 the
  configurer asks ``in (120, 121)`` itself).

Read in vLLM 0.22.1, 0.25.1, 0.33.0, 0.34.0, SGLang 0.5.15.post1, 0.5.19-0.5.23, sgl-kernel 0.4.10,
sgl-deep-gemm 0.1.4-0.2.5, FlashInfer 0.6.14-0.7.4 and left alone (12.1's answer is right, or the path
is not one sm12x serves):
- vLLM ``CudaPlatformBase.support_deep_gemm`` (family 120, vllm#54125, PR #54600): GB10 answers as
  12.0; the GB10 failures traced in vllm#52732 / #53055 came from DeepGEMM pins without SM12x code
  (layout.hpp / hyperconnection.hpp errors 12.0 hits too), and excluding SM121 broke GB10's FP8 linears.
- DeepGEMM's JIT target on GB10: vLLM 0.25.1's vendored ``DeviceRuntime::get_arch`` and sgl-deep-gemm
  0.1.7 give 12.1 its own branch (sm_121a, or sm_120f with nvcc family support; read from the
  disassembly); later builds carry no 12.0-only ``120a`` string (vLLM 0.33/0.34: ``100f`` only;
  sgl-deep-gemm 0.2.x: ``100f``/``120f``). vllm-gb10#27's CUDA_ERROR_INVALID_IMAGE came from DeepGEMM
  nv_dev 2073ddb, which no release vendors.
- vLLM's family checks (``DeepGemmQuantScaleFMT``, ``get_paged_mqa_page_sizes``, the cooperative
  top-k exclusion, ``DeepGemmFP4Experts._supports_current_device``): ``is_device_capability_family(120)``
  matches 12.1.
- vLLM's sparse-MLA selection (``FlashInferMLASparseSM120Backend``: ``major == 12``; DeepSeek-V4's
  FlashInfer SM120 attention: ``major in [10, 12]``; ``_select_dsv4_attn_cls``: ``major == 12``): 12.1
  as 12.0. FlashMLA(Sparse) backends' ``major in [9, 10]`` (#45317, PR #46055) refuse 12.0 as well.
- vLLM's FP4 indexer cache (``use_fp4_indexer_cache`` needs family 100): refused on 12.0 and 12.1
  alike, and sm12x serves the FP8 indexer cache only.
- vLLM 0.25.1 ``fa4_cutedsl_config._fa4_architecture_family_from_compute_capability`` (``== (12, 0)``,
  ValueError on 12.1): FA4 dense MLA-prefill warm-up only; SM12x gets flash-attn 2 unless forced.
- vLLM 0.33/0.34 ``EngineArgs`` ``is_gb10`` (``is_device_capability((12, 1))``): a deliberate
  scheduler default for GB10's compute, not a wrong answer.
- vLLM 0.33/0.34 ``minimax_m3...index_topk`` and ``qwen4_exp...qsa`` (``== (12, 0)``): other models.
- SGLang ``is_sm120_supported`` / ``get_platform().is_sm120`` (major 12): every DeepSeek-V4 / DSA SM120
  branch, the FP8 ``auto`` -> CUTLASS/Triton rewrite and the model hook's SM120 defaults take 12.1 too.
- SGLang 0.5.23 ``model_loader.utils.should_deepgemm_weight_requant_ue8m0`` (``get_device_sm() == 120``):
  differs only for a dense block-FP8 layer on DeepGEMM (``--fp8-gemm-backend deep_gemm``; ``auto`` is
  CUTLASS on SM12x, so nothing is requantised), where 12.1's UE8M0 requant is what DeepGEMM reads.
- SGLang 0.5.23 exact ``is_sm120()`` / ``(12, 0)`` users (FlashInfer-CUTLASS NVFP4 MoE fast paths,
  the ``_SM120`` NVFP4 GEMM registrations, the opt-in SM120 MTP router top-22, Qwen / Nemotron
  kernels): 12.0-tuned kernels of paths sm12x does not serve; GB10 runs the generic path.
- sgl-kernel 0.4.10 ``load_utils._load_architecture_specific_ops``: 12.0 and 12.1 both load ``sm100/``.
- FlashInfer 0.6.14, 0.7.2.post1, 0.7.4 (the DeepSeek-V4 sparse MLA vLLM calls, record
  ``vllm.flashinfer_dsv4``): ``mla._core`` refuses only ``not is_sm12x_supported`` (major 12; SM121a
  with CUDA >= 12.9), and the auto MLA policy takes ``is_sm120a_supported or is_sm121a_supported``.
  ``cake_dsv41_mixed``'s ``unified_memory=(12, 1)`` is a deliberate GB10 setting; ``decode.py``'s
  ``== (12, 0)`` guards an FA2 FP8 head-dim-256 decode, not DeepSeek's.
"""
from __future__ import annotations

from sm12x.frontends.sglang import gates as sglang_gates
from sm12x.patches import Patch

PATCHES = (
    Patch(name="sglang.gb10.deep_gemm_gate", target="sglang.srt.utils.common:get_device_sm",
          make=sglang_gates.make_get_device_sm,
          why="SGLang 0.5.15-0.5.20's DeepGEMM configurer compares get_device_sm() with 120 only, so on "
              "GB10 (121) SGLang runs DeepGEMM recipes that DeepGEMM refuses on SM12x (JIT DeepGEMM on, or "
              "SM90's float32 scales); the configurer's questions alone are answered as on 12.0",
          notes="0.5.15-0.5.19: ENABLE_JIT_DEEPGEMM on where 12.0 has it off; 0.5.20: the scales stay SM90's "
                "float32 where 12.0 takes UE8M0; then the FP8 MoE runner (auto with DeepEP / Mooncake / NIXL), "
                "the JIT warm-up and the opt-in kv_b_proj BMM (SGL_USE_DEEPGEMM_BMM) stop (sgl-deep-gemm 0.1.4 "
                "has no SM12x kernels; the SM12x kernels assert power-of-two scales, sglang#39482); asked once, "
                "at the configurer's import: the patch must be in place before that",
          upstream="sglang 0.5.15-0.5.19 srt/layers/deep_gemm_wrapper/configurer.py:22 "
                   "(_compute_enable_deep_gemm: `if sm_version == 120: return False`), 0.5.20 (the SM120 "
                   "entry-point probe and DEEPGEMM_SCALE_UE8M0 for == 120); sgl-project/sglang#36551, "
                   "fixed by #39482 (0.5.21: `sm_version in (120, 121)`)",
          library="sglang", versions=">=0.5.15,<0.5.21", fixed_in="0.5.21", arch="12.1",
          consumers=("sglang.srt.utils", sglang_gates.CONFIGURER)),
)

"""Patch records for SGLang's choices of DeepSeek-V4 MoE expert kernels that end on SM100-only
kernels on SM12x (checked in the SGLang 0.5.15, 0.5.15.post1, 0.5.16-0.5.19 and 0.5.23 wheels;
0.5.15's MoE, quantization and server-argument code is 0.5.15.post1's).

What each release runs for DeepSeek-V4's experts on SM12x, and which choices are replaced:

- FP8 checkpoints with MXFP4 routed experts (DeepSeek-V4-Flash / -Pro), target and MTP draft
  alike (the draft's ``--speculative-moe-runner-backend`` defaults to the target's): SGLang's own
  SM120 kernels serve. 0.5.15 / 0.5.15.post1 turn ``auto`` into ``marlin`` on SM120
  (``arg_groups/overrides.py: _deepseek_v4_sm120_moe``; ``Mxfp4MarlinMoEMethod``, W4A16);
  0.5.16-0.5.18 (the same pass) and 0.5.19 / 0.5.23 (``arg_groups/model_overrides/
  deepseek_v4.py``) turn it into ``flashinfer_mxfp4``, for which ``Fp8Config`` picks FlashInfer's
  CUTLASS MXFP8 x MXFP4 method on SM120 (``is_sm120_supported``: major 12). Left as they are. Only
  an explicit ``--moe-runner-backend flashinfer_mxfp4`` on 0.5.15(.post1) reaches the TRT-LLM method
  there (``Fp8Config`` sends every GPU but SM90 to it): the ``Fp8Config`` record.
- Hybrid FP8 + NVFP4 checkpoints (``HybridFp8NvFp4Config``: NVFP4 routed experts, MXFP4 experts in
  the NVFP4-excluded MTP layer): ``get_quant_method`` returns FlashInfer's TRT-LLM MXFP4 method for
  the MTP layer in every release, whatever ``--speculative-moe-runner-backend`` says, so the
  users' ``--speculative-moe-runner-backend marlin`` workaround changes nothing there: the hybrid
  record. The target's NVFP4 experts: the DeepSeek-V4 override (a registered function, so not a
  target) picks ``flashinfer_trtllm_routed`` (SM100-only) for ``auto`` on every GPU; sm12x has no
  NVFP4 grouped GEMM. From 0.5.17 SGLang's own NVFP4 Marlin serves SM12x (W4A16; its Marlin runner
  applies the SwiGLU clamp and the routed scaling, which the top-k then leaves out), so the
  runner-choice record turns a TRT-LLM runner into ``marlin`` for these checkpoints in the MoE
  kernel-config pass that runs after the override; the draft then inherits ``marlin`` (the
  speculative default runs after that pass). 0.5.17 and 0.5.18 run the same pass from
  ``ServerArgs._handle_moe_kernel_config`` (imported at the call; 0.5.19 on: ``moe_hook``), with
  0.5.19's DeepSeek-V4 override (then in ``arg_groups/overrides.py``), Marlin fallback of
  ``ModelOptNvFp4FusedMoEMethod``, top-k scaling rule, Marlin runner and JIT kernel source (0.5.17's
  outside a C++ namespace). Not in 0.5.15(.post1) or 0.5.16: there the top-k scales by the routed
  factor for every NVFP4 method (``fused_moe_triton/layer.py``) and the NVFP4 Marlin sum scales
  again (``fused_marlin_moe.py``), ``flashinfer_cutlass`` runs without the clamp, and no SM12x path
  for these experts is correct.
  ``flashinfer_cutlass`` passes the clamp from 0.5.23 on.
- The DeepGEMM runner (``--moe-runner-backend deep_gemm``, DeepEP): its grouped GEMMs are the
  ``deep_gemm`` records of :mod:`sm12x.patches.deep_gemm_moe` where the installed DeepGEMM has no
  SM120 kernels (sgl-deep-gemm 0.1.4). SGLang 0.5.15-0.5.19 run no DeepGEMM on SM12x
  (``deep_gemm_wrapper/configurer.py`` on 12.0; on 12.1 through :mod:`sm12x.patches.gb10`), so the
  runner cannot run there at all (``deep_gemm_wrapper`` never imports ``deep_gemm``) and the hybrid
  record does not pick it; 0.5.23 turns DeepGEMM on for SM12x only when the installed DeepGEMM
  has SM120 kernels (sgl-deep-gemm 0.2.3.post2, its own).

Record names: ``sglang.moe.<config>.get_quant_method``, ``sglang.moe.runner_choice``;
``SM12X_SKIP=sglang.moe`` keeps SGLang's choices.
"""
from __future__ import annotations

from sm12x.frontends.sglang import moe
from sm12x.patches import Patch

_TRTLLM = ("sglang {v} srt/layers/quantization/mxfp4_flashinfer_trtllm_moe.py "
           "(Mxfp4FlashinferTrtllmMoEMethod -> flashinfer trtllm_fp4_block_scale_routed_moe, trtllm-gen SM100)")

PATCHES = (
    Patch(name="sglang.moe.HybridFp8NvFp4Config.get_quant_method",
          target="sglang.srt.layers.quantization.modelopt_quant:HybridFp8NvFp4Config.get_quant_method",
          make=moe.make_hybrid_get_quant_method,
          why="the DeepSeek-V4 NVFP4 checkpoints' MTP draft layer (MXFP4 experts, excluded from NVFP4) "
              "always gets FlashInfer's TRT-LLM MXFP4 MoE, SM100-only, whatever "
              "--speculative-moe-runner-backend says; on SM12x it gets Fp8Config's method for that "
              "runner when that is not SM100-only (marlin, flashinfer_mxfp4 from 0.5.16, humming, "
              "deep_gemm while SGLang runs DeepGEMM), else SGLang's MXFP4 Marlin",
          upstream="sglang 0.5.15-0.5.23 srt/layers/quantization/modelopt_quant.py "
                   "(HybridFp8NvFp4Config.get_quant_method: 'Fall back to MXFP4 for MTP MoE layers'); "
                   + _TRTLLM.format(v="0.5.15-0.5.23")
                   + "; dgxarley: 'nextn draft MoE hard-codes an SM100 trtllm kernel'",
          library="sglang", versions=">=0.5.15,<0.5.24",
          retire_when="SGLang's NVFP4 draft-layer fallback honours --speculative-moe-runner-backend or picks an "
                      "MXFP4 MoE method that runs on SM12x"),
    Patch(name="sglang.moe.Fp8Config.get_quant_method",
          target="sglang.srt.layers.quantization.fp8:Fp8Config.get_quant_method",
          make=moe.make_fp8_get_quant_method,
          why="SGLang 0.5.15 / 0.5.15.post1 send MXFP4 experts under --moe-runner-backend flashinfer_mxfp4 to "
              "FlashInfer's TRT-LLM MXFP4 MoE (SM100-only) on every GPU but SM90; on SM12x they get "
              "SGLang's MXFP4 Marlin, its own DeepSeek-V4 choice on SM120",
          upstream="sglang 0.5.15.post1 srt/layers/quantization/fp8.py (Fp8Config.get_quant_method, "
                   "is_flashinfer_mxfp4 branch); 0.5.16-0.5.19 pick Mxfp4FlashinferCutlassMoEMethod on SM120 "
                   "(is_sm90_supported() or is_sm120_supported()); "
                   + _TRTLLM.format(v="0.5.15.post1"),
          library="sglang", versions=">=0.5.15,<0.5.16", fixed_in="0.5.16"),
    Patch(name="sglang.moe.runner_choice",
          target="sglang.srt.arg_groups.overrides:_moe_runner_backend_quant_constraints",
          make=moe.make_runner_choice,
          why="for DeepSeek-V4's FP8 + NVFP4 checkpoints SGLang's DeepSeek-V4 override turns "
              "--moe-runner-backend auto into flashinfer_trtllm_routed (trtllm-gen, SM100-only) on every "
              "GPU; on SM12x (no expert-parallel all-to-all) the MoE kernel-config pass answers marlin: "
              "SGLang's NVFP4 Marlin for the routed experts, with the SwiGLU clamp, and MXFP4 Marlin for "
              "the MTP layer through the speculative default",
          upstream="sglang 0.5.19 / 0.5.23 srt/arg_groups/model_overrides/deepseek_v4.py (nvfp4_moe_meta -> "
                   "flashinfer_trtllm_routed), arg_groups/overrides.py _moe_runner_backend_quant_constraints "
                   "(run by arg_groups/moe_hook.py handle_moe_kernel_config; 0.5.17 / 0.5.18: "
                   "_deepseek_v4_overrides in overrides.py, the pass run by server_args.py "
                   "ServerArgs._handle_moe_kernel_config); "
                   "fused_moe_triton/layer.py _fuses_routed_scaling_factor_in_topk (not with Marlin); "
                   "modelopt_quant.py ModelOptNvFp4FusedMoEMethod (marlin fallback), moe_runner/marlin.py "
                   "(clamp_limit = gemm1_clamp_limit or swiglu_limit)",
          library="sglang", versions=">=0.5.17,<0.5.24", consumers=("sglang.srt.arg_groups.moe_hook",),
          retire_when="SGLang's DeepSeek-V4 NVFP4 override keeps --moe-runner-backend auto off SM100-only "
                      "kernels on SM12x (or FlashInfer's TRT-LLM routed MoE gets an SM120 build)"),
)

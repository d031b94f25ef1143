"""How SGLang picks the kernels of DeepSeek-V4's MXFP4 experts on SM12x: the factories the
:mod:`sm12x.patches.sglang_moe` records install. Stdlib only at import; SGLang's own modules are
imported when a replacement runs (a model is being built, so SGLang is loaded).

SGLang builds an MoE layer's quant method from its quantization config
(``get_quant_method(layer, prefix)``) while the layer is constructed, under the runner backend in
effect: ``--moe-runner-backend`` for the target model, ``--speculative-moe-runner-backend``
(default: the target's) for the MTP draft model. Two of those choices end in FlashInfer's TRT-LLM
MXFP4 MoE (``Mxfp4FlashinferTrtllmMoEMethod``: ``trtllm_fp4_block_scale_routed_moe``, trtllm-gen
kernels built for SM100 only) on any GPU:

- ``HybridFp8NvFp4Config`` (FP8 linears + NVFP4 routed experts, e.g. the DeepSeek-V4 NVFP4
  checkpoints) returns it for every MoE layer excluded from NVFP4 whose experts are MXFP4: the MTP
  layer, whatever runner backend is in effect.
- ``Fp8Config`` (SGLang 0.5.15.post1) returns it for MXFP4 experts under
  ``--moe-runner-backend flashinfer_mxfp4`` on every GPU but SM90; from 0.5.16 it picks FlashInfer's
  CUTLASS MXFP8 x MXFP4 method on SM120 itself.

On SM12x the replacements keep every other answer and swap that one: for the hybrid config, first
``Fp8Config``'s answer for the runner in effect when it is not SM100-only (Marlin; the FlashInfer
CUTLASS method SGLang picks on SM120 from 0.5.16; Humming, an explicit choice whose SM12x support
is not checked here; ``Fp8MoEMethod`` under the ``deep_gemm`` runner while SGLang runs DeepGEMM,
whose grouped GEMMs are DeepGEMM's: sm12x's where the installed DeepGEMM has no SM120 kernel);
otherwise SGLang's own MXFP4 Marlin method (W4A16; SGLang checks SM90 / SM120 for it and picks it
for DeepSeek-V4 on SM120 in 0.5.15.post1). Marlin is also what the TRT-LLM method is
closest to for the layer SGLang already built: both wrap ``Fp8MoEMethod`` for the MXFP4 weights,
take the standard top-k output, pad the intermediate size to 128 and order w13 themselves.
SwiGLU with DeepSeek-V4's clamp and the activation handling stay SGLang's.
"""
from __future__ import annotations

import functools
import logging

TRTLLM_MXFP4 = "Mxfp4FlashinferTrtllmMoEMethod"
# Fp8Config's MXFP4-expert methods that are not SM100-only (Humming: the user's explicit choice)
SM12X_MXFP4_METHODS = ("Mxfp4MarlinMoEMethod", "Mxfp4FlashinferCutlassMoEMethod", "Mxfp4HummingMoEMethod")
FP8_MOE = "Fp8MoEMethod"


_LOGGED: set = set()


def _log(message: str) -> None:
    """One info line per message on logger ``sm12x`` (whose level ``SM12X_LOG`` sets)."""
    if message not in _LOGGED:
        _LOGGED.add(message)
        logging.getLogger("sm12x").info(message)


def _runner_backend() -> str:
    """The MoE runner backend in effect (SGLang's global; the speculative one while the draft
    model is built), as its ``--moe-runner-backend`` value."""
    from sglang.srt.layers.moe.utils import get_moe_runner_backend

    backend = get_moe_runner_backend()
    return str(getattr(backend, "value", backend))


def _deep_gemm_enabled() -> bool:
    """Whether SGLang runs DeepGEMM in this process (``deep_gemm_wrapper``'s ``ENABLE_JIT_DEEPGEMM``:
    off on SM12x in 0.5.15-0.5.19, and wherever ``SGLANG_ENABLE_JIT_DEEPGEMM=0``); without
    it the DeepGEMM runner calls a ``deep_gemm`` the wrapper never imported."""
    try:
        from sglang.srt.layers.deep_gemm_wrapper import configurer
    except ImportError:
        return False
    return bool(getattr(configurer, "ENABLE_JIT_DEEPGEMM", False))


def serves_on_sm12x(method, runner: str) -> bool:
    """Whether quant method ``method`` (built under runner backend ``runner``) runs MXFP4 experts
    on SM12x kernels: an SM12x MXFP4 method, or ``Fp8MoEMethod`` under the DeepGEMM runner while
    SGLang runs DeepGEMM."""
    name = type(method).__name__
    if name in SM12X_MXFP4_METHODS:
        return True
    return name == FP8_MOE and runner == "deep_gemm" and _deep_gemm_enabled()


def marlin_method(config, prefix: str):
    """SGLang's MXFP4 Marlin method for an MXFP4-expert layer of FP8 config ``config``."""
    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod
    from sglang.srt.layers.quantization.mxfp4_marlin_moe import Mxfp4MarlinMoEMethod

    return Mxfp4MarlinMoEMethod(Fp8MoEMethod(config), prefix=prefix)


def _owner(instance, function):
    """The class in ``instance``'s MRO whose ``get_quant_method`` is ``function``."""
    for cls in type(instance).__mro__:
        if vars(cls).get("get_quant_method") is function:
            return cls
    return None


def make_hybrid_get_quant_method(original):
    """``HybridFp8NvFp4Config.get_quant_method`` on SM12x: the MTP layer's MXFP4 experts get
    ``Fp8Config``'s method for the runner in effect when it has SM12x kernels, else Marlin,
    instead of the SM100-only TRT-LLM method; every other layer keeps SGLang's answer."""
    @functools.wraps(original)
    def get_quant_method(self, layer, prefix):
        method = original(self, layer, prefix)
        if type(method).__name__ != TRTLLM_MXFP4:
            return method
        runner = _runner_backend()
        owner = _owner(self, get_quant_method)
        parent = super(owner, self).get_quant_method(layer, prefix) if owner is not None else None
        if parent is not None and serves_on_sm12x(parent, runner):
            chosen = parent
        else:
            chosen = marlin_method(self, prefix)
        _log(f"sm12x: {prefix}: MXFP4 experts of an NVFP4-excluded MoE layer (runner {runner}) on "
             f"{type(chosen).__name__} instead of the SM100-only {TRTLLM_MXFP4}")
        return chosen

    return get_quant_method


def make_fp8_get_quant_method(original):
    """``Fp8Config.get_quant_method`` on SM12x (SGLang 0.5.15.post1): MXFP4 experts under
    ``flashinfer_mxfp4`` get Marlin instead of the SM100-only TRT-LLM method; every other answer
    is SGLang's."""
    @functools.wraps(original)
    def get_quant_method(self, layer, prefix):
        method = original(self, layer, prefix)
        if type(method).__name__ != TRTLLM_MXFP4:
            return method
        chosen = marlin_method(self, prefix)
        _log(f"sm12x: {prefix}: MXFP4 experts (runner {_runner_backend()}) on "
             f"{type(chosen).__name__} instead of the SM100-only {TRTLLM_MXFP4}")
        return chosen

    return get_quant_method


TRTLLM_RUNNERS = ("flashinfer_trtllm", "flashinfer_trtllm_routed")


def _model_config(view):
    """The model configuration behind a server-args view (0.5.19+: ``model_config_of``; 0.5.15-0.5.18:
    the view's ``get_model_config``)."""
    from sglang.srt.arg_groups import overrides

    of = getattr(overrides, "model_config_of", None)
    return of(view) if of is not None else view.get_model_config()


def _hybrid_nvfp4_deepseek_v4(view) -> bool:
    """Whether the served model is a DeepSeek-V4 hybrid FP8 + NVFP4 checkpoint (NVFP4 routed experts,
    MXFP4 MTP experts: the checkpoints SGLang's DeepSeek-V4 override sends to TRT-LLM)."""
    config = _model_config(view)
    architectures = getattr(getattr(config, "hf_config", None), "architectures", None) or [""]
    return architectures[0] == "DeepseekV4ForCausalLM" and getattr(config, "nvfp4_moe_meta", None) is not None


def make_runner_choice(original):
    """SGLang's ``_moe_runner_backend_quant_constraints`` pass on SM12x: for a DeepSeek-V4 hybrid
    FP8 + NVFP4 checkpoint without expert-parallel all-to-all, a TRT-LLM runner (trtllm-gen,
    SM100-only; the DeepSeek-V4 override's ``auto`` answer) becomes ``marlin``: SGLang's NVFP4
    Marlin for the routed experts (W4A16; the Marlin runner applies DeepSeek-V4's SwiGLU clamp) and,
    through the speculative default, its MXFP4 Marlin for the MTP layer. Every other resolution is
    SGLang's."""
    @functools.wraps(original)
    def moe_runner_backend_quant_constraints(view):
        declared = original(view)
        runner = declared.get("moe_runner_backend", view.moe_runner_backend)
        if (runner in TRTLLM_RUNNERS and getattr(view, "moe_a2a_backend", "none") == "none"
                and _hybrid_nvfp4_deepseek_v4(view)):
            _log(f"sm12x: moe_runner_backend {runner} (trtllm-gen, SM100-only) -> marlin for the "
                 "DeepSeek-V4 FP8 + NVFP4 checkpoint on SM12x")
            return {**declared, "moe_runner_backend": "marlin"}
        return declared

    return moe_runner_backend_quant_constraints


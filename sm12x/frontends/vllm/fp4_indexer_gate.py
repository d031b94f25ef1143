"""The factory of the vLLM MXFP4 indexer-cache record (:mod:`sm12x.patches.fp4_indexer`). Stdlib
only at import.

vLLM 0.34.0's ``dsa_indexer_uses_fp4(vllm_config)`` (``vllm/v1/attention/backends/mla/indexer.py``)
raises ``ValueError`` for ``indexer_kv_dtype='mxfp4'`` on every CUDA GPU outside the SM100 family
("requires Blackwell datacenter GPUs (sm_10x ...); sm_120 (consumer Blackwell) ... not
supported"). For DeepSeek-V4 and V4.1 on SM12x, the calls that cache then reaches are:

- the index queries and keys quantised to MXFP4 (values e2m1, UE8M0 per 32): vLLM's own Triton
  kernels (``fused_indexer_q_rope_quant`` with ``use_fp4``; V4.1's ``indexer_k_norm_rope_store``,
  V4's ``fused_compress_quant_cache``) whose one piece of inline PTX,
  ``cvt.rn.satfinite.e2m1x2.f32``, assembles for sm_120 / sm_121 under Triton 3.6.0-3.9.0, or the
  CuTe-DSL query kernel where ``cutlass`` is installed;
- the prefill's key gather (``ops.cp_gather_indexer_k_quant_cache``): a byte copy in vLLM's ``_C``;
- the logits, ``fp8_fp4_mqa_logits`` / ``fp8_fp4_paged_mqa_logits`` with FP4 queries and keys
  (FP32 logits and weights off SM100: ``mqa_logits_mx_inputs`` passes the packed UE8M0 query
  scales as they are), which sm12x's DeepGEMM records serve (one block-scaled e2m1 MMA per key
  tile on sm_120), and the top-k over them (vLLM's, or sm12x's fused top-k where its records
  defer the logits);
- V4.1's candidate blocks read those float32 logits as with the FP8 cache.

So the answer is given as on SM100 (``True``) where the original refuses on SM12x, the model is
DeepSeek-V4 or V4.1, and the FP4 logits the indexer will call are sm12x's; everywhere else the
original's answer or error stands. DeepSeek-V3.2 / GLM-5 keep the refusal: their indexer inserts
keys with ``ops.indexer_k_quant_and_cache``, which asserts "Unfused FP4 Insert is not supported
yet" on every GPU.
"""
from __future__ import annotations

import functools

# the model types whose indexer writes MXFP4 keys with a fused (Triton) store
FP4_MODEL_TYPES = ("deepseek_v4", "deepseek_v41")
FP4_LOGITS = ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits")
# the refusal's own words (vLLM 0.34.0 indexer.py:101-106)
REFUSAL = "indexer_kv_dtype='mxfp4' requires Blackwell datacenter GPUs"


def sm12x_serves_fp4_logits() -> bool:
    """Whether the DeepGEMM module vLLM's indexer resolves (an installed ``deep_gemm`` first, else
    the vendored ``vllm.third_party.deep_gemm``: ``vllm.utils.deep_gemm._import_deep_gemm``) has
    sm12x's FP4 logits (records applied, or sm12x's stand-in ``deep_gemm``)."""
    import importlib

    for name in ("deep_gemm", "vllm.third_party.deep_gemm"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "__sm12x_shim__", False):
            return all(callable(getattr(module, n, None)) for n in FP4_LOGITS)
        return all(getattr(getattr(module, n, None), "__sm12x_patch__", None) for n in FP4_LOGITS)
    return False


def _model_type(vllm_config):
    try:
        return vllm_config.model_config.hf_config.model_type
    except AttributeError:
        return None


def make_dsa_indexer_uses_fp4(original):
    """``dsa_indexer_uses_fp4(vllm_config)`` answering yes where the original refuses MXFP4 on
    SM12x and sm12x serves the cache (module docstring); the original's answer or error otherwise."""

    @functools.wraps(original)
    def dsa_indexer_uses_fp4(vllm_config, *args, **kwargs):
        try:
            return original(vllm_config, *args, **kwargs)
        except ValueError as error:
            if REFUSAL not in str(error) or _model_type(vllm_config) not in FP4_MODEL_TYPES:
                raise
            try:
                served = sm12x_serves_fp4_logits()
            except Exception:  # the original's error is the one to show
                served = False
            if not served:
                raise
            return True

    return dsa_indexer_uses_fp4

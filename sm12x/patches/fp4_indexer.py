"""Patch record for vLLM's MXFP4 indexer key cache on SM12x (``indexer_kv_dtype='mxfp4'``):
refused by vLLM 0.34.0 on every GPU outside the SM100 family, served on SM12x by sm12x's FP4
indexer logits (:mod:`sm12x.frontends.vllm.fp4_indexer_gate` lists the calls the cache reaches).

What stays refused, and why: ``--kv-cache-dtype nvfp4_ds_mla`` (DeepSeek-V4.1's 528-byte main and
288-byte FP4 compressed attention caches; ``vllm/models/deepseek_v41/attention.py:192-199,
587-591``). On SM12x vLLM 0.34 runs V4.1 attention through FlashInfer's SM120 sparse MLA
(``DeepseekV4FlashInferSM120Attention``), which accepts only the FP8 KV dtypes and passes FlashInfer
no ``kv_cache_format`` (a 528-byte record would be read as GLM-5.3's), and it writes the V4.1
records on SM100 only. sm12x reads both records in its sparse decode and prefill by declared
format, but no sm12x record routes that class's calls with their format, so lifting the refusal
would serve misread caches.
"""
from __future__ import annotations

from sm12x.frontends.vllm import fp4_indexer_gate
from sm12x.patches import Patch

PATCHES = (
    Patch(name="vllm.indexer.mxfp4_cache_gate",
          target="vllm.v1.attention.backends.mla.indexer:dsa_indexer_uses_fp4",
          make=fp4_indexer_gate.make_dsa_indexer_uses_fp4,
          why="vLLM 0.34.0 raises ValueError for indexer_kv_dtype='mxfp4' on SM120 / SM121 ('requires "
              "Blackwell datacenter GPUs'), refusing the FP4 index-key cache (68 instead of 132 bytes "
              "per compressed token) for want of SM12x FP4 logits; sm12x's fp8_fp4_(paged_)mqa_logits "
              "take FP4 queries and keys, so for DeepSeek-V4 / V4.1 the question is answered yes where "
              "those are sm12x's",
          retire_when="vLLM accepts indexer_kv_dtype='mxfp4' on the SM120 family (dsa_indexer_uses_fp4 "
                      "stops raising there)",
          upstream="vllm 0.34.0 v1/attention/backends/mla/indexer.py:67-107 (dsa_indexer_uses_fp4); "
                   "model_executor/layers/sparse_attn_indexer.py (use_fp4_cache); utils/deep_gemm.py "
                   "(mqa_logits_mx_inputs)",
          # read in the 0.34.0 wheel only (the function's MXFP4 refusal); 0.35 not released
          library="vllm", versions=">=0.34.0,<0.35",
          # the modules that hold a `from ... import dsa_indexer_uses_fp4` copy at import (others
          # import it inside functions, reading the patched attribute); Kimi-K3's DSA cache and the
          # ROCm module get the original's answer through the copy (their model types are not V4)
          consumers=("vllm.models.deepseek_v4.attention", "vllm.models.deepseek_v41.attention",
                     "vllm.model_executor.layers.sparse_mqa_indexer", "vllm.models.kimi_k3.common.dsa_cache",
                     "vllm.models.deepseek_v4.amd.rocm")),
)

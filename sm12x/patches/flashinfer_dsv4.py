"""vLLM's DeepSeek-V4 attention on SM12x (FlashInfer's SM120 sparse MLA, vLLM >= 0.24): the calls
whose shapes the installed FlashInfer does not serve go to sm12x's sparse decode.

vLLM calls ``vllm.utils.flashinfer.flashinfer_trtllm_batch_decode_sparse_mla_dsv4`` (a lazy
wrapper of ``flashinfer.decode.trtllm_batch_decode_sparse_mla_dsv4``) from its DeepSeek-V4 (and
0.33+ V4.1) SM120 attention for decode, spec-decode verify and prefill chunks alike, one row per
token. FlashInfer 0.6.14-0.6.18 serve (heads, topk) pairs from a fixed table at <= 64 tokens and a
smaller set of prefill shapes above; outside them the process aborts ("Check failed: num_tokens >
64 ... got num_tokens=N") or, from 0.6.18, raises. FlashInfer 0.6.12 and 0.6.13 (the pins of vLLM
0.24.0 and 0.25.x) have no SM120 path at all. The record's factory decides per call from shapes only
(``sm12x.frontends.vllm.flashinfer_dsv4``: the installed FlashInfer's ``_DECODE_DSV4_DISPATCH``,
``_DECODE_MAX_TOKENS`` and page, the prefill envelope of its release).

vLLM 0.33 and 0.34 also refuse, in the attention layer's constructor, a (padded heads, SWA width)
pair missing from that table ("requires a FlashInfer DSV4 sparse MLA decode specialization");
the second record answers yes there when sm12x serves the pair and the decode record is applied.
With the FlashInfer those releases pin (0.33: 0.7.2.post1, read: its table is a 1-128 heads
predicate; 0.34: 0.7.3, not on PyPI, taken to behave as 0.7.2.post1 and 0.7.4) the check already
passes and nearly every call stays with FlashInfer.
"""
from __future__ import annotations

from sm12x.kernels.manifest import factory
from sm12x.patches import Patch

# checked: vLLM 0.24.0 (which introduced the SM120 class, #43477), 0.25.0 and 0.25.1 (the same class,
# line for line), 0.33.0, 0.34.0
_VLLM = dict(library="vllm", versions=">=0.24.0,<0.35")
_RETIRE = ("FlashInfer's SM120 DeepSeek-V4 sparse MLA serves every (tokens, heads, topk, page) shape vLLM "
           "passes on SM12x (1-128 heads, SWA width 256, any topk DeepSeek-V4 uses, in decode, verify and "
           "prefill chunks)")
_ROUTES = ("routes: FlashInfer keeps every shape its installed release serves (0.6.14-0.6.17: "
           "<= 64 tokens with SWA page 64 and (heads, topk) in {8,16,32,64,128} x {128,512,1024}, "
           "more tokens with heads 16-128 and topk 128 / 512 / 1024 / 2048, or 128 with a compressed "
           "cache; 0.6.18 adds topk 192 / 256 and 8 heads; 0.7: 1-128 heads, prefill topk a multiple "
           "of 64); sm12x takes the rest (DSpark's SWA width 256, TP16's 8 heads in prefill chunks, "
           "short verify / prefill chunks of those shapes, every call under FlashInfer < 0.6.14)")

PATCHES = (
    Patch(name="vllm.flashinfer_dsv4.decode",
          target="vllm.utils.flashinfer:flashinfer_trtllm_batch_decode_sparse_mla_dsv4",
          make=factory("vllm.flashinfer_dsv4.sparse_mla_dsv4", "make_flashinfer_dsv4_decode"),
          consumers=("vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
                     # vLLM 0.33 / 0.34
                     "vllm.models.deepseek_v41.nvidia.flashinfer_sparse",
                     "vllm.models.deepseek_v41.nvidia.specialized_decode.attention.sparse_mla"),
          why="FlashInfer's SM120 DeepSeek-V4 sparse MLA serves a fixed set of (tokens, heads, topk, "
              "page) shapes and aborts the process or raises on the others (DSpark's verify width "
              "256 before FlashInfer 0.6.18, TP16's 8 heads in prefill chunks before 0.6.18, every "
              "call with the 0.6.12 / 0.6.13 that vLLM 0.24.0 / 0.25.x pin)",
          notes=_ROUTES, retire_when=_RETIRE,
          upstream="vllm models/deepseek_v4/nvidia/flashinfer_sparse.py "
                   "DeepseekV4FlashInferSM120Attention; flashinfer mla/_sparse_mla_sm120 "
                   "_DECODE_DSV4_DISPATCH, csrc/sparse_mla_sm120_prefill.cu; vllm#50720, vllm#55526, "
                   "vllm#48054, flashinfer#4380",
          **_VLLM),
    Patch(name="vllm.flashinfer_dsv4.config_check",
          target="vllm.utils.flashinfer:has_flashinfer_sparse_mla_sm120_config",
          make=factory("vllm.flashinfer_dsv4.sparse_mla_dsv4", "make_has_sparse_mla_sm120_config"),
          why="vLLM's SM120 DeepSeek-V4 attention constructor raises 'requires a FlashInfer DSV4 "
              "sparse MLA decode specialization' for a (padded heads, SWA width) pair missing from "
              "FlashInfer's decode table (DSpark's width 256 with FlashInfer 0.6.x); with the decode "
              "record applied sm12x serves those calls, so the check answers yes for 1-128 heads",
          upstream="vllm utils/flashinfer.py has_flashinfer_sparse_mla_sm120_config; "
                   "models/deepseek_v4/nvidia/flashinfer_sparse.py __init__",
          library="vllm", versions=">=0.33.0,<0.35", retire_when=_RETIRE),
)

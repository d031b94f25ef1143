"""What serves DeepSeek-V4.1-Flash and GLM-5-next's attention and indexer on SM12x, per framework
release: the model rows of ``sm12x status``.

Each statement names the part, what runs it on SM12x and the sm12x records it takes (none: the
framework's own SM120 path); where a record does not apply it says what runs instead. Facts read in
vLLM 0.34.0 and SGLang 0.5.23 (the first releases with either model's code); the records' modules
(:mod:`sm12x.patches.v41`, :mod:`sm12x.patches.deep_gemm`) give the sources.
"""
from __future__ import annotations

# one statement per part, in MoePath's shape (its ``experts`` field names the part)
from sm12x.commands.moe_paths import MoePath as ModelPath
from sm12x.commands.moe_paths import path_rows

_VLLM_LOGITS = ("vllm.third_party.deep_gemm.fp8_fp4_mqa_logits", "vllm.third_party.deep_gemm.fp8_fp4_paged_mqa_logits")
_SGL_V41 = ("sglang.v41.candidate_indexer_gate", "deep_gemm.get_paged_sparse_mqa_logits_metadata",
            "deep_gemm.fp8_fp4_paged_sparse_mqa_logits")
_KEPT = "the logits matrix where the top-k row below is not served"
# the records that take V4.1 layers (candidate source and consumers) to the fused candidate top-k
_VLLM_V41_TOPK = ("vllm.sparse_attn_indexer.compressed_mqa_logits", "vllm.sparse_attn_indexer.ops",
                  "vllm.sparse_attn_indexer.fp8_fp4_paged_mqa_logits", "vllm.sparse_attn_indexer.get_indexer_topk",
                  "vllm.sparse_attn_indexer._select_candidate_blocks", "vllm.sparse_attn_indexer._apply_candidate_mask")
_GLM5NEXT_TOPK = ("vllm.fused_mqa_topk.use_fused_mqa_topk", "vllm.fused_mqa_topk.fused_mqa_topk_prefill",
                  "vllm.glm5next.sparse_indexer.fp8_fp4_paged_mqa_logits",
                  "vllm.glm5next.sparse_indexer.get_indexer_topk")
_DENSE = ("[rows, max_model_len] FP32 logits per decode step (4 MiB a row at 1M), [rows, max_seqlen_k] per "
          "prefill chunk, ranked by vLLM's top-k")

PATHS = (
    ModelPath("vllm", ">=0.34,<0.35", "DeepSeek-V4.1 attention",
              "FlashInfer's SM120 sparse MLA (DeepseekV4FlashInferSM120Attention) on the V4 584-byte cache: "
              "vLLM writes the V4.1 528 / 288-byte records on SM100 only (vLLM's own)"),
    ModelPath("vllm", ">=0.34,<0.35", "DeepSeek-V4.1 indexer",
              "vLLM's dense path (SparseAttnIndexer with candidate blocks) on sm12x's indexer logits; " + _KEPT,
              _VLLM_LOGITS, otherwise="the vendored DeepGEMM's own SM120 logits; " + _KEPT),
    ModelPath("vllm", ">=0.34,<0.35", "GLM-5-next indexer",
              "vLLM's SparseAttnIndexerKpool on sm12x's indexer logits (its copies of fp8_fp4_(paged_)mqa_logits "
              "are vLLM's wrappers over the vendored DeepGEMM); " + _KEPT,
              _VLLM_LOGITS, otherwise="the vendored DeepGEMM's own SM120 logits; " + _KEPT),
    ModelPath("vllm", ">=0.34,<0.35", "DeepSeek-V4.1 indexer top-k",
              "sm12x's fused candidate top-k: the candidate source publishes its blocks and the consumers rank "
              "keys inside theirs without the logits matrix (rows wider than 4x their candidate keys score those "
              "keys only; prefill chunks and decode; real logits under DCP)",
              _VLLM_V41_TOPK, otherwise=_DENSE),
    ModelPath("vllm", ">=0.34,<0.35", "GLM-5-next indexer top-k",
              "sm12x's fused top-k over the pools: prefill through vLLM's fused_mqa_topk seam, decode through "
              "the pool indexer's own logits / get_indexer_topk copies, without the logits matrix (FP8 indexer "
              "cache; real logits under DCP)", _GLM5NEXT_TOPK, otherwise=_DENSE),
    ModelPath("sglang", ">=0.5.23,<0.5.24", "DeepSeek-V4.1 attention",
              "SGLang's SM120 decode (FlashInfer, else Triton) on the V4 584-byte cache (SGLang asserts the "
              "V4.1 layouts need SM100; SGLang's own)"),
    ModelPath("sglang", ">=0.5.23,<0.5.24", "DeepSeek-V4.1 indexer top-k",
              "the candidate source layer's decode on sm12x's fused candidate top-k (its page slots and blocks of "
              "8 without the [rows, max_compressed_seq_len] logits, row-chunked or not); its "
              "prefill in SGLang's 2 GiB logits tiles; the consumer layers on candidate-only logits",
              _SGL_V41 + ("sglang.v41.sparse_table.deep_gemm_fp4_paged_mqa_logits",
                          "sglang.v41.sparse_table.topk_transform_paged_v2", "sglang.v41.sparse_table.amax_topk_blocks"),
              otherwise="SGLang's own (with the candidate indexer records): the consumer layers rank candidate-only "
                        "logits; the source layer ranks prefill in 2 GiB logits tiles and decode over [rows, "
                        "max_compressed_seq_len] FP32 logits"),
    ModelPath("sglang", ">=0.5.23,<0.5.24", "DeepSeek-V4.1 indexer",
              "SGLang's sparse-table candidate indexer on sm12x's DeepGEMM paged sparse logits and schedule "
              "(the source layers' dense logits on sm12x's FP4 indexer kernels)", _SGL_V41,
              otherwise="nothing: SGLang raises RuntimeError at attention-backend init for V4.1 on SM120 "
                        "('the candidate indexer needs DeepGEMM's paged sparse MQA logits')"),
)

from sm12x.commands.moe_paths import _SERVING


def _serves(row: dict) -> bool:
    # sm12x's stand-in deep_gemm carries the DeepGEMM functions itself (its records then skip it)
    return row.get("state") in _SERVING or "stand-in" in (row.get("reason") or "")


def model_rows(versions: dict, patch_rows: list) -> list:
    """The model paths of the installed releases: ``{"framework", "version", "part", "serves",
    "via"}`` (``moe_paths.path_rows``)."""
    return path_rows(PATHS, versions, patch_rows, "part", _serves)

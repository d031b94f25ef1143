"""Patch records for DeepSeek-V4.1-Flash on SM12x: the candidate-only (sparse) paged indexer logits
and SGLang's V4.1 candidate-indexer gate.

SGLang 0.5.23 cannot start DeepSeek-V4.1 on SM120 / SM121: ``v41_indexer.make_candidate_indexer``
(called from ``DeepseekV4AttnBackend.__init__``) counts compute capability 12 as "SM100 or newer",
then requires DeepGEMM's paged sparse MQA logits, which its configurer enables on SM100 only
(``DEEPGEMM_PAGED_SPARSE_MQA_LOGITS``), and raises ``RuntimeError`` "the candidate indexer needs
DeepGEMM's paged sparse MQA logits" for any model with ``candidate_topk_blocks > 0``. With these
records sm12x provides those two DeepGEMM functions (:mod:`sm12x.frontends.deep_gemm.sparse_indexer`)
and the gate answers yes where they are sm12x's; the backend then builds SGLang's own sparse-table
scheme (``v41_indexer/sparse_table.py``).

Read through to a served call (SGLang 0.5.23, ``v41_indexer/sparse_table.py``, ``scoring.py``,
``sglang/kernels/ops/attention/dsv4/{index_logits,candidate_table,candidate_blocks,topk}.py``):
- DeepGEMM calls on that path: ``fp8_fp4_mqa_logits`` (prefill, flat-K tiles) and
  ``get_paged_mqa_logits_metadata`` / ``fp8_fp4_paged_mqa_logits`` (decode, the source's dense
  logits), which the ``deep_gemm.*`` records of :mod:`sm12x.patches.deep_gemm` already serve (FP32
  logits and weights on SM120: ``index_logits_dtype``), and the two sparse functions here.
- SGLang's own kernels on that path are generic CUDA (JIT ``candidate_block_table.cuh``: 16 / 32 KiB of
  shared memory; ``block_amax.cuh``, top-k v2, ``fp4_indexer_rope.cuh``) or Triton
  (``candidate_row_lens``, ``quantize_fp4_indexer_tensor``); none is gated on SM100.
- The V4.1 index-K pool is MXFP4 (68 B per compressed slot) and pages at ``dsv41_index_page_size()``:
  128 when the configurer's flag is on, 64 otherwise; it is computed at import from the flag, which
  this gate leaves as SGLang set it, so SM12x pages at 64 (DeepGEMM wants 128 for its 512-byte page
  stride; sm12x's kernel reads any multiple of the block size).
- The attention itself stays SGLang's SM120 path (FlashInfer / Triton, the V4 584-byte cache:
  ``select_dsv4_kv_layout`` keeps ``v4`` off SM100).
"""
from __future__ import annotations

from sm12x.frontends.deep_gemm import sparse_wrappers
from sm12x.kernels.manifest import factory
from sm12x.patches import Patch

_ANY_DEEP_GEMM = ("DeepGEMM ships under several distributions with unrelated version numbers "
                  "(deep-gemm 2.x, sgl-deep-gemm 0.x); the replacement reads each call by the installed "
                  "function's own signature; where a build has no such function the record is skipped "
                  "as missing (and sm12x's stand-in deep_gemm carries it where none is installed)")
_RETIRE = ("DeepGEMM ships an SM120 paged sparse MQA logits runtime (the 2.8.1 vendored "
           "in vLLM 0.34 carries sm120_fp8_fp4_sparse_mqa_logits.cuh with no host runtime for it) and "
           "SGLang's configurer enables it on SM120")

PATCHES = (
    Patch(name="deep_gemm.get_paged_sparse_mqa_logits_metadata",
          target="deep_gemm:get_paged_sparse_mqa_logits_metadata",
          make=sparse_wrappers.FACTORIES["get_paged_sparse_mqa_logits_metadata"],
          why="the schedule of DeepSeek-V4.1's candidate-only paged indexer logits (SGLang 0.5.23 "
              "sparse_table.build_sparse_indexer_schedule): DeepGEMM builds it for its SM100 kernel "
              "only, and the logits that read it must be the implementation that runs",
          retire_when=_RETIRE,
          upstream="deepseek-ai/DeepGEMM deep_gemm/__init__.py (get_paged_sparse_mqa_logits_metadata); "
                   "sglang 0.5.23 kernels/ops/attention/dsv4/candidate_table.py",
          library="deep_gemm", versions="*", versions_note=_ANY_DEEP_GEMM),
    Patch(name="deep_gemm.fp8_fp4_paged_sparse_mqa_logits",
          target="deep_gemm:fp8_fp4_paged_sparse_mqa_logits",
          make=sparse_wrappers.FACTORIES["fp8_fp4_paged_sparse_mqa_logits"],
          why="DeepSeek-V4.1's candidate-only paged indexer logits (every consumer layer's scores of "
              "the source's published blocks; SGLang 0.5.23 sparse_table.consume_decode / "
              "consume_prefill): DeepGEMM has only sm100_(paged_)sparse_mqa_logits",
          retire_when=_RETIRE,
          upstream="deepseek-ai/DeepGEMM csrc/apis/attention.hpp (fp8_fp4_paged_sparse_mqa_logits, "
                   "launch_sm100_sparse_mqa_logits); sglang 0.5.23 kernels/ops/attention/dsv4/index_logits.py",
          library="deep_gemm", versions="*", versions_note=_ANY_DEEP_GEMM),
    Patch(name="sglang.v41.candidate_indexer_gate",
          target="sglang.srt.layers.attention.dsv4.v41_indexer:make_candidate_indexer",
          make=factory("sglang.v41_indexer.make_candidate_indexer"),
          why="SGLang 0.5.23 raises RuntimeError ('the candidate indexer needs DeepGEMM's paged sparse "
              "MQA logits') while initialising the DeepSeek-V4 attention backend for any V4.1 model "
              "(candidate_topk_blocks > 0) on SM120 / SM121: is_sm100_or_newer() counts major 12, and "
              "DEEPGEMM_PAGED_SPARSE_MQA_LOGITS is true only on SM100. Where sm12x serves both DeepGEMM "
              "sparse functions the question is answered yes for that call only",
          retire_when="SGLang decides the candidate indexer from the installed DeepGEMM's SM120 sparse "
                      "runtime (or gives SM120 a non-DeepGEMM candidate path)",
          upstream="sglang 0.5.23 srt/layers/attention/dsv4/v41_indexer/__init__.py:43-46,99-110; "
                   "srt/layers/deep_gemm_wrapper/configurer.py:57,64-78; "
                   "srt/layers/attention/deepseek_v4_backend.py:1286",
          # V4.1's indexer first ships in 0.5.23 (0.5.19 has no deepseek_v41 code); 0.5.20-0.5.22 not read
          library="sglang", versions=">=0.5.23,<0.5.24",
          consumers=("sglang.srt.layers.attention.deepseek_v4_backend",)),
)

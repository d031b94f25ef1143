"""Route the frameworks' indexer logits -> top-k to sm12x's fused top-k, so that a 1M-token
request does not need its [rows, S_kv] logits.

The DeepGEMM records (``sm12x.patches.deep_gemm``) already compute the logits on SM12x, with
64-bit offsets (stock DeepGEMM's 32-bit offsets fail past 256K with CUDA error 719); but
the frameworks still materialise the logits and run their own top-k. These records replace the
pair where the release's source shows it:

- vLLM 0.34.0 has a fused seam of its own (``fused_mqa_topk``: one CUDA op, SM100 family only;
  vLLM answers "not eligible" on SM12x). Its eligibility rule, chunk rule, key-scale decoder and
  the op are replaced, in the module and in the copies its indexer, its chunk planner and GLM-5
  Next's indexer hold. Its planner then packs prefill chunks up to 16,384 rows x 2**20 keys with
  no logits budget.
- vLLM 0.22.1-0.34.0 decode: the indexer module's copy of ``fp8_fp4_paged_mqa_logits`` returns
  placeholder logits (``sm12x.frontends.deferred_logits``) when every top-k its decode may pick
  reads them: from 0.30.0 ``get_indexer_topk(backend)(...)`` (the module's copy, replaced); up to
  0.29.0 ``torch.ops._C.persistent_topk`` / ``cooperative_topk`` (looked up through torch.ops at
  call time: replaced on that namespace, vLLM's op for real logits) and
  ``ops.top_k_per_row_decode``.
- vLLM 0.22.1-0.34.0 prefill chunks call ``fp8_fp4_mqa_logits`` (0.33.0 on: DeepGEMM's
  compressed layout, ``max_seqlen_k``, upcast by ``as_fp32_logits``) and pass the logits to
  ``ops.top_k_per_row_prefill``; both names are globals of ``sparse_attn_indexer``, replaced as a
  pair (0.34.0 runs this dense path only for layers its fused seam does not take).
- Both keep real logits where another reader needs them (DCP's merge; v4.1 candidate blocks in
  0.30.0-0.33.0), read from the indexer call's own arguments.
- vLLM 0.34.0's DeepSeek-V4.1 layers (``candidate_blocks`` given): the indexer's
  ``_select_candidate_blocks`` / ``_apply_candidate_mask`` (vLLM's candidate-block steps between
  the logits and the top-k) record themselves on placeholder logits, and the top-k runs the fused
  candidate top-k (:mod:`sm12x.kernels.indexer.candidate_topk`): the source layer publishes its
  blocks into vLLM's buffer, consumers rank keys inside theirs, in prefill chunks and decode.
- vLLM 0.34.0's GLM-5-next pool indexer (``vllm.models.glm5next.nvidia.sparse_indexer``): its
  own copies of ``fp8_fp4_paged_mqa_logits`` and ``get_indexer_topk`` (decode) as the pair above;
  its prefill goes through the ``fused_mqa_topk`` seam, whose copies the fused records rebind.
- SGLang 0.5.23's DeepSeek-V4.1 sparse-table scheme (``v41_indexer/sparse_table.py``): the
  candidate source layer's decode (``publish_decode``) reads one [rows, max_compressed_seq_len]
  logits tensor with the v2 transform and ``amax_topk_blocks``; the module's copies of those two
  and of ``deep_gemm_fp4_paged_mqa_logits`` are replaced as a set
  (:mod:`sm12x.frontends.sglang.v41`). Its chunked form (``_publish_decode_chunked``: SGLang's
  row chunks past SM120's 4,096-row cap or an eager step's free-memory budget) reads each chunk's
  logits through the DeepSeek-V4 indexer module's ``topk_transform_paged_from_metadata``, i.e.
  that module's transforms, which the ``sglang.dsv4.indexer.topk_transform_paged(_v2)`` records
  replace: served the same way where they are applied. Its prefill scores in SGLang's own 2 GiB
  tiles and its consumers read candidate-only logits already.
- SGLang 0.5.20-0.5.23's DeepSeek-V4 indexer: the paged logits functions SM120 uses by default
  (TileLang, torch) and DeepGEMM's ``fp8_paged_mqa_logits`` when those are turned off (a
  placeholder only for ``run_paged_indexer``'s call): ``PAGED_LAYERS``, which the DeepGEMM-route
  records of those targets (:mod:`sm12x.patches.deep_gemm`) stack on sm12x's logits; the non-paged prefill's
  ``_nonpaged_mqa_logits`` (0.5.21 on), and the top-k transforms the indexer module binds.
- SGLang 0.5.15-0.5.23's DSA indexer (DeepSeek-V3.2, GLM-5), ragged prefill
  (``_get_topk_ragged``, whole batch or budget row chunks): the logits function it calls returns a
  placeholder (0.5.22-0.5.23: through the indexer module's copy of ``resolve_fp8_mqa_logits_fn``;
  0.5.15-0.5.21: the module's ``deep_gemm``, whose ``fp8_mqa_logits`` is wrapped), and
  ``DSATopKBackend.topk_transform`` writes the fused top-k for it as sgl-kernel's transforms do
  (row-local when unfused, plus the ragged-KV offset for RAGGED, page slots of the row's request
  for PAGED); real logits for FlashInfer's PAGED transform (it offsets the table by row starts), a
  FlashInfer tie-break and init / local token marks.
- SGLang 0.5.15-0.5.23's DSA indexer decode, MTP verify and draft extend (``_get_topk_paged``):
  the module's copies of ``deepgemm_paged_mqa_logits_split`` / ``_native`` (DeepGEMM's paged logits,
  whatever function SGLang hands them, split by SM count from 0.5.20) return a placeholder, and the
  same ``DSATopKBackend.topk_transform`` writes the PAGED transform for it (the v2 kernel's slots
  through the indexer's page table, sgl-kernel's or FlashInfer's through the page_size=1 table, or
  positions unfused); real logits for init / local token marks and a FlashInfer tie-break.

Not covered (see the front ends' docstrings): vLLM releases before 0.22.1; vLLM prefill and decode
with DCP > 1, BF16 logits or SM100 MX inputs, v4.1 candidate blocks before 0.34.0 and a 0.34.0 decode
whose [B, 1] lengths bound next_n > 1 rows of a request (real logits, vLLM's top-k); GLM-5-next's dense
prefill (an FP4 indexer cache, which vLLM 0.34.0 refuses on SM12x); SGLang 0.5.23's V4.1 candidate
source prefill (``publish_prefill_table``: flat-K logits in SGLang's own 2 GiB row tiles, each tile
read by its ragged top-k and by the block maxima that a second ragged top-k ranks, so memory is
bounded without sm12x; serving it would take records on the tile's logits call, the package's
ragged top-k and the block maxima, and a flat, request-offset form of the candidate top-k);
SGLang's DeepSeek-V4 paged indexer with the FP4 indexer cache (a (values, scales) query: real
logits); SGLang 0.5.20's DeepSeek-V4 non-paged prefill (``_forward_nonpaged_indexer``: every
row's logits at once); SGLang's DSA indexer in prefill context parallel
(``_get_topk_ragged_with_cp``), its paged logits through CuteDSL (SM100 only) or aiter / XPU
kernels, its fused torch top-k backend (SGLang raises there), and the kpool indexer of
``index_kpool`` models (``dsa_indexer_kpool``, its own ``_get_topk_paged``); SGLang releases before
0.5.15 and, for the DeepSeek-V4 records, before 0.5.20. No ``max_model_len`` / context gate
whose only reason is the indexer's memory or DeepGEMM's 32-bit offsets exists in vLLM 0.25.1 /
0.34.0 or SGLang 0.5.23: past 256K stock crashes (CUDA error 719) rather than refusing.

Releases whose indexer source was read for these records: vLLM 0.22.1-0.34.0, every release
(0.23.0's sparse_attn_indexer is 0.22.1's; 0.24.0 adds ``cooperative_topk`` to the decode, without
0.25.0's SM12x exclusion; 0.25.0's is 0.25.1's); SGLang 0.5.15, 0.5.15.post1 (the same DSA
indexer but for where the paged-logits wrappers are imported) and 0.5.16-0.5.23 (0.5.16-0.5.18's
DSA ``_get_topk_ragged`` / ``_get_topk_paged`` are 0.5.19's; 0.5.16's paged-logits wrappers still
come from ``sglang.jit_kernel.dsa`` with the same signatures).
"""
from __future__ import annotations

from sm12x.frontends.sglang import wrappers as sglang_wrappers
from sm12x.kernels.manifest import factory
from sm12x.patches import Layer, Patch

_VLLM_FUSED = "vllm.model_executor.kernels.attention.dsa.fused_mqa_topk"
_VLLM_INDEXER = "vllm.model_executor.layers.sparse_attn_indexer"
# modules of vLLM 0.34.0 that hold `from ...fused_mqa_topk import <name>` copies
_FUSED_USERS = (_VLLM_INDEXER, "vllm.models.glm5next.nvidia.sparse_indexer")
# the upstream functions (op manifest) whose factories several records here install
_FUSED_PREFILL = "vllm.fused_mqa_topk.fused_mqa_topk_prefill"
_PREFILL_LOGITS = "vllm.sparse_attn_indexer.fp8_fp4_mqa_logits"
_DSV4_PAGED = "sglang.dsv4.indexer.paged_mqa_logits"
_DSA_PAGED = "sglang.dsa.indexer.paged_mqa_logits"
_UPSTREAM_034 = ("vllm 0.34.0 model_executor/kernels/attention/dsa/fused_mqa_topk.py; "
                 "layers/sparse_attn_indexer.py (prefill chunks)")
_UPSTREAM_DECODE = ("vllm 0.30.0-0.34.0 model_executor/layers/sparse_attn_indexer.py (decode: get_indexer_topk); "
                    "layers/indexer_topk.py (SparseIndexerTopk); 0.22.1-0.29.0 sparse_attn_indexer.py (decode: "
                    "torch.ops._C.persistent_topk / cooperative_topk, ops.top_k_per_row_decode)")
_UPSTREAM_RADIX = ("vllm 0.22.1-0.29.0 model_executor/layers/sparse_attn_indexer.py (decode: torch.ops._C.{op} on "
                   "CUDA for topk 512/1024/2048); csrc registers it in the _C torch library")
_UPSTREAM_COMPRESSED = ("vllm 0.33.0 / 0.34.0 model_executor/layers/sparse_attn_indexer.py (prefill chunks: "
                        "as_fp32_logits(fp8_fp4_mqa_logits(..., max_seqlen_k)) then ops.top_k_per_row_prefill); "
                        "utils/deep_gemm.py (compressed logits)")
_UPSTREAM_PREFILL = ("vllm 0.22.1-0.32.0 model_executor/layers/sparse_attn_indexer.py (prefill chunks: "
                     "fp8_fp4_mqa_logits then ops.top_k_per_row_prefill)")

# when the vLLM records retire: vLLM's own fused seam serving SM12x makes the fused ones unnecessary,
# and with it the dense path's (vLLM then sends every eligible layer there)
_RETIRE_VLLM_FUSED = ("vLLM's fused_mqa_topk seam (its fused MQA logits -> top-k op) is built for and admits the "
                      "SM12x family")
_RETIRE_VLLM_DENSE = ("vLLM's sparse indexer ranks keys without materialising [rows, keys] logits on SM12x (its "
                      "fused_mqa_topk seam admitting the SM12x family for every layer it serves)")


def _vllm_fused(name, make, why, consumers=_FUSED_USERS):
    return Patch(name=f"vllm.fused_mqa_topk.{name}", target=f"{_VLLM_FUSED}:{name}", make=make, why=why,
                 upstream=_UPSTREAM_034, library="vllm", versions=">=0.34.0,<0.35", consumers=consumers,
                 retire_when=_RETIRE_VLLM_FUSED)


def _vllm_indexer(name, make, why, upstream, versions):
    """A record for one of the names ``sparse_attn_indexer`` binds (a decode or prefill pair)."""
    return Patch(name=f"vllm.sparse_attn_indexer.{name}", target=f"{_VLLM_INDEXER}:{name}", make=make, why=why,
                 upstream=upstream, library="vllm", versions=versions, retire_when=_RETIRE_VLLM_DENSE)


def _vllm_radix(op, versions, why):
    """A record for a decode top-k op that ``sparse_attn_indexer`` looks up through
    ``torch.ops._C`` at call time: the attribute of that namespace, reached from the module's
    ``torch``."""
    return Patch(name=f"vllm.sparse_attn_indexer.{op}", target=f"{_VLLM_INDEXER}:torch.ops._C.{op}",
                 make=factory("vllm.sparse_attn_indexer.ops", "make_radix_topk"), why=why,
                 upstream=_UPSTREAM_RADIX.format(op=op),
                 library="vllm", versions=versions, retire_when=_RETIRE_VLLM_DENSE)


VLLM_PATCHES = (
    _vllm_fused("use_fused_mqa_topk", factory(_FUSED_PREFILL, "make_use_fused_mqa_topk"),
                "vLLM's fused MQA+top-k prefill is eligible on the SM100 family only, so on SM12x every "
                "prefill chunk materialises [rows, keys] logits under a 512 MB budget (query "
                "sub-chunks at long context) and runs top_k_per_row_prefill; sm12x's fused top-k "
                "serves FP8 layers of 8-64 heads",
                consumers=_FUSED_USERS + ("vllm.v1.attention.backends.mla.indexer",)),
    _vllm_fused("fused_mqa_topk_chunk", factory(_FUSED_PREFILL, "make_fused_mqa_topk_chunk"),
                "vLLM's per-chunk rule weighs its SM100 kernel's SM waves against the dense path; with "
                "sm12x's fused top-k every chunk of an eligible layer skips the logits"),
    _vllm_fused("fused_mqa_topk_key_scales", factory("vllm.fused_mqa_topk.fused_mqa_topk_key_scales"),
                "vLLM decodes the gathered key scales as four UE8M0 bytes (the SM100 cache format); the "
                "SM12x indexer cache stores a float32 per key"),
    _vllm_fused("fused_mqa_topk_prefill", factory(_FUSED_PREFILL, "make_fused_mqa_topk_prefill"),
                "vLLM's fused op (torch.ops._C.fused_mqa_topk_prefill) is an SM100-family CUDA kernel; "
                "sm12x's fused top-k writes the same indices (relative to the row start, -1 padded)"),
    _vllm_indexer("fp8_fp4_paged_mqa_logits", factory("vllm.sparse_attn_indexer.fp8_fp4_paged_mqa_logits"),
                  "each decode step materialises [decode rows, max_model_len] float32 logits (1 MiB a row at "
                  "a 1M-token DeepSeek-V4 limit) for the top-k (SM12x: persistent_topk, directly up to 0.29, "
                  "through the get_indexer_topk selector from 0.30); the logits come back as a placeholder "
                  "for the fused paged top-k when every top-k the decode may pick is sm12x's (real logits "
                  "for v4.1 candidate blocks, DCP or BF16 logits, which other readers need)",
                  _UPSTREAM_DECODE, ">=0.22.1,<0.35"),
    _vllm_indexer("get_indexer_topk", factory("vllm.sparse_attn_indexer.ops", "make_get_indexer_topk"),
                  "the indexer's decode top-k selector runs the fused paged top-k for the placeholder logits "
                  "of its fp8_fp4_paged_mqa_logits record (vLLM's selector for real logits)",
                  _UPSTREAM_DECODE, ">=0.30.0,<0.35"),
    _vllm_radix("persistent_topk", ">=0.22.1,<0.30",
                "the decode top-k on CUDA for topk 512/1024/2048 (every SM12x decode of DeepSeek-V3.2 / V4), "
                "looked up through torch.ops._C at call time; replaced on that namespace, it runs the fused "
                "paged top-k for the placeholder logits of the fp8_fp4_paged_mqa_logits record and vLLM's "
                "op for any other call (0.22.1-0.28.0: sparse_attn_indexer is its only caller; 0.29.0 "
                "adds qsa.py's AMD path)"),
    _vllm_radix("cooperative_topk", ">=0.24.0,<0.30",
                "the decode top-k for up to 32 rows on SM90+ (0.24.0 picks it on SM12x too; 0.25.0 on leaves "
                "the SM12x family out, so there it runs with SM12X_FORCE on Hopper / Blackwell), looked up "
                "through torch.ops._C like persistent_topk: replaced there so that no decode top-k vLLM may "
                "pick reads a placeholder as logits (vLLM's op for any other call)"),
    _vllm_indexer("fp8_fp4_mqa_logits", factory(_PREFILL_LOGITS, "make_deferred_mqa_logits"),
                  "each prefill chunk materialises [rows, keys] float32 logits (up to the 512 MB "
                  "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB budget, query sub-chunks at long context) only to "
                  "pass them to top_k_per_row_prefill; the logits come back as a placeholder for the "
                  "fused top-k (real logits under DCP, whose merge reads them, and with v4.1 candidate "
                  "blocks, which select or mask on them)",
                  _UPSTREAM_PREFILL, ">=0.22.1,<0.33"),
    Patch(name="vllm.sparse_attn_indexer.compressed_mqa_logits", target=f"{_VLLM_INDEXER}:fp8_fp4_mqa_logits",
          make=factory(_PREFILL_LOGITS, "make_deferred_compressed_mqa_logits"),
          why="each prefill chunk (0.33.0; 0.34.0: layers the fused seam does not take, e.g. an FP4 indexer "
              "cache) materialises DeepGEMM's compressed [rows, max_seqlen_k] logits, upcast to float32, only "
              "for top_k_per_row_prefill; they come back as a placeholder for the fused top-k (real logits "
              "under DCP, with v4.1 candidate blocks, for BF16 / SM100 MX inputs)",
          upstream=_UPSTREAM_COMPRESSED, library="vllm", versions=">=0.33.0,<0.35", retire_when=_RETIRE_VLLM_DENSE),
    _vllm_indexer("ops", factory("vllm.sparse_attn_indexer.ops", "make_indexer_ops"),
                  "the indexer's ops.top_k_per_row_prefill and ops.top_k_per_row_decode run the fused top-k "
                  "for the placeholder logits of its fp8_fp4_mqa_logits / fp8_fp4_paged_mqa_logits records "
                  "(vLLM's kernels for real logits; every other op is vllm._custom_ops' own)",
                  _UPSTREAM_PREFILL + "; 0.33.0-0.34.0 prefill; 0.22.1-0.29.0 decode (ops.top_k_per_row_decode)",
                  ">=0.22.1,<0.35"),
)

_UPSTREAM_V41 = ("vllm 0.34.0 model_executor/layers/sparse_attn_indexer.py (prefill chunks and decode: "
                 "_select_candidate_blocks / _apply_candidate_mask between the logits and the top-k); "
                 "model_executor/kernels/attention/dsa/candidate_blocks.py; models/deepseek_v41/attention.py "
                 "(candidate source and consumers)")
_V41_WHY = ("DeepSeek-V4.1's {step} reads every {which} layer's logits ([rows, max_seqlen_k] float32 per prefill "
            "chunk, [decode rows, max_model_len] per decode step, 4 MiB a row at 1M), so sm12x's indexer records "
            "kept them real for every V4.1 indexer layer; for the placeholder logits it now records the step and "
            "the fused candidate top-k does it (vLLM's kernel for real logits)")


def _vllm_v41(step, make, which):
    return Patch(name=f"vllm.sparse_attn_indexer.{step}", target=f"{_VLLM_INDEXER}:{step}", make=make,
                 why=_V41_WHY.format(step=step.lstrip("_"), which=which), upstream=_UPSTREAM_V41, library="vllm",
                 versions=">=0.34.0,<0.35", retire_when=_RETIRE_VLLM_DENSE,
                 notes="only with the indexer's logits and top-k records applied (else every call gets real "
                       "logits); real logits under DCP, for bf16 logits and for a decode whose [B, 1] lengths "
                       "bound several rows of a request (vLLM's row_repeat)")


VLLM_V41_PATCHES = (
    _vllm_v41("_select_candidate_blocks", factory("vllm.sparse_attn_indexer.select_candidate_blocks"), "candidate source"),
    _vllm_v41("_apply_candidate_mask", factory("vllm.sparse_attn_indexer.apply_candidate_mask"), "candidate consumer"),
)

_GLM5NEXT = "vllm.models.glm5next.nvidia.sparse_indexer"
_GLM5NEXT_UPSTREAM = ("vllm 0.34.0 models/glm5next/nvidia/sparse_indexer.py (sparse_attn_indexer_kpool decode: "
                      "fp8_fp4_paged_mqa_logits then get_indexer_topk, its own copies from vllm.utils.deep_gemm "
                      "and layers/indexer_topk.py)")


def _glm5next(name, make, why):
    return Patch(name=f"vllm.glm5next.sparse_indexer.{name}", target=f"{_GLM5NEXT}:{name}", make=make, why=why,
                 upstream=_GLM5NEXT_UPSTREAM, library="vllm", versions=">=0.34.0,<0.35",
                 retire_when=_RETIRE_VLLM_DENSE,
                 notes="prefill goes through vLLM's fused_mqa_topk seam (the vllm.fused_mqa_topk records rebind "
                       "this module's copies); its dense prefill (an FP4 indexer cache, refused on SM12x by "
                       "vLLM 0.34) keeps real logits")


GLM5NEXT_PATCHES = (
    _glm5next("fp8_fp4_paged_mqa_logits", factory("vllm.sparse_attn_indexer.fp8_fp4_paged_mqa_logits"),
              "GLM-5-next's pool indexer decode materialises [decode rows, max_pool_len] float32 logits for its "
              "top-k of topk // index_kpool pools (the module imports its own fp8_fp4_paged_mqa_logits, which "
              "the sparse_attn_indexer records do not reach); they come back as a placeholder for the fused "
              "paged top-k when the module's get_indexer_topk is sm12x's and DCP is off"),
    _glm5next("get_indexer_topk", factory("vllm.sparse_attn_indexer.ops", "make_get_indexer_topk"),
              "GLM-5-next's decode top-k selector (its own copy) runs the fused paged top-k for the placeholder "
              "logits of its fp8_fp4_paged_mqa_logits record (vLLM's selector for real logits)"),
)

_SGLANG_V41_UPSTREAM = ("sglang 0.5.23 srt/layers/attention/dsv4/v41_indexer/sparse_table.py "
                        "(SparseTableBackend.publish_decode); kernels/ops/attention/dsv4/index_logits.py, "
                        "candidate_blocks.py (amax_topk_blocks), topk.py (topk_transform_paged_v2)")
_RETIRE_SGLANG_V41 = ("SGLang's V4.1 candidate source ranks its decode rows and blocks on SM120 without "
                      "materialising [rows, max_compressed_seq_len] logits (its TODO: one kernel for both selections)")


def _sglang_v41(name, make, why):
    return Patch(name=f"sglang.v41.sparse_table.{name}", target=f"{sglang_wrappers.V41_SPARSE_TABLE}:{name}",
                 make=make, why=why, upstream=_SGLANG_V41_UPSTREAM, library="sglang", versions=">=0.5.23,<0.5.24",
                 retire_when=_RETIRE_SGLANG_V41,
                 notes="publish_decode, and its chunked form where the DeepSeek-V4 indexer's transform records "
                       "(sglang.dsv4.indexer.topk_transform_paged / _v2) are applied too; only with all three "
                       "records applied and the candidate gate letting SGLang build this scheme")


SGLANG_V41_PATCHES = (
    _sglang_v41("deep_gemm_fp4_paged_mqa_logits", factory("sglang.v41.deep_gemm_fp4_paged_mqa_logits"),
                "DeepSeek-V4.1's candidate source layer materialises [decode rows, max_compressed_seq_len] FP32 "
                "logits per step (4 MiB a row at 1M positions) for its own top-k and its block selection; called "
                "from publish_decode with both readers sm12x's, the logits come back as a placeholder"),
    _sglang_v41("topk_transform_paged_v2", factory("sglang.dsv4.indexer.topk_transform", "make_topk_transform_v2"),
                "the source layer's own top-k (page slots) runs the fused candidate top-k for the placeholder, "
                "which also publishes the rows' blocks of 8 (SGLang's top-k v2 kernel for real logits)"),
    _sglang_v41("amax_topk_blocks", factory("sglang.v41.amax_topk_blocks"),
                "the source layer's block selection (block maxima of 8 positions, newest pinned, top "
                "topk_blocks) hands over the blocks the fused candidate top-k published for the placeholder, "
                "after an event on the main stream (SGLang's kernels for real logits)"),
)

_SGLANG_UPSTREAM = ("sglang 0.5.21-0.5.23 srt/layers/attention/dsv4/indexer.py (forward_c4_indexer, "
                    "_get_nonpaged_indexer_plan; 0.5.20: _forward_nonpaged_indexer, not replaced)")
_SGLANG_WHY = ("SGLang's DeepSeek-V4 non-paged prefill indexer (one request's extend, on by default) "
               "materialises [rows, max_seqlen_k] float32 logits per row chunk, with no row cap when the "
               "plan has no logits budget (8 GiB for an 8K-token chunk at a 1M-token prompt)")


def _sglang(name, target, make, why, versions, notes=""):
    return Patch(name=f"sglang.dsv4.indexer.{name}", target=f"{sglang_wrappers.DSV4_INDEXER}:{target}",
                 make=make, why=why, upstream=_SGLANG_UPSTREAM, library="sglang", versions=versions,
                 retire_when=_RETIRE_SGLANG_DSV4, notes=notes)


_PAGED_WHY = ("SGLang 0.5.20-0.5.23 on SM120 runs the DeepSeek-V4 paged indexer through {what} by default: "
              "[rows, max_compressed_seq_len] float32 logits for every query row of a batch at once (8 GiB for an "
              "8K-token chunk at a 1M-token prompt); called from forward_c4_indexer the logits come back as a "
              "placeholder for the fused top-k, elsewhere as the real logits of the record below")
_PAGED_NOTES = ("SGLang's SM120 model hook sets SGLANG_OPT_USE_TILELANG_INDEXER and SGLANG_FP8_PAGED_MQA_LOGITS_TORCH, "
                "which also drops the indexer metadata's row chunking")
_PAGED_UPSTREAM = ("sglang 0.5.20-0.5.23 srt/layers/attention/dsv4/indexer.py (forward_c4_indexer: run_paged_indexer); "
                   "dsv4/metadata.py (PagedIndexerMetadata); arg_groups/model_hook.py (SM120)")
_RETIRE_SGLANG_DSV4 = ("SGLang's DeepSeek-V4 indexer ranks its keys on SM120 without materialising the [rows, keys] "
                       "logits (a fused logits -> top-k of its own on that path)")

# Layers the DeepGEMM-route records of :mod:`sm12x.patches.deep_gemm` stack on their replacement
# (sm12x's paged logits): for SGLang's DeepSeek-V4 paged indexer, a placeholder instead of logits.
PAGED_LAYERS = {
    name: Layer(name=f"sglang.dsv4.paged_indexer.{name}", make=factory(_DSV4_PAGED, "make_paged_logits"),
                why=_PAGED_WHY.format(what=what), upstream=_PAGED_UPSTREAM, library="sglang",
                versions=">=0.5.20,<0.5.24", retire_when=_RETIRE_SGLANG_DSV4, notes=_PAGED_NOTES)
    for name, what in (("tilelang", "the TileLang kernel"),
                       ("torch_sm120", "the torch SM120 logits when TileLang is turned off"),
                       ("torch", "the generic torch logits (SM120 detection off)"))
}
PAGED_LAYERS["deep_gemm"] = Layer(
    name="sglang.dsv4.paged_indexer.deep_gemm", make=factory(_DSV4_PAGED, "make_deep_gemm_paged_logits"),
    why=("SGLang 0.5.20-0.5.23's DeepSeek-V4 paged indexer with the TileLang and torch logits turned off imports "
         "DeepGEMM's fp8_paged_mqa_logits at call time and materialises [rows, max_compressed_seq_len] float32 "
         "logits per row chunk for one top-k transform; called from run_paged_indexer with FP8 queries while the "
         "transforms are ours, the logits come back as a placeholder for the fused top-k, every other caller "
         "gets the real logits of the record below"),
    upstream=("sglang 0.5.20-0.5.23 srt/layers/attention/dsv4/indexer.py (forward_c4_indexer: "
              "`from deep_gemm import fp8_paged_mqa_logits as fn`, run_paged_indexer); dsv4/metadata.py "
              "(PagedIndexerMetadata row chunks); sgl-deep-gemm 0.1.4-0.2.3.post2 deep_gemm/__init__.py "
              "(0.2.5 has only fp8_fp4_paged_mqa_logits)"),
    library="deep_gemm", versions=">=0.1.4,<0.2.4", retire_when=_RETIRE_SGLANG_DSV4,
    notes=("turned off by SGLANG_OPT_USE_TILELANG_INDEXER=0 and SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=0; the range is "
           "sgl-deep-gemm's, the releases SGLang 0.5.15-0.5.23 pin; SGLang's own range comes from the transform "
           "records, without which every call gets real logits"))

SGLANG_PATCHES = (
    _sglang("nonpaged_mqa_logits", "C4IndexerBackendMixin._nonpaged_mqa_logits",
            factory("sglang.dsv4.indexer.nonpaged_mqa_logits"),
            f"{_SGLANG_WHY}; the logits come back as a placeholder for the fused top-k (the "
            f"original's logits unless every transform below is applied)", ">=0.5.21,<0.5.24"),
) + tuple(
    _sglang(name, name, make,
            f"{when} receives the non-paged indexer's logits ([rows, max_seqlen_k] float32, 8 GiB for an "
            f"8K-token chunk at a 1M-token prompt); for the placeholder it writes the fused top-k as page "
            f"slots, as SGLang's transforms do", ">=0.5.20,<0.5.24",
            notes="from 0.5.20 the paged layers' placeholders too; the non-paged prefill indexer is one "
                  "request's extend, on by default, with no row cap when the plan has no logits budget")
    for name, make, when in (
        ("topk_transform_paged", factory("sglang.dsv4.indexer.topk_transform", "make_topk_transform"),
         "the sgl-kernel transform (dsa_topk_backend sgl-kernel, SGLANG_OPT_USE_TOPK_V2 off)"),
        ("topk_transform_paged_v2", factory("sglang.dsv4.indexer.topk_transform", "make_topk_transform_v2"),
         "the sgl-kernel v2 transform (dsa_topk_backend sgl-kernel with SGLANG_OPT_USE_TOPK_V2)"),
        ("topk_transform_pytorch_vectorized", factory("sglang.dsv4.indexer.topk_transform", "make_topk_transform"),
         "the torch transform (dsa_topk_backend torch)"),
        ("topk_transform_flashinfer_fused", factory("sglang.dsv4.indexer.topk_transform", "make_topk_transform"),
         "FlashInfer's fused page-table transform (dsa_topk_backend flashinfer, fused)"),
        ("topk_transform_flashinfer_unfused", factory("sglang.dsv4.indexer.topk_transform", "make_topk_transform"),
         "FlashInfer's top-k with SGLang's page mapping (dsa_topk_backend flashinfer, unfused)"))
)

_RETIRE_SGLANG_DSA = ("SGLang's DSA indexer ranks its keys on SM120 without materialising the [rows, keys] logits "
                      "(a fused logits -> top-k of its own on the ragged and paged paths)")
_DSA_UPSTREAM = ("sglang 0.5.22-0.5.23 srt/layers/attention/dsa/dsa_indexer.py (DSAIndexer._get_topk_ragged); "
                 "dsa/dsa_topk_backend.py (DSATopKBackend.topk_transform); mqa_logits_utils.py (the logits budget)")
_DSA_WHY = ("SGLang's DSA indexer (DeepSeek-V3.2, GLM-5) ragged prefill materialises [rows, keys] float32 logits "
            "for the extend batch, row-chunked only under a budget of up to 30% of GPU memory (a 1M-token prompt's "
            "8K-token chunk: 32 GiB of logits in budget-sized row chunks) and ranks them with the sgl-kernel / torch "
            "/ FlashInfer top-k")
_DSA_UPSTREAM_OLD = ("sglang 0.5.15-0.5.21 srt/layers/attention/dsa/dsa_indexer.py "
                     "(DSAIndexer._get_topk_ragged: deep_gemm.fp8_mqa_logits, then metadata.topk_transform)")
_DSA_WHY_OLD = ("SGLang 0.5.15-0.5.21's DSA indexer (DeepSeek-V3.2, GLM-5) ragged prefill materialises "
                "[rows, keys] float32 logits from deep_gemm.fp8_mqa_logits, row-chunked only under the logits "
                "budget, for the DSA top-k")
SGLANG_DSA_PATCHES = (
    Patch(name="sglang.dsa.ragged_indexer.resolve_fp8_mqa_logits_fn",
          target=f"{sglang_wrappers.DSA_INDEXER}:resolve_fp8_mqa_logits_fn",
          make=factory("sglang.dsa.indexer.mqa_logits", "make_resolve_fp8_mqa_logits_fn"),
          why=f"{_DSA_WHY}; the logits function it resolves returns a placeholder for the fused top-k when "
              f"only a top-k sm12x writes reads them",
          notes="a placeholder for _get_topk_ragged's calls with FP8 queries sm12x serves only; the original's "
                "logits for FlashInfer's PAGED transform, init / local token marks and other callers",
          upstream=_DSA_UPSTREAM, library="sglang", versions=">=0.5.22,<0.5.24", retire_when=_RETIRE_SGLANG_DSA,
          # the deprecated nsa shim star-imports the module (its copy is not what _get_topk_ragged calls)
          consumers=("sglang.srt.layers.attention.nsa.nsa_indexer",)),
    Patch(name="sglang.dsa.ragged_indexer.deep_gemm", target=f"{sglang_wrappers.DSA_INDEXER}:deep_gemm",
          make=factory("sglang.dsa.indexer.mqa_logits", "make_indexer_deep_gemm"),
          why=f"{_DSA_WHY_OLD}; the indexer module's deep_gemm (every attribute DeepGEMM's own) answers "
              f"_get_topk_ragged's fp8_mqa_logits calls with a placeholder for the fused top-k under the same "
              f"conditions as 0.5.22-0.5.23's resolve_fp8_mqa_logits_fn record",
          upstream=_DSA_UPSTREAM_OLD, library="sglang", versions=">=0.5.15,<0.5.22", retire_when=_RETIRE_SGLANG_DSA,
          consumers=("sglang.srt.layers.attention.nsa.nsa_indexer",)),  # the nsa shim's star-import copy
    Patch(name="sglang.dsa.ragged_indexer.topk_transform",
          target=f"{sglang_wrappers.DSA_TOPK}:DSATopKBackend.topk_transform",
          make=factory("sglang.dsa.topk_backend.topk_transform"),
          why=f"{_DSA_WHY}; every DSA top-k goes through this method, which for the placeholder writes the "
              f"fused top-k as sgl-kernel's transforms do (SGLang's backends for real logits)",
          notes="row-local (unfused), plus topk_indices_offset (RAGGED) or as page slots of the row's request "
                "(PAGED, SM120's default prefill transform)",
          upstream=_DSA_UPSTREAM + "; 0.5.15-0.5.21 the same method", library="sglang",
          versions=">=0.5.15,<0.5.24", retire_when=_RETIRE_SGLANG_DSA),
)

_DSA_PAGED_UPSTREAM = ("sglang 0.5.15-0.5.23 srt/layers/attention/dsa/dsa_indexer.py (DSAIndexer._get_topk_paged: "
                       "deepgemm_paged_mqa_logits_split / _native, then metadata.topk_transform); "
                       "kernels/ops/attention/dsa/paged_mqa_logits.py "
                       "(0.5.15-0.5.16: jit_kernel/dsa/paged_mqa_logits.py)")
_DSA_PAGED_WHY = ("SGLang's DSA indexer (DeepSeek-V3.2, GLM-5) decode, MTP verify and draft extend "
                  "(_get_topk_paged) materialise [rows, max_seq_len] float32 logits through {name} only for the "
                  "DSA top-k (4 MiB a row at 1M tokens, 1 GiB for a 256-row verify batch); they come back as a "
                  "placeholder for the fused paged top-k when only a top-k sm12x writes reads them")
_DSA_PAGED_NOTES = ("{how}; max_seq_len is the page table's width (the context limit under CUDA graphs); the "
                    "placeholder needs DSATopKBackend.topk_transform applied, no init / local token marks, not "
                    "FlashInfer with a tie-break set, not the fused torch backend (SGLang's logits otherwise)")
SGLANG_DSA_PAGED_PATCHES = tuple(
    Patch(name=f"sglang.dsa.paged_indexer.{name}", target=f"{sglang_wrappers.DSA_INDEXER}:{name}", make=make,
          why=_DSA_PAGED_WHY.format(name=name), notes=_DSA_PAGED_NOTES.format(how=how),
          upstream=_DSA_PAGED_UPSTREAM, library="sglang",
          versions=">=0.5.15,<0.5.24", retire_when=_RETIRE_SGLANG_DSA,
          consumers=("sglang.srt.layers.attention.nsa.nsa_indexer",))  # the nsa shim's star-import copy
    for name, make, how in (
        ("deepgemm_paged_mqa_logits_split", factory(_DSA_PAGED, "make_dsa_paged_logits_split"),
         "this wrapper serves decode rows and verify / draft-extend rows one row per request "
         "(from 0.5.20 through a function that splits the rows by SM count and concatenates them)"),
        ("deepgemm_paged_mqa_logits_native", factory(_DSA_PAGED, "make_dsa_paged_logits_native"),
         "this wrapper serves MTP verify with [B, next_n] context lengths (next_n rows per request, one "
         "DeepGEMM call)"))
)

PATCHES = VLLM_PATCHES + VLLM_V41_PATCHES + GLM5NEXT_PATCHES + SGLANG_V41_PATCHES + SGLANG_PATCHES + SGLANG_DSA_PATCHES + SGLANG_DSA_PAGED_PATCHES

"""SGLang 0.5.23's DeepSeek-V4.1 candidate source layer (``SparseTableBackend.publish_decode``) with
sm12x's records (:mod:`sm12x.patches.indexer_topk`, ``sglang.v41.sparse_table.*``) on a stand-in
tree shaped like the release: its MXFP4 paged logits, the v2 top-k transform (page slots) and the
block selection of 8-position blocks read one [rows, max_compressed_seq_len] logits tensor. With
sm12x the logits are a placeholder and the page slots and published blocks are the sets SGLang's
functions give (the stand-ins keep their semantics as the release documents them). The chunked
decode (``_publish_decode_chunked``: a row chunk's logits at a time, its transform through the
DeepSeek-V4 indexer module's ``topk_transform_paged_from_metadata``, v1 or v2 by the metadata) is
served the same way where that module's transforms are sm12x's records; a reader left to SGLang
keeps real logits."""
import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

PACKAGES = ("sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention",
            "sglang/kernels/ops/attention/dsv4", "sglang/srt", "sglang/srt/layers", "sglang/srt/layers/attention",
            "sglang/srt/layers/attention/dsv4", "sglang/srt/layers/attention/dsv4/v41_indexer")
OPS = "sglang/kernels/ops/attention/dsv4"

TREE = {
    **{f"{p}/__init__.py": "" for p in PACKAGES},
    f"{OPS}/index_logits.py": """
        import torch
        from sm12x.frontends.deep_gemm import indexer as deep_gemm  # DeepGEMM on SM120: sm12x's records
        def deep_gemm_fp4_paged_mqa_logits(q_fp4, k_cache, weights, seq_lens, page_table, deep_gemm_metadata,
                                           max_seq_len):
            sl = seq_lens.to(torch.int32)
            if sl.dim() == 1:
                sl = sl.unsqueeze(-1)
            return deep_gemm.fp8_fp4_paged_mqa_logits(q_fp4, k_cache, weights.float(), sl, page_table,
                                                      deep_gemm_metadata, max_seq_len, False)
    """,
    # SGLang's top-k v2 transform: rows of at most topk positions take 0..n-1, longer ones their topk
    # best (unordered in SGLang; equal scores lower position first here), page slots through the table
    f"{OPS}/topk.py": """
        import torch
        def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                    out_raw_indices=None):
            topk = out_page_indices.shape[1]
            pos = torch.full_like(out_page_indices, -1)
            for r in range(scores.shape[0]):
                n = int(seq_lens[r])
                order = torch.arange(n) if n <= topk else torch.sort(scores[r, :n], descending=True,
                                                                      stable=True).indices[:topk]
                pos[r, :order.numel()] = order.int()
            p = pos.clamp(min=0).long()
            slots = page_tables.gather(1, p // page_size).long() * page_size + p % page_size
            out_page_indices.copy_(torch.where(pos >= 0, slots, -1))
    """,
    # SGLang's block selection as its docstring states it (block maxima of 8 among the first
    # seq_lens positions, the newest block pinned, the top topk_blocks, -1 past the row's count)
    f"{OPS}/candidate_blocks.py": """
        import torch
        from sm12x.kernels.indexer.reference import ref_select_candidate_blocks
        def candidate_row_lens(seq_lens, topk_blocks, block_size=8):
            n = (seq_lens + block_size - 1) // block_size
            kept = torch.minimum(n, torch.full_like(n, topk_blocks))
            valid = torch.where(seq_lens > 0, block_size * (kept - 1) + (seq_lens - 1) % block_size + 1, 0)
            return n.int(), valid.int()
        def amax_topk_blocks(logits, seq_lens, nblocks, topk_blocks, max_seq_len=None):
            return ref_select_candidate_blocks(logits, seq_lens, topk_blocks, 8).int()
    """,
    # the DeepSeek-V4 indexer module's transforms, and the function the chunked decode reaches them by
    "sglang/srt/layers/attention/dsv4/indexer.py": """
        from sglang.kernels.ops.attention.dsv4.topk import topk_transform_paged_v2
        def topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
            topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, None, out_raw_indices)
        def topk_transform_paged_from_metadata(logits, metadata, page_indices, raw_indices=None, *, rows=None,
                                               topk_metadata=None):
            seq_lens, table = metadata.compressed_seq_lens[rows], metadata.page_table[rows]
            if metadata.use_topk_v2:
                topk_transform_paged_v2(logits, seq_lens, table, page_indices[rows], metadata.compressed_page_size,
                                        topk_metadata)
            else:
                topk_transform_paged(logits, seq_lens, table, page_indices[rows], metadata.compressed_page_size)
    """,
    "sglang/srt/layers/attention/dsv4/v41_indexer/sparse_table.py": """
        import os
        import types
        import torch
        from sglang.kernels.ops.attention.dsv4.candidate_blocks import amax_topk_blocks, candidate_row_lens
        from sglang.kernels.ops.attention.dsv4.index_logits import deep_gemm_fp4_paged_mqa_logits
        from sglang.kernels.ops.attention.dsv4.topk import topk_transform_paged_v2
        from sglang.srt.layers.attention.dsv4.indexer import topk_transform_paged_from_metadata

        class SparseTableBackend:
            def __init__(self, topk_blocks):
                self.topk_blocks = topk_blocks

            def publish_decode(self, q, k_cache, weights, lens, table, out_page_indices, page_size, max_len):
                # publish_decode's sequence (streams left out): the logits, the layer's own v2 top-k,
                # then the row lengths and the block selection
                seq_lens = lens.reshape(-1)
                logits = deep_gemm_fp4_paged_mqa_logits(q, k_cache, weights, lens, table, None, max_len)
                topk_transform_paged_v2(logits, seq_lens, table, out_page_indices, page_size, None)
                nblocks, row_valid_lens = candidate_row_lens(seq_lens, self.topk_blocks)
                blocks = amax_topk_blocks(logits, seq_lens, nblocks, self.topk_blocks)
                return blocks, logits

            def _publish_decode_chunked(self, q, k_cache, weights, lens, table, out_page_indices, page_size, max_len):
                # the chunked plan's path (two row chunks here): each chunk's logits, their transform through
                # the indexer module (v1 or v2 by the metadata), the chunk's blocks
                seq_lens = lens.reshape(-1)
                metadata = types.SimpleNamespace(compressed_seq_lens=seq_lens, page_table=table,
                                                 compressed_page_size=page_size,
                                                 use_topk_v2=os.environ.get("TOPK_V2") == "1")
                blocks = []
                for rows in (slice(0, 1), slice(1, seq_lens.shape[0])):
                    logits = deep_gemm_fp4_paged_mqa_logits((q[0][rows], q[1][rows]), k_cache, weights[rows],
                                                            lens[rows], table[rows], None, max_len)
                    topk_transform_paged_from_metadata(logits, metadata, out_page_indices, None, rows=rows)
                    nblocks, row_valid_lens = candidate_row_lens(seq_lens[rows], self.topk_blocks)
                    blocks.append(amax_topk_blocks(logits, seq_lens[rows], nblocks, self.topk_blocks))
                return torch.cat(blocks), logits
    """,
}

CALLS = """
import json, os, torch
import sglang  # the watcher route
from sglang.srt.layers.attention.dsv4.v41_indexer import sparse_table as st
from sm12x.kernels.indexer.cache import quant_fp4_paged_cache, quant_fp4_per_token
from sm12x import apply
g = torch.Generator().manual_seed(3)
rows, h, d, page, pages, topk, kb = 4, 8, 128, 64, 16, 24, 5
cache = quant_fp4_paged_cache(torch.randn(pages, page, d, generator=g))
q = tuple(t.view(rows, 1, *t.shape[1:]) for t in quant_fp4_per_token(torch.randn(rows, h, d, generator=g)))
w = torch.randn(rows, h, generator=g)
lens = torch.tensor([7, 100, 300, 256], dtype=torch.int32)
table = torch.stack([torch.randperm(pages, generator=g)[:8] for _ in range(rows)]).int()
backend = st.SparseTableBackend(kb)
call = backend._publish_decode_chunked if os.environ.get("CHUNKED") else backend.publish_decode
out = torch.full((rows, topk), 7, dtype=torch.int32)
blocks, logits = call(q, cache, w, lens, table, out, page, 512)

def original(fn):
    return getattr(fn, "__sm12x_original__", fn)
want = torch.full((rows, topk), 7, dtype=torch.int32)
real = original(st.deep_gemm_fp4_paged_mqa_logits)(q, cache, w, lens, table, None, 512)
original(st.topk_transform_paged_v2)(real, lens, table, want, page, None)
want_blocks = original(st.amax_topk_blocks)(real, lens, None, kb)
sets = lambda t: [sorted(r) for r in t.tolist()]
print(json.dumps({"slots": sets(out) == sets(want), "blocks": sets(blocks) == sets(want_blocks),
                  "bytes": logits.untyped_storage().nbytes(),
                  "outcomes": {k: v[0] for k, v in apply.OUTCOMES.items() if k.startswith("sglang.v41.sparse_table")}}))
"""


def _run(tmp_path, env=None):
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**TREE, **dist_infos({"sglang": "0.5.23"})})
    return last_json(run_py(CALLS, pythonpath=[REPO, root], env={"TRITON_INTERPRET": "1", **(env or {})}))


def test_v41_source_decode_without_logits(tmp_path):
    out = _run(tmp_path)
    assert out["slots"] and out["blocks"] and out["bytes"] == 4, out
    assert set(out["outcomes"].values()) == {"applied"} and len(out["outcomes"]) == 3, out["outcomes"]


@pytest.mark.parametrize("env", [{"CHUNKED": "1"}, {"CHUNKED": "1", "TOPK_V2": "1"}], ids=["v1 transform", "v2"])
def test_v41_chunked_source_decode_without_logits(tmp_path, env):
    out = _run(tmp_path, env)
    assert out["slots"] and out["blocks"] and out["bytes"] == 4, out


@pytest.mark.parametrize("env", [{"SM12X_SKIP": "sglang.v41.sparse_table.amax_topk_blocks"},
                                 {"CHUNKED": "1", "SM12X_SKIP": "sglang.dsv4.indexer.topk_transform_paged"}],
                         ids=["block record off", "chunked, the indexer's transform record off"])
def test_real_logits_elsewhere(tmp_path, env):
    out = _run(tmp_path, env)
    assert out["slots"] and out["blocks"] and out["bytes"] > 4, out

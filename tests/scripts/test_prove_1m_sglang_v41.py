"""scripts/prove_1m_indexer.py's SGLang 0.5.23 DeepSeek-V4.1 passes (``--v41``: ``init-v41``,
``decode-v41``, ``decode-v41-chunked``) end to end at a tiny scale on the CPU (Triton
interpreter): unpatched, ``make_candidate_indexer`` raises SGLang's RuntimeError and SGLang's own
source decode ranks its materialised logits (whole, or in row chunks); patched, the backend is
the sparse table and the source layer's top-k and blocks come from sm12x's fused candidate top-k
(one top-k over logits left: the consumer's sparse row); both modes' index sets match the
references. A planted bug in SGLang's row lengths makes the script exit 1.

SGLang's modules are the real ones extracted from the wheel when it is on this machine
(``SM12X_FRAMEWORK_WHEELS`` when set, else /tmp/moe-wheels or /tmp/wheels), else the stand-in
tree below: written from those modules' sources, it keeps the names, signatures and call sequence
the records and the script meet (the gate, the source decode's three readers of its logits, the
consumer's sparse logits and top-k, the JIT modules by file name), the rest left out."""
import json
import os
import subprocess
import sys

import pytest
from tests_support import REPO, dist_infos, write_tree

pytestmark = pytest.mark.cpu_only

SCRIPT = os.path.join(REPO, "scripts", "prove_1m_indexer.py")
RELEASE = "sglang-0.5.23"
TINY = ["--device", "cpu", "--keys", "256", "--queries", "8", "--decode-rows", "2", "--topk", "16", "--heads", "16",
        "--dim", "128", "--reps", "0", "--contexts", "256", "--releases", RELEASE, "--v41"]
# the stand-in tree has no prefill (no sm12x record takes part there): the real modules run it too
PASSES = {"stand-in": "init-v41,decode-v41,decode-v41-chunked",
          "real": "init-v41,prefill-v41,decode-v41,decode-v41-chunked"}
V41 = "sglang/srt/layers/attention/dsv4/v41_indexer"
OPS = "sglang/kernels/ops/attention/dsv4"


def _tree(bug=False):
    valid = "valid // 2" if bug else "valid"  # the planted bug: each sparse row half its keys
    return {
        **dist_infos({"sglang": "0.5.23"}),
        # the C4 indexer's transforms, which the chunked source decode reaches through its metadata
        "sglang/srt/layers/attention/dsv4/indexer.py": """
            from sglang.kernels.ops.attention.dsv4 import topk_transform_paged, topk_transform_paged_v2

            def topk_transform_paged_from_metadata(logits, metadata, page_indices, raw_indices=None, *, rows=None,
                                                   topk_metadata=None):
                seq_lens, table = metadata.compressed_seq_lens[rows], metadata.page_table[rows]
                if metadata.use_topk_v2:
                    topk_transform_paged_v2(logits, seq_lens, table, page_indices[rows],
                                            metadata.compressed_page_size, topk_metadata)
                else:
                    topk_transform_paged(logits, seq_lens, table, page_indices[rows], metadata.compressed_page_size)
        """,
        "sglang/srt/layers/deep_gemm_wrapper/configurer.py": """
            from sglang.srt.runtime_context import get_platform
            DEEPGEMM_BLACKWELL = get_platform().is_sm100
            DEEPGEMM_PAGED_SPARSE_MQA_LOGITS = DEEPGEMM_BLACKWELL
        """,
        f"{V41}/__init__.py": """
            import functools
            import torch
            from sglang.srt.utils import is_cuda

            @functools.cache
            def is_sm100_or_newer():
                return is_cuda() and torch.cuda.get_device_capability()[0] >= 10

            class DenseBlocksBackend:
                pass

            def make_candidate_indexer(*, token_to_kv_pool, req_to_token, page_size, candidate_topk_blocks,
                                       candidate_block_size):
                dense = DenseBlocksBackend()
                if not is_sm100_or_newer() or candidate_topk_blocks <= 0:
                    return dense, dense
                from sglang.srt.layers.deep_gemm_wrapper.configurer import DEEPGEMM_PAGED_SPARSE_MQA_LOGITS
                if not DEEPGEMM_PAGED_SPARSE_MQA_LOGITS:
                    raise RuntimeError("the candidate indexer needs DeepGEMM's paged sparse MQA logits")
                from .sparse_table import SparseTableBackend
                return dense, SparseTableBackend(token_to_kv_pool=token_to_kv_pool, page_size=page_size,
                                                 candidate_topk_blocks=candidate_topk_blocks,
                                                 candidate_block_size=candidate_block_size)
        """,
        f"{V41}/types.py": """
            import msgspec

            class DecodeInputs(msgspec.Struct, frozen=True, kw_only=True):
                indexer: object
                layer_id: int
                compress_ratio: int
                freqs_cis: object
                x: object
                q_lora: object
                positions: object
                req_rows: object
                paged_metadata: object
                is_verify: bool
                out_page_indices: object
        """,
        f"{V41}/sparse_table.py": """
            import types
            import torch
            from sglang.kernels.ops.attention.dsv4.candidate_blocks import amax_topk_blocks, candidate_row_lens
            from sglang.kernels.ops.attention.dsv4.candidate_table import (build_sparse_indexer_schedule,
                                                                           sort_candidate_blocks)
            from sglang.kernels.ops.attention.dsv4.fp4_indexer_rope import index_q_rope_pack_weights
            from sglang.kernels.ops.attention.dsv4.index_logits import deep_gemm_fp4_paged_mqa_logits, sparse_logits
            from sglang.kernels.ops.attention.dsv4.topk import topk_transform_paged_v2, topk_transform_sparse
            from sglang.srt.layers.attention.dsv4.indexer import topk_transform_paged_from_metadata

            def _data(inputs, pool):
                ind, rows = inputs.indexer, inputs.x.shape[0]
                q, _ = ind.wq_b(inputs.q_lora)
                q_fp4, q_sf, w = index_q_rope_pack_weights(q.view(rows, ind.n_local_heads, ind.index_head_dim),
                                                           None, inputs.positions, ind.head_weights_raw(inputs.x),
                                                           ind.head_weight_scale)
                page = inputs.paged_metadata.compressed_page_size
                flat = pool.get_index_k_with_scale_buffer(inputs.layer_id)
                return (q_fp4.view(rows, 1, -1, 64), q_sf.view(rows, 1, -1), w,
                        flat.view(flat.shape[0], page, 1, 68))

            class SparseTableBackend:
                def __init__(self, *, token_to_kv_pool, page_size, candidate_topk_blocks, candidate_block_size):
                    self.token_to_kv_pool, self.topk_blocks = token_to_kv_pool, candidate_topk_blocks
                    self.alt_stream = torch.cuda.Stream()

                def publish_decode(self, inputs):
                    m = inputs.paged_metadata
                    q_fp4, q_sf, w, k = _data(inputs, self.token_to_kv_pool)
                    seq_lens = m.compressed_seq_lens.reshape(-1)
                    if isinstance(m.deep_gemm_metadata, list):
                        return self._publish_decode_chunked(inputs, (q_fp4, q_sf, w, k), seq_lens)
                    logits = deep_gemm_fp4_paged_mqa_logits((q_fp4, q_sf), k, w, seq_lens, m.page_table,
                                                            m.deep_gemm_metadata, m.max_compressed_seq_len)
                    topk_transform_paged_v2(logits, seq_lens, m.page_table, inputs.out_page_indices,
                                            m.compressed_page_size, m.topk_metadata)
                    nblocks, valid = candidate_row_lens(seq_lens, self.topk_blocks)
                    blocks = amax_topk_blocks(logits, seq_lens, nblocks, self.topk_blocks)
                    phys = sort_candidate_blocks(blocks, seq_lens, m.page_table, m.compressed_page_size)
                    schedule = build_sparse_indexer_schedule(blocks, seq_lens, m.page_table, m.compressed_page_size,
                                                             q_fp4.dtype, torch.arange(len(seq_lens)).int())
                    return types.SimpleNamespace(blocks=blocks, schedule=schedule, phys_blocks=phys,
                                                 valid_lens=valid, ready=None)

                def _publish_decode_chunked(self, inputs, data, seq_lens):
                    m = inputs.paged_metadata
                    q_fp4, q_sf, w, k = data
                    blocks, phys, valid = [], [], []
                    for rows, plan in m.row_chunks():
                        logits = deep_gemm_fp4_paged_mqa_logits((q_fp4[rows], q_sf[rows]), k, w[rows], seq_lens[rows],
                                                                m.page_table[rows], plan, m.max_compressed_seq_len)
                        topk_transform_paged_from_metadata(logits, m, inputs.out_page_indices, None, rows=rows)
                        nblocks, v = candidate_row_lens(seq_lens[rows], self.topk_blocks)
                        b = amax_topk_blocks(logits, seq_lens[rows], nblocks, self.topk_blocks)
                        phys.append(sort_candidate_blocks(b, seq_lens[rows], m.page_table[rows],
                                                          m.compressed_page_size))
                        blocks.append(b)
                        valid.append(v)
                    blocks = torch.cat(blocks)
                    schedule = build_sparse_indexer_schedule(blocks, seq_lens, m.page_table, m.compressed_page_size,
                                                             q_fp4.dtype, torch.arange(len(seq_lens)).int())
                    return types.SimpleNamespace(blocks=blocks, schedule=schedule, phys_blocks=torch.cat(phys),
                                                 valid_lens=torch.cat(valid), ready=None)

                def consume_decode(self, inputs, published):
                    q_fp4, q_sf, w, k = _data(inputs, self.token_to_kv_pool)
                    logits = sparse_logits(q_fp4, q_sf, k, w.to(torch.bfloat16), published.schedule,
                                           published.blocks.shape[1])
                    topk_transform_sparse(logits, published.valid_lens, published.phys_blocks,
                                          inputs.out_page_indices)
        """,
        f"{OPS}/candidate_blocks.py": f"""
            import torch
            from sglang.kernels.jit.utils import load_jit
            from .topk import plan_topk_v2, topk_transform_paged_v2

            def candidate_row_lens(seq_lens, topk_blocks, block_size=8):
                n = (seq_lens + block_size - 1) // block_size
                kept = torch.minimum(n, torch.full_like(n, topk_blocks))
                valid = torch.where(seq_lens > 0, block_size * (kept - 1) + (seq_lens - 1) % block_size + 1, 0)
                return n.int(), ({valid}).int()

            def amax_topk_blocks(logits, seq_lens, nblocks, topk_blocks, max_seq_len=None):
                rows, width = logits.shape
                plan = plan_topk_v2(nblocks)
                keys = logits.new_empty(rows, -(-width // 32) * 4, dtype=torch.float32)
                load_jit("block_amax", cuda_files=["deepseek_v4/block_amax.cuh"],
                         cuda_wrappers=[("amax8_varlen", "")]).amax8_varlen(logits, seq_lens, keys, 0)
                blocks = torch.empty(rows, topk_blocks, dtype=torch.int32, device=logits.device)
                topk_transform_paged_v2(keys, nblocks, None, blocks, 1, plan)
                return blocks
        """,
        f"{OPS}/candidate_table.py": """
            import torch
            from sglang.kernels.jit.utils import load_jit

            CANDIDATE_BLOCK_SIZE = 8

            def sort_candidate_blocks(blocks, seq_lens, page_table, page_size):
                out = torch.empty_like(blocks)
                load_jit("table", cuda_files=["deepseek_v4/candidate_block_table.cuh"],
                         cuda_wrappers=[("transform", "")]).transform(blocks, seq_lens, page_table, out, page_size)
                return out

            def build_sparse_indexer_schedule(blocks, seq_lens, page_table, page_size, q_dtype, request_ids):
                import deep_gemm
                return deep_gemm.get_paged_sparse_mqa_logits_metadata(seq_lens.contiguous(), page_table, request_ids,
                                                                       page_size, blocks, q_dtype, 8)
        """,
        f"{OPS}/index_logits.py": """
            import torch

            def deep_gemm_fp4_paged_mqa_logits(q_fp4, k_cache, weights, seq_lens, page_table, deep_gemm_metadata,
                                               max_seq_len):
                from deep_gemm import fp8_fp4_paged_mqa_logits
                sl = seq_lens.to(torch.int32)
                if sl.dim() == 1:
                    sl = sl.unsqueeze(-1)
                return fp8_fp4_paged_mqa_logits(q_fp4, k_cache, weights.float(), sl, page_table, deep_gemm_metadata,
                                                max_seq_len, False, logits_dtype=torch.float32)

            def sparse_logits(q_fp4, q_sf, k_cache, weights, schedule, topk_blocks):
                import deep_gemm
                return deep_gemm.fp8_fp4_paged_sparse_mqa_logits((q_fp4, q_sf), k_cache, weights, schedule,
                                                                 topk_blocks, 8)
        """,
        f"{OPS}/topk.py": """
            from sglang.kernels.jit.utils import load_jit

            def _v2():
                return load_jit("topk_v2", cuda_files=["deepseek_v4/topk_v2.cuh"],
                                cuda_wrappers=[("topk_plan", ""), ("topk_transform_paged", "")])

            def plan_topk_v2(seq_lens):
                metadata = seq_lens.new_empty(seq_lens.shape[0] + 1, 2)
                _v2().topk_plan(seq_lens, metadata, -1)
                return metadata

            def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                        out_raw_indices=None):
                _v2().topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                           out_raw_indices)

            def topk_transform_sparse(logits, valid_lens, blocks, out_indices):
                load_jit("bf16", cuda_files=["deepseek_v4/topk_bf16_small.cuh"],
                         cuda_wrappers=[("topk_transform", "")]).topk_transform(logits, valid_lens, blocks,
                                                                                out_indices, 8)
        """,
    }


def _wheels():
    given = os.environ.get("SM12X_FRAMEWORK_WHEELS")
    for folder in [given] if given else ["/tmp/moe-wheels", "/tmp/wheels"]:
        if os.path.isdir(folder) and any(n.startswith(RELEASE + "-") and n.endswith(".whl")
                                         for n in os.listdir(folder)):
            return folder
    return None


def _sources(tmp_path, bug=False):
    """(folder, "real" or "stand-in"): SGLang's modules from its wheel when it is here."""
    wheels = _wheels()
    if wheels and not bug:
        src = tmp_path / "real"
        subprocess.run(["bash", os.path.join(REPO, "scripts", "extract_indexer_sources.sh"), wheels, str(src)],
                       capture_output=True, text=True, check=False)
        if (src / RELEASE / V41 / "sparse_table.py").is_file():
            return src, "real"
    return write_tree(tmp_path / "stand-in" / RELEASE, _tree(bug)).parent, "stand-in"


def _prove(src, kind, tmp_path):
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    proc = subprocess.run([sys.executable, SCRIPT, "--src", str(src), "--json", str(out), *TINY,
                           "--passes", PASSES[kind]],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    return proc, (json.loads(out.read_text()) if out.exists() else [])


def test_sglang_v41_init_and_decode_through_sm12x(tmp_path):
    pytest.importorskip("triton")
    src, kind = _sources(tmp_path)
    proc, rows = _prove(src, kind, tmp_path)
    assert proc.returncode == 0, f"{kind} sources:\n{proc.stdout}\n{proc.stderr}"
    by = {(r["mode"], r["pass"]): r for r in rows}
    assert "RuntimeError: the candidate indexer needs DeepGEMM's paged sparse MQA logits" in \
        by["unpatched", "init-v41"]["outcome"], by
    assert by["patched", "init-v41"]["outcome"].startswith("SparseTableBackend"), by
    # unpatched: the source's own top-k and its block top-k (per row chunk) and the consumer's; patched:
    # the consumer's
    for (mode, kind), topk_on_logits in {("unpatched", "decode-v41"): 3, ("patched", "decode-v41"): 1,
                                         ("unpatched", "decode-v41-chunked"): 5,
                                         ("patched", "decode-v41-chunked"): 1}.items():
        r = by[mode, kind]
        assert r["ok"] and r["logits_topk_calls"] == topk_on_logits, r
        assert (r["same"] + r["ties"], r["wrong"]) == (2, 0), r
    if kind == "real":  # SGLang's prefill publish and consume on sm12x's DeepGEMM calls, the same in both modes
        for mode in ("unpatched", "patched"):
            r = by[mode, "prefill-v41"]
            assert r["ok"] and (r["same"] + r["ties"], r["wrong"]) == (8, 0), r
    assert "FAIL" not in proc.stderr


def test_sglang_v41_wrong_rows_fail_the_proof(tmp_path):
    """SGLang's sparse rows cut to half their keys: the consumers miss keys the reference keeps, exit 1."""
    pytest.importorskip("triton")
    src, kind = _sources(tmp_path, bug=True)
    proc, rows = _prove(src, kind, tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "decode-v41 at 256 keys" in proc.stderr and "decode-v41 (unpatched) at 256 keys" in proc.stderr, proc.stderr
    assert "rows differ beyond ties" in proc.stderr


def test_verdict_allows_ties_at_the_kth_score_only():
    """The reference check (``sglang_v41._verdict``): the k best columns of a row are 'same', a swap
    with a key tied at the k-th score (within the tolerance) 'tied', anything else 'wrong'."""
    import torch

    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        from prove_1m.sglang_v41 import _verdict
    finally:
        sys.path.remove(os.path.join(REPO, "scripts"))
    inf = float("inf")
    s = torch.tensor([5.0, 4.0, 3.0, 3.0 + 1e-7, 1.0, -inf])
    assert _verdict(s, {0, 1, 3}, 3, 1e-5) == "same"
    assert _verdict(s, {0, 1, 2}, 3, 1e-5) == "tied"
    assert _verdict(s, {0, 1, 4}, 3, 1e-5) == "wrong"
    assert _verdict(s, {0, 1}, 3, 1e-5) == "wrong"  # too few
    assert _verdict(s, {0, 1, 2, 3, 4}, 9, 1e-5) == "same"  # a row of fewer keys than k: all of them
    assert _verdict(s, {0, 1, 2, 3, 5}, 9, 1e-5) == "wrong"  # an invisible key

"""scripts/prove_1m_indexer.py ``--glm5next`` at a tiny scale on the CPU (Triton interpreter):
vLLM 0.34.0's GLM-5-next pool indexer (``SparseAttnIndexerKpool``), prefill chunk and decode
rows, unpatched and patched: the patched run ranks no materialised logits, gives the same pools
and tail tokens, and the script exits 0; a framework top-k or a pool expansion that disagrees
makes it exit 1.

The sources are vLLM 0.34.0's real modules extracted from the wheel when it is on this machine
(``SM12X_FRAMEWORK_WHEELS``, default /tmp/moe-wheels), else the stand-in tree below (with
test_prove_1m_indexer's vLLM 0.34.0 tree for the modules the V3.2 passes run): written from
``models/glm5next/nvidia/sparse_indexer.py``, it keeps the names, signatures and call sequence
the records and the driver meet (the fused prefill seam, the dense prefill's
``torch.ops._C.top_k_per_row_prefill``, the decode's own ``fp8_fp4_paged_mqa_logits`` and
``get_indexer_topk``, the pool expansion), with the rest of the function left out."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from tests_support import REPO, write_tree

pytestmark = pytest.mark.cpu_only

SCRIPT = os.path.join(REPO, "scripts", "prove_1m_indexer.py")
WHEELS = os.environ.get("SM12X_FRAMEWORK_WHEELS", "/tmp/moe-wheels")
TINY = ["--device", "cpu", "--releases", "vllm-0.34.0", "--glm5next", "--index-kpool", "4", "--keys", "256",
        "--queries", "16", "--decode-rows", "2", "--topk", "16", "--heads", "8", "--dim", "128", "--reps", "0",
        "--contexts", "256"]


def _sibling_tree():
    """test_prove_1m_indexer's stand-in vLLM 0.34.0 tree (the V3.2 passes' modules)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_prove_1m_indexer.py")
    spec = importlib.util.spec_from_file_location("_prove_1m_indexer_trees", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VLLM_034


def _glm5next(prefill_ends="row_ends", decode_seq="dec_seq"):
    """GLM-5-next's modules; ``prefill_ends`` is what the dense prefill hands its top-k as the
    rows' ends and ``decode_seq`` the decode rows' token lengths the pool expansion appends the
    tail by (a wrong one plants a bug)."""
    return {
        "vllm/models/glm5next/sparse_indexer.py": """
            from vllm.platforms import current_platform

            if current_platform.is_rocm():
                raise ImportError("the stand-in has no AMD module")
            from .nvidia.sparse_indexer import SparseAttnIndexerKpool
        """,
        "vllm/models/glm5next/nvidia/ops/kpool_compress.py": """
            import torch

            def expand_pools_and_append_tail(pool_ids, seq_lens, pool_size):
                rows, groups = pool_ids.shape
                topk = groups * pool_size
                offs = torch.arange(pool_size, device=pool_ids.device)
                hist = torch.where(pool_ids[:, :, None] >= 0, pool_ids[:, :, None] * pool_size + offs, -1)
                tail_start = seq_lens.long() // pool_size * pool_size
                cols = torch.arange(pool_size - 1, device=pool_ids.device)
                tail = tail_start[:, None] + cols
                tail = torch.where(tail < seq_lens.long()[:, None], tail, -1)
                return torch.cat([hist.reshape(rows, topk), tail], dim=1).to(torch.int32)
        """,
        "vllm/models/glm5next/nvidia/sparse_indexer.py": """
            import torch
            from vllm.compilation.breakable_cudagraph import eager_break_during_capture
            from vllm.config import get_current_vllm_config_or_none
            from vllm.forward_context import get_forward_context
            from vllm.model_executor.custom_op import CustomOp
            from vllm.model_executor.kernels.attention.dsa.fused_mqa_topk import (
                fused_mqa_topk_chunk, fused_mqa_topk_key_scales, fused_mqa_topk_prefill, use_fused_mqa_topk)
            from vllm.model_executor.layers.indexer_topk import get_indexer_topk
            from vllm.models.glm5next.nvidia.ops import kpool_compress as kpool_ops
            from vllm.platforms import current_platform
            from vllm.utils.deep_gemm import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits, mqa_logits_mx_inputs
            from vllm.utils.torch_utils import _resolve_layer_name
            from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata, dense_logits_rows
            from vllm.v1.worker.workspace import current_workspace_manager

            if current_platform.is_cuda_alike():
                from vllm import _custom_ops as ops

            @eager_break_during_capture
            def sparse_attn_indexer_kpool(hidden_states, k_cache_prefix, kv_cache, q_quant, q_scale, k, weights,
                                          quant_block_size, scale_fmt, topk_tokens, head_dim, max_pool_len,
                                          total_seq_lens, topk_indices_buffer, skip_k_cache_insert,
                                          use_fp4_cache=False, gate_score=None, compress_ape=None, index_kpool=1,
                                          positions=None, tail_kv_cache=None, tail_prefix=None, topk_backend="auto",
                                          dcp_rank=0, dcp_world_size=1, cp_kv_cache_interleave_size=1,
                                          logits_dtype=torch.float32):
                meta = get_forward_context().attn_metadata[_resolve_layer_name(k_cache_prefix)]
                assert isinstance(meta, DeepseekV32IndexerMetadata)
                fused = use_fused_mqa_topk(query_shape=q_quant.shape[1:], topk=topk_tokens // max(index_kpool, 1),
                                           fp4_cache=use_fp4_cache, full_context=dcp_world_size == 1)
                select_k = topk_tokens // index_kpool
                topk_indices_buffer[: hidden_states.shape[0]] = -1
                if meta.num_prefills > 0:
                    k_full, s_full = current_workspace_manager().get_simultaneous(
                        ((total_seq_lens, head_dim), torch.float8_e4m3fn), ((total_seq_lens, 4), torch.uint8))
                    for chunk in meta.prefill.chunks:
                        k_quant = k_full[: chunk.max_local_total_seq_lens]
                        k_scale = s_full[: chunk.max_local_total_seq_lens]
                        ops.cp_gather_indexer_k_quant_cache(kv_cache, k_quant, k_scale, chunk.block_table,
                                                            chunk.local_cu_seq_lens)
                        rows_all = slice(chunk.token_start, chunk.token_end)
                        q_slice = q_quant[rows_all]
                        num_rows = q_slice.shape[0]
                        pool_topk = torch.empty((num_rows, select_k), dtype=torch.int32, device=q_slice.device)
                        dense_rows = dense_logits_rows(chunk.max_seqlen_k)
                        if fused and fused_mqa_topk_chunk(chunk.max_seqlen_k, k_quant.shape[0], select_k, num_rows,
                                                          dense_rows):
                            fused_mqa_topk_prefill(q_slice, k_quant, fused_mqa_topk_key_scales(k_scale),
                                                   weights[rows_all], chunk.cu_seqlen_ks, chunk.cu_seqlen_ke,
                                                   pool_topk)
                        else:
                            for sub in range(0, num_rows, dense_rows):
                                rows = slice(sub, min(sub + dense_rows, num_rows))
                                q_scale_rows, w = mqa_logits_mx_inputs(q_slice[rows], None,
                                                                       weights[rows_all][rows], logits_dtype)
                                row_ends = chunk.cu_seqlen_ke[rows] - chunk.cu_seqlen_ks[rows]
                                logits = fp8_fp4_mqa_logits((q_slice[rows], q_scale_rows),
                                                            (k_quant, k_scale.view(torch.float32).squeeze(-1)), w,
                                                            chunk.cu_seqlen_ks[rows], chunk.cu_seqlen_ke[rows],
                                                            chunk.max_seqlen_k, logits_dtype=logits_dtype)
                                torch.ops._C.top_k_per_row_prefill(logits, torch.zeros_like(row_ends), PREFILL_ENDS,
                                                                   pool_topk[rows], logits.shape[0],
                                                                   logits.stride(0), logits.stride(1), select_k)
                        q_seq = positions[rows_all].to(torch.int32) + 1
                        expanded = kpool_ops.expand_pools_and_append_tail(pool_topk.long(), q_seq, index_kpool)
                        topk_indices_buffer[rows_all, : expanded.shape[-1]] = expanded
                if meta.num_decodes > 0:
                    decode = meta.decode
                    batch = decode.decode_lens.shape[0]
                    q = q_quant[: meta.num_decode_tokens].reshape(batch, -1, *q_quant.shape[1:])
                    q_scale, w = mqa_logits_mx_inputs(q, None, weights[: meta.num_decode_tokens], logits_dtype)
                    logits = fp8_fp4_paged_mqa_logits((q, q_scale), kv_cache.unsqueeze(-2), w, decode.seq_lens,
                                                      decode.block_table, decode.schedule_metadata,
                                                      max_model_len=max_pool_len, logits_dtype=logits_dtype,
                                                      indices=decode.indices)
                    pool_topk = torch.empty((logits.shape[0], select_k), dtype=torch.int32, device=logits.device)
                    get_indexer_topk(topk_backend)(logits, decode.seq_lens, q.shape[1], pool_topk, select_k,
                                                   meta.max_seq_len)
                    dec_seq = positions[: meta.num_decode_tokens].to(torch.int32) + 1
                    out = kpool_ops.expand_pools_and_append_tail(pool_topk.long(), DECODE_SEQ, index_kpool)
                    topk_indices_buffer[: out.shape[0], : out.shape[-1]] = out
                return topk_indices_buffer

            @CustomOp.register("sparse_attn_indexer_kpool")
            class SparseAttnIndexerKpool(CustomOp):
                def __init__(self, k_cache, quant_block_size, scale_fmt, topk_tokens, head_dim, max_pool_len,
                             max_total_seq_len, topk_indices_buffer, skip_k_cache_insert=False,
                             use_fp4_cache=False, tail_cache=None):
                    super().__init__()
                    assert get_current_vllm_config_or_none() is None
                    self.k_cache, self.quant_block_size, self.scale_fmt = k_cache, quant_block_size, scale_fmt
                    self.topk_tokens, self.head_dim, self.max_pool_len = topk_tokens, head_dim, max_pool_len
                    self.max_total_seq_len, self.topk_indices_buffer = max_total_seq_len, topk_indices_buffer
                    self.skip_k_cache_insert, self.use_fp4_cache = skip_k_cache_insert, use_fp4_cache

                def forward_cuda(self, hidden_states, q_quant, k, weights, *, gate_score=None, compress_ape=None,
                                 index_kpool=1, positions=None):
                    return sparse_attn_indexer_kpool(
                        hidden_states, self.k_cache.prefix, self.k_cache.kv_cache, q_quant, None, k, weights,
                        self.quant_block_size, self.scale_fmt, self.topk_tokens, self.head_dim, self.max_pool_len,
                        self.max_total_seq_len, self.topk_indices_buffer, self.skip_k_cache_insert,
                        self.use_fp4_cache, gate_score, compress_ape, index_kpool, positions)
        """.replace("PREFILL_ENDS", prefill_ends).replace("DECODE_SEQ", decode_seq),
    }


def _sources(tmp_path):
    """(folder, "real" or "stand-in"): vLLM 0.34.0's modules from its wheel when it is here."""
    wheels = os.listdir(WHEELS) if os.path.isdir(WHEELS) else []
    if any(n.startswith("vllm-0.34.0-") and n.endswith(".whl") for n in wheels):
        src = tmp_path / "real"
        subprocess.run(["bash", os.path.join(REPO, "scripts", "extract_indexer_sources.sh"), WHEELS, str(src)],
                       capture_output=True, text=True, check=False)
        if (src / "vllm-0.34.0" / "vllm" / "models" / "glm5next" / "nvidia" / "sparse_indexer.py").is_file():
            return src, "real"
    return _stand_in(tmp_path / "stand-in", _glm5next()), "stand-in"


def _stand_in(folder, glm):
    return write_tree(folder / "vllm-0.34.0", {**_sibling_tree(), **glm}).parent


def _prove(src, tmp_path):
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    proc = subprocess.run([sys.executable, SCRIPT, "--src", str(src), "--json", str(out), *TINY],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    rows = json.loads(out.read_text()) if out.exists() else []
    return proc, {(r["mode"], r["pass"]): r for r in rows}


def test_glm5next_pool_indexer_patched_and_not(tmp_path):
    pytest.importorskip("triton")
    src, kind = _sources(tmp_path)
    proc, rows = _prove(src, tmp_path)
    assert proc.returncode == 0, f"{kind} sources:\n{proc.stdout}\n{proc.stderr}"
    for pass_, n, patched_calls in (("prefill-glm5next", 16, 0), ("prefill-dense-glm5next", 16, 1),
                                     ("decode-glm5next", 2, 0)):
        un, mine = rows["unpatched", pass_], rows["patched", pass_]
        # vLLM's top-k over materialised pool logits runs unpatched, never patched (the prefill
        # through the fused_mqa_topk seam, the decode through the module's own logits / top-k
        # copies) but in the dense prefill the seam leaves to other layers (real logits)
        assert un["ok"] and un["logits_topk_calls"] >= 1, un
        assert mine["ok"] and mine["logits_topk_calls"] == patched_calls, mine
        assert (mine["same"], mine["ties"], mine["wrong"]) == (n, 0, 0), mine
    assert "glm5next SparseAttnIndexerKpool | GLM-5-next decode" in proc.stdout and "FAIL" not in proc.stderr


def test_a_disagreeing_top_k_or_expansion_fails_the_proof(tmp_path):
    """vLLM's dense prefill top-k handed half the rows' ends (the fused prefill's unpatched
    indices move; in the dense prefill both runs share the fault, which the reference check
    finds), and the decode's pool expansion given each row's length one token long (both runs
    agree; the tails hold a token the row does not see yet): every pass fails, exit 1."""
    pytest.importorskip("triton")
    bugs = _glm5next(prefill_ends="row_ends // 2", decode_seq="(dec_seq + 1)")
    proc, rows = _prove(_stand_in(tmp_path / "bad", bugs), tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for pass_ in ("prefill-glm5next", "prefill-dense-glm5next", "decode-glm5next"):
        assert f"FAIL: vllm-0.34.0 {pass_} at 256 keys" in proc.stderr
        assert rows["patched", pass_]["wrong"] > 0, rows


@pytest.fixture
def glm(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "scripts"))
    from prove_1m import glm5next, run

    return glm5next, run


def _rows_for(pools, positions, kpool):
    """Index rows as the op writes them: each pool's tokens, then the row's tail tokens."""
    import torch

    rows = [[t for p in row for t in (range(p * kpool, p * kpool + kpool) if p >= 0 else [-1] * kpool)]
            + [t if t <= pos else -1 for t in range((pos + 1) // kpool * kpool, (pos + 1) // kpool * kpool + kpool - 1)]
            for row, pos in zip(pools, positions)]
    return torch.tensor(rows, dtype=torch.int32)


def _decode_case(glm, same_keys):
    """Three decode rows over 64 pools (kpool 4, top-8 tokens = 2 pools): the inputs, the rows'
    positions and their reference pool scores; ``same_keys``: every pool has the same key (every
    pool ties)."""
    import torch

    from sm12x.kernels.indexer.cache import dequant_paged_cache, quant_fp8_paged_cache
    from sm12x.kernels.indexer.reference import ref_mqa_logits

    glm5next, run = glm
    g = torch.Generator().manual_seed(0)
    values = torch.randn(1, 64, 32, generator=g)
    if same_keys:
        values[:] = values[0, 0]
    cache = quant_fp8_paged_cache(values)
    q = torch.randn(3, 4, 32, generator=g).to(torch.float8_e4m3fn)
    w = torch.rand(3, 4, generator=g)
    positions, ends = glm5next._geometry("decode-glm5next", 64, 4, 3, torch.device("cpu"))
    k = dequant_paged_cache(cache, 32, fp4=False).reshape(-1, 32)
    scores = ref_mqa_logits(q.float(), k, torch.ones(64), w, torch.zeros(3, dtype=torch.int32), ends)
    return run.Inputs(cache, q, w, q, w), positions.tolist(), scores


def test_compare_takes_whole_pools_tails_and_ties(glm):
    """compare_glm5next with the reference's own top pools as the unpatched run: the same rows
    (pool order free), rows whose pools differ only by ties, and wrong rows (a lower pool, a
    pool's tokens out of order, a tail token the row's last pool does not hold)."""
    import torch

    glm5next, _ = glm
    compare = glm5next.compare_glm5next
    inputs, positions, scores = _decode_case(glm, same_keys=False)
    best = torch.topk(scores, 2).indices.tolist()
    want = _rows_for(best, positions, 4)
    swapped = torch.cat([want[:, 4:8], want[:, :4], want[:, 8:]], dim=1)
    assert compare("decode-glm5next", inputs, 64, swapped, want, 8, 4) == (3, 0, 0)
    lowest = torch.topk(scores[0], int(torch.isfinite(scores[0]).sum())).indices[-1].item()
    wrong = want.clone()
    wrong[0, :4] = torch.arange(lowest * 4, lowest * 4 + 4)
    wrong[1, 4:8] = wrong[1, 4:8].flip(0)
    wrong[2, 8] = 0
    assert compare("decode-glm5next", inputs, 64, wrong, want, 8, 4) == (0, 0, 3)

    inputs, positions, _ = _decode_case(glm, same_keys=True)  # every pool ties: any two are a top 2
    want = _rows_for([[0, 1]] * 3, positions, 4)
    tied = _rows_for([[7, 1], [0, 1], [30, 2]], positions, 4)
    assert compare("decode-glm5next", inputs, 64, tied, want, 8, 4) == (1, 2, 0)

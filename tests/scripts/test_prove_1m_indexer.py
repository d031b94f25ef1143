"""scripts/prove_1m_indexer.py end to end at a tiny scale on the CPU (Triton interpreter): per
release, the unpatched and the patched worker run the framework's indexer function, the patched
one takes the fused route (no top-k over materialised logits) and gives the same index sets, and
the script exits 0; a framework whose own top-k disagrees makes it exit 1.

The framework sources are the real modules extracted from the wheels when they are on this
machine (``SM12X_FRAMEWORK_WHEELS``, default /tmp/moe-wheels), else the stand-in trees below:
written from those modules' sources, they keep the names, signatures and call sequence the
records and the script's drivers meet (the seams), with the rest of each function left out."""
import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest
import torch
from tests_support import REPO, dist_infos, write_tree

pytestmark = pytest.mark.cpu_only

SCRIPT = os.path.join(REPO, "scripts", "prove_1m_indexer.py")
WHEELS = os.environ.get("SM12X_FRAMEWORK_WHEELS", "/tmp/moe-wheels")
TINY = ["--device", "cpu", "--keys", "256", "--queries", "16", "--decode-rows", "2", "--topk", "16",
        "--heads", "8", "--dim", "128", "--reps", "0", "--contexts", "128,256"]


VLLM_034 = {
    **dist_infos({"vllm": "0.34.0"}),
    "vllm/model_executor/kernels/attention/dsa/fused_mqa_topk.py": """
        import torch
        import vllm.envs as envs
        from vllm.platforms import current_platform

        def use_fused_mqa_topk(*, query_shape, topk, fp4_cache, full_context, candidate_selection=False):
            return envs.VLLM_USE_FUSED_MQA_TOPK and current_platform.is_device_capability_family(100)

        def fused_mqa_topk_chunk(max_seqlen_k, keys, topk, rows, dense_rows):
            return True

        def fused_mqa_topk_key_scales(scales):
            raise RuntimeError("SM100 UE8M0 key scales")

        def fused_mqa_topk_prefill(q, k, scales, weights, starts, ends, output):
            raise RuntimeError("torch.ops._C.fused_mqa_topk_prefill: SM100 family only")

        def get_fused_mqa_topk_workspaces(device, rows):
            return []
    """,
    "vllm/model_executor/layers/indexer_topk.py": """
        import torch
        from vllm import _custom_ops as ops
        from vllm.platforms import current_platform
        from vllm.v1.worker.workspace import current_workspace_manager

        RADIX_TOPK_WORKSPACE_SIZE = 1024 * 1024

        def is_deep_select_supported(logits, topk):
            return False

        def deep_select_topk(*args, **kwargs):
            raise RuntimeError("DeepSelect: SM100 only")

        def get_indexer_topk(backend):
            return SparseIndexerTopk(backend)

        class SparseIndexerTopk(torch.nn.Module):
            def __init__(self, backend=None):
                super().__init__()
                self._backend = backend

            def takes_bf16_logits(self, logits, topk_tokens, num_rows):
                return False

            def forward(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len):
                if current_platform.is_cuda() and topk_tokens in (512, 1024, 2048):
                    (workspace,) = current_workspace_manager().get_simultaneous(
                        ((RADIX_TOPK_WORKSPACE_SIZE,), torch.uint8))
                    torch.ops._C.persistent_topk(logits, seq_lens, topk_indices, workspace, topk_tokens, max_seq_len)
                else:
                    ops.top_k_per_row_decode(logits, next_n, seq_lens, topk_indices, logits.shape[0],
                                             logits.stride(0), logits.stride(1), topk_tokens)
    """,
    "vllm/model_executor/layers/sparse_attn_indexer.py": """
        import torch
        import vllm.envs as envs
        from vllm import _custom_ops as ops
        from vllm.compilation.breakable_cudagraph import eager_break_during_capture
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context
        from vllm.model_executor.kernels.attention.dsa.fused_mqa_topk import (
            fused_mqa_topk_chunk, fused_mqa_topk_key_scales, fused_mqa_topk_prefill, use_fused_mqa_topk)
        from vllm.model_executor.layers.indexer_topk import get_indexer_topk
        from vllm.platforms import current_platform
        from vllm.utils.deep_gemm import (
            fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits, mqa_logits_mx_inputs)
        from vllm.utils.torch_utils import _resolve_layer_name
        from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata, dense_logits_rows
        from vllm.v1.worker.workspace import current_workspace_manager

        @eager_break_during_capture
        def sparse_attn_indexer(hidden_states, k_cache_prefix, kv_cache, q_quant, q_scale, k, weights,
                                quant_block_size, scale_fmt, topk_tokens, head_dim, max_model_len, total_seq_lens,
                                topk_indices_buffer, skip_k_cache_insert, use_pcp, pcp_shard_decode_requests,
                                dense_mha_metadata_layer_name, use_fp4_cache=False, dcp_rank=0, dcp_world_size=1,
                                cp_kv_cache_interleave_size=1, skip_topk_buffer_clear=False, candidate_blocks=None,
                                candidate_block_size=0, candidate_write=False, topk_backend="auto",
                                logits_dtype=torch.float32, dcp_direct_topk_max_rows=0):
            forward_context = get_forward_context()
            meta = forward_context.attn_metadata[_resolve_layer_name(k_cache_prefix)]
            assert isinstance(meta, DeepseekV32IndexerMetadata)
            assert forward_context.cudagraph_runtime_mode != CUDAGraphMode.FULL
            fused = use_fused_mqa_topk(query_shape=q_quant.shape[1:], topk=topk_tokens, fp4_cache=use_fp4_cache,
                                       full_context=use_pcp or dcp_world_size == 1,
                                       candidate_selection=candidate_blocks is not None)
            topk_indices_buffer[: hidden_states.shape[0]] = -1
            if meta.prefill is not None:
                k_full, s_full = current_workspace_manager().get_simultaneous(
                    ((total_seq_lens, head_dim), torch.float8_e4m3fn), ((total_seq_lens, 4), torch.uint8))
                for chunk in meta.prefill.chunks:
                    k_quant = k_full[: chunk.max_local_total_seq_lens]
                    k_scale = s_full[: chunk.max_local_total_seq_lens]
                    if not chunk.skip_kv_gather:
                        ops.cp_gather_indexer_k_quant_cache(kv_cache, k_quant, k_scale, chunk.block_table,
                                                            chunk.local_cu_seq_lens)
                    q_slice = q_quant[chunk.token_start:chunk.token_end]
                    topk_indices = topk_indices_buffer[chunk.token_start:chunk.token_end, :topk_tokens]
                    dense_rows = dense_logits_rows(chunk.max_seqlen_k)
                    if fused and fused_mqa_topk_chunk(chunk.max_seqlen_k, k_quant.shape[0], topk_tokens,
                                                      q_slice.shape[0], dense_rows):
                        fused_mqa_topk_prefill(q_slice, k_quant, fused_mqa_topk_key_scales(k_scale),
                                               weights[chunk.token_start:chunk.token_end], chunk.cu_seqlen_ks,
                                               chunk.cu_seqlen_ke, topk_indices)
                        continue
                    for sub in range(0, q_slice.shape[0], dense_rows):
                        rows = slice(sub, min(sub + dense_rows, q_slice.shape[0]))
                        tokens = slice(chunk.token_start + rows.start, chunk.token_start + rows.stop)
                        q_scale_rows, chunk_weights = mqa_logits_mx_inputs(q_slice[rows], None, weights[tokens],
                                                                           logits_dtype)
                        row_ends = chunk.cu_seqlen_ke[rows] - chunk.cu_seqlen_ks[rows]
                        logits = fp8_fp4_mqa_logits((q_slice[rows], q_scale_rows),
                                                    (k_quant, k_scale.view(torch.float32).squeeze(-1)),
                                                    chunk_weights, chunk.cu_seqlen_ks[rows], chunk.cu_seqlen_ke[rows],
                                                    chunk.max_seqlen_k, logits_dtype=logits_dtype)
                        ops.top_k_per_row_prefill(logits, torch.zeros_like(row_ends), row_ends, topk_indices[rows],
                                                  logits.shape[0], logits.stride(0), logits.stride(1), topk_tokens)
            if meta.decode is not None:
                decode = meta.decode
                batch = decode.decode_lens.shape[0]
                q = q_quant[: meta.num_decode_tokens].reshape(batch, -1, *q_quant.shape[1:])
                q_scale, decode_weights = mqa_logits_mx_inputs(q, None, weights[: meta.num_decode_tokens],
                                                               logits_dtype)
                logits = fp8_fp4_paged_mqa_logits((q, q_scale), kv_cache.unsqueeze(-2), decode_weights,
                                                  decode.seq_lens, decode.block_table, decode.schedule_metadata,
                                                  max_model_len=max_model_len, logits_dtype=logits_dtype,
                                                  indices=decode.indices)
                get_indexer_topk(topk_backend)(logits, decode.seq_lens, q.shape[1],
                                               topk_indices_buffer[: meta.num_decode_tokens, :topk_tokens],
                                               topk_tokens, meta.max_seq_len)
            return topk_indices_buffer
    """,
}


def _vllm_025(topk_lens="decode.seq_lens"):
    """vLLM 0.25.1's sparse_attn_indexer; ``topk_lens`` is what its decode passes to the top-k
    as the rows' lengths (sm12x's fused top-k takes them from the logits call, so a wrong one
    changes only vLLM's own top-k)."""
    return {
        **dist_infos({"vllm": "0.25.1"}),
        "vllm/model_executor/layers/sparse_attn_indexer.py": """
            import torch
            from vllm import _custom_ops as ops
            from vllm.compilation.breakable_cudagraph import eager_break_during_capture
            from vllm.forward_context import get_forward_context
            from vllm.platforms import current_platform
            from vllm.utils.deep_gemm import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits
            from vllm.utils.torch_utils import _resolve_layer_name
            from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadata
            from vllm.v1.worker.workspace import current_workspace_manager

            RADIX_TOPK_WORKSPACE_SIZE = 1024 * 1024

            @eager_break_during_capture
            def sparse_attn_indexer(hidden_states, k_cache_prefix, kv_cache, q_quant, q_scale, k, weights,
                                    quant_block_size, scale_fmt, topk_tokens, head_dim, max_model_len, total_seq_lens,
                                    topk_indices_buffer, skip_k_cache_insert, use_fp4_cache=False, dcp_rank=0,
                                    dcp_world_size=1, cp_kv_cache_interleave_size=1, skip_topk_buffer_clear=False):
                meta = get_forward_context().attn_metadata[_resolve_layer_name(k_cache_prefix)]
                assert isinstance(meta, DeepseekV32IndexerMetadata)
                topk_indices_buffer[: hidden_states.shape[0]] = -1
                if meta.num_prefills > 0:
                    k_full, s_full = current_workspace_manager().get_simultaneous(
                        ((total_seq_lens, head_dim), torch.float8_e4m3fn), ((total_seq_lens, 4), torch.uint8))
                    for chunk in meta.prefill.chunks:
                        k_quant = k_full[: chunk.max_local_total_seq_lens]
                        k_scale = s_full[: chunk.max_local_total_seq_lens]
                        if not chunk.skip_kv_gather:
                            ops.cp_gather_indexer_k_quant_cache(kv_cache, k_quant, k_scale, chunk.block_table,
                                                                chunk.local_cu_seq_lens)
                        topk_indices = topk_indices_buffer[chunk.token_start:chunk.token_end, :topk_tokens]
                        logits = fp8_fp4_mqa_logits((q_quant[chunk.token_start:chunk.token_end], None),
                                                    (k_quant, k_scale.view(torch.float32).squeeze(-1)),
                                                    weights[chunk.token_start:chunk.token_end], chunk.cu_seqlen_ks,
                                                    chunk.cu_seqlen_ke, clean_logits=False)
                        ops.top_k_per_row_prefill(logits, chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, topk_indices,
                                                  logits.shape[0], logits.stride(0), logits.stride(1), topk_tokens)
                if meta.num_decodes > 0:
                    decode = meta.decode
                    batch = decode.decode_lens.shape[0]
                    q = q_quant[: meta.num_decode_tokens].reshape(batch, -1, *q_quant.shape[1:])
                    logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache.unsqueeze(-2),
                                                      weights[: meta.num_decode_tokens], decode.seq_lens,
                                                      decode.block_table, decode.schedule_metadata,
                                                      max_model_len=max_model_len, clean_logits=False)
                    topk_indices = topk_indices_buffer[: meta.num_decode_tokens, :topk_tokens]
                    cooperative = (current_platform.is_cuda() and topk_tokens in (512, 1024, 2048)
                                   and not current_platform.is_device_capability_family(120))
                    persistent = current_platform.is_cuda() and topk_tokens in (512, 1024, 2048)
                    if cooperative or persistent:
                        (workspace,) = current_workspace_manager().get_simultaneous(
                            ((RADIX_TOPK_WORKSPACE_SIZE,), torch.uint8))
                        op = torch.ops._C.cooperative_topk if cooperative else torch.ops._C.persistent_topk
                        op(logits, TOPK_LENS, topk_indices, workspace, topk_tokens, logits.shape[1])
                    else:
                        ops.top_k_per_row_decode(logits, q.shape[1], TOPK_LENS, topk_indices, logits.shape[0],
                                                 logits.stride(0), logits.stride(1), topk_tokens)
                return topk_indices_buffer
        """.replace("TOPK_LENS", topk_lens),
    }


SGLANG_0523 = {
    **dist_infos({"sglang": "0.5.23"}),
    "sglang/srt/layers/attention/dsv4/indexer.py": """
        from __future__ import annotations
        import torch
        from sglang.kernels.ops.attention.dsv4 import topk_transform_paged, topk_transform_paged_v2
        from sglang.srt.environ import envs
        from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend
        from sglang.srt.layers.attention.dsv4.metadata import NonPagedIndexerPlan, PagedIndexerMetadata, iter_row_chunks
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        def fp8_paged_mqa_logits_torch(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                       max_seq_len, clean_logits=True):
            raise RuntimeError("torch paged logits: not on the TileLang route")

        def fp8_paged_mqa_logits_torch_sm120(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                             max_seq_len, clean_logits=True):
            raise RuntimeError("torch SM120 paged logits: not on the TileLang route")

        def topk_transform_pytorch_vectorized(scores, seq_lens, page_tables, out_page_indices, page_size,
                                              out_raw_indices=None):
            raise RuntimeError("torch transform: dsa_topk_backend torch only")

        def topk_transform_flashinfer_unfused(scores, seq_lens, page_tables, out_page_indices, page_size,
                                              out_raw_indices=None):
            raise RuntimeError("flashinfer transform")

        def topk_transform_flashinfer_fused(scores, seq_lens, page_tables, out_page_indices, page_size,
                                            out_raw_indices=None):
            raise RuntimeError("flashinfer transform")

        class C4IndexerBackendMixin:
            def __init__(self):
                self.dsa_topk_backend = DSATopKBackend.SGL_KERNEL

            @staticmethod
            def _nonpaged_mqa_logits(*, q_indexer, weights, kv, plan, rows):
                import deep_gemm

                return deep_gemm.fp8_mqa_logits(q_indexer[rows], kv, weights[rows], plan.ks[rows], plan.ke[rows],
                                                clean_logits=False, max_seqlen_k=plan.max_seqlen_k)

            def _nonpaged_plan(self, c4_indexer, forward_batch, indexer_metadata, c4_seq_lens, query_rows):
                # one request's extend with the TileLang and torch paged logits off
                if (envs.SGLANG_OPT_USE_TILELANG_INDEXER.get() or envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get()
                        or forward_batch.forward_mode != ForwardMode.EXTEND or forward_batch.batch_size != 1):
                    return None
                ke = c4_seq_lens[:query_rows].to(torch.int32)
                ks = torch.zeros_like(ke)
                ke = torch.where(ke - ks > c4_indexer.index_topk, ke, ks)
                final = forward_batch.seq_lens_cpu[0] // 4
                size = indexer_metadata.compressed_page_size
                return NonPagedIndexerPlan(page_table=indexer_metadata.page_table[:1], gather_seq_lens=ke[-1:], ks=ks,
                                           ke=ke, seq_len_sum=final, max_seq_len=final,
                                           max_seqlen_k=(final + size - 1) // size * size, query_rows=query_rows,
                                           rows_per_chunk=None)

            def forward_c4_indexer(self, x, q_lora, c4_indexer, forward_batch, alt_streams=None,
                                   enable_multi_stream=False, q_lora_ready=None, skip_compressor=False,
                                   q_lora_quant=None):
                metadata = self.forward_metadata
                indexer_metadata, core_metadata = metadata.indexer_metadata, metadata.core_metadata
                assert isinstance(indexer_metadata, PagedIndexerMetadata)
                weights = c4_indexer.compute_weights(x, skip_scale=True)
                q_indexer, weights = c4_indexer.compute_q(q_lora, core_metadata.positions, weights, q_lora_quant)
                q, weights = q_indexer.unsqueeze(1), weights.squeeze(2)
                c4_seq_lens = indexer_metadata.compressed_seq_lens
                page_table = indexer_metadata.page_table
                out = core_metadata.c4_sparse_page_indices
                raw = core_metadata.c4_sparse_raw_indices
                cache = self.token_to_kv_pool.get_index_k_with_scale_buffer(layer_id=c4_indexer.layer_id)
                cache = cache.view(cache.shape[0], 64, 1, 132)

                def run_topk_transform(rows, logits):
                    topk_transform_paged(logits, c4_seq_lens[rows], page_table[rows], out[rows],
                                         indexer_metadata.compressed_page_size, raw[rows])

                plan = self._nonpaged_plan(c4_indexer, forward_batch, indexer_metadata, c4_seq_lens, q.shape[0])
                if plan is not None:
                    k_u8, scale_u8 = self.token_to_kv_pool.get_index_k_scale_buffer(
                        layer_id=c4_indexer.layer_id, seq_len_tensor=plan.gather_seq_lens,
                        page_indices=plan.page_table, seq_len_sum=plan.seq_len_sum, max_seq_len=plan.max_seq_len)
                    kv = (k_u8.view(torch.float8_e4m3fn), scale_u8.view(torch.float32).squeeze(-1))
                    for rows in iter_row_chunks(num_rows=plan.query_rows, rows_per_chunk=plan.rows_per_chunk):
                        logits = self._nonpaged_mqa_logits(q_indexer=q_indexer, weights=weights, kv=kv, plan=plan,
                                                           rows=rows)
                        run_topk_transform(rows, logits)
                    return
                assert envs.SGLANG_OPT_USE_TILELANG_INDEXER.get()
                from sglang.kernels.ops.attention.dsa.tilelang_kernel import tilelang_fp8_paged_mqa_logits as fn

                def run_paged_indexer(rows, metadata):
                    logits = fn(q[rows], cache, weights[rows], c4_seq_lens[rows], page_table[rows], metadata,
                                indexer_metadata.max_compressed_seq_len, False)
                    run_topk_transform(rows, logits)

                for rows in iter_row_chunks(num_rows=q.shape[0], rows_per_chunk=None):
                    run_paged_indexer(rows, indexer_metadata.deep_gemm_metadata)
    """,
}

TREES = {"vllm-0.34.0": VLLM_034, "vllm-0.25.1": _vllm_025(), "sglang-0.5.23": SGLANG_0523}


def _sources(tmp_path, release):
    """(folder, "real" or "stand-in"): the release's modules from its wheel when it is here."""
    wheels = os.listdir(WHEELS) if os.path.isdir(WHEELS) else []
    if any(n.startswith(release + "-") and n.endswith(".whl") for n in wheels):
        src = tmp_path / "real"
        subprocess.run(["bash", os.path.join(REPO, "scripts", "extract_indexer_sources.sh"), WHEELS, str(src)],
                       capture_output=True, text=True, check=False)
        if (src / release).is_dir():
            return src, "real"
    return write_tree(tmp_path / "stand-in" / release, TREES[release]).parent, "stand-in"


def _prove(src, release, tmp_path):
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    proc = subprocess.run([sys.executable, SCRIPT, "--src", str(src), "--releases", release, "--json", str(out), *TINY],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    rows = json.loads(out.read_text()) if out.exists() else []
    return proc, rows


@pytest.mark.parametrize("release", sorted(TREES))
def test_proof_runs_the_framework_function_patched_and_not(tmp_path, release):
    pytest.importorskip("triton")
    src, kind = _sources(tmp_path, release)
    proc, rows = _prove(src, release, tmp_path)
    assert proc.returncode == 0, f"{kind} sources:\n{proc.stdout}\n{proc.stderr}"
    passes = {"vllm-0.34.0": {"prefill", "decode"}, "vllm-0.25.1": {"prefill", "decode"},
              "sglang-0.5.23": {"prefill", "prefill-nonpaged", "decode"}}[release]
    for kind_ in passes:
        un = {r["keys"]: r for r in rows if r["mode"] == "unpatched" and r["pass"] == kind_}
        mine = {r["keys"]: r for r in rows if r["mode"] == "patched" and r["pass"] == kind_}
        assert sorted(un) == sorted(mine) == [128, 256], rows
        for keys, r in mine.items():
            # the framework's own top-k over materialised logits runs unpatched, never patched
            assert un[keys]["ok"] and un[keys]["logits_topk_calls"] >= 1, un[keys]
            assert r["ok"] and r["logits_topk_calls"] == 0, r
            rows_ = 16 if kind_.startswith("prefill") else 2
            assert (r["same"], r["ties"], r["wrong"]) == (rows_, 0, 0), r
    assert proc.stdout.count(" | 256 | ") == len(passes) and "FAIL" not in proc.stderr  # one table row a pass


def test_a_framework_top_k_that_disagrees_fails_the_proof(tmp_path):
    """vLLM's decode top-k handed half the rows' lengths: its indices differ from the fused ones
    beyond ties, and the proof exits 1 naming the pass."""
    pytest.importorskip("triton")
    src = write_tree(tmp_path / "bad" / "vllm-0.25.1", _vllm_025("decode.seq_lens // 2")).parent
    proc, rows = _prove(src, "vllm-0.25.1", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL: vllm-0.25.1 decode at 256 keys" in proc.stderr
    decode = [r for r in rows if r["mode"] == "patched" and r["pass"] == "decode"]
    assert decode and all(r["wrong"] > 0 for r in decode), decode
    assert all(r["wrong"] == 0 for r in rows if r["mode"] == "patched" and r["pass"] == "prefill")


@pytest.fixture(scope="module")
def prove():
    spec = importlib.util.spec_from_file_location("prove_1m_indexer", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _inputs(prove, keys=64, rows=3, heads=8, dim=32):
    from sm12x.kernels.indexer.cache import quant_fp8_paged_cache

    g = torch.Generator().manual_seed(0)
    cache = quant_fp8_paged_cache(torch.randn(keys // prove.BLOCK, prove.BLOCK, dim, generator=g))
    q = torch.randn(rows, heads, dim, generator=g).to(torch.float8_e4m3fn)
    return prove.Inputs(cache, q, torch.rand(rows, heads, generator=g), q, torch.rand(rows, heads, generator=g))


def test_compare_counts_ties_at_the_kth_score_and_nothing_else(prove, monkeypatch):
    keys, topk = 64, 4
    inputs = _inputs(prove, keys)
    scores = torch.arange(3 * keys, dtype=torch.float32).reshape(3, keys)  # key j of a row scores j + offset
    scores[2, 0] = scores[2, keys - topk]  # row 2: key 0 ties with the row's k-th best key
    # compare reads the reference scores from its own module, prove_1m.run
    monkeypatch.setattr(prove.run, "reference_scores", lambda kind, inputs_, keys_, k, rows: scores[rows])
    want = torch.arange(keys - topk, keys, dtype=torch.int32).repeat(3, 1)
    got = want.clone()
    got[1, 0] = keys - topk - 1  # the (k+1)-th key instead of the k-th: a lower score
    got[2, 0] = 0  # the tied key instead of the k-th
    assert prove.compare("prefill", inputs, keys, got, want, topk) == (1, 1, 1)
    assert prove.compare("prefill", inputs, keys, want.flip(1), want, topk) == (3, 0, 0)  # order is free


def test_compare_v41_holds_differing_consumer_rows_against_the_reference(prove, monkeypatch):
    """V4.1 rows [source | consumer | candidate blocks]: the source and the blocks must be the same
    sets; a consumer set that differs is tied when both runs' sets are the masked reference's top-k
    within the kernels' stated rounding, wrong otherwise (a key outside the candidate blocks, or
    one scoring well below the k-th)."""
    keys, topk, bs = 64, 4, 8
    inputs = _inputs(prove, keys)
    scores = torch.arange(3 * keys, dtype=torch.float32).reshape(3, keys) + 1000.0
    sizes_ = torch.full_like(scores, 1000.0)  # slack 2**-8 x 1000 ~ 3.9: a key 1-3 below the k-th passes
    monkeypatch.setattr(prove.run, "reference_scores",
                        lambda kind, inputs_, keys_, k, rows, sizes=False: (sizes_ if sizes else scores)[rows])
    monkeypatch.setattr(prove.run, "row_ends", lambda kind, keys_, rows, device: torch.full((rows,), keys_))
    blocks = torch.tensor([[6, 7]] * 3, dtype=torch.int32)  # candidate keys 48..63
    source = torch.arange(keys - topk, keys, dtype=torch.int32).repeat(3, 1)
    want = torch.cat([source, source, blocks], dim=1)
    got = want.clone()
    got[1, topk] = keys - topk - 2  # the consumer's 6th best candidate key for its 4th: within the rounding
    got[2, topk] = 5  # a key outside the candidate blocks
    assert prove.compare_v41("prefill-v41", inputs, keys, got, want, topk, bs) == (1, 1, 1)
    wrong_source = want.clone()
    wrong_source[0, 0] = 0
    assert prove.compare_v41("prefill-v41", inputs, keys, wrong_source, want, topk, bs) == (2, 0, 1)
    far = want.clone()
    far[0, topk] = 48  # a candidate key 12 below the k-th: beyond the rounding
    assert prove.compare_v41("decode-v41", inputs, keys, far, want, topk, bs) == (2, 0, 1)


def test_table_fails_on_wrong_rows_and_on_a_failed_sm12x_pass(prove):
    args = types.SimpleNamespace(release_list=["vllm-0.25.1"], keys=256, queries=16, decode_rows=2, heads=8, dim=128,
                                 topk=16, memory_cap_gib=1.0, reps=2)
    base = dict(release="vllm-0.25.1", keys=256, ok=True, peak=2 ** 30, ms=2.0, logits_topk_calls=1)
    good = [dict(base, mode="unpatched", **{"pass": "prefill"}),
            dict(base, mode="patched", same=16, ties=0, wrong=0, logits_topk_calls=0, **{"pass": "prefill"}),
            dict(base, mode="unpatched", **{"pass": "decode"}),
            dict(base, mode="patched", same=2, ties=0, wrong=0, logits_topk_calls=0, **{"pass": "decode"})]
    text, failures = prove.table(args, good)
    assert failures == [] and "| vllm 0.25.1 sparse_attn_indexer | prefill | 256 | 1.00 GiB | 2.0 ms |" in text
    bad = good[:1] + [dict(good[1], wrong=1)] + good[2:3] + [dict(base, mode="patched", ok=False, error="boom",
                                                                 **{"pass": "decode"})]
    _, failures = prove.table(args, bad)
    assert len(failures) == 2 and any("1 rows differ" in f for f in failures) and any("boom" in f for f in failures)


def test_no_release_is_refused_by_name(prove):
    with pytest.raises(SystemExit):
        prove.parse_args(["--releases", ",", "--device", "cpu"])


def test_v41_passes_match_vllms_own_candidate_kernels(tmp_path):
    """``--v41``: vLLM 0.34.0's own ``sparse_attn_indexer`` and ``candidate_blocks`` kernels (the
    real modules from the wheel; the stand-in tree has no V4.1 code) for a candidate source and a
    consumer layer, prefill and decode: the patched run never ranks materialised logits and
    gives the same source indices, consumer indices and published blocks."""
    pytest.importorskip("triton")
    src, kind = _sources(tmp_path, "vllm-0.34.0")
    if kind != "real":
        pytest.skip(f"needs the vLLM 0.34.0 wheel in {WHEELS} (SM12X_FRAMEWORK_WHEELS): V4.1's candidate "
                    f"kernels are vLLM's own")
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    tiny = [a if a != "128,256" else "256" for a in TINY]
    proc = subprocess.run([sys.executable, SCRIPT, "--src", str(src), "--releases", "vllm-0.34.0", "--json", str(out),
                           "--v41", "--candidate-block-size", "8", *tiny],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    rows = {(r["mode"], r["pass"]): r for r in json.loads(out.read_text())}
    for kind_, n in (("prefill-v41", 16), ("decode-v41", 2)):
        un, mine = rows["unpatched", kind_], rows["patched", kind_]
        assert un["ok"] and un["logits_topk_calls"] == 2, un  # the source's and the consumer's top-k
        assert mine["ok"] and mine["logits_topk_calls"] == 0, mine
        assert (mine["same"], mine["ties"], mine["wrong"]) == (n, 0, 0), mine

"""The DeepSeek-V4.1 candidate-block records and GLM-5-next's decode records
(:mod:`sm12x.patches.indexer_topk`) on a stand-in vLLM 0.34.0 shaped like the release: its
``sparse_attn_indexer`` puts the candidate select / mask between the logits and the top-k (prefill
chunks on DeepGEMM's compressed logits, decode on the paged ones), GLM-5-next's
``sparse_attn_indexer_kpool`` ranks pools with its own logits / top-k copies. With sm12x the
logits are never materialised and the indices and published blocks are those of vLLM's own
functions (the stand-ins keep their semantics: ``candidate_blocks.py``'s block maxima, pinning,
torch.topk and -inf mask; the top-k kernels return min(visible, topk) positions, masked ones
included); real logits under DCP, for [B, 1] lengths with next_n > 1, and when a record is off.

The same through vLLM's real modules and candidate kernels: ``tests/scripts/test_prove_1m_indexer.py``
(``--v41``)."""
import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

PKG = "__init__.py"
PACKAGES = ("vllm", "vllm/utils", "vllm/model_executor", "vllm/model_executor/kernels",
            "vllm/model_executor/kernels/attention", "vllm/model_executor/kernels/attention/dsa",
            "vllm/model_executor/layers", "vllm/models", "vllm/models/glm5next", "vllm/models/glm5next/nvidia")

TREE = {
    **{f"{p}/{PKG}": "" for p in PACKAGES},
    # vLLM's top-k semantics: a row of at most topk visible keys returns all of them, a longer one its
    # topk best values, -inf (masked) ones included when fewer survive; equal values lower position first
    "vllm/_custom_ops.py": """
        import torch
        CALLS = []
        def rank(logits, starts, ends, out, topk):
            CALLS.append(logits.untyped_storage().nbytes())
            out.fill_(-1)
            for r in range(out.shape[0]):
                lo, hi = int(starts[r]), int(ends[r])
                row = logits[r, lo:hi]
                order = torch.sort(row, descending=True, stable=True).indices[:topk]
                out[r, :order.numel()] = order.int()
        def top_k_per_row_prefill(logits, row_starts, row_ends, out, rows, s0, s1, topk):
            rank(logits, row_starts, row_ends, out[:rows, :topk], topk)
    """,
    "vllm/model_executor/layers/indexer_topk.py": """
        import torch
        from vllm import _custom_ops
        class SparseIndexerTopk:
            def takes_bf16_logits(self, logits, topk, rows):
                return False
            def __call__(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len):
                ends = seq_lens.reshape(-1)
                if ends.numel() != logits.shape[0]:  # [B, 1]: row t ends at len - next_n + 1 + t
                    ends = (seq_lens.reshape(-1, 1) - next_n + 1 + torch.arange(next_n)).reshape(-1)
                _custom_ops.rank(logits, torch.zeros_like(ends), ends, topk_indices, topk_tokens)
        def get_indexer_topk(backend):
            return SparseIndexerTopk()
    """,
    "vllm/utils/deep_gemm.py": """
        import torch
        from sm12x.frontends.deep_gemm import indexer as dg
        def fp8_fp4_mqa_logits(q, kv, weights, ks, ke, max_seqlen_k, logits_dtype=torch.float32):
            flat = dg.fp8_fp4_mqa_logits(q, kv, weights, ks, ke, clean_logits=True)
            cols = ks.long()[:, None] + torch.arange(max_seqlen_k)[None, :]
            return flat.gather(1, cols.clamp(max=flat.shape[1] - 1)).masked_fill(cols >= ke.long()[:, None],
                                                                                float("-inf"))
        def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                     max_model_len, logits_dtype=torch.float32, indices=None):
            if context_lens.shape[-1] == 1 and q[0].shape[1] > 1:  # [B, 1]: each request's length
                context_lens = context_lens[:, 0].contiguous()
            return dg.fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, None,
                                               max_model_len, clean_logits=True)
    """,
    # vLLM 0.34's select / mask (candidate_blocks.py, DeepSelect off) in torch: the references state them
    "vllm/model_executor/kernels/attention/dsa/candidate_blocks.py": """
        from sm12x.kernels.indexer.reference import ref_candidate_mask, ref_select_candidate_blocks
        def select_candidate_blocks(logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat=1,
                                    score_dtype=None):
            ends = row_ke.repeat_interleave(row_repeat)
            out.copy_(ref_select_candidate_blocks(logits, ends, topk_blocks, block_size))
        def apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat=1):
            ends = row_ke.repeat_interleave(row_repeat)
            logits.copy_(ref_candidate_mask(logits, ends, candidate_blocks, block_size))
    """,
    "vllm/model_executor/layers/sparse_attn_indexer.py": """
        import torch
        from vllm import _custom_ops as ops
        from vllm.model_executor.kernels.attention.dsa.candidate_blocks import (
            apply_candidate_mask as _apply_candidate_mask, select_candidate_blocks as _select_candidate_blocks)
        from vllm.model_executor.layers.indexer_topk import get_indexer_topk
        from vllm.utils.deep_gemm import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits

        def as_fp32_logits(logits, row_ends):
            return logits

        def sparse_attn_indexer(prefill, decode, topk_indices_buffer, topk_tokens, candidate_blocks=None,
                                candidate_block_size=0, candidate_write=False, dcp_world_size=1):
            # prefill: one chunk, DeepGEMM's compressed logits; decode: paged logits (vLLM 0.34's sequence)
            if prefill is not None:
                q, k, k_scale, weights, ks, ke, max_seqlen_k = prefill
                row_ends = ke - ks
                logits = as_fp32_logits(fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, max_seqlen_k,
                                                           logits_dtype=torch.float32), row_ends)
                if candidate_blocks is not None:
                    if candidate_write:
                        _select_candidate_blocks(logits, None, row_ends, candidate_blocks.shape[1],
                                                 candidate_block_size, candidate_blocks)
                    else:
                        _apply_candidate_mask(logits, None, row_ends, candidate_blocks, candidate_block_size)
                ops.top_k_per_row_prefill(logits, torch.zeros_like(row_ends), row_ends, topk_indices_buffer,
                                          logits.shape[0], logits.stride(0), logits.stride(1), topk_tokens)
                return logits
            q, kv_cache, weights, seq_lens, block_table, max_model_len = decode
            logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, seq_lens, block_table, None,
                                              max_model_len=max_model_len, logits_dtype=torch.float32, indices=None)
            logits = as_fp32_logits(logits, seq_lens.view(-1))
            num_rows, next_n = logits.shape[0], q.shape[1]
            if candidate_blocks is not None:
                vis = seq_lens.reshape(-1)
                row_repeat = next_n if vis.numel() != num_rows else 1
                if candidate_write:
                    _select_candidate_blocks(logits, None, vis[:num_rows], candidate_blocks.shape[1],
                                             candidate_block_size, candidate_blocks[:num_rows], row_repeat,
                                             score_dtype=torch.float32)
                else:
                    _apply_candidate_mask(logits, None, vis[:num_rows], candidate_blocks[:num_rows],
                                          candidate_block_size, row_repeat)
            get_indexer_topk("auto")(logits, seq_lens, next_n, topk_indices_buffer[:num_rows, :topk_tokens],
                                     topk_tokens, 0)
            return logits
    """,
    # GLM-5-next's pool indexer decode: its own copies, topk // index_kpool pools
    "vllm/models/glm5next/nvidia/sparse_indexer.py": """
        import torch
        from vllm.model_executor.layers.indexer_topk import get_indexer_topk
        from vllm.utils.deep_gemm import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits

        def sparse_attn_indexer_kpool(q, kv_cache, weights, seq_lens, block_table, max_pool_len, topk_tokens,
                                      index_kpool, dcp_world_size=1):
            logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, seq_lens, block_table, None,
                                              max_model_len=max_pool_len, logits_dtype=torch.float32, indices=None)
            select_k = topk_tokens // index_kpool
            pool_topk = torch.empty((logits.shape[0], select_k), dtype=torch.int32)
            get_indexer_topk("auto")(logits, seq_lens, q.shape[1], pool_topk, select_k, 0)
            return logits, pool_topk
    """,
}

CALLS = """
import json, os, torch
import vllm  # the watcher route
from vllm.model_executor.layers import sparse_attn_indexer as s
from vllm.models.glm5next.nvidia import sparse_indexer as glm
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache, quant_fp8_per_token
from sm12x import apply
g = torch.Generator().manual_seed(11)
h, d, topk, bs, kb = 8, 64, 24, 8, 3
dcp = int(os.environ.get("DCP", "1"))

def originals(fn):
    return getattr(fn, "__sm12x_original__", fn)

def run(call, rows):
    # (indices of the source and a consumer layer, published blocks, logits bytes of each layer)
    src, con = torch.full((rows, topk), 7, dtype=torch.int32), torch.full((rows, topk), 7, dtype=torch.int32)
    blocks = torch.full((rows, kb), -7, dtype=torch.int32)
    a = call(src, blocks, True)
    b = call(con, blocks, False)
    return src, con, blocks, [a.untyped_storage().nbytes(), b.untyped_storage().nbytes()]

def want(call, rows):
    # the same calls with vLLM's own functions (the records' originals) on real logits
    saved = {n: getattr(s, n) for n in ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "ops",
                                        "_select_candidate_blocks", "_apply_candidate_mask", "get_indexer_topk")}
    for n, f in saved.items():
        setattr(s, n, originals(f))
    try:
        return run(call, rows)
    finally:
        for n, f in saved.items():
            setattr(s, n, f)

def sets(t):
    return [sorted(r) for r in t.tolist()]

res = {}
# prefill: a chunk of two requests (rows see their request's keys), one row shorter than topk
rows, keys = 6, 300
q = torch.randn(rows, h, d, generator=g).to(torch.float8_e4m3fn)
k, k_scale = quant_fp8_per_token(torch.randn(keys, d, generator=g))
w = torch.randn(rows, h, generator=g)
ks = torch.tensor([0, 0, 0, 100, 100, 100], dtype=torch.int32)
ke = torch.tensor([20, 90, 100, 180, 250, 300], dtype=torch.int32)
prefill = lambda out, blocks, write: s.sparse_attn_indexer(
    (q, k, k_scale, (w if write else w.flip(-1)), ks, ke, 210), None, out, topk, candidate_blocks=blocks,
    candidate_block_size=bs, candidate_write=write, dcp_world_size=dcp)
# decode: next_n 2 with [B, next_n] lengths (native) or [B, 1] (vLLM's row_repeat)
bkv, pages = 32, 12
cache = quant_fp8_paged_cache(torch.randn(pages, bkv, d, generator=g))
qd = torch.randn(3, 2, h, d, generator=g).to(torch.float8_e4m3fn)
wd = torch.randn(6, h, generator=g)
bt = torch.randperm(pages, generator=g)[:12].int().view(3, 4)
forms = {"2d": torch.tensor([[10, 11], [120, 121], [127, 128]], dtype=torch.int32),
         "b1": torch.tensor([[11], [121], [128]], dtype=torch.int32)}
for name, call, n in [("prefill", prefill, rows)] + [
        (f"decode {f}", (lambda lens: lambda out, blocks, write: s.sparse_attn_indexer(
            None, (qd, cache, (wd if write else wd.flip(-1)), lens, bt, 128), out, topk, candidate_blocks=blocks,
            candidate_block_size=bs, candidate_write=write, dcp_world_size=dcp))(lens), 6)
        for f, lens in forms.items()]:
    got, ref = run(call, n), want(call, n)
    res[name] = {"same": [sets(a) == sets(b) for a, b in zip(got[:3], ref[:3])], "bytes": got[3],
                 "counts": (got[1] >= 0).sum(1).tolist(), "ref_counts": (ref[1] >= 0).sum(1).tolist()}
# GLM-5-next: pools, topk // kpool of them
lens = forms["2d"]
glm_got = glm.sparse_attn_indexer_kpool(qd, cache, wd, lens, bt, 128, topk * 2, 2, dcp_world_size=dcp)
real = originals(glm.fp8_fp4_paged_mqa_logits)((qd, None), cache, wd, lens, bt, None, 128)
ref = torch.empty(6, topk, dtype=torch.int32)
originals(glm.get_indexer_topk)("auto")(real, lens, 2, ref, topk, 0)
res["glm5next"] = {"same": sets(glm_got[1]) == sets(ref), "bytes": glm_got[0].untyped_storage().nbytes()}
res["outcomes"] = {k: v[0] for k, v in apply.OUTCOMES.items()
                   if "candidate" in k or "glm5next" in k or k.startswith("vllm.sparse_attn_indexer")}
print(json.dumps(res))
"""


def _run(tmp_path, env=None):
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**TREE, **dist_infos({"vllm": "0.34.0"})})
    return last_json(run_py(CALLS, pythonpath=[REPO, root], env={"TRITON_INTERPRET": "1", **(env or {})}))


def test_v41_candidate_layers_and_glm5next_pools_without_logits(tmp_path):
    out = _run(tmp_path)
    for name in ("prefill", "decode 2d"):
        assert out[name]["same"] == [True, True, True], (name, out[name])
        assert out[name]["bytes"] == [4, 4], (name, out[name])  # placeholders: no logits matrix
        assert out[name]["counts"] == out[name]["ref_counts"], (name, out[name])
    # a consumer row of more keys than topk keeps topk, masked keys included where too few survive
    assert out["prefill"]["counts"] == [20, 24, 24, 24, 24, 24]
    # [B, 1] lengths with next_n 2: vLLM bounds both rows by the request: real logits, vLLM's own steps
    assert out["decode b1"]["same"] == [True, True, True] and min(out["decode b1"]["bytes"]) > 4
    assert out["glm5next"] == {"same": True, "bytes": 4}
    taken = ("vllm.sparse_attn_indexer._select_candidate_blocks", "vllm.sparse_attn_indexer._apply_candidate_mask",
             "vllm.sparse_attn_indexer.compressed_mqa_logits", "vllm.sparse_attn_indexer.ops",
             "vllm.sparse_attn_indexer.fp8_fp4_paged_mqa_logits", "vllm.sparse_attn_indexer.get_indexer_topk",
             "vllm.glm5next.sparse_indexer.fp8_fp4_paged_mqa_logits", "vllm.glm5next.sparse_indexer.get_indexer_topk")
    assert {n: out["outcomes"].get(n) for n in taken} == {n: "applied" for n in taken}, out["outcomes"]


@pytest.mark.parametrize("env", [{"DCP": "2"}, {"SM12X_SKIP": "vllm.sparse_attn_indexer._apply_candidate_mask"}],
                         ids=["dcp", "mask record off"])
def test_real_logits_where_the_candidate_steps_are_not_ours(tmp_path, env):
    """DCP's merge reads the logits; a consumer step left to vLLM would read a placeholder: both
    keep real logits (and vLLM's own steps), with the same indices."""
    out = _run(tmp_path, env)
    for name in ("prefill", "decode 2d"):
        assert out[name]["same"] == [True, True, True], (name, out[name])
        assert min(out[name]["bytes"]) > 4, (name, out[name])
    assert out["glm5next"]["same"] and (out["glm5next"]["bytes"] > 4) == ("DCP" in env)

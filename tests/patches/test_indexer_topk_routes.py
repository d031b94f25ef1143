"""The indexer top-k records on stand-in frameworks shaped like the releases they were checked on
(vLLM 0.34.0's fused_mqa_topk seam and the copies its indexer, planner and GLM-5 Next hold; vLLM
0.25.1's sparse_attn_indexer prefill pair; SGLang 0.5.23's DeepSeek-V4 non-paged indexer): each
route gives the indices the framework's own logits + top-k give, without the logits."""
import textwrap

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

PKG = "__init__.py"


def packages(*paths):
    return {f"{p}/{PKG}": "" for p in paths}


# what the frameworks' own top-k computes, shared by the stand-ins (written out from their sources)
SEMANTICS = textwrap.dedent("""
    import torch
    from sm12x.kernels.indexer.reference import ref_mqa_logits

    def logits(q, k, k_scale, w, ks, ke):  # what DeepGEMM returns (uncleaned = cleaned here)
        return ref_mqa_logits(q.float(), k.float(), k_scale, w, ks, ke)

    def top_k_per_row_prefill(logits, ks, ke, out, rows, s0, s1, topk):  # vLLM's, unordered
        out.fill_(-1)
        for r in range(rows):
            lo, hi = int(ks[r]), int(ke[r])
            n = min(topk, max(hi - lo, 0))
            if n:
                out[r, :n] = torch.topk(logits[r, lo:hi], n).indices.int()
""")

VLLM_034 = {
    **packages("vllm", "vllm/model_executor", "vllm/model_executor/kernels",
               "vllm/model_executor/kernels/attention", "vllm/model_executor/kernels/attention/dsa",
               "vllm/model_executor/layers", "vllm/v1", "vllm/v1/attention", "vllm/v1/attention/backends",
               "vllm/v1/attention/backends/mla", "vllm/models", "vllm/models/glm5next",
               "vllm/models/glm5next/nvidia"),
    "vllm/envs.py": "VLLM_USE_FUSED_MQA_TOPK = True\nVLLM_BATCH_INVARIANT = False\n",
    "vllm/model_executor/kernels/attention/dsa/fused_mqa_topk.py": """
        import vllm.envs as envs
        def use_fused_mqa_topk(*, query_shape, topk, fp4_cache, full_context, candidate_selection=False):
            return False  # SM100 family only
        def fused_mqa_topk_chunk(max_seqlen_k, keys, topk, rows, dense_rows):
            raise RuntimeError("original chunk rule: torch.cuda SM count")
        def fused_mqa_topk_key_scales(scales):
            return ((scales.view(__import__("torch").int32).squeeze(-1) & 0xFF) << 23).view(__import__("torch").float32)
        def fused_mqa_topk_prefill(q, k, scales, weights, starts, ends, output):
            raise RuntimeError("original fused_mqa_topk_prefill: no kernel image for this GPU")
    """,
    # the 0.34 prefill chunk: the fused seam when eligible, dense logits + top-k otherwise
    "vllm/model_executor/layers/sparse_attn_indexer.py": SEMANTICS + """
from vllm.model_executor.kernels.attention.dsa.fused_mqa_topk import (
    fused_mqa_topk_chunk, fused_mqa_topk_key_scales, fused_mqa_topk_prefill, use_fused_mqa_topk)

def prefill_chunk(q, k_quant, k_scale, weights, ks, ke, topk_indices):
    fused = use_fused_mqa_topk(query_shape=q.shape[1:], topk=topk_indices.shape[1], fp4_cache=False,
                               full_context=True)
    if fused and fused_mqa_topk_chunk(int((ke - ks).max()), k_quant.shape[0], topk_indices.shape[1],
                                      q.shape[0], 16):
        fused_mqa_topk_prefill(q, k_quant, fused_mqa_topk_key_scales(k_scale), weights, ks, ke, topk_indices)
        return "fused"
    top_k_per_row_prefill(logits(q, k_quant, k_scale.view(torch.float32).squeeze(-1), weights, ks, ke), ks, ke,
                          topk_indices, q.shape[0], 0, 0, topk_indices.shape[1])
    return "dense"

# the 0.33-0.34 decode: paged logits, then the layer's top-k selector (v4.1 candidates read them)
from vllm.utils.deep_gemm import fp8_fp4_paged_mqa_logits
from vllm.model_executor.layers.indexer_topk import get_indexer_topk

def sparse_attn_indexer(q, kv_cache, weights, seq_lens, block_table, max_model_len, topk_indices_buffer, topk,
                        candidate_blocks=None, dcp_world_size=1):
    logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, seq_lens, block_table, None,
                                      max_model_len=max_model_len, logits_dtype=torch.float32, indices=None)
    if candidate_blocks is not None:
        candidate_blocks.copy_(logits[:, :candidate_blocks.shape[1]])
    get_indexer_topk("auto")(logits, seq_lens, q.shape[1], topk_indices_buffer[:logits.shape[0], :topk], topk, 0)
    return logits
""",
    "vllm/utils/__init__.py": "",
    "vllm/utils/deep_gemm.py": """
        import torch
        from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
        def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                     max_model_len, logits_dtype=torch.float32, indices=None):
            return ref_paged_mqa_logits(q[0], kv_cache, weights, context_lens, block_tables, max_model_len)
    """,
    "vllm/model_executor/layers/indexer_topk.py": """
        import torch
        CALLS = []
        class SparseIndexerTopk:  # vLLM's decode top-k semantics (its torch backend)
            def __call__(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len):
                CALLS.append(logits.untyped_storage().nbytes())
                ends = seq_lens.reshape(-1)
                cols = torch.arange(logits.shape[1])
                masked = logits.masked_fill(cols[None, :] >= ends[:, None], float("-inf"))
                idx = masked.topk(topk_tokens, dim=-1).indices
                topk_indices.copy_(torch.where(torch.arange(topk_tokens)[None, :] < ends[:, None], idx, -1))
        def get_indexer_topk(backend):
            return SparseIndexerTopk()
    """,
    "vllm/v1/attention/backends/mla/indexer.py":
        "from vllm.model_executor.kernels.attention.dsa.fused_mqa_topk import use_fused_mqa_topk\n",
    "vllm/models/glm5next/nvidia/sparse_indexer.py":
        "from vllm.model_executor.kernels.attention.dsa.fused_mqa_topk import fused_mqa_topk_prefill\n",
}

VLLM_025 = {
    **packages("vllm", "vllm/utils", "vllm/model_executor", "vllm/model_executor/layers"),
    # vLLM's ops: the decode radix top-k ops registered in the _C torch library (looked up
    # through torch.ops._C at call time) and the per-row kernels, with vLLM's semantics
    "vllm/_custom_ops.py": SEMANTICS + """
CALLS = []
def indexer_k_quant_and_cache(*args):
    return "original indexer_k_quant_and_cache"
_real = top_k_per_row_prefill
def top_k_per_row_prefill(*args):
    CALLS.append("top_k_per_row_prefill")
    return _real(*args)
def _decode_topk(logits, next_n, seq_lens, out, topk):  # row ends as vLLM's decode top-k kernels
    rows = logits.shape[0]
    if seq_lens.numel() == rows:
        ends = seq_lens.reshape(-1)
    else:
        ends = (seq_lens.reshape(-1, 1) - next_n + 1 + torch.arange(next_n)).clamp(min=0).reshape(-1)
    masked = logits.masked_fill(torch.arange(logits.shape[1])[None, :] >= ends[:, None], float("-inf"))
    idx = masked.topk(topk, dim=-1).indices
    out.copy_(torch.where(torch.arange(topk)[None, :] < ends[:, None], idx, -1))
def top_k_per_row_decode(logits, next_n, seq_lens, out, rows, s0, s1, topk):
    CALLS.append("top_k_per_row_decode")
    _decode_topk(logits, next_n, seq_lens, out, topk)
def _radix_op(name):
    def radix(logits: torch.Tensor, seq_lens: torch.Tensor, topk_indices: torch.Tensor, workspace: torch.Tensor,
              k: int, max_seq_len: int) -> None:
        CALLS.append(name)
        _decode_topk(logits, logits.shape[0] // seq_lens.shape[0], seq_lens, topk_indices, k)
    torch.library.custom_op(f"_C::{name}", radix, mutates_args=("topk_indices",))
_radix_op("persistent_topk")
_radix_op("cooperative_topk")
""",
    "vllm/utils/deep_gemm.py": SEMANTICS + """
from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits):
    return logits(q[0], kv[0], kv[1], weights, cu_seqlen_ks, cu_seqlen_ke)
def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len,
                             clean_logits, indices=None):
    if context_lens.shape[1] != q[0].shape[1]:  # [B, 1]: each request's length, as the 1-D form
        context_lens = context_lens[:, 0]
    return ref_paged_mqa_logits(q[0], kv_cache, weights, context_lens, block_tables, max_model_len)
""",
    # 0.25.1-0.29.0's sparse_attn_indexer: prefill chunks (logits, the row top-k, the DCP merge
    # reading the logits; 0.30.0-0.32.0 add v4.1 candidate blocks reading them before the
    # top-k), then decode (paged logits, one of three top-k vLLM picks by topk / rows / GPU)
    "vllm/model_executor/layers/sparse_attn_indexer.py": """
        import torch
        from vllm import _custom_ops as ops
        from vllm.utils.deep_gemm import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits
        MERGED = []
        def sparse_attn_indexer(prefill, decode, topk_indices_buffer, topk_tokens, dcp_world_size=1,
                                candidate_blocks=None, decode_topk="persistent"):
            if prefill is not None:
                q, k, k_scale, weights, ks, ke = prefill
                topk_indices = topk_indices_buffer[:q.shape[0], :topk_tokens]
                logits = fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, clean_logits=False)
                if candidate_blocks is not None:
                    candidate_blocks.copy_(logits[:, :candidate_blocks.shape[1]])
                ops.top_k_per_row_prefill(logits, ks, ke, topk_indices, logits.shape[0], logits.stride(0),
                                          logits.stride(1), topk_tokens)
                if dcp_world_size > 1:
                    MERGED.append(float(logits.sum()))
            if decode is not None:
                q, cache, weights, seq_lens, block_table, max_model_len = decode
                logits = fp8_fp4_paged_mqa_logits((q, None), cache, weights, seq_lens, block_table, None,
                                                  max_model_len=max_model_len, clean_logits=False)
                rows = logits.shape[0]
                topk_indices = topk_indices_buffer[:rows, :topk_tokens]
                workspace = torch.empty(16, dtype=torch.uint8)
                if decode_topk == "cooperative":
                    torch.ops._C.cooperative_topk(logits, seq_lens, topk_indices, workspace, topk_tokens, 64)
                elif decode_topk == "persistent":
                    torch.ops._C.persistent_topk(logits, seq_lens, topk_indices, workspace, topk_tokens,
                                                 logits.shape[1])
                else:
                    ops.top_k_per_row_decode(logits, q.shape[1], seq_lens, topk_indices, rows, logits.stride(0),
                                             logits.stride(1), topk_tokens)
            return logits
    """,
}

# vLLM 0.33.0-0.34.0's prefill: DeepGEMM's compressed logits (row i's column c is key ks[i] + c),
# upcast to float32, then the row top-k over [0, ke - ks)
VLLM_033 = {
    **VLLM_025,
    "vllm/utils/deep_gemm.py": SEMANTICS + """
def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k, logits_dtype=None):
    full = logits(q[0], kv[0], kv[1], weights, cu_seqlen_ks, cu_seqlen_ke)
    cols = (cu_seqlen_ks[:, None].long() + torch.arange(max_seqlen_k)[None, :]).clamp(max=full.shape[1] - 1)
    return full.gather(1, cols)
""",
    "vllm/model_executor/layers/sparse_attn_indexer.py": """
        import torch
        from vllm import _custom_ops as ops
        from vllm.utils.deep_gemm import fp8_fp4_mqa_logits
        def as_fp32_logits(logits, row_ends):
            return logits if logits.dtype == torch.float32 else logits.float()
        def sparse_attn_indexer(prefill, decode, topk_indices_buffer, topk_tokens, dcp_world_size=1,
                                candidate_blocks=None):
            q, k, k_scale, weights, ks, ke = prefill
            topk_indices = topk_indices_buffer[:q.shape[0], :topk_tokens]
            row_ends = ke - ks
            logits = as_fp32_logits(fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke,
                                                       int(row_ends.max())), row_ends)
            if candidate_blocks is not None:
                candidate_blocks.copy_(logits[:, :candidate_blocks.shape[1]])
            ops.top_k_per_row_prefill(logits, torch.zeros_like(row_ends), row_ends, topk_indices, logits.shape[0],
                                      logits.stride(0), logits.stride(1), topk_tokens)
            return logits
    """,
}

INPUTS = SEMANTICS + """
import json, sys
from sm12x.kernels.indexer.cache import quant_fp8_per_token
g = torch.Generator().manual_seed(0)
rows, keys, h, d, topk = 6, 260, 8, 64, 16
q = torch.randn(rows, h, d, generator=g).to(torch.float8_e4m3fn)
k, k_scale = quant_fp8_per_token(torch.randn(keys, d, generator=g))
w = torch.rand(rows, h, generator=g)
ks = torch.tensor([0, 0, 0, 120, 120, 120], dtype=torch.int32)
ke = torch.tensor([10, 100, 120, 121, 200, 260], dtype=torch.int32)
def want_sets():
    out = torch.empty(rows, topk, dtype=torch.int32)
    top_k_per_row_prefill(logits(q, k, k_scale, w, ks, ke), ks, ke, out, rows, 0, 0, topk)
    return sets(out)
def sets(idx):
    return [sorted(r.tolist()) for r in idx]
from sm12x import apply
"""

CALLS_034 = INPUTS + """
# the plugin route: vLLM imported (copies taken) before sm12x registered
from vllm.model_executor.layers import sparse_attn_indexer as s
import vllm.v1.attention.backends.mla.indexer as planner, vllm.models.glm5next.nvidia.sparse_indexer as glm
import sm12x.plugin; sm12x.plugin.register()
buffer = torch.full((rows, topk + 4), 7, dtype=torch.int32)
route = s.prefill_chunk(q, k, k_scale.view(torch.uint8).view(-1, 4), w, ks, ke, buffer[:, :topk])
res = {"route": route, "sets": sets(buffer[:, :topk]) == want_sets(), "tail": bool((buffer[:, topk:] == 7).all()),
       "copies": [getattr(f, "__sm12x_patch__", None) for f in (planner.use_fused_mqa_topk,
                                                                glm.fused_mqa_topk_prefill)],
       "outcomes": {k: v[0] for k, v in apply.OUTCOMES.items() if "topk" in k or "sparse_attn" in k}}
print(json.dumps(res))
"""

CALLS_DECODE = """
import json, torch
import vllm  # the watcher route
from vllm.model_executor.layers import sparse_attn_indexer as decode, indexer_topk
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x import apply
g = torch.Generator().manual_seed(2)
b, next_n, h, d, bkv, topk = 2, 2, 16, 64, 32, 20
cache = quant_fp8_paged_cache(torch.randn(8, bkv, d, generator=g))
q = torch.randn(b, next_n, h, d, generator=g).to(torch.float8_e4m3fn)
w = torch.rand(b * next_n, h, generator=g)
lens = torch.tensor([[10, 11], [90, 91]], dtype=torch.int32)
bt = torch.randperm(8, generator=g)[:6].int().view(b, 3)
res = {}
for candidates in (None, torch.empty(b * next_n, 4)):
    out = torch.full((b * next_n + 1, topk), 7, dtype=torch.int32)
    got = decode.sparse_attn_indexer(q, cache, w, lens, bt, 96, out, topk, candidate_blocks=candidates)
    want = torch.empty(b * next_n, topk, dtype=torch.int32)
    indexer_topk.CALLS.clear()
    orig = decode.fp8_fp4_paged_mqa_logits.__sm12x_original__
    indexer_topk.SparseIndexerTopk()(orig((q, None), cache, w, lens, bt, None, 96), lens, next_n, want, topk, 0)
    res[str(candidates is None)] = {"sets": [sorted(r) for r in out[:-1].tolist()] == [sorted(r) for r in want.tolist()],
                                    "untouched": out[-1].tolist() == [7] * topk,
                                    "logits_bytes": got.untyped_storage().nbytes()}
res["outcomes"] = {k: v[0] for k, v in apply.OUTCOMES.items() if "paged_mqa" in k or "get_indexer" in k}
print(json.dumps(res))
"""

CALLS_025 = INPUTS + """
import os
import vllm  # the watcher route: sm12x's sitecustomize is on the path
from vllm.model_executor.layers import sparse_attn_indexer as s
from vllm import _custom_ops
dcp = int(os.environ.get("DCP", "1"))
candidates = torch.empty(rows, 4) if os.environ.get("CANDIDATES") else None
out = torch.full((rows + 1, topk), 7, dtype=torch.int32)
got = s.sparse_attn_indexer((q, k, k_scale, w, ks, ke), None, out, topk, dcp_world_size=dcp,
                            candidate_blocks=candidates)
res = {"sets": sets(out[:-1]) == want_sets(), "untouched": out[-1].tolist() == [7] * topk,
       "logits_bytes": got.untyped_storage().nbytes(), "shape": list(got.shape),
       "vllm_topk_calls": len(_custom_ops.CALLS), "other_ops": s.ops.indexer_k_quant_and_cache(),
       "outcomes": {k: v for k, v in apply.OUTCOMES.items() if "topk" in k or "sparse_attn" in k}}
print(json.dumps(res))
"""

CALLS_025_DECODE = """
import json, os, torch
import vllm  # the watcher route
from vllm.model_executor.layers import sparse_attn_indexer as s
from vllm import _custom_ops
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x import apply
g = torch.Generator().manual_seed(5)
b, next_n, h, d, bkv, topk, max_len = 2, 2, 8, 64, 32, 20, 96
cache = quant_fp8_paged_cache(torch.randn(8, bkv, d, generator=g))
q = torch.randn(b, next_n, h, d, generator=g).to(torch.float8_e4m3fn)
w = torch.rand(b * next_n, h, generator=g)
bt = torch.randperm(8, generator=g)[:6].int().view(b, 3)
res = {"default": str(torch.ops._C.persistent_topk.default)}
for form, lens in (("2d", torch.tensor([[10, 11], [90, 91]], dtype=torch.int32)),
                   ("b1", torch.tensor([[11], [91]], dtype=torch.int32))):
    for route in ("persistent", "cooperative", "per_row"):
        _custom_ops.CALLS.clear()
        out = torch.full((b * next_n + 1, topk), 7, dtype=torch.int32)
        got = s.sparse_attn_indexer(None, (q, cache, w, lens, bt, max_len), out, topk,
                                    dcp_world_size=int(os.environ.get("DCP", "1")), decode_topk=route)
        vllm_calls = list(_custom_ops.CALLS)
        want = torch.empty(b * next_n, topk, dtype=torch.int32)
        real = s.fp8_fp4_paged_mqa_logits.__sm12x_original__((q, None), cache, w, lens, bt, None, max_len, False)
        _custom_ops._decode_topk(real, next_n, lens, want, topk)
        res[f"{form} {route}"] = {
            "sets": [sorted(r) for r in out[:-1].tolist()] == [sorted(r) for r in want.tolist()],
            "untouched": out[-1].tolist() == [7] * topk, "logits_bytes": got.untyped_storage().nbytes(),
            "vllm_topk_calls": vllm_calls}
res["outcomes"] = {k: v for k, v in apply.OUTCOMES.items() if k.startswith("vllm.sparse_attn_indexer")}
print(json.dumps(res))
"""


def _run(tmp_path, tree, code, releases, env=None):
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**tree, **dist_infos(releases)})
    return last_json(run_py(code, pythonpath=[REPO, root], env={"TRITON_INTERPRET": "1", **(env or {})}))


def test_vllm_034_fused_seam(tmp_path):
    out = _run(tmp_path, VLLM_034, CALLS_034, {"vllm": "0.34.0"})
    assert out["route"] == "fused" and out["sets"] and out["tail"]
    assert out["copies"] == ["vllm.fused_mqa_topk.use_fused_mqa_topk", "vllm.fused_mqa_topk.fused_mqa_topk_prefill"]
    fused = {k: v for k, v in out["outcomes"].items() if k.startswith("vllm.fused_mqa_topk")}
    assert len(fused) == 4 and set(fused.values()) == {"applied"}, out["outcomes"]


@pytest.mark.parametrize("release", ["0.30.0", "0.34.0"])
def test_vllm_030_to_034_decode_logits_never_materialised(tmp_path, release):
    """The decode pair (paged logits, get_indexer_topk), and real logits where v4.1 candidate
    blocks read them."""
    out = _run(tmp_path, VLLM_034, CALLS_DECODE, {"vllm": release})
    assert out["True"] == {"sets": True, "untouched": True, "logits_bytes": 4}
    assert out["False"] == {"sets": True, "untouched": True, "logits_bytes": 4 * 96 * 4}
    assert set(out["outcomes"].values()) == {"applied"} and len(out["outcomes"]) == 2, out["outcomes"]


@pytest.mark.parametrize("release", ["0.25.1", "0.32.0"])
def test_vllm_025_to_032_prefill_logits_never_materialised(tmp_path, release):
    out = _run(tmp_path, VLLM_025, CALLS_025, {"vllm": release})
    assert out["sets"] and out["untouched"] and out["logits_bytes"] == 4 and out["shape"] == [6, 260]
    assert out["vllm_topk_calls"] == 0 and out["other_ops"] == "original indexer_k_quant_and_cache"
    assert {out["outcomes"][n][0] for n in ("vllm.sparse_attn_indexer.fp8_fp4_mqa_logits",
                                            "vllm.sparse_attn_indexer.ops")} == {"applied"}


@pytest.mark.parametrize("env", [{"DCP": "2"}, {"CANDIDATES": "1"}], ids=["dcp", "v4.1 candidates"])
def test_vllm_prefill_keeps_real_logits_for_other_readers(tmp_path, env):
    """DCP's merge (0.25.1 on) and v4.1 candidate blocks (0.30.0 on) read the prefill logits:
    real logits and vLLM's top-k."""
    out = _run(tmp_path, VLLM_025, CALLS_025, {"vllm": "0.31.0"}, env=env)
    assert out["sets"] and out["logits_bytes"] == 6 * 260 * 4 and out["vllm_topk_calls"] == 1


@pytest.mark.parametrize("release,env", [("0.33.0", {}), ("0.34.0", {}), ("0.33.0", {"CANDIDATES": "1"})],
                         ids=["0.33.0", "0.34.0", "0.33.0 v4.1 candidates"])
def test_vllm_033_compressed_prefill_logits(tmp_path, release, env):
    """vLLM 0.33.0-0.34.0's dense prefill (DeepGEMM's compressed layout, starts 0 and ends ke - ks
    for the row top-k): a [rows, max_seqlen_k] placeholder and vLLM's indices; real logits where
    v4.1 candidate blocks read them."""
    out = _run(tmp_path, VLLM_033, CALLS_025, {"vllm": release}, env=env)
    real = bool(env)
    assert out["sets"] and out["untouched"] and out["shape"] == [6, 140]
    assert out["logits_bytes"] == (6 * 140 * 4 if real else 4) and out["vllm_topk_calls"] == (1 if real else 0)
    assert {out["outcomes"][n][0] for n in ("vllm.sparse_attn_indexer.compressed_mqa_logits",
                                            "vllm.sparse_attn_indexer.ops")} == {"applied"}, out["outcomes"]
    assert out["outcomes"]["vllm.sparse_attn_indexer.fp8_fp4_mqa_logits"][0] == "skipped"


def test_out_of_range_releases_are_skipped_with_the_range(tmp_path):
    """vLLM 0.35.0 is past every checked range: the pair is skipped there, naming the range, and
    vLLM's own path runs."""
    out = _run(tmp_path, VLLM_025, CALLS_025, {"vllm": "0.35.0"})
    state, reason = out["outcomes"]["vllm.sparse_attn_indexer.fp8_fp4_mqa_logits"]
    assert state == "skipped" and ">=0.22.1,<0.33" in reason
    assert out["outcomes"]["vllm.sparse_attn_indexer.ops"][0] == "skipped"
    assert out["sets"] and out["vllm_topk_calls"] == 1


DECODE_ROUTES = [f"{form} {route}" for form in ("2d", "b1") for route in ("persistent", "cooperative", "per_row")]


@pytest.mark.parametrize("release", ["0.24.0", "0.25.1"])  # the releases whose decode has cooperative_topk
def test_vllm_025_decode_logits_never_materialised(tmp_path, release):
    """vLLM 0.22.1-0.29.0 decode: whichever top-k vLLM picks (torch.ops._C.persistent_topk /
    cooperative_topk, ops.top_k_per_row_decode), the paged logits are a placeholder and the
    indices are vLLM's top-k of the real logits; vLLM's ops are not called, and the replaced
    namespace attribute still answers for the op's overloads."""
    out = _run(tmp_path, VLLM_025, CALLS_025_DECODE, {"vllm": release})
    for route in DECODE_ROUTES:
        assert out[route] == {"sets": True, "untouched": True, "logits_bytes": 4, "vllm_topk_calls": []}, route
    assert out["default"] == "_C.persistent_topk.default"
    names = ("fp8_fp4_paged_mqa_logits", "persistent_topk", "cooperative_topk", "ops")
    assert {out["outcomes"][f"vllm.sparse_attn_indexer.{n}"][0] for n in names} == {"applied"}, out["outcomes"]
    assert out["outcomes"]["vllm.sparse_attn_indexer.get_indexer_topk"][0] == "skipped"


@pytest.mark.parametrize("release,env", [("0.25.1", {"DCP": "2"}),
                                         ("0.25.1", {"SM12X_SKIP": "vllm.sparse_attn_indexer.cooperative_topk"}),
                                         ("0.22.1", {})], ids=["dcp", "one reader skipped", "reader out of range"])
def test_vllm_025_decode_real_logits_unless_every_reader_is_ours(tmp_path, release, env):
    """Real logits and vLLM's own top-k whenever a placeholder could reach a reader that is not
    sm12x's: DCP's merge, a top-k op whose record is skipped, or (0.22.1, older than the
    cooperative_topk record's range) not in range."""
    out = _run(tmp_path, VLLM_025, CALLS_025_DECODE, {"vllm": release}, env=env)
    for route in DECODE_ROUTES:
        real = {"sets": True, "untouched": True, "logits_bytes": 4 * 96 * 4}
        assert {k: v for k, v in out[route].items() if k != "vllm_topk_calls"} == real, route
        assert len(out[route]["vllm_topk_calls"]) == 1, route


SGLANG_0523 = {
    **packages("sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention", "sglang/srt",
               "sglang/srt/layers", "sglang/srt/layers/attention", "sglang/srt/layers/attention/dsv4"),
    # SGLang's transform (its vectorised torch fallback's semantics), shared by every backend here
    "sglang/kernels/ops/attention/dsv4/__init__.py": """
        import torch
        CALLS = []
        def _transform(scores, seq_lens, page_tables, out, page_size, out_raw=None):
            CALLS.append(scores.untyped_storage().nbytes())
            topk = out.shape[1]
            raw = torch.full_like(out, -1)
            for r in range(scores.shape[0]):
                n = int(seq_lens[r])
                if n <= topk:
                    raw[r, :n] = torch.arange(n, dtype=raw.dtype)
                else:
                    raw[r] = torch.topk(scores[r, :n], topk, sorted=False).indices.to(raw.dtype)
            p = raw.clamp(min=0).long()
            out.copy_(torch.where(raw >= 0, page_tables.gather(1, p // page_size).long() * page_size
                                  + p % page_size, -1))
            if out_raw is not None:
                out_raw.copy_(raw)
        def topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
            _transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
        def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                    out_raw_indices=None):
            _transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
    """,
    **packages("sglang/kernels/ops/attention/dsa"),
    "sglang/kernels/ops/attention/dsa/tilelang_kernel.py": """
        def tilelang_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                          max_seq_len, clean_logits=True):
            raise RuntimeError("original tilelang_fp8_paged_mqa_logits: asserts head_dim 128")
    """,
    "deep_gemm/__init__.py": """
        def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                                 clean_logits=False, indices=None):
            raise RuntimeError("original DeepGEMM fp8_paged_mqa_logits: no SM120 kernel")
    """,
    "sglang/srt/layers/attention/dsv4/indexer.py": """
        import torch
        from sglang.kernels.ops.attention.dsv4 import _transform, topk_transform_paged, topk_transform_paged_v2
        from sm12x.kernels.indexer.reference import ref_mqa_logits
        def topk_transform_pytorch_vectorized(scores, seq_lens, page_tables, out_page_indices, page_size,
                                              out_raw_indices=None):
            _transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
        def topk_transform_flashinfer_fused(*args):
            raise RuntimeError("flashinfer not installed")
        def topk_transform_flashinfer_unfused(*args):
            raise RuntimeError("flashinfer not installed")
        def fp8_paged_mqa_logits_torch(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                       max_seq_len, clean_logits=True):
            raise RuntimeError("original fp8_paged_mqa_logits_torch")
        def fp8_paged_mqa_logits_torch_sm120(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                             max_seq_len, clean_logits=True):
            raise RuntimeError("original fp8_paged_mqa_logits_torch_sm120")
        class C4IndexerBackendMixin:
            def paged(self, q, cache, w, c4_seq_lens, page_table, max_len, out, raw, rows_per_chunk):
                # forward_c4_indexer's paged path as SM120 runs it (TileLang, 1-D lengths); with TileLang
                # and the torch logits off, DeepGEMM's imported at call time
                import os
                if os.environ.get("SGLANG_OPT_USE_TILELANG_INDEXER", "1") == "1":
                    from sglang.kernels.ops.attention.dsa.tilelang_kernel import tilelang_fp8_paged_mqa_logits as fn
                else:
                    from deep_gemm import fp8_paged_mqa_logits as fn
                def run_paged_indexer(rows, metadata):
                    logits = fn(q[rows], cache, w[rows], c4_seq_lens[rows], page_table[rows], metadata, max_len, False)
                    topk_transform_paged(logits, c4_seq_lens[rows], page_table[rows], out[rows], 64, raw[rows])
                for r0 in range(0, q.shape[0], rows_per_chunk):
                    run_paged_indexer(slice(r0, min(q.shape[0], r0 + rows_per_chunk)), None)
            @staticmethod
            def _nonpaged_mqa_logits(*, q_indexer, weights, kv, plan, rows):  # DeepGEMM's fp8_mqa_logits
                k, s = kv
                full = ref_mqa_logits(q_indexer[rows].float(), k.float(), s, weights[rows], plan.ks[rows],
                                      plan.ke[rows])
                return torch.nn.functional.pad(full, (0, plan.max_seqlen_k - full.shape[1]))
            def nonpaged(self, v2, q, w, kv, plan, c4_seq_lens, page_table, out, raw, rows_per_chunk):
                # forward_c4_indexer's non-paged loop: logits per row chunk, then the transform
                for r0 in range(0, q.shape[0], rows_per_chunk):
                    rows = slice(r0, min(q.shape[0], r0 + rows_per_chunk))
                    logits = self._nonpaged_mqa_logits(q_indexer=q, weights=w, kv=kv, plan=plan, rows=rows)
                    if v2:
                        topk_transform_paged_v2(logits, c4_seq_lens[rows], page_table[rows], out[rows], 64,
                                                torch.zeros(1), raw[rows])
                    else:
                        topk_transform_paged(logits, c4_seq_lens[rows], page_table[rows], out[rows], 64, raw[rows])
    """,
}

CALLS_SGLANG = """
import json, types, torch
import sglang  # the watcher route
from sglang.srt.layers.attention.dsv4 import indexer
from sglang.kernels.ops.attention import dsv4 as ops
from sm12x.kernels.indexer.cache import quant_fp8_per_token
from sm12x import apply
g = torch.Generator().manual_seed(1)
rows, keys, h, d, topk = 5, 200, 16, 64, 24
q = torch.randn(rows, h, d, generator=g).to(torch.float8_e4m3fn)
k, s = quant_fp8_per_token(torch.randn(keys, d, generator=g))
w = torch.rand(rows, h, generator=g)
c4 = torch.tensor([10, 24, 25, 120, 200], dtype=torch.int32)
plan = types.SimpleNamespace(ks=torch.zeros(rows, dtype=torch.int32), ke=c4.clone(), max_seqlen_k=256)
page_table = torch.randperm(12, generator=g)[:4].int()[None].expand(rows, -1).contiguous()
res = {}
for v2 in (False, True):
    out, raw = (torch.full((rows, topk), 9, dtype=torch.int32) for _ in range(2))
    indexer.C4IndexerBackendMixin().nonpaged(v2, q, w, (k, s), plan, c4, page_table, out, raw, 2)
    want_out, want_raw = (torch.empty_like(out) for _ in range(2))
    full = indexer.C4IndexerBackendMixin._nonpaged_mqa_logits.__sm12x_original__(
        q_indexer=q, weights=w, kv=(k, s), plan=plan, rows=slice(0, rows))
    ops._transform(full, c4, page_table, want_out, 64, want_raw)
    srt = lambda t: [sorted(r.tolist()) for r in t]
    res[f"v2={v2}"] = [srt(out) == srt(want_out), srt(raw) == srt(want_raw), torch.equal(raw[:2], want_raw[:2])]
res["sglang_transform_calls"] = ops.CALLS  # logits bytes of each call SGLang's own transform got
res["module_transform_untouched"] = not hasattr(ops.topk_transform_paged, "__sm12x_patch__")
res["outcomes"] = {k: v[0] for k, v in apply.OUTCOMES.items() if k.startswith("sglang.dsv4.indexer.")}
print(json.dumps(res))
"""


def test_sglang_0523_nonpaged_indexer(tmp_path):
    out = _run(tmp_path, SGLANG_0523, CALLS_SGLANG, {"sglang": "0.5.23"})
    assert out["v2=False"] == [True, True, True] and out["v2=True"] == [True, True, True]
    assert out["module_transform_untouched"]
    assert out["sglang_transform_calls"] == [5 * 256 * 4] * 2  # the reference calls only
    mine = {k: v for k, v in out["outcomes"].items() if "paged_logits_torch" not in k}
    assert len(mine) == 6 and set(mine.values()) == {"applied"}, out["outcomes"]


def test_vllm_025_pair_half_skipped_keeps_real_logits(tmp_path):
    """With the ``ops`` record skipped, vLLM's own top-k would read the placeholder: the logits
    record then returns real logits."""
    out = _run(tmp_path, VLLM_025, CALLS_025, {"vllm": "0.25.1"}, env={"SM12X_SKIP": "vllm.sparse_attn_indexer.ops"})
    assert out["sets"] and out["logits_bytes"] == 6 * 260 * 4 and out["vllm_topk_calls"] == 1


def test_sglang_one_transform_skipped_keeps_real_logits(tmp_path):
    """A transform left as SGLang's would read the placeholder: with any one skipped, the
    non-paged logits are real and every transform gets them."""
    out = _run(tmp_path, SGLANG_0523, CALLS_SGLANG, {"sglang": "0.5.23"},
               env={"SM12X_SKIP": "sglang.dsv4.indexer.topk_transform_flashinfer_unfused"})
    assert out["v2=False"] == [True, True, True] and out["v2=True"] == [True, True, True]
    # per loop: three row chunks (2, 2, 1 rows) of real logits, then the reference call
    assert out["sglang_transform_calls"] == [2 * 256 * 4, 2 * 256 * 4, 256 * 4, 5 * 256 * 4] * 2
    assert out["outcomes"]["sglang.dsv4.indexer.nonpaged_mqa_logits"] == "applied"


CALLS_SGLANG_PAGED = """
import json, torch
import sglang  # the watcher route
from sglang.srt.layers.attention.dsv4 import indexer
from sglang.kernels.ops.attention import dsv4 as ops
from sglang.kernels.ops.attention.dsa import tilelang_kernel
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
from sm12x import apply
g = torch.Generator().manual_seed(3)
rows, h, d, pages, topk = 5, 16, 64, 4, 24
cache = quant_fp8_paged_cache(torch.randn(2 * pages, 64, d, generator=g))
q = torch.randn(rows, 1, h, d, generator=g).to(torch.float8_e4m3fn)
w = torch.rand(rows, h, generator=g)
c4 = torch.tensor([10, 24, 25, 130, 256], dtype=torch.int32)
page_table = torch.randperm(2 * pages, generator=g)[:pages].int()[None].expand(rows, -1).contiguous()
out, raw = (torch.full((rows, topk), 9, dtype=torch.int32) for _ in range(2))
indexer.C4IndexerBackendMixin().paged(q, cache, w, c4, page_table, 256, out, raw, 2)
ref = ref_paged_mqa_logits(q, cache, w, c4, page_table, 256)
want_out, want_raw = (torch.empty_like(out) for _ in range(2))
ops._transform(ref, c4, page_table, want_out, 64, want_raw)
srt = lambda t: [sorted(r) for r in t.tolist()]
direct = tilelang_kernel.tilelang_fp8_paged_mqa_logits(q, cache, w, c4, page_table, None, 256, False)
vis = ref > float("-inf")
res = {"sets": [srt(out) == srt(want_out), srt(raw) == srt(want_raw), torch.equal(raw[:2], want_raw[:2])],
       "sglang_transform_calls": ops.CALLS,
       "direct_call_real": [direct.untyped_storage().nbytes(), float((direct[vis] - ref[vis]).abs().max())],
       "outcomes": {k: v for k, v in apply.OUTCOMES.items() if "paged" in k}}
print(json.dumps(res))
"""


def test_sglang_0523_paged_indexer_sm120_default(tmp_path):
    """SM120's default DeepSeek-V4 indexer (TileLang paged logits for every row): the placeholder
    from ``run_paged_indexer``, real logits (sm12x's kernel, through the DeepGEMM record's
    replacement) for a direct call: the placeholder is a layer of the DeepGEMM-route record."""
    out = _run(tmp_path, SGLANG_0523, CALLS_SGLANG_PAGED, {"sglang": "0.5.23"})
    assert out["sets"] == [True, True, True] and out["sglang_transform_calls"] == [5 * 256 * 4]
    assert out["direct_call_real"][0] == 5 * 256 * 4 and out["direct_call_real"][1] < 1e-2
    states = out["outcomes"]
    assert states["sglang.dsv4.paged_indexer.tilelang"] == ["applied", ""], states
    assert states["sglang.dsa.tilelang_paged_logits"] == ["applied", ""], states


def test_sglang_dsv4_paged_indexer_through_deep_gemm(tmp_path):
    """The DeepSeek-V4 paged indexer with TileLang and the torch logits off (DeepGEMM's
    fp8_paged_mqa_logits, imported at call time, per row chunk): the placeholder for
    ``run_paged_indexer``, sm12x's real logits for a direct call: the placeholder is a layer of the
    DeepGEMM record."""
    code = CALLS_SGLANG_PAGED.replace("from sglang.kernels.ops.attention.dsa import tilelang_kernel",
                                      "import deep_gemm").replace(
        "tilelang_kernel.tilelang_fp8_paged_mqa_logits(", "deep_gemm.fp8_paged_mqa_logits(")
    out = _run(tmp_path, SGLANG_0523, code, {"sglang": "0.5.23", "sgl-deep-gemm": "0.2.3.post2"},
               env={"SGLANG_OPT_USE_TILELANG_INDEXER": "0"})
    assert out["sets"] == [True, True, True] and out["sglang_transform_calls"] == [5 * 256 * 4]
    assert out["direct_call_real"][0] == 5 * 256 * 4 and out["direct_call_real"][1] < 1e-2
    states = out["outcomes"]
    assert states["sglang.dsv4.paged_indexer.deep_gemm"] == ["applied", ""], states
    assert states["deep_gemm.fp8_paged_mqa_logits"] == ["applied", ""], states
    # a transform left as SGLang's: real logits for every row chunk
    out = _run(tmp_path / "skip", SGLANG_0523, code, {"sglang": "0.5.23", "sgl-deep-gemm": "0.2.3.post2"},
               env={"SGLANG_OPT_USE_TILELANG_INDEXER": "0", "SM12X_SKIP": "sglang.dsv4.indexer.topk_transform_paged"})
    assert out["sets"] == [True, True, True]
    assert out["sglang_transform_calls"] == [2 * 256 * 4, 2 * 256 * 4, 256 * 4, 5 * 256 * 4]


SGLANG_0523_DSA = {
    **packages("sglang", "sglang/srt", "sglang/srt/layers", "sglang/srt/layers/attention",
               "sglang/srt/layers/attention/dsa", "sglang/kernels", "sglang/kernels/ops",
               "sglang/kernels/ops/attention"),
    "sglang/srt/layers/attention/dsa/utils.py": """
        import functools
        from sm12x.kernels.indexer.reference import ref_mqa_logits
        CALLS = []
        def _fp8_mqa_logits(q_fp8, kv, weights, ks, ke, clean_logits=False, max_seqlen_k=0):  # DeepGEMM's
            CALLS.append(q_fp8.shape[0])
            return ref_mqa_logits(q_fp8.float(), kv[0].float(), kv[1], weights, ks, ke)
        fp8_mqa_logits = _fp8_mqa_logits  # (the 0.5.19 stand-in binds this module as its deep_gemm)
        @functools.lru_cache(maxsize=1)
        def resolve_fp8_mqa_logits_fn():
            return _fp8_mqa_logits
        from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
        PAGED_CALLS = []
        def _fp8_paged_mqa_logits(q, kv_cache, w, context_lens, block_table, schedule, max_len, clean_logits=False):
            PAGED_CALLS.append(q.shape[0] * q.shape[1])
            return ref_paged_mqa_logits(q, kv_cache, w, context_lens, block_table, max_len)
        fp8_paged_mqa_logits = _fp8_paged_mqa_logits
        def resolve_fp8_paged_mqa_logits_fn():
            return _fp8_paged_mqa_logits
    """,
    # SGLang's wrappers around DeepGEMM's paged logits (kernels/ops/attention/dsa/paged_mqa_logits.py)
    "sglang/kernels/ops/attention/dsa/__init__.py": """
        def deepgemm_paged_mqa_logits_native(fn, q_fp8, kv_cache_fp8, weights, ctx_lens_2d, block_tables,
                                             schedule_metadata, max_seq_len, *, q_offset, B, next_n):
            return fn(q_fp8[:q_offset].view(B, next_n, q_fp8.shape[1], q_fp8.shape[2]), kv_cache_fp8,
                      weights[:q_offset], ctx_lens_2d, block_tables[::next_n], schedule_metadata, max_seq_len,
                      clean_logits=False)
        def deepgemm_paged_mqa_logits_split(fn, q_fp8, kv_cache_fp8, weights, ctx_lens_2d, block_tables,
                                            schedule_metadata, max_seq_len, *, q_offset):
            return fn(q_fp8.unsqueeze(1)[:q_offset], kv_cache_fp8, weights[:q_offset], ctx_lens_2d, block_tables,
                      schedule_metadata, max_seq_len, clean_logits=False)
    """,
    # SGLang's top-k step (its torch backend's _topk_unfused, and sgl-kernel's fused transforms:
    # RAGGED adds the row's ragged-KV offset, PAGED maps through the page_size=1 table of the
    # row's request, found from cu_seqlens_q)
    "sglang/srt/layers/attention/dsa/dsa_topk_backend.py": """
        import enum, os, types
        import torch
        class _Flag:
            def __init__(self, name, default):
                self.name, self.default = name, default
            def get(self):
                value = os.environ.get(self.name, self.default)
                return value if value in (None, "small", "large") else value == "1"
        envs = types.SimpleNamespace(SGLANG_DSA_FUSE_TOPK=_Flag("SGLANG_DSA_FUSE_TOPK", "1"),
                                     SGLANG_OPT_USE_TOPK_V2=_Flag("SGLANG_OPT_USE_TOPK_V2", "1"),
                                     SGLANG_DSA_TOPK_FLASHINFER_TIE_BREAK=_Flag("SGLANG_DSA_TOPK_FLASHINFER_TIE_BREAK",
                                                                                None))
        CALLS = []
        class TopkTransformMethod(enum.IntEnum):
            PAGED = 1
            RAGGED = 2
        def _topk_unfused(score, lengths, topk, row_starts=None):
            out = torch.full((score.shape[0], topk), -1, dtype=torch.int32)
            starts = torch.zeros_like(lengths) if row_starts is None else row_starts
            cols = torch.arange(score.shape[1])[None, :]
            valid = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
            n = min(topk, score.shape[1])
            vals, idx = score.masked_fill(~valid, float("-inf")).topk(n, dim=-1)
            out[:, :n] = (idx.int() - starts[:, None]).masked_fill(vals == float("-inf"), -1)
            return out
        class DSATopKBackend(enum.Enum):
            SGL_KERNEL = "sgl-kernel"
            TORCH = "torch"
            FLASHINFER = "flashinfer"
            def should_use_topk_v2(self):
                return self == DSATopKBackend.SGL_KERNEL and envs.SGLANG_OPT_USE_TOPK_V2.get()
            def topk_transform(self, logits, lengths, topk, topk_transform_method, attn_metadata,
                               cu_seqlens_q_topk=None, topk_indices_offset=None, row_starts=None,
                               batch_idx_list=None, force_unfused_topk=False):
                CALLS.append(logits.untyped_storage().nbytes())
                raw = _topk_unfused(logits, lengths, topk, row_starts)
                if not envs.SGLANG_DSA_FUSE_TOPK.get() or force_unfused_topk:
                    return raw
                if (self.should_use_topk_v2() and topk_transform_method == TopkTransformMethod.PAGED
                        and row_starts is None and batch_idx_list is None and 0 < topk <= 2048
                        and lengths.shape[0] == logits.shape[0] == attn_metadata.real_page_table.shape[0]):
                    # the v2 kernel: the indexer's own page table
                    p, size = raw.clamp(min=0).long(), attn_metadata.page_size
                    slots = attn_metadata.real_page_table.gather(1, p // size) * size + p % size
                    return torch.where(raw >= 0, slots, -1)
                if self == DSATopKBackend.TORCH:
                    raise RuntimeError("Unsupported self for SGLANG_DSA_FUSE_TOPK")
                if topk_transform_method == TopkTransformMethod.RAGGED:
                    return torch.where(raw >= 0, raw + topk_indices_offset[:, None], -1)
                table = attn_metadata.page_table_1
                table = table if batch_idx_list is None else table[batch_idx_list]
                cu = cu_seqlens_q_topk.tolist()
                # decode form (sgl-kernel: a table row per logits row; FlashInfer: a request per row)
                per_row = table.shape[0] if self == DSATopKBackend.SGL_KERNEL else len(cu) - 1
                if row_starts is None and per_row == raw.shape[0]:
                    cu = list(range(raw.shape[0] + 1))
                owner = [next(b for b in range(len(cu) - 1) if cu[b] <= i < cu[b + 1]) for i in range(raw.shape[0])]
                slots = table[torch.tensor(owner)[:, None], raw.clamp(min=0).long()]
                return torch.where(raw >= 0, slots, -1)
    """,
    # DSAIndexer._get_topk_ragged: logits for the extend rows (in row chunks past the budget),
    # init / local token marks written into them, then metadata.topk_transform
    "sglang/srt/layers/attention/dsa/dsa_indexer.py": """
        import dataclasses
        import torch
        from sglang.srt.layers.attention.dsa.utils import resolve_fp8_mqa_logits_fn
        from sglang.srt.layers.attention.dsa.utils import resolve_fp8_paged_mqa_logits_fn
        from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend, TopkTransformMethod
        from sglang.kernels.ops.attention.dsa import deepgemm_paged_mqa_logits_native, deepgemm_paged_mqa_logits_split
        @dataclasses.dataclass(frozen=True)
        class DSAIndexerMetadata:
            attn_metadata: object
            topk_transform_method: TopkTransformMethod
            topk_backend: DSATopKBackend = DSATopKBackend.SGL_KERNEL
            force_unfused_topk: bool = False
            def topk_transform(self, logits, topk, ks=None, cu_seqlens_q=None, ke_offset=None, batch_idx_list=None,
                               topk_indices_offset_override=None):
                a = self.attn_metadata
                if topk_indices_offset_override is not None:
                    cu, offset = None, topk_indices_offset_override
                elif cu_seqlens_q is not None:
                    cu = torch.nn.functional.pad(cu_seqlens_q.cumsum(0), (1, 0)).int()
                    offset = torch.repeat_interleave(cu[:-1], cu_seqlens_q)
                else:
                    cu, offset = a.cu_seqlens_q, a.topk_indices_offset
                lengths = a.seqlens_expanded if ke_offset is None else ke_offset
                return self.topk_backend.topk_transform(logits, lengths, topk, self.topk_transform_method, a, cu,
                                                        offset, ks, batch_idx_list, self.force_unfused_topk)
        class DSAIndexer:
            def __init__(self, topk, init_tokens=0):
                self.index_topk, self.num_init_tokens, self.num_local_tokens = topk, init_tokens, 0
            def _mask_init_and_local_tokens(self, logits, lengths, row_starts=None):
                if self.num_init_tokens == 0 and self.num_local_tokens == 0:
                    return logits
                row_starts = torch.zeros_like(lengths) if row_starts is None else row_starts
                idx = row_starts[:, None].long() + torch.arange(self.num_init_tokens)[None, :]
                logits.scatter_(1, idx, float("inf"))
            def _get_topk_paged(self, q_fp8, weights, metadata, kv_cache_fp8, q_offset, next_n, sm_count):
                a = metadata.attn_metadata
                block_tables, seqlens_32 = a.real_page_table, a.seqlens_expanded
                max_seq_len, B = block_tables.shape[1] * 64, q_offset // next_n
                ctx_2d = a.paged_mqa_ctx_lens_2d
                use_dg_native = next_n >= 2 and ctx_2d is not None and ctx_2d.shape == (B, next_n)
                seqlens_32_2d = ctx_2d if use_dg_native else seqlens_32.reshape(-1, 1).contiguous()
                def _chunked(q, kv_cache, w, context_lens, block_table, schedule, max_len, clean_logits=False):
                    batch_size, chunk_next_n = q.shape[:2]
                    if batch_size <= sm_count:
                        return resolve_fp8_paged_mqa_logits_fn()(q, kv_cache, w, context_lens, block_table, schedule,
                                                                 max_len, clean_logits=clean_logits)
                    return torch.cat([resolve_fp8_paged_mqa_logits_fn()(
                        q[s:s + sm_count], kv_cache, w[s * chunk_next_n:(s + sm_count) * chunk_next_n],
                        context_lens[s:s + sm_count], block_table[s:s + sm_count], None, max_len,
                        clean_logits=clean_logits) for s in range(0, batch_size, sm_count)])
                fn = _chunked
                if use_dg_native:
                    logits = deepgemm_paged_mqa_logits_native(fn, q_fp8, kv_cache_fp8, weights, seqlens_32_2d,
                                                              block_tables, None, max_seq_len, q_offset=q_offset,
                                                              B=B, next_n=next_n)
                else:
                    logits = deepgemm_paged_mqa_logits_split(fn, q_fp8, kv_cache_fp8, weights, seqlens_32_2d,
                                                             block_tables, None, max_seq_len, q_offset=q_offset)
                self._mask_init_and_local_tokens(logits, seqlens_32)
                topk_result = metadata.topk_transform(logits, self.index_topk)
                if q_offset < q_fp8.shape[0]:
                    pad = torch.full((q_fp8.shape[0] - q_offset, topk_result.shape[1]), -1, dtype=topk_result.dtype)
                    topk_result = torch.cat([topk_result, pad], dim=0)
                return topk_result, logits
            def _get_topk_ragged(self, q_fp8, kv_fp8, weights, metadata, max_rows):
                a = metadata.attn_metadata
                ks, ke, lengths, rows = a.ks, a.ke, a.seqlens_expanded, q_fp8.shape[0]
                if max_rows >= rows:
                    logits = resolve_fp8_mqa_logits_fn()(q_fp8, kv_fp8, weights, ks, ke, clean_logits=False)
                    self._mask_init_and_local_tokens(logits, lengths, ks)
                    return metadata.topk_transform(logits, self.index_topk, ks=ks), logits
                out = torch.full((rows, self.index_topk), -1, dtype=torch.int32)
                for start in range(0, rows, max_rows):
                    end = min(rows, start + max_rows)
                    logits = resolve_fp8_mqa_logits_fn()(q_fp8[start:end], kv_fp8, weights[start:end], ks[start:end],
                                                         ke[start:end], clean_logits=False)
                    self._mask_init_and_local_tokens(logits, lengths[start:end], ks[start:end])
                    ragged = a.topk_indices_offset is not None  # else each row is its own sequence
                    out[start:end] = metadata.topk_transform(
                        logits, self.index_topk, ks=ks[start:end], ke_offset=lengths[start:end],
                        cu_seqlens_q=None if ragged else torch.ones(end - start, dtype=torch.int32),
                        batch_idx_list=None if ragged else a.token_to_batch_idx[start:end],
                        topk_indices_offset_override=a.topk_indices_offset[start:end] if ragged else None)
                return out, logits
    """,
}

# SGLang 0.5.15.post1-0.5.19: the same indexer calling the module-level deep_gemm's fp8_mqa_logits
SGLANG_0519_DSA = {
    **SGLANG_0523_DSA,
    "sglang/srt/layers/attention/dsa/dsa_indexer.py": SGLANG_0523_DSA["sglang/srt/layers/attention/dsa/dsa_indexer.py"]
    .replace("from sglang.srt.layers.attention.dsa.utils import resolve_fp8_mqa_logits_fn",
             "from sglang.srt.layers.attention.dsa import utils as deep_gemm")
    .replace("resolve_fp8_mqa_logits_fn()(", "deep_gemm.fp8_mqa_logits(")
    .replace("fn = _chunked", "fn = deep_gemm.fp8_paged_mqa_logits"),  # no SM-count split before 0.5.20
}
# SGLang 0.5.20-0.5.21: the module-level deep_gemm for prefill, decode split by SM count as in 0.5.23
SGLANG_0521_DSA = {
    **SGLANG_0523_DSA,
    "sglang/srt/layers/attention/dsa/dsa_indexer.py": SGLANG_0523_DSA["sglang/srt/layers/attention/dsa/dsa_indexer.py"]
    .replace("from sglang.srt.layers.attention.dsa.utils import resolve_fp8_mqa_logits_fn",
             "from sglang.srt.layers.attention.dsa import utils as deep_gemm")
    .replace("resolve_fp8_mqa_logits_fn()(", "deep_gemm.fp8_mqa_logits(")
    .replace("resolve_fp8_paged_mqa_logits_fn()(", "deep_gemm.fp8_paged_mqa_logits("),
}
# (tree, release, whether decode splits its rows by SM count), 0.5.22 being 0.5.23's shape
DSA_RELEASES = [(SGLANG_0523_DSA, "0.5.23", True), (SGLANG_0523_DSA, "0.5.22", True),
                (SGLANG_0521_DSA, "0.5.21", True), (SGLANG_0519_DSA, "0.5.19", False)]
DSA_IDS = [r[1] for r in DSA_RELEASES]

CALLS_SGLANG_DSA = """
import json, os, types, torch
import sglang  # the watcher route
from sglang.srt.layers.attention.dsa import dsa_indexer, dsa_topk_backend as backend, utils
from sm12x.kernels.indexer.cache import quant_fp8_per_token
from sm12x import apply
g = torch.Generator().manual_seed(4)
h, d, topk = 16, 64, 24
new, prefix = [3, 2], [150, 90]  # two requests' extend rows over their gathered keys
ks, lengths, start = [], [], 0
for n, p in zip(new, prefix):
    ks += [start] * n
    lengths += [p + t + 1 for t in range(n)]
    start += p + n
rows, keys = len(ks), start
ks, lengths = torch.tensor(ks, dtype=torch.int32), torch.tensor(lengths, dtype=torch.int32)
q = torch.randn(rows, h, d, generator=g).to(torch.float8_e4m3fn)
kv = quant_fp8_per_token(torch.randn(keys, d, generator=g))
w = torch.rand(rows, h, generator=g)
method = getattr(backend.TopkTransformMethod, os.environ.get("METHOD", "RAGGED"))
attn = types.SimpleNamespace(ks=ks, ke=ks + lengths, seqlens_expanded=lengths,
                             topk_indices_offset=ks + 1000 if method.name == "RAGGED" else None,
                             cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32),
                             token_to_batch_idx=torch.tensor([0, 0, 0, 1, 1]),
                             page_table_1=torch.randperm(4 * keys, generator=g)[:2 * 160].int().view(2, 160))
topk_backend = getattr(backend.DSATopKBackend, os.environ.get("BACKEND", "SGL_KERNEL"))
res = {}
for max_rows in (rows, 2):
    metadata = dsa_indexer.DSAIndexerMetadata(attn, method, topk_backend)
    utils.CALLS.clear()
    got, logits = dsa_indexer.DSAIndexer(topk, int(os.environ.get("INIT", "0")))._get_topk_ragged(q, kv, w, metadata,
                                                                                                 max_rows)
    logits_calls = list(utils.CALLS)
    real = utils._fp8_mqa_logits(q, kv, w, ks, ks + lengths)
    if int(os.environ.get("INIT", "0")):
        dsa_indexer.DSAIndexer(topk, int(os.environ["INIT"]))._mask_init_and_local_tokens(real, lengths, ks)
    sglang_transform = backend.DSATopKBackend.topk_transform
    want = getattr(sglang_transform, "__sm12x_original__", sglang_transform)(
        topk_backend, real, lengths, topk, method, attn, attn.cu_seqlens_q, attn.topk_indices_offset, ks)
    res[f"max_rows={max_rows}"] = {"sets": [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()],
                                   "logits_bytes": logits.untyped_storage().nbytes(), "logits_calls": logits_calls}
res["outcomes"] = {k: v for k, v in apply.OUTCOMES.items() if k.startswith("sglang.dsa.ragged_indexer")}
print(json.dumps(res))
"""


@pytest.mark.parametrize("tree,release,sm_split", DSA_RELEASES, ids=DSA_IDS)
@pytest.mark.parametrize("env", [{}, {"METHOD": "PAGED"}, {"SGLANG_DSA_FUSE_TOPK": "0", "METHOD": "PAGED"}],
                         ids=["ragged", "paged", "unfused"])
def test_sglang_dsa_ragged_prefill(tmp_path, env, tree, release, sm_split):
    """SGLang's DSA ragged prefill (whole batch, and row chunks under the logits budget): the
    logits are a placeholder and the indices SGLang's top-k of the real logits, row-local
    (unfused), plus the ragged-KV offset (fused RAGGED) or as page slots of the row's request
    (fused PAGED: per request in one call, per row with batch_idx_list in row chunks)."""
    out = _run(tmp_path, tree, CALLS_SGLANG_DSA, {"sglang": release}, env=env)
    for case in ("max_rows=5", "max_rows=2"):
        assert out[case] == {"sets": True, "logits_bytes": 4, "logits_calls": []}, (case, out[case])
    seam = "resolve_fp8_mqa_logits_fn" if release in ("0.5.22", "0.5.23") else "deep_gemm"
    applied = {k.rpartition(".")[2] for k, v in out["outcomes"].items() if v[0] == "applied"}
    assert applied == {seam, "topk_transform"}, out["outcomes"]


@pytest.mark.parametrize("tree,release,sm_split", DSA_RELEASES, ids=DSA_IDS)
@pytest.mark.parametrize("env", [{"METHOD": "PAGED", "BACKEND": "FLASHINFER"}, {"INIT": "2"}],
                         ids=["flashinfer paged", "init tokens"])
def test_sglang_dsa_keeps_real_logits(tmp_path, env, tree, release, sm_split):
    """FlashInfer's PAGED transform (sm12x does not write it) and init-token marks (written into
    the logits) get real logits and SGLang's own top-k."""
    out = _run(tmp_path, tree, CALLS_SGLANG_DSA, {"sglang": release}, env=env)
    assert out["max_rows=5"] == {"sets": True, "logits_bytes": 5 * 245 * 4, "logits_calls": [5]}
    assert out["max_rows=2"]["sets"] and out["max_rows=2"]["logits_calls"] == [2, 2, 1]


def test_sglang_dsa_out_of_range(tmp_path):
    """A release past the checked ranges (0.5.24) keeps SGLang's own logits and top-k."""
    out = _run(tmp_path, SGLANG_0523_DSA, CALLS_SGLANG_DSA, {"sglang": "0.5.24"})
    assert out["max_rows=5"]["sets"] and out["max_rows=5"]["logits_calls"] == [5]
    state, reason = out["outcomes"]["sglang.dsa.ragged_indexer.topk_transform"]
    assert state == "skipped" and ">=0.5.15,<0.5.24" in reason


CALLS_SGLANG_DSA_PAGED = """
import json, os, types, torch
import sglang  # the watcher route
from sglang.srt.layers.attention.dsa import dsa_indexer, dsa_topk_backend as backend, utils
from sm12x import apply
from tests.kernels.indexer.test_paged_mqa_logits import make_paged
b, next_n, h, d, topk = 3, int(os.environ.get("NEXT_N", "1")), 16, 64, 24
inp = make_paged(b, next_n, h, d, 64, [20, 100, 150], False, "cpu", ctx2d=True, seed=6)
(q4, _), cache, w, ctx, bt = inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"]
rows = b * next_n
q = torch.cat([q4.reshape(rows, h, d), q4.reshape(rows, h, d)[:1]])  # a padding row past q_offset
w = torch.cat([w, w[:1]])
lengths = ctx.reshape(-1).contiguous()
g = torch.Generator().manual_seed(3)
per_request = os.environ.get("BACKEND") == "FLASHINFER"  # FlashInfer maps rows through cu_seqlens_q
table_1 = torch.randperm(4096, generator=g)[:rows * 192].int().view(rows, 192)
attn = types.SimpleNamespace(real_page_table=bt.repeat_interleave(next_n, dim=0), page_size=64,
                             page_table_1=table_1[::next_n] if per_request else table_1,
                             seqlens_expanded=lengths, cu_seqlens_q=torch.arange(0, rows + 1, next_n, dtype=torch.int32),
                             paged_mqa_ctx_lens_2d=ctx if os.environ.get("CTX_2D") else None, topk_indices_offset=None)
method = backend.TopkTransformMethod.PAGED
topk_backend = getattr(backend.DSATopKBackend, os.environ.get("BACKEND", "SGL_KERNEL"))
metadata = dsa_indexer.DSAIndexerMetadata(attn, method, topk_backend)
indexer = dsa_indexer.DSAIndexer(topk, int(os.environ.get("INIT", "0")))
got, logits = indexer._get_topk_paged(q, w, metadata, cache, rows, next_n, sm_count=2)
real = utils._fp8_paged_mqa_logits(q4, cache, w[:rows], ctx, bt, None, 192)
indexer._mask_init_and_local_tokens(real, lengths)
sglang_transform = backend.DSATopKBackend.topk_transform
want = getattr(sglang_transform, "__sm12x_original__", sglang_transform)(
    topk_backend, real, lengths, topk, method, attn, attn.cu_seqlens_q, None)
res = {"sets": [sorted(r) for r in got[:rows].tolist()] == [sorted(r) for r in want.tolist()],
       "pad": got[rows:].tolist() == [[-1] * topk], "logits_bytes": logits.untyped_storage().nbytes(),
       "logits_calls": utils.PAGED_CALLS[:-1],
       "outcomes": {k: v for k, v in apply.OUTCOMES.items() if k.startswith("sglang.dsa.paged_indexer")}}
print(json.dumps(res))
"""
PAGED_FORMS = {"decode": {}, "verify native": {"NEXT_N": "2", "CTX_2D": "1"}, "verify split": {"NEXT_N": "2"}}


@pytest.mark.parametrize("tree,release,sm_split", DSA_RELEASES, ids=DSA_IDS)
@pytest.mark.parametrize("form", list(PAGED_FORMS))
@pytest.mark.parametrize("env", [{}, {"SGLANG_OPT_USE_TOPK_V2": "0"}, {"BACKEND": "FLASHINFER"},
                                 {"SGLANG_DSA_FUSE_TOPK": "0"}], ids=["v2", "sgl-kernel", "flashinfer", "unfused"])
def test_sglang_dsa_paged_decode_and_verify(tmp_path, env, form, tree, release, sm_split):
    """SGLang's DSA decode (a row per request), MTP verify through the native wrapper ([B, next_n]
    context lengths) and through the split one (a row per request): the logits are a placeholder
    (no paged-logits call, no SM-count split) and the indices SGLang's PAGED transform of the real
    logits: the v2 kernel's page slots, sgl-kernel's through the page_size=1 table, FlashInfer's
    through the row's request, or positions (unfused); the padding row stays -1."""
    out = _run(tmp_path, tree, CALLS_SGLANG_DSA_PAGED, {"sglang": release}, env={**env, **PAGED_FORMS[form]})
    assert out["sets"] and out["pad"] and out["logits_bytes"] == 4 and out["logits_calls"] == [], out
    applied = {k.rpartition(".")[2] for k, v in out["outcomes"].items() if v[0] == "applied"}
    assert applied == {"deepgemm_paged_mqa_logits_split", "deepgemm_paged_mqa_logits_native"}, out["outcomes"]


@pytest.mark.parametrize("tree,release,sm_split", DSA_RELEASES, ids=DSA_IDS)
@pytest.mark.parametrize("env", [{"INIT": "2"}, {"BACKEND": "FLASHINFER", "SGLANG_DSA_TOPK_FLASHINFER_TIE_BREAK": "large"},
                                 {"SM12X_SKIP": "sglang.dsa.ragged_indexer.topk_transform", "NEXT_N": "2",
                                  "CTX_2D": "1"}],
                         ids=["init tokens", "flashinfer tie-break", "transform not applied"])
def test_sglang_dsa_paged_keeps_real_logits(tmp_path, env, tree, release, sm_split):
    """Init-token marks (written into the logits), a FlashInfer tie-break the user set, and a
    top-k transform left as SGLang's get real logits (0.5.20 on: split by SM count) and SGLang's own
    top-k."""
    out = _run(tmp_path, tree, CALLS_SGLANG_DSA_PAGED, {"sglang": release}, env=env)
    rows = 6 if env.get("NEXT_N") == "2" else 3
    assert out["sets"] and out["pad"] and out["logits_bytes"] == rows * 192 * 4, out
    native = env.get("CTX_2D") is not None  # the SM-count split counts requests (next_n rows each)
    want_calls = ([4, 2] if native else [2, 1]) if sm_split else [rows]
    assert out["logits_calls"] == want_calls, out


def test_sglang_dsa_paged_out_of_range(tmp_path):
    """Past the checked ranges (0.5.24) the decode keeps SGLang's own paged logits and top-k."""
    out = _run(tmp_path, SGLANG_0523_DSA, CALLS_SGLANG_DSA_PAGED, {"sglang": "0.5.24"})
    assert out["sets"] and out["logits_bytes"] == 3 * 192 * 4 and out["logits_calls"] == [2, 1], out
    state, reason = out["outcomes"]["sglang.dsa.paged_indexer.deepgemm_paged_mqa_logits_split"]
    assert state == "skipped" and ">=0.5.15,<0.5.24" in reason

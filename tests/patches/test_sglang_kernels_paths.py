"""SGLang 0.5.16 moved its kernel modules under ``sglang.kernels``: from that release the SM120
FlashMLA entry (``sglang.kernels.ops.attention.flash_mla_sm120``) and the TileLang paged indexer
(``sglang.kernels.ops.attention.dsa.tilelang_kernel``, star-imported by the deprecated nsa shim)
live only there, and the ``sglang.srt`` records stop at 0.5.15.post1. Stand-ins shaped like
0.5.16-0.5.18: the originals fail as they do on SM12x, the records' replacements give the
reference's results, and a release before 0.5.16 leaves them alone."""
import pytest
from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ERR = "Unsupported architecture for sparse decode fwd"

KERNELS_LAYOUT = {
    "sglang/__init__.py": "",
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/attention/__init__.py": "",
    "sglang/kernels/ops/attention/flash_mla_sm120.py":
        f"def flash_mla_with_kvcache_sm120(**kwargs):\n    raise RuntimeError({ERR!r})\n",
    "sglang/kernels/ops/attention/dsa/__init__.py": "",
    # the original asserts 1-D lengths (one query token per row)
    "sglang/kernels/ops/attention/dsa/tilelang_kernel.py":
        "def tilelang_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table,\n"
        "                                  deep_gemm_metadata, max_seq_len, clean_logits=True):\n"
        "    assert seq_lens.dim() == 1\n"
        "    raise RuntimeError('original tilelang_fp8_paged_mqa_logits')\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/nsa/__init__.py": "",
    "sglang/srt/layers/attention/nsa/tilelang_kernel.py":
        "from sglang.kernels.ops.attention.dsa.tilelang_kernel import *  # noqa\n",
}

CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
# the nsa shim's star-import copy is taken before sm12x (plugin route)
from sglang.srt.layers.attention.nsa import tilelang_kernel as shim
import sm12x.plugin; sm12x.plugin.register()
from sglang.kernels.ops.attention.dsa import tilelang_kernel
from sglang.kernels.ops.attention import flash_mla_sm120 as s120
from sm12x.kernels.common.tolerance import deepgemm_diff
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode

res = {{}}
g = torch.Generator().manual_seed(0)
b, h, d, bkv, blocks = 2, 16, 64, 64, 2
cache = quant_fp8_paged_cache(torch.randn(b * blocks, bkv, d, generator=g))
q = torch.randn(b, 1, h, d, generator=g).to(torch.float8_e4m3fn)
w = torch.randn(b, h, generator=g)
lens = torch.tensor([[17], [100]], dtype=torch.int32)  # [T, 1], which the original asserts against
bt = torch.arange(b * blocks, dtype=torch.int32).view(b, blocks)
ref = ref_paged_mqa_logits(q, cache, w, lens, bt, blocks * bkv, clean_logits=True)
inv = ref == float("-inf")
for name, fn in (("tilelang", tilelang_kernel.tilelang_fp8_paged_mqa_logits),
                 ("tilelang_shim", shim.tilelang_fp8_paged_mqa_logits)):
    try:
        out = fn(q, cache, w, lens, bt, None, blocks * bkv, False)
        res[name] = deepgemm_diff(out.float().masked_fill(inv, 0), ref.masked_fill(inv, 0))
    except Exception as e:
        res[name] = type(e).__name__

case = make_case(b=1, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2,
                 extra_topk_length=True)
ref_out, _ = ref_sparse_mla_decode(**case)
try:
    # the keyword call of deepseek_v4_backend.py (0.5.15.post1-0.5.19)
    out = s120.flash_mla_with_kvcache_sm120(
        q=case["q"], k_cache=case["k_cache"], head_dim_v=512, softmax_scale=case["softmax_scale"],
        indices=case["indices"], topk_length=case["topk_length"], attn_sink=case["attn_sink"],
        extra_k_cache=case["extra_k_cache"], extra_indices_in_kvcache=case["extra_indices"],
        extra_topk_length=case["extra_topk_length"])[0]
    res["flash_mla_sm120"] = float((out.float() - ref_out.float()).abs().max())
except RuntimeError as e:
    res["flash_mla_sm120"] = str(e)
from sm12x import apply
res["outcomes"] = {{k: v[0] for k, v in apply.OUTCOMES.items()}}
print(json.dumps(res))
"""


@pytest.mark.parametrize("release,ours", [("0.5.15.post1", False), ("0.5.16", True), ("0.5.18", True)])
def test_kernels_layout_records(tmp_path, release, ours):
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**KERNELS_LAYOUT, **dist_infos({"sglang": release})})
    out = last_json(run_py(CALLS.format(repo=REPO), pythonpath=[root],
                           env={"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}))
    states = out["outcomes"]
    if ours:
        for name in ("tilelang", "tilelang_shim"):
            assert isinstance(out[name], float) and out[name] < 1e-5, (name, out)
        assert isinstance(out["flash_mla_sm120"], float) and out["flash_mla_sm120"] <= 1e-2, out
        assert states["sglang.flash_mla_sm120"] == "applied", states
        assert states["sglang.dsa.tilelang_paged_logits"] == "applied", states
    else:
        assert out["tilelang"] == out["tilelang_shim"] == "AssertionError", out
        assert out["flash_mla_sm120"] == ERR, out
        assert states["sglang.flash_mla_sm120"] != "applied", states
    # the 0.5.15.post1 module paths are gone from this layout (and out of range from 0.5.16)
    assert states.get("sglang.flash_mla_sm120.era_b") != "applied", states

"""The real DeepGEMM patch set on stand-ins: a ``deep_gemm`` whose indexer functions raise
DeepGEMM's SM12x error, vLLM's ``vllm.utils.deep_gemm`` that caches the module's functions in
``_*_impl`` globals (resolved before sm12x ran: the plugin route), SGLang's torch fallback that
asserts 1-D ``seq_lens``, and the TileLang / torch paths SGLang forces on SM120."""
import textwrap

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ERR = "Unsupported architecture (attention.hpp:211)"
NAMES = ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata",
         "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits")

def sglang_paged(name, check="pass"):
    """An SGLang paged-logits function with the torch fallback's signature that fails as the
    original would on SM12x (``check``: the original's own assertion, run first)."""
    return (f"def {name}(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,\n"
            f"        max_seq_len, clean_logits=True):\n    {check}\n"
            f"    raise RuntimeError('original {name}')\n")


STANDINS = {
    "deep_gemm/__init__.py": "".join(
        f"def {n}(*args, **kwargs):\n    raise RuntimeError({ERR!r})\n" for n in NAMES)
        + "def fp8_gemm_nt(*args, **kwargs):\n    return 'original-gemm'\n",
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/deep_gemm.py": textwrap.dedent("""
        _fp8_fp4_paged_mqa_logits_impl = None
        def _lazy_init():
            global _fp8_fp4_paged_mqa_logits_impl
            import deep_gemm
            _fp8_fp4_paged_mqa_logits_impl = deep_gemm.fp8_paged_mqa_logits
        def fp8_fp4_paged_mqa_logits(q, *args, **kwargs):
            _lazy_init() if _fp8_fp4_paged_mqa_logits_impl is None else None
            return _fp8_fp4_paged_mqa_logits_impl(q[0], *args, **kwargs)
    """),
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/dsv4/__init__.py": "",
    "sglang/srt/layers/attention/dsv4/indexer.py": sglang_paged(
        "fp8_paged_mqa_logits_torch", "assert seq_lens.dim() == 1")
        + sglang_paged("fp8_paged_mqa_logits_torch_sm120"),
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/attention/__init__.py": "",
    "sglang/kernels/ops/attention/dsa/__init__.py": "",
    "sglang/kernels/ops/attention/dsa/tilelang_kernel.py": sglang_paged(
        "tilelang_fp8_paged_mqa_logits", "assert seq_lens.dim() == 1 and q_fp8.shape[1] == 1"),
}

CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
from sm12x.kernels.common.tolerance import deepgemm_diff

# the framework imported and resolved DeepGEMM before sm12x was installed (plugin route)
import vllm.utils.deep_gemm as vdg
vdg._lazy_init()
import sm12x.plugin; sm12x.plugin.register()

g = torch.Generator().manual_seed(0)
b, h, d, bkv, blocks = 3, 16, 64, 64, 4
cache = quant_fp8_paged_cache(torch.randn(b * blocks, bkv, d, generator=g))
q = torch.randn(b, 1, h, d, generator=g).to(torch.float8_e4m3fn)
w = torch.randn(b, h, generator=g)
lens = torch.tensor([[17], [200], [64]], dtype=torch.int32)
bt = torch.arange(b * blocks, dtype=torch.int32).view(b, blocks)
ref = ref_paged_mqa_logits(q, cache, w, lens, bt, blocks * bkv, clean_logits=True)

def err(x):
    x = x.float()
    masks_match = bool(((x == float("-inf")) == (ref == float("-inf"))).all())
    return [masks_match, deepgemm_diff(x, ref)]

import deep_gemm
meta = deep_gemm.get_paged_mqa_logits_metadata(lens, bkv, 8)
res = {{"deep_gemm": err(deep_gemm.fp8_paged_mqa_logits(q, cache, w, lens, bt, meta, blocks * bkv,
                                                        clean_logits=True)),
        "gemm_untouched": deep_gemm.fp8_gemm_nt(),
        "vllm_cached_impl": err(vdg.fp8_fp4_paged_mqa_logits((q, None), cache, w, lens, bt, meta,
                                                             blocks * bkv, clean_logits=True))}}
from sglang.srt.layers.attention.dsv4 import indexer
res["sglang_torch_fallback"] = err(indexer.fp8_paged_mqa_logits_torch(q, cache, w, lens, bt, None,
                                                                     blocks * bkv))

def err_visible(x):  # SGLang's SM120 paths pass clean_logits=False: compare visible positions only
    inv = ref == float("-inf")
    return [True, deepgemm_diff(x.float().masked_fill(inv, 0), ref.masked_fill(inv, 0))]

# DeepSeek-V4 on SM120 in SGLang main: the TileLang kernel gets 1-D lengths, the torch one [T, 1];
# both are looked up at call time, as dsv4/indexer.py does
from sglang.kernels.ops.attention.dsa import tilelang_kernel
from sglang.srt.layers.attention.dsv4 import indexer as dsv4_indexer
res["sglang_tilelang"] = err_visible(tilelang_kernel.tilelang_fp8_paged_mqa_logits(
    q, cache, w, lens[:, 0], bt, None, blocks * bkv, False))
res["sglang_torch_sm120"] = err_visible(dsv4_indexer.fp8_paged_mqa_logits_torch_sm120(
    q, cache, w, lens, bt, None, blocks * bkv, False))
print(json.dumps(res))
"""


@pytest.fixture
def standins(tmp_path):
    return write_tree(tmp_path, {**STANDINS, **dist_infos()})


def test_deep_gemm_routes_reach_the_kernels(standins):
    pytest.importorskip("triton")
    out = last_json(run_py(CALLS.format(repo=REPO), pythonpath=[standins],
                           env={"TRITON_INTERPRET": "1"}))
    assert out["gemm_untouched"] == "original-gemm"
    for route in ("deep_gemm", "vllm_cached_impl", "sglang_torch_fallback", "sglang_tilelang",
                  "sglang_torch_sm120"):
        masks_match, diff = out[route]
        assert masks_match, route
        assert diff < 1e-5, (route, diff)


# Later front ends name and order the arguments differently. DeepGEMM 2.8 (vendored in vLLM 0.33,
# vllm/third_party/deep_gemm/_C.py): no clean_logits / logits_dtype, max_seqlen_k sixth and
# required, and vLLM's wrapper passes all six positionally and reads compressed logits.
# sgl-deep-gemm 0.2.3: clean_logits defaults to False.
DG28 = f"""
def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, max_seqlen_k,
                       schedule_meta=None):
    raise RuntimeError({ERR!r})

def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, indices=None):
    raise RuntimeError({ERR!r})

def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    raise RuntimeError({ERR!r})
"""
SGL_DG = f"""
import torch
def fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=False, max_seqlen_k=0):
    raise RuntimeError({ERR!r})
def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=False,
                       max_seqlen_k=0, logits_dtype=torch.float, schedule_meta=None):
    raise RuntimeError({ERR!r})
"""
LATER = {
    "deep_gemm/__init__.py": SGL_DG,
    "vllm/__init__.py": "",
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/deep_gemm/__init__.py": DG28,
    "vllm/utils/__init__.py": "",
    # vLLM 0.33's wrapper: resolves the impls once, calls the prefill one with six positionals
    "vllm/utils/deep_gemm.py": textwrap.dedent("""
        _fp8_fp4_mqa_logits_impl = _fp8_fp4_paged_mqa_logits_impl = None
        def _lazy_init():
            global _fp8_fp4_mqa_logits_impl, _fp8_fp4_paged_mqa_logits_impl
            from vllm.third_party import deep_gemm as _dg
            _fp8_fp4_mqa_logits_impl = _dg.fp8_fp4_mqa_logits
            _fp8_fp4_paged_mqa_logits_impl = _dg.fp8_fp4_paged_mqa_logits
        def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
            _lazy_init()
            return _fp8_fp4_mqa_logits_impl(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k)
    """),
}

LATER_CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
import sm12x.frontends.deep_gemm.indexer as api
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache, quant_fp8_per_token
import vllm.utils.deep_gemm as vdg

g = torch.Generator().manual_seed(0)
s, n, h, d = 6, 96, 16, 64
q = torch.randn(s, h, d, generator=g).to(torch.float8_e4m3fn)
k, k_sf = quant_fp8_per_token(torch.randn(n, d, generator=g))
w = torch.randn(s, h, generator=g)
# two requests of one prefill chunk: the second's keys start at 40
ks = torch.tensor([0, 0, 0, 40, 40, 40], dtype=torch.int32)
ke = torch.tensor([38, 39, 40, 94, 95, 96], dtype=torch.int32)
width = 56
want = api.fp8_fp4_mqa_logits((q, None), (k, k_sf), w, ks, ke, clean_logits=False, max_seqlen_k=width)

def same_visible(got):
    if tuple(got.shape) != (s, width):
        return "shape " + str(list(got.shape))
    cols = torch.arange(width)[None, :] < (ke - ks)[:, None]
    return bool(torch.equal(got[cols], want[cols]))

res = {{"vllm_033_prefill": same_visible(vdg.fp8_fp4_mqa_logits((q, None), (k, k_sf), w, ks, ke, width))}}
import deep_gemm
res["sgl_deep_gemm_default"] = same_visible(deep_gemm.fp8_fp4_mqa_logits((q, None), (k, k_sf), w, ks, ke,
                                                                       max_seqlen_k=width))
# sgl-deep-gemm names fp8_mqa_logits' ranges ks / ke; SGLang passes them by position
res["sgl_deep_gemm_ks_ke"] = (same_visible(deep_gemm.fp8_mqa_logits(q, (k, k_sf), w, ks, ke, clean_logits=False,
                                                                    max_seqlen_k=width))
                              and same_visible(deep_gemm.fp8_mqa_logits(q, (k, k_sf), w, ks=ks, ke=ke,
                                                                        max_seqlen_k=width)))

# the paged front end: indices may come eighth (it was clean_logits before)
b, bkv, blocks = 3, 64, 2
cache = quant_fp8_paged_cache(torch.randn(b * blocks, bkv, d, generator=g))
qp = torch.randn(b, 1, h, d, generator=g).to(torch.float8_e4m3fn)
wp = torch.randn(b, h, generator=g)
lens = torch.tensor([[17], [128], [64]], dtype=torch.int32)
bt = torch.arange(b * blocks, dtype=torch.int32).view(b, blocks)
from vllm.third_party import deep_gemm as dg
meta = dg.get_paged_mqa_logits_metadata(lens, bkv, 8)
got = dg.fp8_fp4_paged_mqa_logits((qp, None), cache, wp, lens, bt, meta, blocks * bkv,
                                  torch.arange(b, dtype=torch.int32))
want = api.fp8_fp4_paged_mqa_logits((qp, None), cache, wp, lens, bt, meta, blocks * bkv)
vis = torch.arange(blocks * bkv)[None, :] < lens
res["dg28_paged"] = bool(torch.equal(got[vis], want[vis]))
print(json.dumps(res))
"""


def test_later_front_ends_are_read_by_their_own_signature(tmp_path):
    """DeepGEMM 2.8's front end (vLLM 0.33) passes max_seqlen_k sixth and wants compressed,
    uncleaned logits; sgl-deep-gemm's clean_logits defaults to False and its fp8_mqa_logits
    calls the ranges ks / ke; DeepGEMM 2.8's paged
    function takes indices eighth. Each gets what its own signature means."""
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**LATER, **dist_infos()})
    out = last_json(run_py(LATER_CALLS.format(repo=REPO), pythonpath=[REPO, root],
                           env={"TRITON_INTERPRET": "1"}))
    assert out == {"vllm_033_prefill": True, "sgl_deep_gemm_default": True, "sgl_deep_gemm_ks_ke": True,
                   "dg28_paged": True}, out


# SGLang 0.5.15: the TileLang indexer under sglang.srt (dsv4/indexer.py imports it at call time),
# and the deprecated nsa module that star-imports it (a copy taken before sm12x, plugin route)
SGLANG_015 = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/dsa/__init__.py": "",
    "sglang/srt/layers/attention/dsa/tilelang_kernel.py": sglang_paged(
        "tilelang_fp8_paged_mqa_logits", "assert seq_lens.dim() == 1 and clean_logits == False"),
    "sglang/srt/layers/attention/nsa/__init__.py": "",
    "sglang/srt/layers/attention/nsa/tilelang_kernel.py":
        "from sglang.srt.layers.attention.dsa.tilelang_kernel import *  # noqa\n",
}

SGLANG_015_CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
from sm12x.kernels.common.tolerance import deepgemm_diff
from sglang.srt.layers.attention.nsa import tilelang_kernel as shim
import sm12x.plugin; sm12x.plugin.register()
from sglang.srt.layers.attention.dsa import tilelang_kernel

g = torch.Generator().manual_seed(0)
b, h, d, bkv, blocks = 3, 16, 64, 64, 4
cache = quant_fp8_paged_cache(torch.randn(b * blocks, bkv, d, generator=g))
q = torch.randn(b, 1, h, d, generator=g).to(torch.float8_e4m3fn)
w = torch.randn(b, h, generator=g)
lens = torch.tensor([[17], [200], [64]], dtype=torch.int32)  # [T, 1]: the original asserts 1-D
bt = torch.arange(b * blocks, dtype=torch.int32).view(b, blocks)
ref = ref_paged_mqa_logits(q, cache, w, lens, bt, blocks * bkv, clean_logits=True)
res = {{}}
for name, fn in (("module", tilelang_kernel.tilelang_fp8_paged_mqa_logits),
                 ("shim", shim.tilelang_fp8_paged_mqa_logits)):
    try:
        out = fn(q, cache, w, lens, bt, None, blocks * bkv, False)
        inv = ref == float("-inf")
        res[name] = deepgemm_diff(out.float().masked_fill(inv, 0), ref.masked_fill(inv, 0))
    except Exception as e:
        res[name] = type(e).__name__
print(json.dumps(res))
"""


@pytest.mark.parametrize("release,ours", [("0.5.15.post1", True), ("0.5.23", False)])
def test_sglang_015_tilelang_indexer(tmp_path, release, ours):
    """In its range the record sends the module's function and the nsa shim's copy to our kernel
    (lengths [T, 1], which the original asserts against); outside it the original runs."""
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**SGLANG_015, **dist_infos({"sglang": release})})
    out = last_json(run_py(SGLANG_015_CALLS.format(repo=REPO), pythonpath=[root],
                           env={"TRITON_INTERPRET": "1"}))
    for name in ("module", "shim"):
        if ours:
            assert isinstance(out[name], float) and out[name] < 1e-5, (name, out)
        else:
            assert out[name] == "AssertionError", (name, out)

"""The real FlashMLA patch set on stand-in modules shaped like each route (pip FlashMLA with its
``cuda`` extension, sgl-kernel with descale arguments, vLLM's vendored copy and its stubbed
re-export, SGLang's SM120 entry). Each original raises FlashMLA's SM12x error for sparse calls, so a
correct result proves the call reached sm12x; dense calls must still reach the original."""
import textwrap

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ERR = "Unsupported architecture for sparse decode fwd"
PREFILL_ERR = "Sparse Attention Forward Kernel is only supported on SM90a and SM100f"
PREFILL_NEW = f"""
def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None{{out}}):
    raise RuntimeError({PREFILL_ERR!r})
"""

FLASHMLA_SIG = ("q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, "
                "num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, "
                "indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, "
                "topk_length=None, extra_topk_length=None")
SGL_SIG = FLASHMLA_SIG.replace("causal=False, ", "causal=False, descale_q=None, descale_k=None, ")

INTERFACE = f"""
def get_mla_metadata(*args, **kwargs):
    return "original-meta", None

def flash_mla_with_kvcache({{sig}}):
    if indices is not None:
        raise RuntimeError({ERR!r})
    return "original-dense"
""" + PREFILL_NEW.format(out="")

ROUTES = {
    "flash_mla/__init__.py": "from flash_mla.flash_mla_interface import flash_mla_with_kvcache, "
                             "get_mla_metadata, flash_mla_sparse_fwd\n",
    "flash_mla/flash_mla_interface.py": INTERFACE.format(sig=FLASHMLA_SIG),
    "flash_mla/cuda.py": f"def sparse_decode_fwd(*args):\n    raise RuntimeError({ERR!r})\n",
    "sgl_kernel/__init__.py": "",
    "sgl_kernel/flash_mla.py": INTERFACE.format(sig=SGL_SIG),
    "vllm/__init__.py": "",
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/flashmla/__init__.py": "",
    # vLLM's vendored copy adds `out` to the prefill
    "vllm/third_party/flashmla/flash_mla_interface.py": INTERFACE.format(sig=FLASHMLA_SIG)
    + PREFILL_NEW.format(out=", out=None"),
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/ops/__init__.py": "",
    # on SM12x vLLM binds stubs instead of importing the vendored module
    "vllm/v1/attention/ops/flashmla.py": textwrap.dedent("""
        def _raise(*a, **k):
            raise RuntimeError("FlashMLA is not available")
        flash_mla_with_kvcache = _raise
        get_mla_metadata = _raise
        flash_mla_sparse_fwd = _raise
    """),
    # the pre-2026 FlashMLA prefill (base-2 max_logits / lse), which no patched release carries:
    # the wrapper is built on it directly
    "vllm/attention/__init__.py": "",
    "vllm/attention/ops/__init__.py": "",
    "vllm/attention/ops/flashmla.py":
        f"def flash_mla_sparse_prefill(q, kv, indices, sm_scale, d_v=512):\n"
        f"    raise RuntimeError({PREFILL_ERR!r})\n",
    "sglang/__init__.py": "",
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/attention/__init__.py": "",
    "sglang/kernels/ops/attention/flash_mla_sm120.py":
        f"def flash_mla_with_kvcache_sm120(**kw):\n    raise RuntimeError({ERR!r})\n",
}

CALLS = """
import json, os, torch
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
case = make_case(b=2, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2,
                 extra_topk_length=True)
ref_out, ref_lse = ref_sparse_mla_decode(**case)
kw = dict(softmax_scale=case["softmax_scale"], is_fp8_kvcache=True, indices=case["indices"],
          attn_sink=case["attn_sink"], extra_k_cache=case["extra_k_cache"],
          extra_indices_in_kvcache=case["extra_indices"], topk_length=case["topk_length"],
          extra_topk_length=case["extra_topk_length"])
q, cache = case["q"], case["k_cache"]

def err(out, lse):
    return [float((out.float() - ref_out.float()).abs().max()),
            float((lse - ref_lse).abs().nan_to_num(0.0).max())]

res = {}
import flash_mla
meta = flash_mla.get_mla_metadata()[0]
res["pip"] = err(*flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta, **kw))
res["pip_dense"] = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta)
import flash_mla.flash_mla_interface as fi
res["pip_interface"] = err(*fi.flash_mla_with_kvcache(q, cache, None, None, 512,
                                                      fi.get_mla_metadata()[0], **kw))
import flash_mla.cuda as fc
o, l, _, _ = fc.sparse_decode_fwd(q, cache, kw["indices"], kw["topk_length"], kw["attn_sink"],
                                  None, None, kw["extra_k_cache"], kw["extra_indices_in_kvcache"],
                                  kw["extra_topk_length"], 512, kw["softmax_scale"])
res["pip_cuda"] = err(o, l)
from sgl_kernel import flash_mla as sk
# positional descale_q/descale_k (None) as sgl-kernel's signature has them
res["sgl_kernel"] = err(*sk.flash_mla_with_kvcache(
    q, cache, None, None, 512, sk.get_mla_metadata()[0], None, kw["softmax_scale"], False, None,
    None, True, kw["indices"], kw["attn_sink"], kw["extra_k_cache"],
    kw["extra_indices_in_kvcache"], kw["topk_length"], kw["extra_topk_length"]))
from vllm.v1.attention.ops import flashmla as vf
res["vllm_ops_stub"] = err(*vf.flash_mla_with_kvcache(q, cache, None, None, 512,
                                                      vf.get_mla_metadata()[0], **kw))
from vllm.third_party.flashmla import flash_mla_interface as vt
res["vllm_third_party"] = err(*vt.flash_mla_with_kvcache(q, cache, None, None, 512,
                                                         vt.get_mla_metadata()[0], **kw))
from sglang.kernels.ops.attention import flash_mla_sm120 as s120
res["sglang_sm120"] = err(*s120.flash_mla_with_kvcache_sm120(
    q=q, k_cache=cache, head_dim_v=512, softmax_scale=kw["softmax_scale"], indices=kw["indices"],
    topk_length=kw["topk_length"], attn_sink=kw["attn_sink"], extra_k_cache=kw["extra_k_cache"],
    extra_indices_in_kvcache=kw["extra_indices_in_kvcache"],
    extra_topk_length=kw["extra_topk_length"]))
from sm12x import apply
res["outcomes"] = {k: v[0] for k, v in apply.OUTCOMES.items()}
print(json.dumps(res))
"""


@pytest.fixture
def routes(tmp_path):
    return write_tree(tmp_path, {**ROUTES, **dist_infos()})


def test_every_route_reaches_the_kernel(routes):
    pytest.importorskip("triton")
    out = last_json(run_py(CALLS, pythonpath=[REPO, routes],
                           env={"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}))
    for route in ("pip", "pip_interface", "pip_cuda", "sgl_kernel", "vllm_ops_stub",
                  "vllm_third_party", "sglang_sm120"):
        out_err, lse_err = out[route]
        assert out_err <= 1e-2, (route, out_err)  # bf16 output of a 128-key softmax
        assert lse_err <= 1e-4, (route, lse_err)
    assert out["pip_dense"] == "original-dense"
    applied = {k for k, v in out["outcomes"].items() if v == "applied"}
    assert {"flash_mla.decode", "flash_mla.interface.decode", "flash_mla.cuda.sparse_decode_fwd",
            "sgl_kernel.flash_mla.decode", "vllm.ops.flashmla.decode",
            "vllm.third_party.flashmla.decode", "sglang.flash_mla_sm120"} <= applied
    assert "sglang.flash_mla_sm120.era_b" not in out["outcomes"]  # its module was never imported


def test_not_sm12x_leaves_originals(routes):
    proc = run_py("""
import json, flash_mla
print(json.dumps({"meta": flash_mla.get_mla_metadata()[0]}))
""", pythonpath=[REPO, routes], env={"SM12X_ARCH": "9.0"})
    assert last_json(proc) == {"meta": "original-meta"}


PREFILL_CALLS = """
import json, math, torch
from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill
case = make_prefill_case(512, 3, 16, 64, 100, topk_length=True)
case["indices"][0] = -1  # a row with no valid index: lse +inf (2026 interface) or -inf (before)
ref_out, ref_max, ref_lse = ref_sparse_mla_prefill(**case)
args = (case["q"], case["kv"], case["indices"], case["sm_scale"])
kw = dict(attn_sink=case["attn_sink"], topk_length=case["topk_length"])

def err(result, log2=False, empty=float("inf")):
    out, mx, lse = result
    f = 1.4426950408889634 if log2 else 1.0
    want_lse = (ref_lse * f).masked_fill(ref_lse == float("inf"), empty)
    same_inf = bool(((lse == want_lse) | (lse.isfinite() & want_lse.isfinite())).all())
    return [float((out.float() - ref_out.float()).abs().max()),
            float((mx[1:] - ref_max[1:] * f).abs().max()),
            float((lse[1:] - want_lse[1:]).abs().max()), same_inf]

res = {}
import flash_mla
res["pip"] = err(flash_mla.flash_mla_sparse_fwd(*args, **kw))
import flash_mla.flash_mla_interface as fi
res["pip_interface"] = err(fi.flash_mla_sparse_fwd(*args, 512, kw["attn_sink"], kw["topk_length"]))
from sgl_kernel import flash_mla as sk
res["sgl_kernel"] = err(sk.flash_mla_sparse_fwd(*args, **kw), log2=True)
from vllm.v1.attention.ops import flashmla as vf
out = torch.empty(3, 16, 512, dtype=torch.bfloat16)
res["vllm_ops_stub"] = err(vf.flash_mla_sparse_fwd(*args, **kw, out=out))
res["vllm_out_is_buffer"] = vf.flash_mla_sparse_fwd(*args, **kw, out=out)[0].data_ptr() == out.data_ptr()
from vllm.third_party.flashmla import flash_mla_interface as vt
res["vllm_third_party"] = err(vt.flash_mla_sparse_fwd(*args, **kw))
# the pre-2026 interface (no attn_sink): base-2 max_logits / lse, read from the signature
from vllm.attention.ops import flashmla as old
from sm12x.frontends.flash_mla.wrappers import make_flash_mla_sparse_fwd
old_prefill = make_flash_mla_sparse_fwd(old.flash_mla_sparse_prefill)
case = make_prefill_case(512, 3, 16, 64, 100, sink=False)  # the old interface: no sink, no length
case["indices"][0] = -1
ref_out, ref_max, ref_lse = ref_sparse_mla_prefill(**case)
args = (case["q"], case["kv"], case["indices"], case["sm_scale"])
res["vllm_old"] = err(old_prefill(*args), log2=True, empty=float("-inf"))
from sm12x import apply
res["outcomes"] = {k: v[0] for k, v in apply.OUTCOMES.items()}
print(json.dumps(res))
"""


def test_sparse_prefill_every_route(routes):
    """``flash_mla_sparse_fwd`` reaches sm12x on every route, in that route's units."""
    pytest.importorskip("triton")
    out = last_json(run_py(PREFILL_CALLS, pythonpath=[REPO, routes],
                           env={"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}))
    for route in ("pip", "pip_interface", "sgl_kernel", "vllm_ops_stub", "vllm_third_party",
                  "vllm_old"):
        out_err, max_err, lse_err, same_inf = out[route]
        assert out_err <= 1e-2 and max_err <= 1e-4 and lse_err <= 1e-4, (route, out[route])
        assert same_inf, route
    assert out["vllm_out_is_buffer"]
    applied = {k for k, v in out["outcomes"].items() if v == "applied"}
    assert {"flash_mla.sparse_fwd", "flash_mla.interface.sparse_fwd",
            "sgl_kernel.flash_mla.sparse_fwd", "vllm.ops.flashmla.sparse_fwd",
            "vllm.third_party.flashmla.sparse_fwd"} <= applied


# vLLM's DeepSeek-V4 FlashMLA layer (vllm/models/deepseek_v4/nvidia/flashmla.py, 2026-08): binds
# the functions at import, passes its own scheduler-metadata object and a strided ``out`` view,
# and drops the return value.
VLLM_CALLER = textwrap.dedent("""
    from vllm.v1.attention.ops.flashmla import flash_mla_sparse_fwd, flash_mla_with_kvcache

    class FlashMLASchedMeta:
        pass

    def decode(q, swa_cache, swa_indices, swa_lens, scale, sink, kv_cache, topk_indices, topk_lens,
               output):
        flash_mla_with_kvcache(q=q, k_cache=swa_cache, block_table=None, head_dim_v=512,
                               tile_scheduler_metadata=FlashMLASchedMeta(), cache_seqlens=None,
                               is_fp8_kvcache=True, indices=swa_indices, topk_length=swa_lens,
                               softmax_scale=scale, attn_sink=sink, extra_k_cache=kv_cache,
                               extra_indices_in_kvcache=topk_indices, extra_topk_length=topk_lens,
                               out=output.unsqueeze(1))
""")

VLLM_CALLER_CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
import vllm.models.deepseek_v4.nvidia.flashmla as layer  # imported before sm12x: plugin route
import sm12x.plugin; sm12x.plugin.register()
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
case = make_case(b=3, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2,
                 extra_topk_length=True)
ref_out, _ = ref_sparse_mla_decode(**case)
# vLLM's output buffer: [tokens, heads, 512] rows of a wider allocation (a strided view)
buf = torch.zeros(3, 20, 512, dtype=torch.bfloat16)
output = buf[:, 2:18]
layer.decode(case["q"], case["k_cache"], case["indices"], case["topk_length"],
             case["softmax_scale"], case["attn_sink"], case["extra_k_cache"], case["extra_indices"],
             case["extra_topk_length"], output)
print(json.dumps({{"err": float((output.float() - ref_out[:, 0].float()).abs().max()),
                  "untouched": bool((buf[:, :2] == 0).all() and (buf[:, 18:] == 0).all()),
                  "rebound": getattr(layer.flash_mla_with_kvcache, "__sm12x_patch__", None),
                  "rebound_prefill": getattr(layer.flash_mla_sparse_fwd, "__sm12x_patch__", None)}}))
"""


def test_vllm_layer_out_view_on_plugin_route(tmp_path):
    """A vLLM caller that imported FlashMLA's functions before sm12x ran (plugin route) gets them
    rebound, each name to its own replacement although vLLM's stubs are one function bound to
    every name; its keyword call with a strided ``out`` view and a foreign metadata object fills the
    view (and nothing around it) with the right result."""
    pytest.importorskip("triton")
    files = dict(ROUTES)
    for pkg in ("vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/nvidia"):
        files[f"{pkg}/__init__.py"] = ""
    files["vllm/models/deepseek_v4/nvidia/flashmla.py"] = VLLM_CALLER
    root = write_tree(tmp_path, {**files, **dist_infos()})
    out = last_json(run_py(VLLM_CALLER_CALLS.format(repo=REPO), pythonpath=[root],
                           env={"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}))
    assert out["rebound"] == "vllm.ops.flashmla.decode"
    assert out["rebound_prefill"] == "vllm.ops.flashmla.sparse_fwd"
    assert out["err"] <= 1e-2 and out["untouched"], out


# SGLang 0.5.23 installs sgl-flash-mla as ``flash_mla`` (is_fp8_kvcache None = inferred from
# indices; use_legacy picks its kernel set; kv_format names the cache; return_log2_lse) and calls it
# through sglang/kernels/ops/attention/flash_mla_interface.py with call-time attribute lookups.
SGL_FLASH_MLA = f"""
class FlashMLASchedMeta:
    pass

def get_mla_metadata(*args, **kwargs):
    return FlashMLASchedMeta(), None

def get_mla_decoding_metadata(seqlens_k, num_q_tokens_per_head_k, h_k, h_q=None, is_fp8_kvcache=False,
                              topk=None, use_legacy=False):
    raise RuntimeError({ERR!r})

def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=None,
                           indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                           topk_length=None, extra_topk_length=None, enable_batch_invariant=False,
                           use_legacy=False, kv_format=None, descale_q=None, descale_k=None):
    if indices is not None:
        raise RuntimeError({ERR!r})
    return "original-dense"

def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                         use_legacy=False, return_log2_lse=None):
    raise RuntimeError({PREFILL_ERR!r})
"""
SGL_WRAPPER = """
import flash_mla
from flash_mla.flash_mla_interface import FlashMLASchedMeta

def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=None, num_heads_q=None,
                     is_fp8_kvcache=False, topk=None):
    if cache_seqlens is None:
        return flash_mla.get_mla_metadata()[0], None
    return flash_mla.get_mla_decoding_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k,
                                               num_heads_q, is_fp8_kvcache, topk, use_legacy=True)

def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, descale_q=None, descale_k=None,
                           is_fp8_kvcache=False, indices=None, attn_sink=None, extra_k_cache=None,
                           extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None,
                           kv_format=None, *, use_legacy=True):
    if not isinstance(tile_scheduler_metadata, FlashMLASchedMeta):  # the tensor schedule
        assert num_splits is not None
        tile_scheduler_metadata = FlashMLASchedMeta()
    return flash_mla.flash_mla_with_kvcache(
        q=q, k_cache=k_cache, block_table=block_table, cache_seqlens=cache_seqlens, head_dim_v=head_dim_v,
        tile_scheduler_metadata=tile_scheduler_metadata, softmax_scale=softmax_scale, causal=causal,
        is_fp8_kvcache=is_fp8_kvcache, indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
        extra_indices_in_kvcache=extra_indices_in_kvcache, topk_length=topk_length,
        extra_topk_length=extra_topk_length, use_legacy=use_legacy, kv_format=kv_format,
        descale_q=descale_q, descale_k=descale_k)

def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, *,
                         use_legacy=True):
    return flash_mla.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                                          use_legacy=use_legacy,
                                          return_log2_lse=True if use_legacy else None)
"""
SGL_ROUTES = {
    "flash_mla/__init__.py": "from flash_mla.flash_mla_interface import flash_mla_with_kvcache, "
                             "get_mla_metadata, get_mla_decoding_metadata, flash_mla_sparse_fwd\n",
    "flash_mla/flash_mla_interface.py": SGL_FLASH_MLA,
    "sglang/__init__.py": "",
    "sglang/kernels/__init__.py": "",
    "sglang/kernels/ops/__init__.py": "",
    "sglang/kernels/ops/attention/__init__.py": "",
    "sglang/kernels/ops/attention/flash_mla_interface.py": SGL_WRAPPER,
}

SGL_CALLS = """
import json, torch
from sm12x.kernels.sparse_mla.reference import (make_case, make_prefill_case, ref_sparse_mla_decode,
                                                ref_sparse_mla_prefill)
from sglang.kernels.ops.attention import flash_mla_interface as wrapper
import flash_mla
case = make_case(b=2, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2, extra_topk_length=True)
ref_out, ref_lse = ref_sparse_mla_decode(**case)
kw = dict(softmax_scale=case["softmax_scale"], indices=case["indices"], attn_sink=case["attn_sink"],
          extra_k_cache=case["extra_k_cache"], extra_indices_in_kvcache=case["extra_indices"],
          topk_length=case["topk_length"], extra_topk_length=case["extra_topk_length"])
q, cache = case["q"], case["k_cache"]

def err(out, lse):
    return [float((out.float() - ref_out.float()).abs().max()),
            float((lse - ref_lse).abs().nan_to_num(0.0).max())]

res = {}
meta = wrapper.get_mla_metadata()[0]
res["wrapper"] = err(*wrapper.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,
                                                     kv_format="V4", **kw))
# is_fp8_kvcache left out: sgl-flash-mla infers it from the indices
res["inferred_fp8"] = err(*flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512,
                                                            flash_mla.get_mla_metadata()[0], **kw))
try:
    wrapper.flash_mla_with_kvcache(q, cache, None, None, 512, wrapper.get_mla_metadata()[0],
                                   is_fp8_kvcache=True, kv_format="V32", **kw)
    res["wrong_format"] = "no error"
except ValueError as e:
    res["wrong_format"] = str(e)
sched = wrapper.get_mla_metadata(torch.tensor([5, 9], dtype=torch.int32), 16, 1, 16, True, 64)
res["tensor_metadata"] = [list(t.shape) for t in sched]
res["dense"] = flash_mla.flash_mla_with_kvcache(q, cache, None, None, 512, meta)

p = make_prefill_case(512, 3, 16, 64, 100, topk_length=True)
p_out, p_max, p_lse = ref_sparse_mla_prefill(**p)
args = (p["q"], p["kv"], p["indices"], p["sm_scale"], 512, p["attn_sink"], p["topk_length"])
out, mx, lse = wrapper.flash_mla_sparse_fwd(*args)  # use_legacy: return_log2_lse=True
log2e = 1.4426950408889634
res["prefill_log2"] = [float((out.float() - p_out.float()).abs().max()), float((mx - p_max * log2e).abs().max()),
                       float((lse - p_lse * log2e).abs().max())]
out, mx, lse = wrapper.flash_mla_sparse_fwd(*args, use_legacy=False)
res["prefill_natural"] = [float((mx - p_max).abs().max()), float((lse - p_lse).abs().max())]
res["prefill_no_stats"] = [x is None for x in flash_mla.flash_mla_sparse_fwd(*args, return_log2_lse=False)]
from sm12x import apply
res["outcomes"] = {k: v[0] for k, v in apply.OUTCOMES.items()}
print(json.dumps(res))
"""


def test_sglang_0_5_23_flash_mla_route(tmp_path):
    """SGLang 0.5.23's FlashMLA wrapper over sgl-flash-mla: its use_legacy / kv_format /
    return_log2_lse keywords and inferred is_fp8_kvcache reach sm12x (they raised before), a
    kv_format that does not name the cache is refused by name, the tensor scheduler is ours, and
    dense calls still reach the original."""
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**SGL_ROUTES, **dist_infos()})
    out = last_json(run_py(SGL_CALLS, pythonpath=[REPO, root],
                           env={"TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}))
    for route in ("wrapper", "inferred_fp8"):
        out_err, lse_err = out[route]
        assert out_err <= 1e-2 and lse_err <= 1e-4, (route, out[route])
    assert "kv_format" in out["wrong_format"] and "584" in out["wrong_format"], out["wrong_format"]
    assert out["tensor_metadata"][1] == [3]
    assert out["dense"] == "original-dense"
    assert max(out["prefill_log2"]) <= 1e-2, out["prefill_log2"]
    assert max(out["prefill_natural"]) <= 1e-4, out["prefill_natural"]
    assert out["prefill_no_stats"] == [False, True, True]
    applied = {k for k, v in out["outcomes"].items() if v == "applied"}
    assert {"flash_mla.decode", "flash_mla.interface.decode", "flash_mla.decoding_metadata",
            "flash_mla.sparse_fwd"} <= applied, out["outcomes"]

"""The dense DeepGEMM patch records on stand-ins shaped like each release: vLLM 0.22.1 (vendored
DeepGEMM without SM120 kernels, as in 0.23.0 and 0.24.0; DeepSeek-V4's attention calls fp8_einsum
through ``vllm.utils.deep_gemm``'s cached ``_fp8_einsum_impl``), vLLM 0.25.0 / 0.25.1 (vendored
DeepGEMM with SM120 kernels: left alone), sgl-deep-gemm 0.1.4 (no SM120 kernels; SGLang's deep_gemm_wrapper looks the
functions up at call time) and sgl-deep-gemm 0.2.3 (left alone)."""
import textwrap

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ERR = "Unsupported architecture (hyperconnection.hpp:56)"

VENDORED = "".join(f"def {n}(*args, **kwargs):\n    raise RuntimeError({ERR!r})\n"
                   for n in ("fp8_einsum", "fp8_gemm_nt", "tf32_hc_prenorm_gemm"))

VLLM = {
    "vllm/__init__.py": "",
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/deep_gemm/__init__.py": VENDORED,
    "vllm/utils/__init__.py": "",
    # vLLM 0.22.1's wrapper module: resolves the impls once, its own fp8_einsum passes through
    "vllm/utils/deep_gemm.py": textwrap.dedent("""
        _fp8_einsum_impl = _tf32_hc_prenorm_gemm_impl = None
        def _lazy_init():
            global _fp8_einsum_impl, _tf32_hc_prenorm_gemm_impl
            from vllm.third_party import deep_gemm as _dg
            _fp8_einsum_impl = _dg.fp8_einsum
            _tf32_hc_prenorm_gemm_impl = _dg.tf32_hc_prenorm_gemm
        def fp8_einsum(*args, **kwargs):
            _lazy_init()
            return _fp8_einsum_impl(*args, **kwargs)
        def tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_split):
            _lazy_init()
            return _tf32_hc_prenorm_gemm_impl(x, fn, out, sqrsum, num_split)
    """),
    "vllm/models/__init__.py": "",
    "vllm/models/deepseek_v4/__init__.py": "",
    # vllm 0.22.1 vllm/models/deepseek_v4/attention.py: the custom op body
    "vllm/models/deepseek_v4/attention.py": textwrap.dedent("""
        from vllm.utils.deep_gemm import fp8_einsum
        def deepseek_v4_fp8_einsum(a, a_scale, b, b_scale, out, equation, recipe):
            fp8_einsum(equation, (a, a_scale), (b, b_scale), out, recipe=tuple(recipe))
    """),
}

VLLM_CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from sm12x.kernels.gemm.reference import (per_block_cast_to_fp8, per_token_cast_to_fp8,
                                          ref_fp8_einsum_bhr_hdr, ref_tf32_hc_prenorm_gemm)
from sm12x.kernels.gemm.scales import pack_ue8m0
from sm12x.kernels.common.tolerance import calc_diff

# the framework resolved DeepGEMM before sm12x was installed (plugin route)
import vllm.utils.deep_gemm as vdg
vdg._lazy_init()
import sm12x.plugin; sm12x.plugin.register()
from sm12x import apply

t, g, d_in, r = 3, 2, 256, 128
gen = torch.Generator().manual_seed(0)
o, o_sf = per_token_cast_to_fp8(torch.randn(g * t, d_in, generator=gen), use_ue8m0=True)
o, o_sf = o.view(g, t, d_in), o_sf.view(g, t, -1)
blocks = [per_block_cast_to_fp8(torch.randn(r, d_in, generator=gen)) for _ in range(g)]
w = torch.stack([x for x, _ in blocks]); w_sf = torch.stack([s for _, s in blocks])
z = torch.empty(t, g, r, dtype=torch.bfloat16)
res = {{"states": {{n: s for n, (s, _) in apply.OUTCOMES.items() if "third_party.deep_gemm.fp8" in n
                                                               or "third_party.deep_gemm.tf32" in n}}}}
from vllm.models.deepseek_v4.attention import deepseek_v4_fp8_einsum
try:
    deepseek_v4_fp8_einsum(o.transpose(0, 1), pack_ue8m0(o_sf).transpose(0, 1), w, w_sf, z, "bhr,hdr->bhd",
                           [1, 1, 128])
    ref = ref_fp8_einsum_bhr_hdr(o.transpose(0, 1), o_sf.transpose(0, 1), w, w_sf)
    res["wo_a"] = calc_diff(z.float(), ref)
except RuntimeError as e:
    res["wo_a"] = str(e)
x = torch.randn(4, 512, generator=gen).bfloat16(); fn = torch.randn(24, 512, generator=gen) / 16
out, sq = torch.empty(2, 4, 24), torch.empty(2, 4)
try:
    vdg.tf32_hc_prenorm_gemm(x, fn, out, sq, 2)
    rd, rs = ref_tf32_hc_prenorm_gemm(x, fn)
    res["prenorm"] = max(calc_diff(out.sum(0), rd), calc_diff(sq.sum(0), rs))
except RuntimeError as e:
    res["prenorm"] = str(e)
print(json.dumps(res))
"""

SGL_DG = f"""
def fp8_gemm_nt(a, b, d, c=None, recipe=None, compiled_dims="nk"):
    raise RuntimeError({ERR!r})
def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128)):
    raise RuntimeError({ERR!r})
def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
    raise RuntimeError({ERR!r})
"""
SGLANG = {
    "deep_gemm/__init__.py": SGL_DG,
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/deep_gemm_wrapper/__init__.py": "",
    # sglang 0.5.15.post1 deep_gemm_wrapper/entrypoint.py: looks deep_gemm.<name> up per call
    "sglang/srt/layers/deep_gemm_wrapper/entrypoint.py": textwrap.dedent("""
        import deep_gemm
        def gemm_nt_f8f8bf16(lhs, rhs, out):
            deep_gemm.fp8_gemm_nt(lhs, rhs, out)
        def tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits):
            if x.shape[0] == 0:
                return
            deep_gemm.tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits=num_splits)
    """),
}

SGLANG_CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
import sm12x.plugin; sm12x.plugin.register()
from sm12x.kernels.gemm.cases import gemm_inputs
from sm12x.kernels.gemm.reference import ref_fp8_gemm_nt, ref_tf32_hc_prenorm_gemm
from sm12x.kernels.common.tolerance import calc_diff
from sglang.srt.layers.deep_gemm_wrapper import entrypoint

res = {{}}
a, sfa, b, sfb, sa, sb = gemm_inputs(5, 256, 256, "cpu")
d = torch.empty(5, 256, dtype=torch.bfloat16)
try:
    entrypoint.gemm_nt_f8f8bf16((a, sfa), (b, sfb), d)
    res["linear"] = calc_diff(d.float(), ref_fp8_gemm_nt(a, sa, b, sb))
except RuntimeError as e:
    res["linear"] = str(e)
gen = torch.Generator().manual_seed(0)
x = torch.randn(4, 512, generator=gen).bfloat16(); fn = torch.randn(24, 512, generator=gen) / 16
out, sq = torch.empty(4, 24), torch.empty(4)
try:
    entrypoint.tf32_hc_prenorm_gemm(x, fn, out, sq, None)
    rd, rs = ref_tf32_hc_prenorm_gemm(x, fn)
    res["prenorm"] = max(calc_diff(out, rd), calc_diff(sq, rs))
except RuntimeError as e:
    res["prenorm"] = str(e)
print(json.dumps(res))
"""


def _run(tmp_path, files, releases, calls):
    pytest.importorskip("triton")
    tree = write_tree(tmp_path, {**files, **dist_infos(releases)})
    return last_json(run_py(calls.format(repo=REPO), pythonpath=[tree], env={"TRITON_INTERPRET": "1"}))


# 0.22.1-0.24.0 vendor the same DeepGEMM 2.5.0 (no SM120 kernels) behind the same wrapper module
@pytest.mark.parametrize("release", ["0.22.1", "0.23.0", "0.24.0"])
def test_vllm_0221_wo_a_and_prenorm_reach_the_kernels(tmp_path, release):
    out = _run(tmp_path, VLLM, {"vllm": release}, VLLM_CALLS)
    assert out["states"]["vllm.third_party.deep_gemm.fp8_einsum"] == "applied"
    assert isinstance(out["wo_a"], float) and out["wo_a"] < 1e-5, out
    assert isinstance(out["prenorm"], float) and out["prenorm"] < 1e-5, out


@pytest.mark.parametrize("release", ["0.25.0", "0.25.1"])  # the same vendored DeepGEMM, with SM120 kernels
def test_vllm_0251_keeps_its_sm120_deepgemm(tmp_path, release):
    out = _run(tmp_path, VLLM, {"vllm": release}, VLLM_CALLS)
    assert set(out["states"].values()) == {"skipped"}, out
    assert out["wo_a"] == ERR and out["prenorm"] == ERR  # the original ran


@pytest.mark.parametrize("sgl_deep_gemm,sglang", [("0.1.4", "0.5.15.post1"), ("0.1.4.post1", "0.5.16")])
def test_sgl_deep_gemm_014_routes_reach_the_kernels(tmp_path, sgl_deep_gemm, sglang):
    out = _run(tmp_path, SGLANG, {"sgl-deep-gemm": sgl_deep_gemm, "sglang": sglang}, SGLANG_CALLS)
    assert isinstance(out["linear"], float) and out["linear"] < 1e-5, out
    assert isinstance(out["prenorm"], float) and out["prenorm"] < 1e-5, out


@pytest.mark.parametrize("sgl_deep_gemm,sglang", [("0.1.5.post3", "0.5.18"), ("0.2.3.post2", "0.5.23")])
def test_sgl_deep_gemm_with_sm120_kernels_keeps_them(tmp_path, sgl_deep_gemm, sglang):
    out = _run(tmp_path, SGLANG, {"sgl-deep-gemm": sgl_deep_gemm, "sglang": sglang}, SGLANG_CALLS)
    assert out["linear"] == ERR and out["prenorm"] == ERR

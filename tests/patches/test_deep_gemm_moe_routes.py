"""The real DeepGEMM MoE patch set on stand-ins: vLLM 0.22.1's (and 0.23.0's) vendored DeepGEMM whose grouped
GEMMs raise DeepGEMM's SM12x error (with ``vllm.utils.deep_gemm`` caching them in ``_*_impl``
globals before sm12x ran: the plugin route), its ``DeepGemmFP4Experts`` that admits family 100
only, and sgl-deep-gemm 0.1.4 as SGLang's ``deep_gemm_wrapper`` calls it."""
import json
import textwrap

import pytest
from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ERR = "Unsupported architecture or scaling factor types"

_DG_MODULE = textwrap.dedent(f"""
    _align = [128]
    def set_mk_alignment_for_contiguous_layout(v):
        _align[0] = v
    def get_mk_alignment_for_contiguous_layout():
        return _align[0]
    def m_grouped_fp8_fp4_gemm_nt_contiguous(*args, **kwargs):
        raise RuntimeError({ERR!r})
    m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
    def m_grouped_fp8_fp4_gemm_nt_masked(*args, **kwargs):
        raise RuntimeError({ERR!r})
    m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
    fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
""")

STANDINS = {
    "vllm/__init__.py": "",
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/deep_gemm/__init__.py": _DG_MODULE,
    "vllm/utils/__init__.py": "",
    # vLLM 0.22.1's wrapper: resolves the module's functions once and adds disable_ue8m0_cast
    "vllm/utils/deep_gemm.py": textwrap.dedent("""
        _grouped_fp4_impl = None
        def _lazy_init():
            global _grouped_fp4_impl
            import vllm.third_party.deep_gemm as dg
            _grouped_fp4_impl = dg.m_grouped_fp8_fp4_gemm_nt_contiguous
        def m_grouped_fp8_fp4_gemm_nt_contiguous(*args, **kwargs):
            _lazy_init() if _grouped_fp4_impl is None else None
            return _grouped_fp4_impl(*args, disable_ue8m0_cast=True, **kwargs)
    """),
    "vllm/model_executor/__init__.py": "",
    "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/experts/__init__.py": "",
    "vllm/model_executor/layers/fused_moe/experts/deep_gemm_moe.py": textwrap.dedent("""
        class DeepGemmFP4Experts:
            @staticmethod
            def _supports_current_device() -> bool:
                return False  # 0.22.1: is_deep_gemm_supported() and family 100
            @classmethod
            def is_supported_config(cls):
                return cls._supports_current_device()
    """),
    "deep_gemm/__init__.py": _DG_MODULE,
}
RELEASES = {"vllm": "0.22.1", "sgl-deep-gemm": "0.1.4"}

CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from sm12x.kernels.common.tolerance import calc_diff
from sm12x.kernels.gemm.scales import read_scales
from sm12x.kernels.moe.cases import make_contiguous, make_masked, make_weights
from sm12x.kernels.moe.reference import ref_grouped_contiguous, ref_grouped_masked

# sm12x is installed before vLLM's wrapper resolves DeepGEMM (its _lazy_init runs on the first
# kernel call); test_deep_gemm_moe_plugin_route.py covers _lazy_init running first.
import sm12x.plugin; sm12x.plugin.register()
import vllm.utils.deep_gemm as vdg
import vllm.third_party.deep_gemm as vendored
import deep_gemm
from vllm.model_executor.layers.fused_moe.experts.deep_gemm_moe import DeepGemmFP4Experts

res = {{"supports_current_device": DeepGemmFP4Experts.is_supported_config()}}
# vLLM pads each expert to the alignment it set on the module (mk_alignment_scope)
vendored.set_mk_alignment_for_contiguous_layout(32)
a, sa, layout, m = make_contiguous([5, 0, 40], 256, alignment=32)
b, sb = make_weights(3, 64, 256, fp4=True, fmt="fp32")  # vLLM 0.22.1 upcasts e8m0 to float32
d = torch.zeros(m, 64, dtype=torch.bfloat16)
try:
    vdg.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sa), (b.view(torch.int8), sb), d, layout,
                                             recipe_a=(1, 128), recipe_b=(1, 32))
    ref, defined = ref_grouped_contiguous(a, read_scales("t", "a", sa, m, 256), b,
                                          read_scales("t", "b", sb, 64, 256, groups=3), layout, fp4=True)
    res["vllm_contiguous"] = calc_diff(d.float()[defined], ref[defined])
except RuntimeError as e:
    res["vllm_contiguous"] = str(e)

# SGLang's deep_gemm_wrapper: deep_gemm.<name> looked up at call time
a, sa, masked = make_masked(3, 16, 256, [16, 0, 7], fmt="packed")
b, sb = make_weights(3, 64, 256, fp4=False, fmt="fp32")
d = torch.zeros(3, 16, 64, dtype=torch.bfloat16)
try:
    deep_gemm.fp8_m_grouped_gemm_nt_masked((a, sa), (b, sb), d, masked, 8)
    ref, defined = ref_grouped_masked(a, read_scales("t", "a", sa, 16, 256, groups=3), b,
                                      read_scales("t", "b", sb, 64, 256, groups=3), masked, fp4=False)
    res["sglang_masked"] = calc_diff(d.float()[defined], ref[defined])
except RuntimeError as e:
    res["sglang_masked"] = str(e)
from sm12x import apply
res["outcomes"] = {{k: v[0] for k, v in apply.OUTCOMES.items() if "grouped" in k or "supports" in k}}
print(json.dumps(res))
"""


# 0.23.0's MoE code and vendored DeepGEMM on CUDA are 0.22.1's
@pytest.fixture(params=["0.22.1", "0.23.0"])
def standins(tmp_path, request):
    return write_tree(tmp_path, {**STANDINS, **dist_infos({**RELEASES, "vllm": request.param})})


def _run(standins, **env):
    return last_json(run_py(CALLS.format(repo=REPO), pythonpath=[standins], env={"TRITON_INTERPRET": "1", **env}))


def test_routes_reach_the_kernels(standins):
    pytest.importorskip("triton")
    out = _run(standins)
    assert out["supports_current_device"] is True
    assert isinstance(out["vllm_contiguous"], float) and out["vllm_contiguous"] < 1e-4, out
    assert isinstance(out["sglang_masked"], float) and out["sglang_masked"] < 1e-4, out
    assert all(state == "applied" for state in out["outcomes"].values()), out["outcomes"]
    assert len(out["outcomes"]) == 6


def test_skipping_the_vllm_gemm_restores_the_expert_choice(standins):
    pytest.importorskip("triton")
    out = _run(standins, SM12X_SKIP="vllm.third_party.deep_gemm")
    assert out["supports_current_device"] is False
    assert out["vllm_contiguous"] == ERR
    assert isinstance(out["sglang_masked"], float)


# SGLang 0.5.17's and 0.5.19's pins; vLLM 0.24.0 (its DeepGEMM is off on SM12x through the gate record),
# 0.25.0 and 0.25.1 (SM120 kernels)
@pytest.mark.parametrize("vllm,sgl_deep_gemm", [("0.25.1", "0.1.5.post1"), ("0.25.0", "0.1.7"), ("0.24.0", "0.1.7")])
def test_releases_with_sm120_kernels_keep_their_own(tmp_path, vllm, sgl_deep_gemm):
    pytest.importorskip("triton")
    root = write_tree(tmp_path, {**STANDINS, **dist_infos({"vllm": vllm, "sgl-deep-gemm": sgl_deep_gemm})})
    out = _run(root)
    assert out["vllm_contiguous"] == ERR and out["sglang_masked"] == ERR
    assert out["supports_current_device"] is False
    assert not any(state == "applied" for state in out["outcomes"].values()), out["outcomes"]


def test_records_are_specific():
    from sm12x.patches import deep_gemm_moe

    for p in deep_gemm_moe.PATCHES:
        assert p.library in ("vllm", "deep_gemm") and p.versions not in ("", "*") and p.fixed_in
        assert p.upstream and len(p.why) > 60
    assert json.dumps([p.name for p in deep_gemm_moe.PATCHES])

"""The DeepGEMM-compatible grouped GEMM front end: names and signatures as DeepGEMM's, the M
alignment helpers, every bad input rejected by name, and the wrappers module stdlib-only."""
import inspect
import sys

import pytest
import torch

from sm12x.frontends.deep_gemm import moe as api
from sm12x.kernels.moe.cases import make_contiguous, make_masked, make_weights

pytestmark = pytest.mark.cpu_only

# deepseek-ai/DeepGEMM v2.6.1 csrc/apis/gemm.hpp py::arg lists
CONTIGUOUS = ["a", "b", "d", "grouped_layout", "recipe", "recipe_a", "recipe_b", "compiled_dims",
              "disable_ue8m0_cast", "use_psum_layout", "ensure_zero_padding", "expected_m_for_psum_layout"]
MASKED = ["a", "b", "d", "masked_m", "expected_m", "recipe", "recipe_a", "recipe_b", "compiled_dims",
          "disable_ue8m0_cast"]


def test_names_and_signatures():
    for name in api.NAMES + api.HELPER_NAMES:
        assert callable(getattr(api, name))
    for name in ("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_contiguous"):
        params = inspect.signature(getattr(api, name)).parameters
        assert list(params) == CONTIGUOUS
        assert params["compiled_dims"].default == "nk" and params["ensure_zero_padding"].default is True
    for name in ("m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked", "fp8_m_grouped_gemm_nt_masked"):
        assert list(inspect.signature(getattr(api, name)).parameters) == MASKED


def test_alignment_helpers():
    assert api.get_mk_alignment_for_contiguous_layout() == 128
    api.set_mk_alignment_for_contiguous_layout(64)
    try:
        assert api.get_mk_alignment_for_contiguous_layout() == 64
        with api.mk_alignment(32):
            assert api.get_mk_alignment_for_contiguous_layout() == 32
        assert api.get_mk_alignment_for_contiguous_layout() == 64
    finally:
        api.set_mk_alignment_for_contiguous_layout(128)
    assert api.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    assert api.get_theoretical_mk_alignment_for_contiguous_layout(10) == 16
    assert api.get_theoretical_mk_alignment_for_contiguous_layout(48) == 64
    assert api.get_theoretical_mk_alignment_for_contiguous_layout(4096, num_groups=256) == 16
    assert api.get_theoretical_mk_alignment_for_contiguous_layout(1000) == 128
    for bad in (0, 8, 24, 2048, True, 64.0):
        with pytest.raises(ValueError, match="set_mk_alignment_for_contiguous_layout.*new_value"):
            api.set_mk_alignment_for_contiguous_layout(bad)


def _contiguous_inputs():
    a, sa, layout, m = make_contiguous([5, 3], 128, alignment=128)
    b, sb = make_weights(2, 32, 128, fp4=True, fmt="packed")
    d = torch.empty(m, 32, dtype=torch.bfloat16)
    return (a, sa), (b, sb), d, layout


def _masked_inputs():
    a, sa, masked = make_masked(2, 8, 128, [3, 8])
    b, sb = make_weights(2, 32, 128, fp4=True, fmt="packed")
    return (a, sa), (b, sb), torch.empty(2, 8, 32, dtype=torch.bfloat16), masked


def _bad_contiguous():
    a, b, d, layout = _contiguous_inputs()
    (av, sa), (bv, sb) = a, b
    yield "a", dict(a=(av.float(), sa))
    yield "b", dict(a=(av[:, :64], sa))  # K = 64 against the weights' 128
    yield "a", dict(a=av)
    yield "b", dict(b=(bv[:, :, :32], sb))
    yield "b", dict(b=(bv.float(), sb))
    yield "b", dict(b=(bv, sb.to(torch.int16)))
    yield "b", dict(b=(bv, torch.ones(2, 32, 1)))  # per-128 scales on FP4 weights
    yield "a", dict(a=(av, sa.double()))
    yield "d", dict(d=d.float())
    yield "d", dict(d=d[:, :16])
    yield "grouped_layout", dict(grouped_layout=layout.long())
    yield "grouped_layout", dict(grouped_layout=layout[:-1])
    yield "grouped_layout", dict(use_psum_layout=True)
    yield "expected_m_for_psum_layout", dict(expected_m_for_psum_layout=8)
    yield "recipe", dict(recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(1, 32))
    yield "recipe_b", dict(recipe_a=(1, 128))
    yield "recipe", dict(recipe=(128, 1, 128))
    yield "compiled_dims", dict(compiled_dims=None)
    yield "disable_ue8m0_cast", dict(disable_ue8m0_cast=1)


@pytest.mark.parametrize("arg,change", list(_bad_contiguous()))
def test_bad_contiguous_inputs_are_named(arg, change):
    a, b, d, layout = _contiguous_inputs()
    kwargs = dict(a=a, b=b, d=d, grouped_layout=layout)
    kwargs.update(change)
    with pytest.raises(ValueError, match=f"m_grouped_fp8_fp4_gemm_nt_contiguous: argument '{arg}'"):
        api.m_grouped_fp8_fp4_gemm_nt_contiguous(**kwargs)


def _bad_masked():
    a, b, d, masked = _masked_inputs()
    yield "a", dict(a=(a[0][0], a[1][0]))
    yield "a", dict(a=(a[0][:1], a[1][:1]))
    yield "d", dict(d=d[:, :4])
    yield "masked_m", dict(masked_m=masked.long())
    yield "masked_m", dict(masked_m=masked[:1])
    yield "expected_m", dict(expected_m=0)
    yield "expected_m", dict(expected_m=2.0)


@pytest.mark.parametrize("arg,change", list(_bad_masked()))
def test_bad_masked_inputs_are_named(arg, change):
    a, b, d, masked = _masked_inputs()
    kwargs = dict(a=a, b=b, d=d, masked_m=masked, expected_m=4)
    kwargs.update(change)
    with pytest.raises(ValueError, match=f"m_grouped_fp8_gemm_nt_masked: argument '{arg}'"):
        api.m_grouped_fp8_gemm_nt_masked(**kwargs)


def test_alias_names_itself_in_errors():
    a, b, d, layout = _contiguous_inputs()
    with pytest.raises(ValueError, match="m_grouped_fp8_gemm_nt_contiguous: argument 'd'"):
        api.m_grouped_fp8_gemm_nt_contiguous(a, b, d.float(), layout)


def test_empty_m_returns_without_launch():
    a, b, d, layout = _contiguous_inputs()
    (av, sa) = a
    api.m_grouped_fp8_fp4_gemm_nt_contiguous((av[:0], sa[:0]), b, d[:0], layout[:0])


def test_wrappers_module_is_stdlib_only():
    from tests_support import REPO, run_py

    proc = run_py("import sys, sm12x.frontends.deep_gemm.moe_wrappers, sm12x.patches.deep_gemm_moe\n"
                  "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))",
                  pythonpath=[REPO])
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_shim_carries_the_grouped_names():
    import importlib

    shims = importlib.import_module("sm12x.shims")
    manifest = importlib.import_module("sm12x.kernels.manifest")
    assert "deep_gemm" in shims.SHIMS
    assert manifest.library_functions("deep_gemm")["m_grouped_fp8_fp4_gemm_nt_contiguous"] == \
        "sm12x.frontends.deep_gemm.moe:m_grouped_fp8_fp4_gemm_nt_contiguous"
    assert "m_grouped_fp8_fp4_gemm_nt_contiguous" in api.NAMES
    assert sys.modules["sm12x.frontends.deep_gemm.moe"] is api

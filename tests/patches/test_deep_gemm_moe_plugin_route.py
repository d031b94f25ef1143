"""The plugin route of the DeepGEMM MoE records (:mod:`sm12x.patches.deep_gemm_moe`): vLLM's
``vllm.utils.deep_gemm._lazy_init`` resolved DeepGEMM's grouped GEMMs into its ``_grouped_*_impl``
globals before sm12x was installed, so those globals hold the originals until the records'
consumers rebind them. Two DeepGEMMs as vLLM 0.22.1 finds them: its vendored copy (every function a
separate ``_C`` object, the masked legacy name an alias) and a top-level sgl-deep-gemm 0.1.4, which
binds the FP8 and FP8 x FP4 names to one function (an alias a copy is otherwise rebound through
only under the target's own name). The control run empties the records' consumers: the cached
originals then raise, so the test fails without the rebinding."""
import textwrap

import pytest
from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ERR = "Unsupported architecture or scaling factor types"


def _raising(name):
    return f"def {name}(*args, **kwargs):\n    raise RuntimeError({ERR!r})\n"


_ALIGNMENT = textwrap.dedent("""
    _align = [128]
    def set_mk_alignment_for_contiguous_layout(v):
        _align[0] = v
    def get_mk_alignment_for_contiguous_layout():
        return _align[0]
""")
# vLLM 0.22.1's vendored DeepGEMM 2.5.0: separate _C functions, one legacy alias
VENDORED = (_ALIGNMENT + "".join(_raising(n) for n in (
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked"))
    + "fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked\n")
# sgl-deep-gemm 0.1.4: the FP8 names are the FP8 x FP4 functions
SGL_DEEP_GEMM = (_ALIGNMENT + _raising("m_grouped_fp8_fp4_gemm_nt_contiguous")
                 + _raising("m_grouped_fp8_fp4_gemm_nt_masked")
                 + "m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous\n"
                 + "fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked\n")

VLLM = {
    "vllm/__init__.py": "",
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/deep_gemm/__init__.py": VENDORED,
    "vllm/utils/__init__.py": "",
    # vLLM 0.22.1's wrapper module: an installed deep_gemm first, then the vendored copy, resolved
    # once into module globals
    "vllm/utils/deep_gemm.py": """
        import importlib
        _grouped_impl = None
        _grouped_masked_impl = None
        _grouped_fp4_impl = None
        def _import_deep_gemm():
            try:
                return importlib.import_module("deep_gemm")
            except ImportError:
                return importlib.import_module("vllm.third_party.deep_gemm")
        def _lazy_init():
            global _grouped_impl, _grouped_masked_impl, _grouped_fp4_impl
            dg = _import_deep_gemm()
            _grouped_impl = getattr(dg, "m_grouped_fp8_gemm_nt_contiguous", None)
            _grouped_masked_impl = getattr(dg, "fp8_m_grouped_gemm_nt_masked", None)
            _grouped_fp4_impl = getattr(dg, "m_grouped_fp8_fp4_gemm_nt_contiguous", None)
        def m_grouped_fp8_fp4_gemm_nt_contiguous(*args, **kwargs):
            return _grouped_fp4_impl(*args, disable_ue8m0_cast=True, **kwargs)
        def m_grouped_fp8_gemm_nt_contiguous(*args, **kwargs):
            return _grouped_impl(*args, disable_ue8m0_cast=True, **kwargs)
        def fp8_m_grouped_gemm_nt_masked(*args, **kwargs):
            return _grouped_masked_impl(*args, **kwargs)
    """,
}

CALLS = """
import dataclasses, json, sys, torch
sys.path.insert(0, {repo!r})
from sm12x.kernels.common.tolerance import calc_diff
from sm12x.kernels.gemm.scales import read_scales
from sm12x.kernels.moe.cases import make_contiguous, make_masked, make_weights
from sm12x.kernels.moe.reference import ref_grouped_contiguous, ref_grouped_masked

if {control}:  # the records without their consumers
    from sm12x.patches import deep_gemm_moe
    deep_gemm_moe.PATCHES = tuple(dataclasses.replace(p, consumers=()) for p in deep_gemm_moe.PATCHES)

import vllm.utils.deep_gemm as vdg
vdg._lazy_init()  # vLLM resolved DeepGEMM before sm12x was installed (plugin route)
import sm12x.plugin; sm12x.plugin.register()

# which record's replacement each cached global holds
res = {{"ours": {{n: getattr(vdg, n).__sm12x_patch__ for n in ("_grouped_impl", "_grouped_masked_impl",
                                                            "_grouped_fp4_impl")
                 if getattr(getattr(vdg, n), "__sm12x_patch__", None)}}}}

def attempt(key, fn):
    try:
        res[key] = fn()
    except RuntimeError as e:
        res[key] = str(e)

def contiguous(name, fp4):
    a, sa, layout, m = make_contiguous([5, 0, 40], 256, alignment=128)
    b, sb = make_weights(3, 64, 256, fp4=fp4, fmt="fp32")
    d = torch.zeros(m, 64, dtype=torch.bfloat16)
    recipe = dict(recipe_a=(1, 128), recipe_b=(1, 32)) if fp4 else {{}}
    getattr(vdg, name)((a, sa), (b.view(torch.int8) if fp4 else b, sb), d, layout, **recipe)
    ref, defined = ref_grouped_contiguous(a, read_scales("t", "a", sa, m, 256), b,
                                          read_scales("t", "b", sb, 64, 256, groups=3), layout, fp4=fp4)
    return calc_diff(d.float()[defined], ref[defined])

def masked():
    a, sa, mm = make_masked(3, 16, 256, [16, 0, 7], fmt="packed")
    b, sb = make_weights(3, 64, 256, fp4=False, fmt="fp32")
    d = torch.zeros(3, 16, 64, dtype=torch.bfloat16)
    vdg.fp8_m_grouped_gemm_nt_masked((a, sa), (b, sb), d, mm, 8)
    ref, defined = ref_grouped_masked(a, read_scales("t", "a", sa, 16, 256, groups=3), b,
                                      read_scales("t", "b", sb, 64, 256, groups=3), mm, fp4=False)
    return calc_diff(d.float()[defined], ref[defined])

if "_grouped_fp4_impl" in vdg.__dict__ and {fp4}:
    attempt("fp4_contiguous", lambda: contiguous("m_grouped_fp8_fp4_gemm_nt_contiguous", True))
if {sgl}:
    attempt("fp8_contiguous", lambda: contiguous("m_grouped_fp8_gemm_nt_contiguous", False))
    attempt("masked", masked)
print(json.dumps(res))
"""

_SGL = ({"deep_gemm/__init__.py": SGL_DEEP_GEMM}, {"vllm": "0.22.1", "sgl-deep-gemm": "0.1.4"})
_FP4_RECORDS = "deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous,deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked"
# case: (extra files, releases, SM12X_SKIP, the record each cached global must hold)
CASES = {
    # vLLM 0.22.1 alone: its vendored DeepGEMM (only the FP8 x FP4 contiguous GEMM has a record)
    "vendored": ({}, {"vllm": "0.22.1"}, "",
                 {"_grouped_fp4_impl": "vllm.third_party.deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous"}),
    # vLLM 0.22.1 with sgl-deep-gemm 0.1.4 installed as deep_gemm: each global its own name's record
    "sgl-deep-gemm": (*_SGL, "", {"_grouped_impl": "deep_gemm.m_grouped_fp8_gemm_nt_contiguous",
                                  "_grouped_masked_impl": "deep_gemm.fp8_m_grouped_gemm_nt_masked",
                                  "_grouped_fp4_impl": "deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous"}),
    # the FP8 x FP4 records skipped: the aliased FP8 names' globals are still rebound
    "sgl-deep-gemm-fp8-only": (*_SGL, _FP4_RECORDS,
                               {"_grouped_impl": "deep_gemm.m_grouped_fp8_gemm_nt_contiguous",
                                "_grouped_masked_impl": "deep_gemm.fp8_m_grouped_gemm_nt_masked"}),
}


def _run(tmp_path, case, control):
    extra, releases, skip, _ = CASES[case]
    root = write_tree(tmp_path, {**VLLM, **extra, **dist_infos(releases)})
    code = CALLS.format(repo=REPO, control=control, sgl=case.startswith("sgl"), fp4=not skip)
    return last_json(run_py(code, pythonpath=[root], env={"TRITON_INTERPRET": "1", "SM12X_SKIP": skip}))


@pytest.mark.parametrize("case", sorted(CASES))
def test_cached_globals_reach_the_kernels(tmp_path, case):
    pytest.importorskip("triton")
    out = _run(tmp_path, case, control=False)
    assert out["ours"] == CASES[case][3], out
    for key in ("fp4_contiguous", "fp8_contiguous", "masked"):
        if key in out:
            assert isinstance(out[key], float) and out[key] < 1e-4, (key, out)


@pytest.mark.parametrize("case", ["vendored", "sgl-deep-gemm-fp8-only"])
def test_without_consumers_the_cached_originals_run(tmp_path, case):
    pytest.importorskip("triton")
    out = _run(tmp_path, case, control=True)
    assert out["ours"] == {}, out
    assert all(out[k] == ERR for k in ("fp4_contiguous", "fp8_contiguous", "masked") if k in out), out

"""The SGLang MoE records (:mod:`sm12x.patches.sglang_moe`) on stand-ins shaped like SGLang
0.5.15.post1, 0.5.19 and 0.5.23: ``Fp8Config.get_quant_method``'s MoE branch as each release has
it (``flashinfer_mxfp4`` -> TRT-LLM off SM90 in 0.5.15.post1, -> CUTLASS on SM90 / SM120 from
0.5.16), ``HybridFp8NvFp4Config.get_quant_method`` with its MTP hard-code (every release), the
runner-backend global and the speculative context the draft model is built under. The quant
methods' ``apply`` says which kernels would run; the TRT-LLM one raises as FlashInfer's
SM100-only trtllm-gen MoE does on SM12x."""
import json

import pytest
from tests_support import REPO, dist_infos, last_json, run_py, write_tree

TRTLLM_ERR = "trtllm-gen MoE kernels are built for SM100 only"

_UTILS = """
    import contextlib
    from enum import Enum

    class MoeRunnerBackend(Enum):
        AUTO = "auto"
        DEEP_GEMM = "deep_gemm"
        TRITON = "triton"
        FLASHINFER_TRTLLM_ROUTED = "flashinfer_trtllm_routed"
        FLASHINFER_CUTLASS = "flashinfer_cutlass"
        FLASHINFER_MXFP4 = "flashinfer_mxfp4"
        MARLIN = "marlin"

        def is_marlin(self):
            return self == MoeRunnerBackend.MARLIN

        def is_flashinfer_mxfp4(self):
            return self == MoeRunnerBackend.FLASHINFER_MXFP4

    MOE_RUNNER_BACKEND = None
    SPECULATIVE_MOE_RUNNER_BACKEND = None

    def get_moe_runner_backend():
        global MOE_RUNNER_BACKEND
        if MOE_RUNNER_BACKEND is None:
            MOE_RUNNER_BACKEND = MoeRunnerBackend.AUTO
        return MOE_RUNNER_BACKEND

    @contextlib.contextmanager
    def speculative_moe_backend_context():
        global MOE_RUNNER_BACKEND
        original = MOE_RUNNER_BACKEND
        try:
            MOE_RUNNER_BACKEND = SPECULATIVE_MOE_RUNNER_BACKEND or original
            yield
        finally:
            MOE_RUNNER_BACKEND = original
"""

# one wrapper class per MXFP4 method; apply() names the kernels it runs
_WRAPPER = """
    class {name}:
        def __init__(self, fp8_method, prefix):
            self._fp8 = fp8_method
            self.prefix = prefix
        def apply(self, layer, dispatch_output):
            {body}
"""


def _wrapper(name, body):
    return _WRAPPER.format(name=name, body=body)


def _fp8_module(release):
    # 0.5.15.post1: SM100 -> TRT-LLM, SM90 (not SM100) -> CUTLASS; 0.5.16+: SM90 / SM120 -> CUTLASS
    cutlass_on = ("_is_sm90() and not _is_sm100()" if release == "0.5.15.post1"
                  else "_is_sm90() or _is_sm120()")
    return f"""
        from sglang.srt.layers.moe.utils import get_moe_runner_backend

        def _is_sm90():
            return False
        def _is_sm100():
            return False
        def _is_sm120():  # the stand-in GPU: SM120
            return True

        class Fp8MoEMethod:
            def __init__(self, quant_config):
                self.quant_config = quant_config
                self.runner_backend = get_moe_runner_backend().value
            def apply(self, layer, dispatch_output):
                return "fp8-moe runner " + self.runner_backend

        class Fp8LinearMethod:
            pass

        class Fp8Config:
            def __init__(self, is_fp4_experts=True):
                self.is_fp4_experts = is_fp4_experts
            def get_quant_method(self, layer, prefix):
                from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
                if isinstance(layer, FusedMoE):
                    fp8_method = Fp8MoEMethod(self)
                    if self.is_fp4_experts and get_moe_runner_backend().is_marlin():
                        from sglang.srt.layers.quantization.mxfp4_marlin_moe import Mxfp4MarlinMoEMethod
                        return Mxfp4MarlinMoEMethod(fp8_method, prefix=prefix)
                    if self.is_fp4_experts and get_moe_runner_backend().is_flashinfer_mxfp4():
                        if {cutlass_on}:
                            from sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe import (
                                Mxfp4FlashinferCutlassMoEMethod)
                            return Mxfp4FlashinferCutlassMoEMethod(fp8_method, prefix=prefix)
                        from sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe import (
                            Mxfp4FlashinferTrtllmMoEMethod)
                        return Mxfp4FlashinferTrtllmMoEMethod(fp8_method, prefix=prefix)
                    return fp8_method
                return Fp8LinearMethod()
    """


_MODELOPT = """
    from sglang.srt.layers.quantization.fp8 import Fp8Config

    class ModelOptNvFp4FusedMoEMethod:
        def __init__(self, config):
            self.config = config
        def apply(self, layer, dispatch_output):
            return "nvfp4 experts"

    class ModelOptFp4Config:
        def __init__(self, exclude_modules):
            self.exclude_modules = exclude_modules
        def is_layer_excluded(self, prefix):
            return any(prefix.startswith(m) for m in self.exclude_modules)

    class HybridFp8NvFp4Config(Fp8Config):
        def __init__(self, fp8_config, nvfp4_config):
            self.__dict__.update(fp8_config.__dict__)
            self.nvfp4_config = nvfp4_config
        def get_quant_method(self, layer, prefix):
            from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
            if isinstance(layer, FusedMoE):
                if not self.nvfp4_config.is_layer_excluded(prefix):
                    return ModelOptNvFp4FusedMoEMethod(self.nvfp4_config)
                # Fall back to MXFP4 for MTP MoE layers
                if self.is_fp4_experts:
                    from sglang.srt.layers.quantization.fp8 import Fp8MoEMethod
                    from sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe import (
                        Mxfp4FlashinferTrtllmMoEMethod)
                    return Mxfp4FlashinferTrtllmMoEMethod(Fp8MoEMethod(self), prefix=prefix)
            return super().get_quant_method(layer, prefix)
"""


def standin_sglang(release):
    """The stand-in SGLang tree of ``release`` (module path -> source)."""
    q = "sglang/srt/layers/quantization/"
    return {
        "sglang/__init__.py": "",
        "sglang/srt/__init__.py": "",
        "sglang/srt/layers/__init__.py": "",
        "sglang/srt/layers/moe/__init__.py": "",
        "sglang/srt/layers/moe/utils.py": _UTILS,
        "sglang/srt/layers/moe/fused_moe_triton/__init__.py": "class FusedMoE:\n    pass\n",
        # ENABLE_JIT_DEEPGEMM: off on SM12x in 0.5.15.post1 / 0.5.19; 0.5.23 with an SM120 DeepGEMM
        "sglang/srt/layers/deep_gemm_wrapper/__init__.py": "",
        "sglang/srt/layers/deep_gemm_wrapper/configurer.py":
            "import os\nENABLE_JIT_DEEPGEMM = os.environ.get('STANDIN_DEEP_GEMM') == '1'\n",
        q + "__init__.py": "",
        q + "fp8.py": _fp8_module(release),
        q + "modelopt_quant.py": _MODELOPT,
        q + "mxfp4_flashinfer_trtllm_moe.py": _wrapper("Mxfp4FlashinferTrtllmMoEMethod",
                                                      f"raise RuntimeError({TRTLLM_ERR!r})"),
        q + "mxfp4_marlin_moe.py": _wrapper("Mxfp4MarlinMoEMethod", "return 'marlin w4a16'"),
        q + "mxfp4_flashinfer_cutlass_moe.py": _wrapper("Mxfp4FlashinferCutlassMoEMethod",
                                                       "return 'flashinfer cutlass w4a8'"),
    }


BUILD = """
import json, sys
sys.path.insert(0, {repo!r})
if {install_first}:
    import sm12x.plugin; sm12x.plugin.register()
import sglang.srt.layers.moe.utils as moe_utils
from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.quantization.fp8 import Fp8Config
from sglang.srt.layers.quantization.modelopt_quant import HybridFp8NvFp4Config, ModelOptFp4Config
if not {install_first}:  # plugin route: SGLang's modules were imported before sm12x
    import sm12x.plugin; sm12x.plugin.register()

def run(method):
    try:
        return method.apply(None, None)
    except RuntimeError as e:
        return str(e)

hybrid = HybridFp8NvFp4Config(Fp8Config(is_fp4_experts=True), ModelOptFp4Config(["model.mtp"]))
moe_utils.MOE_RUNNER_BACKEND = moe_utils.MoeRunnerBackend({target!r})
res = {{"target_experts": run(hybrid.get_quant_method(FusedMoE(), "model.layers.3.mlp.experts")),
        "linear": type(hybrid.get_quant_method(object(), "model.layers.3.attn")).__name__,
        "fp8_target": run(Fp8Config().get_quant_method(FusedMoE(), "model.layers.3.mlp.experts"))}}
res["draft"] = {{}}
for spec in {specs!r}:
    moe_utils.SPECULATIVE_MOE_RUNNER_BACKEND = moe_utils.MoeRunnerBackend(spec) if spec else None
    with moe_utils.speculative_moe_backend_context():  # the draft model is built under it
        res["draft"][spec or "inherited"] = run(hybrid.get_quant_method(FusedMoE(), "model.mtp.0.mlp.experts"))
from sm12x import apply
res["outcomes"] = {{k: v[0] for k, v in apply.OUTCOMES.items() if k.startswith("sglang.moe")}}
print(json.dumps(res))
"""

SPECS = ("", "marlin", "flashinfer_mxfp4", "deep_gemm", "triton")
MARLIN, CUTLASS = "marlin w4a16", "flashinfer cutlass w4a8"


def _build(tmp_path, release, target="flashinfer_trtllm_routed", install_first=True, env=None):
    root = write_tree(tmp_path, {**standin_sglang(release), **dist_infos({"sglang": release})})
    code = BUILD.format(repo=REPO, install_first=install_first, target=target, specs=SPECS)
    return last_json(run_py(code, pythonpath=[root], env=env))


@pytest.mark.parametrize("release,deep_gemm", [("0.5.15.post1", "0"), ("0.5.19", "0"), ("0.5.23", "0"),
                                               ("0.5.23", "1")])
@pytest.mark.parametrize("install_first", [True, False], ids=["sitecustomize", "plugin"])
def test_mtp_experts_leave_the_sm100_kernel(tmp_path, release, deep_gemm, install_first):
    """The MTP layer's MXFP4 experts: the runner the user names when its method has SM12x kernels,
    Marlin otherwise (the inherited flashinfer_trtllm_routed, triton, deep_gemm while SGLang runs
    no DeepGEMM); nothing else changes."""
    out = _build(tmp_path, release, install_first=install_first, env={"STANDIN_DEEP_GEMM": deep_gemm})
    draft = out["draft"]
    assert draft["inherited"] == MARLIN and draft["triton"] == MARLIN, out
    assert draft["marlin"] == MARLIN, out
    # DeepGEMM's grouped GEMMs when SGLang runs DeepGEMM
    assert draft["deep_gemm"] == ("fp8-moe runner deep_gemm" if deep_gemm == "1" else MARLIN), out
    # 0.5.15.post1's Fp8Config sends flashinfer_mxfp4 to TRT-LLM (then Marlin); 0.5.16+ to CUTLASS
    assert draft["flashinfer_mxfp4"] == (MARLIN if release == "0.5.15.post1" else CUTLASS), out
    assert out["target_experts"] == "nvfp4 experts" and out["linear"] == "Fp8LinearMethod", out
    assert TRTLLM_ERR not in json.dumps(draft), out
    assert out["outcomes"]["sglang.moe.HybridFp8NvFp4Config.get_quant_method"] == "applied", out


@pytest.mark.parametrize("release,expected", [("0.5.15.post1", MARLIN), ("0.5.16", CUTLASS), ("0.5.19", CUTLASS),
                                              ("0.5.23", CUTLASS)])
def test_target_flashinfer_mxfp4(tmp_path, release, expected):
    """--moe-runner-backend flashinfer_mxfp4 for MXFP4 target experts: 0.5.15.post1's TRT-LLM pick
    becomes Marlin (the Fp8Config record); 0.5.16+ pick CUTLASS themselves (record retired)."""
    out = _build(tmp_path, release, target="flashinfer_mxfp4")
    assert out["fp8_target"] == expected, out
    state = out["outcomes"]["sglang.moe.Fp8Config.get_quant_method"]
    assert state == ("applied" if release == "0.5.15.post1" else "skipped"), out


@pytest.mark.parametrize("env,release", [({"SM12X_SKIP": "sglang.moe"}, "0.5.23"),
                                         ({"SM12X_ARCH": "9.0"}, "0.5.23"),
                                         ({}, "0.5.24")])
def test_sglang_keeps_its_choice(tmp_path, env, release):
    """Skipped by name, off SM12x, or past the checked range: SGLang's own choices, TRT-LLM included."""
    out = _build(tmp_path, release, target="flashinfer_mxfp4", env=env)
    assert out["draft"]["inherited"] == TRTLLM_ERR and out["draft"]["marlin"] == TRTLLM_ERR, out
    assert not any(state == "applied" for state in out["outcomes"].values()), out


def test_records_are_specific():
    from sm12x.patches import sglang_moe

    for p in sglang_moe.PATCHES:
        assert p.library == "sglang" and p.versions not in ("", "*") and p.upstream and len(p.why) > 80
        assert p.name.startswith("sglang.moe.")


# --- the runner choice (server arguments) -------------------------------------------------------

# releases whose ServerArgs._handle_moe_kernel_config imports the pass at the call (0.5.19 moved it to moe_hook)
SERVER_ARGS_CALLER = ("0.5.15.post1", "0.5.16", "0.5.17", "0.5.18")


def standin_arg_groups(release):
    """SGLang's MoE kernel-config pass as ``release`` calls it: 0.5.19+ from ``moe_hook`` (a
    module-level copy) with ``model_config_of``; 0.5.15.post1-0.5.18 from ``ServerArgs`` (imported
    at the call) with the view's ``get_model_config``."""
    overrides = """
        def _moe_runner_backend_quant_constraints(view):
            backend = view.moe_runner_backend
            if backend == "auto" and view.quantization == "modelopt_fp4":
                backend = "flashinfer_cutlass"
            return {"moe_runner_backend": backend} if backend != view.moe_runner_backend else {}
    """
    if release in SERVER_ARGS_CALLER:
        caller = {"sglang/srt/server_args.py": """
            def handle_moe_kernel_config(view):
                from sglang.srt.arg_groups.overrides import _moe_runner_backend_quant_constraints
                return _moe_runner_backend_quant_constraints(view).get("moe_runner_backend", view.moe_runner_backend)
        """}
    else:
        overrides += """
        def model_config_of(view):
            return view.get_model_config()
        """
        caller = {"sglang/srt/arg_groups/moe_hook.py": """
            from sglang.srt.arg_groups.overrides import _moe_runner_backend_quant_constraints

            def handle_moe_kernel_config(view):
                return _moe_runner_backend_quant_constraints(view).get("moe_runner_backend", view.moe_runner_backend)
        """}
    return {"sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/srt/arg_groups/__init__.py": "",
            "sglang/srt/arg_groups/overrides.py": overrides, **caller}


RESOLVE = """
import json, sys, types
sys.path.insert(0, {repo!r})
if {install_first}:
    import sm12x.plugin; sm12x.plugin.register()
import importlib
caller = importlib.import_module({caller!r})
if not {install_first}:  # plugin route: moe_hook took its copy before sm12x
    import sm12x.plugin; sm12x.plugin.register()

def view(runner, arch="DeepseekV4ForCausalLM", nvfp4=True, a2a="none", quantization="fp8"):
    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=[arch]),
                                   nvfp4_moe_meta={{"group_size": 16}} if nvfp4 else None)
    return types.SimpleNamespace(moe_runner_backend=runner, moe_a2a_backend=a2a, quantization=quantization,
                                 get_model_config=lambda: config)

res = {{name: caller.handle_moe_kernel_config(v) for name, v in {{
    "hybrid_routed": view("flashinfer_trtllm_routed"),
    "hybrid_trtllm": view("flashinfer_trtllm"),
    "hybrid_marlin": view("marlin"),
    "hybrid_deepep": view("flashinfer_trtllm_routed", a2a="deepep"),
    "fp4_experts": view("flashinfer_mxfp4", nvfp4=False),
    "other_model": view("flashinfer_trtllm_routed", arch="DeepseekV3ForCausalLM"),
    "modelopt_fp4": view("auto", nvfp4=False, quantization="modelopt_fp4"),
}}.items()}}
from sm12x import apply
res["state"] = apply.OUTCOMES["sglang.moe.runner_choice"][0]
print(json.dumps(res))
"""


def _resolve(tmp_path, release, install_first=True, env=None):
    root = write_tree(tmp_path, {**standin_arg_groups(release), **dist_infos({"sglang": release})})
    caller = "sglang.srt.server_args" if release in SERVER_ARGS_CALLER else "sglang.srt.arg_groups.moe_hook"
    code = RESOLVE.format(repo=REPO, install_first=install_first, caller=caller)
    return last_json(run_py(code, pythonpath=[root], env=env))


@pytest.mark.parametrize("release", ["0.5.17", "0.5.18", "0.5.19", "0.5.23"])
@pytest.mark.parametrize("install_first", [True, False], ids=["sitecustomize", "plugin"])
def test_nvfp4_checkpoints_leave_trtllm(tmp_path, release, install_first):
    """DeepSeek-V4 FP8 + NVFP4 checkpoints without all-to-all: a TRT-LLM runner becomes marlin;
    every other resolution (other models, DeepEP, SGLang's own SM120 picks) is SGLang's."""
    out = _resolve(tmp_path, release, install_first)
    assert out["hybrid_routed"] == "marlin" and out["hybrid_trtllm"] == "marlin", out
    assert out["hybrid_marlin"] == "marlin", out
    assert out["hybrid_deepep"] == "flashinfer_trtllm_routed", out
    assert out["fp4_experts"] == "flashinfer_mxfp4" and out["other_model"] == "flashinfer_trtllm_routed", out
    assert out["modelopt_fp4"] == "flashinfer_cutlass" and out["state"] == "applied", out


@pytest.mark.parametrize("release,env", [("0.5.15.post1", {}), ("0.5.16", {}),
                                         ("0.5.23", {"SM12X_SKIP": "sglang.moe.runner_choice"}),
                                         ("0.5.23", {"SM12X_ARCH": "9.0"})])
def test_runner_choice_left_alone(tmp_path, release, env):
    """0.5.15.post1 / 0.5.16 (their top-k scales the routed output for the NVFP4 Marlin too, which
    scales it again), skipped, or off SM12x: SGLang's TRT-LLM pick stays."""
    out = _resolve(tmp_path, release, env=env)
    assert out["hybrid_routed"] == "flashinfer_trtllm_routed" and out["state"] == "skipped", out

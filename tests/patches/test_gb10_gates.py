"""The GB10 (sm_121) gate records (:mod:`sm12x.patches.gb10`) on stand-in SGLang trees shaped like
each release: the gate answers as on 12.0 on GB10, is left alone on 12.0, and is skipped outside
its checked range.

The stand-ins keep the shape that matters: ``sglang.srt.utils`` star-imports ``get_device_sm`` from
``sglang.srt.utils.common``; the DeepGEMM configurer imports it from ``sglang.srt.utils`` and decides
``ENABLE_JIT_DEEPGEMM`` while it is imported (0.5.15.post1 / 0.5.19: off for 120 only; 0.5.20: on
for 120 with DeepGEMM's SM120 entry point, UE8M0 scales for 120 only; 0.5.23: off for 120 and 121
unless DeepGEMM has the SM120 APIs); the wrapper package re-exports the constant;
other modules take their own copy of ``get_device_sm``. SGLang's capability comes from
``STANDIN_SM`` (what torch / NVML would report), sm12x's from ``SM12X_ARCH``.
"""
import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

GATE = "sglang.gb10.deep_gemm_gate"

COMMON = {
    "deep_gemm/__init__.py": """
        def fp8_einsum(*args, **kwargs): raise RuntimeError("stand-in")
        def m_grouped_fp8_fp4_gemm_nt_contiguous(*args, **kwargs): raise RuntimeError("stand-in")
        def transform_sf_into_required_layout(*args, **kwargs): raise RuntimeError("stand-in")
    """,
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/utils/__init__.py": "from sglang.srt.utils.common import *\n",
    "sglang/srt/utils/common.py": """
        import os

        def is_cuda():
            return True

        def is_musa():
            return False

        def is_sm100_supported():
            return get_device_sm() // 10 == 10

        def get_device_sm():
            return int(os.environ["STANDIN_SM"])
    """,
    "sglang/srt/environ.py": """
        class _Flag:
            def get(self):
                return True

        class envs:
            SGLANG_ENABLE_JIT_DEEPGEMM = _Flag()
    """,
    "sglang/srt/runtime_context.py": """
        from sglang.srt.utils import is_sm100_supported

        class _Platform:
            @property
            def is_sm100(self):
                return is_sm100_supported()

        def get_platform():
            return _Platform()
    """,
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/deep_gemm_wrapper/__init__.py": "from .entrypoint import *\n",
    "sglang/srt/layers/deep_gemm_wrapper/entrypoint.py": """
        from sglang.srt.layers.deep_gemm_wrapper.configurer import (DEEPGEMM_BLACKWELL, DEEPGEMM_SCALE_UE8M0,
                                                                    ENABLE_JIT_DEEPGEMM)
    """,
    # another model module's own copy, read at import (deepseek_common/utils.py takes one)
    "sglang/srt/models/__init__.py": "",
    "sglang/srt/models/deepseek_common/__init__.py": "",
    "sglang/srt/models/deepseek_common/utils.py": """
        from sglang.srt.utils import get_device_sm

        _device_sm = get_device_sm()
    """,
    # a function of the gate's name outside the configurer: not the question the record answers
    "sglang/srt/other_gate.py": """
        from sglang.srt.utils import get_device_sm

        def _compute_enable_deep_gemm():
            return get_device_sm()
    """,
}

# the configurer as each release decides (0.5.15.post1: sglang.srt.utils' is_sm100_supported;
# 0.5.19: get_platform(); 0.5.23: SM120 and SM121 alike, UE8M0 scales for both)
CONFIGURER = {
    "0.5.15.post1": """
        from sglang.srt.environ import envs
        from sglang.srt.utils import get_device_sm, is_cuda, is_musa, is_sm100_supported

        _is_cuda = is_cuda()
        _is_musa = is_musa()

        def _compute_enable_deep_gemm():
            sm_version = get_device_sm()
            if (_is_cuda and sm_version < 90) or (_is_musa and sm_version < 31):
                return False
            if sm_version == 120:
                return False
            try:
                import deep_gemm  # noqa: F401
            except ImportError:
                return False
            return envs.SGLANG_ENABLE_JIT_DEEPGEMM.get()

        ENABLE_JIT_DEEPGEMM = _compute_enable_deep_gemm()
        DEEPGEMM_BLACKWELL = ENABLE_JIT_DEEPGEMM and is_sm100_supported()
        DEEPGEMM_SCALE_UE8M0 = DEEPGEMM_BLACKWELL
    """,
    "0.5.19": """
        from sglang.srt.environ import envs
        from sglang.srt.runtime_context import get_platform
        from sglang.srt.utils import get_device_sm, is_cuda, is_musa

        _is_cuda = is_cuda()
        _is_musa = is_musa()

        def _compute_enable_deep_gemm():
            sm_version = get_device_sm()
            if (_is_cuda and sm_version < 90) or (_is_musa and sm_version < 31):
                return False
            if sm_version == 120:
                return False
            if not (_is_cuda or _is_musa):
                return False
            try:
                import deep_gemm  # noqa: F401
            except ImportError:
                return False
            return envs.SGLANG_ENABLE_JIT_DEEPGEMM.get()

        ENABLE_JIT_DEEPGEMM = _compute_enable_deep_gemm()
        DEEPGEMM_BLACKWELL = ENABLE_JIT_DEEPGEMM and get_platform().is_sm100
        DEEPGEMM_SCALE_UE8M0 = DEEPGEMM_BLACKWELL
    """,
    # 0.5.20: DeepGEMM on for 120 when it has the SM120 entry point, UE8M0 scales for 120 only
    "0.5.20": """
        from sglang.srt.environ import envs
        from sglang.srt.runtime_context import get_platform
        from sglang.srt.utils import get_device_sm, is_cuda, is_musa

        _is_cuda = is_cuda()
        _is_musa = is_musa()

        def _compute_enable_deep_gemm():
            sm_version = get_device_sm()
            if (_is_cuda and sm_version < 90) or (_is_musa and sm_version < 31):
                return False
            if sm_version == 120:
                try:
                    from deep_gemm import m_grouped_fp8_fp4_gemm_nt_contiguous  # noqa: F401
                except (ImportError, AttributeError):
                    return False
            try:
                import deep_gemm  # noqa: F401
            except ImportError:
                return False
            return envs.SGLANG_ENABLE_JIT_DEEPGEMM.get()

        ENABLE_JIT_DEEPGEMM = _compute_enable_deep_gemm()
        DEEPGEMM_BLACKWELL = ENABLE_JIT_DEEPGEMM and get_platform().is_sm100
        DEEPGEMM_SCALE_UE8M0 = ENABLE_JIT_DEEPGEMM and (
            get_platform().is_sm100 or get_device_sm() == 120)
    """,
    "0.5.23": """
        from sglang.srt.environ import envs
        from sglang.srt.runtime_context import get_platform
        from sglang.srt.utils import get_device_sm, is_cuda, is_musa

        _is_cuda = is_cuda()
        _is_musa = is_musa()

        def _sm120_deep_gemm_apis_available():
            import deep_gemm
            return all(callable(getattr(deep_gemm, name, None)) for name in (
                "fp8_einsum", "m_grouped_fp8_fp4_gemm_nt_contiguous", "transform_sf_into_required_layout"))

        def _compute_enable_deep_gemm():
            if not (_is_cuda or _is_musa) or not envs.SGLANG_ENABLE_JIT_DEEPGEMM.get():
                return False
            sm_version = get_device_sm()
            if (_is_cuda and sm_version < 90) or (_is_musa and sm_version < 31):
                return False
            if sm_version in (120, 121) and not _sm120_deep_gemm_apis_available():
                return False
            return True

        ENABLE_JIT_DEEPGEMM = _compute_enable_deep_gemm()
        DEEPGEMM_BLACKWELL = ENABLE_JIT_DEEPGEMM and get_platform().is_sm100
        DEEPGEMM_SCALE_UE8M0 = ENABLE_JIT_DEEPGEMM and (
            get_platform().is_sm100 or get_device_sm() in (120, 121))
    """,
}

SITECUSTOMIZE = "from sm12x import hooks; hooks.install_watcher()"
# the plugin route: SGLang's utilities (and their get_device_sm) were imported before sm12x; the
# configurer comes later and takes its copy from sglang.srt.utils
PLUGIN_BEFORE_CONFIGURER = "import sglang.srt.utils; import sm12x; sm12x.install()"

PROBE = """
import json, sys
sys.path.insert(0, {repo!r})
{install}

import sglang.srt.layers.deep_gemm_wrapper as wrapper
from sglang.srt.layers.deep_gemm_wrapper import configurer
from sglang.srt import other_gate, utils
from sglang.srt.models.deepseek_common import utils as model_utils
from sglang.srt.utils import common
from sm12x import apply

print(json.dumps({{
    "enable": configurer.ENABLE_JIT_DEEPGEMM,
    "package_copy": wrapper.ENABLE_JIT_DEEPGEMM,
    "ue8m0": configurer.DEEPGEMM_SCALE_UE8M0,
    "utils_sm": utils.get_device_sm(),
    "model_copy_sm": model_utils._device_sm,
    "same_name_elsewhere_sm": other_gate._compute_enable_deep_gemm(),
    "wrapped": [getattr(m.get_device_sm, "__sm12x_patch__", None) for m in (common, utils, configurer)],
    "outcome": apply.OUTCOMES.get({gate!r}),
}}))
"""


def release_tree(release):
    """The stand-in files of an SGLang ``release`` (with its dist-info)."""
    return {**COMMON, "sglang/srt/layers/deep_gemm_wrapper/configurer.py": CONFIGURER[release],
            **dist_infos({"sglang": release})}


def run_release(tmp_path, release, sm12x_arch, standin_sm, extra_env=None, install=SITECUSTOMIZE):
    """Import a stand-in SGLang of ``release`` with sm12x installed by ``install``; sm12x told
    ``sm12x_arch``, SGLang's own capability query answering ``standin_sm``."""
    tree = write_tree(tmp_path, release_tree(release))
    env = {"SM12X_ARCH": sm12x_arch, "STANDIN_SM": str(standin_sm), **(extra_env or {})}
    code = PROBE.format(repo=REPO, gate=GATE, install=install)
    return last_json(run_py(code, pythonpath=[tree], env=env))


@pytest.mark.parametrize("release", ["0.5.15.post1", "0.5.19"])
def test_deep_gemm_gate_answers_as_on_sm120_on_gb10(tmp_path, release):
    """On GB10 the configurer turns DeepGEMM off as it does on 12.0 (the package's copy of the
    constant too); every other caller of get_device_sm still sees 121."""
    out = run_release(tmp_path, release, "12.1", 121)
    assert out["outcome"] == ["applied", ""], out
    assert out["wrapped"] == [GATE, GATE, GATE], out
    assert out["enable"] is False and out["package_copy"] is False and out["ue8m0"] is False, out
    assert out["utils_sm"] == 121 and out["model_copy_sm"] == 121, out
    assert out["same_name_elsewhere_sm"] == 121, out


def test_deep_gemm_scales_as_on_sm120_on_gb10(tmp_path):
    """SGLang 0.5.20 runs DeepGEMM on SM120 with UE8M0 scales, a module-level question of the
    configurer that asks for 120 only: on GB10 both answers are 12.0's, without sm12x the scales
    are SM90's float32."""
    on_sm120 = run_release(tmp_path / "sm120", "0.5.20", "12.0", 120)
    assert on_sm120["enable"] is True and on_sm120["ue8m0"] is True, on_sm120
    out = run_release(tmp_path / "gb10", "0.5.20", "12.1", 121)
    assert out["outcome"] == ["applied", ""], out
    assert out["enable"] is True and out["ue8m0"] is True and out["utils_sm"] == 121, out
    stock = run_release(tmp_path / "stock", "0.5.20", "12.1", 121, {"SM12X_DISABLE": "1"})
    assert stock["enable"] is True and stock["ue8m0"] is False, stock


def test_deep_gemm_gate_plugin_route_rebinds_the_utils_copy(tmp_path):
    """sglang.srt.utils took its copy before sm12x was installed: the record rebinds it, so a
    configurer imported afterwards still asks the wrapper."""
    out = run_release(tmp_path, "0.5.19", "12.1", 121, install=PLUGIN_BEFORE_CONFIGURER)
    assert out["outcome"] == ["applied", ""] and out["wrapped"] == [GATE, GATE, GATE], out
    assert out["enable"] is False and out["utils_sm"] == 121, out


@pytest.mark.parametrize("release", ["0.5.15.post1", "0.5.19"])
def test_deep_gemm_gate_is_wrong_on_gb10_without_sm12x(tmp_path, release):
    """What the record answers: without sm12x the same release turns DeepGEMM on for 121."""
    out = run_release(tmp_path, release, "12.1", 121, {"SM12X_DISABLE": "1"})
    assert out["outcome"] is None and out["wrapped"] == [None, None, None], out
    assert out["enable"] is True and out["package_copy"] is True, out


@pytest.mark.parametrize("release", ["0.5.15.post1", "0.5.19"])
def test_deep_gemm_gate_untouched_on_sm120(tmp_path, release):
    out = run_release(tmp_path, release, "12.0", 120)
    state, reason = out["outcome"]
    assert state == "skipped" and reason.startswith("only for compute capability 12.1"), out
    assert out["wrapped"] == [None, None, None], out
    assert out["enable"] is False and out["utils_sm"] == 120, out


def test_deep_gemm_gate_needs_gb10_even_when_forced(tmp_path):
    """SM12X_FORCE applies SM12x records on another GPU, never a GB10-only answer."""
    out = run_release(tmp_path, "0.5.19", "9.0", 90, {"SM12X_FORCE": "1"})
    assert out["outcome"][0] == "skipped" and "12.1" in out["outcome"][1], out
    assert out["wrapped"] == [None, None, None] and out["enable"] is True, out


def test_deep_gemm_gate_skipped_outside_its_range(tmp_path):
    """SGLang 0.5.21 on (here 0.5.23) asks for 120 and 121 itself: the record is skipped and SGLang's own answer,
    the same as on 12.0, stands."""
    out = run_release(tmp_path, "0.5.23", "12.1", 121)
    state, reason = out["outcome"]
    assert state == "skipped" and "outside the checked range" in reason, out
    assert out["wrapped"] == [None, None, None], out
    on_sm120 = run_release(tmp_path / "sm120", "0.5.23", "12.0", 120)
    assert out["enable"] is on_sm120["enable"] is True, (out, on_sm120)
    assert out["ue8m0"] is on_sm120["ue8m0"] is True, (out, on_sm120)


STATUS = """
import json, sys
sys.path.insert(0, {repo!r})
import io
from sm12x.commands import status
data = status.status_data()
text = io.StringIO()
status.print_status(data, stream=text)
print(json.dumps({{"gates": [[p["name"], p["state"]] for p in status.arch_gate_rows(data)],
                   "gates_line": [line for line in text.getvalue().splitlines() if line.startswith("gates:")],
                   "row": [[p["state"], p["reason"]] for p in data["patches"] if p["name"] == {gate!r}][0],
                   "skipped_by": status.summary(data)["skipped_by"]}}))
"""


@pytest.mark.parametrize("arch", ["12.1", "12.0"])
def test_status_lists_the_gates_on_gb10(tmp_path, arch):
    """``status`` on 12.1 names the GB10 gate records (here: would apply to the installed 0.5.19);
    on 12.0 they are skipped as records of another compute capability and not listed as gates."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    tree = write_tree(tmp_path, release_tree("0.5.19"))
    code = STATUS.format(repo=REPO, gate=GATE)
    out = last_json(run_py(code, pythonpath=[tree], env={"SM12X_ARCH": arch}))
    if arch == "12.1":
        assert out["gates"] == [[GATE, "would-apply"]], out
        assert len(out["gates_line"]) == 1 and f"{GATE} would-apply" in out["gates_line"][0], out
        assert out["row"] == ["would-apply", ""], out
    else:
        assert out["gates"] == [] and out["gates_line"] == [], out
        state, reason = out["row"]
        assert state == "skipped" and reason.startswith("only for compute capability 12.1"), out
        assert out["skipped_by"].get("for another compute capability", 0) >= 1, out

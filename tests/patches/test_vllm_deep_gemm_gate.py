"""The vLLM 0.24.0 DeepGEMM gate record (``vllm.platforms.cuda.support_deep_gemm``, in
:mod:`sm12x.patches.deep_gemm_dense`) on a stand-in shaped like that release: the classmethod on
``CudaPlatformBase`` that ``is_deep_gemm_supported`` reads through ``current_platform`` (an
``NvmlCudaPlatform``, whose own capability query answers; the base class has none), answering for
capability 9.0, the family 100 and, from 0.24.0, the family 120. The record answers no on the SM120
family for 0.24.0, keeps every other answer, and leaves the releases outside its range alone
(0.23.0 answers no itself; 0.25.0 on vendors a DeepGEMM with SM120 kernels). The capability comes from ``STANDIN_CAP`` (what NVML would
report); sm12x's arch from ``SM12X_ARCH`` (12.0 unless a case says otherwise)."""
import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

RECORD = "vllm.platforms.cuda.support_deep_gemm"

VLLM_024 = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": """
        from vllm.platforms.cuda import NvmlCudaPlatform

        current_platform = NvmlCudaPlatform()
    """,
    "vllm/platforms/interface.py": """
        class Platform:
            @classmethod
            def get_device_capability(cls, device_id=0):
                raise NotImplementedError

            @classmethod
            def is_device_capability(cls, capability, device_id=0):
                major, minor = cls.get_device_capability(device_id)
                return major * 10 + minor == capability

            @classmethod
            def is_device_capability_family(cls, capability, device_id=0):
                major, minor = cls.get_device_capability(device_id)
                return (major * 10 + minor) // 10 == capability // 10
    """,
    # vllm 0.24.0 vllm/platforms/cuda.py: the gate, and the NVML subclass's capability query
    "vllm/platforms/cuda.py": """
        import os

        from vllm.platforms.interface import Platform

        class CudaPlatformBase(Platform):
            @classmethod
            def support_deep_gemm(cls) -> bool:
                return (
                    cls.is_device_capability(90)
                    or cls.is_device_capability_family(100)
                    or cls.is_device_capability_family(120)
                )

        class NvmlCudaPlatform(CudaPlatformBase):
            @classmethod
            def get_device_capability(cls, device_id=0):
                major, minor = os.environ["STANDIN_CAP"].split(".")
                return int(major), int(minor)
    """,
    "vllm/utils/__init__.py": "",
    "vllm/utils/deep_gemm.py": """
        import functools

        from vllm.platforms import current_platform

        @functools.cache
        def is_deep_gemm_supported() -> bool:
            return current_platform.support_deep_gemm()
    """,
}

CALLS = """
import json, sys
sys.path.insert(0, {repo!r})
import vllm.platforms.cuda  # the plugin route: vLLM's platform module is imported before sm12x
import sm12x.plugin; sm12x.plugin.register()
from vllm.utils.deep_gemm import is_deep_gemm_supported
from sm12x import apply
print(json.dumps({{"supported": is_deep_gemm_supported(), "state": apply.OUTCOMES[{record!r}][0]}}))
"""


def _run(tmp_path, release, capability, **env):
    tree = write_tree(tmp_path, {**VLLM_024, **dist_infos({"vllm": release})})
    return last_json(run_py(CALLS.format(repo=REPO, record=RECORD), pythonpath=[tree],
                            env={"STANDIN_CAP": capability, **env}))


@pytest.mark.parametrize("capability,arch", [("12.0", "12.0"), ("12.1", "12.1")])
def test_vllm_0240_sm12x_gets_0230s_answer(tmp_path, capability, arch):
    out = _run(tmp_path, "0.24.0", capability, SM12X_ARCH=arch)
    assert out == {"supported": False, "state": "applied"}, out


@pytest.mark.parametrize("capability", ["9.0", "10.0"])
def test_vllm_0240_other_gpus_keep_deep_gemm(tmp_path, capability):
    """With the record applied (SM12X_FORCE on Hopper / Blackwell), those GPUs keep vLLM's answer."""
    out = _run(tmp_path, "0.24.0", capability, SM12X_ARCH="9.0", SM12X_FORCE="1")
    assert out == {"supported": True, "state": "applied"}, out


@pytest.mark.parametrize("release", ["0.23.0", "0.25.0", "0.25.1"])
def test_releases_outside_0240_keep_their_gate(tmp_path, release):
    out = _run(tmp_path, release, "12.0")
    assert out == {"supported": True, "state": "skipped"}, out


def test_record_is_specific():
    from sm12x.patches import deep_gemm_dense

    [p] = [p for p in deep_gemm_dense.PATCHES if p.name == RECORD]
    assert (p.library, p.versions, p.fixed_in) == ("vllm", ">=0.24.0,<0.25", "0.25.0")
    assert "47436" in p.upstream and len(p.why) > 60

"""Compile the MoE grouped GEMMs for sm_120 / sm_121 without a GPU: every configuration within the
101,376 B shared-memory limit and without register spills, and the FP4 weights on the hardware
block-scaled MMA (``kind::mxf8f6f4``), not on Triton's bf16 emulation.

The default test covers the production variants (vLLM's MXFP4 experts with packed UE8M0
activation scales, FP8 experts with per-row UE8M0 scales) for every tile class; the ``slow`` test
adds every operand variant and the psum layout (SM12X_SLOW_TESTS=1). Run it under each Triton the
images ship (scripts/compile_check_tritons.sh builds the venvs)."""
import os

import pytest
import triton

from sm12x.kernels.moe import grouped_contiguous as gc
from sm12x.kernels.moe import grouped_masked as gm

from tests_support import assert_within_sm12x_limits

TARGETS = ("sm_120", "sm_121")
PRODUCTION = tuple(v for v in gc.VARIANTS if v[0] in ("fp4 a:packed128", "fp8 b:packed-row"))


def test_compile_production_configs():
    reports = gc.compile_reports(TARGETS, variants=PRODUCTION, psum=(False,))
    reports += gm.compile_reports(TARGETS, variants=PRODUCTION)
    assert len(reports) == 2 * 2 * 2 + 2 * 2 * 3
    assert_within_sm12x_limits(reports)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SM12X_SLOW_TESTS") != "1", reason="full compile sweep: set SM12X_SLOW_TESTS=1")
def test_compile_all_configs():
    assert_within_sm12x_limits(gc.compile_reports(TARGETS) + gm.compile_reports(TARGETS))


def _ptx(target_cap):
    """PTX of the masked kernel's FP4 decode configuration for sm_<target_cap>."""
    import types

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from sm12x.kernels.common.compile_check import launch_hints

    cfg = dict(gm.CONFIGS[f"sm_{target_cap}"]["fp4"][16], BM=16)
    ops = types.SimpleNamespace(b_fp4=True, sfa=gc._Scales(1, 1, 128), sfb=gc._Scales(1, 1, 32))
    sig = gm.signature(True, 1, 1)
    src = ASTSource(fn=gm._masked_kernel, signature=sig, constexprs=gm.constexprs(ops, cfg, f"sm_{target_cap}"), attrs=launch_hints(sig))
    compiled = triton.compile(src, target=GPUTarget("cuda", target_cap, 32),
                              options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
    return compiled.asm["ptx"]


def test_fp4_weights_use_the_block_scaled_mma():
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("compiles in-process: run with SM12X_TEST_DEVICE=cuda or without TRITON_INTERPRET")
    ptx = _ptx(120)
    assert "kind::mxf8f6f4" in ptx and "ue8m0" in ptx, "sm_120 FP4 path is not the block-scaled MMA"
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16" not in ptx, "bf16 emulation MMA present"

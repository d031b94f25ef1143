"""Compile the dense GEMM kernels for sm_120 / sm_121 without a GPU: every tile class (small-M
swap-AB with 16/32/64 columns, 64-row, 128-row), fp32 and packed-UE8M0 scales (the block-scaled
MMA), bf16 and fp32 outputs, split-K, operands through TMA descriptors (where the tile uses them)
and through pointers, plus the pre-norm GEMM in both row tiles and both reductions, must fit the
101,376 B shared-memory limit and must not spill registers."""
from sm12x.kernels.registry import all_ops
from tests_support import assert_within_sm12x_limits

TARGETS = ("sm_120", "sm_121")


def test_every_gemm_config_compiles_within_sm12x_limits():
    reports = []
    for op in (op for op in all_ops() if op.family == "gemm"):
        if op.compile_reports is not None:
            reports += op.compile_reports(TARGETS)
    assert len(reports) >= 40
    assert_within_sm12x_limits(reports)

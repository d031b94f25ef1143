"""Every sm_120 / sm_121 configuration of the sparse MLA decode and prefill kernels compiles within the SM12x
limits (101,376 B shared memory, no register spills). Needs no GPU. The ``slow`` test adds the
HCA page sizes and the calls without lengths or without the extra list (SM12X_SLOW_TESTS=1)."""
import os

import pytest

from sm12x.kernels.common.compile_check import SM12X_SHARED_LIMIT, format_reports
from sm12x.kernels.sparse_mla.decode import compile_reports
from sm12x.kernels.sparse_mla import prefill


@pytest.fixture(scope="module")
def reports():
    return compile_reports(("sm_120", "sm_121"))


def test_sm12x_configs_compile_within_limits(reports):
    print("\n" + format_reports(reports))
    assert {r.target for r in reports} == {"sm_120", "sm_121"}
    assert len(reports) >= 2 * 5 * 2 + 2
    assert any(r.kernel == "_mxfp8_decode_kernel" and r.target == "sm_120" for r in reports)  # fast precision
    for r in reports:
        assert r.ok, f"{r.kernel} {r.config} {r.target}: {r.problem}"
        assert r.shared_bytes <= SM12X_SHARED_LIMIT and r.spill_bytes == 0


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SM12X_SLOW_TESTS") != "1",
                    reason="full compile sweep: set SM12X_SLOW_TESTS=1")
def test_sm12x_all_variants_compile_within_limits():
    reports = compile_reports(("sm_120", "sm_121"), full=True)
    print("\n" + format_reports(reports))
    bad = [r for r in reports if not r.ok]
    assert not bad, format_reports(bad)


def test_sm12x_prefill_configs_compile_within_limits():
    """The pipelined path and the fast precision's (the pack kernel, the MXFP8 kernel with
    max_logits)."""
    reports = prefill.compile_reports(("sm_120", "sm_121"))
    print("\n" + format_reports(reports))
    pipelined = [r for r in reports if r.kernel == "_sparse_prefill_kernel"]
    assert len(pipelined) == 2 * 2 * 2  # targets x d_qk x with / without lengths
    assert {r.kernel for r in reports if r.target == "sm_120"} >= {"_pack_kernel",
                                                                   "_mxfp8_decode_kernel"}
    for r in reports:
        assert r.ok, f"{r.kernel} {r.config} {r.target}: {r.problem}"
        assert r.shared_bytes <= SM12X_SHARED_LIMIT and r.spill_bytes == 0

"""Compile the indexer kernels for sm_120 / sm_121 without a GPU: every configuration must fit the
101,376 B shared-memory limit and must not spill registers.

The default test covers each per-arch configuration at the production shape (H=64, D=128,
block_kv 64, next_n 1/2) plus the smallest head count; the ``slow`` test sweeps every supported
head count, head dim and block size (about 15 minutes on 2 cores: it runs only with
SM12X_SLOW_TESTS=1)."""
import os

import pytest

from sm12x.kernels.indexer import fused_topk as indexer_topk, mqa_logits, paged_mqa_logits

from tests_support import assert_within_sm12x_limits

TARGETS = ("sm_120", "sm_121")


def test_compile_production_configs():
    reports = mqa_logits.compile_reports(TARGETS, heads=(64, 8), dims=(128,),
                                         variants=((0, True, False), (0, False, True)))
    reports += paged_mqa_logits.compile_reports(TARGETS, heads=(64, 8), dims=(128,), block_kvs=(64,),
                                                next_ns=(1, 2), variants=((0, False, True),))
    reports += indexer_topk.compile_reports(("sm_120",), heads=(64,), dims=(128,))
    assert len(reports) >= 20
    assert_within_sm12x_limits(reports)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SM12X_SLOW_TESTS") != "1", reason="full compile sweep: set SM12X_SLOW_TESTS=1")
def test_compile_all_configs():
    heads, dims = (8, 16, 32, 64), (64, 128)
    reports = mqa_logits.compile_reports(TARGETS, heads=heads, dims=dims)
    reports += paged_mqa_logits.compile_reports(TARGETS, heads=heads, dims=dims, next_ns=(1, 2, 8),
                                                variants=((0, False, True), (0, True, False)))
    reports += indexer_topk.compile_reports(("sm_120",), heads=heads, dims=dims)
    assert_within_sm12x_limits(reports)

"""The layer's native row (``sm12x.layer.native``: FlashMLA's and DeepGEMM's SM90 call forms) and
the reference's decision statistics.

The native row's wiring is checked on the CPU with sm12x's own ``deep_gemm`` / ``flash_mla``
stand-ins in place of the real modules: every call in the SM90 form (float32 scales, FP8 experts,
logits then top-k) must compute the same layer as the float32 reference, within the same budgets.
On an H100 / H200 ``scripts/bench_layer.py --check-native`` does the same with the real ones.
"""
import os
import subprocess
import sys
import types

import pytest
import torch

from tests_support import REPO

from sm12x.layer import native
from sm12x.layer.config import small
from sm12x.layer.patched import sm12x_deep_gemm, sm12x_flash_mla
from sm12x.layer.reference import ReferenceBackend
from sm12x.layer.run import Scenario, decisions_per_layer, run_check
from sm12x.layer.weights import make_weights

# a prefill chunk of one request, then one decode step: every call form of the native row once
TWO_STEPS = Scenario(prefill_len=0, batch=1, other_len=13, spec=(), spec_batch=1, batch1=False)
# and a spec-decode step of 3 tokens (DeepGEMM's SM90 paged logits take at most 2 per request)
WITH_SPEC3 = Scenario(prefill_len=0, batch=1, other_len=13, spec=(3,), spec_batch=1, batch1=False)


class Recorder:
    """A module whose calls are logged (name, args, kwargs) on their way to ``module``."""

    def __init__(self, module):
        self._module, self.calls = module, []

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return value(*args, **kwargs)
        return call


def _scale_dtypes(calls, name):
    return {pair[1].dtype for n, args, _ in calls if n == name for pair in args[:2]}


@pytest.mark.cpu_only
def test_native_row_on_standins_is_the_same_layer():
    dg = Recorder(sm12x_deep_gemm())
    report = run_check(small(), WITH_SPEC3, "cpu", layers=1, dg=dg, fmla=sm12x_flash_mla(), native=True)
    assert report["ok"], report["failures"]
    paged = [args[0].shape for n, args, _ in dg.calls if n == "fp8_paged_mqa_logits"]
    assert sorted(paged) == sorted([(1, 1, 8, 128), (3, 1, 8, 128)]), paged
    names = {n for n, _, _ in dg.calls}
    # the SM90 forms: FP8 experts, logits + top-k, float32 scales; no FP4 or packed-scale call
    assert {"m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", "fp8_mqa_logits",
            "get_paged_mqa_logits_metadata", "fp8_paged_mqa_logits", "fp8_gemm_nt", "fp8_einsum",
            "tf32_hc_prenorm_gemm"} <= names
    assert not any("fp4" in n or "packed" in n or n == "transform_sf_into_required_layout" for n in names), names
    for name in ("fp8_gemm_nt", "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked"):
        assert _scale_dtypes(dg.calls, name) == {torch.float32}, name
    assert set(report["op_errors"]) >= {"m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked",
                                        "indexer_topk_recall"}


@pytest.mark.cpu_only
def test_native_row_planted_logits_bug_fails():
    """Logits one column off (a row's keys read from the wrong start) must fail the top-k recall."""
    dg = sm12x_deep_gemm()
    real = dg.fp8_mqa_logits

    def shifted(*args, **kwargs):
        return torch.roll(real(*args, **kwargs), 1, dims=1)
    dg.fp8_mqa_logits = shifted
    report = run_check(small(), TWO_STEPS, "cpu", layers=1, dg=dg, fmla=sm12x_flash_mla(), native=True)
    assert not report["ok"]
    assert any(f.startswith("indexer_topk_recall") for f in report["failures"]), report["failures"]


def test_rows_topk_relative_masked_and_padded():
    logits = torch.tensor([[9.0, 1.0, 5.0, 7.0, 3.0],
                           [0.0, 8.0, 2.0, 6.0, 4.0]])
    ks, ke = torch.tensor([1, 0], dtype=torch.int32), torch.tensor([4, 2], dtype=torch.int32)
    got = native.rows_topk(logits, ks, ke, 4)
    assert got.dtype == torch.int32
    # row 0: columns 1..3 (9.0 at column 0 is outside), relative to ks = 1; row 1: columns 0..1
    assert got[0].tolist() == [2, 1, 0, -1]
    assert got[1].tolist() == [1, 0, -1, -1]


def test_fp8_experts_keep_the_mxfp4_values():
    w = make_weights(small()).t["experts_w13"]
    converted = native.fp8_experts(w)
    assert converted.q.dtype == torch.float8_e4m3fn and converted.q.shape == (w.q.shape[0], w.q.shape[1], 2 * w.q.shape[2])
    assert converted.sf.shape == (w.q.shape[0], w.q.shape[1] // 128, 2 * w.q.shape[2] // 128)
    assert native.conversion_error(w, converted) < 1e-6


def test_expert_agreement_is_pooled_not_a_minimum_of_shares():
    """A one-token step whose 6 picks differ in one expert reads 0 as a share of identical sets;
    pooled with a 10-token step that agrees everywhere it is 65/66 picks and 10/11 sets."""
    ref = ReferenceBackend(small(), None)
    ids = torch.arange(60).view(10, 6)
    ref.trace[("experts", 0, 0)] = ids
    ref.route(None, ids.clone())
    one = torch.arange(6).view(1, 6)
    ref.step_no = 1
    ref.trace[("experts", 0, 1)] = one
    ref.route(None, torch.tensor([[0, 1, 2, 3, 4, 99]]))
    got = decisions_per_layer([ref])
    assert got["expert_pick_agreement"] == [65 / 66]
    assert got["expert_set_agreement"] == [10 / 11]


def _fake(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def test_bench_native_row_refuses_standins_and_patched_modules(monkeypatch):
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    try:
        import bench_layer
    finally:
        sys.path.remove(os.path.join(REPO, "scripts"))

    def fn():
        pass
    names = dict.fromkeys(bench_layer.NATIVE_DG, fn)
    monkeypatch.setitem(sys.modules, "flash_mla", _fake("flash_mla", **dict.fromkeys(bench_layer.NATIVE_FMLA, fn)))
    monkeypatch.setitem(sys.modules, "deep_gemm", _fake("deep_gemm", __sm12x_shim__=True, **names))
    assert bench_layer._native() == (None, "deep_gemm is sm12x's stand-in")

    def patched():
        pass
    patched.__sm12x_patch__ = "deep_gemm_dense"
    monkeypatch.setitem(sys.modules, "deep_gemm", _fake("deep_gemm", **dict(names, fp8_gemm_nt=patched)))
    got, why = bench_layer._native()
    assert got is None and "fp8_gemm_nt is sm12x's patch" in why and "sitecustomize" in why
    monkeypatch.setitem(sys.modules, "deep_gemm", _fake("deep_gemm", **{k: v for k, v in names.items()
                                                                      if k != "fp8_mqa_logits"}))
    assert bench_layer._native() == (None, "deep_gemm has no fp8_mqa_logits")


def test_build_native_bad_arguments_are_one_line(tmp_path):
    script = os.path.join(REPO, "scripts", "build_native.sh")
    bad = subprocess.run(["bash", script, "--jobs", "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "build_native: --jobs x: a positive integer"
    (tmp_path / "mine.txt").write_text("not the build's")
    foreign = subprocess.run(["bash", script, "--target", str(tmp_path)], capture_output=True, text=True)
    assert foreign.returncode == 2 and len(foreign.stderr.strip().splitlines()) == 1
    assert "did not install" in foreign.stderr and (tmp_path / "mine.txt").read_text() == "not the build's"

"""The fast attention precision (``SM12X_ATTENTION_PRECISION=fast``): sparse MLA decode on the V4
"MODEL1" and V3.2 / GLM caches through block-scaled MXFP8 MMAs (``decode_mxfp8``) against the
float32 reference and the exact path; the dispatch, the setting's errors and what ``status``
says."""
import pytest
import torch

from sm12x.kernels.common.tolerance import FLASHMLA_LSE, FLASHMLA_OUT, flashmla_close
from sm12x.kernels.sparse_mla import decode_mxfp8 as mx
from sm12x.kernels.sparse_mla import precision
from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode


def cos_diff(a, b) -> float:
    """FlashMLA's cosine difference, 1 - 2<a,b> / (|a|^2 + |b|^2), in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    denom = float((a * a).sum() + (b * b).sum())
    return 0.0 if denom == 0 else 1 - 2 * float((a * b).sum()) / denom


def _fast(case, num_splits=None):
    b, s_q, h, _ = case["q"].shape
    out = torch.empty(b, s_q, h, 512, dtype=torch.bfloat16, device=case["q"].device)
    lse = torch.empty(b, s_q, h, dtype=torch.float32, device=case["q"].device)
    mx.launch(case["q"], case["k_cache"], case["indices"], case.get("topk_length"), case.get("attn_sink"),
              case.get("extra_k_cache"), case.get("extra_indices"), case.get("extra_topk_length"),
              case["softmax_scale"], out, lse, num_splits=num_splits)
    return out, lse.transpose(1, 2)


def _check(got, ref, cos_tol, lse_tol, abs_tol=2e-3):
    """Within the given bounds and FlashMLA's own decode criterion (``tolerance.flashmla_close``)."""
    out, lse = got
    ref_out, ref_lse = ref
    for name, g, r, tol in (("out", out, ref_out, FLASHMLA_OUT), ("lse", lse, ref_lse, FLASHMLA_LSE)):
        v = flashmla_close(g.float(), r.float(), **tol)
        assert v.ok, f"{name}: {v.detail}"
    assert cos_diff(out.float(), ref_out.float()) <= cos_tol
    assert (out.float() - ref_out.float()).abs().max() <= abs_tol
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin] - ref_lse[fin]).abs().max() <= lse_tol


@pytest.mark.cpu_only
@pytest.mark.parametrize("num_splits", [None, 2])
@pytest.mark.parametrize("fmt,spec", [
    ("model1", dict(b=2, s_q=2, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2, extra_topk_length=True)),
    ("model1", dict(b=1, s_q=1, h_q=20, topk=96, page=64, topk_length=True)),
    ("v32", dict(b=1, s_q=2, h_q=16, topk=64, page=64, extra_topk=32, extra_page=64, extra_topk_length=True)),
    ("model1", dict(b=1, s_q=2, h_q=40, topk=128, page=64, extra_topk=64, extra_page=2, extra_topk_length=True)),
    ("v32", dict(b=1, s_q=1, h_q=40, topk=96, page=64, topk_length=True)),
])
def test_against_reference(fmt, spec, num_splits):
    """Both cache formats, every optional input, head counts that are not a multiple of the head
    block (h_q 40: two 32-head blocks in V halves, one Q term), rows whole and split (combine):
    within 2e-5 cosine difference (bf16 output rounding alone costs ~2e-6 here); lse within 1e-4,
    or 1e-3 with one Q term (its logits keep 4 bits per Q value: 4.3e-4 measured here)."""
    case = make_case(fmt=fmt, **spec)
    lse_tol = 1e-4 if mx.pick_config(spec["h_q"], fmt)["Q_TERMS"] == 2 else 1e-3
    _check(_fast(case, num_splits), ref_sparse_mla_decode(**case), 2e-5, lse_tol)


@pytest.mark.cpu_only
@pytest.mark.parametrize("h_q", [16, 32])
def test_peaked_softmax(h_q):
    """q x 8 and 4x the softmax scale (logits 32x FlashMLA's test data: a peaked softmax), 16-head
    blocks and 32-head blocks in V halves. Two e4m3 terms each for Q and P: cosine difference
    3.6e-7 (the exact path 7e-7), lse within 5e-7. (One Q term would give 2.6e-4 and 3.5e-2 here;
    one P term 1.3e-4 on FlashMLA's own test data.)"""
    case = make_case(fmt="model1", b=1, s_q=1, h_q=h_q, topk=64, page=64, sink=False, seed=3)
    case["q"] = (case["q"].float() * 8).to(torch.bfloat16)
    case["softmax_scale"] = 512 ** -0.5 * 4
    _check(_fast(case), ref_sparse_mla_decode(**case), 1e-5, 1e-4)


@pytest.mark.cpu_only
def test_v32_arbitrary_float32_scales():
    """V3.2 / GLM scales written as amax / 448 (not powers of two): read at float32 precision
    (each group's logits scaled after its MMAs, W folded), where the exact path rounds every
    dequantised value to bf16: cosine difference 8.4e-6 against the exact path's 9.2e-6."""
    case = make_case(fmt="v32", b=1, s_q=1, h_q=16, topk=64, page=64, seed=4)
    c = case["k_cache"]
    raw = c.as_strided((c.shape[0], c.shape[1], 656), (c.stride(0), 656, 1))
    g = torch.Generator().manual_seed(1)
    scales = raw[..., 512:528].contiguous().view(torch.float32)
    raw[..., 512:528] = (scales * (0.5 + 0.5 * torch.rand(scales.shape, generator=g))).view(torch.uint8)
    ref = ref_sparse_mla_decode(**case)
    _check(_fast(case), ref, 1e-5, 1e-4)


@pytest.mark.cpu_only
def test_dispatch_by_precision(monkeypatch):
    """fast: both cache formats go to the MXFP8 kernel; exact (the default): neither."""
    calls = []
    real = mx.launch
    monkeypatch.setattr(mx, "launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    m1 = make_case(fmt="model1", b=1, s_q=1, h_q=16, topk=32, page=64)
    v32 = make_case(fmt="v32", b=1, s_q=1, h_q=16, topk=32, page=64)
    monkeypatch.delenv("SM12X_ATTENTION_PRECISION", raising=False)
    exact = sparse_mla_decode(**m1)
    sparse_mla_decode(**v32)
    assert calls == []
    monkeypatch.setenv("SM12X_ATTENTION_PRECISION", "fast")
    fast = sparse_mla_decode(**m1)
    assert calls == [1]
    sparse_mla_decode(**v32)
    assert calls == [1, 1]
    assert cos_diff(fast[0].float(), exact[0].float()) < 2e-5
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_90")  # no native block-scaled MMA: exact
    sparse_mla_decode(**m1)
    assert calls == [1, 1]


def test_bad_setting(monkeypatch):
    monkeypatch.setenv("SM12X_ATTENTION_PRECISION", "fastest")
    with pytest.raises(ValueError, match="SM12X_ATTENTION_PRECISION='fastest'"):
        precision.attention_precision()
    assert precision.serving((12, 0), "3.9.0").startswith("invalid: SM12X_ATTENTION_PRECISION")


def test_status_line(monkeypatch):
    monkeypatch.delenv("SM12X_ATTENTION_PRECISION", raising=False)
    assert precision.serving((12, 0), "3.9.0").startswith("exact")
    monkeypatch.setenv("SM12X_ATTENTION_PRECISION", "fast")
    assert precision.serving((12, 0), "3.6.0").startswith("fast: sparse MLA decode")
    assert precision.serving((12, 1), "3.9.0").startswith("fast: sparse MLA decode")
    assert precision.serving((12, 1), "3.7.1").startswith("fast requested, exact serves")
    assert precision.serving((9, 0), "3.9.0").startswith("fast requested, exact serves")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,spec", [
    ("model1", dict(b=64, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64)),
    ("model1", dict(b=2, s_q=2, h_q=128, topk=128, page=256, extra_topk=1024, extra_page=64)),
    ("model1", dict(b=74, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=2, extra_topk_length=True)),
    ("model1", dict(b=1, s_q=1, h_q=16, topk=128, page=256, extra_topk=1024, extra_page=64)),
    ("v32", dict(b=64, s_q=2, h_q=128, topk=2048, page=64)),
])
def test_gpu_production(monkeypatch, fmt, spec):
    """The registry's production decode cases with the sm_120 configs (tl.dot_scaled emulated
    with the same math off SM12x): the issue's bound, cosine difference <= 1e-4."""
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")
    case = make_case(fmt=fmt, device="cuda", **spec)
    _check(_fast(case), ref_sparse_mla_decode(**case), 1e-4, 1e-3)

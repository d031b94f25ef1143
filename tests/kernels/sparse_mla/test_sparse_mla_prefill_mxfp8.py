"""The fast attention precision's sparse prefill (``SM12X_ATTENTION_PRECISION=fast``:
``prefill_mxfp8``, kv packed into the FP8 cache layout, then the MXFP8 decode kernel) against the
float32 reference: on kv rows dequantised from an FP8 cache (what frameworks pass where the KV
cache is FP8; packing them back is exact) and on arbitrary bf16 rows (rounded to e4m3)."""
import pytest
import torch

from sm12x.kernels.common.tolerance import flashmla_prefill_close
from sm12x.kernels.sparse_mla import prefill_mxfp8 as pm
from sm12x.kernels.sparse_mla.kv_cache import (dequantize_model1_cache, dequantize_v32_cache,
                                               quantize_model1_cache, quantize_v32_cache)
from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill
from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill

ARGS = ("q", "kv", "indices", "sm_scale", "attn_sink", "topk_length")


def cos_diff(a, b) -> float:
    """FlashMLA's cosine difference, 1 - 2<a,b> / (|a|^2 + |b|^2), in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    denom = float((a * a).sum() + (b * b).sum())
    return 0.0 if denom == 0 else 1 - 2 * float((a * b).sum()) / denom


def cache_rows(case):
    """The case with kv replaced by its rows written to the FP8 cache and read back (V4 MODEL1
    for d_qk 512, V3.2 for 576); rows no query reads stay NaN."""
    kv = case["kv"]
    unused = kv.isnan().any(-1, keepdim=True)
    rows = torch.nan_to_num(kv.float()).view(1, kv.shape[0], kv.shape[-1])
    if kv.shape[-1] == 512:
        back = dequantize_model1_cache(quantize_model1_cache(rows))
    else:
        back = dequantize_v32_cache(quantize_v32_cache(rows))
    back = back.view(kv.shape).to(torch.bfloat16).masked_fill(unused, float("nan"))
    return dict(case, kv=back)


def fast(case, **kw):
    return sparse_mla_prefill(**{k: case[k] for k in ARGS if k in case}, **kw)


def errors(got, ref, flashmla=True):
    """(cos diff, max abs of out, of max_logits, of lse); with ``flashmla`` also FlashMLA's own
    prefill criterion (``tolerance.flashmla_prefill_close``)."""
    if flashmla:
        for name, v in flashmla_prefill_close(got, ref).items():
            assert v.ok, f"{name}: {v.detail}"
    out, max_logits, lse = got
    r_out, r_max, r_lse = ref
    fin = torch.isfinite(r_lse)
    assert torch.equal(fin, torch.isfinite(lse)) and torch.equal(torch.isfinite(max_logits),
                                                                 torch.isfinite(r_max))
    assert torch.equal(lse[~fin], r_lse[~fin]) and torch.equal(out[~fin].float(), r_out[~fin].float())
    m = torch.isfinite(r_max)
    return (cos_diff(out.float(), r_out.float()), float((out.float() - r_out.float()).abs().max()),
            float((max_logits[m] - r_max[m]).abs().max()), float((lse[fin] - r_lse[fin]).abs().max()))


@pytest.fixture
def fast_precision(monkeypatch):
    monkeypatch.setenv("SM12X_ATTENTION_PRECISION", "fast")
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")


def _entries(cache, bpt, data):
    """A cache view [pages, B, 1, bpt] (any page stride) -> (its tokens' first ``data`` bytes
    [pages, B, data], the rest [pages, B, bpt - data]) for MODEL1's data / scale regions (V3.2:
    data = bpt, one region)."""
    nb, B = cache.shape[:2]
    flat = cache.as_strided((nb, B * bpt), (cache.stride(0), 1))
    return flat[:, :B * data].reshape(nb, B, data), flat[:, B * data:].reshape(nb, B, bpt - data)


@pytest.mark.cpu_only
@pytest.mark.parametrize("d_qk", [512, 576])
def test_pack_writes_the_cache_writers_bytes(d_qk):
    """On any bf16 rows the pack writes the bytes the FP8 cache writers do (``kv_cache``: the
    same power-of-two rule per 64 / 128 values, e4m3 round to nearest even, RoPE as it is)."""
    kv = torch.nan_to_num(make_prefill_case(d_qk, 1, 16, 32, 128, seed=3)["kv"])
    mine = pm.pack(kv)
    rows = kv.view(2, 64, d_qk).float()
    if d_qk == 512:
        ref = quantize_model1_cache(rows)
        a, b = _entries(mine, 584, 576), _entries(ref, 584, 576)
        assert torch.equal(a[0], b[0])
        assert torch.equal(a[1][..., :7], b[1][..., :7])  # the 8th byte is padding
    else:
        assert torch.equal(_entries(mine, 656, 656)[0], _entries(quantize_v32_cache(rows), 656, 656)[0])


@pytest.mark.cpu_only
@pytest.mark.parametrize("d_qk", [512, 576])
def test_pack_is_exact_on_cache_rows(d_qk):
    """Rows read back from an FP8 cache pack to the same values (each group's scale is at most the
    cache's), RoPE dims as they are."""
    case = cache_rows(make_prefill_case(d_qk, 1, 16, 32, 80, seed=2))
    kv = torch.nan_to_num(case["kv"])
    packed = pm.pack(kv)
    back = (dequantize_model1_cache if d_qk == 512 else dequantize_v32_cache)(packed)
    assert torch.equal(back.reshape(-1, d_qk)[:kv.shape[0]].float(), kv[:, 0].float())


@pytest.mark.cpu_only
@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("h_q, s_q, topk, s_kv, topk_length, num_splits", [
    (16, 3, 64, 200, True, None),
    (5, 2, 96, 40, False, None),      # odd heads; fewer keys than topk (indices >= s_kv)
    (16, 3, 96, 200, True, 2),        # rows cut into parts: the combine merges max_logits too
    (40, 2, 128, 200, True, None),    # 32-head blocks in V halves, one Q term
])
def test_cache_rows_match_reference(fast_precision, d_qk, h_q, s_q, topk, s_kv, topk_length,
                                    num_splits):
    """On cache rows the only errors are the decode's (P as two e4m3 terms; Q as two, or one for
    the 32-head blocks): cosine difference <= 1e-5, max_logits and lse within 1e-5 (one Q term:
    1e-3); empty rows 0 / -inf / +inf."""
    from sm12x.kernels.sparse_mla.decode_mxfp8 import pick_config

    case = cache_rows(make_prefill_case(d_qk, s_q, h_q, topk, s_kv, topk_length, seed=h_q))
    case["indices"][0] = -1  # one row with no valid candidate
    cos, _, max_err, lse_err = errors(fast(case, num_splits=num_splits),
                                      ref_sparse_mla_prefill(**{k: case[k] for k in ARGS if k in case}))
    tol = 1e-5 if pick_config(h_q, "model1" if d_qk == 512 else "v32")["Q_TERMS"] == 2 else 1e-3
    assert cos <= 1e-5 and max_err <= tol and lse_err <= tol, (cos, max_err, lse_err)


@pytest.mark.cpu_only
@pytest.mark.parametrize("d_qk", [512, 576])
def test_arbitrary_bf16_rows(fast_precision, d_qk):
    """Arbitrary bf16 kv is rounded to e4m3 in the no-RoPE dims (3 mantissa bits): cosine
    difference about 3e-4 on FlashMLA's test distribution (the float32 reference reads the bf16
    rows as they are); logits keep 4e-3 absolute."""
    case = make_prefill_case(d_qk, 3, 16, 64, 200, True, seed=5)
    cos, _, max_err, lse_err = errors(fast(case), ref_sparse_mla_prefill(**{k: case[k] for k in ARGS
                                                                           if k in case}), False)
    assert 3e-5 < cos <= 1e-3 and max_err <= 4e-3 and lse_err <= 4e-3, (cos, max_err, lse_err)


@pytest.mark.cpu_only
def test_dispatch_by_precision(monkeypatch):
    """fast: the MXFP8 path serves (SM12x configs); exact (default) or no native block-scaled MMA:
    the exact kernels."""
    calls = []
    real = pm.launch
    monkeypatch.setattr(pm, "launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    case = make_prefill_case(512, 1, 16, 32, 64, seed=1)
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")
    monkeypatch.delenv("SM12X_ATTENTION_PRECISION", raising=False)
    fast(case)
    assert calls == []
    monkeypatch.setenv("SM12X_ATTENTION_PRECISION", "fast")
    fast(case)
    assert calls == [1]
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_90")
    fast(case)
    assert calls == [1]


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk, h_q, topk, s_kv", [
    (576, 128, 2048, 8192),   # V3.2 h128 top-2048
    (512, 64, 512, 8192),     # MODEL1 CONFIG1 h64 top-512
    (512, 128, 1024, 8192),   # MODEL1 CONFIG2 h128 top-1024
])
def test_gpu_production(monkeypatch, d_qk, h_q, topk, s_kv):
    """FlashMLA's prefill performance shapes (s_q 512 of its 4096) on cache rows, the sm_120
    configs (tl.dot_scaled emulated with the same math off SM12x): the issue's bound, cosine
    difference <= 1e-4 (max_logits and lse within 1e-3: one Q term)."""
    monkeypatch.setenv("SM12X_ATTENTION_PRECISION", "fast")
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")
    case = make_prefill_case(d_qk, 512, h_q, topk, s_kv, device="cpu", seed=0)
    case = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in cache_rows(case).items()}
    cos, max_abs, max_err, lse_err = errors(fast(case), ref_sparse_mla_prefill(
        **{k: case[k] for k in ARGS if k in case}))
    print(f"d_qk {d_qk} h{h_q} top-{topk}: cos diff {cos:.3g}, max abs {max_abs:.3g}, "
          f"max_logits {max_err:.3g}, lse {lse_err:.3g}")
    assert cos <= 1e-4 and max_err <= 1e-3 and lse_err <= 1e-3

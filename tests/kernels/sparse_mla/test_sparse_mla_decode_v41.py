"""Sparse MLA decode on DeepSeek-V4.1's caches (528 B FP8 with UE8M0 per 32; 288 B FP4 extra cache
with e4m3 per 16; interleaved and block-split, chosen by the declared format) vs the reference."""
import os

import pytest
import torch

from sm12x.kernels.sparse_mla import kv_cache as kvc
from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
from sm12x.kernels.common.tolerance import FLASHMLA_LSE, FLASHMLA_OUT, flashmla_close

DEVICE = os.environ.get("SM12X_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.cpu_only  # inputs on the CPU; the GPU cases are marked gpu


def check_case(case, **kw):
    out, lse = sparse_mla_decode(**case, **kw)
    ref_out, ref_lse = ref_sparse_mla_decode(**case)
    for name, ans, ref, tol in (("out", out, ref_out, FLASHMLA_OUT), ("lse", lse, ref_lse, FLASHMLA_LSE)):
        v = flashmla_close(ans.cpu(), ref.cpu(), **tol)
        assert v.ok, f"{name}: {v.detail}; max abs err {v.max_abs:.3g}"
    return out, lse


@pytest.mark.parametrize("fmt, xfmt", [("v41", "v41_fp4"), ("v41_block_split", "v41_fp4_block_split"),
                                       ("v41", "v41")])
def test_v41_caches_match_reference(fmt, xfmt):
    case = make_case(fmt, b=2, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=64,
                     topk_length=True, extra_fmt=xfmt, seed=1)
    check_case(case, num_splits=2)


def test_extra_format_follows_the_main_arrangement():
    case = make_case("v41_block_split", b=1, s_q=2, h_q=16, topk=64, page=64, extra_topk=64,
                     extra_page=64, extra_fmt="v41_fp4_block_split", seed=2)
    ref = ref_sparse_mla_decode(**case)
    del case["extra_kv_format"]  # the 288-byte extra cache takes the main cache's arrangement
    out, _ = sparse_mla_decode(**case)
    assert flashmla_close(out, ref[0], **FLASHMLA_OUT).ok


def test_the_other_arrangement_is_misread_not_guessed():
    """The declared format decides: reading an interleaved cache as block-split gives other
    numbers (so a test with the wrong declaration fails), and no size-based guess hides it."""
    case = make_case("v41", b=1, s_q=1, h_q=16, topk=64, page=64, sink=False, seed=3, invalid_frac=0)
    good, _ = sparse_mla_decode(**case)
    case["kv_format"] = "v41_block_split"
    wrong, _ = sparse_mla_decode(**case)
    assert not flashmla_close(wrong, good, **FLASHMLA_OUT).ok


@pytest.mark.parametrize("change, arg", [
    (dict(kv_format=None), "kv_format"),               # 528 B without a declaration
    (dict(kv_format="v41_fp4"), "kv_format"),          # FP4 only as the extra cache
    (dict(kv_format="model1"), "kv_format"),
    (dict(extra_kv_format="v41_fp8"), "extra_kv_format"),
])
def test_refused_by_name(change, arg):
    case = make_case("v41", b=1, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=64,
                     extra_fmt="v41_fp4", seed=4)
    case.update(change)
    with pytest.raises(ValueError, match=f"sparse_mla_decode: argument '{arg}'"):
        sparse_mla_decode(**case)


def test_v4_cache_with_a_v41_declaration_is_refused_by_size():
    case = make_case("model1", b=1, s_q=1, h_q=16, topk=64, page=64, seed=5)
    with pytest.raises(ValueError, match="argument 'k_cache'.*528"):
        sparse_mla_decode(**case, kv_format="v41")


def test_quantisers_round_trip():
    kv = (torch.randn(2, 16, 512, generator=torch.Generator().manual_seed(0)) / 10).clamp(-1, 1)
    for fmt, (bpt, interleaved) in kvc.V41_FORMATS.items():
        quant = kvc.quantize_v41_cache if bpt == 528 else kvc.quantize_v41_fp4_cache
        cache = quant(kv, interleaved)
        assert cache.shape == (2, 16, 1, bpt)
        back = kvc.dequantize_cache(cache, torch.float32, fmt)
        # e4m3 with power-of-two scales: 2**-4 relative; e2m1 with e4m3 scales: half a step of 6
        tol = kv.abs().amax() * (2**-4 if bpt == 528 else 0.25)
        assert float((back - kv).abs().max()) <= float(tol), fmt
    with pytest.raises(ValueError, match="kv_format"):
        kvc.dequantize_cache(cache)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["default", "sm_120"])
@pytest.mark.parametrize("fmt, xfmt", [("v41", "v41_fp4"), ("v41_block_split", "v41_fp4_block_split"),
                                       ("v41", "v41")])  # 528 + 528: decode.built_prefetch at 64 heads
def test_gpu_v41_production(fmt, xfmt, arch, monkeypatch):
    if DEVICE != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs SM12X_TEST_DEVICE=cuda and a GPU")
    if arch != "default":
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", arch)
    # V4.1-Flash shapes: 64 heads, SWA window 128 (page 256), 512 compressed candidates (page 64)
    case = make_case(fmt, b=74, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64,
                     extra_topk_length=True, extra_fmt=xfmt, device="cuda", seed=7)
    check_case(case)


def test_flash_mla_front_end_reads_the_declared_arrangement():
    """FlashMLA's entry point: sgl-flash-mla's ``use_legacy`` (SGLang passes ``not interleaved``)
    declares the V4.1 arrangement; without it a 528-byte cache is refused by name."""
    from sm12x.frontends.flash_mla import api

    for fmt, xfmt, use_legacy in (("v41", "v41_fp4", False), ("v41_block_split", "v41_fp4_block_split", True)):
        case = make_case(fmt, b=1, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=64,
                         extra_fmt=xfmt, seed=6)
        ref_out, ref_lse = ref_sparse_mla_decode(**case)
        out, lse = api.flash_mla_with_kvcache(
            case["q"], case["k_cache"], None, None, 512, None, softmax_scale=case["softmax_scale"],
            is_fp8_kvcache=True, indices=case["indices"], attn_sink=case["attn_sink"],
            extra_k_cache=case["extra_k_cache"], extra_indices_in_kvcache=case["extra_indices"],
            use_legacy=use_legacy)
        assert flashmla_close(out, ref_out, **FLASHMLA_OUT).ok, fmt
    with pytest.raises(ValueError, match="flash_mla_with_kvcache: argument 'use_legacy'"):
        api.flash_mla_with_kvcache(case["q"], case["k_cache"], None, None, 512, None, is_fp8_kvcache=True,
                                   indices=case["indices"])


def test_fp4_at_64_heads_runs_the_dealt_form(monkeypatch):
    """A 528 + 288 decode at BLOCK_H 64 never runs the split (not dealt) form, which spills under
    Triton 3.7.1 (``decode.fp4_split_form_ok``); it matches the reference through the dealt one."""
    from sm12x.kernels.sparse_mla import decode
    from sm12x.kernels.sparse_mla import decode_plan

    monkeypatch.setenv("SM12X_SPARSE_MLA_CONFIG", "BLOCK_H=64,BLOCK_N=16,num_warps=8,PREFETCH=2")
    plans = []
    real = decode.launch
    monkeypatch.setattr(decode, "launch", lambda *a, **k: plans.append(a[9]) or real(*a, **k))
    case = make_case("v41", b=1, s_q=1, h_q=64, topk=32, page=64, extra_topk=32, extra_page=64,
                     extra_fmt="v41_fp4", seed=8)
    assert not decode_plan.plan(1, 1, 64, 32, 32, case["q"].device, 2, fmt="model1").dealt
    check_case(case, num_splits=2)
    assert plans[-1].dealt and plans[-1].programs == 2

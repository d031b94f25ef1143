"""Sparse MLA prefill reading DeepSeek-V4.1's caches (528 B FP8 with UE8M0 per 32; 288 B FP4 with
e4m3 per 16; interleaved and block-split, chosen by the declared format) vs the reference."""
import os

import pytest
import torch

from sm12x.kernels.common.tolerance import flashmla_prefill_close
from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill
from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill

DEVICE = os.environ.get("SM12X_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.cpu_only  # inputs on the CPU; the GPU cases are marked gpu
FORMATS = ["v41", "v41_block_split", "v41_fp4", "v41_fp4_block_split"]


def check(case, **kw):
    got = sparse_mla_prefill(**case, **kw)
    for name, v in flashmla_prefill_close(got, ref_sparse_mla_prefill(**case)).items():
        assert v.ok, f"{name}: {v.detail}; max abs {v.max_abs:.3g}, max rel {v.max_rel:.3g}"
    return got


@pytest.mark.parametrize("fmt", FORMATS)
def test_v41_caches_match_reference(fmt):
    # 3 query tokens, 16 heads, 64 candidates of 200 keys in 64-token pages (random order), some
    # -1 and some past the cache's end, per-query lengths, sinks, unread rows poisoned
    case = make_prefill_case(512, 3, 16, 64, 200, topk_length=True, kv_format=fmt, seed=11)
    check(case)


@pytest.mark.parametrize("fmt", ["v41", "v41_fp4_block_split"])
def test_split_rows_merge(fmt):
    """Rows cut into parts: the combine merges out, lse and max_logits as for bf16 rows."""
    case = make_prefill_case(512, 2, 16, 96, 150, topk_length=False, kv_format=fmt, page=32,
                             seed=12)
    case["indices"][0, :, :40] = -1
    check(case, num_splits=3)


def test_forced_pipelined_path_still_reads_the_cache(monkeypatch):
    """The pipelined kernel reads bf16 rows only: a V4.1 cache takes the split path even when
    SM12X_SPARSE_MLA_PREFILL=pipelined is set."""
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", "pipelined")
    check(make_prefill_case(512, 2, 16, 32, 64, kv_format="v41_fp4", seed=13))


def test_the_other_arrangement_is_misread_not_guessed():
    """The declaration decides: reading an interleaved cache as block-split gives other numbers
    (a test with the wrong declaration fails), and no size-based guess hides it."""
    case = make_prefill_case(512, 2, 16, 32, 64, sink=False, invalid_frac=0.0, kv_format="v41",
                             seed=14)
    good = sparse_mla_prefill(**case)[0]
    case["kv_format"] = "v41_block_split"
    wrong = sparse_mla_prefill(**case)[0]
    assert not all(v.ok for v in flashmla_prefill_close((wrong,), (good,)).values())


@pytest.mark.parametrize("change, arg", [
    (dict(kv_format=None), "kv_format"),          # 528 B without a declaration
    (dict(kv_format="v41_fp8"), "kv_format"),
    (dict(kv_format="v41_fp4"), "kv"),            # 288-byte format declared for a 528-byte cache
])
def test_refused_by_name(change, arg):
    case = make_prefill_case(512, 1, 16, 32, 64, kv_format="v41", seed=15)
    case.update(change)
    with pytest.raises(ValueError, match=f"flash_mla_sparse_fwd: argument '{arg}'"):
        sparse_mla_prefill(**case)


def test_v41_format_needs_d_qk_512():
    case = make_prefill_case(576, 1, 16, 32, 64, seed=16)
    case["kv_format"] = "v41"
    with pytest.raises(ValueError, match="argument 'kv_format'.*d_qk 512"):
        sparse_mla_prefill(**case)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["default", "sm_120"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_v41_prefill_production(fmt, arch, monkeypatch):
    if DEVICE != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs SM12X_TEST_DEVICE=cuda and a GPU")
    if arch != "default":
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", arch)
    # V4.1-Flash shapes: 64 heads, 1024 candidates over a 16K-token cache in 64-token pages
    case = make_prefill_case(512, 512, 64, 1024, 16384, topk_length=True, kv_format=fmt,
                             device="cuda", seed=17)
    check(case)


@pytest.mark.parametrize("fmt", FORMATS)
def test_head_block_within_the_compiled_limit(fmt, monkeypatch):
    """The FP4 prefill runs at most the head block its compile check covers
    (``decode.prefill_max_block_h``); 64 heads of a 528-byte cache keep the decode's 64."""
    from sm12x.kernels.sparse_mla import prefill
    from sm12x.kernels.sparse_mla.decode import V41_CODES, prefill_max_block_h

    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")
    monkeypatch.delenv("SM12X_SPARSE_MLA_CONFIG", raising=False)
    code = V41_CODES[fmt]
    cfg = prefill._v41_config(64, torch.device("cpu"), code, 4096, 2048)
    assert cfg["BLOCK_H"] == min(64, prefill_max_block_h(code))

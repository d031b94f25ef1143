"""m_grouped_fp8_fp4_gemm_nt_contiguous under the interpreter (tiny shapes): both layouts, every
MMA mode and scale format, empty experts, all-padding tiles, the psum gaps."""
import pytest
from moe_support import check, run_contiguous

from sm12x.frontends.deep_gemm import moe as api
from sm12x.kernels.moe import grouped_contiguous as gc

pytestmark = pytest.mark.cpu_only


def _with_config(monkeypatch, mode, swap, bm=16, bn=32):
    cfg = dict(BM=bm, BN=bn, GROUP_M=2, mode=mode, swap=swap, num_warps=4, num_stages=1)
    monkeypatch.setattr(gc, "pick_config", lambda device, b_fp4, alignment, config=None:
                        dict(cfg, BM=gc.tile_rows(cfg["BM"], alignment)))


@pytest.mark.parametrize("mode", ["scaled", "mixed", "bf16", "fp8"])
@pytest.mark.parametrize("fp4", [True, False])
@pytest.mark.parametrize("swap", [False, True])
def test_modes(monkeypatch, mode, fp4, swap):
    _with_config(monkeypatch, mode, swap)
    # expert 1 empty; expert 2's segment ends in a tile of padding only (BM 16, alignment 32)
    out, ref, defined = run_contiguous(api, [20, 0, 5, 33], 48, 256, fp4=fp4, alignment=32)
    check(out, ref, defined)


@pytest.mark.parametrize("fmt_b", ["fp32", "packed", "bytes"])
def test_fp4_scale_formats(monkeypatch, fmt_b):
    _with_config(monkeypatch, "scaled", False)
    out, ref, defined = run_contiguous(api, [17, 9], 32, 256, fp4=True, alignment=32, fmt_b=fmt_b)
    check(out, ref, defined)


@pytest.mark.parametrize("fmt_a", ["packed", "bytes"])
@pytest.mark.parametrize("mode", ["scaled", "bf16"])
def test_ue8m0_activation_scales(monkeypatch, fmt_a, mode):
    _with_config(monkeypatch, mode, False)
    out, ref, defined = run_contiguous(api, [17, 9], 32, 256, fp4=True, alignment=32, fmt_a=fmt_a)
    check(out, ref, defined)


@pytest.mark.parametrize("mode", ["scaled", "bf16", "fp8"])
def test_activation_scales_per_32(monkeypatch, mode):
    # SGLang's recipe (1, 1, 32): MXFP8 activations (MODE_FP8 falls back to bf16 for them)
    _with_config(monkeypatch, mode, False)
    out, ref, defined = run_contiguous(api, [17, 9], 32, 256, fp4=True, alignment=32, gran_k_a=32,
                                       recipe_kwargs=dict(recipe=(1, 1, 32)))
    check(out, ref, defined)


@pytest.mark.parametrize("zero_pad", [True, False])
def test_psum_layout(monkeypatch, zero_pad):
    _with_config(monkeypatch, "scaled", False)
    out, ref, defined = run_contiguous(api, [20, 0, 3, 40, 0], 32, 128, fp4=True, alignment=32, psum=True,
                                       ensure_zero_padding=zero_pad)
    check(out, ref, defined)


def test_all_padding_segments_are_zero(monkeypatch):
    _with_config(monkeypatch, "scaled", False)
    out, ref, defined = run_contiguous(api, [1, 0, 1], 32, 128, fp4=False, alignment=64)
    check(out, ref, defined)
    assert bool((out[1:64] == 0).all()) and bool((out[65:] == 0).all())


def test_default_configs_small_and_large_alignment():
    # the registered sm_120 configs (the CPU picks them): a narrow and the default alignment
    for alignment in (16, 128):
        out, ref, defined = run_contiguous(api, [3, 0, 18], 128, 128, fp4=True, alignment=alignment)
        check(out, ref, defined)


def test_a_mutation_is_caught(monkeypatch):
    # the check must fail when one expert's weights are swapped for another's
    _with_config(monkeypatch, "scaled", False)
    out, ref, defined = run_contiguous(api, [16, 16], 32, 128, fp4=True, alignment=16)
    with pytest.raises(AssertionError):
        check(out.roll(16, 0), ref, defined)


@pytest.mark.parametrize("mode", ["scaled", "fp8"])
@pytest.mark.parametrize("swap", [False, True])
def test_fp8_weights_ue8m0_both_sides(monkeypatch, mode, swap):
    # e4m3 weights with per-row UE8M0 scales and packed activation scales: the shared base's
    # block-scaled loop (scaled) or its fp32 promotion (fp8)
    _with_config(monkeypatch, mode, swap)
    out, ref, defined = run_contiguous(api, [20, 0, 9], 48, 256, fp4=False, alignment=32, fmt_a="packed",
                                       fmt_b="packed", fp8_per_row=True)
    check(out, ref, defined)

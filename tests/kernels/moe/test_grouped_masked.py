"""m_grouped_fp8_fp4_gemm_nt_masked under the interpreter: masked_m 0 and M_max, clamping, every
MMA mode, the persistent walk with more units than programs."""
import pytest
from moe_support import check, run_masked

from sm12x.frontends.deep_gemm import moe as api
from sm12x.kernels.moe import grouped_masked as gm

pytestmark = pytest.mark.cpu_only


@pytest.mark.parametrize("mode", ["scaled", "mixed", "bf16", "fp8"])
@pytest.mark.parametrize("fp4", [True, False])
@pytest.mark.parametrize("swap", [True, False])
def test_modes(monkeypatch, mode, fp4, swap):
    cfg = dict(BN=32, mode=mode, swap=swap, num_warps=4, num_stages=1, per_sm=1)
    monkeypatch.setattr(gm.configs, "sm_count", lambda device: 2)  # 2 programs walk 4 groups x 2 tiles
    out, ref, defined = run_masked_cfg(monkeypatch, cfg, 4, 40, 64, 256, [0, 40, 7, 17], fp4=fp4, expected_m=16)
    check(out, ref, defined)


def run_masked_cfg(monkeypatch, cfg, *args, **kwargs):
    table = {bm: cfg for bm in gm.BLOCK_MS}
    monkeypatch.setitem(gm.CONFIGS, "sm_120", {"fp8": table, "fp4": table})
    return run_masked(api, *args, **kwargs)


@pytest.mark.parametrize("fmt_b", ["fp32", "packed", "bytes"])
def test_fp4_scale_formats(fmt_b):
    out, ref, defined = run_masked(api, 3, 16, 128, 128, [16, 0, 5], fp4=True, expected_m=8, fmt_b=fmt_b)
    check(out, ref, defined)


def test_all_groups_empty():
    out, ref, defined = run_masked(api, 3, 16, 128, 128, [0, 0, 0], fp4=True, expected_m=8)
    check(out, ref, defined)


def test_masked_m_beyond_m_max_is_clamped():
    out, ref, defined = run_masked(api, 2, 16, 128, 128, [16, 16], fp4=True, expected_m=16)
    check(out, ref, defined)
    import torch

    from sm12x.kernels.moe.cases import make_masked, make_weights

    a, sa, _ = make_masked(2, 16, 128, [16, 16])
    b, sb = make_weights(2, 128, 128, fp4=True)
    d = torch.zeros(2, 16, 128, dtype=torch.bfloat16)
    api.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (b, sb), d, torch.tensor([99, 16], dtype=torch.int32), 16)
    assert torch.equal(d, out)


@pytest.mark.parametrize("expected_m", [1, 24, 200])
def test_expected_m_picks_tile_height_only(expected_m):
    out, ref, defined = run_masked(api, 2, 70, 128, 128, [70, 33], fp4=True, expected_m=expected_m)
    check(out, ref, defined)


def test_fp8_weights_ue8m0_both_sides():
    out, ref, defined = run_masked(api, 3, 16, 128, 256, [16, 0, 5], fp4=False, expected_m=8, fmt_a="packed",
                                   fmt_b="bytes", fp8_per_row=True)
    check(out, ref, defined)

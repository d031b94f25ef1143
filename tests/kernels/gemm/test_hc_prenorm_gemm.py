"""tf32_hc_prenorm_gemm against its reference: with and without num_splits, M = 1 and odd M,
strided outputs, bad inputs; the GPU twin at V4-Flash's mHC shape (N=24, K=16384)."""
import pytest
import torch

from sm12x.kernels.gemm.hc_prenorm_gemm import hc_prenorm_gemm
from sm12x.kernels.gemm.reference import ref_tf32_hc_prenorm_gemm


def _inputs(m, n, k, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, device=device, generator=g).bfloat16()
    b = torch.randn(n, k, device=device, generator=g) / k ** 0.5
    return a, b


def _check(d, sq, a, b):
    ref_d, ref_sq = ref_tf32_hc_prenorm_gemm(a, b)
    # TF32 rounds b to 10 mantissa bits: relative error ~2**-11 per product
    torch.testing.assert_close(d, ref_d, rtol=2e-3, atol=2e-3 * float(ref_d.abs().max()))
    torch.testing.assert_close(sq, ref_sq, rtol=1e-5, atol=1e-3)


@pytest.mark.cpu_only
@pytest.mark.parametrize("m", [1, 33])
@pytest.mark.parametrize("splits", [None, 1, 3, 7])
def test_prenorm(m, splits, device):
    n, k = 24, 640  # K not a multiple of the K step
    a, b = _inputs(m, n, k, device, seed=m)
    lead = () if splits is None else (splits,)
    d = torch.full((*lead, m, n), float("nan"), device=device)
    sq = torch.full((*lead, m), float("nan"), device=device)
    assert hc_prenorm_gemm(a, b, d, sq, splits) is None
    if splits is not None:
        d, sq = d.sum(0), sq.sum(0)
    _check(d, sq, a, b)


@pytest.mark.cpu_only
def test_prenorm_strided_outputs(device):
    m, n, k = 9, 24, 512
    a, b = _inputs(m, n, k, device, seed=2)
    d = torch.empty(n, m, device=device).T
    sq = torch.empty(m, 2, device=device)[:, 0]
    hc_prenorm_gemm(a, b, d, sq)
    _check(d, sq, a, b)


@pytest.mark.cpu_only
def test_prenorm_bad_inputs(device):
    a, b = _inputs(4, 24, 256, device)
    d, sq = torch.empty(4, 24, device=device), torch.empty(4, device=device)
    for args, name in [((a.float(), b, d, sq), "'a'"), ((a, b.bfloat16(), d, sq), "'b'"),
                       ((a, b, d[:, :8], sq), "'d'"), ((a, b, d, sq[:2]), "'sqr_sum'"),
                       ((a, b, d, sq, 0), "'num_splits'"), ((a, b, d, sq, 2), "'d'")]:
        with pytest.raises(ValueError, match=f"tf32_hc_prenorm_gemm: argument {name}"):
            hc_prenorm_gemm(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 24, 137, 4096])
@pytest.mark.parametrize("splits", [None, 16])
def test_prenorm_v4_flash(m, splits, device):
    a, b = _inputs(m, 24, 16384, device, seed=m)
    lead = () if splits is None else (splits,)
    d, sq = torch.empty(*lead, m, 24, device=device), torch.empty(*lead, m, device=device)
    hc_prenorm_gemm(a, b, d, sq, splits)
    if splits is not None:
        d, sq = d.sum(0), sq.sum(0)
    _check(d, sq, a, b)

"""fp8_einsum("bhr,hdr->bhd") against its reference: scale formats, B = 1 and odd B, C aliasing
D, split-K, bad inputs; the GPU twin at V4-Flash's wo_a shape (H=8, R=4096, D=1024)."""
import pytest
import torch

from sm12x.kernels.common.tolerance import assert_gemm_close
from sm12x.kernels.gemm.cases import einsum_inputs
from sm12x.kernels.gemm.fp8_einsum import fp8_einsum_bhr_hdr
from sm12x.kernels.gemm.reference import ref_fp8_einsum_bhr_hdr
from sm12x.kernels.gemm.scales import pack_ue8m0, rows_from_blocks


@pytest.mark.cpu_only
@pytest.mark.parametrize("nb", [1, 5])
@pytest.mark.parametrize("fmt", ["fp32", "fp32 sfa MN-major", "packed ue8m0"])
def test_einsum_formats(nb, fmt, device):
    h, r, nd = 3, 256, 256
    a, sa, b, sb = einsum_inputs(nb, h, r, nd, device, ue8m0=fmt == "packed ue8m0", seed=nb)
    sfa, sfb = sa, sb
    if fmt == "fp32 sfa MN-major":
        sfa = sa.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    elif fmt == "packed ue8m0":
        sfa = pack_ue8m0(sa.transpose(0, 1)).transpose(0, 1)  # [B, H, words], B-major per head
        sfb = pack_ue8m0(rows_from_blocks(sb, nd, 128))
    d = torch.empty(nb, h, nd, dtype=torch.float32, device=device)
    fp8_einsum_bhr_hdr(a, sfa, b, sfb, d)
    assert_gemm_close(d, ref_fp8_einsum_bhr_hdr(a, sa, b, sb))


@pytest.mark.cpu_only
def test_einsum_split_k_with_c_aliasing_d(device):
    nb, h, r, nd = 3, 2, 1024, 128
    a, sa, b, sb = einsum_inputs(nb, h, r, nd, device, seed=7)
    c = torch.randn(nb, h, nd, device=device)
    d = c.clone()
    fp8_einsum_bhr_hdr(a, sa, b, sb, d, d)
    assert_gemm_close(d, ref_fp8_einsum_bhr_hdr(a, sa, b, sb, c))


@pytest.mark.cpu_only
def test_einsum_bad_inputs(device):
    a, sa, b, sb = einsum_inputs(2, 2, 256, 128, device)
    d = torch.empty(2, 2, 128, dtype=torch.bfloat16, device=device)
    for args, name in [((a[:, :1], sa, b, sb, d), "'b'"), ((a, sa[..., :1], b, sb, d), "'sfa'"),
                       ((a, sa, b, sb, d[:, :, :64]), "'d'"), ((a.float(), sa, b, sb, d), "'a'"),
                       ((a, sa, b, sb[:, :, :1], d), "'sfb'")]:
        with pytest.raises(ValueError, match=f"fp8_einsum: argument {name}"):
            fp8_einsum_bhr_hdr(*args)


@pytest.mark.gpu
@pytest.mark.parametrize("nb", [1, 8, 128, 2048])
def test_einsum_v4_flash_wo_a(nb, device):
    a, sa, b, sb = einsum_inputs(nb, 8, 4096, 1024, device, seed=nb)
    d = torch.empty(nb, 8, 1024, dtype=torch.bfloat16, device=device)
    fp8_einsum_bhr_hdr(a, sa, b, sb, d)
    assert_gemm_close(d, ref_fp8_einsum_bhr_hdr(a, sa, b, sb))


@pytest.mark.cpu_only
def test_einsum_bhd_hdr_bhr(device):
    """The transpose-side expression: K = D, the weight read as [H, R, D]."""
    from sm12x.kernels.gemm.fp8_einsum import fp8_einsum
    from sm12x.kernels.gemm.reference import per_block_cast_to_fp8, per_token_cast_to_fp8, ref_fp8_einsum_bhd_hdr

    nb, h, nd, r = 3, 2, 256, 384
    g = torch.Generator().manual_seed(11)
    a, sa = per_token_cast_to_fp8(torch.randn(nb * h, nd, generator=g))
    a, sa = a.view(nb, h, nd).to(device), sa.view(nb, h, -1).to(device)
    blocks = [per_block_cast_to_fp8(torch.randn(nd, r, generator=g)) for _ in range(h)]
    b = torch.stack([x for x, _ in blocks]).to(device)
    sb = torch.stack([s for _, s in blocks]).to(device)
    d = torch.empty(nb, h, r, device=device)
    fp8_einsum("bhd,hdr->bhr", a, sa, b, sb, d)
    assert_gemm_close(d, ref_fp8_einsum_bhd_hdr(a, sa, b, sb))

"""The DeepGEMM-compatible dense API (sm12x.frontends.deep_gemm.gemm): DeepGEMM's signatures,
recipes and scale layouts as its callers pass them, against the PyTorch references."""
import pytest
import torch

import sm12x.frontends.deep_gemm.gemm as dg
from sm12x.kernels.gemm.cases import einsum_inputs, gemm_inputs
from sm12x.kernels.gemm.reference import (per_block_cast_to_fp8, per_token_cast_to_fp8,
                                          ref_fp8_einsum_bhr_hdr, ref_fp8_gemm_nt,
                                          ref_tf32_hc_prenorm_gemm)

pytestmark = pytest.mark.cpu_only


def _close(d, ref):
    torch.testing.assert_close(d.float(), ref, rtol=8e-3, atol=2e-2)


def test_names_exist_and_shim_contract():
    for name in dg.NAMES + dg.HELPER_NAMES:
        assert callable(getattr(dg, name)), name
    from sm12x.frontends.deep_gemm import indexer

    assert dg.get_num_sms is indexer.get_num_sms  # one home for the SM count


@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_gemm_nt_default_recipe(ue8m0, device):
    m, n, k = 7, 256, 384
    a, sfa, b, sfb, sa, sb = gemm_inputs(m, n, k, device, ue8m0=ue8m0)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    assert dg.fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=not ue8m0) is None
    _close(d, ref_fp8_gemm_nt(a, sa, b, sb))


def test_fp8_gemm_nt_k128_packed_scales_without_recipe(device):
    """K = 128 with packed UE8M0 scales and no recipe (as SGLang calls it): one int32 word fits both
    a 128- and a 32-wide K granularity; DeepGEMM's FP8 default (128) is the right reading."""
    m, n, k = 16, 256, 128
    a, sfa, b, sfb, sa, sb = gemm_inputs(m, n, k, device, ue8m0=True)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d)
    _close(d, ref_fp8_gemm_nt(a, sa, b, sb))


def test_fp8_gemm_nt_recipes_and_c(device):
    """recipe (1,128,128) with per-block sfb, recipe_a/recipe_b with per-row sfb, (1,1,128) with
    packed sfb; C as a separate tensor and as D itself."""
    m, n, k = 5, 256, 256
    a, sfa, b, sfb, sa, sb = gemm_inputs(m, n, k, device)
    ref = ref_fp8_gemm_nt(a, sa, b, sb)
    d = torch.empty(m, n, device=device)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 128, 128))
    _close(d, ref)
    rows = sb.repeat_interleave(128, 0)[:n]
    dg.fp8_gemm_nt((a, sa), (b, rows), d, recipe_a=(1, 128), recipe_b=(1, 128))
    _close(d, ref)
    c = torch.randn(m, n, device=device)
    d.copy_(c)
    dg.fp8_gemm_nt((a, sa), (b, sb), d, c=d)
    _close(d, ref + c)
    # (1, 1, 128) with a per-block float sfb: DeepGEMM callers (vLLM 0.22.1's wo_a) pass the
    # weight's 128x128 scales with this recipe; the scale shape decides
    dg.fp8_gemm_nt((a, sa), (b, sb), d, recipe=(1, 1, 128))
    _close(d, ref)


def test_fp8_gemm_nn_tn_tt(device):
    m, n, k = 9, 128, 256
    a, _, b, _, sa, sb = gemm_inputs(m, n, k, device, seed=2)
    ref = ref_fp8_gemm_nt(a, sa, b, sb)
    at, bt = a.T.contiguous(), b.T.contiguous()  # [K, M], [K, N]
    for fn, aa, bb in ((dg.fp8_gemm_nn, (a, sa), (bt, sb.T)), (dg.fp8_gemm_tn, (at, sa.T), (bt, sb.T)),
                       (dg.fp8_gemm_tt, (at, sa.T), (b, sb)), (dg.fp8_fp4_gemm_nt, (a, sa), (b, sb))):
        d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        fn(aa, bb, d)
        _close(d, ref)


def test_fp8_gemm_rejections(device):
    m, n, k = 4, 128, 256
    a, sfa, b, sfb, _, _ = gemm_inputs(m, n, k, device)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="fp8_gemm_nt: argument 'b'.*FP4"):
        dg.fp8_gemm_nt((a, sfa), (torch.zeros(n, k // 2, dtype=torch.int8, device=device), sfb), d)
    with pytest.raises(ValueError, match="fp8_gemm_nt: argument 'a'"):
        dg.fp8_gemm_nt(a, (b, sfb), d)
    with pytest.raises(ValueError, match="fp8_gemm_nt: argument 'recipe'"):
        dg.fp8_gemm_nt((a, sfa), (b, sfb), d, recipe=(1, 128, 128), recipe_a=(1, 128), recipe_b=(1, 128))
    with pytest.raises(NotImplementedError, match="fp8_gemm_nt: argument 'mystery'"):
        dg.fp8_gemm_nt((a, sfa), (b, sfb), d, mystery=3)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, mystery=None)  # an unknown argument left off is fine


def test_fp8_einsum_as_vllm_0221_calls_it(device):
    """DeepSeek-V4's wo_a in vLLM 0.22.1 on SM12x: o quantised per token with UE8M0 scales packed
    as int32 [T, g, words] (a transposed MN-major buffer), the weight's float32 128x128 scales
    [g, r/128, d/128], recipe (1, 1, 128), d bf16 [T, g, r]."""
    t, g, d_in, r = 3, 2, 512, 256
    gen = torch.Generator().manual_seed(0)
    o, o_sf = per_token_cast_to_fp8(torch.randn(g * t, d_in, generator=gen), use_ue8m0=True)
    o, o_sf = o.view(g, t, d_in).to(device), o_sf.view(g, t, -1).to(device)
    packed = dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(o_sf)  # [g, t, words], MN-major
    blocks = [per_block_cast_to_fp8(torch.randn(r, d_in, generator=gen)) for _ in range(g)]
    w = torch.stack([x for x, _ in blocks]).to(device)
    w_sf = torch.stack([s for _, s in blocks]).to(device)
    z = torch.empty(t, g, r, dtype=torch.bfloat16, device=device)
    dg.fp8_einsum("bhr,hdr->bhd", (o.transpose(0, 1), packed.transpose(0, 1)), (w, w_sf), z, recipe=(1, 1, 128))
    _close(z, ref_fp8_einsum_bhr_hdr(o.transpose(0, 1), o_sf.transpose(0, 1), w, w_sf))


def test_fp8_einsum_default_recipe_and_bad_expr(device):
    a, sa, b, sb = einsum_inputs(2, 2, 256, 128, device)
    d = torch.empty(2, 2, 128, dtype=torch.bfloat16, device=device)
    dg.fp8_einsum("bhr,hdr->bhd", (a, sa), (b, sb), d)
    _close(d, ref_fp8_einsum_bhr_hdr(a, sa, b, sb))
    with pytest.raises(ValueError, match="fp8_einsum: argument 'expr'"):
        dg.fp8_einsum("bhd,bhr->hdr", (a, sa), (b, sb), d)


def test_bf16_einsum_forms(device):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(3, 4, 64, generator=gen).bfloat16().to(device)
    b = torch.randn(3, 5, 64, generator=gen).bfloat16().to(device)
    acc = torch.randn(4, 5, device=device)
    d = acc.clone()
    dg.einsum("bmk,bnk->mn", a, b, d, c=d)
    torch.testing.assert_close(d, acc + torch.einsum("bmk,bnk->mn", a.float(), b.float()), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="einsum: argument 'c'"):
        dg.einsum("bmk,bnk->mn", a, b, d)
    x = torch.randn(2, 3, 64, generator=gen).bfloat16().to(device)  # b h r
    w = torch.randn(3, 32, 64, generator=gen).bfloat16().to(device)  # h d r
    out = torch.empty(2, 3, 32, dtype=torch.bfloat16, device=device)
    dg.einsum("bhr,hdr->bhd", x, w, out)
    torch.testing.assert_close(out.float(), torch.einsum("bhr,hdr->bhd", x.float(), w.float()), rtol=1e-2, atol=5e-2)
    y = torch.randn(2, 3, 32, generator=gen).bfloat16().to(device)  # b h d
    out2 = torch.empty(2, 3, 64, dtype=torch.bfloat16, device=device)
    dg.einsum("bhd,hdr->bhr", y, w, out2)
    torch.testing.assert_close(out2.float(), torch.einsum("bhd,hdr->bhr", y.float(), w.float()), rtol=1e-2, atol=5e-2)


def test_tf32_hc_prenorm_gemm_as_vllm_calls_it(device):
    """vLLM's mhc_pre: out [n_splits, T, 24], sqrsum [n_splits, T], summed by the caller."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 1024, generator=gen).bfloat16().to(device)
    fn = (torch.randn(24, 1024, generator=gen) / 32).to(device)
    out, sq = torch.empty(4, 5, 24, device=device), torch.empty(4, 5, device=device)
    assert dg.tf32_hc_prenorm_gemm(x, fn, out, sq, 4) is None
    ref_d, ref_sq = ref_tf32_hc_prenorm_gemm(x, fn)
    torch.testing.assert_close(out.sum(0), ref_d, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(sq.sum(0), ref_sq, rtol=1e-5, atol=1e-3)


def test_transform_sf_into_required_layout(device):
    """DeepGEMM's SM120 layouts: float32 packed into per-row UE8M0 int32 (MN-major, TMA-aligned),
    float32 kept with disable_ue8m0_cast, packed int32 passed through; the GEMM reads them all."""
    m, n, k = 6, 256, 512
    a, _, b, _, sa, sb = gemm_inputs(m, n, k, device, ue8m0=True)
    tb = dg.transform_sf_into_required_layout(sb, n, k, (1, 128, 128), is_sfa=False)
    assert tb.dtype == torch.int32 and tuple(tb.shape) == (n, 1) and tb.stride(0) == 1
    ta = dg.transform_sf_into_required_layout(sa, m, k, (1, 128), disable_ue8m0_cast=True)
    assert ta.dtype == torch.float32 and ta.stride() == (1, 8)
    assert dg.transform_sf_into_required_layout(tb, n, k, (1, 128)) is tb
    grouped = dg.transform_sf_into_required_layout(torch.stack([sb, sb]), n, k, (1, 128, 128), num_groups=2,
                                                   is_sfa=False)
    assert tuple(grouped.shape) == (2, n, 1)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    dg.fp8_gemm_nt((a, ta), (b, tb), d)
    _close(d, ref_fp8_gemm_nt(a, sa, b, sb))
    with pytest.raises(ValueError, match="transform_sf_into_required_layout: argument 'is_sfa'"):
        dg.transform_sf_into_required_layout(sb, n, k, (1, 128, 128))


def test_small_helpers():
    assert dg.get_tma_aligned_size(5, 4) == 8
    assert dg.ceil_div(5, 4) == 2 and dg.align(5, 4) == 8
    x = torch.tensor([[1.0, 2.0, 0.5, 4.0]])
    assert int(dg.pack_ue8m0_to_int(x)) & 0xFFFFFFFF == 127 | (128 << 8) | (126 << 16) | (129 << 24)
    assert dg.get_col_major_tma_aligned_tensor(torch.ones(6, 3)).stride() == (1, 8)

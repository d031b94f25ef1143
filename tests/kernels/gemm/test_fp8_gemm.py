"""The dense block-scaled FP8 GEMM against its PyTorch reference: every DeepGEMM scale format and
recipe, M = 1 and odd M, C given and aliasing D, split-K, strided (transposed) operands, bad
inputs. Interpreter shapes are tiny; the GPU twin runs V4-Flash linear shapes."""
import pytest
import torch

from sm12x.kernels.common.tolerance import assert_gemm_close
from sm12x.kernels.gemm.fp8_gemm import fp8_gemm, plan
from sm12x.kernels.gemm.reference import (per_block_cast_to_fp8, per_token_cast_to_fp8,
                                          ref_fp8_gemm_nt)
from sm12x.kernels.gemm.scales import mn_major_tma_aligned, pack_ue8m0, read_scales, rows_from_blocks


def _inputs(m, n, k, device, ue8m0=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    a, sa = per_token_cast_to_fp8(torch.randn(m, k, generator=g), ue8m0)
    b, sb = per_block_cast_to_fp8(torch.randn(n, k, generator=g), ue8m0)
    return a.to(device), sa.to(device), b.to(device), sb.to(device)


def _formats(sa, sb, n, fmt):
    """(sfa, sfb, recipe grans) of one DeepGEMM scale format built from float32 scales."""
    if fmt == "fp32 block, sfa K-major":
        return sa, sb, (None, None)
    if fmt == "fp32 block, sfa MN-major":
        return mn_major_tma_aligned(sa), sb.T.contiguous().T, (None, None)
    if fmt == "fp32 per-row sfb (1,1,128)":
        return sa, rows_from_blocks(sb, n, 128), (1, 128)
    if fmt == "packed ue8m0 int32":
        return pack_ue8m0(sa), pack_ue8m0(rows_from_blocks(sb, n, 128)), (1, 128)
    if fmt == "uint8 ue8m0":
        to_u8 = lambda s: ((s.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)  # noqa: E731
        return to_u8(sa), to_u8(sb), (None, None)
    if fmt == "float8_e8m0fnu":
        to_e8 = lambda s: ((s.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8).view(torch.float8_e8m0fnu)  # noqa: E731
        return to_e8(sa), to_e8(rows_from_blocks(sb, n, 128)), (None, None)
    raise AssertionError(fmt)


FORMATS = ("fp32 block, sfa K-major", "fp32 block, sfa MN-major", "fp32 per-row sfb (1,1,128)",
           "packed ue8m0 int32", "uint8 ue8m0", "float8_e8m0fnu")


@pytest.mark.cpu_only
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_scale_format(fmt, device):
    m, n, k = 5, 256, 384
    ue8m0 = "ue8m0" in fmt or "e8m0" in fmt
    a, sa, b, sb = _inputs(m, n, k, device, ue8m0=ue8m0)
    sfa, sfb, gran_b = _formats(sa, sb, n, fmt)
    d = torch.empty(m, n, dtype=torch.float32, device=device)
    fp8_gemm(a, sfa, b, sfb, d, gran_b=gran_b)
    assert_gemm_close(d, ref_fp8_gemm_nt(a, sa, b, sb))


@pytest.mark.cpu_only
@pytest.mark.parametrize("m", [1, 17, 65, 130])
@pytest.mark.parametrize("out", [torch.bfloat16, torch.float32])
def test_m_and_output_dtypes(m, out, device):
    """M = 1 and odd M through each tile class (swap-AB <= 64, 64-row tiles, 128-row tiles)."""
    n, k = 192, 256  # N not a multiple of 128: masked columns
    a, sa, b, sb = _inputs(m, n, k, device, seed=m)
    d = torch.empty(m, n, dtype=out, device=device)
    fp8_gemm(a, sa, b, sb, d)
    assert_gemm_close(d, ref_fp8_gemm_nt(a, sa, b, sb))


@pytest.mark.cpu_only
@pytest.mark.parametrize("m", [1, 9, 80])
def test_split_k_with_c_aliasing_d(m, device):
    """K long enough to be split (fp32 partials + reduce), C given as D itself (D += A @ B^T)."""
    n, k = 128, 1024
    a, sa, b, sb = _inputs(m, n, k, device, seed=3)
    s_a, s_b = read_scales("t", "sfa", sa, m, k), read_scales("t", "sfb", sb, n, k)
    assert plan(m, n, k, s_a, s_b, a.device)[3] > 1, "this shape must take the split-K path"
    c = torch.randn(m, n, device=device)
    d = c.clone()
    fp8_gemm(a, sa, b, sb, d, d)
    assert_gemm_close(d, ref_fp8_gemm_nt(a, sa, b, sb, c))


@pytest.mark.cpu_only
def test_c_separate_and_bf16_out(device):
    m, n, k = 33, 256, 256
    a, sa, b, sb = _inputs(m, n, k, device, seed=4)
    c = torch.randn(m, n, device=device)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    fp8_gemm(a, sa, b, sb, d, c)
    assert_gemm_close(d, ref_fp8_gemm_nt(a, sa, b, sb, c))


@pytest.mark.cpu_only
def test_transposed_operands_and_odd_k(device):
    """A and B given as transposed views (the nn / tn / tt forms), K a multiple of 16 only."""
    m, n, k = 20, 144, 208
    a, sa, b, sb = _inputs(m, n, k, device, seed=5)
    at = a.T.contiguous().T
    bt = b.T.contiguous().T
    d = torch.empty(m, n, dtype=torch.float32, device=device)
    fp8_gemm(at, sa, bt, sb, d)
    assert_gemm_close(d, ref_fp8_gemm_nt(a, sa, b, sb))


@pytest.mark.cpu_only
def test_scaled_mma_matches_fp32_promotion(device, monkeypatch):
    """With UE8M0 scales the sm_120 config uses tl.dot_scaled, sm_90 fp32 promotion: same result."""
    m, n, k = 48, 128, 256
    a, sa, b, sb = _inputs(m, n, k, device, ue8m0=True, seed=6)
    pa, pb = pack_ue8m0(sa), pack_ue8m0(rows_from_blocks(sb, n, 128))
    outs = []
    for arch in ("sm_120", "sm_90"):
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", arch)
        d = torch.empty(m, n, dtype=torch.float32, device=device)
        fp8_gemm(a, pa, b, pb, d)
        outs.append(d)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-4)
    assert_gemm_close(outs[0], ref_fp8_gemm_nt(a, sa, b, sb))


def _without_unit_mx(monkeypatch):
    """The sm_120 tiles with unit_mx off: the same launch with tl.dot products."""
    import dataclasses

    from sm12x.kernels.gemm import block_scaled, fp8_gemm as mod

    plain = {arch: {cls: dataclasses.replace(t, unit_mx=False) for cls, t in tiles.items()}
             for arch, tiles in block_scaled.TILES.items()}
    monkeypatch.setattr(block_scaled, "TILES", plain)
    monkeypatch.setattr(mod, "pick_tile", lambda m, arch=None: block_scaled.pick_tile(m, tiles=plain, arch=arch))
    mod._plan.cache_clear()


def test_unit_mx_configs():
    """float32-scale calls take unit-scale block-scaled products on the sm_120 tiles, not on sm_90."""
    from sm12x.kernels.common.fp8_dot import native_block_scaled
    from sm12x.kernels.gemm import block_scaled

    assert all(t.unit_mx for t in block_scaled.TILES["sm_120"].values())
    assert not any(t.unit_mx for t in block_scaled.TILES["sm_90"].values())
    assert all(t.unit_mx == native_block_scaled("sm_121") for t in block_scaled.TILES["sm_121"].values())


@pytest.mark.cpu_only
@pytest.mark.parametrize("m", [3, 80, 130])
def test_unit_mx_identical_to_plain_dot(m, device, monkeypatch):
    """float32 scales (promoted per 128 K) on the sm_120 tiles: the unit-scale tl.dot_scaled
    products give the same d, bit for bit, as tl.dot (swap-AB, 64-row and 128-row tiles; split-K at
    m=3)."""
    from sm12x.kernels.gemm import fp8_gemm as mod

    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")
    mod._plan.cache_clear()
    n, k = 128, 512
    a, sa, b, sb = _inputs(m, n, k, device, seed=m)
    sfa = mn_major_tma_aligned(sa)
    assert plan(m, n, k, read_scales("t", "sfa", sfa, m, k), read_scales("t", "sfb", sb, n, k),
                torch.device(device))[6]
    d_mx = torch.empty(m, n, dtype=torch.float32, device=device)
    fp8_gemm(a, sfa, b, sb, d_mx)
    _without_unit_mx(monkeypatch)
    assert not plan(m, n, k, read_scales("t", "sfa", sfa, m, k), read_scales("t", "sfb", sb, n, k),
                    torch.device(device))[6]
    d = torch.empty(m, n, dtype=torch.float32, device=device)
    fp8_gemm(a, sfa, b, sb, d)
    mod._plan.cache_clear()
    assert torch.equal(d_mx, d)
    assert_gemm_close(d_mx, ref_fp8_gemm_nt(a, sa, b, sb))


@pytest.mark.cpu_only
def test_bad_inputs_are_rejected_by_name(device):
    m, n, k = 4, 128, 256
    a, sa, b, sb = _inputs(m, n, k, device)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    cases = [
        (dict(a=a.float()), "'a'"),
        (dict(b=b[:, :128]), "'b'"),
        (dict(sfa=sa[:, :1]), "'sfa'"),
        (dict(sfb=sb.double()), "'sfb'"),
        (dict(sfb=torch.ones(3, 2, device=device)), "'sfb'"),
        (dict(d=torch.empty(m, n, dtype=torch.float16, device=device)), "'d'"),
        (dict(d=torch.empty(m, n + 1, dtype=torch.bfloat16, device=device)), "'d'"),
        (dict(c=torch.empty(m + 1, n, device=device)), "'c'"),
    ]
    for change, name in cases:
        args = dict(a=a, sfa=sa, b=b, sfb=sb, d=d, c=None)
        args.update(change)
        with pytest.raises(ValueError, match=f"fp8_gemm_nt: argument {name}"):
            fp8_gemm(args["a"], args["sfa"], args["b"], args["sfb"], args["d"], args["c"])
    with pytest.raises(ValueError, match="'a'"):  # K not a multiple of 16
        fp8_gemm(a[:, :100], sa, b[:, :100], sb, d)


# ----------------------------------------------------------------------------------------------
# GPU: V4-Flash linear shapes


V4_NK = [(1024, 4096), (512, 4096), (32768, 1024), (8192, 1024), (4096, 8192), (4096, 4096), (4096, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,k", V4_NK)
@pytest.mark.parametrize("m", [1, 16, 64, 128, 4096])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_v4_flash_shapes(n, k, m, ue8m0, device):
    a, sa, b, sb = _inputs(m, n, k, device, ue8m0=ue8m0, seed=m + n)
    if ue8m0:
        sfa, sfb = pack_ue8m0(sa), pack_ue8m0(rows_from_blocks(sb, n, 128))
    else:
        sfa, sfb = mn_major_tma_aligned(sa), sb
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    fp8_gemm(a, sfa, b, sfb, d)
    ref = ref_fp8_gemm_nt(a, sa, b, sb)
    assert_gemm_close(d, ref)

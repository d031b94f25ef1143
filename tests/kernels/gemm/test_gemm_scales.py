"""Reading DeepGEMM's scale formats (sm12x.kernels.gemm.scales): shapes and granularities read
right, mismatches rejected by name, the packed layout identical to DeepGEMM's."""
import pytest
import torch

from sm12x.kernels.gemm.scales import (SF_FP32, SF_UE8M0_BYTES, SF_UE8M0_PACKED, ceil_to_ue8m0,
                                       mn_major_tma_aligned, pack_ue8m0, read_scales, unpack_scales)


def test_read_granularities_from_shapes():
    s = read_scales("op", "sfa", torch.ones(300, 4), 300, 512)
    assert (s.kind, s.gran_mn, s.gran_k) == (SF_FP32, 1, 128)
    s = read_scales("op", "sfb", torch.ones(3, 4), 300, 512)
    assert (s.gran_mn, s.gran_k) == (128, 128)
    s = read_scales("op", "sfb", torch.ones(300, 16), 300, 512)
    assert s.gran_k == 32
    s = read_scales("op", "sfb", torch.ones(300, 1, dtype=torch.int32), 300, 512)
    assert (s.kind, s.gran_k) == (SF_UE8M0_PACKED, 128)
    s = read_scales("op", "sfb", torch.ones(300, 4, dtype=torch.int32), 300, 512)
    assert s.gran_k == 32
    # K = 128: one packed word fits gran_k 128 and 32; the caller's preference decides (FP8
    # operands: 128, DeepGEMM's FP8 default; e2m1 weights: 32)
    s = read_scales("op", "sfb", torch.ones(300, 1, dtype=torch.int32), 300, 128, prefer_k=128)
    assert s.gran_k == 128
    s = read_scales("op", "sfb", torch.ones(300, 1, dtype=torch.int32), 300, 128)
    assert s.gran_k == 32
    s = read_scales("op", "sfb", torch.ones(300, 1), 300, 32, prefer_k=128)
    assert s.gran_k == 128
    s = read_scales("op", "sfb", torch.ones(2, 300, 4, dtype=torch.uint8), 300, 512, groups=2)
    assert (s.kind, s.stride_g) == (SF_UE8M0_BYTES, 1200)


@pytest.mark.parametrize("sf,msg", [
    (torch.ones(5, 4, dtype=torch.float16), "dtype"),
    (torch.ones(7, 4), "scale rows"),
    (torch.ones(300, 5), "K-blocks"),
    (torch.ones(300, 3, dtype=torch.int32), "int32 words"),
    (torch.ones(300, 4, 1), "dims"),
])
def test_mismatches_name_the_argument(sf, msg):
    with pytest.raises(ValueError, match=f"sm12x op: argument 'sfx'.*{msg}"):
        read_scales("op", "sfx", sf, 300, 512)


def test_pack_matches_deepgemm_layout():
    """DeepGEMM packs exponent bytes little-endian along K into MN-major int32 columns whose stride
    is MN aligned to 4."""
    sf = ceil_to_ue8m0(torch.rand(6, 5) * 10)
    packed = pack_ue8m0(sf)
    assert packed.shape == (6, 2) and packed.stride() == (1, 8)
    exp = (sf.view(torch.int32) >> 23) & 0xFF
    assert int(packed[2, 1]) & 0xFF == int(exp[2, 4])
    assert (int(packed[3, 0]) >> 16) & 0xFF == int(exp[3, 2])
    back = unpack_scales(read_scales("op", "sf", packed, 6, 5 * 128), 6, 5 * 128)
    assert torch.equal(back, sf)


def test_ceil_to_ue8m0_rounds_up_to_powers_of_two():
    x = torch.tensor([1.0, 1.5, 0.3, 3e-39, 2.0 ** -20, -5.0])
    got = ceil_to_ue8m0(x)
    assert got.tolist() == [1.0, 2.0, 0.5, 2.0 ** -126, 2.0 ** -20, 8.0]


def test_mn_major_tma_aligned():
    sf = torch.randn(6, 3)
    out = mn_major_tma_aligned(sf)
    assert out.stride() == (1, 8) and torch.equal(out, sf)
    assert mn_major_tma_aligned(out) is out

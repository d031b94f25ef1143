"""The MoE references and FP4 decoding: e2m1 values and packing, UE8M0 scale formats, the Triton
widening helpers (under the interpreter), and the grouped references against explicit loops."""
import pytest
import torch

from sm12x.kernels.gemm.scales import read_scales
from sm12x.kernels.moe.cases import (
    make_contiguous,
    make_masked,
    make_weights,
    scale_format,
)
from sm12x.kernels.moe.fp4 import E2M1_VALUES, quantize_e2m1, unpack_e2m1
from sm12x.kernels.moe.reference import (
    dequant,
    psum_segments,
    ref_grouped_contiguous,
    ref_grouped_masked,
)

pytestmark = pytest.mark.cpu_only


def test_unpack_low_nibble_is_even_element():
    codes = torch.arange(16)
    packed = (codes | (((codes + 5) % 16) << 4)).to(torch.uint8).view(torch.int8)
    vals = unpack_e2m1(packed)
    table = torch.tensor(E2M1_VALUES)
    assert torch.equal(vals[0::2], table[codes])
    assert torch.equal(vals[1::2], table[(codes + 5) % 16])


def test_e2m1_table_is_the_format():
    # value of s|e1e0|m: m/2 for e = 0, 2^(e-1) (1 + m/2) otherwise
    for c in range(16):
        s, e, m = c >> 3, (c >> 1) & 3, c & 1
        mag = m / 2 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
        assert E2M1_VALUES[c] == (-mag if s else mag)


def test_quantize_round_trip():
    x = torch.randn(3, 64)
    packed, sf = quantize_e2m1(x)
    y = unpack_e2m1(packed).view(3, 2, 32) * sf.view(3, 2, 1)
    # e2m1 keeps 1 mantissa bit: error <= a quarter of the block's scale * 2 per element
    assert float(((y.view(3, 64) - x).abs() / sf.repeat_interleave(32, -1)).max()) <= 1.0 + 1e-6
    assert bool((sf == sf.log2().round().exp2()).all())


@pytest.mark.parametrize("fmt", ["fp32", "packed", "bytes"])
def test_scale_formats_dequantise_the_same(fmt):
    b, sf32 = make_weights(2, 8, 256, fp4=True, fmt="fp32")
    ref = dequant(b, read_scales("t", "b", sf32, 8, 256, groups=2), True)
    sf = scale_format(sf32, fmt)
    got = dequant(b, read_scales("t", "b", sf, 8, 256, groups=2), True)
    assert torch.equal(got, ref)


def test_fp32_scales_at_32_are_read_as_ue8m0():
    b, sf = make_weights(1, 4, 128, fp4=True, fmt="fp32")
    off = sf * 1.5  # not a power of two: DeepGEMM keeps the exponent
    got = dequant(b, read_scales("t", "b", off, 4, 128, groups=1), True)
    want = dequant(b, read_scales("t", "b", sf, 4, 128, groups=1), True)
    assert torch.equal(got, want)


def test_contiguous_reference_matches_loop():
    a, sa, layout, m = make_contiguous([5, 0, 9], 128, alignment=16)
    b, sb = make_weights(3, 8, 128, fp4=True)
    sfa = read_scales("t", "a", sa, m, 128)
    sfb = read_scales("t", "b", sb, 8, 128, groups=3)
    d, defined = ref_grouped_contiguous(a, sfa, b, sfb, layout, fp4=True)
    af, bf = dequant(a, sfa, False), dequant(b, sfb, True)
    for r in range(m):
        g = int(layout[r])
        want = af[r] @ bf[g].T if g >= 0 else torch.zeros(8)
        assert torch.allclose(d[r], want, rtol=1e-5, atol=1e-6)
    assert bool(defined.all())


def test_psum_reference_segments():
    assert psum_segments(torch.tensor([5, 5, 40]), 16) == [(0, 5), (16, 5), (16, 40)]
    a, sa, layout, m = make_contiguous([5, 0, 24], 128, alignment=16, psum=True)
    b, sb = make_weights(3, 8, 128, fp4=False)
    sfa = read_scales("t", "a", sa, m, 128)
    sfb = read_scales("t", "b", sb, 8, 128, groups=3)
    d, defined = ref_grouped_contiguous(a, sfa, b, sfb, layout, fp4=False, psum=True, alignment=16,
                                        ensure_zero_padding=False)
    assert defined.tolist() == [True] * 5 + [False] * 11 + [True] * 24 + [False] * 8  # last gap: 40..48
    _, defined_zero = ref_grouped_contiguous(a, sfa, b, sfb, layout, fp4=False, psum=True, alignment=16)
    assert bool(defined_zero.all())


def test_masked_reference_rows():
    a, sa, masked = make_masked(3, 8, 128, [0, 8, 3])
    b, sb = make_weights(3, 16, 128, fp4=True)
    sfa = read_scales("t", "a", sa, 8, 128, groups=3)
    sfb = read_scales("t", "b", sb, 16, 128, groups=3)
    d, defined = ref_grouped_masked(a, sfa, b, sfb, masked, fp4=True)
    assert defined.sum(1).tolist() == [0, 8, 3]
    af, bf = dequant(a, sfa, False), dequant(b, sfb, True)
    assert torch.allclose(d[2, :3], af[2, :3] @ bf[2].T, rtol=1e-5, atol=1e-6)

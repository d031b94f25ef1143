"""The MoE grouped GEMMs in the op registry, with the input builders their tests, self-test and
benchmark share."""
from __future__ import annotations

from sm12x.kernels.registry import Op

FP8_MAX = 448.0


def quant_fp8(x, gran_k: int = 128, gran_mn: int = 1):
    """x [..., MN, K] -> (e4m3, float32 power-of-two scales [..., MN/gran_mn, K/gran_k]):
    DeepGEMM's per_token_cast_to_fp8 (gran_mn 1) / per_block_cast_to_fp8 (128) with use_ue8m0."""
    import torch

    from sm12x.kernels.gemm.scales import ceil_to_ue8m0

    *lead, mn, k = x.shape
    rows = -(-mn // gran_mn) * gran_mn  # a partial last row block
    xp = torch.nn.functional.pad(x.float(), (0, 0, 0, rows - mn))
    blocks = xp.reshape(*lead, rows // gran_mn, gran_mn, k // gran_k, gran_k)
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True).clamp(min=1e-4)
    sf = ceil_to_ue8m0(amax / FP8_MAX)
    q = (blocks / sf).reshape(*lead, rows, k)[..., :mn, :].to(torch.float8_e4m3fn)
    return q, sf.reshape(*lead, rows // gran_mn, k // gran_k)


def scale_format(sf, fmt: str):
    """float32 power-of-two scales [..., KB] in DeepGEMM format ``fmt``: "fp32", "packed" (int32
    UE8M0, MN-major TMA-aligned) or "bytes" (uint8 UE8M0)."""
    import torch

    from sm12x.kernels.gemm.scales import pack_ue8m0

    if fmt == "fp32":
        return sf
    if fmt == "packed":
        return pack_ue8m0(sf)
    return ((sf.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)


def make_weights(groups: int, n: int, k: int, *, fp4: bool, fmt: str = "packed", device="cpu", seed=0,
                 block_scaled_fp8: bool = True):
    """Expert weights (B, sfb): packed e2m1 [G, N, K/2] int8 with (1, 32) scales, or e4m3 [G, N, K]
    with 128x128 block scales (``block_scaled_fp8``; per row and 128 K otherwise)."""
    import torch

    from sm12x.kernels.moe.fp4 import quantize_e2m1

    g = torch.Generator().manual_seed(seed)
    w = torch.randn(groups, n, k, generator=g) * 0.05
    if fp4:
        b, sf = quantize_e2m1(w, 32)
    else:
        b, sf = quant_fp8(w, 128, 128 if block_scaled_fp8 else 1)
    if fmt == "packed" and not fp4 and block_scaled_fp8:
        fmt = "fp32"  # DeepGEMM packs per-row scales only
    return b.to(device), scale_format(sf, fmt).to(device)


def make_contiguous(segments, k: int, *, alignment: int, psum: bool = False, gran_k: int = 128,
                    fmt: str = "fp32", device="cpu", seed=1):
    """Activations in the contiguous layout for expert segments of ``segments[g]`` rows:
    (A e4m3 [M, K], sfa, layout, M). Padding rows of A are zero (as DeepGEMM's generators)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids, ends, start = [], [], 0
    for e, rows in enumerate(segments):
        aligned = -(-rows // alignment) * alignment
        ids += [e] * rows + [-1] * (aligned - rows)
        ends.append(start + rows)
        start += aligned
    m = len(ids)
    x = torch.randn(m, k, generator=g)
    idt = torch.tensor(ids, dtype=torch.int64)
    x[idt < 0] = 0
    a, sa = quant_fp8(x, gran_k)
    layout = torch.tensor(ends if psum else ids, dtype=torch.int32)
    return a.to(device), scale_format(sa, fmt).to(device), layout.to(device), m


def make_masked(groups: int, m_max: int, k: int, masked, *, gran_k: int = 128, fmt: str = "fp32",
                device="cpu", seed=2):
    """(A e4m3 [G, M_max, K], sfa [G, M_max, K-blocks], masked_m int32 [G])."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(groups, m_max, k, generator=g)
    a, sa = quant_fp8(x, gran_k)
    return a.to(device), scale_format(sa, fmt).to(device), torch.tensor(masked, dtype=torch.int32).to(device)


def compare(out, ref, defined) -> tuple:
    """(calc_diff over the defined rows, max abs error there)."""
    from sm12x.kernels.common.tolerance import calc_diff

    got, want = out.float()[defined], ref[defined]
    err = float((got - want).abs().max()) if got.numel() else 0.0
    return calc_diff(got, want), err


# DeepGEMM's tests pass FP8 at calc_diff < 0.001 against unquantised data; against the reference on
# the same quantised inputs only the bf16 output rounding and float32 summation order remain.
MAX_DIFF = 1e-4

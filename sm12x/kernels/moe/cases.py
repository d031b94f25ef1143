"""The self-test cases of the MoE grouped GEMMs (declared in :mod:`sm12x.kernels.manifest`), with
the input builders their tests, self-test and benchmark share."""
from __future__ import annotations


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

    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(groups, n, k, generator=g, device=device) * 0.05
    if fp4:
        b, sf = quantize_e2m1(w, 32)
    else:
        b, sf = quant_fp8(w, 128, 128 if block_scaled_fp8 else 1)
    del w
    if fmt == "packed" and not fp4 and block_scaled_fp8:
        fmt = "fp32"  # DeepGEMM packs per-row scales only
    return b, scale_format(sf, fmt)


def make_contiguous(segments, k: int, *, alignment: int, psum: bool = False, gran_k: int = 128,
                    fmt: str = "fp32", device="cpu", seed=1):
    """Activations in the contiguous layout for expert segments of ``segments[g]`` rows:
    (A e4m3 [M, K], sfa, layout, M). Padding rows of A are zero (as DeepGEMM's generators)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    ids, ends, start = [], [], 0
    for e, rows in enumerate(segments):
        aligned = -(-rows // alignment) * alignment
        ids += [e] * rows + [-1] * (aligned - rows)
        ends.append(start + rows)
        start += aligned
    m = len(ids)
    x = torch.randn(m, k, generator=g, device=device)
    idt = torch.tensor(ids, dtype=torch.int64, device=device)
    x[idt < 0] = 0
    a, sa = quant_fp8(x, gran_k)
    layout = torch.tensor(ends if psum else ids, dtype=torch.int32, device=device)
    return a, scale_format(sa, fmt), layout, m


def make_masked(groups: int, m_max: int, k: int, masked, *, gran_k: int = 128, fmt: str = "fp32",
                device="cpu", seed=2):
    """(A e4m3 [G, M_max, K], sfa [G, M_max, K-blocks], masked_m int32 [G])."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(groups, m_max, k, generator=g, device=device)
    a, sa = quant_fp8(x, gran_k)
    return a, scale_format(sa, fmt), torch.tensor(masked, dtype=torch.int32, device=device)


def compare(out, ref, defined) -> tuple:
    """(calc_diff over the defined rows, max abs error there)."""
    from sm12x.kernels.common.tolerance import calc_diff

    got, want = out.float()[defined], ref[defined]
    err = float((got - want).abs().max()) if got.numel() else 0.0
    return calc_diff(got, want), err


# DeepGEMM's tests pass FP8 at calc_diff < 0.001 against unquantised data; against the reference on
# the same quantised inputs only the bf16 output rounding and float32 summation order remain.
MAX_DIFF = 1e-4


# ----------------------------------------------------------------------------------------------
# self-test

# DeepSeek-V4-Flash routed experts: hidden 4096, moe_intermediate_size 2048 (gate+up: N = 4096),
# 256 experts, top-6 (config.json); the self-test uses a slice of the experts so that the float32
# reference fits the GPU.
HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 4096, 2048, 256, 6


def _segments(tokens: int, experts: int, seed: int = 3):
    """Rows per expert when ``tokens`` rows are routed at random (some experts empty)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (tokens,), generator=g)
    counts = torch.bincount(ids, minlength=experts)
    counts[0] = 0
    return counts.tolist()


def _row(op, case, out, ref, defined, us, flops=0.0, nbytes=0.0):
    diff, err = compare(out, ref, defined)
    tput = f"{flops / us / 1e6:.0f} TFLOPS" if flops else f"{nbytes / us / 1e3:.0f} GB/s"
    return dict(op=op, case=case, ok=diff < MAX_DIFF, max_abs=err, max_rel=diff,
                detail="" if diff < MAX_DIFF else f"calc_diff {diff:.3g} >= {MAX_DIFF}", us=us, throughput=tput)


def check_contiguous(device, full):
    import torch

    from sm12x.kernels.moe.grouped_contiguous import grouped_contiguous
    from sm12x.kernels.moe.operands import read_operands
    from sm12x.kernels.common.timing import time_us
    from sm12x.kernels.gemm.scales import read_scales
    from sm12x.kernels.moe.reference import ref_grouped_contiguous

    if device == "cuda":
        shapes = [(32, 4096, HIDDEN, INTERMEDIATE * 2, 128, True), (32, 4096, INTERMEDIATE, HIDDEN, 128, True),
                  (32, 4096, HIDDEN, INTERMEDIATE * 2, 128, False), (32, 256, HIDDEN, INTERMEDIATE * 2, 16, True)]
        if full:
            shapes.append((32, 16384, HIDDEN, INTERMEDIATE * 2, 128, True))
    else:
        shapes = [(4, 40, 256, 64, 16, True), (4, 40, 256, 64, 32, False)]
    for groups, tokens, k, n, alignment, fp4 in shapes:
        segs = _segments(tokens, groups)
        a, sa, layout, m = make_contiguous(segs, k, alignment=alignment, fmt="packed", device=device)
        b, sb = make_weights(groups, n, k, fp4=fp4, fmt="packed", device=device, block_scaled_fp8=False)
        d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
        recipe = dict(recipe_a=(1, 128), recipe_b=(1, 32 if fp4 else 128))

        ops = read_operands("m_grouped_fp8_fp4_gemm_nt_contiguous", (a, sa), (b.view(torch.int8) if fp4 else b, sb),
                            a_dims=2, **recipe)
        run = lambda: grouped_contiguous(ops, d, layout, alignment=alignment)  # noqa: E731

        run()
        sfa = read_scales("t", "a", sa, m, k)
        sfb = read_scales("t", "b", sb, n, k, groups=groups)
        ref, defined = ref_grouped_contiguous(a, sfa, b, sfb, layout, fp4=fp4)
        us = time_us(run, device)
        flops = 2.0 * sum(segs) * n * k
        yield _row("m_grouped_fp8_fp4_gemm_nt_contiguous",
                   f"{'fp4' if fp4 else 'fp8'} G={groups} rows={sum(segs)} N={n} K={k} align={alignment}",
                   d, ref, defined, us, flops=flops)
        del ref, defined


def check_masked(device, full):
    import torch

    from sm12x.kernels.common.timing import time_us
    from sm12x.kernels.gemm.scales import read_scales
    from sm12x.kernels.moe.grouped_masked import grouped_masked
    from sm12x.kernels.moe.operands import read_operands
    from sm12x.kernels.moe.reference import ref_grouped_masked

    if device == "cuda":
        shapes = [(32, 64, HIDDEN, INTERMEDIATE * 2, 8, True), (32, 64, INTERMEDIATE, HIDDEN, 24, True),
                  (32, 64, HIDDEN, INTERMEDIATE * 2, 16, False)]
    else:
        shapes = [(4, 24, 256, 64, 8, True), (4, 24, 256, 64, 8, False)]
    for groups, m_max, k, n, expected_m, fp4 in shapes:
        g = torch.Generator().manual_seed(4)
        masked = torch.randint(0, 2 * expected_m + 1, (groups,), generator=g).clamp(max=m_max).tolist()
        masked[0], masked[-1] = 0, m_max
        a, sa, masked_m = make_masked(groups, m_max, k, masked, fmt="packed", device=device)
        b, sb = make_weights(groups, n, k, fp4=fp4, fmt="packed", device=device, block_scaled_fp8=False)
        d = torch.zeros(groups, m_max, n, dtype=torch.bfloat16, device=device)
        ops = read_operands("m_grouped_fp8_fp4_gemm_nt_masked", (a, sa), (b, sb), a_dims=3)
        run = lambda: grouped_masked(ops, d, masked_m, expected_m)  # noqa: E731
        run()
        sfa = read_scales("t", "a", sa, m_max, k, groups=groups)
        sfb = read_scales("t", "b", sb, n, k, groups=groups)
        ref, defined = ref_grouped_masked(a, sfa, b, sfb, masked_m, fp4=fp4)
        us = time_us(run, device)
        active = sum(1 for x in masked if x)
        nbytes = active * (b[0].numel() * b.element_size() + sb[0].numel() * sb.element_size())
        yield _row("m_grouped_fp8_fp4_gemm_nt_masked",
                   f"{'fp4' if fp4 else 'fp8'} G={groups} M_max={m_max} N={n} K={k} expected_m={expected_m}",
                   d, ref, defined, us, nbytes=nbytes)

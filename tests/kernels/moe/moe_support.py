"""Shared by the MoE kernel tests: run an op through the DeepGEMM front end and compare with the
reference on the rows it defines."""
import torch

from sm12x.kernels.gemm.scales import read_scales
from sm12x.kernels.moe.cases import (
    MAX_DIFF,
    compare,
    make_contiguous,
    make_masked,
    make_weights,
)
from sm12x.kernels.moe.reference import ref_grouped_contiguous, ref_grouped_masked

SENTINEL = 7.0  # what D holds before the call: rows the op leaves alone keep it


def run_contiguous(api, segments, n, k, *, fp4, alignment, psum=False, fmt_a="fp32", fmt_b="packed",
                   gran_k_a=128, ensure_zero_padding=True, device="cpu", recipe_kwargs=None, fp8_per_row=False):
    a, sa, layout, m = make_contiguous(segments, k, alignment=alignment, psum=psum, gran_k=gran_k_a, fmt=fmt_a,
                                       device=device)
    b, sb = make_weights(len(segments), n, k, fp4=fp4, fmt=fmt_b, device=device, block_scaled_fp8=not fp8_per_row)
    d = torch.full((m, n), SENTINEL, dtype=torch.bfloat16, device=device)
    api.set_mk_alignment_for_contiguous_layout(alignment)
    try:
        kwargs = dict(use_psum_layout=psum, ensure_zero_padding=ensure_zero_padding, **(recipe_kwargs or {}))
        api.m_grouped_fp8_fp4_gemm_nt_contiguous((a, sa), (b, sb), d, layout, **kwargs)
    finally:
        api.set_mk_alignment_for_contiguous_layout(128)
    sfa = read_scales("t", "a", sa, m, k)
    sfb = read_scales("t", "b", sb, n, k, groups=len(segments))
    ref, defined = ref_grouped_contiguous(a, sfa, b, sfb, layout, fp4=fp4, psum=psum, alignment=alignment,
                                          ensure_zero_padding=ensure_zero_padding)
    return d.cpu(), ref.cpu(), defined.cpu()


def run_masked(api, groups, m_max, n, k, masked, *, fp4, expected_m, fmt_a="fp32", fmt_b="packed", gran_k_a=128,
               device="cpu", fp8_per_row=False):
    a, sa, masked_m = make_masked(groups, m_max, k, masked, gran_k=gran_k_a, fmt=fmt_a, device=device)
    b, sb = make_weights(groups, n, k, fp4=fp4, fmt=fmt_b, device=device, block_scaled_fp8=not fp8_per_row)
    d = torch.full((groups, m_max, n), SENTINEL, dtype=torch.bfloat16, device=device)
    api.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (b, sb), d, masked_m, expected_m)
    sfa = read_scales("t", "a", sa, m_max, k, groups=groups)
    sfb = read_scales("t", "b", sb, n, k, groups=groups)
    ref, defined = ref_grouped_masked(a, sfa, b, sfb, masked_m, fp4=fp4)
    return d.cpu(), ref.cpu(), defined.cpu()


def check(out, ref, defined):
    diff, err = compare(out, ref, defined)
    assert diff < MAX_DIFF, f"calc_diff {diff:.3g}, max abs error {err:.3g}"
    # bf16 output rounding (and the interpreter's bf16-emulated dot_scaled): one bf16 ulp of the
    # largest value
    scale = float(ref[defined].abs().max()) if bool(defined.any()) else 0.0
    assert err <= scale * 2 ** -7 + 1e-6, f"max abs error {err:.3g} for values up to {scale:.3g}"
    untouched = out[~defined]
    assert bool((untouched == SENTINEL).all()), "rows the op must leave alone were written"

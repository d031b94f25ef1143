"""DeepGEMM-compatible grouped MoE GEMMs backed by the sm12x Triton kernels.

Same names, parameter names, order and defaults as ``deep_gemm`` (deepseek-ai/DeepGEMM v2.6.1
``csrc/apis/gemm.hpp`` / ``layout.hpp``): ``m_grouped_fp8_fp4_gemm_nt_contiguous`` and
``m_grouped_fp8_fp4_gemm_nt_masked`` with their FP8 aliases, and the contiguous layout's M
alignment helpers. Semantics: :mod:`sm12x.kernels.moe.reference`.

Differences from DeepGEMM (supersets only):
- float32 scales at 128 granularity are applied as float32 values (DeepGEMM's SM100/SM120 kernels
  cast them to UE8M0, keeping the exponent; for the power-of-two scales they require the results
  are the same), so ``disable_ue8m0_cast`` changes nothing; 32-granular float32 scales are read as
  UE8M0, as DeepGEMM casts them;
- padding rows of the default contiguous layout (id -1) are written 0 (DeepGEMM computes them from
  A's padding rows, which its callers zero);
- ``compiled_dims`` is accepted and ignored (Triton specialises on its own);
- masked_m[g] is clamped to M_max.
"""
from __future__ import annotations

import contextlib

import torch

from sm12x.kernels import manifest
from sm12x.kernels.common.checks import require, require_dtype
from sm12x.kernels.moe import operands as _operands
from sm12x.kernels.moe.grouped_contiguous import grouped_contiguous as _contiguous
from sm12x.kernels.moe.grouped_masked import grouped_masked as _masked

# what this module implements, as the manifest declares it
NAMES = manifest.names_in(__name__)
HELPER_NAMES = manifest.names_in(__name__, helper=True)


def get_mk_alignment_for_contiguous_layout() -> int:
    """Rows each expert's segment of the contiguous layout is padded to (128 unless set)."""
    return _operands.get_mk_alignment()


def set_mk_alignment_for_contiguous_layout(new_value: int) -> None:
    _operands.set_mk_alignment(new_value)


@contextlib.contextmanager
def mk_alignment(value: int):
    """Run with the M alignment ``value`` (a caller that set it on its own DeepGEMM module)."""
    previous = _operands.get_mk_alignment()
    _operands.set_mk_alignment(int(value), "m_grouped_fp8_fp4_gemm_nt_contiguous")
    try:
        yield
    finally:
        _operands.set_mk_alignment(previous)


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m=None, num_groups=None) -> int:
    """The smallest alignment the kernels run well with for ``expected_m`` rows per expert (with
    ``num_groups``, as DeepGEMM 2.8: ``expected_m`` rows over that many experts): 16 / 32 / 64 for
    small segments (one tile of that height), else 128."""
    op = "get_theoretical_mk_alignment_for_contiguous_layout"
    if expected_m is None:
        return _operands.DEFAULT_MK_ALIGNMENT
    require(isinstance(expected_m, int) and expected_m >= 0, op, "expected_m", repr(expected_m), "an int >= 0 or None")
    if num_groups is not None:
        require(isinstance(num_groups, int) and num_groups > 0, op, "num_groups", repr(num_groups), "an int > 0")
        expected_m = -(-expected_m // num_groups)
    for value in (16, 32, 64):
        if expected_m <= value:
            return value
    return _operands.DEFAULT_MK_ALIGNMENT


def _common(op, compiled_dims, disable_ue8m0_cast):
    require(isinstance(compiled_dims, str), op, "compiled_dims", repr(compiled_dims), "a string such as 'nk'")
    require(isinstance(disable_ue8m0_cast, bool), op, "disable_ue8m0_cast", repr(disable_ue8m0_cast), "a bool")


def _contiguous_call(op, a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                     disable_ue8m0_cast, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout):
    _common(op, compiled_dims, disable_ue8m0_cast)
    ops = _operands.read_operands(op, a, b, a_dims=2, recipe=recipe, recipe_a=recipe_a, recipe_b=recipe_b)
    m = ops.a.shape[0]
    _operands.require_output(op, d, (m, ops.n))
    require(isinstance(grouped_layout, torch.Tensor), op, "grouped_layout", lambda: type(grouped_layout).__name__,
            "an int32 tensor")
    require_dtype(grouped_layout, (torch.int32,), op, "grouped_layout")
    require(grouped_layout.is_contiguous(), op, "grouped_layout", "a non-contiguous tensor", "contiguous")
    if use_psum_layout:
        require(tuple(grouped_layout.shape) == (ops.groups,), op, "grouped_layout",
                lambda: f"shape {list(grouped_layout.shape)}",
                f"[{ops.groups}] cumulative expert ends (use_psum_layout=True)")
    else:
        require(tuple(grouped_layout.shape) == (m,), op, "grouped_layout", lambda: f"shape {list(grouped_layout.shape)}",
                f"[{m}] expert id per row (-1 for padding)")
        require(expected_m_for_psum_layout is None, op, "expected_m_for_psum_layout",
                repr(expected_m_for_psum_layout), "None unless use_psum_layout=True")
    _operands.require_same_device(op, ops, d=d, grouped_layout=grouped_layout)
    return _contiguous(ops, d, grouped_layout, psum=bool(use_psum_layout), alignment=_operands.get_mk_alignment(),
                       ensure_zero_padding=bool(ensure_zero_padding))


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                         compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
                                         ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """D [M, N] bf16 = A [M, K] e4m3 (a = (A, sfa)) times the weights of each row's expert,
    B [G, N, K] e4m3 or [G, N, K/2] packed e2m1 (b = (B, sfb)); ``grouped_layout`` int32 [M] expert
    per row (-1 padding) or, with ``use_psum_layout``, [G] cumulative expert ends."""
    return _contiguous_call("m_grouped_fp8_fp4_gemm_nt_contiguous", a, b, d, grouped_layout, recipe, recipe_a,
                            recipe_b, compiled_dims, disable_ue8m0_cast, use_psum_layout, ensure_zero_padding,
                            expected_m_for_psum_layout)


def m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
                                     ensure_zero_padding=True, expected_m_for_psum_layout=None):
    """DeepGEMM's FP8 name of :func:`m_grouped_fp8_fp4_gemm_nt_contiguous` (the same function there)."""
    return _contiguous_call("m_grouped_fp8_gemm_nt_contiguous", a, b, d, grouped_layout, recipe, recipe_a,
                            recipe_b, compiled_dims, disable_ue8m0_cast, use_psum_layout, ensure_zero_padding,
                            expected_m_for_psum_layout)


def _masked_call(op, a, b, d, masked_m, expected_m, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast):
    _common(op, compiled_dims, disable_ue8m0_cast)
    ops = _operands.read_operands(op, a, b, a_dims=3, recipe=recipe, recipe_a=recipe_a, recipe_b=recipe_b)
    g, m_max = ops.a.shape[0], ops.a.shape[1]
    _operands.require_output(op, d, (g, m_max, ops.n))
    require(isinstance(masked_m, torch.Tensor), op, "masked_m", lambda: type(masked_m).__name__, "an int32 tensor")
    require_dtype(masked_m, (torch.int32,), op, "masked_m")
    require(tuple(masked_m.shape) == (g,) and masked_m.is_contiguous(), op, "masked_m",
            lambda: f"shape {list(masked_m.shape)}", f"contiguous [{g}]")
    require(isinstance(expected_m, int) and not isinstance(expected_m, bool) and expected_m > 0, op, "expected_m",
            repr(expected_m), "an int > 0")
    _operands.require_same_device(op, ops, d=d, masked_m=masked_m)
    return _masked(ops, d, masked_m, expected_m)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                     compiled_dims="nk", disable_ue8m0_cast=False):
    """D [G, M_max, N] bf16: for each group g, its first masked_m[g] rows of A [G, M_max, K] e4m3 times
    B[g] (e4m3 [G, N, K] or packed e2m1 [G, N, K/2]); the other rows of D are left alone."""
    return _masked_call("m_grouped_fp8_fp4_gemm_nt_masked", a, b, d, masked_m, expected_m, recipe, recipe_a,
                        recipe_b, compiled_dims, disable_ue8m0_cast)


def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                 compiled_dims="nk", disable_ue8m0_cast=False):
    """DeepGEMM's FP8 name of :func:`m_grouped_fp8_fp4_gemm_nt_masked`."""
    return _masked_call("m_grouped_fp8_gemm_nt_masked", a, b, d, masked_m, expected_m, recipe, recipe_a,
                        recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_m_grouped_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None,
                                 compiled_dims="nk", disable_ue8m0_cast=False):
    """The older DeepGEMM name vLLM's wrappers look up (``fp8_m_grouped_gemm_nt_masked``)."""
    return _masked_call("fp8_m_grouped_gemm_nt_masked", a, b, d, masked_m, expected_m, recipe, recipe_a,
                        recipe_b, compiled_dims, disable_ue8m0_cast)

"""Validation of the grouped GEMMs' operands (shared by both layouts) and the M alignment of the
contiguous layout.

Every bad input raises ValueError naming the op and the argument, with what came and what is
supported. Nothing here reads tensor values (CUDA-graph safe).
"""
from __future__ import annotations

import dataclasses

import torch

from sm12x.kernels.common.checks import bad, require, require_dtype
from sm12x.kernels.gemm.scales import OperandScales, read_scales

# DeepGEMM's default M alignment of the contiguous layout; ``set_mk_alignment`` changes it (vLLM
# narrows it per call for small batches through ``mk_alignment_scope``).
DEFAULT_MK_ALIGNMENT = 128
_MK_ALIGNMENT = [DEFAULT_MK_ALIGNMENT]
MAX_MK_ALIGNMENT = 1024

FP4_DTYPES = tuple(t for t in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if t is not None)


def get_mk_alignment() -> int:
    return _MK_ALIGNMENT[0]


def set_mk_alignment(value: int, op: str = "set_mk_alignment_for_contiguous_layout") -> None:
    require(isinstance(value, int) and not isinstance(value, bool) and 16 <= value <= MAX_MK_ALIGNMENT
            and value % 16 == 0, op, "new_value", repr(value), "a multiple of 16 from 16 to 1024")
    _MK_ALIGNMENT[0] = value


@dataclasses.dataclass(frozen=True)
class Operands:
    """Validated operands: A values (e4m3, K contiguous), B values (e4m3 [G, N, K] or packed e2m1
    [G, N, K/2] viewed as int8), their scales, and the sizes."""

    a: torch.Tensor
    sfa: OperandScales
    b: torch.Tensor
    sfb: OperandScales
    b_fp4: bool
    groups: int
    n: int
    k: int


def _pair(op, arg, x):
    require(isinstance(x, (tuple, list)) and len(x) == 2, op, arg, lambda: type(x).__name__,
            "a (values, scales) pair")
    return x[0], x[1]


def resolve_recipe(op, recipe, recipe_a, recipe_b):
    """(gran_mn_a, gran_k_a), (gran_mn_b, gran_k_b), each entry None when left to the scale shapes.
    ``recipe`` = (gran_m_a, gran_n_b, gran_k) or the pair ``recipe_a`` = (gran_m, gran_k),
    ``recipe_b`` = (gran_n, gran_k), as DeepGEMM."""
    if recipe is not None:
        require(recipe_a is None and recipe_b is None, op, "recipe", repr(recipe),
                "either recipe or the recipe_a / recipe_b pair, not both")
        require(isinstance(recipe, (tuple, list)) and len(recipe) == 3, op, "recipe", repr(recipe),
                "(gran_m_a, gran_n_b, gran_k)")
        return (recipe[0], recipe[2]), (recipe[1], recipe[2])
    if recipe_a is None and recipe_b is None:
        return (None, None), (None, None)
    for name, r in (("recipe_a", recipe_a), ("recipe_b", recipe_b)):
        require(isinstance(r, (tuple, list)) and len(r) == 2, op, name, repr(r),
                "(gran_mn, gran_k), given together with the other of recipe_a / recipe_b")
    return tuple(recipe_a), tuple(recipe_b)


def read_operands(op: str, a, b, *, a_dims: int, recipe=None, recipe_a=None, recipe_b=None) -> Operands:
    """Validate ``a`` = (A [M, K] or [G, M, K] e4m3, sfa) and ``b`` = (B, sfb) for a grouped GEMM."""
    av, sa = _pair(op, "a", a)
    bv, sb = _pair(op, "b", b)
    require(isinstance(av, torch.Tensor), op, "a", lambda: type(av).__name__, "a tensor")
    require(isinstance(bv, torch.Tensor), op, "b", lambda: type(bv).__name__, "a tensor")
    require_dtype(av, (torch.float8_e4m3fn,), op, "a")
    require(av.dim() == a_dims, op, "a", lambda: f"shape {list(av.shape)}",
            "[M, K]" if a_dims == 2 else "[G, M_max, K]")
    require(av.stride(-1) == 1, op, "a", lambda: f"strides {av.stride()}", "K-major (unit stride along K)")
    require(bv.dim() == 3, op, "b", lambda: f"shape {list(bv.shape)}", "[G, N, K] e4m3 or [G, N, K/2] packed e2m1")
    b_fp4 = bv.dtype != torch.float8_e4m3fn
    if b_fp4:
        require(bv.dtype in FP4_DTYPES, op, "b", f"dtype {bv.dtype}",
                "float8_e4m3fn, or packed e2m1 as int8 / uint8 / float4_e2m1fn_x2")
        bv = bv.view(torch.int8)
    require(bv.stride(-1) == 1, op, "b", lambda: f"strides {bv.stride()}", "K-major (unit stride along K)")
    k = av.shape[-1]
    groups, n = bv.shape[0], bv.shape[1]
    kb = bv.shape[2] * 2 if b_fp4 else bv.shape[2]
    require(kb == k, op, "b", lambda: f"shape {list(bv.shape)} (K = {kb})",
            lambda: f"K = {k} as in a ({'K/2 bytes of packed e2m1' if b_fp4 else 'e4m3'})")
    require(k > 0 and k % 128 == 0, op, "a", f"K = {k}", "K a positive multiple of 128")
    require(n > 0 and groups > 0, op, "b", lambda: f"shape {list(bv.shape)}", "G > 0 groups of N > 0 rows")
    if a_dims == 3:
        require(av.shape[0] == groups, op, "a", lambda: f"shape {list(av.shape)}", f"G = {groups} groups as in b")
    (gma, gka), (gnb, gkb) = resolve_recipe(op, recipe, recipe_a, recipe_b)
    require(gma in (None, 1), op, "recipe", f"gran_m {gma} for a", "1 (per-row activation scales)")
    m_rows = av.shape[-2]
    sfa = read_scales(op, "a", sa, m_rows, k, groups=groups if a_dims == 3 else None, gran_mn=1, gran_k=gka)
    if a_dims == 3:
        require(sfa.stride_g != 0, op, "a", "scales shared by all groups", "scales [G, M_max, K-blocks]")
    sfb = read_scales(op, "b", sb, n, k, groups=groups, gran_mn=gnb, gran_k=gkb)
    if b_fp4:
        require(sfb.gran_k == 32 and sfb.gran_mn == 1, op, "b",
                lambda: f"scales at granularity ({sfb.gran_mn}, {sfb.gran_k})",
                "(1, 32) UE8M0 scales for packed e2m1 weights (recipe_b=(1, 32))")
    return Operands(av, sfa, bv, sfb, b_fp4, groups, n, k)


def require_output(op: str, d, shape) -> None:
    require(isinstance(d, torch.Tensor), op, "d", lambda: type(d).__name__, "a tensor")
    require_dtype(d, (torch.bfloat16,), op, "d")
    require(tuple(d.shape) == tuple(shape), op, "d", lambda: f"shape {list(d.shape)}",
            lambda: f"shape {list(shape)}")
    require(d.stride(-1) == 1, op, "d", lambda: f"strides {d.stride()}", "N contiguous (row-major)")


def require_same_device(op: str, ops: Operands, **tensors) -> None:
    dev = ops.a.device
    for name, t in (("b", ops.b), ("a scales", ops.sfa.data), ("b scales", ops.sfb.data), *tensors.items()):
        if t is not None and t.device != dev:
            raise bad(op, name, f"device {t.device}", f"the device of a ({dev})")

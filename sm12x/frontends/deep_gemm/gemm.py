"""DeepGEMM-compatible dense GEMM API backed by the sm12x Triton kernels.

Same names, parameter names, defaults and semantics as ``deep_gemm`` (checked against
deepseek-ai/DeepGEMM nv_dev ``csrc/apis/gemm.hpp``, ``einsum.hpp``, ``hyperconnection.hpp``,
``layout.hpp`` and ``deep_gemm/utils``), so that a patch can install these functions on a
``deep_gemm`` module (``NAMES``; ``HELPER_NAMES`` are the small helpers callers touch on these
paths) and the ``deep_gemm`` stand-in (``sm12x.shims``) carries them.

- ``fp8_gemm_{nt,nn,tn,tt}`` and the ``fp8_fp4_gemm_*`` aliases: ``D = C + A @ B^T`` with fp32
  promotion per 128-wide K block. a = (A, sfa), b = (B, sfb); nt: A [M, K], B [N, K]; nn: B as
  [K, N] (its scales transposed likewise); tn: A as [K, M] and B as [K, N]; tt: A as [K, M].
  D bf16 or float32 [M, N], written in place; C optional (may be D itself).
- ``fp8_einsum(expr, (a, sfa), (b, sfb), d, c=None, recipe=(1, 128, 128))``: "bhr,hdr->bhd" and
  "bhd,hdr->bhr". ``einsum(expr, a, b, d, c=None, use_cublaslt=False)``: the bf16 forms
  ("bmk,bnk->mn" accumulating into float32 d = c, or into bf16 d without c; "bhr,hdr->bhd";
  "bhd,hdr->bhr"), computed with torch.
- ``tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None)``.
- ``transform_sf_into_required_layout``: DeepGEMM's SM120 layouts (packed UE8M0 int32, MN-major,
  TMA-aligned; float32 kept with ``disable_ue8m0_cast``).

Scales: every DeepGEMM format is read as given (float32 in either major-ness, per-block or per-row
weights, packed UE8M0 int32, uint8 / float8_e8m0fnu exponents); no transposing copy is made.
Differences from DeepGEMM (supersets only): float32 scales are always applied exactly (DeepGEMM on
SM100/SM120 truncates them to powers of two unless ``disable_ue8m0_cast``; the callers' UE8M0
scales are powers of two already, so their results are the same); C may be float32 or bf16 with
either D; any N and K % 16 == 0 (DeepGEMM's SM120 kernels want N % 64 and K % 128 in places).
``compiled_dims`` only names what DeepGEMM's JIT specialises on and is ignored. FP4 operands
(int8 packed e2m1) belong to the MoE path and are rejected by name.
"""
from __future__ import annotations

import torch

from sm12x.frontends.deep_gemm.indexer import get_num_sms, set_num_sms  # noqa: F401 (re-exported helpers)
from sm12x.kernels import manifest
from sm12x.kernels.common.checks import bad, require, unsupported
from sm12x.kernels.gemm import scales as _scales
from sm12x.kernels.gemm.fp8_einsum import fp8_einsum as _fp8_einsum
from sm12x.kernels.gemm.fp8_gemm import fp8_gemm as _fp8_gemm
from sm12x.kernels.gemm.hc_prenorm_gemm import hc_prenorm_gemm as _hc_prenorm_gemm

# what this module implements, as the manifest declares it
NAMES = manifest.names_in(__name__)
HELPER_NAMES = manifest.names_in(__name__, helper=True)

ceil_div = _scales.ceil_div
align = _scales.align
ceil_to_ue8m0 = _scales.ceil_to_ue8m0


def _reject_unknown(op: str, kwargs: dict) -> None:
    """Arguments a later DeepGEMM added that we do not know: accepted when off (None / False),
    NotImplementedError naming them otherwise (they could change the result)."""
    for name, value in kwargs.items():
        if value is not None and value is not False:
            raise unsupported(op, name, repr(value)[:60], "None or False (unknown argument; sm12x does not implement it)")


# ----------------------------------------------------------------------------------------------
# helpers (deep_gemm.utils / layout)


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` rounded up so that ``x * element_size`` is a multiple of 16 bytes."""
    return align(x, 16 // element_size)


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """[*G, MN, KB] as MN-major with the column stride aligned to 16 bytes."""
    return _scales.mn_major_tma_aligned(sf)


get_col_major_tma_aligned_tensor = get_mn_major_tma_aligned_tensor  # DeepGEMM's older name


def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor) -> torch.Tensor:
    """float32 power-of-two scales [*G, MN, KB] -> packed UE8M0 int32 [*G, MN, ceil(KB/4)]."""
    return _scales.pack_ue8m0(sf)


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """float32 powers of two [..., 4n] -> int32 [..., n] of their exponent bytes, little endian
    along the last dim (``deep_gemm.utils.math.pack_ue8m0_to_int``)."""
    require(x.dtype == torch.float32 and x.shape[-1] % 4 == 0, "pack_ue8m0_to_int", "x",
            lambda: f"{x.dtype} {list(x.shape)}", "float32 with a last dim divisible by 4")
    return (x.contiguous().view(torch.int32) >> 23).to(torch.uint8).view(torch.int32)


def _recipe_grans(op, recipe, is_sfa):
    if len(recipe) == 3:
        require(is_sfa is not None, op, "is_sfa", None, "True or False with a 3-element recipe")
        return (recipe[0] if is_sfa else recipe[1]), recipe[2]
    require(len(recipe) == 2 and is_sfa is None, op, "recipe", recipe,
            "(gran_a_mn, gran_b_mn, gran_k) with is_sfa, or (gran_mn, gran_k)")
    return recipe


def transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None, is_sfa=None,
                                      disable_ue8m0_cast=False):
    """Scales in the layout DeepGEMM's SM120 kernels take: float32 per-row / per-block scales
    with ``disable_ue8m0_cast`` -> MN-major TMA-aligned float32 (per-block kept as is); float32
    otherwise -> per-row packed UE8M0 int32 (exponent bytes as stored, as DeepGEMM does); packed
    int32 per-row -> as is. Our kernels read every one of these."""
    op = "transform_sf_into_required_layout"
    require(isinstance(sf, torch.Tensor), op, "sf", type(sf).__name__, "a tensor")
    gran_mn, gran_k = _recipe_grans(op, tuple(recipe), is_sfa)
    _scales.read_scales(op, "sf", sf, mn, k, groups=num_groups, gran_mn=gran_mn, gran_k=gran_k)
    if sf.dtype == torch.float32 and gran_k == 128 and disable_ue8m0_cast:
        return get_mn_major_tma_aligned_tensor(sf) if gran_mn == 1 else sf
    if sf.dtype == torch.float32 and gran_k in (32, 128):
        require(not disable_ue8m0_cast, op, "disable_ue8m0_cast", True,
                f"False for gran_k {gran_k} float32 scales (only 1x128 and 128x128 stay float32)")
        return _scales.pack_ue8m0(_scales.rows_from_blocks(sf, mn, gran_mn))
    if sf.dtype == torch.int32 and gran_mn == 1:
        return sf
    raise bad(op, "sf", f"{sf.dtype} scales with recipe {tuple(recipe)}",
              "float32 (1 or 128, 128 / 32) or packed int32 (1, 32 / 128)")


# ----------------------------------------------------------------------------------------------
# FP8 GEMM


def _pair(op, arg, x):
    require(isinstance(x, (tuple, list)) and len(x) == 2, op, arg, type(x).__name__,
            "a (values, scales) pair")
    values, sf = x
    if isinstance(values, torch.Tensor) and values.dtype in (torch.int8, torch.uint8):
        raise bad(op, arg, f"packed FP4 values ({values.dtype})",
                  "float8_e4m3fn values (FP4 operands go through the grouped MoE GEMMs)")
    return values, sf


def _grans(op, recipe, recipe_a, recipe_b):
    """((gran_mn_a, gran_k_a), (gran_mn_b, gran_k_b)) from DeepGEMM's recipe arguments (Nones:
    read from the scale shapes)."""
    if recipe is not None:
        require(recipe_a is None and recipe_b is None, op, "recipe", recipe,
                "either recipe or the recipe_a + recipe_b pair")
        require(len(tuple(recipe)) == 3, op, "recipe", recipe, "(gran_m_a, gran_n_b, gran_k)")
        ga, gb, gk = recipe
        return (ga, gk), (gb, gk)
    require((recipe_a is None) == (recipe_b is None), op, "recipe_a", recipe_a, "given together with recipe_b")
    if recipe_a is None:
        return (None, None), (None, None)
    return tuple(recipe_a), tuple(recipe_b)


def _mn_from_shape(gran):
    """(gran_mn, gran_k) for the kernel: the recipe's gran_k, and None for gran_mn, which the
    kernel then reads from the scale tensor's shape (rows == MN: per row; ceil(MN/128): per
    128-row block). The recipe's MN granularity is not trusted: DeepGEMM's own callers pass one
    that is not the stored one (packed UE8M0 scales are per row whatever the recipe, as DeepGEMM
    broadcasts 128-row blocks before packing; vLLM 0.22.1 passes its weight's 128x128 float32
    scales with recipe (1, 1, 128))."""
    return None, gran[1]


def _gemm(op, a, b, d, c, recipe, recipe_a, recipe_b, transpose_a, transpose_b):
    av, sfa = _pair(op, "a", a)
    bv, sfb = _pair(op, "b", b)
    if transpose_a:
        require(isinstance(av, torch.Tensor) and av.dim() == 2, op, "a", type(av).__name__, "a 2-dim [K, M] tensor")
        av, sfa = av.T, (sfa.T if isinstance(sfa, torch.Tensor) and sfa.dim() == 2 else sfa)
    if transpose_b:
        require(isinstance(bv, torch.Tensor) and bv.dim() == 2, op, "b", type(bv).__name__, "a 2-dim [K, N] tensor")
        bv, sfb = bv.T, (sfb.T if isinstance(sfb, torch.Tensor) and sfb.dim() == 2 else sfb)
    gran_a, gran_b = _grans(op, recipe, recipe_a, recipe_b)
    _fp8_gemm(av, sfa, bv, sfb, d, c, gran_a=_mn_from_shape(gran_a), gran_b=_mn_from_shape(gran_b), op=op)
    return None


# The four layouts. ``compiled_dims`` (DeepGEMM's JIT specialisation; defaults as DeepGEMM's) and
# ``disable_ue8m0_cast`` (float32 scales are always applied exactly) change nothing here.


def fp8_gemm_nt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                disable_ue8m0_cast=False, **kwargs):
    """D = C + A @ B^T: a = (A [M, K] e4m3, sfa), b = (B [N, K] e4m3, sfb); d [M, N] in place."""
    _reject_unknown("fp8_gemm_nt", kwargs)
    return _gemm("fp8_gemm_nt", a, b, d, c, recipe, recipe_a, recipe_b, False, False)


def fp8_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",
                disable_ue8m0_cast=False, **kwargs):
    """D = C + A @ B: a = (A [M, K], sfa), b = (B [K, N], sfb given transposed like B)."""
    _reject_unknown("fp8_gemm_nn", kwargs)
    return _gemm("fp8_gemm_nn", a, b, d, c, recipe, recipe_a, recipe_b, False, True)


def fp8_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn",
                disable_ue8m0_cast=False, **kwargs):
    """D = C + A^T @ B: a = (A [K, M], sfa transposed like A), b = (B [K, N], sfb likewise)."""
    _reject_unknown("fp8_gemm_tn", kwargs)
    return _gemm("fp8_gemm_tn", a, b, d, c, recipe, recipe_a, recipe_b, True, True)


def fp8_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn",
                disable_ue8m0_cast=False, **kwargs):
    """D = C + A^T @ B^T: a = (A [K, M], sfa transposed like A), b = (B [N, K], sfb)."""
    _reject_unknown("fp8_gemm_tt", kwargs)
    return _gemm("fp8_gemm_tt", a, b, d, c, recipe, recipe_a, recipe_b, True, False)


# DeepGEMM 2.x names the same functions fp8_fp4_gemm_* (the FP4 operand forms are the MoE path's)
fp8_fp4_gemm_nt = fp8_gemm_nt
fp8_fp4_gemm_nn = fp8_gemm_nn
fp8_fp4_gemm_tn = fp8_gemm_tn
fp8_fp4_gemm_tt = fp8_gemm_tt


# ----------------------------------------------------------------------------------------------
# einsum


def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128), **kwargs):
    """"bhr,hdr->bhd" / "bhd,hdr->bhr" with a = (values, per-token scales), b = (weight, scales)."""
    op = "fp8_einsum"
    _reject_unknown(op, kwargs)
    av, sfa = _pair(op, "a", a)
    bv, sfb = _pair(op, "b", b)
    (ga_mn, ga_k), (gb_mn, gb_k) = _grans(op, recipe, None, None)
    _fp8_einsum(expr, av, sfa, bv, sfb, d, c, gran_a=_mn_from_shape((ga_mn, ga_k)),
                gran_b=_mn_from_shape((gb_mn, gb_k)), op=op)
    return None


BF16_EXPRS = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr")


def einsum(expr, a, b, d, c=None, use_cublaslt=False, **kwargs):
    """DeepGEMM's bf16 einsum forms, computed with torch (cuBLAS): "bmk,bnk->mn" sums over b
    into float32 d (then c must be d: d += a . b) or into bf16 d (no c); "bhr,hdr->bhd" and
    "bhd,hdr->bhr" write bf16 d (no c)."""
    op = "einsum"
    _reject_unknown(op, kwargs)
    require(expr in BF16_EXPRS, op, "expr", repr(expr), " or ".join(map(repr, BF16_EXPRS)))
    for name, t in (("a", a), ("b", b)):
        require(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.dim() == 3, op, name,
                lambda t=t: f"{getattr(t, 'dtype', type(t).__name__)} {list(getattr(t, 'shape', []))}",
                "a 3-dim torch.bfloat16 tensor")
    require(isinstance(d, torch.Tensor) and d.dtype in (torch.bfloat16, torch.float32), op, "d",
            getattr(d, "dtype", type(d).__name__), "a torch.bfloat16 or torch.float32 tensor")
    if expr == "bmk,bnk->mn":
        require(a.shape[0] == b.shape[0] and a.shape[2] == b.shape[2], op, "b", lambda: f"shape {list(b.shape)}",
                f"[{a.shape[0]}, N, {a.shape[2]}]")
        require(tuple(d.shape) == (a.shape[1], b.shape[1]), op, "d", lambda: f"shape {list(d.shape)}",
                f"[{a.shape[1]}, {b.shape[1]}]")
        if d.dtype == torch.float32:
            require(c is d or (isinstance(c, torch.Tensor) and c.data_ptr() == d.data_ptr()
                               and c.shape == d.shape and c.stride() == d.stride()),
                    op, "c", "not d", "d itself (float32 d accumulates: d += sum_b a[b] . b[b]^T)")
            # one GEMM over (b, k) jointly, fp32 output
            m, n = a.shape[1], b.shape[1]
            a2 = a.permute(1, 0, 2).reshape(m, -1)
            b2 = b.permute(1, 0, 2).reshape(n, -1)
            d.add_(a2.float() @ b2.float().T)
        else:
            require(c is None, op, "c", "a tensor", "None with bf16 d")
            d.copy_(torch.einsum("bmk,bnk->mn", a.float(), b.float()))
        return None
    require(c is None, op, "c", "a tensor", f"None for {expr!r}")
    require(d.dtype == torch.bfloat16, op, "d", f"dtype {d.dtype}", f"torch.bfloat16 for {expr!r}")
    lhs, out = expr.split("->")
    want = tuple({"b": a.shape[0], "h": a.shape[1], "d": b.shape[1], "r": b.shape[2]}[ch] for ch in out)
    require(tuple(d.shape) == want, op, "d", lambda: f"shape {list(d.shape)}", f"shape {list(want)}")
    d.copy_(torch.einsum(expr, a, b))
    return None


# ----------------------------------------------------------------------------------------------
# mHC pre-norm GEMM


def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None, **kwargs):
    """d = a . b^T (TF32) and sqr_sum = sum_k a^2; with num_splits, split-K partials [S, M, N] /
    [S, M] for the caller to sum."""
    _reject_unknown("tf32_hc_prenorm_gemm", kwargs)
    _hc_prenorm_gemm(a, b, d, sqr_sum, num_splits)
    return None

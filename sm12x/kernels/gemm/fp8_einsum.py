"""DeepGEMM ``fp8_einsum``: DeepSeek-V4's grouped output projection ``"bhr,hdr->bhd"`` (``wo_a``: 8
groups x 4096 in -> 1024 out each) and its transpose-side form ``"bhd,hdr->bhr"``, as H independent
block-scaled FP8 GEMMs in one launch of :func:`fp8_gemm.launch` (a group per head).

``fp8_bmm`` is the batched form both reduce to: a [G, M, K], b [G, N, K] float8_e4m3fn (any
strides), their scales in any DeepGEMM format with the group first ([G, rows, K-blocks]; sfb may
be 2-D, shared by all groups), d bf16 / float32 [G, M, N], c None or like d (may alias d):

    d[g, m, n] = c[g, m, n] + sum_kb (sum_{k in kb} a[g, m, k] b[g, n, k]) * sa(g, m, kb) * sb(g, n, kb)

Expressions (per-token scales on the activation, per-block or per-row on the weight):
- "bhr,hdr->bhd": a [B, H, R], sfa [B, H, R-blocks]; b [H, D, R], sfb [H, D-rows, R-blocks];
  d [B, H, D]. G = H, M = B, N = D, K = R.
- "bhd,hdr->bhr": a [B, H, D], sfa [B, H, D-blocks]; b [H, D, R], sfb [H, D-blocks, R-rows] (the
  weight's scales indexed as stored); d [B, H, R]. G = H, M = B, N = R, K = D (b is copied K-major
  first, as DeepGEMM does on SM120).
"""
from __future__ import annotations

import torch

from sm12x.kernels.common.checks import require
from sm12x.kernels.gemm.fp8_gemm import C_DTYPES, OUT_DTYPES, launch
from sm12x.kernels.gemm.scales import read_scales

OP = "fp8_einsum"
EXPRS = ("bhr,hdr->bhd", "bhd,hdr->bhr")


def _require_fp8(op, name, x, dims):
    require(isinstance(x, torch.Tensor), op, name, type(x).__name__, "a float8_e4m3fn tensor")
    require(x.dtype == torch.float8_e4m3fn, op, name, f"dtype {x.dtype}", "torch.float8_e4m3fn")
    require(x.dim() == 3, op, name, lambda: f"shape {list(x.shape)}", f"3 dims {dims}")


def _require_out(op, name, t, shape, dtypes, device):
    require(isinstance(t, torch.Tensor) and t.dtype in dtypes, op, name, getattr(t, "dtype", type(t).__name__),
            " or ".join(map(str, dtypes)))
    require(tuple(t.shape) == tuple(shape), op, name, lambda: f"shape {list(t.shape)}", f"shape {list(shape)}")
    require(t.device == device, op, name, f"device {t.device}", f"the device of a ({device})")


def fp8_bmm(a, sfa, b, sfb, d, c=None, *, gran_a=(None, None), gran_b=(None, None), op: str = OP,
            names=("a", "sfa", "b", "sfb")):
    """d = c + a @ b^T per group (see the module docstring); ``names`` are the caller's argument
    names for messages. Returns d."""
    _require_fp8(op, names[0], a, "[G, M, K]")
    _require_fp8(op, names[2], b, "[G, N, K]")
    g, m, k = a.shape
    n = b.shape[1]
    require(b.shape[0] == g and b.shape[2] == k, op, names[2], lambda: f"shape {list(b.shape)}",
            f"[{g}, N, {k}] (groups and K of {names[0]})")
    require(k % 16 == 0 and k > 0, op, names[0], f"K = {k}", "K a positive multiple of 16")
    require(b.device == a.device, op, names[2], f"device {b.device}", f"the device of {names[0]} ({a.device})")
    _require_out(op, "d", d, (g, m, n), OUT_DTYPES, a.device)
    if c is not None:
        _require_out(op, "c", c, (g, m, n), C_DTYPES, a.device)
    sa = read_scales(op, names[1], sfa, m, k, groups=g, gran_mn=gran_a[0], gran_k=gran_a[1],
                     prefer_k=128)
    sb = read_scales(op, names[3], sfb, n, k, groups=g, gran_mn=gran_b[0], gran_k=gran_b[1],
                     prefer_k=128)
    require(sa.gran_mn == 1, op, names[1], f"granularity {sa.gran_mn} along M", "1 (per-token scales)")
    for name, s in ((names[1], sa), (names[3], sb)):
        require(s.data.device == a.device, op, name, f"device {s.data.device}", f"the device of {names[0]} ({a.device})")
    if g == 0 or m == 0 or n == 0:
        return d
    strides = (a.stride(0), b.stride(0), d.stride(0), 0 if c is None else c.stride(0))
    launch(a[0], sa, b[0], sb, d[0], None if c is None else c[0], groups=g, group_strides=strides)
    return d


def fp8_einsum(expr: str, a, sfa, b, sfb, d, c=None, *, gran_a=(None, None), gran_b=(None, None),
               op: str = OP):
    """One of ``EXPRS`` (see the module docstring), block-scaled. Returns d."""
    require(expr in EXPRS, op, "expr", repr(expr), " or ".join(map(repr, EXPRS)))
    for name, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("d", d)) + ((("c", c),) if c is not None else ()):
        require(isinstance(t, torch.Tensor) and t.dim() == 3, op, name,
                lambda t=t: f"{list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}", "a 3-dim tensor")
    heads_first = lambda t: t.permute(1, 0, 2)  # noqa: E731  [B, H, x] -> [H, B, x]
    cg = None if c is None else heads_first(c)
    if expr == "bhr,hdr->bhd":
        return fp8_bmm(heads_first(a), heads_first(sfa), b, sfb, heads_first(d), cg, gran_a=gran_a,
                       gran_b=gran_b, op=op)
    # "bhd,hdr->bhr": the weight as [H, R, D] (K-major copy), its scales [H, R-rows, D-blocks]
    return fp8_bmm(heads_first(a), heads_first(sfa), b.permute(0, 2, 1).contiguous(), sfb.permute(0, 2, 1),
                   heads_first(d), cg, gran_a=gran_a, gran_b=gran_b, op=op)


def fp8_einsum_bhr_hdr(a, sfa, b, sfb, d, c=None, *, gran_a=(None, None), gran_b=(None, None), op: str = OP):
    """``fp8_einsum("bhr,hdr->bhd", ...)``."""
    return fp8_einsum("bhr,hdr->bhd", a, sfa, b, sfb, d, c, gran_a=gran_a, gran_b=gran_b, op=op)

"""DeepGEMM ``fp8_einsum("bhr,hdr->bhd", ...)``: DeepSeek-V4's grouped output projection
(``wo_a``: 8 groups x 4096 in -> 1024 out each) as H independent block-scaled FP8 GEMMs.

Contract: a float8_e4m3fn [B, H, R] with per-token scales [B, H, ceil(R/128)] (any DeepGEMM
format: float32 in either major-ness, packed UE8M0 int32, uint8 UE8M0), b float8_e4m3fn [H, D, R]
with per-block scales [H, ceil(D/128), ceil(R/128)] or per-row [H, D, ...], d bf16 or float32
[B, H, D] written in place, c None or [B, H, D] (may alias d):

    d[b, h, j] = c[b, h, j] + sum_kb (sum_{r in kb} a[b, h, r] B[h, j, r]) * sa(b, h, kb) * sb(h, j, kb)

One launch of :func:`fp8_gemm.launch` with a group per head (M = B, N = D, K = R).
"""
from __future__ import annotations

import torch

from sm12x.kernels.common.checks import require
from sm12x.kernels.gemm.fp8_gemm import C_DTYPES, OUT_DTYPES, launch
from sm12x.kernels.gemm.scales import read_scales

OP = "fp8_einsum"
EXPRS = ("bhr,hdr->bhd",)


def fp8_einsum_bhr_hdr(a, sfa, b, sfb, d, c=None, *, gran_a=(None, None), gran_b=(None, None), op: str = OP):
    """d = c + einsum("bhr,hdr->bhd", a, b), block-scaled (see the module docstring). Returns d."""
    for name, x, dims in (("a", a, "[B, H, R]"), ("b", b, "[H, D, R]")):
        require(isinstance(x, torch.Tensor), op, name, type(x).__name__, "a float8_e4m3fn tensor")
        require(x.dtype == torch.float8_e4m3fn, op, name, f"dtype {x.dtype}", "torch.float8_e4m3fn")
        require(x.dim() == 3, op, name, lambda: f"shape {list(x.shape)}", f"3 dims {dims}")
    nb, h, r = a.shape
    require(b.shape[0] == h and b.shape[2] == r, op, "b", lambda: f"shape {list(b.shape)}",
            f"[{h}, D, {r}] (H and R of a)")
    nd = b.shape[1]
    require(r % 16 == 0 and r > 0, op, "a", f"R = {r}", "R a positive multiple of 16")
    require(b.device == a.device, op, "b", f"device {b.device}", f"the device of a ({a.device})")
    require(isinstance(d, torch.Tensor) and d.dtype in OUT_DTYPES, op, "d",
            getattr(d, "dtype", type(d).__name__), "a torch.bfloat16 or torch.float32 tensor")
    require(tuple(d.shape) == (nb, h, nd), op, "d", lambda: f"shape {list(d.shape)}", f"[{nb}, {h}, {nd}]")
    require(d.device == a.device, op, "d", f"device {d.device}", f"the device of a ({a.device})")
    if c is not None:
        require(isinstance(c, torch.Tensor) and c.dtype in C_DTYPES, op, "c",
                getattr(c, "dtype", type(c).__name__), "None or a torch.float32 / torch.bfloat16 tensor")
        require(tuple(c.shape) == (nb, h, nd), op, "c", lambda: f"shape {list(c.shape)}", f"[{nb}, {h}, {nd}]")
    require(isinstance(sfa, torch.Tensor) and sfa.dim() == 3, op, "sfa",
            lambda: f"{getattr(sfa, 'shape', type(sfa).__name__)}", "[B, H, R-blocks] scales")
    # per head: a[:, h, :] is [B, R] with rows B apart; the scales likewise
    sa = read_scales(op, "sfa", sfa.transpose(0, 1), nb, r, groups=h, gran_mn=gran_a[0], gran_k=gran_a[1])
    sb = read_scales(op, "sfb", sfb, nd, r, groups=h, gran_mn=gran_b[0], gran_k=gran_b[1])
    require(sa.gran_mn == 1, op, "sfa", f"granularity {sa.gran_mn} along B", "1 (per-token scales)")
    require(sa.data.device == a.device and sb.data.device == a.device, op, "sfa/sfb",
            f"devices {sa.data.device} / {sb.data.device}", f"the device of a ({a.device})")
    if nb == 0 or nd == 0 or h == 0:
        return d
    c_view = None if c is None else c[:, 0, :]
    strides = (a.stride(1), b.stride(0), d.stride(1), 0 if c is None else c.stride(1))
    launch(a[:, 0, :], sa, b[0], sb, d[:, 0, :], c_view, groups=h, group_strides=strides)
    return d

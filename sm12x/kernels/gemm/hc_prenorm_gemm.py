"""DeepGEMM ``tf32_hc_prenorm_gemm``: the mHC (manifold-constrained hyper-connection) pre-norm
GEMM, d = a . b^T in TF32 and sqr_sum = sum_k a^2 in one pass over a.

Contract: a bf16 [M, K], b float32 [N, K] (N = 24 in DeepSeek-V4: (2 + 4) x 4 mixes), d float32
and sqr_sum float32. Without ``num_splits``: d [M, N], sqr_sum [M]. With ``num_splits`` = S:
d [S, M, N] and sqr_sum [S, M] hold split-K partials (split s covers its own K range; a split
with no K left writes zeros) that the caller sums, as DeepGEMM returns them.

Precision: the product is a TF32 MMA (``tl.dot(..., input_precision="tf32")``: a's bf16 values
are exact in TF32, b is rounded to TF32), accumulated in float32; sqr_sum is float32 (exact
squares of the bf16 values, summed in float32).

Launch: one program per (BLOCK_M rows, K split); without ``num_splits`` the split count comes
from the shapes (enough programs for every SM) and a second kernel sums the partials.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.common.checks import require

OP = "tf32_hc_prenorm_gemm"

# BLOCK_N covers N (24 -> 32); BLOCK_K per step; sm_120: mma.sync m16n8k8 tf32. Rows per program
# by M: up to SMALL_M, 16-row tiles (a small M is a short, latency-bound pass over b: less work per
# step); above, 32-row tiles, so that a 16-split call's programs stay within one wave
# of SMs up to M ~ 260 (a second, partial wave costs more than the smaller tile saves). A 64-row
# tile with 4 warps spills on sm_120 (a's fp32 tile feeds both the MMA and the square sum).
CONFIGS = {
    "sm_90": {"small": dict(BLOCK_M=16, BLOCK_K=128, num_warps=4, num_stages=3),
              "large": dict(BLOCK_M=32, BLOCK_K=128, num_warps=4, num_stages=3)},
    "sm_120": {"small": dict(BLOCK_M=16, BLOCK_K=128, num_warps=4, num_stages=3),
               "large": dict(BLOCK_M=32, BLOCK_K=128, num_warps=4, num_stages=3)},
}
SMALL_M = 64
MAX_N = 64


@triton.jit
def hc_prenorm_kernel(a_ptr, b_ptr, d_ptr, sq_ptr, M, N, K, k_per_split,
                      stride_am, stride_ak, stride_bn, stride_bk,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Split s of rows [pid*BLOCK_M, +BLOCK_M): d[s] rows and sq[s] rows (contiguous [S, M, N] /
    [S, M])."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    a_ptrs = a_ptr + rows.to(tl.int64)[:, None] * stride_am + (k_begin + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + cols[:, None] * stride_bn + (k_begin + offs_k)[None, :] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k_ok = (k0 + offs_k) < k_end
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision="tf32")
        sq += tl.sum(a * a, axis=1)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    out = split.to(tl.int64) * M * N + rows.to(tl.int64)[:, None] * N + cols[None, :]
    tl.store(d_ptr + out, acc, mask=row_ok[:, None] & col_ok[None, :])
    tl.store(sq_ptr + split.to(tl.int64) * M + rows, sq, mask=row_ok)


@triton.jit
def hc_prenorm_reduce_kernel(dp_ptr, sqp_ptr, d_ptr, sq_ptr, M, N, stride_dm, stride_dn, stride_sq,
                             SPLITS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_N: tl.constexpr):
    """d[m, n] = sum_s dp[s, m, n]; sq[m] = sum_s sqp[s, m] for BLOCK rows per program."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK_N)
    ok = (rows[:, None] < M) & (cols[None, :] < N)
    acc = tl.zeros((BLOCK, BLOCK_N), dtype=tl.float32)
    sq = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(dp_ptr + (s * M + rows[:, None]) * N + cols[None, :], mask=ok, other=0.0)
        sq += tl.load(sqp_ptr + s * M + rows, mask=rows < M, other=0.0)
    tl.store(d_ptr + rows[:, None] * stride_dm + cols[None, :] * stride_dn, acc, mask=ok)
    tl.store(sq_ptr + rows * stride_sq, sq, mask=rows < M)


def auto_splits(m: int, k: int, block_m: int, block_k: int, device) -> int:
    """Splits for a call without ``num_splits``: about two programs per SM, each split at least
    4 K-steps (shapes only)."""
    row_tiles = triton.cdiv(m, block_m)
    want = max(1, (2 * configs.sm_count(device)) // row_tiles)
    return max(1, min(want, triton.cdiv(k, 4 * block_k), 64))


def hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None, op: str = OP):
    """See the module docstring. Writes d and sqr_sum in place; returns None (as DeepGEMM)."""
    require(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16, op, "a",
            getattr(a, "dtype", type(a).__name__), "a torch.bfloat16 tensor [M, K]")
    require(a.dim() == 2, op, "a", lambda: f"shape {list(a.shape)}", "2 dims [M, K]")
    m, k = a.shape
    require(isinstance(b, torch.Tensor) and b.dtype == torch.float32, op, "b",
            getattr(b, "dtype", type(b).__name__), "a torch.float32 tensor [N, K]")
    require(b.dim() == 2 and b.shape[1] == k, op, "b", lambda: f"shape {list(b.shape)}", f"[N, {k}]")
    n = b.shape[0]
    require(0 < n <= MAX_N, op, "b", f"N = {n}", f"1 <= N <= {MAX_N} (mHC mixes)")
    require(k > 0 and k % 4 == 0, op, "a", f"K = {k}", "K a positive multiple of 4")
    require(num_splits is None or (isinstance(num_splits, int) and num_splits >= 1), op, "num_splits",
            num_splits, "None or an int >= 1")
    lead = () if num_splits is None else (num_splits,)
    for name, t, shape in (("d", d, lead + (m, n)), ("sqr_sum", sqr_sum, lead + (m,))):
        require(isinstance(t, torch.Tensor) and t.dtype == torch.float32, op, name,
                getattr(t, "dtype", type(t).__name__), "a torch.float32 tensor")
        require(tuple(t.shape) == shape, op, name, lambda t=t: f"shape {list(t.shape)}", f"shape {list(shape)}")
        require(t.device == a.device, op, name, f"device {t.device}", f"the device of a ({a.device})")
    require(b.device == a.device, op, "b", f"device {b.device}", f"the device of a ({a.device})")
    if m == 0:
        return None
    cfg = configs.pick(CONFIGS, a.device)["small" if m <= SMALL_M else "large"]
    block_n = max(16, triton.next_power_of_2(n))
    splits = num_splits if num_splits is not None else auto_splits(m, k, cfg["BLOCK_M"], cfg["BLOCK_K"], a.device)
    # each split's K range a multiple of BLOCK_K (a split past K writes zeros)
    k_per_split = triton.cdiv(triton.cdiv(k, splits), cfg["BLOCK_K"]) * cfg["BLOCK_K"]
    direct = splits == 1 or num_splits is not None
    if direct and d.is_contiguous() and sqr_sum.is_contiguous():
        dp, sqp = d, sqr_sum
    else:
        dp = torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
        sqp = torch.empty((splits, m), dtype=torch.float32, device=a.device)
    hc_prenorm_kernel[(triton.cdiv(m, cfg["BLOCK_M"]), splits)](
        a, b, dp, sqp, m, n, k, k_per_split, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, BLOCK_K=cfg["BLOCK_K"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    if dp is d:
        return None
    if num_splits is not None:  # strided outputs: copy the partials
        d.copy_(dp)
        sqr_sum.copy_(sqp)
        return None
    hc_prenorm_reduce_kernel[(triton.cdiv(m, 32),)](
        dp, sqp, d, sqr_sum, m, n, d.stride(0), d.stride(1), sqr_sum.stride(0),
        SPLITS=splits, BLOCK=32, BLOCK_N=block_n, num_warps=4)
    return None


def compile_reports(targets=("sm_120", "sm_121")):
    """The split kernel at N = 24 (BLOCK_N 32) in both row-tile sizes and the reduction, per
    target."""
    from sm12x.kernels.common.compile_check import compile_kernel

    sig = {"a_ptr": "*bf16", "b_ptr": "*fp32", "d_ptr": "*fp32", "sq_ptr": "*fp32", "M": "i32", "N": "i32",
           "K": "i32", "k_per_split": "i32", "stride_am": "i32", "stride_ak": "constexpr", "stride_bn": "i32",
           "stride_bk": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
    rsig = {"dp_ptr": "*fp32", "sqp_ptr": "*fp32", "d_ptr": "*fp32", "sq_ptr": "*fp32", "M": "i32", "N": "i32",
            "stride_dm": "i32", "stride_dn": "constexpr", "stride_sq": "constexpr", "SPLITS": "constexpr",
            "BLOCK": "constexpr", "BLOCK_N": "constexpr"}
    reports = []
    for target in targets:
        for size, cfg in configs.for_target(CONFIGS, target).items():
            const = dict(stride_ak=1, stride_bk=1, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=32, BLOCK_K=cfg["BLOCK_K"])
            reports.append(compile_kernel(hc_prenorm_kernel, sig, const, target=target, num_warps=cfg["num_warps"],
                                          num_stages=cfg["num_stages"],
                                          config_name=f"{size} M{cfg['BLOCK_M']} N32 K{cfg['BLOCK_K']} s{cfg['num_stages']}"))
        reports.append(compile_kernel(hc_prenorm_reduce_kernel, rsig,
                                      dict(stride_dn=1, stride_sq=1, SPLITS=16, BLOCK=32, BLOCK_N=32),
                                      target=target, num_warps=4, num_stages=1, config_name="reduce 16 splits"))
    return reports

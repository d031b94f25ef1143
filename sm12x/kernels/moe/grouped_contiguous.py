"""DeepGEMM-compatible ``m_grouped_fp8_fp4_gemm_nt_contiguous`` (and its FP8 alias) in Triton.

Contract: A [M, K] float8_e4m3fn (K a multiple of 128) with scales sfa per row and 128 (or 32) K;
B [G, N, K] float8_e4m3fn or packed e2m1 [G, N, K/2] (int8 / uint8, low nibble = even element) with
scales sfb per 128x128 block, per row and 128 K, or (FP4) per row and 32 K; D [M, N] bfloat16:

    D[r, :] = dequant(A[r]) . dequant(B[g(r)])^T      for every row r of expert g(r)

``layout``: int32 [M] expert id per row, -1 on padding rows (their D rows are written 0); or, with
``psum``, int32 [G] of cumulative unaligned expert ends: expert g owns rows
[align(layout[g-1]), layout[g]); gap rows are written 0 with ``ensure_zero_padding``, rows after
the last expert are left alone. Every expert's segment starts at a multiple of the M alignment
(``operands.get_mk_alignment()``, 128 unless set): a tile of BM rows (BM divides the alignment)
then holds one expert. Scale formats: see :mod:`sm12x.kernels.moe.reference`.

Tiling: one program per (BM rows, BN columns) output tile, GROUP_M tiles along M share a column
band for L2 reuse; a tile's expert is its first valid row's id (default layout) or found by binary
search over the psum ends; a tile of padding only runs no K steps and stores zeros. The K loop is
:func:`sm12x.kernels.moe.expert_tile.expert_tile`.
"""
from __future__ import annotations

import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.common.register_budget import launch_budget
from sm12x.kernels.common.compile_check import interpreting
from sm12x.kernels.moe.expert_tile import (
    expert_tile,
    fit_config,
    kernel_mode,
    scale_plan,
)
from sm12x.kernels.moe.operands import Operands

OP = "m_grouped_fp8_fp4_gemm_nt_contiguous"

# Per arch: "fp8" / "fp4" by the weight type; "large" for segments of >= 64 rows, "small" for the
# narrow alignments vLLM uses on small batches (BM = the alignment, at most the config's BM).
# sm_120: block-scaled mxf8f6f4 MMA; 128x128 FP8 tiles with 3 stages of A 16 KB + B 16 KB fit
# 99 KB. FP4 tiles are 64 x 64 with 8 warps: the e4m3 tile widened in registers makes ptxas'
# register use erratic across Triton 3.6-3.9 (128 x 128, 128 x 64 and 64 x 128 each spill 8-56 B
# under one of them; 64 x 64 spills under none). Small tiles put the weights on the MMA's M side.
# sm_121: 64-wide tiles, 8 warps; under Triton < 3.8 its block-scaled dots are emulated, so the
# kernels take the bf16 path there (``expert_tile.native_block_scaled``).
# maxnreg: the first budget of ``register_budget.budgets`` that does not spill is launched.
_SM12X = dict(GROUP_M=8, mode="scaled", num_warps=8, maxnreg=255)
CONFIGS = {
    "sm_120": {
        "fp8": {"large": dict(_SM12X, BM=128, BN=128, swap=False, num_stages=3),
                "small": dict(_SM12X, BM=32, BN=128, swap=True, num_stages=4, GROUP_M=1)},
        "fp4": {"large": dict(_SM12X, BM=64, BN=64, swap=False, num_stages=3),
                "small": dict(_SM12X, BM=32, BN=64, swap=True, num_stages=4, GROUP_M=1)},
    },
    "sm_121": {
        "fp8": {"large": dict(_SM12X, BM=64, BN=64, swap=False, num_stages=3),
                "small": dict(_SM12X, BM=32, BN=64, swap=True, num_stages=3, GROUP_M=1)},
        "fp4": {"large": dict(_SM12X, BM=64, BN=64, swap=False, num_stages=3),
                "small": dict(_SM12X, BM=32, BN=64, swap=True, num_stages=3, GROUP_M=1)},
    },
    # sm_90: FP8 128x128 tiles; FP4 through Triton's mixed e4m3 x e2m1 dot, whose e2m1 decoding is
    # the cheapest on Hopper (the sweep: docs/performance.md, "Tuning provenance"). Small tiles as
    # the masked decode ones.
    "sm_90": {
        "fp8": {"large": dict(BM=128, BN=128, GROUP_M=8, mode="fp8", swap=False, num_warps=8, num_stages=4),
                "small": dict(BM=32, BN=128, GROUP_M=1, mode="fp8", swap=True, num_warps=4, num_stages=4)},
        "fp4": {"large": dict(BM=128, BN=256, GROUP_M=8, mode="mixed", swap=False, num_warps=8, num_stages=3),
                "small": dict(BM=32, BN=128, GROUP_M=1, mode="mixed", swap=True, num_warps=4, num_stages=4)},
    },
}


def pick_config(device, b_fp4: bool, alignment: int, config=None) -> dict:
    if config is not None:
        cfg = dict(config)
        cfg["BM"] = tile_rows(cfg["BM"], alignment)
        return cfg
    table = configs.pick(CONFIGS, device)["fp4" if b_fp4 else "fp8"]
    cfg = dict(table["large" if alignment >= 64 else "small"])
    cfg["BM"] = tile_rows(cfg["BM"], alignment)
    return cfg


def tile_rows(bm: int, alignment: int) -> int:
    """The largest power of two <= ``bm`` that divides ``alignment`` (a multiple of 16), so that
    no tile spans two experts' segments."""
    while alignment % bm:
        bm //= 2
    return bm


@triton.jit
def _contiguous_kernel(
    a_ptr, b_ptr, d_ptr, layout_ptr, sfa_ptr, sfb_ptr,
    M, N, K, G, alignment,
    stride_am, stride_bg, stride_bn, stride_dm,
    sfa_stride_m, sfa_stride_k, sfb_stride_g, sfb_stride_n, sfb_stride_k,
    PSUM: tl.constexpr, ZERO_PAD: tl.constexpr, LOG2_G: tl.constexpr,
    SFA_KIND: tl.constexpr, SFA_GRAN_K: tl.constexpr, SFB_KIND: tl.constexpr, SFB_GRAN_K: tl.constexpr,
    SFB_GRAN_N: tl.constexpr, A_IN_MMA: tl.constexpr, B_IN_MMA: tl.constexpr, A_FMA: tl.constexpr,
    B_FMA: tl.constexpr, B_FP4: tl.constexpr, MODE: tl.constexpr, SWAP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    band = GROUP_M * num_n
    first_m = (pid // band) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % band) % group_rows
    pid_n = (pid % band) // group_rows

    r0 = pid_m * BM
    rows = r0 + tl.arange(0, BM)
    in_m = rows < M
    if PSUM:
        # expert g = the first whose aligned end is past r0 (the ends are non-decreasing)
        lo = 0
        hi = G
        for _ in tl.static_range(LOG2_G):
            mid = (lo + hi) // 2
            end = tl.load(layout_ptr + tl.minimum(mid, G - 1))
            past = (tl.cdiv(end, alignment) * alignment > r0) | (mid >= G)
            go_left = (lo < hi) & past
            go_right = (lo < hi) & (~past)
            hi = tl.where(go_left, mid, hi)
            lo = tl.where(go_right, mid + 1, lo)
        g = lo
        # past the last expert (g == G): no valid rows and nothing written
        seg_end = tl.where(g < G, tl.load(layout_ptr + tl.minimum(g, G - 1)), 0)
        valid = in_m & (rows < seg_end)
        if ZERO_PAD:
            written = in_m & (rows < tl.where(g < G, M, 0))
        else:
            written = valid
    else:
        ids = tl.load(layout_ptr + rows, mask=in_m, other=-1)
        g = tl.max(ids, axis=0)
        valid = in_m & (ids >= 0)
        written = in_m
    g = tl.minimum(tl.maximum(g, 0), G - 1)
    n_steps = tl.where(tl.max(valid.to(tl.int32), axis=0) > 0, K // 128, 0)

    cols = pid_n * BN + tl.arange(0, BN)
    n_ok = cols < N
    g64 = g.to(tl.int64)
    acc = expert_tile(a_ptr, rows, valid, stride_am, b_ptr + g64 * stride_bg, cols, n_ok, stride_bn, n_steps,
                      sfa_ptr, sfa_stride_m, sfa_stride_k, sfb_ptr + g64 * sfb_stride_g, sfb_stride_n, sfb_stride_k,
                      SFA_KIND, SFA_GRAN_K, SFB_KIND, SFB_GRAN_N, SFB_GRAN_K, A_IN_MMA, B_IN_MMA, A_FMA, B_FMA,
                      B_FP4, MODE, SWAP, BM, BN)
    if SWAP:
        acc = tl.trans(acc)
    out = tl.where(valid[:, None], acc, 0.0).to(tl.bfloat16)
    tl.store(d_ptr + rows.to(tl.int64)[:, None] * stride_dm + cols[None, :], out,
             mask=written[:, None] & n_ok[None, :])


def constexprs(ops: Operands, cfg: dict, *, psum: bool, zero_pad: bool, arch: str = "sm_120") -> dict:
    mode = kernel_mode(cfg["mode"], ops.sfa, ops.sfb, ops.b_fp4, arch)
    return dict(PSUM=psum, ZERO_PAD=zero_pad, LOG2_G=max(ops.groups, 1).bit_length(),
                SFA_KIND=ops.sfa.kind, SFA_GRAN_K=ops.sfa.gran_k, SFB_KIND=ops.sfb.kind,
                SFB_GRAN_K=ops.sfb.gran_k, SFB_GRAN_N=ops.sfb.gran_mn,
                **scale_plan(mode, ops.sfa.kind, ops.sfa.gran_k, ops.sfb.kind, ops.sfb.gran_k),
                B_FP4=ops.b_fp4, MODE=mode, SWAP=bool(cfg["swap"]), BM=cfg["BM"], BN=cfg["BN"],
                GROUP_M=cfg["GROUP_M"])


def grouped_contiguous(ops: Operands, d, layout, *, psum: bool = False, alignment: int = 128,
                       ensure_zero_padding: bool = True, config=None):
    """Run the kernel into ``d`` (inputs validated by the caller; see the module docstring)."""
    m = ops.a.shape[0]
    if m == 0:
        return d
    cfg = pick_config(ops.a.device, ops.b_fp4, alignment, config)
    if config is None:
        cfg = fit_config(cfg, ops.b_fp4, ops.sfa.kind, ops.sfb.kind)
    const = constexprs(ops, cfg, psum=psum, zero_pad=ensure_zero_padding, arch=configs.arch_key(d.device))
    grid = (triton.cdiv(m, cfg["BM"]) * triton.cdiv(ops.n, cfg["BN"]),)
    sa, sb = ops.sfa, ops.sfb
    args = (ops.a, ops.b, d, layout, sa.data, sb.data, m, ops.n, ops.k, ops.groups, alignment,
            ops.a.stride(0), ops.b.stride(0), ops.b.stride(1), d.stride(0),
            sa.stride_mn, sa.stride_k, sb.stride_g, sb.stride_mn, sb.stride_k)
    kwargs = dict(const, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    budget = {} if interpreting() else launch_budget(_contiguous_kernel, args, kwargs, cfg.get("maxnreg"), d.device)
    _contiguous_kernel[grid](*args, **kwargs, **budget)
    return d


# ----------------------------------------------------------------------------------------------
# compile check

SF_POINTER = {0: "*fp32", 1: "*i32", 2: "*u8"}


def signature(b_fp4: bool, sfa_kind: int, sfb_kind: int) -> dict:
    sig = {"a_ptr": "*fp8e4nv", "b_ptr": "*i8" if b_fp4 else "*fp8e4nv", "d_ptr": "*bf16", "layout_ptr": "*i32",
           "sfa_ptr": SF_POINTER[sfa_kind], "sfb_ptr": SF_POINTER[sfb_kind]}
    for name in ("M", "N", "K", "G", "alignment", "stride_am", "stride_bg", "stride_bn", "stride_dm",
                 "sfa_stride_m", "sfa_stride_k", "sfb_stride_g", "sfb_stride_n", "sfb_stride_k"):
        sig[name] = "i32"
    for name in ("PSUM", "ZERO_PAD", "LOG2_G", "SFA_KIND", "SFA_GRAN_K", "SFB_KIND", "SFB_GRAN_K", "SFB_GRAN_N",
                 "A_IN_MMA", "B_IN_MMA", "A_FMA", "B_FMA", "B_FP4", "MODE", "SWAP", "BM", "BN", "GROUP_M"):
        sig[name] = "constexpr"
    return sig


class _Scales:  # what constexprs() reads of an OperandScales
    def __init__(self, kind, gran_mn, gran_k):
        self.kind, self.gran_mn, self.gran_k = kind, gran_mn, gran_k


# (name, weights FP4, activation scale kind, gran_k_a, weight scale kind, gran_n_b): vLLM's MXFP4
# experts (UE8M0 packed activations on SM12x, float32 elsewhere), SGLang's 1x32 activations, and
# FP8 experts with 128x128 float32 or per-row UE8M0 weight scales
VARIANTS = (
    ("fp4 a:packed128", True, 1, 128, 1, 1),
    ("fp4 a:fp32-128", True, 0, 128, 1, 1),
    ("fp4 a:packed32", True, 1, 32, 1, 1),
    ("fp8 b:fp32-128x128", False, 0, 128, 0, 128),
    ("fp8 b:packed-row", False, 1, 128, 1, 1),
)


def compile_reports(targets=("sm_120", "sm_121"), variants=VARIANTS, psum=(False, True)):
    """Compile every configuration this op runs on ``targets`` (large and small tiles, each
    operand variant, both layouts) and return CompileReports."""
    import types

    from sm12x.kernels.common.compile_check import compile_kernel, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), variants=tuple(variants), psum=tuple(psum))
    reports = []
    for target in targets:
        table = CONFIGS[target]
        for name, b_fp4, ka, gka, kb, gnb in variants:
            for size, cfg in table["fp4" if b_fp4 else "fp8"].items():
                cfg = fit_config(cfg, b_fp4, ka, kb)
                for use_psum in psum:
                    ops = types.SimpleNamespace(groups=256, b_fp4=b_fp4, sfa=_Scales(ka, 1, gka),
                                                sfb=_Scales(kb, gnb, 32 if b_fp4 else 128))
                    const = constexprs(ops, cfg, psum=use_psum, zero_pad=True, arch=target)
                    reports.append(compile_kernel(
                        _contiguous_kernel, signature(b_fp4, ka, kb), const, target=target,
                        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                        config_name=f"{name} {size} BN{cfg['BN']} {'psum' if use_psum else 'ids'} mode{const['MODE']}",
                        maxnreg=cfg.get("maxnreg"), register_ladder=True))
    return reports

"""DeepGEMM-compatible ``m_grouped_fp8_fp4_gemm_nt_masked`` (and its FP8 alias) in Triton.

Contract: A [G, M_max, K] float8_e4m3fn with scales [G, M_max, K-blocks] (per row and 128 or 32 K),
B and its scales as in :mod:`sm12x.kernels.moe.grouped_contiguous`, D [G, M_max, N] bfloat16,
masked_m int32 [G]:

    D[g, r, :] = dequant(A[g, r]) . dequant(B[g])^T      for r < masked_m[g] (clamped to M_max)

Rows at or past masked_m[g] are left alone. ``expected_m`` (rows per group the caller expects)
only picks the tile height. CUDA-graph safe: masked_m is read on the device only.

Schedule: persistent. A work unit is (group, BN columns); each of a few programs per SM walks the
units ``pid, pid + P, ...`` and, for a unit whose group has rows, runs the K loop once per BM rows
(once for decode, where a group has at most BM rows), so each active expert's weight tile is read
once and the units of the active experts are spread over every SM. A unit of an empty group costs
one load of masked_m[g] (L1/L2 resident).
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

OP = "m_grouped_fp8_fp4_gemm_nt_masked"

# BM follows expected_m (16 / 32 / 64 rows); weights on the MMA's M side (swap) for decode tiles.
# sm_120: 8 warps; 16-row tiles take 128 weight rows, 32- and 64-row FP4 tiles 64 (128 spill 32-48 B
# under Triton 3.7 / 3.9: the e4m3 tile widened in registers), 64-row FP8 tiles 64. sm_121: 64
# weight rows (its block-scaled dots are emulated under Triton < 3.8: the bf16 path there).
# maxnreg: the first budget of ``register_budget.budgets`` that does not spill is launched (ptxas
# left alone keeps some of these at 128 registers and spills).
_SM12X = dict(mode="scaled", swap=True, num_warps=8, num_stages=4, per_sm=2, maxnreg=255)
# sm_90: Hopper has no FP4 MMA, so FP4 decode is bound by e2m1 decoding there, and Triton's mixed
# e4m3 x e2m1 dot decodes cheapest; BN 128, 4 warps for both kinds (the sweep: docs/performance.md,
# "Tuning provenance").
_SM90 = dict(swap=True, num_warps=4, num_stages=4, per_sm=2)
CONFIGS = {
    "sm_120": {
        "fp8": {16: dict(_SM12X, BN=128), 32: dict(_SM12X, BN=128), 64: dict(_SM12X, BN=64)},
        "fp4": {16: dict(_SM12X, BN=128), 32: dict(_SM12X, BN=64), 64: dict(_SM12X, BN=64)},
    },
    "sm_121": {kind: {bm: dict(_SM12X, BN=64, num_stages=3) for bm in (16, 32, 64)} for kind in ("fp8", "fp4")},
    "sm_90": {
        "fp8": {bm: dict(_SM90, BN=128, mode="fp8") for bm in (16, 32, 64)},
        "fp4": {bm: dict(_SM90, BN=128, mode="mixed") for bm in (16, 32, 64)},
    },
}
BLOCK_MS = (16, 32, 64)


def block_m(expected_m: int) -> int:
    for bm in BLOCK_MS:
        if expected_m <= bm:
            return bm
    return BLOCK_MS[-1]


def pick_config(device, b_fp4: bool, expected_m: int, config=None) -> dict:
    if config is not None:
        cfg = dict(config)
        cfg.setdefault("BM", block_m(expected_m))
        return cfg
    bm = block_m(expected_m)
    return dict(configs.pick(CONFIGS, device)["fp4" if b_fp4 else "fp8"][bm], BM=bm)


@triton.jit
def _masked_kernel(
    a_ptr, b_ptr, d_ptr, masked_ptr, sfa_ptr, sfb_ptr,
    G, M_MAX, N, K, n_tiles,
    stride_ag, stride_am, stride_bg, stride_bn, stride_dg, stride_dm,
    sfa_stride_g, sfa_stride_m, sfa_stride_k, sfb_stride_g, sfb_stride_n, sfb_stride_k,
    SFA_KIND: tl.constexpr, SFA_GRAN_K: tl.constexpr, SFB_KIND: tl.constexpr, SFB_GRAN_K: tl.constexpr,
    SFB_GRAN_N: tl.constexpr, A_IN_MMA: tl.constexpr, B_IN_MMA: tl.constexpr, A_FMA: tl.constexpr,
    B_FMA: tl.constexpr, B_FP4: tl.constexpr, MODE: tl.constexpr, SWAP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    n_steps = K // 128
    for unit in range(pid, G * n_tiles, programs):
        g = unit // n_tiles
        pid_n = unit % n_tiles
        m_g = tl.minimum(tl.load(masked_ptr + g), M_MAX)
        g64 = g.to(tl.int64)
        cols = pid_n * BN + tl.arange(0, BN)
        n_ok = cols < N
        for m0 in range(0, m_g, BM):
            rows = m0 + tl.arange(0, BM)
            ok = rows < m_g
            acc = expert_tile(a_ptr + g64 * stride_ag, rows, ok, stride_am, b_ptr + g64 * stride_bg, cols, n_ok,
                              stride_bn, n_steps, sfa_ptr + g64 * sfa_stride_g, sfa_stride_m, sfa_stride_k,
                              sfb_ptr + g64 * sfb_stride_g, sfb_stride_n, sfb_stride_k,
                              SFA_KIND, SFA_GRAN_K, SFB_KIND, SFB_GRAN_N, SFB_GRAN_K, A_IN_MMA, B_IN_MMA, A_FMA,
                              B_FMA, B_FP4, MODE, SWAP, BM, BN)
            if SWAP:
                acc = tl.trans(acc)
            tl.store(d_ptr + g64 * stride_dg + rows.to(tl.int64)[:, None] * stride_dm + cols[None, :],
                     acc.to(tl.bfloat16), mask=ok[:, None] & n_ok[None, :])


def constexprs(ops: Operands, cfg: dict, arch: str = "sm_120") -> dict:
    mode = kernel_mode(cfg["mode"], ops.sfa, ops.sfb, ops.b_fp4, arch)
    return dict(SFA_KIND=ops.sfa.kind, SFA_GRAN_K=ops.sfa.gran_k, SFB_KIND=ops.sfb.kind,
                SFB_GRAN_K=ops.sfb.gran_k, SFB_GRAN_N=ops.sfb.gran_mn,
                **scale_plan(mode, ops.sfa.kind, ops.sfa.gran_k, ops.sfb.kind, ops.sfb.gran_k),
                B_FP4=ops.b_fp4, MODE=mode, SWAP=bool(cfg["swap"]), BM=cfg["BM"], BN=cfg["BN"])


def grouped_masked(ops: Operands, d, masked_m, expected_m: int, config=None):
    """Run the kernel into ``d`` (inputs validated by the caller; see the module docstring)."""
    groups, m_max = ops.a.shape[0], ops.a.shape[1]
    if m_max == 0:
        return d
    cfg = pick_config(ops.a.device, ops.b_fp4, expected_m, config)
    if config is None:
        cfg = fit_config(cfg, ops.b_fp4, ops.sfa.kind, ops.sfb.kind)
    n_tiles = triton.cdiv(ops.n, cfg["BN"])
    units = groups * n_tiles
    grid = (max(1, min(units, cfg.get("per_sm", 2) * configs.sm_count(ops.a.device))),)
    sa, sb = ops.sfa, ops.sfb
    args = (ops.a, ops.b, d, masked_m, sa.data, sb.data, groups, m_max, ops.n, ops.k, n_tiles,
            ops.a.stride(0), ops.a.stride(1), ops.b.stride(0), ops.b.stride(1), d.stride(0), d.stride(1),
            sa.stride_g, sa.stride_mn, sa.stride_k, sb.stride_g, sb.stride_mn, sb.stride_k)
    kwargs = dict(constexprs(ops, cfg, configs.arch_key(d.device)), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    budget = {} if interpreting() else launch_budget(_masked_kernel, args, kwargs, cfg.get("maxnreg"), d.device)
    _masked_kernel[grid](*args, **kwargs, **budget)
    return d


# ----------------------------------------------------------------------------------------------
# compile check


def signature(b_fp4: bool, sfa_kind: int, sfb_kind: int) -> dict:
    from sm12x.kernels.moe.grouped_contiguous import SF_POINTER

    sig = {"a_ptr": "*fp8e4nv", "b_ptr": "*i8" if b_fp4 else "*fp8e4nv", "d_ptr": "*bf16", "masked_ptr": "*i32",
           "sfa_ptr": SF_POINTER[sfa_kind], "sfb_ptr": SF_POINTER[sfb_kind]}
    for name in ("G", "M_MAX", "N", "K", "n_tiles", "stride_ag", "stride_am", "stride_bg", "stride_bn",
                 "stride_dg", "stride_dm", "sfa_stride_g", "sfa_stride_m", "sfa_stride_k", "sfb_stride_g",
                 "sfb_stride_n", "sfb_stride_k"):
        sig[name] = "i32"
    for name in ("SFA_KIND", "SFA_GRAN_K", "SFB_KIND", "SFB_GRAN_K", "SFB_GRAN_N", "A_IN_MMA", "B_IN_MMA",
                 "A_FMA", "B_FMA", "B_FP4", "MODE", "SWAP", "BM", "BN"):
        sig[name] = "constexpr"
    return sig


def compile_reports(targets=("sm_120", "sm_121"), block_ms=BLOCK_MS, variants=None):
    """Compile every configuration this op runs on ``targets`` (each tile height, each operand
    variant of :data:`grouped_contiguous.VARIANTS`) and return CompileReports."""
    import types

    from sm12x.kernels.common.compile_check import compile_kernel, reports_in_subprocess
    from sm12x.kernels.moe.grouped_contiguous import VARIANTS, _Scales

    variants = VARIANTS if variants is None else variants
    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), block_ms=tuple(block_ms),
                                     variants=tuple(variants))
    reports = []
    for target in targets:
        table = CONFIGS[target]
        for name, b_fp4, ka, gka, kb, gnb in variants:
            for bm in block_ms:
                cfg = fit_config(dict(table["fp4" if b_fp4 else "fp8"][bm], BM=bm), b_fp4, ka, kb)
                ops = types.SimpleNamespace(b_fp4=b_fp4, sfa=_Scales(ka, 1, gka), sfb=_Scales(kb, gnb, 32 if b_fp4 else 128))
                const = constexprs(ops, cfg, target)
                reports.append(compile_kernel(
                    _masked_kernel, signature(b_fp4, ka, kb), const, target=target,
                    num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                    config_name=f"{name} BM{bm} BN{cfg['BN']} mode{const['MODE']}",
                    maxnreg=cfg.get("maxnreg"), register_ladder=True))
    return reports

"""Dense block-scaled FP8 GEMM (DeepGEMM ``fp8_gemm_nt`` and its nn/tn/tt forms) in Triton.

Contract: a float8_e4m3fn [M, K] and b float8_e4m3fn [N, K] (any strides: the nn/tn/tt forms pass
transposed views), their scales in any DeepGEMM format (:mod:`scales`), d bf16 or float32 [M, N]
written in place, c None or [M, N] (may alias d). Computes

    d[m, n] = c[m, n] + sum_kb (sum_{k in kb} a[m, k] b[n, k]) * sa(m, kb) * sb(n, kb)

with fp32 promotion per K-block (:func:`block_scaled.block_scaled_dot`). Any M (1 included), N
and K with K % 16 == 0.

Launch: M <= 64 puts the weight's rows on the MMA's M side (swap-AB: a 16-64 column tile holds
the activations); when the output tiles alone leave SMs idle, K is split (a count from the shapes
only) and a second kernel sums the fp32 partials, adds c and writes d. K-major operands with
16-byte aligned rows are read through TMA tensor descriptors where the tile says so
(``Tile.tma``); other strides through per-thread pointers.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sm12x.kernels.common import configs
from sm12x.kernels.common.checks import require
from sm12x.kernels.common.compile_check import interpreting

from sm12x.kernels.gemm.block_scaled import block_scaled_dot, pick_tile, split_k
from sm12x.kernels.gemm.scales import read_scales

OP = "fp8_gemm_nt"
OUT_DTYPES = (torch.bfloat16, torch.float32)
C_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _tile_coords(pid, num_r, num_c, GROUP_R: tl.constexpr):
    """Grouped ordering: GROUP_R row tiles share their column tiles' reads in L2."""
    per_group = GROUP_R * num_c
    group = pid // per_group
    first_r = group * GROUP_R
    size = tl.minimum(num_r - first_r, GROUP_R)
    pid_r = first_r + (pid % per_group) % size
    pid_c = (pid % per_group) // size
    return pid_r, pid_c


@triton.jit
def fp8_gemm_kernel(a_ptr, sfa_ptr, b_ptr, sfb_ptr, d_ptr, c_ptr, ws_ptr, a_desc, b_desc,
                    M, N, K, tiles_per_split,
                    stride_am, stride_ak, stride_bn, stride_bk, stride_dm, stride_dn, stride_cm, stride_cn,
                    sfa_stride_mn, sfa_stride_k, sfb_stride_mn, sfb_stride_k,
                    stride_ag, stride_bg, stride_dg, stride_cg, sfa_stride_g, sfb_stride_g,
                    SFA_KIND: tl.constexpr, SFA_GRAN_MN: tl.constexpr, SFA_GRAN_K: tl.constexpr,
                    SFB_KIND: tl.constexpr, SFB_GRAN_MN: tl.constexpr, SFB_GRAN_K: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_R: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT: tl.constexpr,
                    HAS_C: tl.constexpr, SCALED_MMA: tl.constexpr, EVEN_K: tl.constexpr,
                    TMA: tl.constexpr, UNIT_MX: tl.constexpr):
    """One (output tile, K split, group) per program. TMA (one group): a and b tiles come through
    the tensor descriptors ``a_desc`` / ``b_desc`` (block shapes: the tile's rows x BLOCK_K).
    UNIT_MX: the fp32-promotion products as unit-scale block-scaled MMAs (``block_scaled_dot``)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    # groups (einsum heads) are independent GEMMs: offset every operand to this one
    g = tl.program_id(2)
    a_ptr += g * stride_ag
    b_ptr += g * stride_bg
    d_ptr += g * stride_dg
    c_ptr += g * stride_cg
    sfa_ptr += g * sfa_stride_g
    sfb_ptr += g * sfb_stride_g
    if SWAP_AB:
        num_r = tl.cdiv(N, BLOCK_R)
        num_c = tl.cdiv(M, BLOCK_C)
    else:
        num_r = tl.cdiv(M, BLOCK_R)
        num_c = tl.cdiv(N, BLOCK_C)
    pid_r, pid_c = _tile_coords(pid, num_r, num_c, GROUP_R)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    t_begin = split * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, tl.cdiv(K, BLOCK_K))
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    if TMA:  # the same tiles through the descriptors
        a_src = a_desc
        b_src = b_desc
    else:
        a_src = a_ptr
        b_src = b_ptr
    if SWAP_AB:  # acc[n, m]
        acc = block_scaled_dot(acc, b_src, rows, rows < N, stride_bn, stride_bk,
                               sfb_ptr, sfb_stride_mn, sfb_stride_k,
                               a_src, cols, cols < M, stride_am, stride_ak,
                               sfa_ptr, sfa_stride_mn, sfa_stride_k,
                               t_begin, t_end, K, SFB_KIND, SFB_GRAN_MN, SFB_GRAN_K,
                               SFA_KIND, SFA_GRAN_MN, SFA_GRAN_K, BLOCK_K, SCALED_MMA, EVEN_K,
                               TMA, pid_r * BLOCK_R, pid_c * BLOCK_C, UNIT_MX)
    else:  # acc[m, n]
        acc = block_scaled_dot(acc, a_src, rows, rows < M, stride_am, stride_ak,
                               sfa_ptr, sfa_stride_mn, sfa_stride_k,
                               b_src, cols, cols < N, stride_bn, stride_bk,
                               sfb_ptr, sfb_stride_mn, sfb_stride_k,
                               t_begin, t_end, K, SFA_KIND, SFA_GRAN_MN, SFA_GRAN_K,
                               SFB_KIND, SFB_GRAN_MN, SFB_GRAN_K, BLOCK_K, SCALED_MMA, EVEN_K,
                               TMA, pid_r * BLOCK_R, pid_c * BLOCK_C, UNIT_MX)
    if SWAP_AB:
        offs_m = cols[None, :]
        offs_n = rows[:, None]
    else:
        offs_m = rows[:, None]
        offs_n = cols[None, :]
    mask = (offs_m < M) & (offs_n < N)
    if SPLIT:  # fp32 partial of this split, [splits, groups, M, N] contiguous
        ws = ws_ptr + (split.to(tl.int64) * tl.num_programs(2) + g) * M * N + offs_m.to(tl.int64) * N + offs_n
        tl.store(ws, acc, mask=mask)
    else:
        if HAS_C:
            acc += tl.load(c_ptr + offs_m.to(tl.int64) * stride_cm + offs_n * stride_cn, mask=mask,
                           other=0.0).to(tl.float32)
        tl.store(d_ptr + offs_m.to(tl.int64) * stride_dm + offs_n * stride_dn,
                 acc.to(d_ptr.dtype.element_ty), mask=mask)


@triton.jit
def split_k_reduce_kernel(ws_ptr, d_ptr, c_ptr, M, N, stride_dm, stride_dn, stride_cm, stride_cn,
                          stride_dg, stride_cg,
                          SPLITS: tl.constexpr, HAS_C: tl.constexpr, BLOCK: tl.constexpr):
    """d = c + sum over the SPLITS fp32 partials [SPLITS, G, M, N] (c may alias d); program
    (i, g) covers BLOCK elements of group g."""
    g = tl.program_id(1).to(tl.int64)
    groups = tl.num_programs(1)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    m = offs // N
    n = offs % N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        acc += tl.load(ws_ptr + (s * groups + g) * M * N + offs, mask=mask, other=0.0)
    if HAS_C:
        acc += tl.load(c_ptr + g * stride_cg + m * stride_cm + n * stride_cn, mask=mask, other=0.0).to(tl.float32)
    tl.store(d_ptr + g * stride_dg + m * stride_dm + n * stride_dn, acc.to(d_ptr.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024


def check_operand(op: str, arg: str, x, rows_name: str):
    require(isinstance(x, torch.Tensor), op, arg, type(x).__name__, "a float8_e4m3fn tensor")
    require(x.dtype == torch.float8_e4m3fn, op, arg, f"dtype {x.dtype}", "torch.float8_e4m3fn")
    require(x.dim() == 2, op, arg, lambda: f"shape {list(x.shape)}", f"2 dims [{rows_name}, K]")


def check_out(op: str, d, c, m: int, n: int, device):
    require(isinstance(d, torch.Tensor), op, "d", type(d).__name__, "a bf16 or float32 tensor")
    require(d.dtype in OUT_DTYPES, op, "d", f"dtype {d.dtype}", "torch.bfloat16 or torch.float32")
    require(tuple(d.shape) == (m, n), op, "d", lambda: f"shape {list(d.shape)}", f"shape [{m}, {n}]")
    require(d.device == device, op, "d", f"device {d.device}", f"the device of a ({device})")
    if c is not None:
        require(isinstance(c, torch.Tensor), op, "c", type(c).__name__, "None or a tensor")
        require(c.dtype in C_DTYPES, op, "c", f"dtype {c.dtype}", "torch.float32 or torch.bfloat16")
        require(tuple(c.shape) == (m, n), op, "c", lambda: f"shape {list(c.shape)}", f"shape [{m}, {n}]")
        require(c.device == device, op, "c", f"device {c.device}", f"the device of a ({device})")


def fp8_gemm(a, sfa, b, sfb, d, c=None, *, gran_a=(None, None), gran_b=(None, None), op: str = OP):
    """d = c + a @ b^T, block-scaled (see the module docstring); ``gran_a`` / ``gran_b`` =
    (gran_mn, gran_k) from the caller's recipe, or Nones to read them from the scale shapes.
    Returns d."""
    check_operand(op, "a", a, "M")
    check_operand(op, "b", b, "N")
    m, k = a.shape
    n = b.shape[0]
    require(b.shape[1] == k, op, "b", lambda: f"shape {list(b.shape)}", f"[N, {k}] (K of a)")
    require(k % 16 == 0 and k > 0, op, "a", f"K = {k}", "K a positive multiple of 16")
    require(b.device == a.device, op, "b", f"device {b.device}", f"the device of a ({a.device})")
    check_out(op, d, c, m, n, a.device)
    sa = read_scales(op, "sfa", sfa, m, k, gran_mn=gran_a[0], gran_k=gran_a[1],
                     prefer_k=128)
    sb = read_scales(op, "sfb", sfb, n, k, gran_mn=gran_b[0], gran_k=gran_b[1],
                     prefer_k=128)
    require(sa.gran_mn == 1, op, "sfa", f"granularity {sa.gran_mn} along M", "1 (per-token scales)")
    require(sa.data.device == a.device, op, "sfa", f"device {sa.data.device}", f"the device of a ({a.device})")
    require(sb.data.device == a.device, op, "sfb", f"device {sb.data.device}", f"the device of a ({a.device})")
    if m == 0 or n == 0:
        return d
    launch(a, sa, b, sb, d, c)
    return d


def plan(m: int, n: int, k: int, sa, sb, device, groups: int = 1):
    """(tile, block_k, scaled_mma, splits, tiles_per_split, grid programs, unit_mx) of a call (worked out
    once per shape, arch and scale kinds: the launcher runs per layer and step)."""
    return _plan(m, n, k, sa.ue8m0, sb.ue8m0, sa.gran_k, sb.gran_k, groups, configs.arch_key(device),
                 configs.sm_count(device))


@functools.lru_cache(maxsize=4096)
def _plan(m, n, k, ue8m0_a, ue8m0_b, gran_k_a, gran_k_b, groups, arch, sms):
    tile = pick_tile(m, arch=arch)
    scaled = tile.scaled_mma and ue8m0_a and ue8m0_b
    unit_mx = tile.unit_mx and not scaled
    block_k = tile.block_k if scaled else min(tile.block_k, gran_k_a, gran_k_b)
    k_tiles = triton.cdiv(k, block_k)
    if tile.swap_ab:
        out_tiles = triton.cdiv(n, tile.block_r) * triton.cdiv(m, tile.block_c)
    else:
        out_tiles = triton.cdiv(m, tile.block_r) * triton.cdiv(n, tile.block_c)
    splits = split_k(out_tiles * groups, k_tiles, m, k, None, sms=sms)
    per = triton.cdiv(k_tiles, splits)
    return tile, block_k, scaled, splits, per, out_tiles, unit_mx


def _tma_ready(x) -> bool:
    """A TMA descriptor can read ``x`` [rows, K] (fp8): K-major, 16-byte aligned start and rows."""
    return ((x.is_cuda or interpreting()) and x.stride(1) == 1 and x.data_ptr() % 16 == 0
            and x.stride(0) % 16 == 0)


def launch(a, sa, b, sb, d, c, groups: int = 1, group_strides=(0, 0, 0, 0)):
    """Launch on validated inputs. ``a`` [M, K], ``b`` [N, K], ``d`` / ``c`` [M, N] are group 0's
    views; ``groups`` > 1 runs that many independent GEMMs whose a / b / d / c start
    ``group_strides`` elements apart (the scales' own ``stride_g``)."""
    m, k = a.shape
    n = b.shape[0]
    tile, block_k, scaled, splits, per, out_tiles, unit_mx = plan(m, n, k, sa, sb, a.device, groups)
    has_c = c is not None
    ws = torch.empty((splits, groups, m, n), dtype=torch.float32, device=a.device) if splits > 1 else d
    c_arg = c if has_c else d
    sg_a, sg_b, sg_d, sg_c = group_strides
    if not has_c:
        sg_c = sg_d
    # TMA descriptors where the tile uses them and the operands allow one (one group, K-major,
    # 16-byte aligned rows); the nn / tn / tt forms' transposed views and the einsum keep pointers
    tma = tile.tma and groups == 1 and _tma_ready(a) and _tma_ready(b)
    if tma:
        rows_a, rows_b = (tile.block_c, tile.block_r) if tile.swap_ab else (tile.block_r, tile.block_c)
        a_desc = TensorDescriptor.from_tensor(a, [rows_a, block_k])
        b_desc = TensorDescriptor.from_tensor(b, [rows_b, block_k])
    else:
        a_desc, b_desc = a, b
    fp8_gemm_kernel[(out_tiles, splits, groups)](
        a, sa.data, b, sb.data, d, c_arg, ws, a_desc, b_desc, m, n, k, per,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), d.stride(0), d.stride(1),
        c_arg.stride(0), c_arg.stride(1), sa.stride_mn, sa.stride_k, sb.stride_mn, sb.stride_k,
        sg_a, sg_b, sg_d, sg_c, sa.stride_g, sb.stride_g,
        SFA_KIND=sa.kind, SFA_GRAN_MN=sa.gran_mn, SFA_GRAN_K=sa.gran_k,
        SFB_KIND=sb.kind, SFB_GRAN_MN=sb.gran_mn, SFB_GRAN_K=sb.gran_k,
        BLOCK_R=tile.block_r, BLOCK_C=tile.block_c, BLOCK_K=block_k, GROUP_R=tile.group_r,
        SWAP_AB=tile.swap_ab, SPLIT=splits > 1, HAS_C=has_c, SCALED_MMA=scaled,
        EVEN_K=k % block_k == 0, TMA=tma, UNIT_MX=unit_mx, num_warps=tile.num_warps, num_stages=tile.num_stages)
    if splits > 1:
        split_k_reduce_kernel[(triton.cdiv(m * n, REDUCE_BLOCK), groups)](
            ws, d, c_arg, m, n, d.stride(0), d.stride(1), c_arg.stride(0), c_arg.stride(1), sg_d, sg_c,
            SPLITS=splits, HAS_C=has_c, BLOCK=REDUCE_BLOCK, num_warps=4)


# ----------------------------------------------------------------------------------------------
# compile check


# the strides that are 1 in a production call (K-major operands, row-major d and c, MN-major sfa)
UNIT_STRIDES = ("stride_ak", "stride_bk", "stride_dn", "stride_cn", "sfa_stride_mn")


def _signature(out_t: str, c_t: str, sf_t: str, desc_blocks=None) -> dict:
    """``desc_blocks``: the (a, b) tensor-descriptor block shapes of a TMA launch, else None."""
    sig = {"a_ptr": "*fp8e4nv", "sfa_ptr": sf_t, "b_ptr": "*fp8e4nv", "sfb_ptr": sf_t, "d_ptr": out_t,
           "c_ptr": c_t, "ws_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "tiles_per_split": "i32"}
    for name, block in zip(("a_desc", "b_desc"), desc_blocks or (None, None)):
        sig[name] = f"tensordesc<fp8e4nv{list(block)}>" if block else "*fp8e4nv"
    for name in ("stride_am", "stride_bn", "stride_dm", "stride_cm", "sfa_stride_k", "sfb_stride_mn", "sfb_stride_k",
                 "stride_ag", "stride_bg", "stride_dg", "stride_cg", "sfa_stride_g", "sfb_stride_g"):
        sig[name] = "i32"
    for name in UNIT_STRIDES:  # Triton specialises an int argument equal to 1 into a constant
        sig[name] = "constexpr"
    for name in ("SFA_KIND", "SFA_GRAN_MN", "SFA_GRAN_K", "SFB_KIND", "SFB_GRAN_MN", "SFB_GRAN_K", "BLOCK_R",
                 "BLOCK_C", "BLOCK_K", "GROUP_R", "SWAP_AB", "SPLIT", "HAS_C", "SCALED_MMA", "EVEN_K", "TMA",
                 "UNIT_MX"):
        sig[name] = "constexpr"
    # in the kernel's parameter order: launch hints are given by position
    return {name: sig[name] for name in fp8_gemm_kernel.arg_names}


def compile_reports(targets=("sm_120", "sm_121")):
    """Compile every tile class of ``targets`` with fp32 scales (fp32 promotion) and packed UE8M0
    scales (block-scaled MMA where the tile enables it), bf16 and fp32 outputs, split and not,
    operands through TMA descriptors and through pointers, plus the split-K reduction."""
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.gemm.block_scaled import TILE_MS, m_class
    from sm12x.kernels.gemm.scales import SF_FP32, SF_UE8M0_PACKED

    reports = []
    for target in targets:
        for m in TILE_MS:
            cls, tile = m_class(m), pick_tile(m, arch=target)
            for kind in (SF_FP32, SF_UE8M0_PACKED):
                scaled = tile.scaled_mma and kind != SF_FP32
                variants = [(o, c, sp, tma) for o, c, sp in (("*bf16", False, False), ("*fp32", True, cls != "large"))
                            for tma in ((True, False) if tile.tma else (False,))]
                rows_a, rows_b = (tile.block_c, tile.block_r) if tile.swap_ab else (tile.block_r, tile.block_c)
                for out_t, has_c, split, tma in variants:
                    const = dict(TMA=tma, SFA_KIND=kind, SFA_GRAN_MN=1, SFA_GRAN_K=128, SFB_KIND=kind,
                                 SFB_GRAN_MN=128 if kind == SF_FP32 else 1, SFB_GRAN_K=128,
                                 BLOCK_R=tile.block_r, BLOCK_C=tile.block_c, BLOCK_K=tile.block_k,
                                 GROUP_R=tile.group_r, SWAP_AB=tile.swap_ab, SPLIT=split, HAS_C=has_c,
                                 SCALED_MMA=scaled, EVEN_K=True, UNIT_MX=tile.unit_mx and not scaled,
                                 **dict.fromkeys(UNIT_STRIDES, 1))
                    name = (f"{cls} {tile.describe()} {'ue8m0' if kind else 'fp32'}-sf "
                            f"{out_t[1:]}{' +C' if has_c else ''}{' split' if split else ''}{'' if tma or not tile.tma else ' pointers'}")
                    blocks = ((rows_a, tile.block_k), (rows_b, tile.block_k)) if tma else None
                    reports.append(compile_kernel(
                        fp8_gemm_kernel, _signature(out_t, "*fp32", "*i32" if kind else "*fp32", blocks), const,
                        target=target, num_warps=tile.num_warps, num_stages=tile.num_stages,
                        config_name=name))
        sig = {"ws_ptr": "*fp32", "d_ptr": "*bf16", "c_ptr": "*fp32", "M": "i32", "N": "i32", "stride_dm": "i32",
               "stride_dn": "i32", "stride_cm": "i32", "stride_cn": "i32", "stride_dg": "i32", "stride_cg": "i32",
               "SPLITS": "constexpr",
               "HAS_C": "constexpr", "BLOCK": "constexpr"}
        reports.append(compile_kernel(split_k_reduce_kernel, sig, dict(SPLITS=8, HAS_C=True, BLOCK=REDUCE_BLOCK),
                                      target=target, num_warps=4, num_stages=1, config_name="reduce 8 splits"))
    return reports

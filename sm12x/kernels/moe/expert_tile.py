"""The K loop of one expert's output tile, shared by the contiguous and masked grouped GEMMs.

One call computes acc[BM, BN] = sum over K of (A rows x their scales) . (B rows of one expert x
their scales)^T in float32, 128 K at a time (one 128-granular scale block per step; a 32-granular
scale contributes 4 bytes per step). How the MMA is done is the ``MODE`` constexpr:

- ``MODE_SCALED``: ``tl.dot_scaled(e4m3, e4m3)`` with one UE8M0 byte per 32 K per row, packed e2m1
  weights widened to e4m3 in registers first (every e2m1 value is exact in e4m3). On sm_120 this is
  the block-scaled ``mma.sync ... kind::mxf8f6f4`` (full 8-bit rate; Triton's own mixed
  e4m3 x e2m1 ``dot_scaled`` is emulated with bf16 MMAs on SM12x). UE8M0 scales go into the MMA;
  float32 scales at 128 granularity are applied to each step's product (the MMA gets 127 = 1.0).
- ``MODE_BF16`` (sm_90): operands dequantised to bfloat16, 32-granular scales folded into them
  (exact: an e4m3 or e2m1 value times a power of two is a bfloat16), 128-granular ones applied to
  each step's product.
- ``MODE_FP8`` (e4m3 weights, 128-granular scales): ``tl.dot`` with every scale applied to each
  step's product, as DeepGEMM's SM90 kernel promotes; and ``MODE_BASE_SCALED`` (e4m3 weights,
  UE8M0 scales on both sides): ``tl.dot_scaled``. Both are the shared GEMM base's K loop,
  :func:`sm12x.kernels.gemm.block_scaled.block_scaled_dot`; the other modes are this module's loop
  (the base takes e4m3 operands with matching scale kinds only).

``SWAP`` puts the weight rows on the MMA's M side (acc is [BN, BM]; the caller transposes): for
decode, where an expert has few rows, so the MMA is not mostly padding.
"""
from __future__ import annotations

import triton
import triton.language as tl

from sm12x.kernels.common.compile_check import interpreting
from sm12x.kernels.gemm.block_scaled import (
    block_scaled_dot,
    load_scales_fp32,
    load_scales_ue8m0,
)
from sm12x.kernels.moe.fp4 import dequant_e2m1_bf16, widen_e2m1

MODE_FP8 = 0
MODE_SCALED = 1
MODE_BF16 = 2
MODE_BF16_INTERPRETER = 3  # MODE_BF16 with float32 dots: Triton's interpreter gets bf16 dots wrong
MODES = {"fp8": MODE_FP8, "scaled": MODE_SCALED, "bf16": MODE_BF16}


def native_block_scaled(arch: str) -> bool:
    """Whether Triton lowers ``tl.dot_scaled`` to the hardware block-scaled MMA on ``arch``: sm_121
    only from Triton 3.8 (3.6 / 3.7 emulate it with bf16 MMAs, staging operands in shared memory:
    the sm_120 tiles then spill or exceed 99 KB there)."""
    if arch != "sm_121":
        return True
    release = tuple(int(x) for x in triton.__version__.split("+")[0].split(".")[:2])
    return release >= (3, 8)


def kernel_mode(name: str, sfa, sfb, b_fp4: bool, arch: str = "sm_120") -> int:
    """The MODE constexpr for a config's ``mode``, the operands' scales (OperandScales) and the
    arch key: 32-granular scales cannot go through MODE_FP8 (MODE_BF16 then); without a native
    block-scaled MMA (sm_121 under Triton < 3.8) MODE_SCALED becomes MODE_BF16, which is what
    Triton's emulation would do, with fewer registers; e4m3 weights with UE8M0 scales on both sides
    take the shared base's block-scaled loop; MODE_BF16 runs as MODE_BF16_INTERPRETER under the
    interpreter."""
    mode = MODES[name]
    if mode == MODE_MIXED and not b_fp4:
        mode = MODE_SCALED
    if mode == MODE_SCALED and not native_block_scaled(arch):
        mode = MODE_BF16
    if b_fp4 and mode == MODE_FP8:
        mode = MODE_BF16
    if mode == MODE_FP8 and (sfa.gran_k == 32 or sfb.gran_k == 32):
        mode = MODE_BF16
    if mode == MODE_SCALED and not b_fp4 and sfa.kind != 0 and sfb.kind != 0:
        mode = MODE_BASE_SCALED
    if mode == MODE_BF16 and interpreting():
        mode = MODE_BF16_INTERPRETER
    return mode

MODE_BASE_SCALED = 4  # e4m3 weights, UE8M0 scales on both sides: the base's tl.dot_scaled loop
# packed e2m1 weights straight into Triton's mixed e4m3 x e2m1 tl.dot_scaled: emulated (bf16 MMAs)
# on every arch in the Tritons the images ship; on sm_90 Triton's own e2m1 decoding is the fast one
MODE_MIXED = 5
MODES["mixed"] = MODE_MIXED

BK = 128  # K per step: one 128-granular scale block


@triton.jit
def ue8m0_bytes(sf_ptr, rows, mask, stride_mn, stride_k, k0, KIND: tl.constexpr, GRAN_MN: tl.constexpr,
                GRAN_K: tl.constexpr):
    """UE8M0 exponents uint8 [R, 4] of the 128-K step at element ``k0``, one per 32 K: the shared
    base's reader, and for float32 scales their exponent byte (DeepGEMM's UE8M0 cast)."""
    if KIND == 0:
        row_off = (rows // GRAN_MN).to(tl.int64) * stride_mn
        kb = (k0 + 32 * tl.arange(0, 4)) // GRAN_K
        v = tl.load(sf_ptr + row_off[:, None] + kb[None, :] * stride_k, mask=mask[:, None], other=0.0)
        return ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)
    else:
        return load_scales_ue8m0(sf_ptr, rows, mask, stride_mn, stride_k, k0, KIND, GRAN_MN, GRAN_K, 128)


@triton.jit
def _per_element(e4, R: tl.constexpr):
    """[R, 4] per-32 values -> [R, 128] (each repeated 32 times along K)."""
    return tl.reshape(tl.broadcast_to(e4[:, :, None], (R, 4, 32)), (R, 128))


@triton.jit
def _bf16_operand(x, e4, FOLD: tl.constexpr, R: tl.constexpr):
    """e4m3 tile [R, 128] -> bfloat16, times 2**(e - 127) per 32 when ``FOLD`` (exact)."""
    if FOLD:
        s = (_per_element(e4.to(tl.int32), R) << 23).to(tl.float32, bitcast=True)
        return (x.to(tl.float32) * s).to(tl.bfloat16)
    else:
        return x.to(tl.float32).to(tl.bfloat16)


@triton.jit
def _tile_loop(a_ptr, a_rows, a_ok, stride_am, b_ptr, b_rows, b_ok, stride_bn, n_steps,
               sfa_ptr, sfa_stride_m, sfa_stride_k, sfb_ptr, sfb_stride_n, sfb_stride_k,
               SFA_KIND: tl.constexpr, SFA_GRAN_K: tl.constexpr, SFB_KIND: tl.constexpr,
               SFB_GRAN_N: tl.constexpr, SFB_GRAN_K: tl.constexpr, A_IN_MMA: tl.constexpr,
               B_IN_MMA: tl.constexpr, A_FMA: tl.constexpr, B_FMA: tl.constexpr, B_FP4: tl.constexpr,
               MODE: tl.constexpr, SWAP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """The K loop for what the shared base does not take: packed e2m1 weights, float32 scales
    next to block-scaled MMAs, and the bf16 dequantising path."""
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    ka = tl.arange(0, 128)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_am + ka[None, :]
    if B_FP4:
        b_ptrs = b_ptr + b_rows.to(tl.int64)[:, None] * stride_bn + tl.arange(0, 64)[None, :]
    else:
        b_ptrs = b_ptr + b_rows.to(tl.int64)[:, None] * stride_bn + ka[None, :]
    for kstep in range(n_steps):
        k0 = kstep * 128
        a = tl.load(a_ptrs, mask=a_ok[:, None], other=0.0)
        if B_FP4:
            bq = tl.load(b_ptrs, mask=b_ok[:, None], other=0)
        else:
            bq = tl.load(b_ptrs, mask=b_ok[:, None], other=0.0)
        if A_IN_MMA:
            ea = ue8m0_bytes(sfa_ptr, a_rows, a_ok, sfa_stride_m, sfa_stride_k, k0, SFA_KIND, 1, SFA_GRAN_K)
        else:
            ea = tl.full((BM, 4), 127, dtype=tl.uint8)
        if B_IN_MMA:
            eb = ue8m0_bytes(sfb_ptr, b_rows, b_ok, sfb_stride_n, sfb_stride_k, k0, SFB_KIND, SFB_GRAN_N,
                             SFB_GRAN_K)
        else:
            eb = tl.full((BN, 4), 127, dtype=tl.uint8)

        if MODE == 5:  # MODE_MIXED: Triton's own e4m3 x e2m1 block-scaled dot
            if SWAP:
                part = tl.dot_scaled(bq.to(tl.uint8, bitcast=True), eb, "e2m1", tl.trans(a), ea, "e4m3")
            else:
                part = tl.dot_scaled(a, ea, "e4m3", tl.trans(bq.to(tl.uint8, bitcast=True)), eb, "e2m1")
        elif MODE == 1:  # MODE_SCALED
            if B_FP4:
                bw = widen_e2m1(bq)
            else:
                bw = bq
            if SWAP:
                part = tl.dot_scaled(bw, eb, "e4m3", tl.trans(a), ea, "e4m3")
            else:
                part = tl.dot_scaled(a, ea, "e4m3", tl.trans(bw), eb, "e4m3")
        else:  # MODE_BF16 (3: the interpreter's variant)
            ab = _bf16_operand(a, ea, A_IN_MMA, BM)
            if B_FP4:
                bb = dequant_e2m1_bf16(bq, _per_element(eb.to(tl.int32), BN))
            else:
                bb = _bf16_operand(bq, eb, B_IN_MMA, BN)
            if MODE == 3:  # the same bf16 values as float32 (the interpreter's bf16 dot is wrong)
                if SWAP:
                    part = tl.dot(bb.to(tl.float32), tl.trans(ab.to(tl.float32)), input_precision="ieee")
                else:
                    part = tl.dot(ab.to(tl.float32), tl.trans(bb.to(tl.float32)), input_precision="ieee")
            elif SWAP:
                part = tl.dot(bb, tl.trans(ab))
            else:
                part = tl.dot(ab, tl.trans(bb))

        if A_FMA:
            fa = load_scales_fp32(sfa_ptr, a_rows, a_ok, sfa_stride_m, sfa_stride_k, k0 // 128, SFA_KIND, 1)
        else:
            fa = tl.full((BM,), 1.0, dtype=tl.float32)
        if B_FMA:
            fb = load_scales_fp32(sfb_ptr, b_rows, b_ok, sfb_stride_n, sfb_stride_k, k0 // 128, SFB_KIND,
                                  SFB_GRAN_N)
        else:
            fb = tl.full((BN,), 1.0, dtype=tl.float32)
        if A_FMA or B_FMA:
            if SWAP:
                acc += part * (fb[:, None] * fa[None, :])
            else:
                acc += part * (fa[:, None] * fb[None, :])
        else:
            acc += part
        a_ptrs += 128
        if B_FP4:
            b_ptrs += 64
        else:
            b_ptrs += 128
    return acc


@triton.jit
def expert_tile(a_ptr, a_rows, a_ok, stride_am, b_ptr, b_rows, b_ok, stride_bn, n_steps,
                sfa_ptr, sfa_stride_m, sfa_stride_k, sfb_ptr, sfb_stride_n, sfb_stride_k,
                SFA_KIND: tl.constexpr, SFA_GRAN_K: tl.constexpr, SFB_KIND: tl.constexpr,
                SFB_GRAN_N: tl.constexpr, SFB_GRAN_K: tl.constexpr, A_IN_MMA: tl.constexpr,
                B_IN_MMA: tl.constexpr, A_FMA: tl.constexpr, B_FMA: tl.constexpr, B_FP4: tl.constexpr,
                MODE: tl.constexpr, SWAP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """float32 acc [BM, BN] ([BN, BM] with ``SWAP``) over ``n_steps`` K-steps of 128.

    a_ptr / b_ptr / sfa_ptr / sfb_ptr point at the expert's A rows, weights and scales; a_rows [BM]
    and b_rows [BN] are expert-local row indices (masked by a_ok / b_ok) with element strides
    stride_am / stride_bn (bytes for packed FP4); scale rows are row // gran_mn. A_IN_MMA /
    B_IN_MMA: the operand's UE8M0 bytes go into the MMA (MODE_SCALED) or are folded into its bf16
    values (MODE_BF16); A_FMA / B_FMA: its 128-granular scale multiplies each step's product.
    MODE_FP8 and MODE_BASE_SCALED (e4m3 weights) are the shared base's ``block_scaled_dot``.
    """
    if MODE == 0 or MODE == 4:  # the shared base: e4m3 x e4m3
        if SWAP:
            acc = tl.zeros((BN, BM), dtype=tl.float32)
            acc = block_scaled_dot(acc, b_ptr, b_rows, b_ok, stride_bn, 1, sfb_ptr, sfb_stride_n, sfb_stride_k,
                                   a_ptr, a_rows, a_ok, stride_am, 1, sfa_ptr, sfa_stride_m, sfa_stride_k,
                                   0, n_steps, n_steps * 128, SFB_KIND, SFB_GRAN_N, SFB_GRAN_K,
                                   SFA_KIND, 1, SFA_GRAN_K, 128, MODE == 4, True)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            acc = block_scaled_dot(acc, a_ptr, a_rows, a_ok, stride_am, 1, sfa_ptr, sfa_stride_m, sfa_stride_k,
                                   b_ptr, b_rows, b_ok, stride_bn, 1, sfb_ptr, sfb_stride_n, sfb_stride_k,
                                   0, n_steps, n_steps * 128, SFA_KIND, 1, SFA_GRAN_K,
                                   SFB_KIND, SFB_GRAN_N, SFB_GRAN_K, 128, MODE == 4, True)
    else:
        acc = _tile_loop(a_ptr, a_rows, a_ok, stride_am, b_ptr, b_rows, b_ok, stride_bn, n_steps,
                         sfa_ptr, sfa_stride_m, sfa_stride_k, sfb_ptr, sfb_stride_n, sfb_stride_k,
                         SFA_KIND, SFA_GRAN_K, SFB_KIND, SFB_GRAN_N, SFB_GRAN_K, A_IN_MMA, B_IN_MMA,
                         A_FMA, B_FMA, B_FP4, MODE, SWAP, BM, BN)
    return acc


def fit_config(cfg: dict, b_fp4: bool, sfa_kind: int, sfb_kind: int) -> dict:
    """``cfg`` for one operand variant: with float32 scales next to the block-scaled MMA, each
    step's product and the accumulator are both live, so the weight tile is cut to 64 rows (128 x
    128 FP8 spills 88 B under Triton 3.8 on sm_120); with packed e2m1 weights also the activation
    tile (128 x 64 still spills 8 B)."""
    if cfg.get("mode") == "scaled" and (sfa_kind == 0 or sfb_kind == 0):
        cfg = dict(cfg, BN=min(cfg["BN"], 64))
        if b_fp4:
            cfg["BM"] = min(cfg.get("BM", 64), 64)
    return cfg


def scale_plan(mode: int, sfa_kind: int, sfa_gran_k: int, sfb_kind: int, sfb_gran_k: int) -> dict:
    """Where each operand's scales are applied for ``mode`` (the A_IN_MMA / B_IN_MMA / A_FMA /
    B_FMA constexprs): 32-granular scales always in the MMA (or folded into bf16 operands); UE8M0
    128-granular ones in the MMA with MODE_SCALED; the rest per step in float32."""
    def plan(kind, gran):
        if gran == 32:
            in_mma = True
        elif mode in (MODE_SCALED, MODE_MIXED):
            in_mma = kind != 0
        else:
            in_mma = False
        return in_mma, not in_mma

    if mode in (MODE_FP8, MODE_BASE_SCALED):  # the base applies every scale itself
        return dict(A_IN_MMA=False, B_IN_MMA=False, A_FMA=False, B_FMA=False)
    mode = MODE_BF16 if mode == MODE_BF16_INTERPRETER else mode
    a_in, a_fma = plan(sfa_kind, sfa_gran_k)
    b_in, b_fma = plan(sfb_kind, sfb_gran_k)
    return dict(A_IN_MMA=a_in, B_IN_MMA=b_in, A_FMA=a_fma, B_FMA=b_fma)

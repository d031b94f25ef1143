"""MXFP4 (e2m1) decoding: host helpers for references and tests, and the Triton helpers the kernels
use to widen packed e2m1 tiles.

Packing (DeepGEMM, vLLM, the DeepSeek-V4 checkpoints): two e2m1 codes per byte, the LOW nibble is
the even element. A code is s|e1 e0|m: value = (-1)^s * (m / 2 if e == 0 else 2^(e-1) * (1 + m/2)),
i.e. {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives. Every e2m1 value is exact in e4m3 and bf16.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 [..., K/2] (int8 / uint8 / float4_e2m1fn_x2) -> float32 [..., K]."""
    codes = packed.contiguous().view(torch.uint8).to(torch.int64)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    lo, hi = table[codes & 15], table[codes >> 4]
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def quantize_e2m1(x: torch.Tensor, gran_k: int = 32):
    """x [..., K] -> (packed int8 [..., K/2], float32 power-of-two scales [..., K/gran_k]):
    scale = amax/6 rounded up to a power of two (amax clamped to >= 1e-4, as DeepGEMM's
    quantisers), values rounded to the nearest e2m1 (test data; ties go to the smaller code)."""
    from sm12x.kernels.gemm.scales import ceil_to_ue8m0

    *lead, k = x.shape
    blocks = x.float().reshape(*lead, k // gran_k, gran_k)
    amax = blocks.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    sf = ceil_to_ue8m0(amax / 6.0)
    y = (blocks / sf).reshape(*lead, k)
    # nearest magnitude code: the midpoints between consecutive e2m1 magnitudes
    mids = torch.tensor((0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0), dtype=torch.float32, device=x.device)
    code = torch.bucketize(y.abs(), mids).to(torch.int32)
    code = code | ((y < 0) & (code > 0)).to(torch.int32) << 3  # no -0
    pair = code.reshape(*lead, k // 2, 2)
    packed = (pair[..., 0] | (pair[..., 1] << 4)).to(torch.uint8).view(torch.int8)
    return packed, sf.reshape(*lead, k // gran_k)


@triton.jit
def e2m1_to_e4m3_bits(c):
    """e2m1 codes (uint8, 0..15) -> the e4m3 bit pattern (uint8) of the same value:
    magnitude 1 (0.5) is 0x30, magnitude c >= 2 is (c << 2) + 0x30 (exponent bias 1 -> 7), the sign
    moves from bit 3 to bit 7. Byte arithmetic throughout (no value exceeds 0xCC)."""
    mag = c & 7
    bits = tl.where(mag < 2, mag * 0x30, (mag << 2) + 0x30)
    return bits | ((c & 8) << 4)


@triton.jit
def widen_e2m1(packed):
    """Packed e2m1 tile [R, C] (int8) -> float8e4nv [R, 2C] in element order (low nibble first)."""
    b = packed.to(tl.uint8, bitcast=True)
    lo = e2m1_to_e4m3_bits(b & 15).to(tl.float8e4nv, bitcast=True)
    hi = e2m1_to_e4m3_bits(b >> 4).to(tl.float8e4nv, bitcast=True)
    return tl.reshape(tl.join(lo, hi), (packed.shape[0], 2 * packed.shape[1]))


@triton.jit
def e2m1_scaled_bf16_bits(c, e):
    """e2m1 codes (int32) times 2**(e - 127) (UE8M0 byte e, int32, broadcastable) -> bf16 bit
    patterns (int32): exponent field (c >> 1) + e - 1 for magnitudes >= 1 (0.5 has the field of
    e - 1 and no mantissa bit). Results below bf16's normal range are flushed to zero (a scale
    byte of 0 gives 0, as the float32 reading of UE8M0 does)."""
    mag = c & 7
    field = (mag >> 1) + e - 1
    mant = tl.where(mag >= 2, (mag & 1) << 6, 0)
    bits = (field << 7) | mant | ((c & 8) << 12)
    return tl.where((mag == 0) | (field <= 0) | (e == 0), 0, bits)


@triton.jit
def dequant_e2m1_bf16(packed, e):
    """Packed e2m1 tile [R, C] (int8) with UE8M0 bytes e [R, 2C] (int32, one per element) ->
    bfloat16 [R, 2C] of value * 2**(e - 127)."""
    b = packed.to(tl.int32) & 0xFF
    codes = tl.reshape(tl.join(b & 15, b >> 4), (packed.shape[0], 2 * packed.shape[1]))
    return e2m1_scaled_bf16_bits(codes, e).to(tl.int16).to(tl.bfloat16, bitcast=True)

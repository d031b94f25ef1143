"""One FP8 x FP8 product tile, through the instruction that runs it fastest on each architecture.

Contract of :func:`fp8_dot` (a ``@triton.jit`` helper, inlined into the caller's kernel): ``a``
float8_e4m3fn [M, K], ``b`` float8_e4m3fn [K, N] (a ``tl.trans`` view is fine), K a multiple of 32;
returns the float32 [M, N] tile ``a @ b`` (exact products, float32 accumulation).

- ``UNIT_MX=False``: ``tl.dot``, the plain FP8 ``mma.sync`` (wgmma on sm_90).
- ``UNIT_MX=True``: ``tl.dot_scaled(e4m3, e4m3)`` with every UE8M0 scale 127 (2**0): the same
  products and the same float32 accumulation, but on sm_120 (and on sm_121 from Triton 3.8) the
  block-scaled ``mma.sync ... kind::mxf8f6f4.block_scale`` (SASS ``QMMA.SF``), which runs at the full
  8-bit rate where the plain FP8 MMA with float32 accumulation runs at half rate on GeForce parts.
  Where the data carries its own scales that are not powers of two (float32 scales), they stay
  outside the MMA, applied to the float32 tile by the caller as before.

:func:`native_block_scaled` says where ``UNIT_MX`` pays: where Triton lowers ``tl.dot_scaled`` to the
hardware instruction (elsewhere it is emulated with bf16 MMAs: slower, more registers).
"""
from __future__ import annotations

import triton
import triton.language as tl


def _triton_release() -> tuple:
    parts = []
    for p in triton.__version__.split("+")[0].split(".")[:2]:
        parts.append(int("".join(ch for ch in p if ch.isdigit()) or 0))
    return tuple(parts)


def native_block_scaled(arch: str) -> bool:
    """Whether Triton lowers ``tl.dot_scaled(e4m3, e4m3)`` to the hardware block-scaled MMA on arch
    key ``arch``: always on sm_120, on sm_121 from Triton 3.8 (triton #10010; 3.6 / 3.7 emulate it
    there), never on sm_90 (Hopper has no block-scaled MMA)."""
    if arch == "sm_120":
        return True
    if arch == "sm_121":
        return _triton_release() >= (3, 8)
    return False


@triton.jit
def fp8_dot(a, b, UNIT_MX: tl.constexpr):
    """float32 a [M, K] @ b [K, N] of two e4m3 tiles (see the module docstring)."""
    if UNIT_MX:
        # one UE8M0 byte per 32 K per row of a and per column of b; 127 is the exponent of 1.0
        sa = tl.full((a.shape[0], a.shape[1] // 32), 127, tl.uint8)
        sb = tl.full((b.shape[1], b.shape[0] // 32), 127, tl.uint8)
        return tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3")
    else:
        return tl.dot(a, b)

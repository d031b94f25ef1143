"""Triton helpers for rounding that the kernels share."""
import triton
import triton.language as tl


@triton.jit
def round_bf16(x):
    """float32 -> the nearest bfloat16 value (ties to even), kept in float32 (finite x). Written
    out because triton 3.9's interpreter truncates ``.to(tl.bfloat16)``; on the GPU it compiles to
    integer ops, so kernels use it only where the interpreter runs or the value stays float32."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)

"""The Triton e2m1 helpers under the interpreter: widening to e4m3 and scaled bf16 decoding, for
every byte."""
import pytest
import torch
import triton
import triton.language as tl

from sm12x.kernels.moe.fp4 import dequant_e2m1_bf16, unpack_e2m1, widen_e2m1

pytestmark = pytest.mark.cpu_only


@triton.jit
def _widen(p_ptr, o_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    p = tl.load(p_ptr + r[:, None] * C + tl.arange(0, C)[None, :])
    w = widen_e2m1(p)
    tl.store(o_ptr + r[:, None] * (2 * C) + tl.arange(0, 2 * C)[None, :], w.to(tl.float32))


@triton.jit
def _bf16(p_ptr, e_ptr, o_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.arange(0, R)
    p = tl.load(p_ptr + r[:, None] * C + tl.arange(0, C)[None, :])
    e = tl.load(e_ptr + r)
    x = dequant_e2m1_bf16(p, tl.broadcast_to(e[:, None], (R, 2 * C)))
    tl.store(o_ptr + r[:, None] * (2 * C) + tl.arange(0, 2 * C)[None, :], x.to(tl.float32))


def test_widen_every_byte():
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).view(16, 16)
    out = torch.empty(16, 32)
    _widen[(1,)](packed, out, R=16, C=16)
    assert torch.equal(out, unpack_e2m1(packed))


def test_scaled_bf16_every_byte_and_exponents():
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.int8).view(16, 16)
    exps = torch.tensor([1, 2, 100, 117, 126, 127, 128, 140, 200, 250, 0, 120, 127, 64, 30, 3], dtype=torch.int32)
    out = torch.empty(16, 32)
    _bf16[(1,)](packed, exps, out, R=16, C=16)
    scale = (exps << 23).view(torch.float32)[:, None]
    want = unpack_e2m1(packed) * scale
    # below bf16's normal range the helper flushes to zero
    want = torch.where(want.abs() < 2.0 ** -126, torch.zeros_like(want), want)
    assert torch.equal(out, want)

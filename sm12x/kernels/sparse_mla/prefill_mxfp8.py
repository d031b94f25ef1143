"""Sparse MLA prefill through block-scaled MXFP8 MMAs (the ``fast`` attention precision,
``SM12X_ATTENTION_PRECISION=fast``; SM12x only).

Contract: as :func:`sm12x.kernels.sparse_mla.prefill.sparse_mla_prefill` (FlashMLA
``flash_mla_sparse_fwd``): q bf16 [s_q, h_q, 512 | 576], kv bf16 [s_kv, 1, d_qk], indices int32
[s_q, 1, topk], optional attn_sink fp32 [h_q] and topk_length int32 [s_q] -> out bf16 [s_q, h_q,
512], max_logits and lse fp32 [s_q, h_q] (natural log; no valid candidate: out 0, max_logits -inf,
lse +inf).

Two launches:

1. ``_pack_kernel`` writes kv once into the FP8 cache layout the MXFP8 decode kernel reads:
   d_qk 512 as a V4 "MODEL1" cache (448 e4m3 values with one UE8M0 scale per 64, 64 bf16 RoPE
   values), d_qk 576 as a V3.2 cache (512 e4m3 values with one power-of-two float32 scale per 128,
   64 bf16 RoPE values). A group's scale is the smallest power of two 2**k >= amax / 448 (k >= -13),
   the rule FlashMLA's and vLLM's cache writers use, so a kv row that was dequantised from such a
   cache (what the frameworks pass at prefill) is packed back to the same values exactly: its
   group's new scale is at most the cache's, which leaves every value representable. Any other
   bf16 kv is rounded to e4m3 (3 mantissa bits) in the no-RoPE dims: that is this path's error
   beyond the decode's (``scripts/bench_sparse_mla_precision.py --prefill`` measures both).
2. :func:`sm12x.kernels.sparse_mla.decode_mxfp8.launch` on that cache, each query token a request
   of one token (the exact prefill's split path does the same with bf16 rows), writing max_logits
   too. Indices >= s_kv are invalid (``cache_tokens``).

The packed cache is a workspace of s_kv * 584 (656) bytes sized by shapes only (CUDA-graph safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess
from sm12x.kernels.sparse_mla import decode_mxfp8
from sm12x.kernels.sparse_mla.decode_mxfp8 import _e4m3
from sm12x.kernels.sparse_mla.kv_cache import MODEL1_BYTES_PER_TOKEN

V32_BYTES_PER_TOKEN = 656
PAGE = 64  # tokens per page of the packed cache (the decode kernel's PAGE)
BLOCK_T = 16  # tokens per pack program


def serves(d_qk: int, device) -> bool:
    """Whether the fast prefill serves a call (the decode's rule: fast precision, d_qk 512 / 576,
    a native block-scaled MMA on this arch)."""
    return decode_mxfp8.serves(d_qk, device)


@triton.jit
def _pow2_exponent(amax):
    """k = the smallest integer with amax <= 448 * 2**k, at least -13 (float32 amax >= 0, exact:
    448 * 2**k is compared by exponent and mantissa, no division)."""
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127  # amax in [2**e, 2**(e + 1))
    # 448 * 2**(e - 8) = 1.75 * 2**e: k = e - 8 when amax's mantissa is at most 1.75's
    k = tl.where((bits & 0x7FFFFF) <= 0x600000, e - 8, e - 7)
    return tl.maximum(tl.where(amax > 0.0, k, -13), -13)


@triton.jit
def _pack_kernel(kv_ptr, stride_kv, S_KV, cache_ptr, stride_page, IS_MODEL1: tl.constexpr,
                 PAGE: tl.constexpr, BLOCK_T: tl.constexpr, INTERPRET: tl.constexpr):
    """Tokens [pid * BLOCK_T, ...) of kv -> their cache entries (module docstring)."""
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < S_KV
    row = kv_ptr + t.to(tl.int64) * stride_kv
    page_base = (t // PAGE).to(tl.int64) * stride_page
    off = (t % PAGE).to(tl.int64)
    if IS_MODEL1:
        NOPE: tl.constexpr = 448
        GROUP: tl.constexpr = 64
        d = tl.arange(0, 512)
        x = tl.load(row[:, None] + d[None, :], mask=tmask[:, None] & (d[None, :] < NOPE), other=0.0)
        data = cache_ptr + page_base + off * 576
    else:
        NOPE: tl.constexpr = 512
        GROUP: tl.constexpr = 128
        d = tl.arange(0, 512)
        x = tl.load(row[:, None] + d[None, :], mask=tmask[:, None], other=0.0)
        data = cache_ptr + page_base + off * 656
    g = tl.reshape(x.to(tl.float32), (BLOCK_T, 512 // GROUP, GROUP))
    k = _pow2_exponent(tl.max(tl.abs(g), axis=2))  # [BLOCK_T, groups]
    inv = ((127 - k) << 23).to(tl.float32, bitcast=True)  # 2**-k, exact
    codes = _e4m3(tl.reshape(g * inv[:, :, None], (BLOCK_T, 512)), INTERPRET).to(tl.uint8,
                                                                                 bitcast=True)
    tl.store(data[:, None] + d[None, :], codes, mask=tmask[:, None] & (d[None, :] < NOPE))
    r = tl.arange(0, 64)
    rope = tl.load(row[:, None] + NOPE + r[None, :], mask=tmask[:, None], other=0.0)
    if IS_MODEL1:
        tl.store((data + 448).to(tl.pointer_type(tl.bfloat16))[:, None] + r[None, :], rope,
                 mask=tmask[:, None])
        # 8 groups of 64 over the padded 512 dims: the first 7 are the NoPE scales; the 8th
        # (zero padding, k = -13) lands on the entry's pad byte, which no reader uses.
        sc = cache_ptr + page_base + PAGE * 576 + off * 8
        j = tl.arange(0, 8)
        tl.store(sc[:, None] + j[None, :], (k + 127).to(tl.uint8), mask=tmask[:, None])
    else:
        tl.store((data + 528).to(tl.pointer_type(tl.bfloat16))[:, None] + r[None, :], rope,
                 mask=tmask[:, None])
        j = tl.arange(0, 4)
        scale = ((k + 127) << 23).to(tl.float32, bitcast=True)  # 2**k
        tl.store((data + 512).to(tl.pointer_type(tl.float32))[:, None] + j[None, :], scale,
                 mask=tmask[:, None])


def pack(kv: torch.Tensor) -> torch.Tensor:
    """bf16 kv [s_kv, 1, d_qk] (16-byte aligned rows) -> the packed cache [pages, PAGE, 1, bytes
    per token] (uint8; 584 for d_qk 512, 656 for 576)."""
    s_kv, _, d_qk = kv.shape
    bpt = MODEL1_BYTES_PER_TOKEN if d_qk == 512 else V32_BYTES_PER_TOKEN
    pages = triton.cdiv(s_kv, PAGE)
    cache = torch.empty((pages, PAGE * bpt), dtype=torch.uint8, device=kv.device)
    _pack_kernel[(triton.cdiv(s_kv, BLOCK_T),)](kv, kv.stride(0), s_kv, cache, cache.stride(0),
                                                IS_MODEL1=d_qk == 512, PAGE=PAGE, BLOCK_T=BLOCK_T,
                                                INTERPRET=interpreting(), num_warps=4)
    return cache.view(pages, PAGE, 1, bpt)


def launch(q, kv, indices, topk_length, attn_sink, sm_scale, out, max_logits, lse,
           num_splits=None):
    """The fast prefill on inputs checked by ``prefill.validate`` (q with 16-byte aligned rows;
    out bf16 [s_q, h_q, 512]; max_logits and lse contiguous fp32 [s_q, h_q]); ``num_splits``
    cuts every row into that many parts (default: from shapes and SMs)."""
    cache = pack(kv)
    decode_mxfp8.launch(q.unsqueeze(1), cache, indices, topk_length, attn_sink, None, None, None,
                        sm_scale, out.unsqueeze(1), lse.unsqueeze(1), num_splits=num_splits,
                        max_logits=max_logits.unsqueeze(1), cache_tokens=kv.shape[0])


# ----------------------------------------------------------------------------------------------
# compile check


def compile_reports(targets=("sm_120", "sm_121")):
    """The pack kernel and the MXFP8 attention kernel in the prefill's form, for the ``targets``
    whose Triton lowers ``tl.dot_scaled`` natively."""
    from sm12x.kernels.common.compile_check import compile_kernel

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets))
    reports = decode_mxfp8.compile_reports(targets, prefill=True)
    for target in targets:
        if not decode_mxfp8.native_block_scaled(target):
            continue
        for d_qk in (512, 576):
            sig = {"kv_ptr": "*bf16", "stride_kv": "i32", "S_KV": "i32", "cache_ptr": "*u8",
                   "stride_page": "i64", "IS_MODEL1": "constexpr", "PAGE": "constexpr",
                   "BLOCK_T": "constexpr", "INTERPRET": "constexpr"}
            const = dict(IS_MODEL1=d_qk == 512, PAGE=PAGE, BLOCK_T=BLOCK_T, INTERPRET=False)
            reports.append(compile_kernel(_pack_kernel, sig, const, target=target, num_warps=4,
                                          num_stages=1, config_name=f"mxfp8 pack d{d_qk}"))
    return reports

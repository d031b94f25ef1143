"""FP8 sparse-MLA KV-cache formats (FlashMLA's), in plain PyTorch: quantisers, dequantisers and
the index helper. Used by tests, benchmarks and the reference; the Triton kernel reads the same bytes.

MODEL1 (DeepSeek-V4; d_qk = d_v = 512; 584 B per token). Per page of B tokens:
  bytes [0, B*576):          token t at t*576: 448 fp8 e4m3 NoPE, then 64 bf16 RoPE;
  bytes [B*576, B*584):      token t at B*576 + t*8: 7 UE8M0 scales (one per 64 NoPE values), 1 pad;
  the page stride is padded up to a multiple of 576 bytes (or any larger ``page_stride``).
  The cache is viewed [num_blocks, B, 1, 584] uint8 with stride(0) = page bytes, stride(1) = 584.

V3.2 / GLM-5 (d_qk = 576, d_v = 512; 656 B per token, inline): 512 fp8 e4m3 NoPE, 4 fp32 scales (one
per 128 NoPE values), 64 bf16 RoPE. Viewed [num_blocks, B, 1, 656], stride(1) = 656.

Scales are ``amax / 448`` clamped to >= 1e-4 and rounded up to a power of two, so dequantising to
bf16 is exact.
"""
from __future__ import annotations

import torch

MODEL1_BYTES_PER_TOKEN = 584  # 448 fp8 + 64*2 bf16 + 7 scales + 1 pad
V32_BYTES_PER_TOKEN = 656     # 512 fp8 + 4*4 fp32 scales + 64*2 bf16
FP8_MAX = 448.0


def _pow2_scales(x: torch.Tensor, tile: int) -> torch.Tensor:
    """Per-tile power-of-two scales of ``x`` [..., n*tile] -> fp32 [..., n]."""
    amax = x.float().unflatten(-1, (-1, tile)).abs().amax(dim=-1)
    return torch.exp2(torch.ceil(torch.log2(torch.clamp_min(amax / FP8_MAX, 1e-4))))


def _to_fp8_bytes(x: torch.Tensor, scales: torch.Tensor, tile: int) -> torch.Tensor:
    q = (x.float().unflatten(-1, (-1, tile)) / scales.unsqueeze(-1)).flatten(-2)
    return q.to(torch.float8_e4m3fn).view(torch.uint8)


def _page_stride(page_bytes: int, page_stride: int | None, align: int) -> int:
    if page_stride is None:
        return (page_bytes + align - 1) // align * align
    if page_stride < page_bytes or page_stride % 16:
        raise ValueError(f"page_stride {page_stride}: must be >= {page_bytes} and a multiple of 16")
    return page_stride


def quantize_model1_cache(kv: torch.Tensor, page_stride: int | None = None) -> torch.Tensor:
    """bf16/fp32 ``kv`` [num_blocks, B, 512] -> uint8 cache view [num_blocks, B, 1, 584].

    ``page_stride`` (bytes, default: B*584 rounded up to a multiple of 576) lets tests build a view
    into a bigger arena."""
    nb, B, d = kv.shape
    assert d == 512, "MODEL1 caches hold 512-dim tokens"
    stride = _page_stride(B * MODEL1_BYTES_PER_TOKEN, page_stride, 576)
    arena = torch.zeros(nb, stride, dtype=torch.uint8, device=kv.device)
    scales = _pow2_scales(kv[..., :448], 64)                       # [nb, B, 7]
    data = arena[:, : B * 576].view(nb, B, 576)
    data[..., :448] = _to_fp8_bytes(kv[..., :448], scales, 64)
    data[..., 448:] = kv[..., 448:].to(torch.bfloat16).contiguous().view(torch.uint8)
    sc = arena[:, B * 576: B * 584].view(nb, B, 8)
    sc[..., :7] = (torch.log2(scales).round().to(torch.int32) + 127).to(torch.uint8)
    return arena.as_strided((nb, B, 1, MODEL1_BYTES_PER_TOKEN), (stride, MODEL1_BYTES_PER_TOKEN,
                                                                 MODEL1_BYTES_PER_TOKEN, 1))


def dequantize_model1_cache(cache: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """MODEL1 cache view [num_blocks, B, 1, 584] (any stride(0)) -> [num_blocks, B, 512] ``dtype``."""
    nb, B = cache.shape[0], cache.shape[1]
    raw = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    pages = raw.as_strided((nb, B * MODEL1_BYTES_PER_TOKEN), (raw.stride(0), 1),
                           raw.storage_offset())
    data = pages[:, : B * 576].reshape(nb, B, 576)
    nope = data[..., :448].contiguous().view(torch.float8_e4m3fn).float()
    rope = data[..., 448:].contiguous().view(torch.bfloat16).float()
    exps = pages[:, B * 576:].reshape(nb, B, 8)[..., :7].to(torch.int32) - 127
    nope = (nope.unflatten(-1, (7, 64)) * torch.exp2(exps.float()).unsqueeze(-1)).flatten(-2)
    return torch.cat([nope, rope], dim=-1).to(dtype)


def quantize_v32_cache(kv: torch.Tensor, page_stride: int | None = None) -> torch.Tensor:
    """bf16/fp32 ``kv`` [num_blocks, B, 576] -> uint8 cache view [num_blocks, B, 1, 656]."""
    nb, B, d = kv.shape
    assert d == 576, "V3.2 caches hold 576-dim tokens"
    stride = _page_stride(B * V32_BYTES_PER_TOKEN, page_stride, 16)
    arena = torch.zeros(nb, stride, dtype=torch.uint8, device=kv.device)
    tok = arena[:, : B * V32_BYTES_PER_TOKEN].view(nb, B, V32_BYTES_PER_TOKEN)
    scales = _pow2_scales(kv[..., :512], 128)                      # [nb, B, 4]
    tok[..., :512] = _to_fp8_bytes(kv[..., :512], scales, 128)
    tok[..., 512:528] = scales.contiguous().view(torch.uint8)
    tok[..., 528:] = kv[..., 512:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return arena.as_strided((nb, B, 1, V32_BYTES_PER_TOKEN), (stride, V32_BYTES_PER_TOKEN,
                                                              V32_BYTES_PER_TOKEN, 1))


def dequantize_v32_cache(cache: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """V3.2 cache view [num_blocks, B, 1, 656] (any stride(0)) -> [num_blocks, B, 576] ``dtype``."""
    raw = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    tok = raw[:, :, 0, :]
    nope = tok[..., :512].contiguous().view(torch.float8_e4m3fn).float()
    scales = tok[..., 512:528].contiguous().view(torch.float32)
    rope = tok[..., 528:].contiguous().view(torch.bfloat16).float()
    nope = (nope.unflatten(-1, (4, 128)) * scales.unsqueeze(-1)).flatten(-2)
    return torch.cat([nope, rope], dim=-1).to(dtype)


def dequantize_cache(cache: torch.Tensor, dtype=torch.bfloat16) -> torch.Tensor:
    """Either format, chosen by bytes per token (584 or 656)."""
    if cache.shape[-1] == MODEL1_BYTES_PER_TOKEN:
        return dequantize_model1_cache(cache, dtype)
    if cache.shape[-1] == V32_BYTES_PER_TOKEN:
        return dequantize_v32_cache(cache, dtype)
    raise ValueError(f"bytes per token {cache.shape[-1]}: supported 584 (MODEL1) or 656 (V3.2)")


def indices_from_positions(positions: torch.Tensor, block_table: torch.Tensor,
                           page_size: int) -> torch.Tensor:
    """Logical token positions [b, s_q, topk] (-1 = invalid) -> int32 cache indices
    ``block_table[b, pos // page_size] * page_size + pos % page_size`` (-1 kept)."""
    invalid = positions < 0
    pos = positions.clamp_min(0).long()
    blocks = torch.gather(block_table.long(), 1, (pos // page_size).flatten(1)).view_as(pos)
    idx = blocks * page_size + pos % page_size
    return idx.masked_fill(invalid, -1).to(torch.int32)

"""Quantisers and dequantisers for the lightning-indexer key formats (plain PyTorch).

Formats (as DeepGEMM's MQA-logits kernels read them):

- FP8 flat keys: ``k`` [S_kv, D] float8_e4m3fn and ``k_scale`` [S_kv] float32, one scale per token,
  ``scale = amax / 448`` (optionally rounded up to a power of two, "ue8m0").
- FP4 values: int8 [..., D/2], two e2m1 codes per byte, the **low nibble is the even element**.
  Scales are ue8m0 (power-of-two exponent bytes, value ``2**(byte-127)``) per 32 elements, four bytes
  packed little-endian into one int32 (byte g = group g); D=64 has two real groups and two padding
  bytes of 127 (= 1.0). So q_sf is int32 [..., H] and k_sf int32 [S_kv].
- Fused paged FP8 cache: uint8 [num_blocks, block_kv, 1, D+4]. Per block (row of stride(0) bytes,
  stride(0) may be padded): block_kv·D fp8 bytes (token-major), then block_kv float32 scales.
- Fused paged FP4 cache: uint8 [num_blocks, block_kv, 1, D/2+4]. Per block: block_kv·D/2 packed bytes,
  then block_kv int32 packed ue8m0 scales (68 B/token at D=128).
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_GROUP = 32
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# midpoints between consecutive e2m1 magnitudes; ties go to the even code (round half to even)
_E2M1_MID = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def ue8m0_ceil(x: torch.Tensor) -> torch.Tensor:
    """|x| rounded up to a power of two (exponent clamped to [1, 254]), as float32."""
    bits = x.abs().float().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).int()
    return (exp.clamp(1, 254) << 23).view(torch.float32)


# ----------------------------------------------------------------------------------------------
# FP8


def quant_fp8_per_token(x: torch.Tensor, use_ue8m0: bool = False):
    """x [N, D] -> (float8_e4m3fn [N, D], float32 scale [N]) with scale = max(amax, 1e-4) / 448."""
    amax = x.abs().float().amax(dim=-1).clamp(min=1e-4)
    sf = amax / FP8_MAX
    if use_ue8m0:
        sf = ue8m0_ceil(sf)
    return (x.float() / sf.unsqueeze(-1)).to(torch.float8_e4m3fn), sf


# ----------------------------------------------------------------------------------------------
# FP4 (e2m1 + ue8m0 per 32)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.int32, device=v.device)
    for i, mid in enumerate(_E2M1_MID):
        code += (a >= mid if i % 2 else a > mid).int()
    code = code | (((v < 0) & (code != 0)).int() << 3)
    return code


def quant_fp4_per_token(x: torch.Tensor):
    """x [..., D] (D in {64, 128} or any multiple of 32 up to 128) -> (int8 [..., D/2], int32 [...]).

    Per group of 32: scale = ue8m0_ceil(max(amax, 1e-4) / 6), codes = round_half_even(x / scale)."""
    *lead, d = x.shape
    if d % FP4_GROUP or d > 4 * FP4_GROUP:
        raise ValueError(f"quant_fp4_per_token: last dim {d} must be a multiple of 32 and <= 128")
    g = d // FP4_GROUP
    xg = x.float().reshape(*lead, g, FP4_GROUP)
    sf = ue8m0_ceil(xg.abs().amax(dim=-1).clamp(min=1e-4) / FP4_MAX)  # [..., g]
    codes = _e2m1_codes(xg / sf.unsqueeze(-1)).reshape(*lead, d // 2, 2)
    packed = (codes[..., 0] | (codes[..., 1] << 4)).to(torch.uint8).view(torch.int8)
    exp = (sf.view(torch.int32) >> 23) & 0xFF
    pad = torch.full((*lead, 4 - g), 127, dtype=torch.int32, device=x.device)
    exp = torch.cat([exp, pad], dim=-1)
    packed_sf = exp[..., 0] | (exp[..., 1] << 8) | (exp[..., 2] << 16) | (exp[..., 3] << 24)
    return packed, packed_sf.to(torch.int32)


def unpack_ue8m0(sf: torch.Tensor, groups: int) -> torch.Tensor:
    """int32 [...] -> float32 [..., groups] scale values (byte g = group g, value 2**(byte-127);
    byte 0 decodes to 0 as in DeepGEMM's reference)."""
    b = torch.stack([(sf >> (8 * i)) & 0xFF for i in range(groups)], dim=-1)
    return (b << 23).view(torch.float32)


def dequant_fp4(packed: torch.Tensor, sf: torch.Tensor) -> torch.Tensor:
    """(int8 [..., D/2], int32 [...]) -> float32 [..., D]."""
    u = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([u & 0xF, u >> 4], dim=-1).flatten(-2)  # [..., D], even element first
    table = torch.tensor(_E2M1, device=packed.device)
    val = table[codes & 7]
    val = torch.where((codes & 8) != 0, -val, val)
    d = val.shape[-1]
    scale = unpack_ue8m0(sf, d // FP4_GROUP).repeat_interleave(FP4_GROUP, dim=-1)
    return val * scale


# ----------------------------------------------------------------------------------------------
# Fused paged caches


def _alloc_blocks(num_blocks: int, block_bytes: int, block_stride: int | None, device):
    stride = block_bytes if block_stride is None else block_stride
    if stride < block_bytes or stride % 4:
        raise ValueError(f"block_stride {stride} must be >= {block_bytes} and a multiple of 4")
    flat = torch.zeros(num_blocks * stride, dtype=torch.uint8, device=device)
    return flat, stride


def quant_fp8_paged_cache(x: torch.Tensor, block_stride: int | None = None, use_ue8m0: bool = False):
    """x [num_blocks, block_kv, D] (or [.., 1, D]) -> fused uint8 cache [num_blocks, block_kv, 1, D+4].

    ``block_stride`` (bytes, >= block_kv·(D+4), multiple of 4) gives a padded stride(0)."""
    if x.dim() == 4:
        x = x.squeeze(2)
    nb, bkv, d = x.shape
    vals, sf = quant_fp8_per_token(x.reshape(-1, d), use_ue8m0)
    flat, stride = _alloc_blocks(nb, bkv * (d + 4), block_stride, x.device)
    rows = flat.view(nb, stride)
    rows[:, : bkv * d] = vals.view(torch.uint8).reshape(nb, bkv * d)
    rows[:, bkv * d: bkv * (d + 4)] = sf.reshape(nb, bkv).contiguous().view(torch.uint8)
    return torch.as_strided(flat, (nb, bkv, 1, d + 4), (stride, d + 4, d + 4, 1))


def quant_fp4_paged_cache(x: torch.Tensor, block_stride: int | None = None):
    """x [num_blocks, block_kv, D] (or [.., 1, D]) -> fused uint8 cache [num_blocks, block_kv, 1, D/2+4]."""
    if x.dim() == 4:
        x = x.squeeze(2)
    nb, bkv, d = x.shape
    vals, sf = quant_fp4_per_token(x.reshape(-1, d))
    tok = d // 2 + 4
    flat, stride = _alloc_blocks(nb, bkv * tok, block_stride, x.device)
    rows = flat.view(nb, stride)
    rows[:, : bkv * d // 2] = vals.view(torch.uint8).reshape(nb, bkv * d // 2)
    rows[:, bkv * d // 2: bkv * tok] = sf.reshape(nb, bkv).contiguous().view(torch.uint8)
    return torch.as_strided(flat, (nb, bkv, 1, tok), (stride, tok, tok, 1))


def paged_cache_parts(cache: torch.Tensor, head_dim: int, fp4: bool):
    """Split a fused cache into (values uint8 [nb, bkv, bytes_per_token], scales [nb, bkv]) views:
    float32 scales for FP8, int32 packed ue8m0 for FP4. Handles a padded stride(0)."""
    nb, bkv = cache.shape[0], cache.shape[1]
    vbytes = head_dim // 2 if fp4 else head_dim
    stride = cache.stride(0)
    base = cache.storage_offset()
    storage = cache.untyped_storage()
    u8 = torch.empty(0, dtype=torch.uint8, device=cache.device).set_(storage)
    vals = torch.as_strided(u8, (nb, bkv, vbytes), (stride, vbytes, 1), base)
    assert stride % 4 == 0 and (base + bkv * vbytes) % 4 == 0
    sdt = torch.int32 if fp4 else torch.float32
    s32 = torch.empty(0, dtype=sdt, device=cache.device).set_(storage)
    scales = torch.as_strided(s32, (nb, bkv), (stride // 4, 1), (base + bkv * vbytes) // 4)
    return vals, scales


def dequant_paged_cache(cache: torch.Tensor, head_dim: int, fp4: bool) -> torch.Tensor:
    """Fused cache -> float32 [num_blocks, block_kv, head_dim]."""
    vals, scales = paged_cache_parts(cache, head_dim, fp4)
    if fp4:
        return dequant_fp4(vals.contiguous().view(torch.int8), scales.contiguous())
    return vals.contiguous().view(torch.float8_e4m3fn).float() * scales.unsqueeze(-1)

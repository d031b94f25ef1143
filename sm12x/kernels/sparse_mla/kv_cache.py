"""FP8 sparse-MLA KV-cache formats (FlashMLA's), in plain PyTorch: quantisers, dequantisers and
the index helper. Used by tests, benchmarks and the reference; the Triton kernel reads the same bytes.

MODEL1 (DeepSeek-V4; d_qk = d_v = 512; 584 B per token). Per page of B tokens:
  bytes [0, B*576):          token t at t*576: 448 fp8 e4m3 NoPE, then 64 bf16 RoPE;
  bytes [B*576, B*584):      token t at B*576 + t*8: 7 UE8M0 scales (one per 64 NoPE values), 1 pad;
  the page stride is padded up to a multiple of 576 bytes (or any larger ``page_stride``).
  The cache is viewed [num_blocks, B, 1, 584] uint8 with stride(0) = page bytes, stride(1) = 584.

V3.2 / GLM-5 (d_qk = 576, d_v = 512; 656 B per token, inline): 512 fp8 e4m3 NoPE, 4 fp32 scales (one
per 128 NoPE values), 64 bf16 RoPE. Viewed [num_blocks, B, 1, 656], stride(1) = 656.

V4.1 (d_qk = d_v = 512; FlashMLA's formats, chosen by the caller's declared format, never by size
alone: a block-split cache has the same bytes per token as an interleaved one):
  528 B per token: 512 fp8 e4m3 (the RoPE dims quantised too), 16 UE8M0 scales, one per 32 values.
    Interleaved (FlashMLA 2026.09.30 and later; SGLang "v41_new"): token t at t*528, its 512 data
    bytes then its 16 scale bytes. Block-split (before; SGLang "v41", FlashInfer "fp8_dsv41"): a page
    holds B data rows of 512 bytes, then B scale rows of 16.
  288 B per token (only as the extra cache beside a 528 main cache): 512 e2m1 values in 256 bytes
    (the even-indexed value in the low nibble), 32 e4m3 scales, one per 16 values; interleaved or
    block-split as above (256-byte data rows, then 32-byte scale rows).
  Viewed [num_blocks, B, 1, 528 | 288], stride(1) = bytes per token.

Scales are ``amax / 448`` clamped to >= 1e-4 and rounded up to a power of two, so dequantising to
bf16 is exact; the FP4 format's e4m3 scales are ``amax / 6`` rounded to e4m3 (an e2m1 value times
an e4m3 scale has at most 5 significant bits, so its bf16 dequantisation is exact too).
"""
from __future__ import annotations

import torch

MODEL1_BYTES_PER_TOKEN = 584  # 448 fp8 + 64*2 bf16 + 7 scales + 1 pad
V32_BYTES_PER_TOKEN = 656     # 512 fp8 + 4*4 fp32 scales + 64*2 bf16
V41_BYTES_PER_TOKEN = 528     # 512 fp8 + 16 UE8M0 scales
V41_FP4_BYTES_PER_TOKEN = 288  # 256 bytes of e2m1 pairs + 32 e4m3 scales
FP8_MAX = 448.0
FP4_MAX = 6.0
# the declared formats of the V4.1 caches: (bytes per token, interleaved)
V41_FORMATS = {"v41": (528, True), "v41_block_split": (528, False),
               "v41_fp4": (288, True), "v41_fp4_block_split": (288, False)}


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


def _pages(cache: torch.Tensor, bpt: int) -> torch.Tensor:
    """uint8 [num_blocks, B * bpt] rows of a [num_blocks, B, 1, bpt] view (any stride(0))."""
    raw = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
    nb, B = raw.shape[0], raw.shape[1]
    return raw.as_strided((nb, B * bpt), (raw.stride(0), 1), raw.storage_offset())


def _split(pages: torch.Tensor, B: int, data: int, scales: int, interleaved: bool):
    """(data [nb, B, data], scales [nb, B, scales]) byte views of V4.1 pages."""
    nb = pages.shape[0]
    if interleaved:
        tok = pages.reshape(nb, B, data + scales)
        return tok[..., :data], tok[..., data:]
    return pages[:, : B * data].reshape(nb, B, data), pages[:, B * data:].reshape(nb, B, scales)


def _v41_arena(nb, B, bpt, page_stride, device):
    stride = _page_stride(B * bpt, page_stride, 16)
    return torch.zeros(nb, stride, dtype=torch.uint8, device=device), stride


def quantize_v41_cache(kv: torch.Tensor, interleaved: bool = True, page_stride: int | None = None):
    """bf16/fp32 ``kv`` [num_blocks, B, 512] -> uint8 V4.1 cache view [num_blocks, B, 1, 528]."""
    nb, B, d = kv.shape
    assert d == 512, "V4.1 caches hold 512-dim tokens"
    arena, stride = _v41_arena(nb, B, V41_BYTES_PER_TOKEN, page_stride, kv.device)
    data, sc = _split(arena[:, : B * V41_BYTES_PER_TOKEN], B, 512, 16, interleaved)
    scales = _pow2_scales(kv, 32)                                    # [nb, B, 16]
    data.copy_(_to_fp8_bytes(kv, scales, 32))
    sc.copy_((torch.log2(scales).round().to(torch.int32) + 127).to(torch.uint8))
    return arena.as_strided((nb, B, 1, V41_BYTES_PER_TOKEN), (stride, V41_BYTES_PER_TOKEN,
                                                              V41_BYTES_PER_TOKEN, 1))


def dequantize_v41_cache(cache: torch.Tensor, interleaved: bool, dtype=torch.bfloat16) -> torch.Tensor:
    """V4.1 cache view [num_blocks, B, 1, 528] -> [num_blocks, B, 512] ``dtype``."""
    B = cache.shape[1]
    data, sc = _split(_pages(cache, V41_BYTES_PER_TOKEN), B, 512, 16, interleaved)
    vals = data.contiguous().view(torch.float8_e4m3fn).float().unflatten(-1, (16, 32))
    exps = torch.exp2(sc.to(torch.int32).float() - 127)
    return (vals * exps.unsqueeze(-1)).flatten(-2).to(dtype)


_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """The e2m1 code (int64 0..15: sign bit 3, magnitude index 0..7) nearest each value of ``v``
    (|v| <= 6); a tie takes the smaller magnitude. The dequantiser, not this rounding, defines the
    format: tests compare kernels with the dequantised values."""
    table = torch.tensor(_E2M1, device=v.device)
    mag = (v.abs().unsqueeze(-1) - table).abs().argmin(dim=-1)
    return torch.where((v < 0) & (mag > 0), mag | 8, mag)


def quantize_v41_fp4_cache(kv: torch.Tensor, interleaved: bool = True, page_stride: int | None = None):
    """bf16/fp32 ``kv`` [num_blocks, B, 512] -> uint8 V4.1 FP4 cache view [num_blocks, B, 1, 288]:
    per 16 values an e4m3 scale ``amax / 6`` (clamped to >= 2**-9, e4m3's smallest subnormal), and
    the nearest e2m1 code of each value / scale."""
    nb, B, d = kv.shape
    assert d == 512, "V4.1 caches hold 512-dim tokens"
    arena, stride = _v41_arena(nb, B, V41_FP4_BYTES_PER_TOKEN, page_stride, kv.device)
    data, sc = _split(arena[:, : B * V41_FP4_BYTES_PER_TOKEN], B, 256, 32, interleaved)
    x = kv.float().unflatten(-1, (32, 16))
    scales = (x.abs().amax(-1) / FP4_MAX).clamp(min=2.0 ** -9).to(torch.float8_e4m3fn)  # [nb, B, 32]
    codes = _e2m1_codes((x / scales.float().unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX)).flatten(-2)
    pairs = codes.unflatten(-1, (256, 2))  # even-indexed value in the low nibble
    data.copy_((pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8))
    sc.copy_(scales.view(torch.uint8))
    return arena.as_strided((nb, B, 1, V41_FP4_BYTES_PER_TOKEN), (stride, V41_FP4_BYTES_PER_TOKEN,
                                                                  V41_FP4_BYTES_PER_TOKEN, 1))


def dequantize_v41_fp4_cache(cache: torch.Tensor, interleaved: bool, dtype=torch.bfloat16) -> torch.Tensor:
    """V4.1 FP4 cache view [num_blocks, B, 1, 288] -> [num_blocks, B, 512] ``dtype``."""
    B = cache.shape[1]
    data, sc = _split(_pages(cache, V41_FP4_BYTES_PER_TOKEN), B, 256, 32, interleaved)
    u = data.to(torch.int64)
    codes = torch.stack([u & 15, u >> 4], dim=-1).flatten(-2)        # [nb, B, 512], even first
    table = torch.tensor(_E2M1, device=cache.device)
    vals = torch.where(codes >= 8, -table[codes & 7], table[codes & 7]).unflatten(-1, (32, 16))
    scales = sc.contiguous().view(torch.float8_e4m3fn).float()
    return (vals * scales.unsqueeze(-1)).flatten(-2).to(dtype)


def dequantize_cache(cache: torch.Tensor, dtype=torch.bfloat16, kv_format: str | None = None) -> torch.Tensor:
    """Any format: 584 (MODEL1) and 656 (V3.2) by bytes per token; the V4.1 caches (528, 288) only
    with their declared ``kv_format`` (a key of ``V41_FORMATS``): the two arrangements of each have
    the same bytes per token, so the size alone would misread one of them."""
    bpt = cache.shape[-1]
    if kv_format is None:
        if bpt == MODEL1_BYTES_PER_TOKEN:
            return dequantize_model1_cache(cache, dtype)
        if bpt == V32_BYTES_PER_TOKEN:
            return dequantize_v32_cache(cache, dtype)
        if bpt in (V41_BYTES_PER_TOKEN, V41_FP4_BYTES_PER_TOKEN):
            raise ValueError(f"dequantize_cache: argument 'kv_format' got None for a {bpt}-byte V4.1 "
                             f"cache; supported: one of {sorted(V41_FORMATS)} (the arrangement is "
                             f"declared, never guessed)")
        raise ValueError(f"dequantize_cache: argument 'cache' got {bpt} bytes per token; supported: "
                         f"584 (MODEL1), 656 (V3.2), 528 / 288 (V4.1, with kv_format)")
    if kv_format not in V41_FORMATS or V41_FORMATS[kv_format][0] != bpt:
        raise ValueError(f"dequantize_cache: argument 'kv_format' got {kv_format!r} for {bpt} bytes per "
                         f"token; supported: " + ", ".join(f"{k} ({v[0]} B)" for k, v in V41_FORMATS.items()))
    interleaved = V41_FORMATS[kv_format][1]
    if bpt == V41_BYTES_PER_TOKEN:
        return dequantize_v41_cache(cache, interleaved, dtype)
    return dequantize_v41_fp4_cache(cache, interleaved, dtype)


def indices_from_positions(positions: torch.Tensor, block_table: torch.Tensor,
                           page_size: int) -> torch.Tensor:
    """Logical token positions [b, s_q, topk] (-1 = invalid) -> int32 cache indices
    ``block_table[b, pos // page_size] * page_size + pos % page_size`` (-1 kept)."""
    invalid = positions < 0
    pos = positions.clamp_min(0).long()
    blocks = torch.gather(block_table.long(), 1, (pos // page_size).flatten(1)).view_as(pos)
    idx = blocks * page_size + pos % page_size
    return idx.masked_fill(invalid, -1).to(torch.int32)

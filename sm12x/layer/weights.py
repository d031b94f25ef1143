"""Random weights of one V4-Flash layer in the checkpoint's dtypes and scale formats.

- FP8 linears (wq_a, wq_b, wkv, the indexer's wq_b, wo_a, wo_b, the shared expert): e4m3 values
  with float32 power-of-two (UE8M0) scales per 128 x 128 block, as the checkpoint's
  ``weight_scale_inv``; ``wo_a`` is [o_groups, o_lora, heads_per_group * 512] with scales
  [o_groups, o_lora / 128, heads_per_group * 4].
- Routed experts: MXFP4, packed e2m1 int8 [E, N, K/2] (low nibble first) with float32
  power-of-two scales per 1 x 32 ([E, N, K/32]; the checkpoint's float8_e8m0fnu bytes hold the
  same exponents). w13 stacks gate then up rows ([E, 2 * inter, hidden]).
- bf16: the compressors' wkv / wgate, the indexer's weights_proj, the gate; float32: norms,
  ``ape``, the attention sink, the mHC mixing matrices, scales and biases, the gate bias.

Values are drawn so that activations stay near unit scale through the layer (weights ~ N(0, 1/K)).
"""
from __future__ import annotations

import dataclasses

import torch

from sm12x.kernels.gemm.scales import ceil_to_ue8m0
from sm12x.kernels.moe.fp4 import quantize_e2m1, unpack_e2m1
from sm12x.layer.config import LayerConfig

FP8_MAX = 448.0


@dataclasses.dataclass
class Fp8Weight:
    """e4m3 values [*G, N, K] and float32 UE8M0 scales [*G, N/128, K/128]."""

    q: torch.Tensor
    sf: torch.Tensor

    def dequant(self) -> torch.Tensor:
        s = self.sf.repeat_interleave(128, -2)[..., : self.q.shape[-2], :].repeat_interleave(128, -1)
        return self.q.float() * s[..., : self.q.shape[-1]]


@dataclasses.dataclass
class Fp4Experts:
    """Packed e2m1 [E, N, K/2] and float32 UE8M0 scales [E, N, K/32]."""

    q: torch.Tensor
    sf: torch.Tensor

    def dequant(self, expert: int) -> torch.Tensor:
        return unpack_e2m1(self.q[expert]) * self.sf[expert].repeat_interleave(32, -1)


def _fp8_block(w: torch.Tensor) -> Fp8Weight:
    *lead, n, k = w.shape
    nb, kb = -(-n // 128), k // 128
    wp = torch.nn.functional.pad(w, (0, 0, 0, nb * 128 - n)).reshape(*lead, nb, 128, kb, 128)
    sf = ceil_to_ue8m0(wp.abs().amax(dim=(-3, -1)).clamp(min=1e-4) / FP8_MAX)  # [*G, nb, kb]
    q = (wp / sf[..., :, None, :, None]).reshape(*lead, nb * 128, k)[..., :n, :].to(torch.float8_e4m3fn)
    return Fp8Weight(q.contiguous(), sf.contiguous())


@dataclasses.dataclass
class LayerWeights:
    cfg: LayerConfig
    t: dict  # name -> tensor, Fp8Weight or Fp4Experts


def make_weights(cfg: LayerConfig, device="cpu", seed: int = 0) -> LayerWeights:
    """Random weights for ``cfg``, drawn on ``device`` (deterministic in ``seed`` per device type)."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, d, ih, idim = cfg.hidden, cfg.head_dim, cfg.index_heads, cfg.index_dim

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device=device) * scale

    def lin(n, k):
        return randn(n, k, scale=k ** -0.5)

    def fp8(n, k):
        return _fp8_block(lin(n, k))

    def norm(n):
        return 1.0 + randn(n, scale=0.1)

    t = {}
    for site in ("attn", "ffn"):
        t[f"hc_{site}_fn"] = randn(cfg.hc_mix, cfg.hc_mult * h, scale=(cfg.hc_mult * h) ** -0.5)
        t[f"hc_{site}_scale"] = 0.5 + randn(3, scale=0.1).abs()
        t[f"hc_{site}_base"] = randn(cfg.hc_mix, scale=0.5)
        t[f"{site}_norm"] = norm(h)
    t["wq_a"], t["q_norm"], t["wq_b"] = fp8(cfg.q_lora, h), norm(cfg.q_lora), fp8(cfg.heads * d, cfg.q_lora)
    t["wkv"], t["kv_norm"] = fp8(d, h), norm(d)
    coff = 2 if cfg.compress_ratio == 4 else 1  # ratio 4 overlaps two blocks: two halves of channels
    for name, width in (("c", d), ("ic", idim)):
        t[f"{name}_wkv"] = lin(coff * width, h).to(torch.bfloat16)
        t[f"{name}_wgate"] = lin(coff * width, h).to(torch.bfloat16)
        t[f"{name}_ape"] = randn(cfg.compress_ratio, coff * width, scale=0.5)
        t[f"{name}_norm"] = norm(width)
    t["idx_wq_b"] = fp8(ih * idim, cfg.q_lora)
    t["idx_weights_proj"] = lin(ih, h).to(torch.bfloat16)
    t["attn_sink"] = randn(cfg.heads)
    r = cfg.heads_per_group * d
    t["wo_a"] = _fp8_block(randn(cfg.o_groups, cfg.o_lora, r, scale=r ** -0.5))
    t["wo_b"] = fp8(h, cfg.o_groups * cfg.o_lora)
    t["gate"] = lin(cfg.experts, h).to(torch.bfloat16)
    t["gate_bias"] = randn(cfg.experts, scale=0.1)
    t["shared_w13"], t["shared_w2"] = fp8(2 * cfg.shared_inter, h), fp8(h, cfg.shared_inter)
    for name, (n, k) in (("w13", (2 * cfg.moe_inter, h)), ("w2", (h, cfg.moe_inter))):
        qs, sfs = [], []
        for _ in range(cfg.experts):  # one expert at a time: V4-Flash's w13 in float32 is 16 GiB
            q, sf = quantize_e2m1(lin(n, k), 32)
            qs.append(q)
            sfs.append(sf)
        t[f"experts_{name}"] = Fp4Experts(torch.stack(qs), torch.stack(sfs))
    return LayerWeights(cfg, t)

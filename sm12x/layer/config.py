"""Shapes of one DeepSeek-V4-Flash decoder layer (the checkpoint's ``config.json``) and the small
widths the CPU runs use.

``V4_FLASH`` is a compressed-sparse-attention layer (compress ratio 4, with the lightning indexer) of
DeepSeek-V4-Flash: hidden 4096, 64 query heads of 512 (the last 64 rotary), one shared 512-wide
KV vector per token, q_lora 1024, the grouped output projection (8 groups of 1024), window 128,
indexer 64 heads x 128 with top-512, 256 routed MXFP4 experts (top 6, intermediate 2048) plus one
shared FP8 expert, the mHC residual of 4 streams with 20 Sinkhorn iterations. ``small()`` keeps every
fixed width a kernel requires (head dim 512, rope 64, indexer head dim 128, K a multiple of 128) and
shrinks the rest so the Triton interpreter gets through a step of a layer in a few seconds.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LayerConfig:
    hidden: int = 4096
    heads: int = 64
    head_dim: int = 512            # d_qk = d_v = 512 (MODEL1), the last rope_dim rotary
    rope_dim: int = 64
    q_lora: int = 1024
    o_groups: int = 8
    o_lora: int = 1024
    window: int = 128              # sliding-window tokens every query attends
    compress_ratio: int = 4        # CSA layer: one compressed entry per 4 tokens (overlapping windows)
    index_heads: int = 64
    index_dim: int = 128
    index_topk: int = 512
    experts: int = 256
    experts_per_token: int = 6
    moe_inter: int = 2048
    shared_inter: int = 2048
    routed_scale: float = 1.5
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_eps: float = 1e-6
    rope_theta: float = 160000.0   # compress_rope_theta: compressed layers rotate with it
    cache_block: int = 64          # tokens per page of the SWA cache and entries per page of the others

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.o_groups

    @property
    def hc_mix(self) -> int:
        """Rows of the mHC mixing matrix: pre (hc), post (hc) and the hc x hc combination."""
        return self.hc_mult * (2 + self.hc_mult)

    def check(self) -> "LayerConfig":
        for name, value in (("hidden", self.hidden), ("q_lora", self.q_lora), ("moe_inter", self.moe_inter),
                            ("shared_inter", self.shared_inter), ("o_lora", self.o_lora)):
            if value % 128:
                raise ValueError(f"sm12x layer config: {name} {value} must be a multiple of 128 (FP8 K blocks)")
        if self.head_dim != 512 or self.rope_dim != 64:
            raise ValueError(f"sm12x layer config: head_dim {self.head_dim} / rope_dim {self.rope_dim}: "
                             "the MODEL1 cache holds 512-dim tokens with 64 rotary dims")
        if self.heads % self.o_groups:
            raise ValueError(f"sm12x layer config: heads {self.heads} must split into o_groups {self.o_groups}")
        if self.index_dim != 128 or self.index_heads not in (8, 16, 32, 64):
            raise ValueError(f"sm12x layer config: indexer {self.index_heads} x {self.index_dim}: "
                             "head dim 128 and 8, 16, 32 or 64 heads")
        return self


V4_FLASH = LayerConfig().check()


def small() -> LayerConfig:
    """The widths of the CPU runs (the Triton interpreter): every kernel constraint of V4-Flash kept.
    The dense FP8 GEMMs keep K >= 256 (shared_inter): ``fp8_gemm_nt`` called without a recipe, as
    SGLang calls it, reads the one packed UE8M0 word of a K = 128 operand as four 1 x 32 scales
    (V4-Flash's smallest dense K is 1,024)."""
    return LayerConfig(hidden=256, heads=4, q_lora=256, o_groups=2, o_lora=128, window=16,
                       index_heads=8, index_topk=8, experts=8, experts_per_token=2, moe_inter=128,
                       shared_inter=256, cache_block=32).check()

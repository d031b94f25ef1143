"""The parts of a V4-Flash layer that no patch replaces, in plain PyTorch, shared by the patched
forward and the float32 reference (each calls them on its own activations): RMSNorm, the
interleaved rotary embedding, the Hadamard rotation, the compressor's gated pooling, the mHC
Sinkhorn split and the stream mix, the MoE gate, the clamped SwiGLU, and the FP8 quantisers the
checkpoint's math applies (activations per 1 x 128, the KV cache per 64, the indexer per token),
all with UE8M0 (power-of-two) scales.
"""
from __future__ import annotations

import functools
import math

import torch

from sm12x.kernels.gemm.scales import ceil_to_ue8m0

FP8_MAX = 448.0


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """float32 RMSNorm over the last dim (``weight`` None: no weight, V4's per-head q norm)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.float()


def rope(x: torch.Tensor, positions: torch.Tensor, rope_dim: int, theta: float, inverse: bool = False):
    """Rotate the last ``rope_dim`` dims of ``x`` [T, ..., D] in interleaved pairs (element 2i with
    2i + 1) by position [T] (``inverse``: the opposite angle, V4's de-rotation of the attention
    output, whose V carries rotated dims). float32 result."""
    xf = x.float()
    half = rope_dim // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) * 2 / rope_dim)
    ang = positions.float()[:, None] * freqs[None, :]                       # [T, half]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [half]
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    if inverse:
        sin = -sin
    r = xf[..., -rope_dim:].unflatten(-1, (half, 2))
    a, b = r[..., 0], r[..., 1]
    rot = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((xf[..., :-rope_dim], rot), dim=-1)


@functools.lru_cache(maxsize=4)
def _hadamard(n: int, device: str) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / math.sqrt(n)).to(device)


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard rotation of the last dim (a power of two), float32."""
    return x.float() @ _hadamard(x.shape[-1], str(x.device))


def compress(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, ratio: int, first: int, count: int):
    """Compressed entries ``first`` .. ``first + count - 1`` of one request from its tokens'
    projections ``kv`` / ``score`` [T, 2d] (float32; ratio 4 overlaps two blocks). Entry j pools, per
    channel c, softmax over candidates of (score + ape) weighting kv: the tokens of block j with the
    second half of the channels and those of block j - 1 with the first half (none before block 0).
    -> float32 [count, d]."""
    d = kv.shape[1] // 2
    if count <= 0:
        return kv.new_zeros((0, d), dtype=torch.float32)
    blocks_kv = kv[: (first + count) * ratio].float().view(-1, ratio, 2 * d)
    blocks_s = score[: (first + count) * ratio].float().view(-1, ratio, 2 * d) + ape.float()
    j = torch.arange(first, first + count, device=kv.device)
    prev = (j - 1).clamp_min(0)
    cand_kv = torch.cat((blocks_kv[j, :, d:], blocks_kv[prev, :, :d]), dim=1)        # [count, 2r, d]
    prev_s = blocks_s[prev, :, :d].masked_fill((j == 0)[:, None, None], float("-inf"))
    w = torch.softmax(torch.cat((blocks_s[j, :, d:], prev_s), dim=1), dim=1)
    return (w * cand_kv).sum(1)


def hc_split(mix: torch.Tensor, sqr_sum: torch.Tensor, k: int, scale: torch.Tensor, base: torch.Tensor,
             hc: int, iters: int, rms_eps: float, hc_eps: float):
    """mHC: the [T, hc * (2 + hc)] mixes (x . fn^T, before the RMS factor) and sum(x^2) [T] over
    the K = hc * hidden stream values -> (pre [T, hc], post [T, hc], comb [T, hc, hc]): pre =
    sigmoid + eps, post = 2 sigmoid, comb = Sinkhorn (row softmax + eps, then column / row
    normalisations, ``iters`` in all, ending on a column one)."""
    m = mix.float() * torch.rsqrt(sqr_sum.float() / k + rms_eps)[:, None]
    pre = torch.sigmoid(m[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(m[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = (m[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(-1, hc, hc)
    comb = torch.softmax(comb, dim=-1) + hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    return pre, post, comb


def hc_combine(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """Layer input sum_k pre_k x_k from the streams [T, hc, H] -> float32 [T, H]."""
    return (pre[:, :, None] * streams.float()).sum(1)


def hc_post(f: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """New streams y_j = post_j f + sum_i comb[i, j] x_i -> float32 [T, hc, H]."""
    return post[:, :, None] * f.float()[:, None, :] + torch.einsum("tij,tih->tjh", comb, streams.float())


def gate(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, topk: int, scale: float):
    """V4's router: scores sqrt(softplus(x W^T)) in float32; experts chosen by scores + bias; weights
    the chosen unbiased scores renormalised, times ``scale``. -> (ids int64 [T, k], weights [T, k])."""
    scores = torch.sqrt(torch.nn.functional.softplus(x.float() @ weight.float().T))
    ids = torch.topk(scores + bias, topk, dim=-1).indices
    return ids, routing_weights(scores, ids, scale)


def routing_weights(scores: torch.Tensor, ids: torch.Tensor, scale: float) -> torch.Tensor:
    w = scores.gather(1, ids)
    return w / w.sum(-1, keepdim=True) * scale


def gate_scores(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.nn.functional.softplus(x.float() @ weight.float().T))


def swiglu(h: torch.Tensor, limit: float | None) -> torch.Tensor:
    """silu(gate) * up on [T, 2 * inter] (gate first), float32; ``limit``: gate <= limit and
    up in [-limit, limit] (the routed experts' swiglu_limit)."""
    g, u = h.float().chunk(2, dim=-1)
    if limit:
        g, u = g.clamp(max=limit), u.clamp(-limit, limit)
    return torch.nn.functional.silu(g) * u


def quant_fp8(x: torch.Tensor, block: int):
    """x [..., K] -> (e4m3 [..., K], float32 UE8M0 scales [..., K / block]): amax / 448 per
    ``block`` values (clamped to >= 1e-4), rounded up to a power of two."""
    xb = x.float().unflatten(-1, (-1, block))
    sf = ceil_to_ue8m0(xb.abs().amax(-1, keepdim=True).clamp(min=1e-4) / FP8_MAX)
    return (xb / sf).flatten(-2).to(torch.float8_e4m3fn), sf.squeeze(-1)


def fake_quant(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` through :func:`quant_fp8` and back, float32: what the FP8 consumer sees."""
    q, sf = quant_fp8(x, block)
    return (q.float().unflatten(-1, (-1, block)) * sf[..., None]).flatten(-2)


def fake_quant_kv(kv: torch.Tensor, nope: int) -> torch.Tensor:
    """A MODEL1 cache token as read back: the first ``nope`` dims FP8 per 64, the rest bf16."""
    return torch.cat((fake_quant(kv[..., :nope], 64), kv[..., nope:].to(torch.bfloat16).float()), -1)

"""PyTorch reference of FlashMLA sparse decode (``flash_mla_with_kvcache`` with ``indices``), in fp32
from the dequantised cache.

For each query token (b, s): gather the rows named by ``indices[b, s]`` (and ``extra_indices``);
a row is invalid when its index is -1 (or outside [0, num_blocks * page_size)) or its position is
>= topk_length[b]. logits = (q . k) * softmax_scale; lse = logsumexp (natural log) over valid rows;
out = softmax @ V with V = k[:, :d_v]. A sink multiplies out by 1 / (1 + exp(sink - lse)) and does
not enter the returned lse. A query with no valid row gets out = 0 and lse = +inf.
"""
from __future__ import annotations

import torch

from sm12x.kernels.mla_kv_cache import dequantize_cache


def _gather(cache, indices, topk_length):
    """-> (rows fp32 [b, s_q, topk, d] with invalid rows zeroed, invalid mask [b, s_q, topk])."""
    kv = dequantize_cache(cache, torch.float32).flatten(0, 1)      # [num_blocks * B, d]
    b, s_q, topk = indices.shape
    idx = indices.long()
    invalid = (idx < 0) | (idx >= kv.shape[0])
    if topk_length is not None:
        pos = torch.arange(topk, device=idx.device).view(1, 1, topk)
        invalid |= pos >= topk_length.view(b, 1, 1).long()
    rows = kv.index_select(0, idx.masked_fill(invalid, 0).flatten()).view(b, s_q, topk, -1)
    # Zero before any arithmetic so NaN/Inf in rows we must not read never leak.
    rows = rows.masked_fill(invalid.unsqueeze(-1), 0.0)
    return rows, invalid


def ref_sparse_mla_decode(q, k_cache, indices, topk_length=None, attn_sink=None, extra_k_cache=None,
                          extra_indices=None, extra_topk_length=None, softmax_scale=None, d_v=512):
    """q [b, s_q, h_q, d_qk] -> (out bf16 [b, s_q, h_q, d_v], lse fp32 [b, h_q, s_q])."""
    b, s_q, h_q, d_qk = q.shape
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    rows, invalid = _gather(k_cache, indices, topk_length)
    if extra_k_cache is not None:
        rows1, invalid1 = _gather(extra_k_cache, extra_indices, extra_topk_length)
        rows, invalid = torch.cat([rows, rows1], 2), torch.cat([invalid, invalid1], 2)
    logits = torch.einsum("bshd,bsnd->bshn", q.float(), rows) * softmax_scale
    logits = logits.masked_fill(invalid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)                          # [b, s_q, h_q]
    lonely = lse == float("-inf")
    probs = torch.exp(logits - lse.masked_fill(lonely, 0.0).unsqueeze(-1))
    out = torch.einsum("bshn,bsnd->bshd", probs, rows[..., :d_v])
    if attn_sink is not None:
        sink = attn_sink.float().view(1, 1, h_q)
        out = out * (1.0 / (1.0 + torch.exp(sink - lse))).unsqueeze(-1)
    out = out.masked_fill(lonely.unsqueeze(-1), 0.0)
    lse = lse.masked_fill(lonely, float("inf"))
    return out.to(torch.bfloat16), lse.transpose(1, 2)

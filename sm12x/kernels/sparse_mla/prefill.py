"""Sparse MLA prefill on bf16 KV rows (FlashMLA ``flash_mla_sparse_fwd`` semantics) in Triton.

The sparse decode kernel (``sparse_mla_decode``) with each candidate read as a bf16 row instead of
an FP8 cache entry: every query token is its own request with one candidate list.

Contract (FlashMLA main since 2026-01-16, ``tests/ref.py``): q bf16 [s_q, h_q, d_qk] (d_qk 512 or
576), kv bf16 [s_kv, 1, d_qk] (V = the first 512 dims), indices int32 [s_q, 1, topk] (invalid:
< 0 or >= s_kv; positions >= topk_length[i] too), attn_sink fp32 [h_q], topk_length int32 [s_q].
With P = (q . k) * sm_scale over the valid candidates:

    out = softmax(P) @ V * 1 / (1 + exp(sink - lse))   (bf16 [s_q, h_q, 512])
    max_logits = max P,  lse = logsumexp P             (fp32 [s_q, h_q], natural log, no sink)

A row with no valid candidate gets out 0, max_logits -inf, lse +inf. Any h_q is accepted (FlashMLA
takes 64 and 128 only; callers pad to those, with uninitialised heads that stay in their rows).
Rows are split across programs as in decode when there are too few to fill the GPU (a few query
tokens); the plan and workspace depend on shapes only (CUDA-graph safe).
"""
from __future__ import annotations

import torch

from sm12x.kernels.common import checks
from sm12x.kernels.sparse_mla.decode import D_V, _rows_aligned, launch, plan

OP = "flash_mla_sparse_fwd"


def validate(op, q, kv, indices, topk_length, attn_sink, d_v):
    """Raise ValueError naming ``op`` and the argument for anything the kernel does not handle."""
    checks.require_dtype(q, (torch.bfloat16,), op, "q")
    checks.require(q.dim() == 3 and q.shape[-1] in (512, 576) and q.stride(-1) == 1, op, "q",
                   lambda: f"shape {list(q.shape)} strides {tuple(q.stride())}",
                   "[s_q, h_q, d_qk] with d_qk 512 or 576 and a contiguous last dimension")
    s_q, h_q, d_qk = q.shape
    checks.require(s_q > 0 and h_q > 0, op, "q", lambda: f"shape {list(q.shape)}",
                   "non-empty s_q and h_q")
    checks.require(d_v == D_V, op, "d_v", d_v, "512")
    checks.require_dtype(kv, (torch.bfloat16,), op, "kv")
    checks.require(kv.dim() == 3 and kv.shape[1] == 1 and kv.shape[2] == d_qk
                   and kv.stride(-1) == 1, op, "kv",
                   lambda: f"shape {list(kv.shape)} strides {tuple(kv.stride())}",
                   f"[s_kv, 1, {d_qk}] with a contiguous last dimension")
    # The kernel tells the compiler that rows start on 16-byte boundaries (vector loads).
    checks.require(kv.data_ptr() % 16 == 0 and (kv.shape[0] <= 1 or kv.stride(0) % 8 == 0),
                   op, "kv", lambda: f"data_ptr % 16 = {kv.data_ptr() % 16}, "
                   f"stride(0) {kv.stride(0)}", "16-byte aligned rows")
    checks.require_same_device(op, q, kv=kv)
    checks.require_dtype(indices, (torch.int32,), op, "indices")
    checks.require(indices.dim() == 3 and indices.shape[0] == s_q and indices.shape[1] == 1
                   and indices.shape[2] > 0 and indices.stride(2) == 1, op, "indices",
                   lambda: f"shape {list(indices.shape)} strides {tuple(indices.stride())}",
                   f"[{s_q}, 1, topk > 0] with a contiguous last dimension")
    checks.require_same_device(op, q, indices=indices)
    if topk_length is not None:
        checks.require_dtype(topk_length, (torch.int32,), op, "topk_length")
        checks.require_shape(topk_length, (s_q,), op, "topk_length")
        checks.require_same_device(op, q, topk_length=topk_length)
    if attn_sink is not None:
        checks.require_dtype(attn_sink, (torch.float32,), op, "attn_sink")
        checks.require_shape(attn_sink, (h_q,), op, "attn_sink")
        checks.require_same_device(op, q, attn_sink=attn_sink)


def sparse_mla_prefill(q, kv, indices, sm_scale, d_v=D_V, attn_sink=None, topk_length=None,
                       out=None, num_splits=None, op=OP):
    """-> (out bf16 [s_q, h_q, 512], max_logits fp32 [s_q, h_q], lse fp32 [s_q, h_q]); see the
    module docstring. ``out`` may be given (bf16 [s_q, h_q, 512], 16-byte aligned rows);
    ``num_splits`` cuts every row into that many parts (default: from shapes and SMs)."""
    validate(op, q, kv, indices, topk_length, attn_sink, d_v)
    s_q, h_q, d_qk = q.shape
    if out is None:
        out = torch.empty((s_q, h_q, D_V), dtype=torch.bfloat16, device=q.device)
    checks.require(out.shape == (s_q, h_q, D_V) and out.dtype == torch.bfloat16
                   and out.stride(-1) == 1 and _rows_aligned(out), op, "out",
                   lambda: f"{out.dtype} {list(out.shape)} strides {tuple(out.stride())}",
                   f"bf16 [{s_q}, {h_q}, 512] with 16-byte aligned rows")
    max_logits = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    lse = torch.empty((s_q, h_q), dtype=torch.float32, device=q.device)
    if not _rows_aligned(q):
        q = q.clone(memory_format=torch.contiguous_format)
    # each query token is a request of one token: [s_q, 1, ...] views of the same memory
    pl = plan(s_q, 1, h_q, indices.shape[-1], 0, q.device, num_splits, fmt=f"bf16_{d_qk}",
              ragged=topk_length is not None)
    launch(q.unsqueeze(1), kv, indices, topk_length, attn_sink, None, None, None, sm_scale, pl,
           out.unsqueeze(1), lse.unsqueeze(1), max_logits=max_logits.unsqueeze(1), kv_bf16=True)
    return out, max_logits, lse

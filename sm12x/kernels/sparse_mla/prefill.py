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

DeepSeek-V4.1's caches in place of the bf16 rows (``kv_format``, a key of
``kv_cache.V41_FORMATS``: "v41" / "v41_block_split" 528 B e4m3 with UE8M0 per 32, "v41_fp4" /
"v41_fp4_block_split" 288 B e2m1 with e4m3 per 16): kv is then the uint8 / int8 / fp8 cache view
[num_blocks, B, 1, 528 | 288], d_qk 512, and indices name cache slots (block * B + offset; invalid:
< 0 or >= num_blocks * B). The arrangement is declared, never guessed (both have the same size).
Each tile's rows are gathered and dequantised to bf16 in registers (exact: power-of-two UE8M0
scales; an e2m1 value times an e4m3 scale has at most 5 significant bits) by the decode kernel's
load step, and the math is then the bf16 path's: the only error against the float32 reference
of the dequantised cache is the bf16 rounding of P and of out.
With ``SM12X_ATTENTION_PRECISION=fast`` on SM12x the block-scaled MXFP8 path serves bf16 rows
(:mod:`sm12x.kernels.sparse_mla.prefill_mxfp8`); otherwise two exact paths, chosen by shape
(``use_pipelined``; a V4.1 cache always takes the split path):

- split (the decode kernel): rows are split across programs when there are too few to fill the
  GPU (a few query tokens); the plan and workspace depend on shapes only (CUDA-graph safe).
- pipelined (``_sparse_prefill_kernel``): one program per (query token, head block), whole rows,
  no workspace. The bf16 rows feed both dots straight from the loads, so Triton's software
  pipeliner (``tl.range(num_stages=...)``) copies the next tiles' rows into a ring of shared
  buffers (``cp.async``) while the current tile computes, and the dots read them from there.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import checks, configs
from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess
from sm12x.kernels.sparse_mla import prefill_mxfp8
from sm12x.kernels.sparse_mla.decode import (LOG2E, V41_CODES, _check_cache, _rows_aligned, launch,
                                             prefill_max_block_h)
from sm12x.kernels.sparse_mla.decode_kernels import _dot, _to_bf16
from sm12x.kernels.sparse_mla.decode_plan import CONFIGS, D_V, pick_config, plan
from sm12x.kernels.sparse_mla.online_softmax import online_softmax_step

OP = "flash_mla_sparse_fwd"


# Pipelined path: launch configs by d_qk. The fp32 accumulator is BLOCK_H x 512; the pipeliner
# holds the next tile's BLOCK_N rows (d_qk bf16 each) in shared memory while the current one
# computes. sm_120 / sm_121 (101,376 B per block, no spills under triton 3.6-3.9; compile_reports):
# 32 x 32 (68 / 76 KB at d_qk 512 / 576, 180-186 registers); 64 x 16 spills 24 B under 3.7.1 at
# d_qk 512 and under all of them at 576, and 64 x 32 exceeds the shared memory. sm_90: 64 x 64 (197-221 KB) spills 264-368 B (triton 3.9), as the split path's
# 64 x 64 tile does there; on Hopper the QK dot here runs on both warpgroups (Triton lays out a dot
# whose result feeds another dot with all warps on the head axis), which the split path avoids.
# SM12X_SPARSE_MLA_PREFILL_CONFIG="BLOCK_H=64,BLOCK_N=32,num_warps=8,num_stages=3" overrides it.
PIPELINED_CONFIGS = {
    "sm_120": {512: {"BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2},
               576: {"BLOCK_H": 32, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}},
    "sm_90": {512: {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
              576: {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}},
}
# The pipelined path needs this many whole-row programs per SM: calls with fewer query tokens take
# the split path, which cuts rows to fill the GPU.
PIPELINED_MIN_WAVES = 2
# Per arch: the d_qk whose calls take the pipelined path by default (``use_pipelined``). At d_qk 576
# (V3.2) it beats the split path, with the sm_90 configs and with the sm_120 ones (those timed on
# the H200 as a proxy, not on an SM12x GPU); at d_qk 512 (MODEL1) the split path is faster with the
# sm_90 configs. Measurements: docs/performance.md, "Sparse MLA prefill" and "Tuning provenance".
PIPELINED_PATH = {"sm_90": (576,), "sm_120": (576,), "sm_121": (576,)}


def pipelined_config(d_qk, device):
    """The pipelined path's launch config for ``d_qk`` on ``device`` (env override applied)."""
    cfg = configs.pick(PIPELINED_CONFIGS, device)[d_qk]
    text = os.environ.get("SM12X_SPARSE_MLA_PREFILL_CONFIG", "").strip()
    if not text:
        return cfg
    cfg = dict(cfg)
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key.strip() not in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages"):
            raise ValueError(f"SM12X_SPARSE_MLA_PREFILL_CONFIG={text!r}: unknown key "
                             f"{key.strip()!r}")
        cfg[key.strip()] = int(value)
    return cfg


def use_pipelined(s_q, h_q, d_qk, device):
    """The pipelined path where the arch enables it (PIPELINED_PATH) and its whole-row programs
    fill the GPU PIPELINED_MIN_WAVES times; SM12X_SPARSE_MLA_PREFILL=pipelined|split forces a
    path."""
    forced = os.environ.get("SM12X_SPARSE_MLA_PREFILL", "").strip()
    if forced:
        if forced not in ("pipelined", "split"):
            raise ValueError(f"SM12X_SPARSE_MLA_PREFILL={forced!r}: supported pipelined, split")
        return forced == "pipelined"
    if d_qk not in PIPELINED_PATH.get(configs.arch_key(device), ()):
        return False
    programs = s_q * triton.cdiv(h_q, pipelined_config(d_qk, device)["BLOCK_H"])
    return programs >= PIPELINED_MIN_WAVES * configs.sm_count(device)


@triton.jit(do_not_specialize=["stride_qs", "stride_qh", "stride_kv", "S_KV", "stride_is",
                               "stride_os", "stride_oh", "H", "TOPK"])
def _sparse_prefill_kernel(q_ptr, stride_qs, stride_qh, kv_ptr, stride_kv, S_KV, idx_ptr,
                           stride_is, len_ptr, sink_ptr, out_ptr, stride_os, stride_oh, lse_ptr,
                           max_ptr, H, TOPK, qk_scale, HAS_ROPE: tl.constexpr,
                           HAS_LEN: tl.constexpr, HAS_SINK: tl.constexpr,
                           BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                           NUM_STAGES: tl.constexpr, INTERPRET: tl.constexpr):
    """Heads [hb * BLOCK_H, ...) of query token s (grid (head blocks, s_q)) over its whole
    candidate list: out, lse and max_logits as in the module docstring. ``qk_scale`` is
    sm_scale * log2(e) (base-2 online softmax). HAS_ROPE: d_qk 576 (dims 512..575 in a second
    QK dot), else 512. Pointers and row strides are 16-byte aligned (the launcher checks)."""
    hb = tl.program_id(0)
    s = tl.program_id(1)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    dv = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    q_row = tl.multiple_of(q_ptr + s.to(tl.int64) * stride_qs + heads * stride_qh, 16)
    q = tl.load(q_row[:, None] + dv[None, :], mask=hmask[:, None], other=0.0)
    if HAS_ROPE:
        q_rope = tl.load(q_row[:, None] + 512 + dr[None, :], mask=hmask[:, None], other=0.0)
    length = TOPK
    if HAS_LEN:
        length = tl.maximum(tl.minimum(tl.load(len_ptr + s), TOPK), 0)
    idx_row = idx_ptr + s.to(tl.int64) * stride_is
    ar = tl.arange(0, BLOCK_N)

    acc = tl.zeros((BLOCK_H, 512), dtype=tl.float32)
    m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for t in tl.range(0, tl.cdiv(length, BLOCK_N), num_stages=NUM_STAGES):
        pos = t * BLOCK_N + ar
        idx = tl.load(idx_row + pos, mask=pos < length, other=-1)
        valid = (idx >= 0) & (idx < S_KV)
        row = tl.multiple_of(kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv, 16)
        k = tl.load(row[:, None] + dv[None, :], mask=valid[:, None], other=0.0)
        qk = _dot(q, tl.trans(k), tl.zeros((BLOCK_H, BLOCK_N), dtype=tl.float32), INTERPRET)
        if HAS_ROPE:
            k_rope = tl.load(row[:, None] + 512 + dr[None, :], mask=valid[:, None], other=0.0)
            qk = _dot(q_rope, tl.trans(k_rope), qk, INTERPRET)
        p, alpha, m_new, l_i = online_softmax_step(qk, valid, qk_scale, m_i, l_i)
        acc = _dot(_to_bf16(p, INTERPRET), k, acc * alpha[:, None], INTERPRET)
        m_i = m_new

    has_any = l_i > 0.0
    lse2 = tl.where(has_any, m_i + tl.log2(tl.where(has_any, l_i, 1.0)), float("-inf"))
    lse = tl.where(has_any, lse2 * 0.6931471805599453, float("inf"))
    factor = tl.where(has_any, 1.0 / tl.where(has_any, l_i, 1.0), 0.0)
    if HAS_SINK:
        sink = tl.load(sink_ptr + heads, mask=hmask, other=float("-inf"))
        factor = tl.where(has_any, factor / (1.0 + tl.exp(sink - lse)), 0.0)  # +inf - +inf
    o_row = tl.multiple_of(out_ptr + s.to(tl.int64) * stride_os + heads * stride_oh, 16)
    tl.store(o_row[:, None] + dv[None, :], _to_bf16(acc * factor[:, None], INTERPRET),
             mask=hmask[:, None])
    tl.store(lse_ptr + s.to(tl.int64) * H + heads, lse, mask=hmask)
    tl.store(max_ptr + s.to(tl.int64) * H + heads, m_i * 0.6931471805599453, mask=hmask)


def _launch_pipelined(q, kv, indices, topk_length, attn_sink, sm_scale, out, max_logits, lse,
                      cfg):
    """The pipelined path on checked inputs (q with 16-byte aligned rows; max_logits and lse
    contiguous [s_q, h_q])."""
    s_q, h_q, d_qk = q.shape
    sink = attn_sink.contiguous() if attn_sink is not None else lse
    length = topk_length.contiguous() if topk_length is not None else indices
    grid = (triton.cdiv(h_q, cfg["BLOCK_H"]), s_q)
    _sparse_prefill_kernel[grid](
        q, q.stride(0), q.stride(1), kv, kv.stride(0), kv.shape[0], indices, indices.stride(0),
        length, sink, out, out.stride(0), out.stride(1), lse, max_logits, h_q,
        indices.shape[-1], float(sm_scale) * LOG2E, HAS_ROPE=d_qk == 576,
        HAS_LEN=topk_length is not None, HAS_SINK=attn_sink is not None,
        BLOCK_H=cfg["BLOCK_H"], BLOCK_N=cfg["BLOCK_N"], NUM_STAGES=cfg["num_stages"],
        INTERPRET=interpreting(), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])


def validate(op, q, kv, indices, topk_length, attn_sink, d_v, kv_format=None):
    """Raise ValueError naming ``op`` and the argument for anything the kernel does not handle;
    returns the kernel's code of ``kv_format`` (0: bf16 rows)."""
    checks.require_dtype(q, (torch.bfloat16,), op, "q")
    checks.require(q.dim() == 3 and q.shape[-1] in (512, 576) and q.stride(-1) == 1, op, "q",
                   lambda: f"shape {list(q.shape)} strides {tuple(q.stride())}",
                   "[s_q, h_q, d_qk] with d_qk 512 or 576 and a contiguous last dimension")
    s_q, h_q, d_qk = q.shape
    checks.require(s_q > 0 and h_q > 0, op, "q", lambda: f"shape {list(q.shape)}",
                   "non-empty s_q and h_q")
    checks.require(d_v == D_V, op, "d_v", d_v, "512")
    fmt = _kv_code(op, q, kv, kv_format)
    if fmt:
        _check_cache(op, kv, "kv", d_qk, q, fmt)
    else:
        _check_bf16_rows(op, q, kv)
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
    return fmt


def _kv_code(op, q, kv, kv_format):
    """The declared format of ``kv`` -> the kernel's KV_FMT code (0: bf16 rows). A 528 / 288-byte
    cache without a declaration is refused by name: its two arrangements have the same size."""
    if kv_format is None:
        if kv.dim() == 4 and kv.shape[-1] in (528, 288) and kv.dtype != torch.bfloat16:
            raise checks.bad(op, "kv_format", None, f"one of {sorted(V41_CODES)} for a "
                             f"{kv.shape[-1]}-byte DeepSeek-V4.1 kv cache (the arrangement is "
                             f"declared, never guessed)")
        return 0
    checks.require(kv_format in V41_CODES, op, "kv_format", repr(kv_format),
                   f"None (bf16 rows) or one of {sorted(V41_CODES)}")
    checks.require(q.shape[-1] == 512, op, "kv_format", lambda: f"{kv_format!r} with d_qk "
                   f"{q.shape[-1]}", "d_qk 512 (the V4.1 caches hold 512 dims)")
    return V41_CODES[kv_format]


_V41_PLANS: dict = {}


def _v41_plan(s_q, h_q, topk, fmt, device, num_splits, ragged):
    """The decode's plan for a V4.1 cache's prefill with ``_v41_config``'s head block, memoised
    by shape like the decode's own (``decode_plan.plan``)."""
    key = (s_q, h_q, topk, fmt, configs.arch_key(device), configs.sm_count(device), num_splits, ragged,
           os.environ.get("SM12X_SPARSE_MLA_CONFIG", ""))
    hit = _V41_PLANS.get(key)
    if hit is None:
        hit = _V41_PLANS[key] = plan(s_q, 1, h_q, topk, 0, device, num_splits,
                                     _v41_config(h_q, device, fmt, s_q, topk), fmt="model1",
                                     ragged=ragged)
    return hit


def _v41_config(h_q, device, fmt, s_q, topk):
    """The decode's MODEL1 config for a V4.1 cache's prefill, within ``prefill_max_block_h``."""
    cfg = pick_config(h_q, device, "model1", s_q, topk)
    cap = prefill_max_block_h(fmt)
    if cfg["BLOCK_H"] > cap and not os.environ.get("SM12X_SPARSE_MLA_CONFIG", "").strip():
        cfg = max((c for c in configs.pick(CONFIGS, device)["model1"] if c["BLOCK_H"] <= cap),
                  key=lambda c: c["BLOCK_H"])
    return cfg


def _check_bf16_rows(op, q, kv):
    d_qk = q.shape[-1]
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


def sparse_mla_prefill(q, kv, indices, sm_scale, d_v=D_V, attn_sink=None, topk_length=None,
                       out=None, num_splits=None, op=OP, kv_format=None):
    """-> (out bf16 [s_q, h_q, 512], max_logits fp32 [s_q, h_q], lse fp32 [s_q, h_q]); see the
    module docstring. ``out`` may be given (bf16 [s_q, h_q, 512], 16-byte aligned rows);
    ``num_splits`` cuts every row into that many parts (default: from shapes and SMs);
    ``kv_format``: kv is a DeepSeek-V4.1 cache of that declared format (module docstring)."""
    fmt = validate(op, q, kv, indices, topk_length, attn_sink, d_v, kv_format)
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
    # the fast path packs bf16 rows into the FP8 cache layout itself; a V4.1 cache is read in place
    # by the exact split path
    if not fmt and prefill_mxfp8.serves(d_qk, q.device):  # SM12X_ATTENTION_PRECISION=fast
        prefill_mxfp8.launch(q, kv, indices, topk_length, attn_sink, sm_scale, out, max_logits, lse,
                             num_splits)
        return out, max_logits, lse
    if not fmt and num_splits is None and use_pipelined(s_q, h_q, d_qk, q.device):
        _launch_pipelined(q, kv, indices, topk_length, attn_sink, sm_scale, out, max_logits, lse,
                          pipelined_config(d_qk, q.device))
        return out, max_logits, lse
    # each query token is a request of one token: [s_q, 1, ...] views of the same memory. A V4.1
    # cache is read as the decode reads it (its tiles have MODEL1's shape: the decode's configs,
    # head blocks capped by ``prefill_max_block_h``)
    topk, ragged = indices.shape[-1], topk_length is not None
    if fmt:
        pl = _v41_plan(s_q, h_q, topk, fmt, q.device, num_splits, ragged)
    else:
        pl = plan(s_q, 1, h_q, topk, 0, q.device, num_splits, fmt=f"bf16_{d_qk}", ragged=ragged)
    launch(q.unsqueeze(1), kv, indices, topk_length, attn_sink, None, None, None, sm_scale, pl,
           out.unsqueeze(1), lse.unsqueeze(1), max_logits=max_logits.unsqueeze(1),
           kv_bf16=not fmt, kv_fmts=(fmt, 0))
    return out, max_logits, lse


# ----------------------------------------------------------------------------------------------
# Compile checks of the pipelined path (no GPU needed); the split path is the decode kernel's
# (``decode.compile_reports``).

def _pipelined_signature(cfg, d_qk, has_len):
    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32",
           "sink_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "max_ptr": "*fp32",
           "qk_scale": "fp32"}
    for n in ("stride_qs", "stride_qh", "stride_kv", "S_KV", "stride_is", "stride_os",
              "stride_oh", "H", "TOPK"):
        sig[n] = "i32"
    const = dict(HAS_ROPE=d_qk == 576, HAS_LEN=has_len, HAS_SINK=True, BLOCK_H=cfg["BLOCK_H"],
                 BLOCK_N=cfg["BLOCK_N"], NUM_STAGES=cfg["num_stages"], INTERPRET=False)
    for k in const:
        sig[k] = "constexpr"
    return {n: sig[n] for n in _sparse_prefill_kernel.arg_names}, const


def compile_reports(targets=("sm_120", "sm_121"), cfgs=None):
    """Compile the pipelined path's configs (``cfgs``: {d_qk: cfg}, default the targets' own)
    for ``targets``, with and without per-query lengths, and (default configs) the fast
    precision's (``prefill_mxfp8``) -> list of CompileReport. Under the Triton interpreter this
    re-runs itself in a subprocess without TRITON_INTERPRET."""
    from sm12x.kernels.common.compile_check import compile_kernel

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), cfgs=cfgs)
    reports = []
    for target in targets:
        key = target if target in PIPELINED_CONFIGS else "sm_120"
        for d_qk, cfg in (cfgs or PIPELINED_CONFIGS[key]).items():
            for has_len in (True, False):
                sig, const = _pipelined_signature(cfg, d_qk, has_len)
                name = (f"pipelined d{d_qk} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} "
                        f"w{cfg['num_warps']} s{cfg['num_stages']}{' L' if has_len else ''}")
                reports.append(compile_kernel(_sparse_prefill_kernel, sig, const, target=target,
                                              num_warps=cfg["num_warps"],
                                              num_stages=cfg["num_stages"], config_name=name))
    if cfgs is None:
        reports += prefill_mxfp8.compile_reports(targets)
    return reports

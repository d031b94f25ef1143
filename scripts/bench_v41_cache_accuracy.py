#!/usr/bin/env python
"""Accuracy of the sparse MLA decode and prefill on DeepSeek-V4.1's caches (528 B: e4m3 with UE8M0
per 32; 288 B: e2m1 with e4m3 per 16; both arrangements) beside the V4 cache (584 B) and bf16 rows,
against float32 references, as FlashMLA's tests measure (cosine difference
1 - 2<a,b>/(|a|^2+|b|^2) and the largest absolute difference of ``out``; the largest absolute
difference of ``lse`` over finite entries). Two errors per case:

- kernel: sm12x's output against the float32 reference on the dequantised cache (what the kernel
  adds: bf16 rounding of P and of out; the dequantisation itself is exact);
- format: that reference against the float32 reference on the unquantised rows the cache was
  written from (what the cache format costs; the same for any correct kernel).

The indexer logits on an MXFP4 key cache (``indexer_kv_dtype='mxfp4'``: queries and keys e2m1 with
UE8M0 per 32; ``fp8_fp4_mqa_logits``) beside the FP8 one (e4m3 queries, keys with a float32 scale
per token), measured the same two ways with DeepGEMM's test metric (calc_diff
1 - 2<a,b>/(|a|^2+|b|^2) over the logits inside each row's range) and the largest difference
relative to the largest logit.

Rows follow FlashMLA's test distribution (N(0, 0.01) clamped to +-1, q N(0, 1) clamped), one
random candidate set per query token. Decode: V4.1-Flash's lists (SWA window 128 in the main
cache, 512 compressed candidates in the extra cache); prefill: 1024 candidates of one cache.
Off SM12x the sm_120 configurations run (``SM12X_KERNEL_CONFIGS=sm_120`` unless given).

  python scripts/bench_v41_cache_accuracy.py [--device cuda|cpu]
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def cos_diff(a, b) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    denom = float((a * a).sum() + (b * b).sum())
    return 0.0 if denom == 0 else 1 - 2 * float((a * b).sum()) / denom


def errors(out, lse, ref_out, ref_lse):
    fin = ref_lse.isfinite()
    return (cos_diff(out.float(), ref_out.float()), float((out.float() - ref_out.float()).abs().max()),
            float((lse[fin] - ref_lse[fin]).abs().max()) if fin.any() else 0.0)


def make_rows(n, gen, device):
    import torch

    return (torch.randn(n, 512, generator=gen, device=device) / 10).clamp(-1, 1)


def quantize(rows, fmt, page):
    """fp32 rows [nb * page, 512] -> the cache of ``fmt`` ("model1" or a V4.1 format), pages in order."""
    from sm12x.kernels.sparse_mla import kv_cache as kvc

    kv = rows.view(-1, page, 512)
    if fmt == "model1":
        return kvc.quantize_model1_cache(kv)
    bpt, interleaved = kvc.V41_FORMATS[fmt]
    quant = kvc.quantize_v41_cache if bpt == 528 else kvc.quantize_v41_fp4_cache
    return quant(kv, interleaved)


def pick(queries, n, topk, gen, device):
    import torch

    return torch.rand(queries, n, generator=gen, device=device).argsort(-1)[:, :topk].to(torch.int32)


def decode_case(fmt, xfmt, b, h_q, gen, device):
    """-> (kernel errors, format errors) of one decode call (s_q 1): main list 128 of 256 rows
    (page 256), extra list 512 of 4096 rows (page 64)."""
    import torch

    from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
    from sm12x.kernels.sparse_mla.reference import ref_sparse_mla_decode, ref_sparse_mla_prefill

    main, extra = make_rows(256, gen, device), make_rows(4096, gen, device)
    cache, xcache = quantize(main, fmt, 256), quantize(extra, xfmt, 64)
    idx, xidx = pick(b, 256, 128, gen, device), pick(b, 4096, 512, gen, device)
    q = torch.randn(b, 1, h_q, 512, generator=gen, device=device).clamp(-1, 1).to(torch.bfloat16)
    scale = 512 ** -0.5
    formats = {} if fmt == "model1" else dict(kv_format=fmt, extra_kv_format=xfmt)
    out, lse = sparse_mla_decode(q, cache, idx.view(b, 1, -1), None, None, xcache, xidx.view(b, 1, -1),
                                 None, scale, **formats)
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, idx.view(b, 1, -1), extra_k_cache=xcache,
                                             extra_indices=xidx.view(b, 1, -1), softmax_scale=scale,
                                             **formats)
    # the unquantised rows: both lists as one candidate list over the concatenated rows
    rows = torch.cat([main, extra])[:, None, :]
    both = torch.cat([idx, xidx + 256], dim=-1).view(b, 1, -1)
    true_out, _, true_lse = ref_sparse_mla_prefill(q[:, 0], rows, both, scale)
    return (errors(out, lse, ref_out, ref_lse),
            errors(ref_out[:, 0], ref_lse[:, :, 0], true_out, true_lse))


def prefill_case(fmt, s_q, h_q, gen, device):
    """-> (kernel errors, format errors) of one prefill call: 1024 of 16384 rows (page 64);
    ``fmt`` None: bf16 rows."""
    import torch

    from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill
    from sm12x.kernels.sparse_mla.reference import ref_sparse_mla_prefill

    n = 16384 if device == "cuda" else 2048
    rows = make_rows(n, gen, device)
    idx = pick(s_q, n, 1024 if device == "cuda" else 128, gen, device).view(s_q, 1, -1)
    q = torch.randn(s_q, h_q, 512, generator=gen, device=device).clamp(-1, 1).to(torch.bfloat16)
    scale = 512 ** -0.5
    if fmt is None:
        kv = rows.to(torch.bfloat16)[:, None, :]
        out, _, lse = sparse_mla_prefill(q, kv, idx, scale)
        ref_out, _, ref_lse = ref_sparse_mla_prefill(q, kv, idx, scale)
    else:
        kv = quantize(rows, fmt, 64)
        out, _, lse = sparse_mla_prefill(q, kv, idx, scale, kv_format=fmt)
        ref_out, _, ref_lse = ref_sparse_mla_prefill(q, kv, idx, scale, kv_format=fmt)
    true_out, _, true_lse = ref_sparse_mla_prefill(q, rows[:, None, :], idx, scale)
    return errors(out, lse, ref_out, ref_lse), errors(ref_out, ref_lse, true_out, true_lse)


def indexer_case(fp4, s, s_kv, h, gen, device):
    """-> (kernel errors, format errors) of the prefill indexer logits: calc_diff and the largest
    difference relative to the largest |logit| (rows see keys [0, s_kv * (i + 1) / s))."""
    import torch

    from sm12x.frontends.deep_gemm.indexer import fp8_fp4_mqa_logits
    from sm12x.kernels.common.tolerance import calc_diff
    from sm12x.kernels.indexer.cache import dequant_fp4, quant_fp4_per_token, quant_fp8_per_token
    from sm12x.kernels.indexer.reference import ref_mqa_logits

    q = torch.randn(s, h, 128, generator=gen, device=device)
    k = torch.randn(s_kv, 128, generator=gen, device=device)
    w = torch.randn(s, h, generator=gen, device=device)
    if fp4:
        (qv, qs), (kv, ksf) = quant_fp4_per_token(q), quant_fp4_per_token(k)
        q_deq, k_deq, k_sf = dequant_fp4(qv, qs), dequant_fp4(kv, ksf), None
    else:
        qv, qs = q.to(torch.float8_e4m3fn), None
        kv, ksf = quant_fp8_per_token(k)
        q_deq, k_deq, k_sf = qv.float(), kv.float(), ksf
    ks = torch.zeros(s, dtype=torch.int32, device=device)
    ke = ((torch.arange(s, device=device) + 1) * s_kv // s).to(torch.int32)
    got = fp8_fp4_mqa_logits((qv, qs), (kv, ksf), w, ks, ke, clean_logits=True).float()
    deq = ref_mqa_logits(q_deq, k_deq, k_sf, w, ks, ke, clean_logits=True)
    true = ref_mqa_logits(q, k, None, w, ks, ke, clean_logits=True)
    inside = deq.isfinite()
    got, deq, true = (t.masked_fill(~inside, 0) for t in (got, deq, true))

    def pair(a, b):
        return calc_diff(a, b), float((a - b).abs().max() / b.abs().max())

    return pair(got, deq), pair(deq, true)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("SM12X_KERNEL_CONFIGS", "sm_120")

    import torch
    import triton

    cuda = args.device == "cuda"
    gpu = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(f"{datetime.date.today()}  {gpu}  torch {torch.__version__}  triton {triton.__version__}  "
          f"configs {os.environ['SM12X_KERNEL_CONFIGS']}")
    b, s_q, h_q = (64, 256, 64) if cuda else (2, 2, 16)
    print(f"decode: b {b}, 1 query token, {h_q} heads; prefill: s_q {s_q}, {h_q} heads\n")
    print("| call | cache | kernel cos diff | kernel max abs | kernel lse max abs | format cos diff "
          "| format max abs | format lse max abs |")
    print("|---|---|---|---|---|---|---|---|")
    gen = torch.Generator(device=args.device).manual_seed(0)
    rows = [("decode", "584 V4 (+ 584 extra)", lambda: decode_case("model1", "model1", b, h_q, gen, args.device))]
    for fmt, xfmt, label in (("v41", "v41_fp4", "528 + 288 FP4 interleaved"),
                             ("v41_block_split", "v41_fp4_block_split", "528 + 288 FP4 block-split"),
                             ("v41", "v41", "528 + 528 interleaved")):
        rows.append(("decode", label, lambda f=fmt, x=xfmt: decode_case(f, x, b, h_q, gen, args.device)))
    rows.append(("prefill", "bf16 rows", lambda: prefill_case(None, s_q, h_q, gen, args.device)))
    for fmt, label in (("v41", "528 interleaved"), ("v41_block_split", "528 block-split"),
                       ("v41_fp4", "288 FP4 interleaved"), ("v41_fp4_block_split", "288 FP4 block-split")):
        rows.append(("prefill", label, lambda f=fmt: prefill_case(f, s_q, h_q, gen, args.device)))
    for call, label, run in rows:
        kernel, fmt_err = run()
        print(f"| {call} | {label} | " + " | ".join(f"{v:.3g}" for v in kernel + fmt_err) + " |")
        if cuda:
            torch.cuda.empty_cache()
    s, s_kv, h = (1024, 8192, 64) if cuda else (16, 512, 32)
    print(f"\nindexer prefill logits: {s} rows x {s_kv} keys, {h} heads, head dim 128\n")
    print("| key cache | kernel calc_diff | kernel max rel | format calc_diff | format max rel |")
    print("|---|---|---|---|---|")
    for fp4, label in ((False, "FP8 (e4m3, float32 scale per token)"), (True, "MXFP4 (e2m1, UE8M0 per 32)")):
        kernel, fmt_err = indexer_case(fp4, s, s_kv, h, gen, args.device)
        print(f"| {label} | " + " | ".join(f"{v:.3g}" for v in kernel + fmt_err) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

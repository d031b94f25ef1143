#!/usr/bin/env python
"""Benchmark the sm12x lightning-indexer kernels on a CUDA GPU.

    python scripts/bench_indexer.py [--quick] [--fp4]

Cases (H=64, D=128 throughout):
- prefill logits (fp8_fp4_mqa_logits), causal ranges: S 2048-8192, S_kv 8K-64K.
  FLOP model: 2 * sum_i(ke_i - ks_i) * H * D ("FP8-equivalent" TFLOPS).
- paged decode logits (fp8_fp4_paged_mqa_logits), block_kv 64, batch 256-4096, context 8K-64K,
  next_n 1/2 (batch x context capped at 32M tokens like DeepGEMM's test), max_context_len the
  batch's longest request; and a few of these with max_context_len = 262,144 (MODEL_LEN), as vLLM
  calls it: it passes max_model_len, the model's limit, whatever the batch holds.
  Byte model: KV bytes read once (sum ctx * (D+4) B, FP4 D/2+4) + q/weights + logits written
  (sum over rows of the visible positions * 4 B).
Logits kernels are timed by CUDA-graph replay (no host time, L2 warm), and again as DeepGEMM's own
test harness times them: kernel time in a profiler trace, L2 flushed before every call ("kernel
us", the figure to hold against DeepGEMM's). The top-k cases are timed with do_bench.
- fused top-k (mqa_topk_indices) vs logits + torch.topk at S=4096, S_kv=262144, topk=512 and 2048,
  and on prefill chunks of several requests (vLLM gathers their keys into one buffer; each row
  sees its own request's): time, torch.cuda.max_memory_allocated, and whether both return the
  same index sets.
- the 1M-token prompt case: S_kv = 262144 compressed keys (1M tokens / 4), prefill chunk S=8192,
  fused top-k only (the logits would be 8 GiB): time and peak memory.
- fused paged top-k (paged_mqa_topk_indices) vs paged logits (clean) + torch.topk in decode: one
  1M-token request (262,144 compressed keys; next_n 1 and 2), 32 such requests, and batches of 8K-32K
  requests, topk 512 (V4) and 2048 (V3.2 / GLM-5). Time per call by CUDA-graph replay (how the
  frameworks run decode), peak memory of one eager call, and whether both return the same index
  sets ("same sets": rows whose sorted indices are equal).
Prints a markdown table with the date, GPU, torch / triton versions and the models above.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

H, D, BLOCK_KV = 64, 128, 64
MODEL_LEN = 262144  # DeepSeek-V4's 1M-token limit in 4x-compressed indexer keys


def fail(msg: str) -> None:
    print(f"bench_indexer: {msg}", file=sys.stderr)
    sys.exit(2)


def bench(fn, reps: int = 20) -> float:
    """Median milliseconds of ``fn`` (triton.testing.do_bench: CUDA events, L2 flushed; host time
    between calls included)."""
    import triton

    return triton.testing.do_bench(fn, warmup=5, rep=max(reps, 10), return_mode="median")


def bench_graph(fn) -> float:
    """Milliseconds per call of ``fn`` replayed from a CUDA graph (how the frameworks run decode;
    no host time, L2 not flushed between calls)."""
    from gpu_timing import time_us

    try:
        return time_us(fn) / 1e3
    except RuntimeError as e:  # not capturable: say so and time it eagerly
        print(f"bench_indexer: CUDA-graph capture failed ({e}); timed eagerly", file=sys.stderr)
        torch.cuda.synchronize()
        return bench(fn)


def bench_kernel(fn) -> float:
    """Milliseconds per call as kernel time in a profiler trace, L2 flushed before each call."""
    from gpu_timing import kernel_span_us

    return kernel_span_us(fn, iters=20) / 1e3


def make_q(shape, fp4: bool):
    from sm12x.kernels.indexer.cache import quant_fp4_per_token

    q = torch.randn(*shape, D, device="cuda", dtype=torch.bfloat16)
    return quant_fp4_per_token(q) if fp4 else (q.to(torch.float8_e4m3fn), None)


def make_keys(n: int, fp4: bool):
    from sm12x.kernels.indexer.cache import quant_fp4_per_token, quant_fp8_per_token

    k = torch.randn(n, D, device="cuda", dtype=torch.bfloat16)
    return quant_fp4_per_token(k) if fp4 else quant_fp8_per_token(k)


def make_cache(num_blocks: int, fp4: bool, chunk: int = 4096):
    """Random fused cache filled block-chunk by block-chunk (no full-size float temporary)."""
    tok = D // 2 + 4 if fp4 else D + 4
    cache = torch.empty((num_blocks, BLOCK_KV * tok), dtype=torch.uint8, device="cuda")
    vb = BLOCK_KV * (D // 2 if fp4 else D)
    for b0 in range(0, num_blocks, chunk):
        rows = cache[b0:b0 + chunk]
        n = rows.shape[0]
        if fp4:
            rows[:, :vb] = torch.randint(0, 256, (n, vb), dtype=torch.uint8, device="cuda")
            exp = torch.randint(120, 128, (n, BLOCK_KV, 4), dtype=torch.int32, device="cuda")
            sf = exp[..., 0] | (exp[..., 1] << 8) | (exp[..., 2] << 16) | (exp[..., 3] << 24)
        else:
            rows[:, :vb] = torch.randn(n, vb, device="cuda", dtype=torch.bfloat16).to(
                torch.float8_e4m3fn).view(torch.uint8)
            sf = torch.rand(n, BLOCK_KV, device="cuda") / 448 + 1e-3
        rows[:, vb:] = sf.contiguous().view(torch.uint8).view(n, -1)
    return cache.view(num_blocks, BLOCK_KV, 1, tok)


def causal_ranges(s, s_kv):
    """(ks, ke) of S causal prefill rows at the end of S_kv keys."""
    return torch.zeros(s, dtype=torch.int32, device="cuda"), \
        torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1


def prefill_cases(quick: bool, fp4: bool, out: list):
    from sm12x.frontends.deep_gemm.indexer import fp8_fp4_mqa_logits

    shapes = [(2048, 8192), (4096, 32768)] if quick else \
        [(2048, 8192), (2048, 65536), (4096, 16384), (4096, 65536), (8192, 32768), (8192, 65536)]
    for s, s_kv in shapes:
        q = make_q((s, H), fp4)
        kv = make_keys(s_kv, fp4)
        w = torch.randn(s, H, device="cuda")
        ks, ke = causal_ranges(s, s_kv)
        eff = int((ke - ks).sum())
        call = lambda: fp8_fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=False)  # noqa: E731
        ms, kms = bench_graph(call), bench_kernel(call)
        flop = 2 * eff * H * D
        out.append(("prefill logits" + (" FP4" if fp4 else ""), f"S={s} S_kv={s_kv}", f"{ms * 1e3:.0f}",
                    f"{flop / ms / 1e9:.0f} TFLOPS", f"{kms * 1e3:.0f}", f"{flop / kms / 1e9:.0f} TFLOPS", ""))
        del q, kv, w
        torch.cuda.empty_cache()


def peak_gib(fn):
    """(fn's result, GiB allocated at its peak above what was allocated before the call)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    result = fn()
    torch.cuda.synchronize()
    return result, (torch.cuda.max_memory_allocated() - base) / 2 ** 30


def paged_case(b: int, ctx_avg: int, next_n: int, fp4: bool, exact: bool = False):
    """A decode batch: request lengths uniform in 0.7-1.3 x ``ctx_avg`` (``exact``: all
    ``ctx_avg``), a random block table, 2-D context lengths
    -> (ctx, cache, block_table, context_lens, q, weights, max_context_len)."""
    if exact:
        ctx = torch.full((b,), ctx_avg, dtype=torch.int32, device="cuda")
    else:
        ctx = torch.randint(int(0.7 * ctx_avg), int(1.3 * ctx_avg), (b,), dtype=torch.int32, device="cuda")
    max_blocks = int((int(ctx.max()) + BLOCK_KV - 1) // BLOCK_KV)
    cache = make_cache(b * max_blocks, fp4)
    bt = torch.randperm(b * max_blocks, device="cuda", dtype=torch.int32).view(b, max_blocks)
    cl = (ctx[:, None] - next_n + 1 + torch.arange(next_n, device="cuda", dtype=torch.int32)).contiguous()
    q = make_q((b, next_n, H), fp4)
    w = torch.randn(b * next_n, H, device="cuda")
    return ctx, cache, bt, cl, q, w, max_blocks * BLOCK_KV


def paged_topk_case(b: int, ctx_avg: int, next_n: int, model_len: int | None):
    """A decode batch for the paged top-k cases: requests of exactly MODEL_LEN keys when
    ``ctx_avg`` is MODEL_LEN, else ``paged_case``'s; the window is ``model_len`` when given
    -> (cache, block_table, context_lens, q, weights, max_context_len)."""
    _, cache, bt, cl, q, w, mcl = paged_case(b, ctx_avg, next_n, False, exact=ctx_avg == MODEL_LEN)
    if model_len:
        bt = torch.nn.functional.pad(bt, (0, model_len // BLOCK_KV - bt.shape[1]))
        mcl = model_len
    return cache, bt, cl, q, w, mcl


def decode_cases(quick: bool, fp4: bool, out: list):
    from sm12x.frontends.deep_gemm.indexer import fp8_fp4_paged_mqa_logits, get_num_sms, get_paged_mqa_logits_metadata

    batches = (256, 1024) if quick else (256, 1024, 4096)
    contexts = (8192, 65536) if quick else (8192, 16384, 32768, 65536)
    shapes = [(b, ctx_avg, None) for b in batches for ctx_avg in contexts if b * ctx_avg <= 32 * 1024 * 1024]
    shapes += [(256, 8192, MODEL_LEN)] if quick else [(256, 8192, MODEL_LEN), (1024, 8192, MODEL_LEN),
                                                       (256, 65536, MODEL_LEN)]
    for b, ctx_avg, model_len in shapes:
        for next_n in (1, 2):
            ctx, cache, bt, cl, q, w, mcl = paged_case(b, ctx_avg, next_n, fp4)
            label = f"B={b} ctx~{ctx_avg} next_n={next_n}"
            if model_len:
                mcl = model_len
                bt = torch.nn.functional.pad(bt, (0, model_len // BLOCK_KV - bt.shape[1]))
                label += f" max_context_len={model_len}"
            meta = get_paged_mqa_logits_metadata(cl, BLOCK_KV, get_num_sms())
            call = lambda: fp8_fp4_paged_mqa_logits(q, cache, w, cl, bt, meta, mcl)  # noqa: E731
            ms, kms = bench_graph(call), bench_kernel(call)
            tok_bytes = (D // 2 if fp4 else D) + 4
            kv_bytes = int(ctx.long().sum()) * tok_bytes
            logit_bytes = int(cl.long().sum()) * 4
            qw_bytes = q[0].numel() * q[0].element_size() + w.numel() * 4
            nbytes = kv_bytes + logit_bytes + qw_bytes
            out.append(("paged decode logits" + (" FP4" if fp4 else ""), label,
                        f"{ms * 1e3:.0f}", f"{nbytes / ms / 1e6:.0f} GB/s", f"{kms * 1e3:.0f}",
                        f"{nbytes / kms / 1e6:.0f} GB/s", ""))
            del cache, bt, q, w
            torch.cuda.empty_cache()


def same_sets(got, ref):
    """Share of rows where the fused op's indices (int32, -1 padded) and torch.topk's (values,
    indices) name the same keys; torch.topk's picks of -inf entries (rows that see fewer than
    topk keys) are left out, as the fused op pads those with -1."""
    ref_idx = torch.where(ref.values > float("-inf"), ref.indices, -1)
    return (got.long().sort(dim=1).values == ref_idx.sort(dim=1).values).all(dim=1).float().mean().item()


def chunk_ranges(new_tokens, prefixes):
    """(ks, ke) of a prefill chunk of several requests whose keys vLLM gathers into one buffer:
    request i's keys follow request i-1's; its queries see its prefix and themselves (causal)."""
    ks, ke, start = [], [], 0
    for n, p in zip(new_tokens, prefixes):
        ks.append(torch.full((n,), start, dtype=torch.int32))
        ke.append(torch.arange(n, dtype=torch.int32) + start + p + 1)
        start += p + n
    return torch.cat(ks).cuda(), torch.cat(ke).cuda()


def topk_cases(quick: bool, out: list):
    from sm12x.frontends.deep_gemm.indexer import fp8_mqa_logits
    from sm12x.kernels.indexer.fused_topk import mqa_topk_indices

    # (label, S, S_kv, topk, (ks, ke) builder, also time logits + torch.topk)
    cases = [("S=4096 S_kv=262144 topk=512", 4096, 262144, 512, causal_ranges, True),
             ("S=4096 S_kv=262144 topk=2048", 4096, 262144, 2048, causal_ranges, True),
             ("1M-token prompt: S=8192 chunk, S_kv=262144", 8192, 262144, 512, causal_ranges, False),
             ("chunk of 8 requests x 1024 new after 31,744 keys: S=8192 S_kv=262144 topk=512", 8192, 262144, 512,
              lambda s, s_kv: chunk_ranges([1024] * 8, [31744] * 8), True),
             ("chunk of 16 requests x 512 new after 0-29,000 keys: S=8192 S_kv=240152 topk=2048", 8192, None, 2048,
              lambda s, s_kv: chunk_ranges([512] * 16, [i * 1933 for i in range(16)]), True)]
    if quick:
        cases = cases[:1] + cases[3:4]
    for label, s, s_kv, topk, ranges, compare in cases:
        ks, ke = ranges(s, s_kv)
        s_kv = s_kv or int(ke.max())
        q, _ = make_q((s, H), False)
        kv = make_keys(s_kv, False)
        w = torch.randn(s, H, device="cuda")
        fused = lambda: mqa_topk_indices(q, kv, w, ks, ke, topk, relative=False)  # noqa: E731
        ms = bench(fused, reps=3)
        got, gib = peak_gib(fused)
        note = f"peak +{gib:.2f} GiB"
        if compare:
            def unfused():
                logits = fp8_mqa_logits(q, kv, w, ks, ke, clean_logits=True)
                return logits.topk(topk, dim=1)
            ref_ms = bench(unfused, reps=3)
            ref, ref_gib = peak_gib(unfused)
            same = same_sets(got, ref)
            out.append(("fused top-k", label, f"{ms * 1e3:.0f}", f"{ref_ms / ms:.2f}x", "", "",
                        f"{note}; same sets {same:.0%}"))
            out.append(("logits + torch.topk", label, f"{ref_ms * 1e3:.0f}", "", "", "", f"peak +{ref_gib:.2f} GiB"))
            del ref
        else:
            out.append(("fused top-k", label, f"{ms * 1e3:.0f}", "", "", "", note))
        del q, kv, w, got
        torch.cuda.empty_cache()


def paged_topk_cases(quick: bool, out: list):
    from sm12x.frontends.deep_gemm.indexer import fp8_fp4_paged_mqa_logits, get_num_sms, get_paged_mqa_logits_metadata
    from sm12x.kernels.indexer.fused_topk import paged_mqa_topk_indices

    # (B, context, next_n, topk, max_context_len: None = the batch's longest request)
    cases = [(1, MODEL_LEN, 1, 512, MODEL_LEN), (1, MODEL_LEN, 2, 512, MODEL_LEN)]
    if not quick:
        cases += [(1, MODEL_LEN, 1, 2048, MODEL_LEN), (32, MODEL_LEN, 1, 512, MODEL_LEN),
                  (64, 32768, 2, 512, None), (256, 8192, 1, 2048, None), (256, 8192, 1, 512, MODEL_LEN)]
    for b, ctx_avg, next_n, topk, model_len in cases:
        cache, bt, cl, q, w, mcl = paged_topk_case(b, ctx_avg, next_n, model_len)
        label = f"B={b} ctx~{ctx_avg} next_n={next_n} topk={topk} max_context_len={mcl}"
        meta = get_paged_mqa_logits_metadata(cl, BLOCK_KV, get_num_sms())
        fused = lambda: paged_mqa_topk_indices(q, cache, w, cl, bt, mcl, topk)  # noqa: E731

        def unfused():
            logits = fp8_fp4_paged_mqa_logits(q, cache, w, cl, bt, meta, mcl, clean_logits=True)
            return logits.topk(topk, dim=1)

        got, gib = peak_gib(fused)
        ref, ref_gib = peak_gib(unfused)
        same = same_sets(got, ref)
        ms, ref_ms = bench_graph(fused), bench_graph(unfused)
        out.append(("fused paged top-k", label, f"{ms * 1e3:.0f}", f"{ref_ms / ms:.2f}x", "", "",
                    f"peak +{gib:.3f} GiB; same sets {same:.0%}"))
        out.append(("paged logits + torch.topk", label, f"{ref_ms * 1e3:.0f}", "", "", "",
                    f"peak +{ref_gib:.3f} GiB"))
        del cache, bt, q, w, got, ref
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--fp4", action="store_true", help="also run the FP4 prefill / decode cases")
    ap.add_argument("--skip-topk", action="store_true")
    ap.add_argument("--topk-only", action="store_true", help="only the top-k cases")
    ap.add_argument("--paged-topk-only", action="store_true", help="only the fused paged top-k cases")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        fail("TRITON_INTERPRET is set; unset it to benchmark on the GPU")
    if not torch.cuda.is_available():
        fail("no CUDA GPU available (torch.cuda.is_available() is False); this benchmark needs one")
    import triton

    from sm12x.kernels.common import configs

    dev = torch.device("cuda")
    rows: list = []
    logits = not (args.topk_only or args.paged_topk_only)
    if logits:
        prefill_cases(args.quick, False, rows)
        decode_cases(args.quick, False, rows)
    if args.fp4 and logits:
        prefill_cases(args.quick, True, rows)
        decode_cases(args.quick, True, rows)
    if not args.skip_topk and not args.paged_topk_only:
        topk_cases(args.quick, rows)
    if not args.skip_topk and not args.topk_only:
        paged_topk_cases(args.quick, rows)

    name = torch.cuda.get_device_name(0)
    print(f"# sm12x indexer benchmark — {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"GPU: {name} ({configs.sm_count(dev)} SMs, configs {configs.arch_key(dev)}); "
          f"torch {torch.__version__}; triton {triton.__version__}; H={H} D={D} block_kv={BLOCK_KV}")
    print("FLOP model (prefill): 2 * visible (query, key) pairs * H * D. Byte model (decode): KV read once "
          "(D+4 B/token FP8, D/2+4 FP4) + q + weights + visible logits written (4 B).")
    print()
    print("| case | shape | time (us) | rate | kernel us, L2 flushed | rate (kernel) | memory |")
    print("|---|---|---:|---:|---:|---:|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()

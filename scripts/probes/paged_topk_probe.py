"""Probe: where a decode call of the fused paged top-k (``paged_mqa_topk_indices``) spends its
time, against paged logits (clean) + ``torch.topk`` (H200, SM12X_FORCE=1).

Each call is replayed from a CUDA graph under the profiler (L2 not flushed, as
``bench_indexer.py``'s graph times); per case it prints the span of one call, the GPU work summed
per kernel name and the gaps between kernels.

    python scripts/probes/paged_topk_probe.py [--cases "[[1, 262144, 1, 512, 262144]]"]

A case is [B, context, next_n, topk, max_context_len or null (the batch's longest request)].
"""
import argparse
import collections
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton

from bench_indexer import BLOCK_KV, MODEL_LEN, paged_topk_case
from gpu_timing import traced_calls
from sm12x.frontends.deep_gemm.indexer import fp8_fp4_paged_mqa_logits, get_num_sms, get_paged_mqa_logits_metadata
from sm12x.kernels.indexer.fused_topk import paged_mqa_topk_indices

CASES = [[1, MODEL_LEN, 1, 512, MODEL_LEN], [256, 8192, 1, 512, MODEL_LEN], [256, 8192, 1, 2048, None]]


def breakdown(fn, iters=10):
    """(median span µs, {kernel name: median µs per call}, median µs between kernels)."""
    calls = traced_calls(fn, iters=iters, flush=False)
    spans, gaps, per_name = [], [], collections.defaultdict(list)
    for work in calls:
        spans.append(work[-1][1] - work[0][0])
        busy = collections.defaultdict(float)
        for start, end, name in work:
            busy[name[:60]] += end - start
        for name, us in busy.items():
            per_name[name].append(us)
        gaps.append(spans[-1] - sum(busy.values()))
    return (statistics.median(spans), {n: statistics.median(v) for n, v in per_name.items()},
            statistics.median(gaps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=json.dumps(CASES))
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for b, ctx_avg, next_n, topk, model_len in json.loads(args.cases):
        cache, bt, cl, q, w, mcl = paged_topk_case(b, ctx_avg, next_n, model_len)
        meta = get_paged_mqa_logits_metadata(cl, BLOCK_KV, get_num_sms())
        variants = {
            "fused": lambda: paged_mqa_topk_indices(q, cache, w, cl, bt, mcl, topk),
            "logits + torch.topk": lambda: fp8_fp4_paged_mqa_logits(
                q, cache, w, cl, bt, meta, mcl, clean_logits=True).topk(topk, dim=1),
        }
        print(f"\n## B={b} ctx~{ctx_avg} next_n={next_n} topk={topk} max_context_len={mcl}")
        for name, fn in variants.items():
            span, per_name, gap = breakdown(fn)
            print(f"\n{name}: span {span:.1f} µs, between kernels {gap:.1f} µs, {len(per_name)} kernel names")
            for kname, us in sorted(per_name.items(), key=lambda kv: -kv[1]):
                print(f"  {us:8.1f} µs  {kname}")
        del cache, bt, q, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

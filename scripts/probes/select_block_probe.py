"""Probe: the radix select's columns per loop step (``topk_select.BLOCK``) in the fused paged
top-k (H200, SM12X_FORCE=1). Each BLOCK is set on the module before the calls (it is a launch
constant, so each value compiles its own kernels); every variant's indices must equal BLOCK
1024's. Prints the time per call (CUDA-graph replay, L2 warm) per case and BLOCK.

    python scripts/probes/select_block_probe.py [--blocks 1024,2048,4096]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton

from bench_indexer import MODEL_LEN, paged_topk_case
from gpu_timing import time_us
from sm12x.kernels.indexer import topk_select
from sm12x.kernels.indexer.fused_topk import paged_mqa_topk_indices

# [B, context, next_n, topk, max_context_len or null]
CASES = [[1, MODEL_LEN, 1, 512, MODEL_LEN], [32, MODEL_LEN, 1, 512, MODEL_LEN], [64, 32768, 2, 512, None],
         [256, 8192, 1, 2048, None], [256, 8192, 1, 512, MODEL_LEN]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", default="1024,2048,4096")
    ap.add_argument("--cases", default=json.dumps(CASES))
    args = ap.parse_args()
    blocks = [int(b) for b in args.blocks.split(",")]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("\n| case | " + " | ".join(f"BLOCK {b} µs" for b in blocks) + " |")
    print("|---|" + "---:|" * len(blocks))
    checks = []
    for b, ctx_avg, next_n, topk, model_len in json.loads(args.cases):
        cache, bt, cl, q, w, mcl = paged_topk_case(b, ctx_avg, next_n, model_len)
        label = f"B={b} ctx~{ctx_avg} next_n={next_n} topk={topk} window={mcl}"
        row, first = [], None
        for block in blocks:
            topk_select.BLOCK = block
            call = lambda: paged_mqa_topk_indices(q, cache, w, cl, bt, mcl, topk)  # noqa: E731
            got = call()
            if first is None:
                first = got
            elif not torch.equal(got, first):
                checks.append(f"{label}: BLOCK {block} differs from BLOCK {blocks[0]}")
            row.append(f"{time_us(call):.0f}")
        topk_select.BLOCK = 1024
        print(f"| {label} | " + " | ".join(row) + " |", flush=True)
        del cache, bt, q, w
        torch.cuda.empty_cache()
    print("\nevery BLOCK gave the same indices" if not checks else "\n".join(checks))


if __name__ == "__main__":
    main()

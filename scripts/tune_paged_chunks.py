"""Blocks per program (N_ITERS) and pipeline depth of the paged decode logits kernel on the
benchmark's inputs (``bench_indexer.py``: per-request context uniform in 0.7-1.3 x the average,
random block tables). Prints GB/s (bytes of KV read once + logits written + q + weights) per
configuration as markdown. N_ITERS is the chunk each program walks at a time; how many programs
share a request still comes from ``paged_mqa_logits.grid_columns`` (add ``columns`` to fix it).
``--tokens`` sweeps how next_n > 1 query tokens share programs instead (one token per program,
token pairs sharing each key tile, or two tokens in one 128-row dot).

    python scripts/tune_paged_chunks.py [--tokens]
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import torch
import triton

from bench_indexer import D, paged_case
from gpu_timing import time_us
from sm12x.kernels.indexer import paged_mqa_logits as paged

BASE = dict(key_rows=True, rows=64, SUB_N=64, num_warps=4)
CHUNKS = [(f"{n} blocks, {st} stages", dict(BASE, N_ITERS=n, num_stages=st))
          for n, st in ((16, 2), (16, 3), (8, 2), (8, 3), (32, 3), (32, 2))]
TOKENS = [("1 token, 32, 3", dict(BASE, N_ITERS=32, num_stages=3)),
          ("pair, 32, 3", dict(BASE, pair=True, N_ITERS=32, num_stages=3)),
          ("pair, 16, 3", dict(BASE, pair=True, N_ITERS=16, num_stages=3)),
          ("rows 128, 32, 3", dict(BASE, rows=128, N_ITERS=32, num_stages=3)),
          ("rows 128, 8 warps, 32, 3", dict(BASE, rows=128, num_warps=8, N_ITERS=32, num_stages=3)),
          ("rows 128, 8 warps, 16, 3", dict(BASE, rows=128, num_warps=8, N_ITERS=16, num_stages=3)),
          ("rows 128, 8 warps, 32, 3, maxnreg 80",
           dict(BASE, rows=128, num_warps=8, N_ITERS=32, num_stages=3, maxnreg=80)),
          ("rows 128, 8 warps, pair, 32, 3", dict(BASE, rows=128, num_warps=8, pair=True, N_ITERS=32,
                                                  num_stages=3))]
SHAPES = ((256, 8192), (256, 16384), (256, 32768), (256, 65536), (1024, 8192), (1024, 16384),
          (1024, 32768), (4096, 8192))


def main():
    if not torch.cuda.is_available():
        raise SystemExit("tune_paged_chunks: needs a CUDA GPU")
    print(f"# paged logits chunks, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}\n")
    tokens = "--tokens" in sys.argv[1:]
    configs = TOKENS if tokens else CHUNKS
    print("| B | ctx | next_n | " + " | ".join(label for label, _ in configs) + " |")
    print("|---|---|---|" + "---:|" * len(configs))
    for b, ctx_avg in SHAPES:
        for next_n in ((2, 4) if tokens else (1, 2)):
            torch.manual_seed(0)
            ctx, cache, bt, cl, (q, _), w, mcl = paged_case(b, ctx_avg, next_n, False)
            out = paged.alloc_logits(b * next_n, mcl, torch.float32, q.device)
            nbytes = int(ctx.long().sum()) * (D + 4) + int(cl.long().sum()) * 4 + q.numel() + w.numel() * 4
            rates = []
            for _, cfg in configs:
                us = time_us(lambda: paged.launch(q, None, cache, w, cl, bt, mcl, out, clean=False,
                                                  out_mode=0, config=cfg), iters=30)
                rates.append(f"{nbytes / us / 1e3:.0f}")
            print(f"| {b} | {ctx_avg} | {next_n} | " + " | ".join(rates) + " |", flush=True)
            del cache, bt, q, w, out
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

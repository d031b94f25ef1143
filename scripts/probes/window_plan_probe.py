"""Probe: the prefill fused top-k's window plan (``indexer_topk._plan``). Wider windows mean fewer
row-block x window steps (each runs the fold's merge over every row of the block), fewer rows per
block. Each variant raises the window to at least MIN columns (row blocks shrink to keep the
workspace budget); every variant's indices must equal the as-is plan's. Prints do_bench medians
(ms) per case and variant (H200, SM12X_FORCE=1).

    python scripts/probes/window_plan_probe.py [--mins 0,16384,32768,65536]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton

from bench_indexer import H, bench, causal_ranges, chunk_ranges, make_keys, make_q
from sm12x.kernels.indexer import fused_topk as indexer_topk

CASES = [("S=4096 S_kv=262144 top-512 causal", 4096, 262144, 512, causal_ranges),
         ("S=4096 S_kv=262144 top-2048 causal", 4096, 262144, 2048, causal_ranges),
         ("chunk 8 x 1024 after 31,744 top-512", 8192, 262144, 512,
          lambda s, s_kv: chunk_ranges([1024] * 8, [31744] * 8)),
         ("chunk 16 x 512 after 0-29,000 top-2048", 8192, 240152, 2048,
          lambda s, s_kv: chunk_ranges([512] * 16, [i * 1933 for i in range(16)]))]


def plan_with_min(min_cols):
    as_is = indexer_topk._plan

    def plan(rows, cols, unit, topk, budget, elem_bytes=4):
        row_block, win = as_is(rows, cols, unit, topk, budget, elem_bytes)
        cols_needed = -(-cols // unit) * unit
        wide = min(cols_needed, -(-min_cols // unit) * unit)
        if wide > win:
            win = wide
            row_block = max(1, min(rows, (budget // elem_bytes) // win))
        return row_block, win
    return plan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mins", default="0,16384,32768,65536")
    args = ap.parse_args()
    mins = [int(m) for m in args.mins.split(",")]
    as_is = indexer_topk._plan
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("\n| case | " + " | ".join("as is" if m == 0 else f"window >= {m}" for m in mins) + " |")
    print("|---|" + "---:|" * len(mins))
    for label, s, s_kv, topk, ranges in CASES:
        ks, ke = ranges(s, s_kv)
        q, _ = make_q((s, H), False)
        kv = make_keys(s_kv, False)
        w = torch.randn(s, H, device="cuda")
        cells, want = [], None
        for m in mins:
            indexer_topk._plan = plan_with_min(m) if m else as_is
            try:
                fn = lambda: indexer_topk.mqa_topk_indices(q, kv, w, ks, ke, topk)  # noqa: E731
                got = fn()
                want = got if want is None else want
                same = torch.equal(got, want)
                cells.append(f"{bench(fn, reps=3):.2f}" + ("" if same else " (DIFFERENT)"))
            finally:
                indexer_topk._plan = as_is
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
        del q, kv, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

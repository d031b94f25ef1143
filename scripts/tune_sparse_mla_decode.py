"""Sweep launch configurations of the sparse MLA decode kernel on the local GPU.

For each DeepSeek-V4 decode case, times every (BLOCK_H, BLOCK_N, num_warps, num_stages, PREFETCH)
config and several split-KV counts (GPU time from CUDA-graph replay of 20 calls, L2 not flushed),
checks the output against the default configuration, and prints the best few per case as a markdown table. Configurations that
fail to compile or run out of resources are listed as such. Usage:

    python scripts/tune_sparse_mla_decode.py [--quick] [--top N] [--grid JSON] [--waves auto|all]

``--grid '{"BLOCK_H": [64], "num_warps": [8, 16]}'`` replaces those axes of the grid.
"""
import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton

from sm12x.kernels.sparse_mla.reference import make_case
from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
from gpu_timing import time_us

CASES = [  # (label, make_case kwargs)
    ("b2 h64 128+512p64", dict(b=2, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64)),
    ("b64 h64 128+512p64", dict(b=64, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64)),
    ("b74 h64 128+512p64", dict(b=74, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64)),
    ("b148 h64 128+512p64", dict(b=148, s_q=2, h_q=64, topk=128, page=256, extra_topk=512,
                                 extra_page=64)),
    ("b74 h128 128+1024p64", dict(b=74, s_q=2, h_q=128, topk=128, page=256, extra_topk=1024,
                                  extra_page=64)),
    ("b128 h128 128+1024p64", dict(b=128, s_q=2, h_q=128, topk=128, page=256, extra_topk=1024,
                                   extra_page=64)),
    ("b1 h16 128+1024p2", dict(b=1, s_q=1, h_q=16, topk=128, page=256, extra_topk=1024, extra_page=2,
                               extra_topk_length=True)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--grid", default="", help="JSON dict of axis -> values overriding the grid")
    ap.add_argument("--waves", choices=("auto", "all"), default="all",
                    help="auto: only the default split count")
    ap.add_argument("--cases", default="", help="comma-separated case labels (default: all)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tune_sparse_mla_decode: needs a CUDA GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = dict(BLOCK_H=(16, 32, 64), BLOCK_N=(16, 32, 64), num_warps=(4, 8), num_stages=(1,),
                PREFETCH=(0, 1, 2))
    if args.quick:
        grid = dict(BLOCK_H=(16, 32, 64), BLOCK_N=(32, 64), num_warps=(4, 8), num_stages=(1,),
                    PREFETCH=(1, 2))
    if args.grid:
        grid.update({k: tuple(v) for k, v in json.loads(args.grid).items()})
    print(f"# sparse MLA decode tuning, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()} ({sms} SMs), torch {torch.__version__}, "
          f"triton {triton.__version__}\n")
    for label, kw in CASES:
        if args.cases and label not in args.cases.split(","):
            continue
        case = make_case(device="cuda", sink=True, **kw)
        os.environ.pop("SM12X_SPARSE_MLA_CONFIG", None)
        ref_out, _ = sparse_mla_decode(**case)
        default_us = time_us(lambda: sparse_mla_decode(**case))
        rows = []
        for values in itertools.product(*grid.values()):
            cfg = dict(zip(grid, values))
            if cfg["BLOCK_H"] > max(16, triton.next_power_of_2(kw["h_q"])):
                continue
            os.environ["SM12X_SPARSE_MLA_CONFIG"] = ",".join(f"{k}={v}" for k, v in cfg.items())
            heads = triton.cdiv(kw["h_q"], cfg["BLOCK_H"])
            base = kw["b"] * kw["s_q"] * heads
            all_waves = (None, 1, 2, 4) if args.quick else (None, 1, 2, 4, 8)
            for waves in ((None,) if args.waves == "auto" else all_waves):
                splits = None if waves is None else max(1, triton.cdiv(waves * sms, base))
                try:
                    out, _ = sparse_mla_decode(**case, num_splits=splits)
                    ok = (out.float() - ref_out.float()).abs().max().item() < 2e-3
                    us = time_us(lambda: sparse_mla_decode(**case, num_splits=splits))
                except Exception as e:  # compile / resource failures are results too
                    rows.append((float("inf"), cfg, splits, f"{type(e).__name__}"))
                    break
                rows.append((us, cfg, "auto" if splits is None else splits, "ok" if ok else "MISMATCH"))
        os.environ.pop("SM12X_SPARSE_MLA_CONFIG", None)
        rows.sort(key=lambda r: r[0])
        print(f"## {label}: default config {default_us:.1f} us\n")
        print("| us | BLOCK_H | BLOCK_N | warps | stages | PREFETCH | splits | check |\n"
              "|---|---|---|---|---|---|---|---|")
        for us, cfg, splits, note in rows[: args.top]:
            print(f"| {us:.1f} | {cfg['BLOCK_H']} | {cfg['BLOCK_N']} | {cfg['num_warps']} | "
                  f"{cfg['num_stages']} | {cfg.get('PREFETCH', 1)} | {splits} | {note} |")
        failed = [r for r in rows if r[3] not in ("ok",)]
        if failed:
            print(f"\n{len(failed)} failed/mismatched: " + "; ".join(
                f"{r[1]} splits={r[2]}: {r[3]}" for r in failed[:8]))
        print()


if __name__ == "__main__":
    main()

"""Sweep launch configurations of the indexer logits kernels (FP8 prefill and paged decode) on the
local GPU; GPU time from CUDA-graph replay, output checked against the default configuration.
Prints the best few per case as markdown. Usage:

    python scripts/tune_indexer.py [--top N] [--prefill-grid JSON] [--paged-grid JSON]

A grid JSON (dict of axis -> values) replaces those axes of the default grid."""
import argparse
import itertools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton

from gpu_timing import time_us
from sm12x.kernels.common import configs
from sm12x.kernels.indexer import mqa_logits as mqa
from sm12x.kernels.indexer import paged_mqa_logits as paged
from sm12x.commands.selftest import _mqa_inputs, _paged_inputs


def sweep(label, default_cfg, grid, run, amount, unit, top):
    """``amount`` FLOPs (unit TFLOPS) or bytes (unit GB/s) moved per call."""
    per_us = 1e6 if unit == "TFLOPS" else 1e3
    ref = run(default_cfg).clone()
    default_us = time_us(lambda: run(default_cfg))
    rows = []
    for values in itertools.product(*grid.values()):
        cfg = dict(zip(grid, values))
        try:
            out = run(cfg)
            finite = ref.isfinite()
            ok = bool((out[finite] - ref[finite]).abs().max() <= 1e-3 * ref[finite].abs().max())
            us = time_us(lambda: run(cfg))
        except Exception as e:
            rows.append((float("inf"), cfg, type(e).__name__))
            continue
        rows.append((us, cfg, "ok" if ok else "MISMATCH"))
    rows.sort(key=lambda r: r[0])
    print(f"## {label}: default {default_cfg} {default_us:.1f} us "
          f"({amount / default_us / per_us:.0f} {unit})\n")
    print("| us | rate | config | check |\n|---|---|---|---|")
    for us, cfg, note in rows[:top]:
        print(f"| {us:.1f} | {amount / us / per_us:.0f} {unit} | {cfg} | {note} |")
    bad = [r for r in rows if r[2] != "ok"]
    if bad:
        print(f"\n{len(bad)} failed: " + "; ".join(f"{r[1]}: {r[2]}" for r in bad[:6]))
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--prefill-grid", default="")
    ap.add_argument("--paged-grid", default="")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-paged", action="store_true")
    args = ap.parse_args()
    prefill_grid = dict(key_rows=(False, True), rows=(128, 256), BLOCK_N=(64, 128), N_ITERS=(8, 16, 64),
                        num_warps=(4, 8), num_stages=(2, 3))
    prefill_grid.update({k: tuple(v) for k, v in json.loads(args.prefill_grid or "{}").items()})
    paged_grid = dict(key_rows=(False, True), rows=(64, 128), SUB_N=(64,), N_ITERS=(4, 16, 64),
                      num_warps=(4, 8), num_stages=(2, 3))
    paged_grid.update({k: tuple(v) for k, v in json.loads(args.paged_grid or "{}").items()})
    if not torch.cuda.is_available():
        raise SystemExit("tune_indexer: needs a CUDA GPU")
    print(f"# indexer tuning, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}\n")
    dev = torch.device("cuda")
    s, s_kv, h, d = 2048, 8192, 64, 128
    q, _, k, k_sf, w, ks, ke = _mqa_inputs("cuda", s, s_kv, h, d)
    # causal ranges, as bench_indexer.py (ragged ranges make programs compute columns few rows see)
    ks = torch.zeros_like(ks)
    ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
    out = mqa.alloc_logits(s, s_kv, h, torch.float32, dev)
    flops = 2.0 * h * d * float((ke - ks).clamp(min=0).sum())
    if not args.skip_prefill:
        sweep(f"prefill fp8 S={s} S_kv={s_kv}", configs.pick(mqa.CONFIGS, dev)["fp8"], prefill_grid,
              lambda cfg: mqa.launch(q, None, k, k_sf, w, ks, ke, out, clean=True, compressed=False,
                                     out_mode=0, config=cfg),
              flops, "TFLOPS", args.top)
    for next_n in (() if args.skip_paged else (1, 2)):
        q2, cache, w2, cl, bt, max_len = _paged_inputs("cuda", 256, next_n, h, d, 64, 8192)
        out2 = paged.alloc_logits(256 * next_n, max_len, torch.float32, dev)
        nbytes = float(cl[:, -1].sum()) * (d + 4) + float(cl.sum()) * 4
        sweep(f"paged fp8 B=256 next_n={next_n} ctx<=8192", configs.pick(paged.CONFIGS, dev)["fp8"],
              paged_grid,
              lambda cfg: paged.launch(q2, None, cache, w2, cl, bt, max_len, out2, clean=True,
                                       out_mode=0, config=cfg),
              nbytes, "GB/s", args.top)


if __name__ == "__main__":
    main()

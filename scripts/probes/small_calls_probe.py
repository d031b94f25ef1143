"""Probe: the decode plan for small calls (one to sixteen requests) against forced head blocks
and split counts, and the combine launched with and without PDL (H200, SM12X_FORCE=1).

For each case: the plan's own choice with PDL (where the plan uses it) and with SM12X_PDL=0,
then each head-block config of the GPU's config set (or SM12X_KERNEL_CONFIGS's) at the plan's
split count and at split counts that give about half, one and two programs per SM. Kernel span (profiler trace, L2 flushed, mean of
``--iters`` calls); every forced variant is checked against the plan's output.

    python scripts/probes/small_calls_probe.py [--iters 20] [--out results.md]
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton

from gpu_timing import kernel_span_us
from sm12x.kernels.common import configs
from sm12x.kernels.sparse_mla import decode as mod
from sm12x.kernels.sparse_mla.reference import make_case

LAYERS = {"CSA": dict(extra_topk=512, extra_page=64), "CSA128": dict(extra_topk=1024, extra_page=64),
          "HCA len": dict(extra_topk=1024, extra_page=2, extra_topk_length=True)}


def cases():
    out = []
    for h_q, layers in ((64, ("CSA", "HCA len")), (128, ("CSA128", "HCA len"))):
        for layer in layers:
            for b in (1, 2, 4, 8, 16):
                out.append((f"b{b} h{h_q} {layer}", dict(b=b, s_q=2, h_q=h_q, **LAYERS[layer])))
    for s_q in (1, 2):
        for layer in ("CSA", "HCA len"):
            out.append((f"b1 s{s_q} h16 {layer}", dict(b=1, s_q=s_q, h_q=16, **LAYERS[layer])))
    return out


def plan_of(case, dev):
    b, s_q, h_q, _ = case["q"].shape
    xtopk = case["extra_indices"].shape[-1]
    ragged = case.get("extra_topk_length") is not None
    return mod.plan(b, s_q, h_q, case["indices"].shape[-1], xtopk, dev, ragged=ragged)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop starting cases after this")
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = configs.sm_count(dev)
    lines = [f"# small decode calls, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{torch.cuda.get_device_name()} ({sms} SMs), torch {torch.__version__}, "
             f"triton {triton.__version__}; kernel span µs (programs), L2 flushed\n",
             "| case | plan | plan µs | plan, no PDL | H16 | H32 | H64 | best forced |",
             "|---|---|---:|---:|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    t0 = time.time()
    for label, kw in cases():
        if time.time() - t0 > args.budget_s:
            lines.append(f"| {label} | (time budget spent) |")
            print(lines[-1], flush=True)
            continue
        case = make_case("model1", device="cuda", seed=1, **kw)
        os.environ.pop("SM12X_SPARSE_MLA_CONFIG", None)
        os.environ.pop("SM12X_PDL", None)
        mod._PLANS.clear()
        pl = plan_of(case, dev)
        ref, _ = mod.sparse_mla_decode(**case)
        ref = ref.clone()
        plan_us = kernel_span_us(lambda: mod.sparse_mla_decode(**case), args.iters)
        os.environ["SM12X_PDL"] = "0"
        mod._PLANS.clear()
        nopdl_us = kernel_span_us(lambda: mod.sparse_mla_decode(**case), args.iters)
        os.environ.pop("SM12X_PDL", None)
        mod._PLANS.clear()
        cols, best = [], (float("inf"), "")
        for cfg in configs.pick(mod.CONFIGS, dev)["model1"]:
            if cfg["BLOCK_H"] > max(16, triton.next_power_of_2(kw["h_q"])):
                cols.append("-")
                continue
            os.environ["SM12X_SPARSE_MLA_CONFIG"] = ",".join(f"{k}={v}" for k, v in cfg.items())
            rows = kw["b"] * kw["s_q"] * triton.cdiv(kw["h_q"], cfg["BLOCK_H"])
            tiles = plan_of(case, dev).tiles
            splits = sorted({None} | {min(tiles, max(1, round(m * sms / rows)))
                                      for m in (0.5, 1, 2)}, key=lambda v: -1 if v is None else v)
            cell = []
            for k in splits:
                out, _ = mod.sparse_mla_decode(**case, num_splits=k)
                bad = not torch.allclose(out.float(), ref.float(), atol=2e-3, rtol=2 / 128)
                us = kernel_span_us(lambda: mod.sparse_mla_decode(**case, num_splits=k), args.iters)
                programs = mod.plan(kw["b"], kw["s_q"], kw["h_q"], case["indices"].shape[-1],
                                    kw["extra_topk"], dev, num_splits=k,
                                    ragged="extra_topk_length" in kw).programs
                cell.append(f"{'auto' if k is None else k}: {us:.1f} ({programs}){' BAD' if bad else ''}")
                if us < best[0] and not bad:
                    best = (us, f"H{cfg['BLOCK_H']} {'auto' if k is None else k}")
            cols.append("; ".join(cell))
        os.environ.pop("SM12X_SPARSE_MLA_CONFIG", None)
        desc = (f"H{pl.cfg['BLOCK_H']} {pl.programs}p{' dealt' if pl.dealt else ''}"
                f"{' pdl' if pl.pdl else ''}")
        lines.append(f"| {label} | {desc} | {plan_us:.1f} | {nopdl_us:.1f} | {' | '.join(cols)} | "
                     f"{best[0]:.1f} {best[1]} |")
        print(lines[-1], flush=True)
        del case
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

"""Pointer loads vs TMA descriptor loads of the key tiles in the paged decode logits kernel, on
the benchmark's inputs (``bench_indexer.py``: per-request context uniform in 0.7-1.3 x the
average, random block tables, clean logits). Each variant patches the picked configuration in
place (so ``paged_mqa_logits.grid_columns`` still sizes the grid) and must reproduce the first variant's
logits exactly ("DIFFERS" otherwise). Prints GB/s (byte model of ``bench_indexer.py``) as markdown.

    python scripts/tune_tma.py
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import torch  # noqa: E402
import triton  # noqa: E402

from bench_indexer import D, paged_case  # noqa: E402
from gpu_timing import time_us  # noqa: E402
from sm12x.kernels import configs  # noqa: E402
from sm12x.kernels.indexer import paged_mqa_logits as pm  # noqa: E402

# (pair_stages too: the configs give token pairs their own depth)
PAGED = [("pointers, 3 stages", {"tma": False, "num_stages": 3, "pair_stages": 3}),
         ("TMA, 3 stages", {"tma": True, "num_stages": 3, "pair_stages": 3}),
         ("TMA, 2 stages", {"tma": True, "num_stages": 2, "pair_stages": 2}),
         ("pointers, 2 stages", {"tma": False, "num_stages": 2, "pair_stages": 2})]


def run_variants(cfg: dict, variants, call, rate, same=None):
    """Time ``call(out)`` under each variant of ``cfg`` (patched in place, then restored);
    ``same(out, first)`` says whether a variant's output agrees with the first's (default: equal)."""
    same = same or (lambda out, first: torch.equal(out.nan_to_num(), first.nan_to_num()))
    saved = dict(cfg)
    cells, first = [], None
    try:
        for _, change in variants:
            cfg.clear()
            cfg.update(saved, **change)
            out = call(None)
            if first is None:
                first = out.clone()
            agrees = same(out, first)
            us = time_us(lambda: call(out), iters=20)
            cells.append(f"{rate(us):.0f}" + ("" if agrees else " (DIFFERS)"))
    finally:
        cfg.clear()
        cfg.update(saved)
    return cells


SHAPES = ((256, 8192), (256, 32768), (256, 65536), (1024, 8192), (4096, 8192), (4, 65536))


def paged_table(dev, variants, shapes=SHAPES, same=None, label="paged"):
    """GB/s of each variant of the FP8 paged config on ``bench_indexer``'s inputs, next_n 1 and 2,
    as a markdown table (``same`` as in ``run_variants``)."""
    cfg = configs.pick(pm.CONFIGS, dev)["fp8"]
    print(f"| {label} | " + " | ".join(n for n, _ in variants) + " |")
    print("|---|" + "---:|" * len(variants))
    for b, ctx_avg in shapes:
        for next_n in (1, 2):
            torch.manual_seed(0)
            ctx, cache, bt, cl, (q, _), w, mcl = paged_case(b, ctx_avg, next_n, False)
            nbytes = int(ctx.long().sum()) * (D + 4) + int(cl.long().sum()) * 4 + q.numel() + w.numel() * 4

            def call(out):
                out = pm.alloc_logits(b * next_n, mcl, torch.float32, dev) if out is None else out
                return pm.launch(q, None, cache, w, cl, bt, mcl, out, clean=True, out_mode=0)

            cells = run_variants(cfg, variants, call, lambda us: nbytes / us / 1e3, same)
            print(f"| B={b} ctx~{ctx_avg} next_n={next_n} | " + " | ".join(cells) + " |", flush=True)
            del cache, bt, q, w
            torch.cuda.empty_cache()


def main():
    if not torch.cuda.is_available():
        raise SystemExit("tune_tma: needs a CUDA GPU")
    dev = torch.device("cuda")
    print(f"# TMA key loads, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()}, "
          f"configs {configs.arch_key(dev)}, torch {torch.__version__}, triton {triton.__version__}\n")
    paged_table(dev, PAGED)


if __name__ == "__main__":
    main()

"""A/B tables of indexer logits config variants given on the command line, on the benchmark's
inputs (``bench_indexer.py``). Each variant patches the GPU's picked configuration in place (so
``configs.fit_iters`` / ``paged_mqa_logits.grid_columns`` still size the grid) and must agree with the first variant to DeepGEMM's
calc_diff < 1e-5 ("DIFFERS" otherwise). Prints TFLOPS (prefill) / GB/s (paged) as markdown.

    python scripts/tune_logits_variants.py [--unclean] [--quick] \
        --prefill '[["now", {}], ["128 tiles", {"N_ITERS": 128}]]' \
        --paged '[["now", {}], ["4 stages", {"num_stages": 4}]]'
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import torch  # noqa: E402
import triton  # noqa: E402

from bench_indexer import D, H, make_keys, make_q  # noqa: E402
from sm12x.kernels import configs  # noqa: E402
from sm12x.kernels.indexer import mqa_logits as mqa  # noqa: E402
from sm12x.kernels.common.tolerance import deepgemm_diff  # noqa: E402
from tune_tma import SHAPES, paged_table, run_variants  # noqa: E402

PREFILL_SHAPES = ((2048, 8192), (4096, 32768), (8192, 65536))


def agree(out, first):
    return deepgemm_diff(out.float(), first.float()) < 1e-5


def prefill_table(dev, variants, shapes=PREFILL_SHAPES, clean=True, label="prefill (TFLOPS)"):
    """TFLOPS of each variant of the FP8 prefill config, causal ranges as in ``bench_indexer``."""
    cfg = configs.pick(mqa.CONFIGS, dev)["fp8"]
    print(f"| {label} | " + " | ".join(n for n, _ in variants) + " |")
    print("|---|" + "---:|" * len(variants))
    for s, s_kv in shapes:
        torch.manual_seed(0)
        q, _ = make_q((s, H), False)
        k, k_sf = make_keys(s_kv, False)
        w = torch.randn(s, H, device=dev)
        ks = torch.zeros(s, dtype=torch.int32, device=dev)
        ke = torch.arange(s, dtype=torch.int32, device=dev) + (s_kv - s) + 1  # causal
        flops = 2 * int((ke - ks).sum()) * H * D

        def call(out):
            out = mqa.alloc_logits(s, s_kv, H, torch.float32, dev) if out is None else out
            return mqa.launch(q, None, k, k_sf, w, ks, ke, out, clean=clean, compressed=False, out_mode=0)

        # unclean logits leave unseen columns undefined: compare the visible ones only
        seen = torch.arange(s_kv, device=dev)[None, :] < ke[:, None]

        def same(out, first):
            return agree(torch.where(seen, out, 0.0), torch.where(seen, first, 0.0))

        cells = run_variants(cfg, variants, call, lambda us: flops / us / 1e6, same)
        print(f"| S={s} S_kv={s_kv} | " + " | ".join(cells) + " |", flush=True)
        del q, k, k_sf, w
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", default="", help="JSON list of [label, config changes]")
    ap.add_argument("--paged", default="", help="JSON list of [label, config changes]")
    ap.add_argument("--unclean", action="store_true", help="prefill with clean_logits=False")
    ap.add_argument("--quick", action="store_true", help="paged: three shapes instead of six")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("tune_logits_variants: needs a CUDA GPU")
    dev = torch.device("cuda")
    print(f"# Indexer logits variants, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()}, configs {configs.arch_key(dev)}, torch {torch.__version__}, "
          f"triton {triton.__version__}\n")
    if args.prefill:
        prefill_table(dev, [tuple(v) for v in json.loads(args.prefill)], clean=not args.unclean,
                      label="prefill, " + ("unclean" if args.unclean else "clean") + " (TFLOPS)")
        print()
    if args.paged:
        shapes = ((256, 8192), (256, 65536), (1024, 8192)) if args.quick else SHAPES
        paged_table(dev, [tuple(v) for v in json.loads(args.paged)], shapes, agree, "paged (GB/s)")


if __name__ == "__main__":
    main()

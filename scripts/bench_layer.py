#!/usr/bin/env python
"""Time DeepSeek-V4-Flash layers end to end on a CUDA GPU: the prefill of one 4,096-token request,
a prefill chunk of 63 more requests, decode steps at batch 1 and 64, spec decode with 2 and 4
tokens (8 requests), and the peak GPU memory (``sm12x.layer.run.time_layer``).

    python scripts/bench_layer.py [--layers N] [--repeats R] [--json PATH]

Rows, in the same run on the same weights and inputs:

- sm12x: every kernel call through the deep_gemm / flash_mla front ends sm12x installs (the
  stand-in ``deep_gemm``, the FlashMLA functions of the flash_mla patches, the fused indexer
  top-k), SM12x call forms (packed UE8M0 scales);
- native: the same layer on an installed FlashMLA and DeepGEMM (their own kernels; SM90 call forms,
  float32 scales, on Hopper), when both import and are not sm12x's stand-ins;
- torch bf16: otherwise, the layer's torch reference path with bf16 GEMMs (linears, wo_a, experts
  one expert at a time; softmax and attention in float32): a plain-PyTorch floor to compare with,
  not a fast implementation. The table says which one ran.

Times are wall-clock per step of the whole stack with CUDA synchronised around it (median of
``repeats`` decode steps, each advancing the requests; one prefill), so they include the layer's
torch work between kernels (cache writes, the compressor, routing) as a framework would run it
eagerly, without CUDA graphs. Prints a markdown table with the date, GPU, torch and triton versions.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch


def _native():
    """(deep_gemm, flash_mla) when both are installed for real, else None and why."""
    try:
        import deep_gemm
        import flash_mla
    except Exception as e:  # noqa: BLE001 (any import failure means: not available)
        return None, f"not importable ({type(e).__name__}: {e})"
    if getattr(deep_gemm, "__sm12x_shim__", False):
        return None, "deep_gemm is sm12x's stand-in"
    return (deep_gemm, flash_mla), ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=1, help="stacked layers (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="decode steps timed per row (median)")
    p.add_argument("--json", help="also write the numbers as JSON")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_layer: needs a CUDA GPU (the CPU runs the layer under the Triton interpreter: "
              "use `python3 -m sm12x selftest --layer` there)", file=sys.stderr)
        return 2
    import triton

    from sm12x.layer.config import V4_FLASH
    from sm12x.layer.run import PRODUCTION, time_layer

    rows = {"sm12x": time_layer(V4_FLASH, PRODUCTION, "cuda", layers=a.layers, repeats=a.repeats)}
    torch.cuda.empty_cache()
    native, why = _native()
    if native is not None:
        dg, fmla = native
        rows["native FlashMLA + DeepGEMM"] = time_layer(V4_FLASH, PRODUCTION, "cuda", layers=a.layers,
                                                        repeats=a.repeats, dg=dg, fmla=fmla, scale_format="fp32")
        note = "native: the installed FlashMLA and DeepGEMM kernels, SM90 call forms"
    else:
        rows["torch bf16 (reference path)"] = time_layer(V4_FLASH, PRODUCTION, "cuda", layers=a.layers,
                                                         repeats=a.repeats, reference=True,
                                                         reference_dtype=torch.bfloat16)
        note = f"FlashMLA / DeepGEMM {why}: the torch bf16 reference path is timed beside instead"
    steps = list(rows["sm12x"]["ms_per_step"])
    print(f"{datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; {a.layers} DeepSeek-V4-Flash CSA layer(s); {note}\n")
    print("| step | " + " | ".join(f"{name} (ms)" for name in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for s in steps:
        print(f"| {s} | " + " | ".join(f"{r['ms_per_step'][s]:.2f}" for r in rows.values()) + " |")
    print("| peak GPU memory (GiB) | " + " | ".join(f"{r['peak_gib']:.1f}" for r in rows.values()) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "note": note, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

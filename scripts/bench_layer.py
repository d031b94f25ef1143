#!/usr/bin/env python
"""Time DeepSeek-V4-Flash layers end to end on a CUDA GPU: the prefill of one 4,096-token request,
a prefill chunk of 63 more requests, decode steps at batch 1 and 64, spec decode with 2 and 4
tokens (8 requests), and the peak GPU memory (``sm12x.layer.run.time_layer``).

    python scripts/bench_layer.py [--layers N] [--repeats R] [--json PATH] [--check-native]

With FlashMLA and DeepGEMM built by ``scripts/build_native.sh`` (on the path given by
``PYTHONPATH``; sm12x's ``sitecustomize`` must not be on it, or it patches them): ``--check-native``
first runs the native row's layer once against the float32 reference (every call's error against
its budget, as ``sm12x selftest --layer`` does for sm12x's calls), so the timed row is known to be
the same layer.

Rows, in the same run on the same weights and inputs:

- sm12x: every kernel call through the deep_gemm / flash_mla front ends sm12x installs (the
  stand-in ``deep_gemm``, the FlashMLA functions of the flash_mla patches, the fused indexer
  top-k), SM12x call forms (packed UE8M0 scales);
- native: the same layer on an installed FlashMLA and DeepGEMM (their own kernels, built from
  source by ``scripts/build_native.sh``; SM90 call forms, float32 scales, on Hopper), when both
  import, are not sm12x's stand-ins or patched by sm12x, and the GPU is SM90
  (``sm12x.layer.native``): the proxy for the layer on native kernels. Where DeepGEMM has no SM90
  form of a call the row says what it runs instead: the routed experts as FP8 (re-quantised from
  MXFP4, twice the expert weight bytes), the indexer as DeepGEMM's logits then ``torch.topk``;
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


# what the native row calls (sm12x.layer.native), by module
NATIVE_DG = ("fp8_gemm_nt", "fp8_einsum", "tf32_hc_prenorm_gemm", "m_grouped_fp8_gemm_nt_contiguous",
             "m_grouped_fp8_gemm_nt_masked", "fp8_mqa_logits", "get_paged_mqa_logits_metadata",
             "fp8_paged_mqa_logits", "get_mn_major_tma_aligned_tensor", "get_mk_alignment_for_contiguous_layout")
NATIVE_FMLA = ("flash_mla_sparse_fwd", "flash_mla_with_kvcache", "get_mla_metadata")


def _native():
    """(deep_gemm, flash_mla) when both are installed for real and can run their SM90 forms here,
    else None and why."""
    try:
        import deep_gemm
        import flash_mla
    except Exception as e:  # noqa: BLE001 (any import failure means: not available)
        return None, f"not importable ({type(e).__name__}: {e})"
    if getattr(deep_gemm, "__sm12x_shim__", False):
        return None, "deep_gemm is sm12x's stand-in"
    for module, names in ((deep_gemm, NATIVE_DG), (flash_mla, NATIVE_FMLA)):
        missing = [n for n in names if not hasattr(module, n)]
        if missing:
            return None, f"{module.__name__} has no {', '.join(missing)}"
        patched = [n for n in names if getattr(getattr(module, n), "__sm12x_patch__", None)]
        if patched:
            return None, (f"{module.__name__}.{patched[0]} is sm12x's patch (run without sm12x's "
                          "sitecustomize on PYTHONPATH)")
    major = torch.cuda.get_device_capability()[0]
    if major != 9:
        return None, f"the native row runs DeepGEMM's / FlashMLA's SM90 forms; this GPU is sm_{major}x"
    return (deep_gemm, flash_mla), ""


def _native_versions(deep_gemm, flash_mla) -> str:
    """The versions, and the commits ``scripts/build_native.sh`` recorded beside the packages."""
    text = f"DeepGEMM {getattr(deep_gemm, '__version__', '?')}, FlashMLA {getattr(flash_mla, '__version__', '?')}"
    stamp = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(deep_gemm.__file__))),
                         "sm12x_native_versions.txt")
    if os.path.exists(stamp):
        with open(stamp) as f:
            commits = [line.split()[0] + " " + line.split()[2][:12] for line in f
                       if line.split() and line.split()[0] in ("FlashMLA", "DeepGEMM") and len(line.split()) > 2]
        text += " (" + ", ".join(commits) + ")"
    if os.environ.get("DG_JIT_USE_NVRTC", "0") == "1":
        text += ", DeepGEMM's kernels compiled with NVRTC"
    return text


def _check_native(dg, fmla, layers) -> bool:
    from sm12x.layer.config import V4_FLASH
    from sm12x.layer.run import PRODUCTION, run_check

    report = run_check(V4_FLASH, PRODUCTION, "cuda", layers=layers, dg=dg, fmla=fmla, native=True)
    for op, err in report["op_errors"].items():
        print(f"  native op {op:40} {'recall (min)' if op.endswith('recall') else 'rel err (max)'} {err:.2e}")
    for s in report["steps"]:
        print(f"  native {s['step']:44} output err {s['layers'][-1]['out']:.2e}")
    for f in report["failures"]:
        print(f"FAIL native layer: {f}")
    print("native layer check: PASS" if report["ok"] else "native layer check: FAIL")
    torch.cuda.empty_cache()
    return report["ok"]


def _warm_native(index: int) -> int:
    """Run step ``index`` of the scenario once through the native row's layer, so DeepGEMM compiles
    that step's kernels (``scripts/build_native.sh --warm`` runs every step at once, one process
    each). The steps before it run first (untimed): a step's layer reads the caches and the
    compressor's raw rows its predecessors wrote, so they must exist."""
    import time

    from sm12x.layer.config import V4_FLASH
    from sm12x.layer.run import PRODUCTION, LayerStack, scenario_steps

    native, why = _native()
    if native is None:
        print(f"warm {index}: no native row here: {why}")
        return 1
    steps = scenario_steps(PRODUCTION)
    if not 0 <= index < len(steps):
        print(f"bench_layer: --warm-native {index}: a step index 0..{len(steps) - 1}", file=sys.stderr)
        return 2
    dg, fmla = native
    stack = LayerStack(V4_FLASH, 1, PRODUCTION, "cuda", dg=dg, fmla=fmla, native=True, check_ops=False,
                       reference=False)
    for _, reqs, counts, decode in steps[:index]:
        stack.step(reqs, counts, decode, compare=False)
    name, reqs, counts, decode = steps[index]
    t0 = time.perf_counter()
    stack.step(reqs, counts, decode, compare=False)
    torch.cuda.synchronize()
    print(f"warm {index} ({name}): {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=1, help="stacked layers (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="decode steps timed per row (median)")
    p.add_argument("--json", help="also write the numbers as JSON")
    p.add_argument("--check-native", action="store_true",
                   help="check the native row's layer against the float32 reference before timing it")
    p.add_argument("--warm-native", type=int, metavar="STEP",
                   help="only run scenario step STEP through the native row once (compiles its DeepGEMM kernels)")
    a = p.parse_args(argv)
    if a.warm_native is not None:
        if not torch.cuda.is_available():
            print("bench_layer: --warm-native needs a CUDA GPU", file=sys.stderr)
            return 2
        return _warm_native(a.warm_native)
    if a.layers < 1 or a.repeats < 1:
        print(f"bench_layer: --layers {a.layers} / --repeats {a.repeats}: both must be >= 1", file=sys.stderr)
        return 2
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
        versions = _native_versions(dg, fmla)
        ok = True
        if a.check_native:
            try:
                ok = _check_native(dg, fmla, 1)
            except Exception as e:  # noqa: BLE001 (reported; the timing still runs)
                print(f"native layer check: ERROR {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                ok = False
        try:
            rows["native FlashMLA + DeepGEMM (SM90)"] = time_layer(V4_FLASH, PRODUCTION, "cuda", layers=a.layers,
                                                                   repeats=a.repeats, dg=dg, fmla=fmla, native=True)
            note = (f"native: {versions}, built from source, SM90 call forms (float32 scales); "
                    "*routed experts FP8 x FP8* (MXFP4 re-quantised: DeepGEMM has no FP4 grouped GEMM on SM90, "
                    "twice the expert weight bytes); *indexer* DeepGEMM logits + torch.topk"
                    + ("" if ok else "; its reference check FAILED"))
        except Exception as e:  # noqa: BLE001 (a native kernel that refuses is reported, sm12x's row kept)
            note = f"native ({versions}) failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if native is None:
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

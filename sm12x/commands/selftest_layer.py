"""``sm12x selftest --layer``: DeepSeek-V4-Flash layers end to end through the patched calls on this
machine, against the float32 reference, with the time per prefill and decode step.

On a CUDA GPU: production widths (hidden 4096, 64 heads, 256 MXFP4 experts, ...), ``depth`` stacked
layers (default 2), a 4,096-token prefill, a prefill chunk of 63 more requests, decode at batch 1 and
64, spec decode with 2 and 4 tokens; then the same steps again on fresh caches, timed (CUDA
synchronised wall time per step of the whole stack, the framework-side torch work of the layer
included), and the peak GPU memory. Without a GPU: small widths under the Triton interpreter, one
layer, a prefill chunk of two requests, decode at batch 2 and spec decode with 2 tokens; times are
not taken there. Exit code 1 when anything is over its budget (``sm12x.layer.run``).
"""
from __future__ import annotations

import json
import sys


def _scenarios(device):
    from sm12x.layer.config import V4_FLASH, small
    from sm12x.layer.run import PRODUCTION, Scenario

    if device == "cuda":
        return V4_FLASH, PRODUCTION, 2
    # one prefill chunk of 2 requests, decode batch 2, spec 2 x 2: every call form once
    return small(), Scenario(prefill_len=0, batch=2, other_len=24, spec=(2,), spec_batch=2, batch1=False), 1


def run_layer(device, depth=None, json_path=None, stream=None, header=None) -> int:
    import torch

    from sm12x.layer.run import run_check, time_layer

    stream = stream or sys.stdout
    cfg, scenario, default_depth = _scenarios(device)
    depth = depth or default_depth
    print(f"layer: DeepSeek-V4-Flash CSA layer x {depth}, hidden {cfg.hidden}, {cfg.heads} heads, "
          f"{cfg.experts} experts (MXFP4), through deep_gemm / flash_mla as the frameworks call them",
          file=stream)
    try:
        report = run_check(cfg, scenario, device, layers=depth)
    except Exception as e:  # a crashing call is a failure, reported like one
        report = {"ok": False, "failures": [f"{type(e).__name__}: {e}"], "steps": [], "op_errors": {},
                  "decisions": {}}
    times = None
    if report["ok"] and device == "cuda":
        times = time_layer(cfg, scenario, device, layers=depth, warm=False)
    for s in report["steps"]:
        worst = max((max(t.values()) for t in s["layers"]), default=0.0)
        out = s["layers"][-1]["out"] if s["layers"] else float("nan")
        timing = f"{times['ms_per_step'][s['step']]:9.2f} ms" if times else "(interpreter: untimed)" \
            if device != "cuda" else ""
        print(f"  {s['step']:44} rows {s['rows']:5}  output err {out:.2e}  worst boundary {worst:.2e}  {timing}",
              file=stream)
    for op, err in report["op_errors"].items():
        print(f"  op {op:40} {'recall (min)' if op.endswith('recall') else 'rel err (max)'} {err:.2e}", file=stream)
    for k, v in report["decisions"].items():
        how = "worst row" if k.endswith("recall") else "pooled over the steps"
        print(f"  reference's own choice: {k} {v:.3f} ({how}, worst layer; informative, not budgeted)", file=stream)
    if times and times.get("peak_gib") is not None:
        print(f"  peak GPU memory {times['peak_gib']:.2f} GiB", file=stream)
    for f in report["failures"]:
        print(f"FAIL layer: {f}", file=stream)
    print("layer: PASS" if report["ok"] else f"layer: FAIL ({len(report['failures'])} over budget)", file=stream)
    if json_path:
        doc = dict(header or {}, device=torch.cuda.get_device_name() if device == "cuda" else "none",
                   mode="cuda" if device == "cuda" else "interpreter", layer=report, times=times,
                   passed=int(report["ok"]), failed=int(not report["ok"]))
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2)
    return 0 if report["ok"] else 1

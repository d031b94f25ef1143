#!/usr/bin/env python3
"""The ISA report under the Triton this Python has: every op's sm_120 / sm_121 launch configurations
compiled here (no GPU), each with its hot loop's matrix instructions, the non-matrix instructions
per matrix instruction, registers, shared memory, resident CTAs per SM and the full-rate verdict
(``sm12x/kernels/common/isa.py``). Exit 1 when a configuration feeds FP8 / FP4 to a reduced-rate
MMA without an allow-list entry.

    python3 scripts/isa_report.py                          # summary per op, then every configuration
    python3 scripts/isa_report.py --ops mqa_logits --json isa.json
    VENVS=/tmp/sm12x-tritons bash scripts/compile_check_tritons.sh 3.6.0 3.7.1 3.8.0   # other Tritons

``sm12x selftest --ops isa`` prints the same inside a container.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ.pop("TRITON_INTERPRET", None)


def main() -> int:
    import triton

    from sm12x.kernels.common import isa_report
    from sm12x.kernels.registry import all_ops

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated op names (default: every op)")
    ap.add_argument("--targets", default="sm_120,sm_121")
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--summary-only", action="store_true", help="print the per-op summary only")
    args = ap.parse_args()
    ops = all_ops()
    if args.ops:
        wanted = [o.strip() for o in args.ops.split(",")]
        unknown = sorted(set(wanted) - {o.name for o in ops})
        if unknown:
            ap.error(f"argument --ops: unknown {', '.join(unknown)}; supported: {', '.join(o.name for o in ops)}")
        ops = [o for o in ops if o.name in wanted]
    rows = isa_report.report(ops, tuple(t.strip() for t in args.targets.split(",")))
    print(f"ISA report, Triton {triton.__version__}, targets {args.targets}")
    print(f"| op | configs | verdicts | hot-loop MMA kinds |\n|---|---:|---|---|")
    for op, s in isa_report.summarise(rows).items():
        verdicts = ", ".join(f"{v} {n}" for v, n in sorted(s["verdicts"].items()))
        print(f"| {op} | {s['configs']} | {verdicts} | {', '.join(s['kinds']) or '-'} |")
    if not args.summary_only:
        print()
        print(isa_report.format_rows(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(triton=triton.__version__, rows=[dataclasses.asdict(r) for r in rows]), f, indent=1)
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

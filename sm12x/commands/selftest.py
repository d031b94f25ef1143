"""``sm12x selftest``: the patch plan, then every bundled kernel against its PyTorch reference on
this machine.

On a CUDA GPU the cases run at production shapes (``--quick``: one per op, well under a minute;
``--full``: the DeepSeek-V4 decode sweep plus the V3.2 format and larger indexer shapes) and report
max abs/rel error, time per call (CUDA events, median of repeated calls) and GB/s or TFLOPS.
Without a GPU the same kernels run at small shapes under the Triton interpreter, labelled
``interpreter``: correctness only, times mean nothing there. ``--full`` also compiles every
sm_120/sm_121 kernel configuration and checks shared memory and spills, and prints the ISA report
(``--ops isa``: the matrix instructions of every hot loop and whether an FP8 / FP4 operand runs below
the full block-scaled rate). ``--layer``: instead of the ops one by one, DeepSeek-V4-Flash layers end
to end through the patched calls (``sm12x.commands.selftest_layer``). Exit code 1 on any failure.
No network, no model download.
"""
from __future__ import annotations

import functools
import json
import os
import sys

COMPILE = "compile"  # not an op: the sm_120/sm_121 compile check of every op
ISA = "isa"  # not an op: the ISA report (what the sm_120/sm_121 machine code of every op runs)


def _device():
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ["TRITON_INTERPRET"] = "1"  # must be set before kernels are launched
    return "cpu"


def check_compile(ops, full):
    """Compile every sm_120/sm_121 configuration of each op that launches kernels of its own; a
    configuration over the limits or with a reduced-rate MMA verdict (the ISA report) fails."""
    from sm12x.kernels.common import isa_report
    from sm12x.kernels.registry import result

    for op in ops:
        if op.compile_reports is None:
            continue
        reports = op.compile_reports(("sm_120", "sm_121"))
        reduced = [r for r in isa_report.judge(op.name, reports) if r.failed]
        bad = [r for r in reports if not r.ok]
        worst = max(reports, key=lambda r: r.shared_bytes)
        yield result("compile", f"{op.name}: {len(reports)} sm_120/sm_121 configs", ok=not bad and not reduced,
                     detail="; ".join([f"{r.kernel} {r.config} {r.target}: {r.problem}" for r in bad]
                                      + [f"{r.kernel} {r.config} {r.target}: reduced-rate MMA: {r.why}"
                                         for r in reduced]),
                     throughput=f"max smem {worst.shared_bytes} B, "
                     f"max regs {max(r.registers for r in reports)}")


def check_isa(ops, stream):
    """The ISA report of every op: per configuration the hot loop's matrix instructions and the
    verdict (an FP8 / FP4 operand on a reduced-rate MMA fails unless the allow-list says why)."""
    from sm12x.kernels.common import isa_report
    from sm12x.kernels.registry import result

    for op in ops:
        if op.compile_reports is None:
            continue
        rows = isa_report.report([op])
        print(isa_report.format_rows(rows), file=stream)
        verdicts = isa_report.summarise(rows).get(op.name, {}).get("verdicts", {})
        bad = [r for r in rows if r.failed]
        yield result(ISA, f"{op.name}: {len(rows)} sm_120/sm_121 configs", ok=not bad,
                     detail="; ".join(f"{r.kernel} {r.config} {r.target}: {r.why}" for r in bad),
                     throughput=", ".join(f"{v} {n}" for v, n in sorted(verdicts.items())))


def preflight(json_path=None) -> str:
    """Why the self-test cannot start (one line), or "": torch and triton importable here, and
    ``--json``'s file writable, both known before any kernel runs."""
    import importlib.util

    missing = [m for m in ("torch", "triton") if importlib.util.find_spec(m) is None]
    if missing:
        return (f"needs {' and '.join(missing)}, not installed in this Python ({sys.executable}): "
                f"run bash scripts/setup.sh, or the self-test inside the container")
    if json_path:
        folder = os.path.dirname(os.path.abspath(json_path)) or "."
        if os.path.isdir(json_path):
            return f"--json {json_path}: is a folder (give a file name, e.g. {os.path.join(json_path, 'selftest.json')})"
        if not os.path.isdir(folder):
            return f"--json {json_path}: folder {folder} does not exist (create it, or give another path)"
        if not os.access(folder, os.W_OK) or (os.path.exists(json_path) and not os.access(json_path, os.W_OK)):
            return f"--json {json_path}: cannot write there (give a path you can write)"
    return ""


def run(ops=None, full=False, json_path=None, stream=None, layer=None) -> int:
    from sm12x.commands import status as status_command

    problem = preflight(json_path)
    if problem:
        print(f"sm12x selftest: {problem}", file=sys.stderr)
        return 2
    stream = stream or sys.stdout
    device = _device()
    if layer is not None:
        if ops or full:
            print("sm12x selftest: argument '--layer' runs on its own; leave out --ops and --full", file=sys.stderr)
            return 2
        return _run_layer(device, layer, json_path, stream)
    from sm12x.kernels.registry import all_ops

    registry = all_ops()
    names = [op.name for op in registry] + [COMPILE, ISA]
    unknown = sorted(set(ops or ()) - set(names))
    if unknown:
        print(f"sm12x selftest: argument '--ops' got {', '.join(unknown)}; supported: "
              f"{', '.join(names)}", file=sys.stderr)
        return 2
    import torch
    import triton

    status = status_command.status_data()
    mode = "cuda" if device == "cuda" else "interpreter (CPU, small shapes; times are not meaningful)"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    print(f"sm12x selftest: device {gpu}, mode {mode}, torch {torch.__version__}, "
          f"triton {triton.__version__}", file=stream)
    status_command.print_status(status, stream)
    # --full compiles every configuration once (COMPILE judges the ISA verdicts too); the ISA
    # report's table prints only when asked for
    chosen = [o for o in names if (ops is None or o in ops) and (o != COMPILE or full or ops)
              and (o != ISA or ops)]
    checks = {op.name: functools.partial(op.selftest, device, full) for op in registry}
    checks[COMPILE] = functools.partial(check_compile, registry, full)
    checks[ISA] = functools.partial(check_isa, registry, stream)
    tty = stream.isatty()
    results = []
    for i, op in enumerate(chosen):
        if tty:
            stream.write(f"\r[{i + 1}/{len(chosen)}] {op} ...")
            stream.flush()
        try:
            for r in checks[op]():
                results.append(r)
                if tty:
                    stream.write("\r" + " " * 60 + "\r")
                print(_line(r), file=stream)
        except Exception as e:  # a crashing kernel is a failure, reported like one
            results.append(dict(op=op, case="(setup)", ok=False, max_abs=float("nan"),
                                max_rel=float("nan"), detail=f"{type(e).__name__}: {e}", us=0.0,
                                throughput=""))
            print(_line(results[-1]), file=stream)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed", file=stream)
    if json_path:
        doc = dict(device=gpu, mode="cuda" if device == "cuda" else "interpreter",
                   torch=torch.__version__, triton=triton.__version__, full=full,
                   status=status, results=results, passed=len(results) - failed, failed=failed)
        try:
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=2)
        except OSError as e:  # the results above are printed; say why the file is missing
            print(f"sm12x selftest: --json {json_path}: not written ({e.strerror or e})", file=sys.stderr)
            return 2
    return 1 if failed or not results else 0


def _run_layer(device, depth, json_path, stream) -> int:
    import torch
    import triton

    from sm12x.commands import selftest_layer
    from sm12x.commands import status as status_command

    if device == "cuda":
        torch.empty(0, device="cuda")  # the status header names the GPU
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    mode = "cuda" if device == "cuda" else "interpreter (CPU, small widths; times are not meaningful)"
    print(f"sm12x selftest --layer: device {gpu}, mode {mode}, torch {torch.__version__}, "
          f"triton {triton.__version__}", file=stream)
    status = status_command.status_data()
    return selftest_layer.run_layer(device, depth or None, json_path, stream,
                                    header=dict(torch=torch.__version__, triton=triton.__version__, status=status))


def _line(r) -> str:
    verdict = "PASS" if r["ok"] else "FAIL"
    if r["op"] in (COMPILE, ISA) or os.environ.get("TRITON_INTERPRET") != "1":
        timing = f"{r['us']:9.1f} us  {r['throughput']}" if r["us"] else r["throughput"]
    else:
        timing = "(interpreter: untimed)"
    text = f"{verdict} {r['op']:18} {r['case']:58} max_abs {r['max_abs']:.3g}  {timing}"
    return text + (f"  [{r['detail']}]" if r["detail"] else "")


def add_selftest_command(subparsers):
    p = subparsers.add_parser("selftest", help="every kernel against its reference on this machine")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="one production case per op (default)")
    g.add_argument("--full", action="store_true", help="the production sweep + compile check")
    p.add_argument("--ops", help="comma-separated op names (as the report lists them), 'compile' (the "
                   "sm_120/sm_121 compile check) or 'isa' (the ISA report: which MMA each hot loop runs)")
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write results as JSON")
    p.add_argument("--layer", nargs="?", type=_depth, const=0, metavar="DEPTH",
                   help="DeepSeek-V4-Flash layers end to end through the patched calls, against the "
                        "reference, with decode / prefill times (DEPTH layers; default 2 on a GPU, 1 on CPU)")
    p.set_defaults(func=lambda a: run(
        ops=[o.strip() for o in a.ops.split(",")] if a.ops else None, full=a.full,
        json_path=a.json_path, layer=a.layer))


def _depth(text):
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError(f"{text!r}: a layer count from 1 to 8")
    return value

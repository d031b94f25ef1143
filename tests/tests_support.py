"""Helpers for tests that run code in a fresh interpreter (imported by test modules; the
``tests`` folder is on sys.path through conftest)."""
import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_py(code, *, pythonpath, env=None, flags=(), check=True, timeout=600):
    """Run ``code`` with PYTHONPATH=``pythonpath`` and SM12X_ARCH=12.0 (unless ``env`` overrides;
    a None value removes a variable). Returns the CompletedProcess."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_") and k != "PYTHONPATH"}
    full.update({"PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "SM12X_ARCH": "12.0"})
    full.update(env or {})
    full = {k: v for k, v in full.items() if v is not None}
    proc = subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, env=full, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_tree(root, files):
    """Write ``{relative path: text}`` under ``root`` (a pathlib.Path); returns ``root``."""
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body).lstrip() if body else body)
    return root


# releases inside the patch records' checked ranges, for stand-in frameworks
RELEASES = {"vllm": "0.34.0", "sglang": "0.5.23", "sglang-kernel": "0.4.10"}


def dist_infos(releases=RELEASES):
    """``{path: text}`` of minimal dist-info folders, so ``importlib.metadata`` reports stand-in
    frameworks at these releases."""
    return {f"{name.replace('-', '_')}-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            for name, version in releases.items()}


def assert_within_sm12x_limits(reports, op="compile check"):
    """Print the compile reports' table and the ISA report, and fail, naming them, on any
    configuration over SM12x's shared memory, spilling registers, or feeding an FP8 / FP4 operand
    to a reduced-rate MMA in its hot loop on sm_120 / sm_121 without an allow-list entry
    (``sm12x.kernels.common.isa.ALLOW``)."""
    from sm12x.kernels.common import isa_report
    from sm12x.kernels.common.compile_check import format_reports, over_limits

    print()
    print(format_reports(reports))
    bad = over_limits(reports)
    assert not bad, format_reports(bad)
    rows = isa_report.judge(op, [r for r in reports if r.target.startswith("sm_12")])
    print(isa_report.format_rows(rows))
    reduced = [r for r in rows if r.failed]
    assert not reduced, "reduced-rate MMA on SM12x:\n" + isa_report.format_rows(reduced)

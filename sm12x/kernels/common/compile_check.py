"""Compile Triton kernels for GPUs that are not present and report their resource use.

Triton can build a cubin for any target (``GPUTarget("cuda", 120, 32)``) on a machine without that
GPU. This module compiles one kernel configuration for one target and reads shared memory from
Triton's metadata and registers / spills from ``cuobjdump --dump-resource-usage`` (the tool ships
with Triton). SM12x parts allow at most 101,376 bytes of shared memory per block.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile

from sm12x.kernels.common.register_budget import as_option, budgets

SM12X_SHARED_LIMIT = 101_376
TARGETS = {"sm_120": 120, "sm_121": 121, "sm_90": 90}

# Per-SM residency limits (CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability"): warps, blocks, 32-bit registers, shared memory per SM; 1 KB of shared memory is
# reserved per resident block. Registers are allocated per warp in units of 256.
SM_LIMITS = {
    "sm_120": dict(warps=48, blocks=32, registers=65_536, shared=102_400),
    "sm_121": dict(warps=48, blocks=32, registers=65_536, shared=102_400),
    "sm_90": dict(warps=64, blocks=32, registers=65_536, shared=233_472),
}


@dataclasses.dataclass
class CompileReport:
    """Resource use of one compiled kernel configuration."""

    kernel: str
    config: str
    target: str
    shared_bytes: int
    registers: int
    spill_bytes: int  # local memory + stack: non-zero means the kernel spills registers
    ok: bool
    problem: str = ""
    num_warps: int = 0
    ctas_per_sm: int = 0  # resident CTAs per SM that registers, shared memory and warps allow
    triton: str = ""  # the Triton version that built it
    isa: dict = dataclasses.field(default_factory=dict)  # isa.IsaSummary as a dict (SASS read)


def ctas_per_sm(target: str, num_warps: int, registers: int, shared_bytes: int) -> int:
    """Resident CTAs per SM on ``target`` for a kernel of ``num_warps`` warps using ``registers``
    per thread and ``shared_bytes`` of shared memory per CTA."""
    lim = SM_LIMITS[target]
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = (lim["registers"] // per_warp) // num_warps
    by_smem = lim["shared"] // (shared_bytes + 1024) if shared_bytes else lim["blocks"]
    return max(0, min(lim["blocks"], lim["warps"] // num_warps, by_regs, by_smem))


def sass(cubin: bytes) -> str:
    """The SASS listing of a cubin (``cuobjdump -sass``), or "" where no disassembler here knows
    the target: Triton 3.6 / 3.7 bundle CUDA 12.8's cuobjdump, which reads sm_120 but not sm_121.
    Tried in order: Triton's bundled cuobjdump, ``SM12X_CUOBJDUMP``, a cuobjdump on PATH."""
    import shutil

    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        for tool in (knobs.nvidia.cuobjdump.path, os.environ.get("SM12X_CUOBJDUMP"), shutil.which("cuobjdump")):
            if not tool:
                continue
            res = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
            if res.returncode == 0 and res.stdout.strip():
                return res.stdout
        return ""
    finally:
        os.unlink(path)


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    from triton import knobs

    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        out = subprocess.run([knobs.nvidia.cuobjdump.path, "--dump-resource-usage", path],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(path)
    regs = max((int(m) for m in re.findall(r"REG:(\d+)", out)), default=0)
    spill = sum(int(a) + int(b) for a, b in re.findall(r"STACK:(\d+) .*?LOCAL:(\d+)", out))
    return regs, spill


def launch_hints(signature: dict, arg_names=None) -> dict:
    """The divisibility facts Triton's launcher gives a production call: every pointer 16-byte
    aligned (torch allocations are) and every ``stride*`` integer a multiple of 16. Without them
    the compiler does not vectorise or software-pipeline the loads (the sm_90 prefill logits kernel
    compiles to 32 KB without, 66 KB with), so the check would under-report shared memory and
    registers."""
    def is_stride(name: str) -> bool:  # stride_x, cache_stride0, ...
        return name.startswith("stride") or name.split("_")[-1].startswith("stride")

    names = list(arg_names or signature)  # Triton reads a hint by the kernel parameter's position
    hinted = [n for n, t in signature.items()
              if t.startswith("*") or (t in ("i32", "i64") and is_stride(n))]
    return {(names.index(n),): [["tt.divisibility", 16]] for n in hinted}


def compile_kernel(fn, signature: dict, constexprs: dict, *, target: str, num_warps: int,
                   num_stages: int, config_name: str = "", maxnreg: int | None = None,
                   register_ladder: bool = False) -> CompileReport:
    """Compile ``fn`` (a ``@triton.jit`` function) for ``target`` and check the SM12x limits.

    ``signature`` maps every argument name to a Triton type string ("*fp32", "i32", "constexpr");
    ``constexprs`` gives the values of the constexpr arguments; ``maxnreg`` is the launch option
    of the same name (a register budget per thread), when the configuration sets one. With
    ``register_ladder`` the budgets are tried in the launcher's order (``register_budget.budgets``)
    and the first spill-free one is reported; the config name then notes a budget other than
    ``maxnreg``.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cap = TARGETS[target]
    # SM12X_COMPILE_HINTS=0 checks the variant Triton builds for calls whose pointers or strides
    # are not 16-aligned (no hints)
    hints = os.environ.get("SM12X_COMPILE_HINTS", "1") != "0"
    tries = budgets(maxnreg) if register_ladder else [maxnreg]
    for budget in tries:
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs,
                        attrs=launch_hints(signature, getattr(fn, "arg_names", None)) if hints else {})
        options = {"num_warps": num_warps, "num_stages": num_stages, **as_option(budget)}
        compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32), options=options)
        regs, spill = _resource_usage(compiled.asm["cubin"])
        if not spill:
            break
    if budget != maxnreg:
        config_name += f" (maxnreg {budget or 'ptxas'})"
    shared = int(compiled.metadata.shared)
    problems = []
    if cap >= 120 and shared > SM12X_SHARED_LIMIT:
        problems.append(f"shared memory {shared} B > {SM12X_SHARED_LIMIT} B")
    if spill:
        problems.append(f"spills {spill} B")
    name = getattr(fn, "__name__", None) or fn.fn.__name__
    from sm12x.kernels.common import isa

    summary = isa.analyse(sass(compiled.asm["cubin"]))
    return CompileReport(name, config_name, target, shared, regs, spill, not problems,
                         "; ".join(problems), num_warps=num_warps,
                         ctas_per_sm=ctas_per_sm(target, num_warps, regs, shared),
                         triton=triton.__version__, isa=dataclasses.asdict(summary))


def format_reports(reports) -> str:
    """A plain-text table of compile reports."""
    lines = [f"{'kernel':32} {'config':40} {'target':7} {'smem B':>8} {'regs':>5} {'spill':>6}  ok"]
    for r in reports:
        lines.append(f"{r.kernel:32} {r.config:40} {r.target:7} {r.shared_bytes:8d} {r.registers:5d} "
                     f"{r.spill_bytes:6d}  {'yes' if r.ok else 'NO: ' + r.problem}")
    return "\n".join(lines)


def over_limits(reports) -> list:
    """The reports of configurations that fail on SM12x: over 101,376 B of shared memory, spilling
    registers, or reported not ok."""
    return [r for r in reports if not r.ok or r.shared_bytes > SM12X_SHARED_LIMIT or r.spill_bytes]


def interpreting() -> bool:
    """Whether kernels run under the Triton interpreter (``TRITON_INTERPRET``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def reports_in_subprocess(module: str, **kwargs) -> list:
    """``module.compile_reports(**kwargs)`` run in a fresh interpreter without TRITON_INTERPRET
    (under the interpreter kernels cannot be compiled in-process), with the repository root (never
    the package folder, whose ``platform`` would shadow the standard library's) first on the
    path."""
    import json
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    code = (f"import dataclasses, json; from {module} import compile_reports as c; "
            f"print(json.dumps([dataclasses.asdict(r) for r in c(**{kwargs!r})]))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=root)
    if res.returncode:
        raise RuntimeError(f"compile_reports subprocess failed:\n{res.stderr[-4000:]}")
    return [CompileReport(**d) for d in json.loads(res.stdout.strip().splitlines()[-1])]


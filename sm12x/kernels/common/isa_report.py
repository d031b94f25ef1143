"""The ISA report: for every launch configuration of every op, what the SM12x machine code does.

Per op and configuration, for sm_120 and sm_121 under the installed Triton: the matrix
instructions of the hot loop and their rate class, the non-matrix instructions issued per matrix
instruction there, registers, shared memory, spills, resident CTAs per SM, and the verdict of
:func:`sm12x.kernels.common.isa.verdict`: an FP8 or FP4 operand that reaches a reduced-rate MMA
(plain FP32-accumulate ``QMMA``, or bf16 ``HMMA`` after widening in registers) in a hot loop fails
the report unless :data:`sm12x.kernels.common.isa.ALLOW` says why it may.

``sm12x selftest --ops isa`` prints it (``--json`` keeps every row); the compile tests assert it
(``tests/tests_support.py``), so CI fails on a reduced-rate dot. ``scripts/isa_report.py`` runs it
under each Triton the supported images ship.
"""
from __future__ import annotations

import dataclasses

from sm12x.kernels.common import isa

SM12X_TARGETS = ("sm_120", "sm_121")


@dataclasses.dataclass
class IsaRow:
    """One configuration's line of the report."""

    op: str
    kernel: str
    config: str
    target: str
    triton: str
    loop_mma: dict  # opcode -> count in one pass of the hot loop
    loop_ratio: float  # non-matrix instructions per matrix instruction in the hot loop
    loop_widen: int  # 8/4-bit -> 16-bit conversions in the hot loop
    registers: int
    shared_bytes: int
    spill_bytes: int
    ctas_per_sm: int
    verdict: str
    why: str = ""

    @property
    def kinds(self) -> str:
        return ",".join(sorted({isa.mma_kind(op) for op in self.loop_mma})) or "-"

    @property
    def failed(self) -> bool:
        return self.verdict == "REDUCED"


def judge(op: str, reports, allow=None) -> list:
    """Compile reports of ``op`` -> :class:`IsaRow` list with each configuration's verdict."""
    rows = []
    for r in reports:
        summary = isa.IsaSummary(**r.isa) if r.isa else None
        if summary is None or not summary.instructions:
            # no disassembler here reads this target (CUDA 12.8's cuobjdump, bundled with Triton
            # 3.6 / 3.7, does not know sm_121): said, not judged
            rows.append(IsaRow(op, r.kernel, r.config, r.target, r.triton, {}, 0.0, 0, r.registers,
                               r.shared_bytes, r.spill_bytes, r.ctas_per_sm, "unread",
                               f"no disassembler here reads {r.target} SASS (Triton {r.triton}'s cuobjdump; "
                               "SM12X_CUOBJDUMP names a newer one)"))
            continue
        verdict, why = isa.verdict(r.kernel, r.config, r.target, summary, r.triton,
                                   isa.ALLOW if allow is None else allow)
        rows.append(IsaRow(op, r.kernel, r.config, r.target, r.triton, dict(summary.loop_mma),
                           round(summary.loop_ratio, 2), summary.loop_widen, r.registers,
                           r.shared_bytes, r.spill_bytes, r.ctas_per_sm, verdict, why))
    return rows


def _short(opcode: str) -> str:
    return opcode.replace(".F32", "").replace(".E4M3.E4M3", ".e4m3").replace(".E2M1.E2M1", ".e2m1")


def format_rows(rows) -> str:
    """A plain-text table, one configuration a line; allowed and failing ones with their reason."""
    lines = [f"{'op':20} {'kernel':30} {'target':6} {'triton':7} {'hot-loop MMA':44} {'other/MMA':>9} "
             f"{'regs':>4} {'smem B':>7} {'CTA/SM':>6}  verdict",
             ]
    for r in rows:
        mma = " ".join(f"{n}x{_short(op)}" for op, n in sorted(r.loop_mma.items())) or "-"
        lines.append(f"{r.op:20} {r.kernel[:30]:30} {r.target:6} {r.triton:7} {mma[:44]:44} "
                     f"{r.loop_ratio:9.1f} {r.registers:4d} {r.shared_bytes:7d} {r.ctas_per_sm:6d}  "
                     f"{r.verdict}")
        lines.append(f"{'':20} {r.config}" + (f"  [{r.why}]" if r.why else ""))
    return "\n".join(lines)


def summarise(rows) -> dict:
    """Per op: configurations, verdict counts and the hot-loop MMA kinds seen."""
    out: dict = {}
    for r in rows:
        s = out.setdefault(r.op, dict(configs=0, verdicts={}, kinds=set()))
        s["configs"] += 1
        s["verdicts"][r.verdict] = s["verdicts"].get(r.verdict, 0) + 1
        s["kinds"].update(isa.mma_kind(op) for op in r.loop_mma)
    for s in out.values():
        s["kinds"] = sorted(s["kinds"])
    return out


def report(ops, targets=SM12X_TARGETS) -> list:
    """Compile every configuration of ``ops`` (registry :class:`Op` objects) for ``targets`` and
    judge each -> :class:`IsaRow` list."""
    rows = []
    for op in ops:
        if op.compile_reports is None:
            continue
        rows += judge(op.name, op.compile_reports(tuple(targets)))
    return rows

"""What a compiled kernel executes: its SASS, read for the instruction economics of the target.

A Triton kernel compiled for sm_120 / sm_121 on a machine without that GPU still yields the exact
machine code the card will run (``compile_check.compile_kernel``). This module reads that code
(``cuobjdump -sass``, bundled with Triton) and answers the questions that decide speed on SM12x:

- which matrix instructions run, how many, and at which rate class: on SM12x the block-scaled
  ``QMMA.SF`` (MXFP8) and ``OMMA.SF`` (MXFP4) run at the full 8- / 4-bit rate, while plain FP8
  ``QMMA`` with an FP32 accumulator and bf16 ``HMMA`` run at a reduced rate (half and a quarter of
  MXFP8 on GeForce parts, half on the RTX PRO 6000);
- where the hot loop is (the loop, closed by a backward branch, that holds the most matrix
  instructions) and how many other instructions it issues per matrix instruction;
- whether FP8 / FP4 data is widened to 16 bits in registers before a bf16 ``HMMA`` (the
  dequantise-then-HMMA pattern: the conversions, not the MMA, then bound the loop).

:func:`analyse` turns SASS text into an :class:`IsaSummary`; :func:`verdict` judges it against the
rule that FP8 / FP4 operands reach a full-rate block-scaled MMA in every hot loop on SM12x, with
the documented exceptions in :data:`ALLOW`.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import re

# One SASS instruction line of ``cuobjdump -sass``: ``/*0a30*/  @!P0 QMMA.SF.16832... R4, ... ;``
_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)(.*?);")
_BRANCH_TARGET = re.compile(r"\b0x([0-9a-f]+)\b")

# Matrix instructions and what each computes per warp instruction. The shape suffix names
# m, n, k: HMMA.16816 is m16 n8 k16; QMMA.16832 m16 n8 k32; OMMA.16864 m16 n8 k64. Hopper's
# warpgroup MMAs (HGMMA / QGMMA.64xNxK) are issued by each of the group's four warps and
# compute 64 x N x K between them.
MMA_OPCODES = ("HMMA", "QMMA", "OMMA", "IMMA", "HGMMA", "QGMMA", "IGMMA", "BMMA", "DMMA")

# Rate classes. ``full``: the fastest form for its operand width on SM12x.
FULL_RATE = "full"          # block-scaled QMMA.SF / OMMA.SF
REDUCED_FP8 = "reduced-fp8"  # plain QMMA with FP32 accumulation: FP8 operands at half rate or less
BF16 = "bf16"               # HMMA on 16-bit operands (FP32 accumulation)
TF32 = "tf32"               # HMMA.1688 TF32
HOPPER = "hopper-wgmma"      # sm_90 warpgroup MMA
OTHER = "other"

# In-register widening of 8- / 4-bit floats to 16 / 32 bits: the dequantise step. SASS names a
# conversion's destination type first (``F2FP.F16.E4M3.UNPACK_B``: e4m3 -> f16); narrowing
# (``F2FP.SATFINITE.E4M3.F32.PACK_AB``: f32 -> e4m3, quantising P or Q) is not widening.
_NARROW_TYPES = {"E4M3", "E5M2", "E2M1", "E3M2", "E2M3", "UE8M0"}
_WIDE_TYPES = {"F16", "BF16", "F32"}


def _widens(opcode: str) -> bool:
    base, *mods = opcode.split(".")
    if base not in ("F2FP", "F2F", "I2F", "HADD2", "HMUL2", "HFMA2"):
        return False
    types = [m for m in mods if m in _NARROW_TYPES | _WIDE_TYPES]
    return bool(types) and types[0] in _WIDE_TYPES and any(t in _NARROW_TYPES for t in types[1:])


@dataclasses.dataclass
class Mma:
    """One matrix opcode (the full SASS opcode with its modifiers) and its count."""

    opcode: str
    count: int

    @property
    def kind(self) -> str:
        return mma_kind(self.opcode)


@dataclasses.dataclass
class IsaSummary:
    """The matrix-instruction picture of one kernel.

    mma: opcode -> count over the whole kernel.
    loop_mma: opcode -> count inside the hot loop (static counts: one pass of the loop body).
    loop_instructions: every instruction of the hot loop, matrix ones included.
    loop_widen: instructions in the hot loop that widen 8- / 4-bit floats to 16 bits.
    loop_class: hot-loop instruction counts by class (mma, ldg, lds, sts, ldgsts, bar, cvt, alu).
    instructions: the kernel's instruction count.
    inner: the loops with matrix instructions directly inside the hot loop, each as its static
        instruction count and matrix opcode counts (their trip counts are not in the SASS).
    stream_loops: for a kernel without matrix instructions, the static instruction count of each
        outermost loop that loads from global memory (its passes over the data it streams: a
        radix select's histogram, count and write passes), in address order; else empty. The
        performance model costs such kernels by these (their trips come from the launch).
    barriers: for such a kernel, its CTA barriers (``BAR``) outside those loops (a sorting
        network's exchanges through shared memory); else 0.
    """

    mma: dict
    loop_mma: dict
    loop_instructions: int
    loop_widen: int
    loop_class: dict
    instructions: int
    inner: list = dataclasses.field(default_factory=list)  # [{instructions, mma}] loops inside the hot loop
    stream_loops: list = dataclasses.field(default_factory=list)  # no-MMA kernels: outermost loops with a load
    barriers: int = 0  # no-MMA kernels: BAR instructions outside those loops

    @property
    def loop_ratio(self) -> float:
        """Non-matrix instructions issued per matrix instruction in the hot loop (0 when none)."""
        n = sum(self.loop_mma.values())
        return (self.loop_instructions - n) / n if n else 0.0

    def kinds(self, where: str = "loop") -> list:
        counts = self.loop_mma if where == "loop" else self.mma
        return sorted({mma_kind(op) for op in counts})


def mma_kind(opcode: str) -> str:
    """The rate class of a SASS matrix opcode (see the module docstring)."""
    base = opcode.split(".")[0]
    mods = set(opcode.split(".")[1:])
    if base in ("HGMMA", "QGMMA", "IGMMA"):
        return HOPPER
    if base in ("QMMA", "OMMA") and "SF" in mods:
        return FULL_RATE
    if base == "QMMA":
        # plain FP8 MMA: F16 accumulation is full rate on SM12x, F32 accumulation is not
        return FULL_RATE if "F16" in mods and "F32" not in mods else REDUCED_FP8
    if base == "OMMA":
        return FULL_RATE
    if base == "HMMA":
        return TF32 if "TF32" in mods else BF16
    return OTHER


def mma_flops(opcode: str) -> int:
    """Floating-point operations one warp issue of ``opcode`` performs (2 x m x n x k; for a
    warpgroup MMA, a quarter of the group's m64 x N x K)."""
    parts = opcode.split(".")
    base = parts[0]
    for p in parts[1:]:
        m = re.fullmatch(r"64x(\d+)x(\d+)", p)
        if m and base.endswith("GMMA"):
            return 2 * 64 * int(m.group(1)) * int(m.group(2)) // 4
        m = re.fullmatch(r"(16)(8)(\d+)", p)
        if m:
            return 2 * 16 * 8 * int(m.group(3))
    return 0


def _classify(opcode: str) -> str:
    base = opcode.split(".")[0]
    if base in MMA_OPCODES:
        return "mma"
    if _widens(opcode):
        return "cvt"
    if base in ("LDG", "LDGSTS", "LDS", "STS", "STG", "LDSM", "BAR", "UTMALDG", "SYNCS"):
        return base.lower()
    if base in ("LDGDEPBAR", "DEPBAR"):
        return "bar"
    return "alu"


def parse(sass: str) -> list:
    """SASS text -> [(address, opcode, operands, predicated)] for the function in the listing."""
    out = []
    for line in sass.splitlines():
        m = _LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4), bool(m.group(2))))
    return out


def _successors(instrs) -> list:
    """Per instruction, the indices control can go to next."""
    index = {ins[0]: i for i, ins in enumerate(instrs)}
    succ = []
    for i, (addr, op, args, predicated) in enumerate(instrs):
        nxt = [i + 1] if i + 1 < len(instrs) else []
        base = op.split(".")[0]
        if base in ("BRA", "JMP"):
            # a predicate operand (``BRA.U UP2, 0x3680``) makes a branch conditional too
            predicated = predicated or bool(re.match(r"\s*!?U?P[0-9T]", args))
            m = _BRANCH_TARGET.search(args)
            target = index.get(int(m.group(1), 16)) if m else None
            succ.append(([target] if target is not None else []) + (nxt if predicated else []))
        elif base in ("EXIT", "RET", "BRX", "JMX"):
            succ.append(nxt if predicated else [])
        else:
            succ.append(nxt)
    return succ


def loops(instrs) -> list:
    """Every natural loop, as the sorted instruction indices of its body: a branch back to an
    earlier (or its own) address closes the loop headed by its target; the body is the header plus
    every instruction that reaches the branch without passing the header. Code the compiler lays
    out inside a loop's address range but outside the loop (an exit path) is not part of it. The
    branch to itself that ends every kernel is no loop (nothing reaches it from its target's side)."""
    succ = _successors(instrs)
    pred: list = [[] for _ in instrs]
    for i, targets in enumerate(succ):
        for t in targets:
            pred[t].append(i)
    found = []
    for i, (addr, op, args, predicated) in enumerate(instrs):
        if op.split(".")[0] != "BRA":
            continue
        conditional = predicated or bool(re.match(r"\s*!?U?P[0-9T]", args))
        for h in succ[i]:
            if h > i or (h == i and not conditional):
                continue
            body, stack = {h, i}, [i]
            while stack:
                for p in pred[stack.pop()]:
                    if p not in body:
                        body.add(p)
                        stack.append(p)
            found.append(sorted(body))
    return found


def _count(body) -> tuple:
    """(matrix opcode -> count, class -> count, widening conversions) of an instruction range."""
    mma: dict = {}
    classes: dict = {}
    widen = 0
    for ins in body:
        op = ins[1]
        cls = _classify(op)
        classes[cls] = classes.get(cls, 0) + 1
        if cls == "mma":
            mma[op] = mma.get(op, 0) + 1
        elif cls == "cvt":
            widen += 1
    return mma, classes, widen


def analyse(sass: str) -> IsaSummary:
    """Read one kernel's SASS (``cuobjdump -sass`` of a single-kernel cubin).

    The hot loop is the outermost loop holding matrix instructions (among several, the one with the
    most; among equals the largest); the loops with matrix instructions nested in it are its inner
    loops, whose trip counts the SASS does not say (``inner`` keeps each one's counts)."""
    instrs = parse(sass)
    mma, _, _ = _count(instrs)
    with_mma = []
    for body in loops(instrs):
        n_mma = sum(instrs[i][1].split(".")[0] in MMA_OPCODES for i in body)
        if n_mma:
            with_mma.append((frozenset(body), n_mma))
    outer = max(with_mma, key=lambda x: (x[1], len(x[0])), default=None)
    if outer is None:
        # a kernel whose matrix work is straight-line code (every loop unrolled) is judged whole
        body = instrs if mma else []
        inner_sets = []
    else:
        body = [instrs[i] for i in sorted(outer[0])]
        nested = [x[0] for x in with_mma if x[0] != outer[0] and x[0] < outer[0]]
        # only the loops directly inside the hot loop (a loop inside a nested one is part of it)
        inner_sets = [x for x in nested if not any(y != x and x < y for y in nested)]
    loop_mma, loop_class, widen = _count(body)
    inner = []
    for members in inner_sets:
        i_mma, _, _ = _count([instrs[i] for i in members])
        inner.append(dict(instructions=len(members), mma=i_mma))
    return IsaSummary(mma=mma, loop_mma=loop_mma, loop_instructions=len(body), loop_widen=widen,
                      loop_class=loop_class, instructions=len(instrs), inner=inner,
                      **({} if mma else _streaming(instrs)))


def _streaming(instrs) -> dict:
    """``stream_loops`` and ``barriers`` of a kernel without matrix instructions (``parse``'s list):
    the static instruction counts of its outermost loops that load from global memory, in address
    order, and its BAR instructions outside them."""
    bodies = {frozenset(b) for b in loops(instrs)}
    outer = [b for b in bodies if not any(o != b and b < o for o in bodies)]
    loads = sorted((b for b in outer if any(instrs[i][1].split(".")[0] == "LDG" for i in b)), key=min)
    inside = set().union(*loads) if loads else set()
    bars = sum(1 for i, ins in enumerate(instrs) if ins[1].split(".")[0] == "BAR" and i not in inside)
    return dict(stream_loops=[len(b) for b in loads], barriers=bars)


# ----------------------------------------------------------------------------------------------
# The verdict


@dataclasses.dataclass(frozen=True)
class Allowed:
    """A documented exception to the full-rate rule.

    kernel / config: fnmatch patterns on the compile report's kernel and config names.
    targets: the targets it covers. tritons: fnmatch patterns on ``triton.__version__``.
    why: the reason, one or two sentences; it is printed beside the verdict.
    """

    kernel: str
    config: str
    targets: tuple
    tritons: tuple
    why: str

    def covers(self, kernel: str, config: str, target: str, triton_version: str) -> bool:
        return (fnmatch.fnmatchcase(kernel, self.kernel) and fnmatch.fnmatchcase(config, self.config)
                and target in self.targets
                and any(fnmatch.fnmatchcase(triton_version, t) for t in self.tritons))


ALLOW: tuple = (
    Allowed("*", "*", ("sm_121",), ("3.6.*", "3.7.*"),
            "Triton before 3.8 builds no block-scaled MMA for sm_121: `tl.dot_scaled` is lowered to "
            "plain e4m3 dots there (native sm_121 support is Triton 3.8's, triton #10010)."),
    Allowed("_sparse_mla_split_kernel", "*", ("sm_120", "sm_121"), ("*",),
            "The exact attention path: FP8 cache rows are widened to bf16 (exactly: their scales are "
            "powers of two, or V3.2's float32 scales are folded in) for bf16 HMMA, so its error is "
            "bf16's; `SM12X_ATTENTION_PRECISION=fast` selects the block-scaled MXFP8 kernels where "
            "they exist."),
    Allowed("_mxfp8_decode_kernel", "*", ("sm_120", "sm_121"), ("*",),
            "The fast attention path: its bf16 HMMA is the RoPE part, which the cache stores in "
            "bf16; the e4m3 widening is the residual of the second e4m3 term of Q and P (x minus "
            "its first term), not a dequantised operand: every FP8 product is a block-scaled QMMA.SF."),
)


def widened_before_hmma(summary: IsaSummary) -> bool:
    """Whether the hot loop widens 8- / 4-bit floats to 16 bits and feeds bf16 / f16 ``HMMA``."""
    return summary.loop_widen > 0 and BF16 in summary.kinds("loop")


def reduced_rate(summary: IsaSummary) -> str:
    """What in the hot loop runs FP8 / FP4 data below the full rate ("" when nothing does)."""
    problems = []
    plain = sum(n for op, n in summary.loop_mma.items() if mma_kind(op) == REDUCED_FP8)
    if plain:
        problems.append(f"{plain} plain FP8 QMMA with FP32 accumulation (half rate; block-scaled "
                        "QMMA.SF with unit scales is exact and full rate)")
    if widened_before_hmma(summary):
        problems.append(f"FP8/FP4 widened to 16 bits in registers ({summary.loop_widen} conversions) "
                        f"before {sum(n for op, n in summary.loop_mma.items() if mma_kind(op) == BF16)} "
                        "bf16 HMMA")
    return "; ".join(problems)


def verdict(kernel: str, config: str, target: str, summary: IsaSummary, triton_version: str,
            allow=ALLOW) -> tuple:
    """-> (verdict, reason): ``"ok"`` (no FP8 / FP4 operand below the full rate), ``"no-mma"``, ``"allowed"`` (a reduced-rate form covered
    by :data:`ALLOW`, with its why) or ``"REDUCED"`` (fails the ISA report). Only SM12x targets are
    judged; sm_90 builds are ``"not judged"``."""
    if not target.startswith("sm_12"):
        return "not judged", ""
    if not summary.loop_mma:
        return "no-mma", ""
    problem = reduced_rate(summary)
    if not problem:
        return "ok", ""
    for entry in allow:
        if entry.covers(kernel, config, target, triton_version):
            return "allowed", f"{problem}: {entry.why}"
    return "REDUCED", problem

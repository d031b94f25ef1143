"""The performance model: a kernel's time on a card from its machine code.

For one launch (a compiled configuration, a grid of CTAs, the matrix FLOPs it issues, the hot-loop
trips per CTA and the DRAM bytes it moves) on one :class:`~sm12x.perfmodel.cards.Card`:

- the hot loop's instruction mix comes from the SASS (:mod:`sm12x.kernels.common.isa`). Loops nested
  in it run the number of trips that makes the loop's matrix FLOPs equal the launch's (the same
  count for each; the SASS does not say), and a loop with no nested one runs as many passes as its
  matrix FLOPs require (this covers unrolled K steps);
- per iteration and SM, with ``c`` CTAs of ``W`` warps resident together (the occupancy the
  registers and shared memory allow, no more than the grid gives each SM):
    issue   = I x max(c W / 4, CPI) + B x BARRIER   (I instructions per warp, 4 schedulers; a warp
              issues at most every CPI cycles; B CTA barriers in the loop, each BARRIER cycles)
    tensor  = c W x sum(MMA count x FLOP per MMA / FLOP per SM per clock of its kind)
    one iteration step = max(issue, tensor)
- compute = waves x (trips x step + the straight-line code outside the loop x CPI) / clock, where
  waves = ceil(CTAs / (SMs x c));
- a kernel without matrix instructions whose launch gives its trips (the fused top-k's select,
  filter, fold and merge kernels) is costed the same way by its instructions: per CTA, ``passes``
  passes over ``trips`` blocks of its columns, each pass the mean of its column loops (the
  outermost loops that load from global memory, ``IsaSummary.stream_loops``), plus its code
  outside those loops (a sorting network is all straight-line code), and B' barriers outside them;
  compute = waves x (that count x max(c W / 4, CPI) + B' x BARRIER) / clock. Other kernels without matrix work
  (a split-K reduction, a combine) are bound by their bytes or their launch;
- memory = DRAM bytes / (bandwidth x the streaming efficiency);
- time = max(compute, memory) + the launch cost.

The roofline bound beside it is max(FLOPs / the card's peak for the op's best instruction kind,
bytes / bandwidth). CPI and BARRIER are single constants for every card and op (below): the model
is checked against measured sm_90 times (``scripts/perf_model.py --validate``) rather than fitted
per op.
"""
from __future__ import annotations

import dataclasses
import math

from sm12x.kernels.common import isa
from sm12x.perfmodel.cards import Card

# Cycles between two instructions of one warp when nothing else limits it: the dependent-issue
# latency of the FP32 / integer pipes (4 cycles on Ampere, Hopper and Blackwell). Waits on memory
# are not added per instruction: the compiler's software pipelining hides them in the loops
# modelled here, and where it does not the measured-vs-modelled table shows it.
CPI = 4.0
# Cycles one CTA-wide barrier costs the CTA (DeepGEMM's SM120 calibration: 120 cycles per K block).
BARRIER = 120.0


@dataclasses.dataclass
class Launch:
    """One kernel launch of a modelled case.

    report: the :class:`~sm12x.kernels.common.compile_check.CompileReport` of the configuration
        it runs (with its SASS summary, ``report.isa``).
    ctas: the grid size. flops: matrix FLOPs it issues in all (padding included).
    trips: hot-loop trips per CTA, needed when the hot loop has loops nested in it (else None);
        for a kernel without matrix instructions, the column blocks each of its passes walks per
        CTA (0: straight-line code only), None to bound it by its bytes or launch alone.
    dram_bytes: bytes it reads and writes in DRAM.
    passes: a kernel without matrix instructions: its passes over those columns per CTA.
    """

    report: object
    ctas: int
    flops: float
    dram_bytes: float
    trips: float | None = None
    passes: float = 1.0


@dataclasses.dataclass
class Estimate:
    """The model's answer for one launch or one case (µs)."""

    time_us: float
    compute_us: float
    memory_us: float
    bound: str  # "issue", "tensor", "memory" or "launch"
    detail: str = ""


def _mma_cycles(mma: dict, card: Card) -> float:
    """Tensor-pipe cycles of one warp's matrix instructions ``mma`` (opcode -> count) on one SM."""
    return sum(n * isa.mma_flops(op) / card.rate(op) for op, n in mma.items())


def _flops(mma: dict) -> float:
    return sum(n * isa.mma_flops(op) for op, n in mma.items())


def estimate(launch: Launch, card: Card) -> Estimate:
    """Model one launch on ``card`` (see the module docstring)."""
    r = launch.report
    s = isa.IsaSummary(**r.isa)
    warps = max(r.num_warps, 1)
    mem_us = launch.dram_bytes / (card.dram_gbs * card.dram_efficiency) / 1e3
    if launch.ctas <= 0:
        return Estimate(card.launch_us, 0.0, mem_us, "launch")
    per_warp_flops = launch.flops / (launch.ctas * warps)
    loop_flops = _flops(s.loop_mma)
    bars = s.loop_class.get("bar", 0) + s.loop_class.get("bar_sync", 0)
    if s.inner:
        inner_instr = sum(i["instructions"] for i in s.inner)
        inner_mma: dict = {}
        for i in s.inner:
            for op, n in i["mma"].items():
                inner_mma[op] = inner_mma.get(op, 0) + n
        outer_mma = {op: n - inner_mma.get(op, 0) for op, n in s.loop_mma.items()}
        trips_outer = max(launch.trips or 1.0, 1.0)
        need = per_warp_flops / trips_outer - _flops(outer_mma)
        t = max(1.0, need / _flops(inner_mma)) if _flops(inner_mma) else 1.0
        instr = (s.loop_instructions - inner_instr) + t * inner_instr
        tensor_warp = _mma_cycles(outer_mma, card) + t * _mma_cycles(inner_mma, card)
        trips = trips_outer
        detail = f"inner x{t:.1f}"
    elif loop_flops:
        instr = s.loop_instructions
        tensor_warp = _mma_cycles(s.loop_mma, card)
        trips = per_warp_flops / loop_flops
        detail = ""
    elif launch.trips is None:  # no matrix work: a streaming or reduction kernel, bound by its bytes or launch
        return Estimate(mem_us + card.launch_us, 0.0, mem_us, "memory" if mem_us > card.launch_us else "launch")
    else:
        return _estimate_streaming(launch, s, warps, mem_us, card)
    ctas_per_sm = max(r.ctas_per_sm, 1)
    conc = max(1, min(ctas_per_sm, math.ceil(launch.ctas / card.sms)))
    waves = math.ceil(launch.ctas / (card.sms * ctas_per_sm))
    issue = instr * max(conc * warps / card.issue_per_clock, CPI) + bars * BARRIER
    tensor = conc * warps * tensor_warp
    step = max(issue, tensor)
    straight = max(s.instructions - s.loop_instructions, 0) * CPI
    cycles = waves * (trips * step + straight)
    compute_us = cycles / (card.clock_ghz * 1e3)
    bound = "memory" if mem_us >= compute_us else ("tensor" if tensor >= issue else "issue")
    total = max(compute_us, mem_us) + card.launch_us
    return Estimate(total, compute_us, mem_us, bound,
                    f"{conc} CTA/SM x {warps} warps, {waves} wave(s), {trips:.1f} trips {detail}".strip())


def _estimate_streaming(launch: Launch, s, warps: int, mem_us: float, card: Card) -> Estimate:
    """A kernel without matrix instructions, by its instruction count (see the module docstring)."""
    loops = s.stream_loops
    per_pass = sum(loops) / len(loops) if loops else 0.0
    instr = launch.passes * launch.trips * per_pass + max(s.instructions - sum(loops), 0)
    ctas_per_sm = max(launch.report.ctas_per_sm, 1)
    conc = max(1, min(ctas_per_sm, math.ceil(launch.ctas / card.sms)))
    waves = math.ceil(launch.ctas / (card.sms * ctas_per_sm))
    cycles = waves * (instr * max(conc * warps / card.issue_per_clock, CPI) + s.barriers * BARRIER)
    compute_us = cycles / (card.clock_ghz * 1e3)
    bound = "memory" if mem_us >= compute_us else "issue"
    return Estimate(max(compute_us, mem_us) + card.launch_us, compute_us, mem_us, bound,
                    f"{conc} CTA/SM x {warps} warps, {waves} wave(s), {launch.passes:g} x {launch.trips:.1f} trips")


def estimate_case(launches, card: Card) -> Estimate:
    """A case of several launches: their times add (each waits for the previous one)."""
    parts = [estimate(l, card) for l in launches]
    main = max(parts, key=lambda e: e.time_us)
    return Estimate(sum(p.time_us for p in parts), sum(p.compute_us for p in parts),
                    sum(p.memory_us for p in parts), main.bound, main.detail)


def roofline_us(flops: float, dram_bytes: float, card: Card, kind: str) -> float:
    """The roofline bound: the slower of the matrix work at the card's peak for ``kind`` (a
    ``Card.rates`` key) and the bytes at full bandwidth."""
    return max(flops / (card.peak_tflops(kind) * 1e6), dram_bytes / card.dram_gbs / 1e3)

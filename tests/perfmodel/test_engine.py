"""The performance model's arithmetic, on hand-made SASS summaries (no compile): the issue, tensor and
memory bounds, inner-loop trips, waves, and the card figures against their published peaks."""
import dataclasses

import pytest

from sm12x.kernels.common.compile_check import CompileReport, ctas_per_sm
from sm12x.perfmodel import cards, engine


def _report(loop_mma, loop_instructions, instructions=None, inner=(), warps=8, ctas=1, bars=0, stream=()):
    isa = dict(mma=dict(loop_mma), loop_mma=dict(loop_mma), loop_instructions=loop_instructions, loop_widen=0,
               loop_class={"bar": bars}, instructions=instructions or loop_instructions, inner=list(inner),
               stream_loops=list(stream))
    return CompileReport("k", "c", "sm_120", 0, 128, 0, True, num_warps=warps, ctas_per_sm=ctas, isa=isa)


def test_card_peaks_match_their_sources():
    assert cards.RTX_PRO_6000.peak_tflops("mxf8") == pytest.approx(1007, rel=0.01)
    assert cards.RTX_5090.peak_tflops("mxf8") == pytest.approx(993, rel=0.01)
    assert cards.RTX_5090.peak_tflops("fp8_f32") == pytest.approx(496, rel=0.03)  # measured 506
    assert cards.H200.peak_tflops("wgmma_bf16") == pytest.approx(989, rel=0.01)
    assert cards.RTX_PRO_6000.rate("QMMA.SF.16832.F32.E4M3.E4M3.E8") == 2 * cards.RTX_PRO_6000.rate("HMMA.16816.F32.BF16")
    assert cards.RTX_5090.rate("QMMA.16832.F32.E4M3.E4M3") == cards.RTX_5090.rate("QMMA.SF.16832.F32.E4M3.E4M3.E8") / 2


def test_tensor_bound_loop_runs_at_the_mma_rate():
    card = dataclasses.replace(cards.RTX_5090, launch_us=0.0)
    # 64 block-scaled MMAs, hardly any other instruction: tensor-bound
    rep = _report({"QMMA.SF.16832.F32.E4M3.E4M3.E8": 64}, 70, warps=8, ctas=1)
    flops = 2.0 ** 40
    est = engine.estimate(engine.Launch(rep, card.sms * 10, flops, 0.0), card)
    assert est.bound == "tensor"
    assert est.time_us == pytest.approx(flops / (card.peak_tflops("mxf8") * 1e6), rel=0.01)
    # the same FLOPs through plain FP8 QMMA take twice as long on the 5090
    slow = _report({"QMMA.16832.F32.E4M3.E4M3": 64}, 70, warps=8, ctas=1)
    assert engine.estimate(engine.Launch(slow, card.sms * 10, flops, 0.0), card).time_us == pytest.approx(
        2 * est.time_us, rel=0.01)


def test_issue_bound_loop_and_latency_floor():
    card = dataclasses.replace(cards.RTX_PRO_6000, launch_us=0.0)
    rep = _report({"HMMA.16816.F32.BF16": 4}, 1000, warps=4, ctas=1)
    per_pass = 4 * 4096  # FLOPs of one warp's pass
    launch = engine.Launch(rep, card.sms, per_pass * 4 * card.sms * 10, 0.0)  # 10 passes per CTA
    est = engine.estimate(launch, card)
    assert est.bound == "issue"
    # one CTA of 4 warps per SM: each warp issues every CPI cycles
    assert est.compute_us == pytest.approx(10 * 1000 * engine.CPI / (card.clock_ghz * 1e3), rel=0.01)


def test_inner_loops_take_the_trips_the_flops_need():
    card = dataclasses.replace(cards.RTX_PRO_6000, launch_us=0.0)
    inner = [dict(instructions=100, mma={"HMMA.16816.F32.BF16": 8})]
    rep = _report({"HMMA.16816.F32.BF16": 8}, 300, inner=inner, warps=4, ctas=1)
    flops = 8 * 4096 * 4 * card.sms * 5 * 2  # 5 outer trips x 2 inner trips per warp
    est = engine.estimate(engine.Launch(rep, card.sms, flops, 0.0, trips=5), card)
    assert "inner x2.0" in est.detail
    assert est.compute_us == pytest.approx(5 * (200 + 2 * 100) * engine.CPI / (card.clock_ghz * 1e3), rel=0.01)


def test_memory_bound_and_waves():
    card = dataclasses.replace(cards.GB10, launch_us=0.0)
    rep = _report({"QMMA.SF.16832.F32.E4M3.E4M3.E8": 64}, 70)
    est = engine.estimate(engine.Launch(rep, card.sms, 1e6, 273e6), card)  # 273 MB at 273 GB/s
    assert est.bound == "memory"
    assert est.time_us == pytest.approx(1e3 / card.dram_efficiency, rel=0.01)
    one = engine.estimate(engine.Launch(rep, card.sms, 1e9, 0.0), card).compute_us
    two = engine.estimate(engine.Launch(rep, card.sms * 2, 2e9, 0.0), card).compute_us
    assert two == pytest.approx(2 * one, rel=0.01)  # a second wave


def test_streaming_kernel_costs_its_column_loops():
    card = dataclasses.replace(cards.RTX_PRO_6000, launch_us=0.0)
    # no matrix work: two column loops of 100 and 300 instructions, 100 more outside them
    rep = _report({}, 0, instructions=500, warps=8, ctas=1, stream=(100, 300))
    est = engine.estimate(engine.Launch(rep, card.sms, 0.0, 0.0, trips=10, passes=2), card)
    assert est.bound == "issue"
    # 2 passes x 10 trips x the loops' mean + the rest; one CTA of 8 warps: a warp every CPI cycles
    assert est.compute_us == pytest.approx((2 * 10 * 200 + 100) * engine.CPI / (card.clock_ghz * 1e3), rel=1e-6)
    # four CTAs of 8 warps on an SM: 32 warps over 4 schedulers issue every 8 cycles
    rep4 = _report({}, 0, instructions=500, warps=8, ctas=4, stream=(100, 300))
    est4 = engine.estimate(engine.Launch(rep4, 4 * card.sms, 0.0, 0.0, trips=10, passes=2), card)
    assert est4.compute_us == pytest.approx(2 * est.compute_us, rel=1e-6)
    # a sorting network's barriers: each costs the CTA BARRIER cycles
    rep.isa["barriers"] = 10
    est_b = engine.estimate(engine.Launch(rep, card.sms, 0.0, 0.0, trips=10, passes=2), card)
    assert est_b.compute_us - est.compute_us == pytest.approx(10 * engine.BARRIER / (card.clock_ghz * 1e3), rel=1e-6)
    # without trips such a kernel is bound by its bytes or its launch alone
    assert engine.estimate(engine.Launch(rep, card.sms, 0.0, 1.792e6), card).compute_us == 0.0


def test_residency_from_registers_and_shared_memory():
    assert ctas_per_sm("sm_120", 8, 255, 84_224) == 1
    assert ctas_per_sm("sm_120", 4, 128, 30_000) == 3  # 3 x (30,000 + 1,024) B of 102,400
    assert ctas_per_sm("sm_120", 4, 64, 0) == 8  # 48 warps / 4 = 12, registers 65,536 / (64 x 128) = 8
    assert ctas_per_sm("sm_90", 4, 64, 0) == 8


def test_roofline():
    card = cards.RTX_PRO_6000
    assert engine.roofline_us(1e12, 0, card, "mxf8") == pytest.approx(1e12 / (card.peak_tflops("mxf8") * 1e6))
    assert engine.roofline_us(0, 1.792e9, card, "mxf8") == pytest.approx(1e3)

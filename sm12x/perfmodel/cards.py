"""The GPUs the performance model knows: SM counts, clocks, matrix rates per instruction kind,
issue rate and memory bandwidth, each with where it comes from.

Rates are dense FLOP per SM per clock for one kind of matrix instruction (the kinds of
:func:`sm12x.kernels.common.isa.mma_kind`, split by operand width where the card's rate differs).
``clock_ghz`` is the clock the card sustains under matrix load as the cited throughput figures
imply (peak TFLOPS / (SMs x FLOP per SM per clock)), not the marketing boost clock.

Sources (public, 2026): NVIDIA's RTX Blackwell architecture whitepaper and the RTX PRO 6000 /
RTX 5090 / DGX Spark datasheets for SM counts, memory and peak tensor rates; flashinfer PR #4149
(2026-07) for MXFP8 993 TFLOPS and plain FP8 with FP32 accumulation 506 TFLOPS measured on an RTX
5090; triton #11320 (`dot_scaled` with unit scales 1.55x faster than plain FP8 `tl.dot` on a
5090); Neroued/ninfer PR #160 for 2,048 MXFP8 / 4,096 NVFP4 FLOP per SM per clock on SM120;
H100 / H200 SXM datasheets (989 TFLOPS bf16, 1,979 FP8 dense; 3.35 / 4.8 TB/s).

Where sources disagree or say nothing, the value below is the stated assumption:
- RTX PRO 6000, plain FP8 with FP32 accumulation: no public measurement; workstation parts are not
  documented as halved, so the model takes the full 8-bit rate and says so in its table.
- GB10: FP8 ~208 TFLOPS measured and ~250 derived; its bf16 / plain-FP8 FP32-accumulate rates are
  unpublished and taken at GeForce ratios (half of MXFP8 for plain FP8, a quarter for bf16).
  Bandwidth 273 GB/s (one source says 301).
- Hopper ``mma.sync`` (HMMA.16816 on sm_90, which Triton emits where it does not use wgmma): half
  the wgmma rate, the figure commonly measured for legacy MMA on H100.
"""
from __future__ import annotations

import dataclasses

from sm12x.kernels.common import isa


@dataclasses.dataclass(frozen=True)
class Card:
    """One GPU as the model sees it.

    name, target: the card and the compile target whose SASS runs on it.
    sms, clock_ghz: SM count and the sustained clock under matrix load.
    rates: matrix FLOP per SM per clock by kind: ``mxf8`` (block-scaled QMMA.SF), ``mxf4``
        (OMMA.SF), ``fp8_f32`` (plain QMMA, FP32 accumulation), ``bf16`` (HMMA bf16 / f16,
        FP32 accumulation), ``tf32`` (HMMA TF32), ``wgmma_bf16`` / ``wgmma_fp8`` (Hopper warpgroup MMA).
    dram_gbs: DRAM bandwidth, GB/s; ``dram_efficiency`` the fraction a streaming kernel reaches.
    issue_per_clock: warp instructions issued per SM per clock (four schedulers).
    launch_us: fixed cost of one kernel launch inside a CUDA graph (start, drain, tail).
    sources: where the figures come from, one line.
    """

    name: str
    target: str
    sms: int
    clock_ghz: float
    rates: dict
    dram_gbs: float
    dram_efficiency: float = 0.9
    issue_per_clock: int = 4
    launch_us: float = 2.5
    sources: str = ""

    def rate(self, opcode: str) -> float:
        """Matrix FLOP per SM per clock for one SASS matrix opcode on this card."""
        kind = isa.mma_kind(opcode)
        base = opcode.split(".")[0]
        if kind == isa.HOPPER:
            return self.rates["wgmma_fp8" if base == "QGMMA" else "wgmma_bf16"]
        if kind == isa.FULL_RATE:
            return self.rates["mxf4" if base == "OMMA" else "mxf8"]
        if kind == isa.REDUCED_FP8:
            return self.rates["fp8_f32"]
        if kind == isa.TF32:
            return self.rates["tf32"]
        return self.rates["bf16"]

    def peak_tflops(self, key: str) -> float:
        return self.rates[key] * self.sms * self.clock_ghz / 1e3


# RTX PRO 6000 Blackwell: 188 SMs; MXFP8 ~1,007 TFLOPS dense = 2,048 FLOP/SM/clk at ~2.62 GHz;
# bf16 FP32-accumulate ~504 TFLOPS (half); 1,792 GB/s GDDR7.
RTX_PRO_6000 = Card("RTX PRO 6000", "sm_120", 188, 2.617,
                    dict(mxf8=2048, mxf4=4096, fp8_f32=2048, bf16=1024, tf32=512),
                    1792, sources="whitepaper / datasheet; fp8_f32 at full rate is an assumption")
# RTX 5090: 170 SMs; MXFP8 993 TFLOPS and plain FP8 FP32-accumulate 506 measured (flashinfer #4149)
# = 2,048 / 1,024 FLOP/SM/clk at ~2.85 GHz under load; bf16 FP32-accumulate ~210-253 TFLOPS
# (a quarter of MXFP8); 1,792 GB/s GDDR7.
RTX_5090 = Card("RTX 5090", "sm_120", 170, 2.85,
                dict(mxf8=2048, mxf4=4096, fp8_f32=1024, bf16=512, tf32=256),
                1792, sources="flashinfer #4149 measurements; datasheet")
# DGX Spark GB10: 48 SMs, FP8 ~208 measured / ~250 derived TFLOPS (2,048 FLOP/SM/clk at ~2.5 GHz);
# 273 GB/s LPDDR5X; FP32-accumulate rates at GeForce ratios (assumption).
GB10 = Card("GB10 (DGX Spark)", "sm_121", 48, 2.5,
            dict(mxf8=2048, mxf4=4096, fp8_f32=1024, bf16=512, tf32=256),
            273, sources="datasheet; FP32-accumulate rates at GeForce ratios (assumption)")
# H100 / H200 SXM: 132 SMs, 989 TFLOPS bf16 / 1,979 FP8 dense with wgmma = 4,096 / 8,192
# FLOP/SM/clk at 1.83 GHz; mma.sync at half the wgmma rate (assumption); 3.35 / 4.8 TB/s.
_HOPPER_RATES = dict(wgmma_bf16=4096, wgmma_fp8=8192, wgmma_tf32=2048, bf16=2048, fp8_f32=2048, tf32=1024,
                     mxf8=2048, mxf4=2048)
H100 = Card("H100 SXM", "sm_90", 132, 1.83, _HOPPER_RATES, 3350,
            sources="datasheet; mma.sync at half wgmma (assumption)")
H200 = Card("H200", "sm_90", 132, 1.83, _HOPPER_RATES, 4800, dram_efficiency=0.93,
            sources="datasheet; streaming read measured at 4,472 GB/s (93%) in this project's MoE run")

SM12X_CARDS = (RTX_PRO_6000, RTX_5090, GB10)
CARDS = {c.name: c for c in (*SM12X_CARDS, H100, H200)}

"""The sparse MLA decode's launch configurations and work plan: which head block and tile a call
uses (``pick_config``), how many programs take how many units each (``plan``: whole rows, rows
cut into equal parts, or units dealt out evenly), and whether the combine runs as a programmatic
dependent of the split kernel (PDL). Shapes and the SM count only: CUDA-graph capturable."""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs

D_V = 512  # value / output head dimension

# Per-architecture launch configurations per cache format, by head-block size: a call uses the
# smallest BLOCK_H that covers h_q, else the largest, and a smaller one when that leaves SMs idle
# (``pick_config``). The fp32 accumulator is BLOCK_H x 512 and every program dequantises its
# tokens itself, so a larger BLOCK_H means less repeated dequantisation (h_q = 64 with BLOCK_H 64:
# each token is dequantised once per query). PREFETCH (default 1) is the depth of the loads issued
# ahead of the tile being computed (``_scan_list``).
# sm_120/sm_121 configs must fit 101,376 B of shared memory with no spills (``compile_reports``).
# BLOCK_H 64 fits on sm_120 for MODEL1 only (V3.2 needs an extra RoPE dot).
# SM12X_SPARSE_MLA_CONFIG="BLOCK_H=32,BLOCK_N=16,num_warps=8" overrides the choice (tuning).
_H16 = {"BLOCK_H": 16, "BLOCK_N": 32, "num_warps": 8, "num_stages": 1}
_H32 = {"BLOCK_H": 32, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1}
_H64 = {"BLOCK_H": 64, "BLOCK_N": 16, "num_warps": 8, "num_stages": 1}
# PREFETCH 2 (the next tile's rows held in registers) at BLOCK_H 32 and 64 compiles without
# spills on sm_120/sm_121 for MODEL1 (182-192 / 244-254 registers, 50,304 / 84,224 B) and makes
# these configs faster (timed on the H200, not on an SM12x GPU). At BLOCK_H 16 (N16 or N32) it
# spills or does not pay. V3.2's extra RoPE dot: at BLOCK_H 32 only PREFETCH 2 compiles without
# spills (180 regs; 0 and 1 spill 80-170 B). The sparse prefill's bf16 rows keep PREFETCH 1: with 2
# the sm_120 configs run V4 prefill slower.
# Measurements behind the configs and the plan: docs/performance.md, "Tuning provenance".
_H32_PF2 = {**_H32, "PREFETCH": 2}
_H64_PF2 = {**_H64, "PREFETCH": 2}
# sm_90 model1: 64 tokens per tile everywhere. BLOCK_H 64 spills ~180 B (wgmma keeps the 64 x 512
# fp32 accumulator in registers) and is still the fastest for h_q >= 64 once a call fills the GPU
# (b2 h64 takes BLOCK_H 16, see pick_config); prefetching whole rows (PREFETCH 2) spills ~1 KB
# there, but pays at BLOCK_H 16.
# These wide tiles exceed sm_120's 101,376 B of shared memory, so SM12x keeps the configs above.
_H16_N64 = {"BLOCK_H": 16, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1, "PREFETCH": 2}
_H32_N64 = {"BLOCK_H": 32, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1}
# PREFETCH 2 pays at BLOCK_H 32 too, spilling ~0.6 KB (triton 3.9). At BLOCK_H 64 it spills ~2 KB
# and is much slower.
_H32_N64_PF2 = {**_H32_N64, "PREFETCH": 2}
_H64_N64 = {"BLOCK_H": 64, "BLOCK_N": 64, "num_warps": 8, "num_stages": 1}
# sm_90 v32: h_q 128 takes BLOCK_H 64 x BLOCK_N 64, the tile the sparse prefill's 576-dim rows
# use there (same kernel, same RoPE dot): two head blocks gather each row instead of four, in
# 64-token tiles instead of 16; the fastest of the tiles tried. It spills ~460 B there (triton
# 3.9), like model1's 64 x 64.
# bf16_512 / bf16_576: the sparse prefill's bf16 rows (``sparse_mla_prefill``), d_qk 512 / 576.
# sm_90 takes BLOCK_H 64 x BLOCK_N 64 at d_qk 576, far faster than the FP8 V3.2 config (BLOCK_N
# 16). sm_120 d_qk 576 keeps BLOCK_N 16: BLOCK_N 32 is faster on the H200 but spills 8-16 B on
# sm_120 in the programs that leave row parts to the combine step.
CONFIGS = {
    "sm_120": {"model1": (_H16, _H32_PF2, _H64_PF2), "v32": (_H16, _H32_PF2),
               "bf16_512": (_H16, _H32, _H64), "bf16_576": (_H16, _H32_PF2)},
    "sm_90": {"model1": (_H16_N64, _H32_N64_PF2, _H64_N64), "v32": (_H16, _H32_PF2, _H64_N64),
              "bf16_512": (_H16_N64, _H32_N64, _H64_N64), "bf16_576": (_H32_N64, _H64_N64)},
}
DECODE_FORMATS = ("model1", "v32")
# PARTS: parts merged per step of the combine loop; a dealt-out plan's split rows have two or
# three parts, and there merging 2 per step beats 4
COMBINE_CONFIG = {"BLOCK_HC": 8, "BLOCK_DC": 128, "PARTS": 4, "DEALT_PARTS": 2, "num_warps": 4}
# The fewest candidates per program that pay for its set-up (q, the write-out, the combine):
# the head-block choice counts the programs a call can use in these (``pick_config``).
PROGRAM_TOKENS = 64
WIDE_PRODUCT = 2**31  # units x programs from here on: the unit arithmetic runs in int64


def _env_config():
    text = os.environ.get("SM12X_SPARSE_MLA_CONFIG", "").strip()
    if not text:
        return None
    cfg = {"num_stages": 1}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key.strip() not in ("BLOCK_H", "BLOCK_N", "num_warps", "num_stages", "PREFETCH"):
            raise ValueError(f"SM12X_SPARSE_MLA_CONFIG={text!r}: unknown key {key.strip()!r}")
        cfg[key.strip()] = int(value)
    return cfg


def pick_config(h_q, device, fmt="model1", queries=None, topk=0, extra_topk=0):
    """The launch configuration for ``h_q`` heads of cache format ``fmt`` ("model1" or "v32").
    Given ``queries`` (b * s_q) and the top-k sizes, a call whose head block cannot give half
    the SMs a program of PROGRAM_TOKENS candidates takes the smallest head block (more
    programs, each one cheaper). A program costs about the same at BLOCK_H 32 as at 64 (the
    gather and dequantisation dominate), so a middle step does not pay. Counting 16-token tiles
    instead, the sm_120 configs would keep BLOCK_H 64 for one request of h_q 64, which is slower
    than BLOCK_H 16 (measurements: docs/performance.md, "Tuning provenance")."""
    forced = _env_config()
    if forced is not None:
        return forced
    options = sorted(configs.pick(CONFIGS, device)[fmt], key=lambda c: c["BLOCK_H"])
    cfg = next((c for c in options if c["BLOCK_H"] >= h_q), options[-1])
    if queries is None:
        return cfg
    sms = configs.sm_count(device)

    # every (query, head block, PROGRAM_TOKENS candidates) as its own program
    programs = queries * triton.cdiv(h_q, cfg["BLOCK_H"]) * (
        triton.cdiv(topk, PROGRAM_TOKENS) + triton.cdiv(extra_topk, PROGRAM_TOKENS))
    if 2 * programs < sms:
        cfg = options[0]
    return cfg


class Plan(NamedTuple):
    """A shapes-only launch plan. A row is one query token's head block; it has ``tiles``
    candidate tiles (units). Dealt (``dealt``): the units dealt out evenly to ``programs``
    programs, rows numbered query first or head block first (``head_major``); one row per
    program is the direct case. Else every row is cut into ``splits`` > 1 parts of
    ``tiles_per_split`` tiles, one program each."""
    cfg: dict
    head_blocks: int
    tiles: int
    splits: int
    tiles_per_split: int
    programs: int
    dealt: bool
    head_major: bool
    direct: bool        # no row is split between programs: no combine step
    # The combine step does not read empty parts: set for calls with per-request lengths (they
    # leave empty parts) whose programs fill the GPU, where the combine is bound by bandwidth; a
    # smaller combine is bound by latency and reads every part at once.
    skip_empty: bool = False
    # The combine is launched as the split kernel's programmatic dependent (PDL) where its
    # programs fit beside the split kernel's (``_combine_fits_beside``) and the GPU and Triton
    # support it; SM12X_PDL=0 turns it off.
    pdl: bool = False


def plan(b, s_q, h_q, topk, extra_topk, device, num_splits=None, cfg=None, fmt="model1",
         ragged=False):
    """The launch plan of a call. ``num_splits`` forces every row into that many parts; by
    default the program count comes from a time model (``_best_program_count``; ``ragged``: the
    call has per-request top-k lengths). The sparse prefill's formats (``bf16_*``) always take the
    dealt-out form: their 576-dim config spills in the other one on sm_120 (compile check)."""
    if cfg is None:  # the common case, memoised: this runs on every decode call
        key = (b, s_q, h_q, topk, extra_topk, configs.arch_key(device), configs.sm_count(device),
               num_splits, fmt, ragged, os.environ.get("SM12X_SPARSE_MLA_CONFIG", ""))
        hit = _PLANS.get(key)
        if hit is None:
            hit = _PLANS[key] = _plan(b, s_q, h_q, topk, extra_topk, device, num_splits,
                                      pick_config(h_q, device, fmt, b * s_q, topk, extra_topk),
                                      ragged, fmt not in DECODE_FORMATS)
        return hit
    return _plan(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged,
                 fmt not in DECODE_FORMATS)


_PLANS: dict = {}


def _plan(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged, dealt_only=False):
    pl = _layout(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged, dealt_only)
    sms = configs.sm_count(device)
    return pl._replace(skip_empty=ragged and pl.programs >= sms,
                       pdl=_combine_fits_beside(pl, b * s_q, h_q, sms) and pdl_supported(device))


def _combine_fits_beside(pl, queries, h_q, sms):
    """The combine's programs, launched early (PDL), wait on the SMs the split kernel leaves idle
    and later run there: worth it only where the split kernel is one wave and they fit there,
    8 to an SM. PDL saves a little per call where they fit and costs more where hundreds of
    them crowd onto a few dozen idle SMs (measurements: docs/performance.md, "Tuning
    provenance")."""
    groups, dims, tokens = _combine_grid(h_q, queries)
    return not pl.direct and groups * dims * tokens <= 8 * (sms - pl.programs)


def _combine_grid(h_q, queries):
    """The combine kernel's grid: (head groups of BLOCK_HC, output-dim blocks, query tokens)."""
    return (triton.cdiv(h_q, COMBINE_CONFIG["BLOCK_HC"]), D_V // COMBINE_CONFIG["BLOCK_DC"],
            queries)


def pdl_supported(device):
    """Programmatic dependent launch is possible: a CUDA GPU of compute capability >= 9.0, a
    Triton with ``launch_pdl`` and ``gdc_wait``, and SM12X_PDL is not 0."""
    if getattr(device, "type", "cpu") != "cuda" or torch.version.hip is not None:
        return False
    if os.environ.get("SM12X_PDL", "1").strip() == "0":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _pdl_supported(index)


@functools.lru_cache(maxsize=None)
def _pdl_supported(index):
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        has_option = "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}
        gdc = all(hasattr(tl.extra.cuda, n) for n in ("gdc_wait", "gdc_launch_dependents"))
    except Exception:  # another Triton layout: no PDL
        return False
    return has_option and gdc and torch.cuda.get_device_capability(index)[0] >= 9


def _layout(b, s_q, h_q, topk, extra_topk, device, num_splits, cfg, ragged, dealt_only):
    bn, bh = cfg["BLOCK_N"], cfg["BLOCK_H"]
    tiles = triton.cdiv(topk, bn) + triton.cdiv(extra_topk, bn)
    head_blocks = triton.cdiv(h_q, bh)
    rows = b * s_q * head_blocks
    if num_splits is None:
        programs, head_major = _best_program_count(rows, tiles, configs.sm_count(device),
                                                   bh * D_V * 4 * 2, head_blocks, ragged)
    else:
        programs, head_major = rows * max(1, min(int(num_splits), tiles)), False
    if head_major or programs % rows or programs == rows or dealt_only:  # (one row each: direct)
        return Plan(cfg, head_blocks, tiles, 1, tiles, programs, True, head_major,
                    split_rows(rows, tiles, programs)[0] == 0)
    tiles_per_split = triton.cdiv(tiles, programs // rows)
    splits = triton.cdiv(tiles, tiles_per_split)  # no empty parts
    if splits == 1:
        return Plan(cfg, head_blocks, tiles, 1, tiles, rows, True, False, True)
    return Plan(cfg, head_blocks, tiles, splits, tiles_per_split, rows * splits, False, False,
                False)


def split_rows(rows, tiles, programs):
    """(rows cut between programs, row parts the programs write to the workspace)."""
    if programs % rows == 0:  # every row cut into k equal parts
        k = programs // rows
        return (rows, programs) if k > 1 else (0, 0)
    units = rows * tiles
    cuts = {p * units // programs for p in range(1, programs)}
    split = {c // tiles for c in cuts if c % tiles}
    parts = 0
    for r in split:  # a split row has one part per program that touches it
        first, last = r * tiles, r * tiles + tiles - 1
        parts += ((last + 1) * programs - 1) // units - ((first + 1) * programs - 1) // units + 1
    return len(split), parts


# The cost model, in units of one program's time for one tile: BYTES_PER_STEP bytes of partial
# outputs (written and read once) cost as much as one BLOCK_H 64 x BLOCK_N 64 tile step (derived
# from timings: docs/performance.md, "Tuning provenance").
COMBINE_STEPS = 0.5
BYTES_PER_STEP = 32e6


def _best_program_count(rows, tiles, sms, part_bytes, head_blocks=1, ragged=False):
    """-> (program count, head_major) with the least modelled time: (waves of programs over the
    SMs) x (most tiles per program), plus the combine step and the traffic of the parts it
    merges (``part_bytes`` each, written and read) when a row is split. One program per SM runs
    at a time (the big head blocks fill an SM).
    Candidates: every row cut into k equal parts (query-major: the head blocks of a query token
    run side by side and share its rows in L2), and, unless ``ragged``, one to four programs per
    SM with the units dealt out evenly, rows cut anywhere (head-major with a multiple of
    ``head_blocks`` programs, so that the programs at the same place in each head block's share
    also run side by side). Ragged calls (per-request lengths) keep one program per row part:
    the hardware then balances the uneven rows, which dealt-out units cannot."""
    units = rows * tiles
    candidates = {(rows * k, False) for k in range(1, tiles + 1)}
    if not ragged:
        for w in range(1, 5):
            programs = sms * w // head_blocks * head_blocks
            if head_blocks <= programs <= units and programs % rows:
                candidates.add((programs, True))
    best, best_cost = (rows, False), triton.cdiv(rows, sms) * tiles
    for programs, head_major in sorted(candidates):
        n_split, parts = split_rows(rows, tiles, programs)
        cost = triton.cdiv(programs, sms) * triton.cdiv(units, programs)
        if n_split:
            cost += COMBINE_STEPS + parts * part_bytes / BYTES_PER_STEP
        if cost < 0.95 * best_cost:  # another count must win clearly: the model is rough
            best, best_cost = (programs, head_major), cost
    return best


# the split kernels' (exact and MXFP8) runtime arguments, for their compile checks
_SIGNATURE = {**{n: "*u8" for n in ("cache_ptr", "xcache_ptr")},
              **{n: "*i32" for n in ("idx_ptr", "len_ptr", "xidx_ptr", "xlen_ptr")},
              "q_ptr": "*bf16", "ows_ptr": "*fp32", "lsews_ptr": "*fp32", "mws_ptr": "*fp32",
              "out_ptr": "*bf16", "lse_ptr": "*fp32", "sink_ptr": "*fp32", "max_ptr": "*fp32",
              "qk_scale": "fp32", "cache_stride0": "i64", "xcache_stride0": "i64",
              **{n: "i32" for n in ("stride_qb", "stride_qs", "stride_qh", "cache_ntok", "stride_ib",
                                    "stride_is", "xcache_ntok", "stride_xb", "stride_xs", "stride_ob",
                                    "stride_os", "stride_oh", "S_Q", "H", "TOPK", "XTOPK", "QUERIES",
                                    "HEAD_BLOCKS", "HEAD_MAJOR", "TILES", "SPLITS", "TILES_PER_SPLIT",
                                    "PROGRAMS")}}


def split_signature(kernel, const: dict):
    """(signature, const) of a sparse-MLA split kernel (``_sparse_mla_split_kernel`` or the MXFP8
    decode's) for the compile check: its runtime arguments as the launchers pass them, ``const``
    as constexprs."""
    sig = dict(_SIGNATURE, **{k: "constexpr" for k in const})
    return {n: sig[n] for n in kernel.arg_names}, const


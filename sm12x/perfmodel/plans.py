"""What each op launches for its production cases: per case, the compiled configuration, grid, matrix
FLOPs, hot-loop trips and DRAM bytes of every kernel launch, worked out by the op's own launch
logic (its plan / tile choice, run as if on the modelled card: ``SM12X_KERNEL_CONFIGS`` and
``SM12X_NUM_SMS`` set for the call) and matched to the op's compile reports for that target.

The cases are the production cases of the benchmarks (``scripts/bench_*.py``), so that the model's
sm_90 figures can be held against their measured times.
"""
from __future__ import annotations

from sm12x.perfmodel.compiled import Case, as_card, find
from sm12x.perfmodel.engine import Launch


# ----------------------------------------------------------------------------------------------
# Dense GEMM (fp8_gemm_nt, fp8_einsum)

GEMM_NK = [(1024, 4096), (512, 4096), (32768, 1024), (8192, 1024), (4096, 8192), (4096, 4096), (4096, 2048)]
GEMM_MS = [1, 16, 64, 128, 4096]
EINSUM_BS = [1, 8, 64, 128, 2048]
EINSUM_HRD = (8, 4096, 1024)


def _gemm_launches(op_name, m, n, k, card, groups=1, ue8m0=None):
    """Launches of one block-scaled GEMM (``groups`` of them in one launch, as the einsum runs).
    ``ue8m0``: the scales' kind; default the card's production form (UE8M0 on SM12x, as vLLM >=
    0.25 passes; float32 on sm_90, DeepGEMM's SM90 layout)."""
    from sm12x.kernels.gemm import fp8_gemm
    from sm12x.kernels.gemm.block_scaled import m_class

    sm12x = card.target.startswith("sm_12")
    ue8m0 = sm12x if ue8m0 is None else ue8m0
    tile, block_k, scaled, splits, per, out_tiles = fp8_gemm._plan(
        m, n, k, ue8m0, ue8m0, 128, 128, groups, card.target, card.sms)[:6]
    sf = "ue8m0" if ue8m0 else "fp32"
    prefix = f"{m_class(m)} {tile.describe()} {sf}-sf bf16"
    tma = tile.tma and groups == 1

    def match(kernel, config):
        return (kernel == "fp8_gemm_kernel" and config.startswith(prefix)
                and (" split" in config) == (splits > 1) and (" pointers" in config) == (tile.tma and not tma))

    def match_any_split(kernel, config):  # the compile check builds split variants with +C only
        return (kernel == "fp8_gemm_kernel" and config.startswith(f"{m_class(m)} {tile.describe()} {sf}-sf")
                and (" split" in config) == (splits > 1) and (" pointers" in config) == (tile.tma and not tma))

    try:
        rep = find(op_name, card.target, match, prefix)
    except LookupError:
        rep = find(op_name, card.target, match_any_split, prefix)
    m_tile, n_tile = (tile.block_c, tile.block_r) if tile.swap_ab else (tile.block_r, tile.block_c)
    m_pad, n_pad = -(-m // m_tile) * m_tile, -(-n // n_tile) * n_tile
    flops = 2.0 * m_pad * n_pad * (per * splits * block_k) * groups
    ctas = out_tiles * splits * groups
    out_bytes = m * n * 2 * groups
    dram = groups * (m * k + n * k + (m + n) * k / 128 * 4) + out_bytes
    launches = [Launch(rep, ctas, flops, dram + (splits * m * n * 4 * groups if splits > 1 else 0))]
    if splits > 1:  # the reduction of the fp32 partials
        red = find(op_name, card.target, lambda kern, cfg: kern == "split_k_reduce_kernel", "reduce")
        launches.append(Launch(red, -(-m * n // 1024) * groups, 0.0, splits * m * n * 4 * groups + out_bytes))
    return launches, 2.0 * m * n * k * groups, dram


def gemm_cases(card) -> list:
    out = []
    with as_card(card):
        for n, k in GEMM_NK:
            for m in GEMM_MS:
                launches, flops, dram = _gemm_launches("fp8_gemm_nt", m, n, k, card)
                out.append(Case("fp8_gemm_nt", f"M {m} x N {n} x K {k}", launches, flops, "mxf8", dram,
                                ("fp8_gemm_nt", m, n, k)))
        h, r, d = EINSUM_HRD
        for b in EINSUM_BS:
            launches, flops, dram = _gemm_launches("fp8_gemm_nt", b, d, r, card, groups=h)
            out.append(Case("fp8_einsum", f"bhr,hdr->bhd B {b} (H {h}, R {r}, D {d})", launches, flops,
                            "mxf8", dram, ("fp8_einsum", b)))
    return out


# ----------------------------------------------------------------------------------------------
# Sparse MLA decode and prefill

# (name, fmt, h_q, main top-k, main page, extra top-k, extra page, batches): FlashMLA's production
# decode cases, s_q 2 (scripts/bench_sparse_mla_decode.py)
DECODE = [
    ("MODEL1 CONFIG1", "model1", 64, 128, 512, (2, 64, 74, 128, 148, 256)),
    ("MODEL1 CONFIG2", "model1", 128, 128, 1024, (2, 64, 74, 128, 148, 256)),
    ("MODEL1 CONFIG3", "model1", 64, 128, 1024, (2, 64, 74, 128, 148, 256)),
    ("MODEL1 CONFIG4", "model1", 128, 128, 1024, (2, 64, 74, 128, 148, 256)),
    ("V3.2", "v32", 128, 2048, 0, (2, 64, 74, 128)),
]
# (name, d_qk, s_q, h_q, top-k, s_kv): FlashMLA's prefill performance cases (bench_sparse_mla_prefill.py)
PREFILL = ([("V3.2 h128 top-2048", 576, 4096, 128, 2048, s) for s in (8192, 131072)]
           + [("MODEL1 h64 top-512", 512, 4096, 64, 512, s) for s in (8192, 65536)]
           + [("MODEL1 h128 top-1024", 512, 4096, 128, 1024, s) for s in (8192, 65536)]
           + [("V4 h64 640, 16 query tokens", 512, 16, 64, 640, 65536)])
D_V = 512


def _split_kernel_launches(op_name, fmt, b, s_q, h_q, topk, extra, card, bytes_per_token):
    """The decode kernel's launches (split kernel, then the combine where rows are split)."""
    import torch

    from sm12x.kernels.sparse_mla.decode_plan import plan

    pl = plan(b, s_q, h_q, topk, extra, torch.device("cpu"), fmt=fmt)
    cfg = pl.cfg
    name = f"{fmt} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}"
    if fmt.startswith("bf16"):
        name = f"prefill {fmt} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']}"

    def match(kernel, config):
        return (kernel == "_sparse_mla_split_kernel" and config.startswith(name + " ")
                and (" direct" in config) == pl.direct and (" dealt" in config) == pl.dealt
                and (" pdl" in config) == (pl.pdl and not pl.direct))

    def loose(kernel, config):
        return (kernel == "_sparse_mla_split_kernel" and config.startswith(name + " ")
                and (" direct" in config) == pl.direct)

    try:
        rep = find(op_name, card.target, match, name)
    except LookupError:
        rep = find(op_name, card.target, loose, name)
    d_qk = 576 if fmt in ("v32", "bf16_576") else 512
    rows = b * s_q * pl.head_blocks
    units = rows * pl.tiles
    flops = 2.0 * cfg["BLOCK_H"] * cfg["BLOCK_N"] * (d_qk + D_V) * units
    tokens = b * s_q * (topk + extra)
    dram = tokens * bytes_per_token + b * s_q * h_q * (d_qk + D_V) * 2
    # a direct plan's programs walk whole rows (the hot loop), their tiles in a loop inside it; the
    # other plans' programs walk units (tiles) in the hot loop
    trips = rows / pl.programs if pl.direct else units / pl.programs
    launches = [Launch(rep, pl.programs, flops, dram, trips=trips)]
    if not pl.direct:
        parts = rows * pl.splits if not pl.dealt else pl.programs
        ws = parts * cfg["BLOCK_H"] * D_V * 4 * 2
        comb = find(op_name, card.target, lambda k, c: k == "_sparse_mla_combine_kernel", "combine")
        launches.append(Launch(comb, 1, 0.0, ws))
    return launches, dram


def decode_cases(card) -> list:
    out = []
    with as_card(card):
        for name, fmt, h_q, topk, extra, batches in DECODE:
            bpt = 584 if fmt == "model1" else 656
            d_qk = 512 if fmt == "model1" else 576
            for b in batches:
                launches, dram = _split_kernel_launches("sparse_mla_decode", fmt, b, 2, h_q, topk, extra,
                                                        card, bpt)
                flops = 2.0 * b * 2 * h_q * (topk + extra) * (d_qk + D_V)
                out.append(Case("sparse_mla_decode", f"{name} b {b}", launches, flops, "mxf8", dram,
                                ("sparse_mla_decode", name, b)))
    return out


def prefill_cases(card) -> list:
    import torch

    from sm12x.kernels.sparse_mla import prefill

    out = []
    with as_card(card):
        for name, d_qk, s_q, h_q, topk, s_kv in PREFILL:
            flops = 2.0 * s_q * h_q * topk * (d_qk + D_V)
            dram = s_kv * d_qk * 2 + s_q * h_q * (d_qk + D_V) * 2 + s_q * topk * 4
            if prefill.use_pipelined(s_q, h_q, d_qk, torch.device("cpu")):
                cfg = prefill.pipelined_config(d_qk, torch.device("cpu"))
                tag = f"pipelined d{d_qk} H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"
                rep = find("sparse_mla_prefill", card.target, lambda k, c: c == tag, tag)
                blocks = -(-h_q // cfg["BLOCK_H"])
                ctas = s_q * blocks
                tiles = -(-topk // cfg["BLOCK_N"])
                issued = 2.0 * cfg["BLOCK_H"] * cfg["BLOCK_N"] * (d_qk + D_V) * tiles * ctas
                launches = [Launch(rep, ctas, issued, dram)]
            else:
                launches, _ = _split_kernel_launches("sparse_mla_decode", f"bf16_{d_qk}", s_q, 1, h_q, topk,
                                                     0, card, d_qk * 2)
                launches[0].dram_bytes = dram
            out.append(Case("sparse_mla_prefill", f"{name} s_kv {s_kv}", launches, flops, "mxf8", dram,
                            ("sparse_mla_prefill", name, s_kv)))
    return out


BUILDERS = {"fp8_gemm_nt": gemm_cases, "sparse_mla_decode": decode_cases,
            "sparse_mla_prefill": prefill_cases}


# ----------------------------------------------------------------------------------------------
# MoE grouped GEMMs (DeepSeek-V4-Flash experts: 256 experts, hidden 4096, intermediate 2048)

EXPERTS = 256
# (weights, GEMM, N, K, top-k, tokens): scripts/bench_moe.py's decode (masked) and prefill
# (contiguous) cases
MOE_DECODE = [("FP8", "gate_up", 4096, 4096, 6, 256), ("FP8", "gate_up", 4096, 4096, 8, 768),
              ("FP8", "down", 4096, 2048, 6, 256), ("FP8", "down", 4096, 2048, 8, 768),
              ("FP4", "gate_up", 4096, 4096, 6, 256), ("FP4", "down", 4096, 2048, 6, 256)]
MOE_PREFILL = [("FP4", "gate_up", 4096, 4096, 6, 4096), ("FP4", "gate_up", 4096, 4096, 6, 16384),
               ("FP4", "down", 4096, 2048, 6, 16384), ("FP8", "gate_up", 4096, 4096, 6, 4096),
               ("FP8", "gate_up", 4096, 4096, 6, 16384), ("FP8", "down", 4096, 2048, 6, 16384)]


def _moe_variant(fp4: bool, card) -> str:
    if not fp4:
        return "fp8 b:packed-row"
    return "fp4 a:packed128" if card.target.startswith("sm_12") else "fp4 a:fp32-128"


def _weight_bytes(n, k, fp4):
    return n * k // 2 + n * k // 32 if fp4 else n * k + n * (k // 128) * 4


def moe_cases(card) -> list:
    import torch

    from sm12x.kernels.moe import grouped_contiguous as gc
    from sm12x.kernels.moe import grouped_masked as gm

    out = []
    cpu = torch.device("cpu")
    with as_card(card):
        for w, gemm, n, k, top, tokens in MOE_DECODE:
            fp4 = w == "FP4"
            rows = top * tokens / EXPERTS  # routed at random: every expert has rows
            bm = gm.block_m(int(-(-rows // 1)))
            cfg = gm.pick_config(cpu, fp4, int(-(-rows // 1)))
            tag = f"{_moe_variant(fp4, card)} BM{bm} "
            rep = find("m_grouped_fp8_fp4_gemm_nt_masked", card.target, lambda kern, c: c.startswith(tag), tag)
            bn = int(rep.config.split(" BN")[1].split()[0])
            units = EXPERTS * -(-n // bn)
            ctas = max(1, min(units, cfg.get("per_sm", 2) * card.sms))
            issued = 2.0 * EXPERTS * bm * (-(-n // bn) * bn) * k
            dram = EXPERTS * (_weight_bytes(n, k, fp4) + rows * (k + n * 2))
            out.append(Case("m_grouped_fp8_fp4_gemm_nt_masked", f"decode {w} {gemm} top-{top} x {tokens}",
                            [Launch(rep, ctas, issued, dram, trips=units / ctas)],
                            2.0 * top * tokens * n * k, "mxf4" if fp4 else "mxf8", dram,
                            ("moe", "decode", w, gemm, top, tokens)))
        for w, gemm, n, k, top, tokens in MOE_PREFILL:
            fp4 = w == "FP4"
            m = top * tokens + EXPERTS * 64  # segments padded to 128-row alignment, on average half a tile
            cfg = gc.pick_config(cpu, fp4, 128)
            size = "large"
            tag = f"{_moe_variant(fp4, card)} {size} BN{cfg['BN']} ids"
            rep = find("m_grouped_fp8_fp4_gemm_nt_contiguous", card.target, lambda kern, c: c.startswith(tag), tag)
            ctas = -(-m // cfg["BM"]) * -(-n // cfg["BN"])
            issued = 2.0 * (-(-m // cfg["BM"]) * cfg["BM"]) * (-(-n // cfg["BN"]) * cfg["BN"]) * k
            dram = EXPERTS * _weight_bytes(n, k, fp4) + top * tokens * (k + n * 2)
            out.append(Case("m_grouped_fp8_fp4_gemm_nt_contiguous", f"prefill {w} {gemm} {tokens} x top-{top}",
                            [Launch(rep, ctas, issued, dram)], 2.0 * top * tokens * n * k,
                            "mxf4" if fp4 else "mxf8", dram, ("moe", "prefill", w, gemm, top, tokens)))
    return out


BUILDERS["moe"] = moe_cases


# ----------------------------------------------------------------------------------------------
# Indexer logits (DeepGEMM fp8_fp4_mqa_logits / fp8_fp4_paged_mqa_logits), H 64, D 128, FP8 and FP4

IDX_H, IDX_D = 64, 128
# (S, S_kv): causal prefill rows at the end of S_kv keys (scripts/bench_indexer.py)
MQA_PREFILL = [(2048, 8192), (2048, 65536), (4096, 16384), (4096, 65536), (8192, 32768), (8192, 65536)]
# (B, average context, next_n): paged decode (scripts/bench_indexer.py)
PAGED_DECODE = [(b, ctx, nn) for b, ctx in ((256, 8192), (1024, 8192), (256, 65536), (4096, 8192))
                for nn in (1, 2)]


def indexer_cases(card) -> list:
    """The logits' production cases in both cache forms: FP8 (e4m3 keys + a float32 scale, 132 B per
    key: the frameworks' default) and FP4 (``fp8_fp4_*`` with FP4 q and keys: e2m1 + UE8M0 scales,
    68 B per key; DeepSeek-V4 / V4.1's MXFP4 indexer cache, which vLLM 0.34 takes on SM12x through
    sm12x's record and SGLang 0.5.23's V4.1 pools use), at the same shapes."""
    import torch

    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import mqa_logits as ml
    from sm12x.kernels.indexer import paged_mqa_logits as pml

    out = []
    cpu = torch.device("cpu")
    with as_card(card):
        for form in ("fp8", "fp4"):
            fp4 = form == "fp4"
            key = IDX_D // 2 + 4 if fp4 else IDX_D + 4  # bytes per key (and per q head)
            label = "FP4 " if fp4 else ""
            kind = "mxf4" if fp4 else "mxf8"
            cfg = configs.pick(ml.CONFIGS, cpu)[form]
            tag = f"{form} H{IDX_H} D{IDX_D} out0"
            # the unit-scale block-scaled variant names itself "fp8 mx ..." (the configs that use it)
            rep = find("mqa_logits", card.target,
                       lambda k, c: c.replace(" mx", "").startswith(tag) and "clean" not in c, tag)
            bq = ml._block_q(IDX_H, cfg["rows"])
            for s, s_kv in MQA_PREFILL:
                eff = s * (s_kv - s) + s * (s + 1) // 2  # visible (row, key) pairs
                tiles = -(-s_kv // cfg["BLOCK_N"])
                n_iters = configs.fit_iters(cfg["N_ITERS"], tiles, -(-s // bq), cpu)
                grid = -(-s // bq) * -(-tiles // n_iters)
                visible = eff / (s * s_kv)  # programs past every row's last key exit at once
                ctas = max(1, round(grid * visible))
                issued = 2.0 * bq * IDX_H * IDX_D * cfg["BLOCK_N"] * (eff / (bq * cfg["BLOCK_N"]))
                dram = s_kv * key + s * IDX_H * key + eff * 4
                out.append(Case("mqa_logits", f"{label}prefill S {s} x S_kv {s_kv}", [Launch(rep, ctas, issued, dram)],
                                2.0 * eff * IDX_H * IDX_D, kind, dram,
                                ("mqa_logits", s, s_kv) + (("fp4",) if fp4 else ())))
            pcfg = configs.pick(pml.CONFIGS, cpu)[form]
            for b, ctx, nn in PAGED_DECODE:
                bt = pml.block_t(IDX_H, nn, pcfg["rows"])
                pair = pml.pair_tokens(pcfg, bt, IDX_H, nn, fp4)
                row_programs = b * -(-nn // (2 * bt if pair else bt))
                blocks = -(-ctx // 64)
                cols, _, multi = pml.grid_columns(blocks, row_programs, cpu, pcfg)
                want = f"{form} H{IDX_H} D{IDX_D} bkv64 T{bt}{'x2' if pair else ''} out0"
                rep = find("paged_mqa_logits", card.target,
                           lambda k, c: c.replace(" mx", "").startswith(want) and ("multi-chunk" in c) == multi
                           and "clean" not in c, want)
                ctas = row_programs * cols
                rows_per = (2 * bt if pair else bt) * IDX_H
                issued = 2.0 * rows_per * IDX_D * 64 * blocks * row_programs
                dram = b * ctx * key + b * nn * ctx * 4
                out.append(Case("paged_mqa_logits", f"{label}decode B {b} x ctx {ctx}, next_n {nn}",
                                [Launch(rep, ctas, issued, dram)], 2.0 * b * nn * ctx * IDX_H * IDX_D, kind, dram,
                                ("paged_mqa_logits", b, ctx, nn) + (("fp4",) if fp4 else ())))
    return out


BUILDERS["indexer"] = indexer_cases


# ----------------------------------------------------------------------------------------------
# Anchors: what the field's SM12x kernels are reported to reach, at the same shapes

def anchor_cases(card) -> list:
    """The published SM12x anchor points as cases of our ops on ``card``: FlashInfer's SM120 sparse
    decode at T=1 (one V4 request, 64 heads, SWA window 128 + top-512 of an 18K context's compressed
    cache: flashinfer #4802, 11.3 µs on an RTX PRO 6000), DeepGEMM's SM120 FP8 GEMM (~778 TFLOPS on
    an RTX PRO 6000, DeepGEMM PR #324, secondary report) and torch's MXFP8 ``_scaled_mm`` at 4096^3
    (678 TFLOPS on an RTX 5090, quack PR #153)."""
    out = []
    with as_card(card):
        launches, dram = _split_kernel_launches("sparse_mla_decode", "model1", 1, 1, 64, 128, 512, card, 584)
        out.append(Case("anchor", "V4 decode T=1, h 64, 128 + 512 of 18K (FlashInfer SM120: 11.3 µs, PRO 6000)",
                        launches, 2.0 * 64 * 640 * (512 + 512), "mxf8", dram, ("anchor", "decode")))
        for m, n, k, label in ((4096, 4096, 8192, "DeepGEMM SM120 FP8 ~778 TFLOPS, PRO 6000"),
                               (4096, 4096, 4096, "torch MXFP8 _scaled_mm 678 TFLOPS, RTX 5090")):
            launches, flops, dram = _gemm_launches("fp8_gemm_nt", m, n, k, card, ue8m0=True)
            out.append(Case("anchor", f"fp8_gemm_nt {m}x{n}x{k} UE8M0 ({label})", launches, flops, "mxf8", dram,
                            ("anchor", m, n, k)))
    return out


BUILDERS["anchors"] = anchor_cases


# ----------------------------------------------------------------------------------------------
# mHC pre-norm GEMM (tf32_hc_prenorm_gemm), (N, K) = (24, 16384), num_splits 16 as vLLM calls it

PRENORM_NK = (24, 16384)
PRENORM_MS = [1, 16, 64, 137, 1024, 4096]
PRENORM_SPLITS = 16


def prenorm_cases(card) -> list:
    import torch

    from sm12x.kernels.common import configs
    from sm12x.kernels.gemm import hc_prenorm_gemm as hp

    n, k = PRENORM_NK
    out = []
    with as_card(card):
        for m in PRENORM_MS:
            size = "small" if m <= hp.SMALL_M else "large"
            cfg = configs.pick(hp.CONFIGS, torch.device("cpu"))[size]
            rep = find("tf32_hc_prenorm_gemm", card.target,
                       lambda kern, c: kern == "hc_prenorm_kernel" and c.startswith(size), size)
            ctas = -(-m // cfg["BLOCK_M"]) * PRENORM_SPLITS
            issued = 2.0 * (-(-m // cfg["BLOCK_M"]) * cfg["BLOCK_M"]) * 32 * k
            dram = m * k * 2 + n * k * 4 + PRENORM_SPLITS * m * (n + 1) * 4
            out.append(Case("tf32_hc_prenorm_gemm", f"M {m} (N {n}, K {k}, num_splits {PRENORM_SPLITS})",
                            [Launch(rep, ctas, issued, dram)], 2.0 * m * n * k, "tf32", dram,
                            ("tf32_hc_prenorm_gemm", m)))
    return out


BUILDERS["prenorm"] = prenorm_cases


def _fast_launches(op_name, fmt, b, s_q, h_q, topk, extra, card, prefill=False):
    """The MXFP8 kernel's launches (``decode_mxfp8``: head blocks x V parts x row parts, then the
    combine where rows are split) for b requests of s_q query tokens."""
    from sm12x.kernels.sparse_mla import decode_mxfp8 as mx

    cfg = mx.pick_config(h_q, fmt)
    bh, bn, vp = cfg["BLOCK_H"], cfg["BLOCK_N"], cfg["V_PARTS"]
    d_qk = 512 if fmt == "model1" else 576
    tag = f"mxfp8 {fmt} H{bh} N{bn} w{cfg['num_warps']} q{cfg['Q_TERMS']}p{cfg['P_TERMS']}v{vp} "
    kind = "prefill" if prefill else "p"
    rep = find(op_name, card.target, lambda k, c: c.startswith(tag) and (" prefill " in c) == prefill,
               tag + kind)
    tiles = -(-topk // bn) + -(-extra // bn)
    rows = b * s_q * -(-h_q // bh)
    splits = mx.splits_for(rows * vp, tiles, card.sms)
    per = -(-tiles // splits)
    # per program and tile: QK with the no-RoPE part as Q_TERMS block-scaled MMAs and RoPE in bf16
    # (every V part computes it), PV over the part's share of the 512 output dims in P_TERMS MMAs
    issued = 2.0 * bh * bn * ((d_qk - 64) * cfg["Q_TERMS"] + 64 + D_V * cfg["P_TERMS"] / vp) * rows * vp * tiles
    launches = [Launch(rep, rows * vp * splits, issued, 0.0, trips=per)]
    if splits > 1:
        comb = find("sparse_mla_decode", card.target, lambda k, c: k == "_sparse_mla_combine_kernel", "combine")
        launches.append(Launch(comb, 1, 0.0, rows * splits * bh * D_V * 4 * 2))
    return launches


def decode_fast_cases(card) -> list:
    """The decode's fast precision (``SM12X_ATTENTION_PRECISION=fast``: block-scaled MXFP8 MMAs,
    ``decode_mxfp8``) on the same production cases; SM12x targets only (sm_90 emulates it)."""
    if not card.target.startswith("sm_12"):
        return []
    out = []
    with as_card(card):
        for name, fmt, h_q, topk, extra, batches in DECODE:
            bpt = 584 if fmt == "model1" else 656
            d_qk = 512 if fmt == "model1" else 576
            for b in batches:
                launches = _fast_launches("sparse_mla_decode", fmt, b, 2, h_q, topk, extra, card)
                # every head block gathers its rows again: bytes per head block, from L2 after the first
                dram = b * 2 * (topk + extra) * bpt + b * 2 * h_q * (d_qk + D_V) * 2
                launches[0].dram_bytes = dram
                flops = 2.0 * b * 2 * h_q * (topk + extra) * (d_qk + D_V)
                out.append(Case("sparse_mla_decode (fast)", f"{name} b {b}", launches, flops, "mxf8", dram,
                                ("sparse_mla_decode_fast", name, b)))
    return out


def prefill_fast_cases(card) -> list:
    """The sparse prefill's fast precision (``prefill_mxfp8``: kv packed into the FP8 cache layout,
    then the MXFP8 kernel) on the prefill production cases; SM12x targets only."""
    from sm12x.kernels.sparse_mla import prefill_mxfp8 as pm

    if not card.target.startswith("sm_12"):
        return []
    out = []
    with as_card(card):
        for name, d_qk, s_q, h_q, topk, s_kv in PREFILL:
            fmt = "model1" if d_qk == 512 else "v32"
            bpt = 584 if fmt == "model1" else 656
            pack = find("sparse_mla_prefill", card.target, lambda k, c: c == f"mxfp8 pack d{d_qk}",
                        f"pack d{d_qk}")
            launches = [Launch(pack, -(-s_kv // pm.BLOCK_T), 0.0, s_kv * (d_qk * 2 + bpt))]
            launches += _fast_launches("sparse_mla_prefill", fmt, s_q, 1, h_q, topk, 0, card, prefill=True)
            dram = s_kv * bpt + s_q * h_q * (d_qk + D_V) * 2 + s_q * topk * 4
            launches[1].dram_bytes = dram
            flops = 2.0 * s_q * h_q * topk * (d_qk + D_V)
            out.append(Case("sparse_mla_prefill (fast)", f"{name} s_kv {s_kv}", launches, flops, "mxf8",
                            dram + s_kv * (d_qk * 2 + bpt), ("sparse_mla_prefill_fast", name, s_kv)))
    return out


BUILDERS["decode_fast"] = decode_fast_cases
BUILDERS["prefill_fast"] = prefill_fast_cases


# ----------------------------------------------------------------------------------------------
# DeepSeek-V4.1's candidate-only paged logits (paged_sparse_mqa_logits): FP4 keys, 32 heads,
# published blocks of 8 positions per row (scripts/bench_v41_indexer.py)

SPARSE_ROWS = (64, 256, 1024)
SPARSE_BLOCKS, SPARSE_BS, SPARSE_H = 512, 8, 32


def sparse_logits_cases(card) -> list:
    import torch

    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import paged_sparse_mqa_logits as psl

    out = []
    with as_card(card):
        cfg = configs.pick(psl.CONFIGS, torch.device("cpu"))
        tag = f"fp4 H{SPARSE_H} page64 bs{SPARSE_BS} bf16"
        rep = find("paged_sparse_mqa_logits", card.target, lambda k, c: c == tag, tag)
        width = SPARSE_BLOCKS * SPARSE_BS
        for rows in SPARSE_ROWS:
            ctas = rows * -(-width // (cfg["BLOCK_N"] * cfg["N_ITERS"]))
            flops = 2.0 * rows * width * SPARSE_H * psl.D
            # FP4 keys: 64 B of e2m1 + 4 B of scales per position, the bf16 logits written once
            dram = rows * width * (psl.D // 2 + 4) + rows * width * 2
            out.append(Case("paged_sparse_mqa_logits", f"decode {rows} rows x {SPARSE_BLOCKS} blocks of {SPARSE_BS}",
                            [Launch(rep, ctas, flops, dram)], flops, "mxf4", dram,
                            ("paged_sparse_mqa_logits", rows)))
    return out


BUILDERS["sparse_logits"] = sparse_logits_cases


# ----------------------------------------------------------------------------------------------
# The fused indexer top-k: logits windows and the select / fold / merge kernels of each call
# (its own module, sm12x/perfmodel/topk_plan.py), and DeepSeek-V4.1's candidate top-k, the same
# calls with a window hook and a block selection (sm12x/perfmodel/candidate_plan.py)

def topk_cases(card) -> list:
    from sm12x.perfmodel import topk_plan

    return topk_plan.cases(card)


def candidate_cases(card) -> list:
    from sm12x.perfmodel import candidate_plan

    return candidate_plan.cases(card)


BUILDERS["indexer_topk"] = topk_cases
BUILDERS["candidate_topk"] = candidate_cases


# Every op of the manifest (sm12x.kernels.manifest.OPS) and the builders that model its production
# cases; an op the model leaves out goes in UNMODELED with the reason (tests/perfmodel checks both).
MODELED = {
    "sparse_mla_decode": ("sparse_mla_decode", "decode_fast", "anchors"),
    "sparse_mla_prefill": ("sparse_mla_prefill", "prefill_fast"),
    "mqa_logits": ("indexer",),
    "paged_mqa_logits": ("indexer",),
    "indexer_topk": ("indexer_topk",),
    "candidate_topk": ("candidate_topk",),
    "paged_sparse_mqa_logits": ("sparse_logits",),
    "fp8_gemm_nt": ("fp8_gemm_nt", "anchors"),
    "fp8_einsum": ("fp8_gemm_nt",),
    "tf32_hc_prenorm_gemm": ("prenorm",),
    "m_grouped_fp8_fp4_gemm_nt_contiguous": ("moe",),
    "m_grouped_fp8_fp4_gemm_nt_masked": ("moe",),
}
UNMODELED: dict = {}

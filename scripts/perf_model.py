#!/usr/bin/env python3
"""The performance model's tables: every production case of every modelled op on RTX PRO 6000,
RTX 5090 and DGX Spark (GB10), modeled from the sm_120 / sm_121 machine code, with the roofline
bound beside it; and (``--validate``) the same model for sm_90 on an H200 against the times
measured there (``MEASURED``, from docs/performance.md), with its error per case and per op; the
same on an H100 for the cases measured there (``MEASURED_H100``).

No GPU needed: Triton compiles each configuration for the target here. Takes a few minutes (every
configuration of every op is compiled once per target).

    python3 scripts/perf_model.py                       # SM12x tables (markdown)
    python3 scripts/perf_model.py --validate            # + the H200 validation table
    python3 scripts/perf_model.py --ops fp8_gemm_nt --cards "RTX 5090"
    python3 scripts/perf_model.py --validate --markdown out.md --json out.json

The model (``sm12x/perfmodel/engine.py``) and the card figures with their sources
(``sm12x/perfmodel/cards.py``) say what is assumed. An op whose validation error exceeds 30% on
some case is marked so: its SM12x figures are not targets until the model is fixed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ.pop("TRITON_INTERPRET", None)

# H200 (132 SMs), sm_90 configs, SM12X_FORCE=1, torch 2.11.0+cu130, Triton 3.6.0: the sm12x
# columns of docs/performance.md (decode / prefill / MoE 2026-12-04, GEMM / einsum 2026-12-05), in µs.
MEASURED = {
    **{("fp8_gemm_nt", m, n, k): us for (m, n, k), us in {
        (1, 1024, 4096): 6.4, (16, 1024, 4096): 7.6, (64, 1024, 4096): 9.2, (128, 1024, 4096): 9.4,
        (4096, 1024, 4096): 58.2, (1, 512, 4096): 5.8, (16, 512, 4096): 6.8, (64, 512, 4096): 8.1,
        (128, 512, 4096): 8.4, (4096, 512, 4096): 31.3, (1, 32768, 1024): 14.0, (16, 32768, 1024): 14.7,
        (64, 32768, 1024): 20.0, (128, 32768, 1024): 20.6, (4096, 32768, 1024): 521.3,
        (1, 8192, 1024): 7.7, (16, 8192, 1024): 8.8, (64, 8192, 1024): 10.7, (128, 8192, 1024): 8.2,
        (4096, 8192, 1024): 135.4, (1, 4096, 8192): 16.2, (16, 4096, 8192): 19.7, (64, 4096, 8192): 22.0,
        (128, 4096, 8192): 29.5, (4096, 4096, 8192): 404.2, (1, 4096, 4096): 10.4, (16, 4096, 4096): 12.1,
        (64, 4096, 4096): 14.5, (128, 4096, 4096): 17.3, (4096, 4096, 4096): 207.7, (1, 4096, 2048): 8.0,
        (16, 4096, 2048): 8.8, (64, 4096, 2048): 10.9, (128, 4096, 2048): 11.9, (4096, 4096, 2048): 113.9,
    }.items()},
    **{("fp8_einsum", b): us for b, us in {1: 17.0, 8: 17.1, 64: 22.6, 128: 24.0, 2048: 234.3}.items()},
    **{("sparse_mla_decode", name, b): us for name, row in {
        "MODEL1 CONFIG1": (17.2, 63.2, 92.0, 116.4, 163.5, 219.6),
        "MODEL1 CONFIG2": (23.3, 180.2, 233.9, 348.2, 437.2, 680.3),
        "MODEL1 CONFIG3": (21.1, 101.9, 121.4, 168.0, 204.4, 275.2),
        "MODEL1 CONFIG4": (23.6, 141.0, 190.3, 255.4, 287.1, 453.2),
        "V3.2": (30.6, 423.2, 488.4, 828.4)}.items()
       for b, us in zip((2, 64, 74, 128, 148, 256), row)},
    ("sparse_mla_prefill", "V3.2 h128 top-2048", 8192): 10162, ("sparse_mla_prefill", "V3.2 h128 top-2048", 131072): 10975,
    ("sparse_mla_prefill", "MODEL1 h64 top-512", 8192): 1245, ("sparse_mla_prefill", "MODEL1 h64 top-512", 65536): 1408,
    ("sparse_mla_prefill", "MODEL1 h128 top-1024", 8192): 4502,
    ("sparse_mla_prefill", "MODEL1 h128 top-1024", 65536): 4878,
    ("sparse_mla_prefill", "V4 h64 640, 16 query tokens", 65536): 20,
    ("moe", "decode", "FP8", "gate_up", 6, 256): 1014, ("moe", "decode", "FP8", "gate_up", 8, 768): 1145,
    ("moe", "decode", "FP8", "down", 6, 256): 522, ("moe", "decode", "FP8", "down", 8, 768): 584,
    ("moe", "decode", "FP4", "gate_up", 6, 256): 3179,
    ("moe", "prefill", "FP8", "gate_up", 6, 4096): 2544, ("moe", "prefill", "FP8", "gate_up", 6, 16384): 8781,
    ("moe", "prefill", "FP8", "down", 6, 16384): 4670,
    ("mqa_logits", 8192, 65536): 7830,
    # the fused indexer top-k (docs/performance.md, "Fused indexer top-k", 2026-12-04): prefill timed
    # with do_bench, decode by CUDA-graph replay
    ("indexer_topk", "prefill S 4096 x S_kv 262,144, top-512"): 22500,
    ("indexer_topk", "prefill S 4096 x S_kv 262,144, top-2048"): 28600,
    ("indexer_topk", "prefill chunk 16 requests x 512 new after 0-29,000 keys, top-2048"): 21900,
    ("indexer_topk", "1M-token prompt: chunk S 8192 x S_kv 262,144, top-512"): 44600,
    ("indexer_topk", "decode", 256, 8192, 1, 2048, None): 191,
    ("indexer_topk", "decode", 1, 262144, 1, 2048, 262144): 66,
    **{("tf32_hc_prenorm_gemm", m): us for m, us in {1: 9.8, 16: 9.9, 64: 10.0, 137: 11.9, 1024: 32.2,
                                                     4096: 121.1}.items()},
}
MEASURED_NOTE = ("H200 (132 SMs), sm_90 configs, torch 2.11.0+cu130, Triton 3.6.0, docs/performance.md "
                 "(2026-12-04 / 05)")
# H100 measurements, in µs, by case key (the rows' ``key``). DeepSeek-V4.1's fused candidate top-k
# (its consumer on the candidate keys only, ``candidate_gather``): both layers of one pass through
# vLLM 0.34's sparse_attn_indexer over 1,048,576 indexer keys (docs/performance.md, the 1M-token
# indexer pass, --v41: median of 3 timed calls, CUDA events, not graph-replayed), and the
# production decode rows from ``scripts/bench_v41_indexer.py --graph``'s "fused, CUDA graph"
# column (64 rows, each with its own pages, 64 FP8 heads, top-1024, 18 blocks of 64, max_model_len
# 262,144), one entry per context and layer.
MEASURED_H100 = {
    ("candidate_topk", "vLLM", "source + consumer", "prefill", 8192, 1 << 20): 534100,
    ("candidate_topk", "vLLM", "source + consumer", "decode", 64, 1 << 20): 4900,
    **{("candidate_topk", "vLLM", layer, "decode", 64, ctx, 1, 1024, 18, 64, False): us
       for (layer, ctx), us in {("source", 32768): 277.4, ("consumer", 32768): 90.7,
                                ("source", 131072): 616.8, ("consumer", 131072): 90.4,
                                ("source", 262144): 1113.8, ("consumer", 262144): 90.6}.items()},
}
MEASURED_H100_NOTE = ("NVIDIA H100 80GB HBM3 (132 SMs), sm_90 configs, torch 2.11.0+cu130, Triton 3.6.0, "
                      "docs/performance.md (2026-12-06 16:13-16:17 UTC: scripts/prove_1m_indexer.py --v41, "
                      "scripts/bench_v41_indexer.py --graph)")
# the cards the validation models, each with its measurements and where they come from
VALIDATION = {"H200": (MEASURED, MEASURED_NOTE), "H100 SXM": (MEASURED_H100, MEASURED_H100_NOTE)}
ERROR_LIMIT = 0.30


def roofline_kind(kind: str, card) -> str:
    """The roofline's rate key on ``card`` for an op whose best SM12x instruction is ``kind``."""
    if card.target == "sm_90":
        return "wgmma_tf32" if kind == "tf32" else "wgmma_fp8"
    return kind


def model(builders, card_list):
    from sm12x.perfmodel import engine

    rows = []
    for name, build in builders:
        for card in card_list:
            for case in build(card):
                e = engine.estimate_case(case.launches, card)
                roof = engine.roofline_us(case.flops, case.dram_bytes, card, roofline_kind(case.kind, card))
                rep = case.launches[0].report
                rows.append(dict(op=case.op, case=case.name, card=card.name, target=card.target,
                                 flops=case.flops, model_us=round(e.time_us, 2), roofline_us=round(roof, 2), bound=e.bound,
                                 detail=e.detail, config=rep.config, key=list(case.key),
                                 of_roofline=round(roof / e.time_us, 3) if e.time_us else 0.0))
    return rows


def sm12x_tables(rows, card_list) -> str:
    out = []
    for op in dict.fromkeys(r["op"] for r in rows if r["target"] != "sm_90"):
        cases = list(dict.fromkeys(r["case"] for r in rows if r["op"] == op))
        head = "| case | " + " | ".join(f"{c.name}: model µs, roofline µs, bound, TFLOPS" for c in card_list) + " |"
        out += [f"### {op} (modeled, not measured)", "", head, "|---|" + "---:|" * len(card_list)]
        for case in cases:
            cells = []
            for c in card_list:
                r = next((x for x in rows if x["op"] == op and x["case"] == case and x["card"] == c.name), None)
                cells.append(f"{r['model_us']:.1f}, {r['roofline_us']:.1f}, {r['bound']}, "
                             f"{r['flops'] / r['model_us'] / 1e6:.0f}" if r else "")
            out.append(f"| {case} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def validation(rows, card="H200"):
    """The rows of ``card`` (a ``VALIDATION`` card) with a measured time, and their error."""
    val = []
    for r in rows:
        if r["target"] != "sm_90" or r["card"] != card:
            continue
        measured = VALIDATION[card][0].get(tuple(r["key"]))
        if measured is None:
            continue
        val.append(dict(r, measured_us=measured, error=round(r["model_us"] / measured - 1, 3)))
    return val


def validation_table(val, card="H200") -> str:
    out = [f"Measured: {VALIDATION[card][1]}. Error = modeled / measured - 1.", "",
           "| op | cases | mean abs error | worst case | worst error | within 30% |", "|---|---:|---:|---|---:|---|"]
    for op in dict.fromkeys(v["op"] for v in val):
        vs = [v for v in val if v["op"] == op]
        worst = max(vs, key=lambda v: abs(v["error"]))
        mean = sum(abs(v["error"]) for v in vs) / len(vs)
        ok = all(abs(v["error"]) <= ERROR_LIMIT for v in vs)
        out.append(f"| {op} | {len(vs)} | {mean:.0%} | {worst['case']} | {worst['error']:+.0%} | "
                   f"{'yes' if ok else 'no: not used for targets'} |")
    out += ["", "| op | case | measured µs | modeled µs | error | bound |", "|---|---|---:|---:|---:|---|"]
    for v in val:
        out.append(f"| {v['op']} | {v['case']} | {v['measured_us']:.1f} | {v['model_us']:.1f} | "
                   f"{v['error']:+.0%} | {v['bound']} |")
    return "\n".join(out)


def main():
    from sm12x.perfmodel import cards, plans

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", help="comma-separated: " + ", ".join(plans.BUILDERS))
    ap.add_argument("--cards", help="comma-separated card names (default: the three SM12x cards)")
    ap.add_argument("--validate", action="store_true",
                    help="also model sm_90 on an H200 against MEASURED (and an H100 against MEASURED_H100)")
    ap.add_argument("--markdown", help="write the tables here too")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    names = [o.strip() for o in args.ops.split(",")] if args.ops else list(plans.BUILDERS)
    unknown = [n for n in names if n not in plans.BUILDERS]
    if unknown:
        ap.error(f"argument --ops: unknown {', '.join(unknown)}; supported: {', '.join(plans.BUILDERS)}")
    card_list = ([cards.CARDS[c.strip()] for c in args.cards.split(",")] if args.cards
                 else list(cards.SM12X_CARDS))
    builders = [(n, plans.BUILDERS[n]) for n in names]
    import triton

    checked = [c for c in (cards.H200, cards.H100) if args.validate and VALIDATION[c.name][0]]
    rows = model(builders, card_list + [c for c in checked if c not in card_list])
    stamp = (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, Triton {triton.__version__} "
             f"(the SASS read), model constants CPI / BARRIER in sm12x/perfmodel/engine.py")
    sm12x_cards = [c for c in card_list if c.target != "sm_90"]
    text = [f"Modeled {stamp}.", "", sm12x_tables(rows, sm12x_cards) if sm12x_cards else ""]
    val = [v for c in checked for v in validation(rows, c.name)]
    for c in (c for c in checked if validation(rows, c.name)):
        text += [f"### Validation on the {c.name} (sm_90 builds, modeled against measured)", "",
                 validation_table(validation(rows, c.name), c.name), ""]
    doc = "\n".join(text)
    print(doc)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(doc + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(stamp=stamp, rows=rows, validation=val), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

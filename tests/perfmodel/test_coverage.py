"""The performance model covers the manifest: every op has builders for its production cases, or a
stated reason it has none; the fused indexer top-k's plan (many launches per call) walks its
windows as the op does, V4.1's candidate top-k adds its hooks and block selection to those windows
and its consumers' masked windows change the top-k's path; the logits have FP4 rows. No compile:
the plans run on stand-in compile reports."""
import dataclasses

import pytest

from sm12x.kernels import manifest
from sm12x.kernels.common.compile_check import CompileReport
from sm12x.perfmodel import cards, compiled, engine, plans


def test_every_manifest_op_has_a_plan_or_a_reason():
    names = [op.name for op in manifest.OPS]
    missing = [n for n in names if n not in plans.MODELED and not str(plans.UNMODELED.get(n, "")).strip()]
    assert not missing, f"ops with no builder in plans.MODELED and no reason in plans.UNMODELED: {missing}"
    assert not set(plans.MODELED) & set(plans.UNMODELED), "an op is both modeled and unmodeled"
    assert not (set(plans.MODELED) | set(plans.UNMODELED)) - set(names), "entries for ops not in the manifest"
    for op, builders in plans.MODELED.items():
        assert builders and all(b in plans.BUILDERS for b in builders), (op, builders)


def _stand_in(op_name, target, match, what):
    """A compile report with a plausible SASS summary: the logits kernels a block-scaled MMA loop,
    the top-k kernels two column loops (or none: the merges and the collect)."""
    logits = "logits" in what or what.startswith(("fp8 H", "fp4 H"))
    if logits:
        mma = {"QMMA.SF.16832.F32.E4M3.E4M3.E8": 16}
        isa = dict(mma=mma, loop_mma=mma, loop_instructions=120, loop_widen=0, loop_class={}, instructions=600)
    else:
        isa = dict(mma={}, loop_mma={}, loop_instructions=0, loop_widen=0, loop_class={}, instructions=900,
                   stream_loops=[] if "merge" in what or "collect" in what else [80, 200])
    return CompileReport("k", what, target, 0, 64, 0, True, num_warps=8, ctas_per_sm=2, isa=isa)


def test_topk_plan_walks_the_windows(monkeypatch):
    from sm12x.perfmodel import topk_plan

    monkeypatch.setattr(compiled, "find", _stand_in)
    card = cards.RTX_5090
    cases = topk_plan.cases(card)
    assert len(cases) == len(topk_plan.PREFILL) + len(topk_plan.DECODE)
    by_name = {c.name: c for c in cases}
    # S 4096 x 262,144: one block of rows, 16 windows of 16,384 columns, each a logits launch
    p = by_name["prefill S 4096 x S_kv 262,144, top-512"]
    assert sum(1 for l in p.launches if l.flops) == 16
    assert sum(l.flops for l in p.launches) == pytest.approx(p.flops)  # every visible (row, key) pair once
    # a window after the first folds in: collect + merge, then the floor select for the rest
    assert sum(1 for l in p.launches if l.report.config.startswith("collect")) == 15
    # one 1M-token request: one window, no fold
    d = next(c for c in cases if c.key[1:] == ("decode", 1, topk_plan.MODEL_LEN, 1, 2048, topk_plan.MODEL_LEN))
    assert sum(1 for l in d.launches if l.flops) == 1
    assert not any(l.report.config.startswith("collect") for l in d.launches)
    for c in cases:
        est = engine.estimate_case(c.launches, dataclasses.replace(card, launch_us=0.0))
        logits = engine.estimate_case([l for l in c.launches if l.flops], dataclasses.replace(card, launch_us=0.0))
        assert est.time_us > logits.time_us > 0, c.name  # the top-k kernels cost time of their own


def _configs(launches):
    return [l.report.config for l in launches]


def test_candidate_plan_adds_its_hooks_to_the_fused_topk(monkeypatch):
    from sm12x.perfmodel import candidate_plan as cp
    from sm12x.perfmodel import topk_plan

    monkeypatch.setattr(compiled, "find", _stand_in)
    card = cards.RTX_PRO_6000
    cases = cp.cases(card)
    assert len(cases) == 2 * len(cp.PREFILL) + sum(len(d[-1]) for d in cp.DECODE)
    assert all(c.op == "candidate_topk" for c in cases)
    by_key = {c.key: c for c in cases}
    # a source's launches are the plain fused top-k's, each window's followed by its block-max fold,
    # then the block selection (torch launches)
    _, label, make_rows, s_kv, topk, kb, bs, fp4 = cp.PREFILL[0]
    src = by_key[("candidate_topk", "vLLM", "source", label)]
    with compiled.as_card(card):
        plain = topk_plan._Call(card, topk, " starts ends")
        topk_plan.prefill_windows(plain, card, make_rows(), s_kv, topk)
    kernels = [l for l in src.launches if not l.report.config.startswith(("candidate", "torch"))]
    assert _configs(kernels) == _configs(plain.launches)
    windows = sum(1 for l in src.launches if l.flops)
    assert sum(1 for l in src.launches if l.report.config == f"candidate block max B{bs}") == windows
    assert sum(l.flops for l in src.launches) == pytest.approx(src.flops)
    torch_launches = [l for l in src.launches if l.report.config.startswith("torch")]
    assert len(torch_launches) == cp.SOURCE_TORCH_LAUNCHES + 1
    # a consumer 4x wider than its candidate keys ranks those keys only (candidate_gather): the
    # gather, the fused paged top-k over them, the map and fill; cheaper than its source here
    dec = [c for c in cases if c.key[3] == "decode" and c.key[4] == 64 and c.key[5] == 262144]
    src, con = sorted(dec, key=lambda c: c.key[2] != "source")
    assert _configs(con.launches).count("gather") == 1 and _configs(con.launches).count("map and fill") == 1
    assert not any(x.startswith("candidate mask") for x in _configs(con.launches))
    zero = dataclasses.replace(card, launch_us=0.0)
    time = lambda c: engine.estimate_case(c.launches, zero).time_us  # noqa: E731
    assert time(con) < time(src)
    # scoring every visible key instead, it masks each window; a long decode row with 18 x 64
    # candidate keys draws a -FLT_MAX filter threshold: the full radix select follows the filter
    from sm12x.kernels.indexer import candidate_gather as cg

    monkeypatch.setattr(cg, "MIN_WIDTH_RATIO", 1 << 62)
    dense = [c for c in cp.cases(card) if c.key[3] == "decode" and c.key[4] == 64 and c.key[5] == 262144]
    con = next(c for c in dense if c.key[2] == "consumer")
    assert sum(1 for l in con.launches if l.report.config == "candidate mask B64") == 1
    full = lambda c: [x for x in _configs(c.launches) if x.startswith(("segment histogram", "row ends B"))]
    assert not full(src) and full(con)
    assert time(con) > time(src)
    monkeypatch.undo()
    monkeypatch.setattr(compiled, "find", _stand_in)
    # the H100 run's two-layer passes are sm_90 cases only, each layer's hooks in them
    assert not cp.validation_cases(card)
    val = cp.validation_cases(cards.H100)
    assert [c.key[2:4] for c in val] == [("source + consumer", "prefill"), ("source + consumer", "decode")]
    for c in val:  # the source's fold; the consumer (1,048,576 wide, 4,097 candidate keys) gathers
        hooks = {l.report.config for l in c.launches if l.report.config.startswith("candidate")}
        assert hooks == {"candidate block max B8"} and "gather" in _configs(c.launches)
    # SGLang's source is FP4: its logits are the e2m1 kernel's, its roofline the MXFP4 rate
    sg = [c for c in cases if c.key[1] == "SGLang"]
    assert sg and all(c.kind == "mxf4" for c in sg)
    assert all(l.report.config.startswith("fp4 H") for c in sg for l in c.launches if l.flops)


def test_indexer_logits_have_fp4_rows(monkeypatch):
    monkeypatch.setattr(plans, "find", _stand_in)
    cases = plans.indexer_cases(cards.GB10)
    fp4 = [c for c in cases if c.key[-1] == "fp4"]
    fp8 = [c for c in cases if c.key[-1] != "fp4"]
    assert len(fp4) == len(fp8) == len(plans.MQA_PREFILL) + len(plans.PAGED_DECODE)
    for a, b in zip(fp8, fp4):
        assert b.name == "FP4 " + a.name and b.kind == "mxf4" and b.flops == a.flops
        assert b.dram_bytes < a.dram_bytes  # 68-byte keys against 132
        assert b.launches[0].report.config.startswith("fp4 H")

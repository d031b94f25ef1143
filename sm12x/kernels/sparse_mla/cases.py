"""The self-test cases of the sparse MLA ops (declared in :mod:`sm12x.kernels.manifest`):
FlashMLA-compatible sparse decode and prefill (production shapes on a GPU, small ones under the
interpreter)."""
from __future__ import annotations

from sm12x.kernels.common.timing import time_us


def _mla_cases(device, full):
    if device != "cuda":
        return [dict(fmt="model1", b=2, s_q=2, h_q=16, topk=64, page=64, extra_topk=64,
                     extra_page=2, extra_topk_length=True),
                dict(fmt="v32", b=1, s_q=1, h_q=16, topk=64, page=64)]
    cases = [dict(fmt="model1", b=64, s_q=2, h_q=64, topk=128, page=256, extra_topk=512,
                  extra_page=64)]
    if full:
        cases += [dict(fmt="model1", b=b, s_q=2, h_q=h, topk=128, page=256, extra_topk=x,
                       extra_page=64) for b in (2, 128, 256) for h, x in ((64, 512), (128, 1024))]
        cases += [dict(fmt="model1", b=74, s_q=2, h_q=64, topk=128, page=256, extra_topk=512,
                       extra_page=2, extra_topk_length=True),
                  dict(fmt="model1", b=1, s_q=1, h_q=16, topk=128, page=256, extra_topk=1024,
                       extra_page=64),
                  dict(fmt="v32", b=64, s_q=2, h_q=128, topk=2048, page=64)]
    return cases


def check_sparse_mla_decode(device, full):
    from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
    from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
    from sm12x.kernels.common.tolerance import failures, flashmla_decode_close

    for spec in _mla_cases(device, full):
        case = make_case(device=device, **spec)
        v = flashmla_decode_close(sparse_mla_decode(**case), ref_sparse_mla_decode(**case))
        us = time_us(lambda: sparse_mla_decode(**case), device)
        b, s_q, h = spec["b"], spec["s_q"], spec["h_q"]
        per_token = 576 if spec["fmt"] == "model1" else 656
        d = 512 if spec["fmt"] == "model1" else 576
        tokens = b * s_q * (spec["topk"] + (spec.get("extra_topk") or 0))
        nbytes = tokens * per_token + 2 * b * s_q * h * (d + 512)  # FlashMLA's accounting
        label = (f"{spec['fmt']} b={b} s_q={s_q} h_q={h} topk={spec['topk']}"
                 + (f"+{spec['extra_topk']}(page {spec['extra_page']})" if spec.get("extra_topk") else ""))
        yield dict(op="sparse_mla_decode", case=label, ok=not failures(v),
                   max_abs=v["out"].max_abs, max_rel=v["out"].max_rel, lse_max_abs=v["lse"].max_abs,
                   detail=failures(v), us=us, throughput=f"{nbytes / us / 1e3:.0f} GB/s")


def check_sparse_mla_prefill(device, full):
    from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill
    from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill
    from sm12x.kernels.common.tolerance import failures, flashmla_prefill_close

    if device != "cuda":
        specs = [(512, 3, 16, 64, 100, True), (576, 2, 8, 64, 100, False)]
    else:  # (d_qk, s_q, h_q, topk, s_kv, topk_length): V4 (512 + 128 window) and V3.2 prefill
        specs = [(512, 1024, 64, 640, 65536, True)]
        if full:
            specs += [(512, 1024, 128, 1152, 65536, True), (576, 1024, 128, 2048, 131072, False)]
    for d_qk, s_q, h_q, topk, s_kv, with_len in specs:
        case = make_prefill_case(d_qk, s_q, h_q, topk, s_kv, with_len, device=device)
        v = flashmla_prefill_close(sparse_mla_prefill(**case), ref_sparse_mla_prefill(**case))
        us = time_us(lambda: sparse_mla_prefill(**case), device)
        flops = 2 * s_q * h_q * topk * (d_qk + 512)  # FlashMLA's count: every listed key
        yield dict(op="sparse_mla_prefill", case=f"bf16 d_qk={d_qk} s_q={s_q} h_q={h_q} "
                   f"topk={topk}", ok=not failures(v), max_abs=v["out"].max_abs,
                   max_rel=v["out"].max_rel, detail=failures(v),
                   us=us, throughput=f"{flops / us / 1e6:.1f} TFLOPS")

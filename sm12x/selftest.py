"""``sm12x selftest``: the patch plan, then every bundled kernel against its PyTorch reference on
this machine.

On a CUDA GPU the cases run at production shapes (``--quick``: one per op, well under a minute;
``--full``: the DeepSeek-V4 decode sweep plus the V3.2 format and larger indexer shapes) and report
max abs/rel error, time per call (CUDA events, median of repeated calls) and GB/s or TFLOPS.
Without a GPU the same kernels run at small shapes under the Triton interpreter, labelled
``interpreter``: correctness only, times mean nothing there. ``--full`` also compiles every
sm_120/sm_121 kernel configuration and checks shared memory and spills. Exit code 1 on any failure.
No network, no model download.
"""
from __future__ import annotations

import json
import os
import sys
import time

OPS = ("sparse_mla_decode", "sparse_mla_prefill", "mqa_logits", "paged_mqa_logits", "indexer_topk",
       "compile")


def _device():
    import torch

    if torch.cuda.is_available():
        return "cuda"
    os.environ["TRITON_INTERPRET"] = "1"  # must be set before kernels are launched
    return "cpu"


def _time_us(fn, device, iters=20):
    """Median µs per call: CUDA events on a GPU; one wall-clock call on the CPU interpreter."""
    import torch

    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


# --- sparse MLA decode ------------------------------------------------------------------------

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
    from sm12x.kernels.reference.sparse_mla import make_case, ref_sparse_mla_decode
    from sm12x.kernels.sparse_mla_decode import sparse_mla_decode
    from sm12x.kernels.tolerance import failures, flashmla_decode_close

    for spec in _mla_cases(device, full):
        case = make_case(device=device, **spec)
        v = flashmla_decode_close(sparse_mla_decode(**case), ref_sparse_mla_decode(**case))
        us = _time_us(lambda: sparse_mla_decode(**case), device)
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
    from sm12x.kernels.reference.sparse_mla import make_prefill_case, ref_sparse_mla_prefill
    from sm12x.kernels.sparse_mla_prefill import sparse_mla_prefill
    from sm12x.kernels.tolerance import failures, flashmla_prefill_close

    if device != "cuda":
        specs = [(512, 3, 16, 64, 100, True), (576, 2, 8, 64, 100, False)]
    else:  # (d_qk, s_q, h_q, topk, s_kv, topk_length): V4 (512 + 128 window) and V3.2 prefill
        specs = [(512, 1024, 64, 640, 65536, True)]
        if full:
            specs += [(512, 1024, 128, 1152, 65536, True), (576, 1024, 128, 2048, 131072, False)]
    for d_qk, s_q, h_q, topk, s_kv, with_len in specs:
        case = make_prefill_case(d_qk, s_q, h_q, topk, s_kv, with_len, device=device)
        v = flashmla_prefill_close(sparse_mla_prefill(**case), ref_sparse_mla_prefill(**case))
        us = _time_us(lambda: sparse_mla_prefill(**case), device)
        flops = 2 * s_q * h_q * topk * (d_qk + 512)  # FlashMLA's count: every listed key
        yield dict(op="sparse_mla_prefill", case=f"bf16 d_qk={d_qk} s_q={s_q} h_q={h_q} "
                   f"topk={topk}", ok=not failures(v), max_abs=v["out"].max_abs,
                   max_rel=v["out"].max_rel, detail=failures(v),
                   us=us, throughput=f"{flops / us / 1e6:.1f} TFLOPS")


# --- indexer ----------------------------------------------------------------------------------

def _mqa_inputs(device, s, s_kv, h, d, seed=0, fp4=False):
    """(q, q_sf, k, k_sf, w, ks, ke): FP8 q (q_sf None) and k with float32 scales, or with ``fp4``
    packed e2m1 q and k with int32 ue8m0 scales."""
    import torch

    from sm12x.kernels.indexer_cache import quant_fp4_per_token, quant_fp8_per_token

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, h, d, generator=g)
    q, q_sf = quant_fp4_per_token(q) if fp4 else (q.to(torch.float8_e4m3fn), None)
    k = torch.randn(s_kv, d, generator=g)
    k, k_sf = quant_fp4_per_token(k) if fp4 else quant_fp8_per_token(k)
    w = torch.randn(s, h, generator=g)
    # causal-like ragged ranges, one of them empty
    ke = torch.linspace(max(1, s_kv // 4), s_kv, s).round().int()
    ks = (ke - torch.randint(1, max(2, s_kv // 2), (s,), generator=g).int()).clamp(min=0)
    ks[0] = ke[0]
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(q), to(q_sf), to(k), to(k_sf), to(w), to(ks), to(ke)


def check_mqa_logits(device, full):
    from sm12x.kernels import deep_gemm_api as api
    from sm12x.kernels.indexer_cache import dequant_fp4
    from sm12x.kernels.reference.indexer import ref_mqa_logits
    from sm12x.kernels.tolerance import deepgemm_diff

    shapes = [(48, 256, 16, 64)] if device != "cuda" else [(2048, 8192, 64, 128)]
    if full and device == "cuda":
        shapes.append((4096, 32768, 64, 128))
    # FP4 runs on a different MMA (block-scaled e2m1 on sm_120): one case of it as well
    cases = [(shape, False) for shape in shapes] + [(shapes[0], True)]
    for (s, s_kv, h, d), fp4 in cases:
        q, q_sf, k, k_sf, w, ks, ke = _mqa_inputs(device, s, s_kv, h, d, fp4=fp4)
        run = lambda: api.fp8_fp4_mqa_logits((q, q_sf), (k, k_sf), w, ks, ke,  # noqa: E731
                                             clean_logits=True)
        out = run()
        if fp4:
            ref = ref_mqa_logits(dequant_fp4(q, q_sf), dequant_fp4(k, k_sf), None, w, ks, ke, clean_logits=True)
        else:
            ref = ref_mqa_logits(q, k, k_sf, w, ks, ke, clean_logits=True)
        same_mask = bool(((out == float("-inf")) == (ref == float("-inf"))).all())
        diff = deepgemm_diff(out, ref)
        err = (out - ref).nan_to_num(0, 0, 0).abs()
        us = _time_us(run, device)
        flops = 2.0 * h * d * float((ke - ks).clamp(min=0).sum())
        yield dict(op="mqa_logits", case=f"{'fp4' if fp4 else 'fp8'} S={s} S_kv={s_kv} H={h} D={d}",
                   ok=same_mask and diff < 1e-3, max_abs=float(err.max()),
                   max_rel=diff, detail="" if same_mask else "-inf mask differs",
                   us=us, throughput=f"{flops / us / 1e6:.1f} TFLOPS")


def _paged_inputs(device, b, next_n, h, d, block_kv, ctx, seed=0, fp4=False):
    """(q, cache, w, context_lens, block_table, max_context_len); with ``fp4`` q is (packed e2m1,
    int32 ue8m0 scales) and the cache the FP4 layout."""
    import torch

    from sm12x.kernels.indexer_cache import quant_fp4_paged_cache, quant_fp4_per_token, quant_fp8_paged_cache

    g = torch.Generator().manual_seed(seed)
    max_blocks = (ctx + block_kv - 1) // block_kv
    nblocks = b * max_blocks + 1
    cache = torch.randn(nblocks, block_kv, d, generator=g)
    cache = quant_fp4_paged_cache(cache) if fp4 else quant_fp8_paged_cache(cache)
    q = torch.randn(b, next_n, h, d, generator=g)
    q = quant_fp4_per_token(q) if fp4 else q.to(torch.float8_e4m3fn)
    w = torch.randn(b * next_n, h, generator=g)
    lens = torch.randint(ctx // 2, ctx + 1, (b,), generator=g).int()
    cl = torch.stack([lens - (next_n - 1 - t) for t in range(next_n)], 1).int().contiguous()
    bt = torch.randperm(nblocks, generator=g)[: b * max_blocks].view(b, max_blocks).int()
    to = lambda t: tuple(x.to(device) for x in t) if isinstance(t, tuple) else t.to(device)  # noqa: E731
    return to(q), to(cache), to(w), to(cl), to(bt), max_blocks * block_kv


def check_paged_mqa_logits(device, full):
    from sm12x.kernels import configs
    from sm12x.kernels import deep_gemm_api as api
    from sm12x.kernels.reference.indexer import ref_paged_mqa_logits
    from sm12x.kernels.tolerance import deepgemm_diff

    shapes = [(3, 2, 16, 64, 64, 200)] if device != "cuda" else [(256, 1, 64, 128, 64, 8192)]
    if full and device == "cuda":
        shapes += [(256, 2, 64, 128, 64, 32768)]
    cases = [(shape, False) for shape in shapes] + [(shapes[0][:1] + (2,) + shapes[0][2:], True)]
    for (b, next_n, h, d, block_kv, ctx), fp4 in cases:
        q, cache, w, cl, bt, max_len = _paged_inputs(device, b, next_n, h, d, block_kv, ctx, fp4=fp4)
        meta = api.get_paged_mqa_logits_metadata(cl, block_kv, configs.sm_count(w.device))
        run = lambda: api.fp8_fp4_paged_mqa_logits(q, cache, w, cl, bt, meta, max_len,  # noqa: E731
                                                   clean_logits=True)
        out = run()
        rows = list(range(0, b * next_n, max(1, (b * next_n) // 8)))  # reference on a sample
        q_cpu = tuple(x.cpu() for x in q) if fp4 else q.cpu()
        ref = ref_paged_mqa_logits(q_cpu, cache.cpu(), w.cpu(), cl.cpu(), bt.cpu(), max_len,
                                   clean_logits=True)[rows]
        got = out[rows].float().cpu()
        same_mask = bool(((got == float("-inf")) == (ref == float("-inf"))).all())
        diff = deepgemm_diff(got, ref)
        us = _time_us(run, device)
        kv_bytes = float(cl[:, -1].sum()) * ((d // 2 if fp4 else d) + 4) + out.numel() * 4
        yield dict(op="paged_mqa_logits",
                   case=f"{'fp4' if fp4 else 'fp8'} B={b} next_n={next_n} H={h} ctx<={ctx}",
                   ok=same_mask and diff < 1e-3,
                   max_abs=float((got - ref).nan_to_num(0, 0, 0).abs().max()), max_rel=diff,
                   detail="" if same_mask else "-inf mask differs", us=us,
                   throughput=f"{kv_bytes / us / 1e3:.0f} GB/s")


def check_indexer_topk(device, full):
    from sm12x.kernels import deep_gemm_api as api
    from sm12x.kernels.indexer_topk import mqa_topk_indices
    from sm12x.kernels.reference.indexer import ref_indexer_topk

    shapes = [(32, 300, 16, 64, 64)] if device != "cuda" else [(4096, 65536, 64, 128, 512)]
    for s, s_kv, h, d, topk in shapes:
        q, _, k, k_sf, w, ks, ke = _mqa_inputs(device, s, s_kv, h, d, seed=1)
        idx = mqa_topk_indices(q, (k, k_sf), w, ks, ke, topk)
        logits = api.fp8_mqa_logits(q, (k, k_sf), w, ks, ke, clean_logits=True)
        ref = ref_indexer_topk(logits, topk, ks, ke)
        mismatched = int((idx != ref).any(dim=1).sum())
        us = _time_us(lambda: mqa_topk_indices(q, (k, k_sf), w, ks, ke, topk), device)
        yield dict(op="indexer_topk", case=f"prefill S={s} S_kv={s_kv} topk={topk}",
                   ok=mismatched == 0, max_abs=float(mismatched), max_rel=0.0,
                   detail=f"{mismatched} rows differ from top-k of the logits" if mismatched else "",
                   us=us, throughput="")


def check_compile(device, full):
    from sm12x.kernels import mqa_logits, paged_mqa_logits, sparse_mla_decode, indexer_topk

    for module in (sparse_mla_decode, mqa_logits, paged_mqa_logits, indexer_topk):
        reports = module.compile_reports()
        bad = [r for r in reports if not r.ok]
        worst = max(reports, key=lambda r: r.shared_bytes)
        yield dict(op="compile", case=f"{module.__name__.rsplit('.', 1)[1]}: {len(reports)} "
                   f"sm_120/sm_121 configs", ok=not bad, max_abs=0.0, max_rel=0.0,
                   detail="; ".join(f"{r.kernel} {r.config} {r.target}: {r.problem}" for r in bad),
                   us=0.0, throughput=f"max smem {worst.shared_bytes} B, "
                   f"max regs {max(r.registers for r in reports)}")


CHECKS = {"sparse_mla_decode": check_sparse_mla_decode,
          "sparse_mla_prefill": check_sparse_mla_prefill, "mqa_logits": check_mqa_logits,
          "paged_mqa_logits": check_paged_mqa_logits, "indexer_topk": check_indexer_topk,
          "compile": check_compile}


def run(ops=None, full=False, json_path=None, stream=sys.stdout) -> int:
    from sm12x import cli

    unknown = sorted(set(ops or ()) - set(OPS))
    if unknown:
        print(f"sm12x selftest: argument '--ops' got {', '.join(unknown)}; supported: "
              f"{', '.join(OPS)}", file=sys.stderr)
        return 2
    device = _device()
    import torch
    import triton

    status = cli.status_data()
    mode = "cuda" if device == "cuda" else "interpreter (CPU, small shapes; times are not meaningful)"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    print(f"sm12x selftest: device {gpu}, mode {mode}, torch {torch.__version__}, "
          f"triton {triton.__version__}", file=stream)
    cli.print_status(status, stream)
    chosen = [o for o in OPS if (ops is None or o in ops) and (o != "compile" or full or ops)]
    tty = stream.isatty()
    results = []
    for i, op in enumerate(chosen):
        if tty:
            stream.write(f"\r[{i + 1}/{len(chosen)}] {op} ...")
            stream.flush()
        try:
            for r in CHECKS[op](device, full):
                results.append(r)
                if tty:
                    stream.write("\r" + " " * 60 + "\r")
                print(_line(r), file=stream)
        except Exception as e:  # a crashing kernel is a failure, reported like one
            results.append(dict(op=op, case="(setup)", ok=False, max_abs=float("nan"),
                                max_rel=float("nan"), detail=f"{type(e).__name__}: {e}", us=0.0,
                                throughput=""))
            print(_line(results[-1]), file=stream)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed", file=stream)
    if json_path:
        doc = dict(device=gpu, mode="cuda" if device == "cuda" else "interpreter",
                   torch=torch.__version__, triton=triton.__version__, full=full,
                   status=status, results=results, passed=len(results) - failed, failed=failed)
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2)
    return 1 if failed or not results else 0


def _line(r) -> str:
    verdict = "PASS" if r["ok"] else "FAIL"
    if r["op"] == "compile" or os.environ.get("TRITON_INTERPRET") != "1":
        timing = f"{r['us']:9.1f} us  {r['throughput']}" if r["us"] else r["throughput"]
    else:
        timing = "(interpreter: untimed)"
    text = f"{verdict} {r['op']:18} {r['case']:58} max_abs {r['max_abs']:.3g}  {timing}"
    return text + (f"  [{r['detail']}]" if r["detail"] else "")


def add_selftest_command(subparsers):
    p = subparsers.add_parser("selftest", help="every kernel against its reference on this machine")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="one production case per op (default)")
    g.add_argument("--full", action="store_true", help="the production sweep + compile check")
    p.add_argument("--ops", help="comma-separated subset of: " + ", ".join(OPS))
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write results as JSON")
    p.set_defaults(func=lambda a: run(
        ops=[o.strip() for o in a.ops.split(",")] if a.ops else None, full=a.full,
        json_path=a.json_path))

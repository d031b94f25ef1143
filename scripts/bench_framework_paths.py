#!/usr/bin/env python
"""Time the frameworks' own SM12x paths that sm12x replaces against sm12x, on this GPU.

For each path importable here (SGLang's SM120 sparse MLA decode entry and its Triton / torch
backends, SGLang's paged indexer-logits fallbacks, DeepGEMM's paged logits), it builds
DeepSeek-V4-shaped inputs, runs the framework's function and sm12x's replacement of it (the
patch's own factory applied to that function, as the mount installs it) on the same inputs,
checks both against sm12x's PyTorch reference and times both: µs per call, L2 flushed before
every call, replayed from a CUDA graph where the function can be captured (else launched
eagerly, and the table says so). A framework function that raises (on SM12x most stock paths
raise "Unsupported architecture") is listed with its error. Paths that are not installed are
listed as such. Run it in the container you serve from, on that GPU:

  python3 /sm12x/scripts/bench_framework_paths.py [--quick] [--only SUBSTRING]

Prints a markdown table. Needs a CUDA GPU. The sm12x patches need not be active: the
framework's function is read from under an installed patch (``__sm12x_original__``) if there
is one.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

# (label, "module:attr", kind, patch whose factory makes ours). SGLang's SM120 decode entry picks a
# backend at import (SGLANG_SM120_FLASHMLA_BACKEND: flashinfer by default); its Triton and torch
# backends are listed too, as what the other settings run, each against the same replacement.
_SGL_SM120 = "sglang.kernels.ops.attention.flash_mla_sm120"
PATHS = (
    ("SGLang SM120 decode entry", f"{_SGL_SM120}:flash_mla_with_kvcache_sm120", "decode_entry",
     "sglang.flash_mla_sm120"),
    ("SGLang SM120 decode, Triton backend",
     "sglang.kernels.ops.attention.flash_mla_sm120_triton:flash_mla_sparse_decode_triton",
     "decode_positional", "sglang.flash_mla_sm120"),
    ("SGLang SM120 decode, torch backend", f"{_SGL_SM120}:_sm120_sparse_decode_fwd", "decode_positional",
     "sglang.flash_mla_sm120"),
    ("SGLang SM120 decode entry (older module path)",
     "sglang.srt.layers.attention.flash_mla_sm120:flash_mla_with_kvcache_sm120", "decode_entry",
     "sglang.flash_mla_sm120.era_b"),
    ("SGLang paged logits, SM120 torch", "sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch_sm120",
     "logits_sglang", "sglang.dsv4.indexer.paged_logits_torch_sm120"),
    ("SGLang paged logits, torch", "sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch",
     "logits_sglang", "sglang.dsv4.indexer.paged_logits_torch"),
    ("SGLang paged logits, TileLang",
     "sglang.kernels.ops.attention.dsa.tilelang_kernel:tilelang_fp8_paged_mqa_logits", "logits_sglang",
     "sglang.dsa.tilelang_paged_logits"),
    ("DeepGEMM fp8_paged_mqa_logits", "deep_gemm:fp8_paged_mqa_logits", "logits_deepgemm",
     "deep_gemm.fp8_paged_mqa_logits"),
    ("DeepGEMM fp8_fp4_paged_mqa_logits", "deep_gemm:fp8_fp4_paged_mqa_logits", "logits_deepgemm_fp4api",
     "deep_gemm.fp8_fp4_paged_mqa_logits"),
    ("vLLM's DeepGEMM fp8_fp4_paged_mqa_logits", "vllm.third_party.deep_gemm:fp8_fp4_paged_mqa_logits",
     "logits_deepgemm_fp4api", "vllm.third_party.deep_gemm.fp8_fp4_paged_mqa_logits"),
)


def resolve(target: str):
    """The framework's function at ``module:attr`` (under our patch, if one is installed), or the
    reason it is not there."""
    module, attr = target.split(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as e:  # noqa: BLE001 - any import failure means "not available here"
        return None, f"not importable ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    while hasattr(fn, "__sm12x_original__"):
        fn = fn.__sm12x_original__
    return fn, ""


def replacement(patch_name: str, original):
    """sm12x's replacement of ``original``: the named patch's factory applied to it."""
    from sm12x.apply import _load_factory
    from sm12x.patches import all_patches

    patch = next(p for p in all_patches() if p.name == patch_name)
    return _load_factory(patch.make)(original)


def time_call(fn, flush: bool, iters: int):
    """(median µs per call, "graph" or "eager")."""
    import torch
    from gpu_timing import graphed, median_us

    fn()  # compile, autotune
    torch.cuda.synchronize()
    try:
        run, how = graphed(fn), "graph"
    except Exception:  # noqa: BLE001 - host syncs or allocations that capture refuses
        torch.cuda.synchronize()
        run, how = fn, "eager"
    return median_us(run, iters, flush), how


# ---------------------------------------------------------------- sparse MLA decode (DeepSeek-V4)

def decode_cases(quick: bool):
    """SGLang's decode layout: one query token per row (batch x next_n rows, s_q 1), 64 heads
    (SGLang pads the heads to 64 on SM120), top-128 in 256-token SWA pages + the C4 layer's
    top-512 in 64-token pages or the C128 layer's top-1024 in 2-token pages with lengths."""
    rows = (2, 64) if quick else (2, 64, 128, 256)
    for t in rows:
        yield f"T={t} h64 128+512p64", dict(b=t, s_q=1, h_q=64, extra_topk=512, extra_page=64)
    if not quick:
        for t in (64, 256):
            yield f"T={t} h64 128+1024p2 len", dict(b=t, s_q=1, h_q=64, extra_topk=1024, extra_page=2,
                                                     extra_topk_length=True)


def decode_calls(kind, original, ours, case):
    """(framework call, sm12x call) on ``case`` (``make_case``'s keyword arguments)."""
    kw = dict(q=case["q"], k_cache=case["k_cache"], head_dim_v=512, softmax_scale=case["softmax_scale"],
              indices=case["indices"], topk_length=case["topk_length"], attn_sink=case.get("attn_sink"),
              extra_k_cache=case.get("extra_k_cache"), extra_indices_in_kvcache=case.get("extra_indices"),
              extra_topk_length=case.get("extra_topk_length"))
    mine = lambda: ours(**kw)  # noqa: E731
    if kind == "decode_entry":
        return (lambda: original(**kw)), mine
    args = (kw["q"], kw["k_cache"], kw["indices"], kw["topk_length"], kw["attn_sink"], 512, kw["softmax_scale"],
            kw["extra_k_cache"], kw["extra_indices_in_kvcache"], kw["extra_topk_length"])
    return (lambda: original(*args)), mine


def decode_check(result, ref, full: bool) -> str:
    """'ok' or what is off. ``full``: out and lse (FlashMLA's contract); else out only (SGLang's
    SM120 functions fold the sink into the lse they return, and their callers read out only)."""
    from sm12x.kernels.common.tolerance import failures, flashmla_close, flashmla_decode_close, FLASHMLA_OUT

    out = result[0] if isinstance(result, (tuple, list)) else result
    if full:
        bad = failures(flashmla_decode_close(result, ref))
    else:
        v = flashmla_close(out.reshape(ref[0].shape).float(), ref[0].float(), **FLASHMLA_OUT)
        bad = "" if v.ok else f"out: {v.detail}"
    return "ok" if not bad else bad


# ---------------------------------------------------------------- paged indexer logits

def logits_cases(quick: bool):
    """Decode batches of DeepSeek-V4's indexer (64 heads, D 128, 64-token blocks), next_n 1 (what
    SGLang's torch fallbacks take), request lengths 0.7-1.3 x the average."""
    shapes = ((64, 8192), (256, 8192)) if quick else ((64, 8192), (256, 8192), (64, 32768), (256, 32768))
    for b, ctx in shapes:
        yield f"B={b} ctx~{ctx} next_n=1", (b, ctx)


def make_logits_case(b: int, ctx_avg: int, seed: int = 0, device="cuda"):
    """Random fp8 indexer inputs: q, a paged cache (``indexer_cache``'s fp8 format), weights,
    2-D context lengths, a shuffled block table."""
    import torch
    from sm12x.kernels.indexer.cache import quant_fp8_paged_cache

    gen = torch.Generator(device=device).manual_seed(seed)
    ctx = torch.randint(int(0.7 * ctx_avg), int(1.3 * ctx_avg), (b,), generator=gen, device=device,
                        dtype=torch.int32)
    max_blocks = (int(ctx.max()) + 63) // 64
    keys = torch.randn(b * max_blocks, 64, 128, generator=gen, device=device)
    cache = quant_fp8_paged_cache(keys)
    block_table = torch.randperm(b * max_blocks, generator=gen, device=device).to(torch.int32).view(b, max_blocks)
    q = torch.randn(b, 1, 64, 128, generator=gen, device=device).to(torch.float8_e4m3fn)
    weights = torch.randn(b, 64, generator=gen, device=device)
    return dict(q=q, cache=cache, weights=weights, context_lens=ctx.view(b, 1).contiguous(),
                block_table=block_table, max_context_len=max_blocks * 64)


def logits_calls(kind, original, ours, c, original_meta, our_meta):
    """(framework call, sm12x call); DeepGEMM's need scheduler metadata from their own
    ``get_paged_mqa_logits_metadata``: ``original_meta`` / ``our_meta`` make it."""
    args = (c["q"], c["cache"], c["weights"], c["context_lens"], c["block_table"])
    if kind == "logits_sglang":  # SGLang's own decode passes 1-D lengths (its torch path asserts them)
        args = args[:3] + (c["context_lens"].view(-1),) + args[4:]
        tail = (None, c["max_context_len"], False)
        return (lambda: original(*args, *tail)), (lambda: ours(*args, *tail))
    q = (c["q"], None) if kind == "logits_deepgemm_fp4api" else c["q"]
    args = (q,) + args[1:]
    m0, m1 = original_meta(c["context_lens"]), our_meta(c["context_lens"])
    return (lambda: original(*args, m0, c["max_context_len"])), (lambda: ours(*args, m1, c["max_context_len"]))


def logits_check(result, ref) -> str:
    """'ok' when DeepGEMM's calc_diff over the visible positions is below its tests' 1e-3."""
    from sm12x.kernels.common.tolerance import deepgemm_diff

    visible = ref.isfinite()
    diff = deepgemm_diff(result.float()[:, :ref.shape[1]].masked_fill(~visible, float("-inf")), ref)
    return "ok" if diff < 1e-3 else f"calc_diff {diff:.2g}"


def metadata_makers(target: str):
    """(framework's, sm12x's) context_lens -> scheduler metadata, for a DeepGEMM target."""
    from sm12x.frontends.deep_gemm import indexer as api

    fn, _ = resolve(target.split(":")[0] + ":get_paged_mqa_logits_metadata")
    sms = api.get_num_sms()
    theirs = (lambda cl: fn(cl, 64, sms)) if fn else (lambda cl: None)
    return theirs, (lambda cl: api.get_paged_mqa_logits_metadata(cl, 64, sms))


# ---------------------------------------------------------------- driver

def run_path(label, target, kind, patch_name, quick, flush, iters):
    """Table rows for one path."""
    import torch

    original, why = resolve(target)
    if original is None:
        return [(label, "-", why, "", "")]
    ours = replacement(patch_name, original)
    rows = []
    if kind.startswith("decode"):
        from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode

        for name, spec in decode_cases(quick):
            case = make_case(device="cuda", **spec)
            ref = ref_sparse_mla_decode(**case)
            theirs, mine = decode_calls(kind, original, ours, case)
            rows.append(measure(label, name, theirs, mine, lambda r: decode_check(r, ref, False),
                                lambda r: decode_check(r, ref, True), flush, iters))
            del case, ref
            torch.cuda.empty_cache()
    else:
        from sm12x.kernels.indexer.reference import ref_paged_mqa_logits

        metas = metadata_makers(target) if kind.startswith("logits_deepgemm") else (None, None)
        for name, (b, ctx) in logits_cases(quick):
            c = make_logits_case(b, ctx)
            ref = ref_paged_mqa_logits(c["q"], c["cache"], c["weights"], c["context_lens"], c["block_table"],
                                       c["max_context_len"])
            theirs, mine = logits_calls(kind, original, ours, c, *metas)
            check = lambda r: logits_check(r, ref)  # noqa: E731
            rows.append(measure(label, name, theirs, mine, check, check, flush, iters))
            del c, ref
            torch.cuda.empty_cache()
    return rows


def measure(label, name, theirs, mine, check_theirs, check_mine, flush, iters):
    """One row: (path, case, framework µs and check, sm12x µs and check, speed-up)."""
    try:
        their_check = check_theirs(theirs())
        their_us, their_how = time_call(theirs, flush, iters)
        their_cell = f"{their_us:.1f} ({their_how}); {their_check}"
    except Exception as e:  # noqa: BLE001 - report what the framework's path does on this GPU
        their_us, their_cell = None, f"raises {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}"
    my_check = check_mine(mine())
    my_us, my_how = time_call(mine, flush, iters)
    ratio = f"{their_us / my_us:.2f}x" if their_us else "-"
    return (label, name, their_cell, f"{my_us:.1f} ({my_how}); {my_check}", ratio)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer cases and iterations")
    ap.add_argument("--only", help="paths whose label contains this text")
    ap.add_argument("--warm-l2", action="store_true", help="do not flush L2 between calls")
    args = ap.parse_args()

    import torch
    import triton

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_framework_paths: needs a CUDA GPU (torch.cuda.is_available() is False or "
              "TRITON_INTERPRET is set); nothing was measured.", file=sys.stderr)
        return 2
    iters = 10 if args.quick else 30
    print("# The frameworks' own SM12x paths against sm12x\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"- GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}, triton {triton.__version__}")
    print(f"- µs per call, median of {iters}, L2 {'warm' if args.warm_l2 else 'flushed before every call'}; "
          "'graph': replayed from a CUDA graph, 'eager': launched from Python (the function could not "
          "be captured). Checks against sm12x's PyTorch reference: decode output to FlashMLA's tolerance "
          "(sm12x also its lse), logits by DeepGEMM's calc_diff < 1e-3.\n")
    print("| path | case | framework µs; check | sm12x µs; check | framework / sm12x |")
    print("|---|---|---|---|---:|")
    for label, target, kind, patch_name in PATHS:
        if args.only and args.only.lower() not in label.lower():
            continue
        for row in run_path(label, target, kind, patch_name, args.quick, not args.warm_l2, iters):
            print("| " + " | ".join(row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe: how the radix select builds its digit histograms (H200, SM12X_FORCE=1).

Variants of ``topk_select`` (its source with text edits, loaded beside it):
- ``before`` (with ``--before FILE``): an earlier version of the module, e.g. ``git show
  HEAD:sm12x/kernels/topk_select.py`` saved to a file.
- ``as is``: 8-bit digits; excluded entries go to bin 0 and are taken out again with a sum
  over the block every loop step.
- ``mask``: the same with ``tl.histogram(..., mask=sel)`` (no per-step sum).
- ``mask r4``: 4-bit digits (8 passes, 16 bins) with the mask.
- ``cmp r4``: 4-bit digits counted by compares into a [16, BLOCK] register tile, summed once
  after the loop (no tl.histogram).
- ``prefetch``: the histogram loops load the next block before they work on this one.
- ``seg 4096``: wide rows cut into segments of 4,096 columns (also rows above 4,096 columns
  take the segmented path).

Part 1 times ``row_topk_keys`` alone on logits-like rows (CUDA-graph replay, L2 warm); part 2
the fused paged top-k (``paged_mqa_topk_indices`` with the variant's ``row_topk_keys``); part 3
the prefill fused top-k (``do_bench``). Every variant's result must equal the module's.

    python scripts/probes/radix_hist_probe.py [--parts 1,2,3] [--variants "as is,mask"] [--before FILE]
"""
import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton

from source_variant import edited_module
from sm12x.kernels.indexer import fused_topk as indexer_topk, topk_filter, topk_select

HIST = "hist += tl.histogram(tl.where(sel, digit, 0), NBINS)"
SUBTRACT = "hist -= tl.where(bins == 0, tl.sum(tl.where(sel, 0, 1)), 0)"
MASKED = [(HIST, "hist += tl.histogram(digit, NBINS, mask=sel)"), (SUBTRACT, "hist = hist")]
R4 = [("RADIX_BITS = 8", "RADIX_BITS = 4")]
CMP = [("hist = tl.zeros((NBINS,), dtype=tl.int32)",
        "hist = tl.zeros((NBINS,), dtype=tl.int32); acc = tl.zeros((NBINS, BLOCK), dtype=tl.int32)"),
       (HIST, "acc += ((digit[None, :] == bins[:, None]) & sel[None, :]).to(tl.int32)"),
       (SUBTRACT, "hist = hist"),
       ("        hist = _add_unread(hist, unread, prefix, pmask, shift, NBINS)",
        "        hist += tl.sum(acc, 1)\n        hist = _add_unread(hist, unread, prefix, pmask, shift, NBINS)"),
       ("    tl.atomic_add(hist_ptr + (P * R + r).to(tl.int64) * NBINS + bins, hist)",
        "    hist += tl.sum(acc, 1)\n    tl.atomic_add(hist_ptr + (P * R + r).to(tl.int64) * NBINS + bins, hist)")]
# the next block's load issued before this block's histogram (Triton does not pipeline them)
LOAD_BLOCK = """
@triton.jit
def _load_block(row, c0, lo, hi, BLOCK: tl.constexpr):
    c = c0 + tl.arange(0, BLOCK)
    return tl.load(row + c, mask=(c >= lo) & (c < hi), other=float("-inf"))


@triton.jit
def _outside("""
ROW_LOOP = """        hist = tl.zeros((NBINS,), dtype=tl.int32)
        for c0 in range(_aligned(lo, BLOCK), hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            read = (c >= lo) & (c < hi)
            u = _ordered_u32(tl.load(row + c, mask=read, other=float("-inf")))"""
ROW_PREFETCH = """        hist = tl.zeros((NBINS,), dtype=tl.int32)
        v_next = _load_block(row, _aligned(lo, BLOCK), lo, hi, BLOCK)
        for c0 in range(_aligned(lo, BLOCK), hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            read = (c >= lo) & (c < hi)
            v = v_next
            v_next = _load_block(row, c0 + BLOCK, lo, hi, BLOCK)
            u = _ordered_u32(v)"""
SEGMENT_LOOP = """    end = tl.minimum(hi, (g + 1) * SEGMENT)
    for c0 in range(tl.maximum(_aligned(lo, BLOCK), g * SEGMENT), end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < end)
        u = _ordered_u32(tl.load(row + c, mask=read, other=float("-inf")))
        sel"""
SEGMENT_PREFETCH = """    end = tl.minimum(hi, (g + 1) * SEGMENT)
    start = tl.maximum(_aligned(lo, BLOCK), g * SEGMENT)
    v_next = _load_block(row, start, lo, end, BLOCK)
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < end)
        v = v_next
        v_next = _load_block(row, c0 + BLOCK, lo, end, BLOCK)
        u = _ordered_u32(v)
        sel"""
PREFETCH = [("\n@triton.jit\ndef _outside(", LOAD_BLOCK), (ROW_LOOP, ROW_PREFETCH),
            (SEGMENT_LOOP, SEGMENT_PREFETCH)]
EDITS = {"as is": None, "prefetch": PREFETCH, "mask": MASKED, "mask r4": MASKED + R4, "cmp r4": CMP + R4,
         "seg 4096": [("SEGMENT = 16384", "SEGMENT = 4096")]}

# part 1: (rows, width, k)
SELECT_CASES = [(32, 262144, 512), (256, 262144, 512), (1, 262144, 512), (4096, 16384, 512),
                (4096, 16384, 2048), (256, 8192, 2048)]
# part 2: [B, context, next_n, topk, max_context_len or None]
PAGED_CASES = [(1, 262144, 1, 512, 262144), (32, 262144, 1, 512, 262144), (64, 32768, 2, 512, None),
               (256, 8192, 1, 2048, None), (256, 8192, 1, 512, 262144)]


def variants(names, tmp, before=None):
    src = open(topk_select.__file__).read()
    out = {}
    if before:
        out["before"] = edited_module(open(before).read(), [], "topk_select_before", tmp)
    for name in names:
        edits = EDITS[name]
        out[name] = topk_select if edits is None else edited_module(
            src, edits, "topk_select_" + name.replace(" ", "_"), tmp)
    return out


def part1(mods):
    from gpu_timing import time_us

    print("\n| row_topk_keys: rows x width, k | " + " | ".join(f"{n} µs" for n in mods) + " |")
    print("|---|" + "---:|" * len(mods))
    bad = []
    for rows, width, k in SELECT_CASES:
        torch.manual_seed(0)
        x = torch.randn(rows, width, device="cuda").relu_() * torch.rand(rows, 1, device="cuda")
        ref = None
        row = []
        for name, mod in mods.items():
            got = mod.row_topk_keys(x, k).sort(dim=1).values
            if ref is None:
                ref = got
            elif not torch.equal(got, ref):
                bad.append(f"select {rows}x{width} k={k}: {name} differs")
            row.append(f"{time_us(lambda: mod.row_topk_keys(x, k)):.0f}")
        print(f"| {rows} x {width}, k={k} | " + " | ".join(row) + " |", flush=True)
        del x
        torch.cuda.empty_cache()
    return bad


def fused_row(mods, label, call, timer, bad):
    """Print one table row: ``call`` (a fused op) timed with each variant's ``row_topk_keys``; every
    variant's result must equal the first one's (else a line in ``bad``)."""
    ref, row = None, []
    try:
        for name, mod in mods.items():
            indexer_topk.row_topk_keys = mod.row_topk_keys
            got = call()
            if ref is None:
                ref = got
            elif not torch.equal(got, ref):
                bad.append(f"{label}: {name} differs")
            row.append(timer(call))
    finally:
        indexer_topk.row_topk_keys = topk_select.row_topk_keys
    print(f"| {label} | " + " | ".join(row) + " |", flush=True)


def part2(mods):
    from bench_indexer import paged_topk_case
    from gpu_timing import time_us

    print("\n| fused paged top-k | " + " | ".join(f"{n} µs" for n in mods) + " |")
    print("|---|" + "---:|" * len(mods))
    bad = []
    for b, ctx, next_n, topk, model_len in PAGED_CASES:
        cache, bt, cl, q, w, mcl = paged_topk_case(b, ctx, next_n, model_len)
        label = f"B={b} ctx~{ctx} next_n={next_n} topk={topk} window={mcl}"
        call = lambda: indexer_topk.paged_mqa_topk_indices(q, cache, w, cl, bt, mcl, topk)  # noqa: E731
        fused_row(mods, label, call, lambda fn: f"{time_us(fn):.0f}", bad)
        del cache, bt, q, w
        torch.cuda.empty_cache()
    return bad


def part3(mods):
    from bench_indexer import H, bench, causal_ranges, chunk_ranges, make_keys, make_q

    cases = [("S=4096 S_kv=262144 topk=512", 4096, 262144, 512, causal_ranges),
             ("S=4096 S_kv=262144 topk=2048", 4096, 262144, 2048, causal_ranges),
             ("chunk 16 x 512 after 0-29,000, topk=2048", 8192, None, 2048,
              lambda s, s_kv: chunk_ranges([512] * 16, [i * 1933 for i in range(16)]))]
    print("\n| fused prefill top-k | " + " | ".join(f"{n} ms" for n in mods) + " |")
    print("|---|" + "---:|" * len(mods))
    bad = []
    for label, s, s_kv, topk, ranges in cases:
        ks, ke = ranges(s, s_kv)
        s_kv = s_kv or int(ke.max())
        q, _ = make_q((s, H), False)
        kv = make_keys(s_kv, False)
        w = torch.randn(s, H, device="cuda")
        call = lambda: indexer_topk.mqa_topk_indices(q, kv, w, ks, ke, topk)  # noqa: E731
        fused_row(mods, label, call, lambda fn: f"{bench(fn, reps=3):.2f}", bad)
        del q, kv, w
        torch.cuda.empty_cache()
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="1,2,3")
    ap.add_argument("--variants", default=",".join(EDITS))
    ap.add_argument("--before", default=None, help="an earlier topk_select.py to time beside")
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    # the radix select itself, as measured before topk_filter existed (the filter would send the
    # first windows of many rows to the committed module's select over candidates)
    topk_filter.capacity = lambda rows, width, k: 0
    with tempfile.TemporaryDirectory() as tmp:
        mods = variants(args.variants.split(","), tmp, args.before)
        bad = []
        for part in args.parts.split(","):
            bad += {"1": part1, "2": part2, "3": part3}[part](mods)
    print("\nevery variant gave the same results" if not bad else "\n".join(bad))


if __name__ == "__main__":
    main()

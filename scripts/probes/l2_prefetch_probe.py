"""Probe: the sparse MLA decode with the next tile's cache rows requested into L2 (H200,
SM12X_FORCE=1). The kernel does not do this; the probe edits the module's source, loads each
variant as a separate module and times it against the module as it is:

- PREFETCH 3: PREFETCH 1 (the next tile's indices loaded a step ahead), and once this tile's rows
  have arrived (after its dequantisation) the next tile's MODEL1 rows are requested into L2 with
  ``cp.async.bulk.prefetch.L2`` (four 144-byte pieces per row, one per thread) and their scale
  bytes with ``prefetch.global.L2``. A hint: no registers wait for it.
- PREFETCH 4: the same with one 576-byte request per row (the index vector's own layout).

Variants: "as is"; "H64 L2" (BLOCK_H 64 with PREFETCH 3; on sm_120 instead of PREFETCH 2);
"all L2" (every head block with PREFETCH 3); "H64 L2 1-D" (BLOCK_H 64 with PREFETCH 4); sm_120
only: "H64 PF1" (BLOCK_H 64 with PREFETCH 1, the L2 variants' base there).

Prints the span of each variant per case (profiler trace of CUDA-graph replays, L2 flushed, best
of two) and whether each variant matches the reference within FlashMLA's tolerances. Run once
as is (sm_90 configs) and once with SM12X_KERNEL_CONFIGS=sm_120.

    python scripts/probes/l2_prefetch_probe.py [--variants "as is,H64 L2"]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

from decode_variants import compare, config_key

HELPER = '''@triton.jit
def _prefetch_rows_l2(cache_ptr, stride0, ntok, idx, PAGE: tl.constexpr, PIECES: tl.constexpr):
    safe = tl.where((idx >= 0) & (idx < ntok), idx, 0)
    page_base = (safe // PAGE).to(tl.int64) * stride0
    off = (safe % PAGE).to(tl.int64)
    row = cache_ptr + (page_base + off * 576)
    if PIECES:
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 144;\\n\\tmov.u32 $0, 0;", "=r,l",
                                  [row[:, None] + (tl.arange(0, 4) * 144)[None, :]], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], 576;\\n\\tmov.u32 $0, 0;", "=r,l",
                                  [row], dtype=tl.int32, is_pure=False, pack=1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\\n\\tmov.u32 $0, 0;", "=r,l",
                              [cache_ptr + (page_base + PAGE * 576 + off * 8)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _dequant_tile('''
KERNEL = [("@triton.jit\ndef _dequant_tile(", HELPER),
          ("            if PREFETCH == 1:\n", "            if PREFETCH == 1 or PREFETCH >= 3:\n"),
          ("            k = _dequant_tile(raw, scale, k_rope, IS_MODEL1, KV_BF16, BLOCK_N)\n",
           "            k = _dequant_tile(raw, scale, k_rope, IS_MODEL1, KV_BF16, BLOCK_N)\n"
           "            if PREFETCH >= 3:\n"
           "                _prefetch_rows_l2(cache_ptr, stride0, ntok, idx, PAGE, PREFETCH == 3)\n")]
MODEL1 = {"sm_90": '"model1": (_H16_N64, _H32_N64_PF2, _H64_N64)',
          "sm_120": '"model1": (_H16, _H32_PF2, _H64_PF2)'}
SWAPS = {
    "sm_90": {"H64 L2": '"model1": (_H16_N64, _H32_N64_PF2, {**_H64_N64, "PREFETCH": 3})',
              "all L2": '"model1": ({**_H16_N64, "PREFETCH": 3}, {**_H32_N64, "PREFETCH": 3}, '
                        '{**_H64_N64, "PREFETCH": 3})',
              "H64 L2 1-D": '"model1": (_H16_N64, _H32_N64_PF2, {**_H64_N64, "PREFETCH": 4})'},
    "sm_120": {"H64 PF1": '"model1": (_H16, _H32_PF2, _H64)',
               "H64 L2": '"model1": (_H16, _H32_PF2, {**_H64, "PREFETCH": 3})',
               "all L2": '"model1": ({**_H16, "PREFETCH": 3}, {**_H32, "PREFETCH": 3}, {**_H64, "PREFETCH": 3})',
               "H64 L2 1-D": '"model1": (_H16, _H32_PF2, {**_H64, "PREFETCH": 4})'},
}

CASES = [("b2 h64 128+512p64", dict(b=2, h_q=64, extra_topk=512, extra_page=64)),
         ("b64 h64 128+512p64", dict(b=64, h_q=64, extra_topk=512, extra_page=64)),
         ("b256 h64 128+512p64", dict(b=256, h_q=64, extra_topk=512, extra_page=64)),
         ("b64 h128 128+1024p64", dict(b=64, h_q=128, extra_topk=1024, extra_page=64)),
         ("b74 h64 128+512p64", dict(b=74, h_q=64, extra_topk=512, extra_page=64)),
         ("b74 h64 128+1024p2 len", dict(b=74, h_q=64, extra_topk=1024, extra_page=2,
                                         extra_topk_length=True)),
         ("b1 h64 128+512p64", dict(b=1, h_q=64, extra_topk=512, extra_page=64)),
         ("b1 s1 h16 128+1024p2", dict(b=1, s_q=1, h_q=16, extra_topk=1024, extra_page=2)),
         ("b64 h32 128+512p64", dict(b=64, h_q=32, extra_topk=512, extra_page=64))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="", help="comma-separated subset of the variant names")
    args = ap.parse_args()
    key = config_key()
    chosen = {"as is": [], **{n: KERNEL + [(MODEL1[key], new)] for n, new in SWAPS[key].items()}}
    if args.variants:
        chosen = {n: chosen[n] for n in args.variants.split(",")}
    compare(chosen, CASES)


if __name__ == "__main__":
    main()

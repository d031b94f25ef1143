"""Probe: register-pressure changes to the sparse MLA decode's split kernel (H200,
SM12X_FORCE=1), each the module's source with edits, loaded as a separate module:

- "rope [N,1,64]": the MODEL1 RoPE slot loaded as [BLOCK_N, 1, 64] and broadcast into k by the
  select, instead of a [BLOCK_N, 8, 64] load masked to chunk 7 (fewer sm_90 spills in local
  compiles, sixteenth session);
- PREFETCH 2 (the next tile's rows held in registers) against PREFETCH 1 at BLOCK_H 64 and 32,
  and BLOCK_H 16 with 16-token tiles and PREFETCH 2 on sm_120. The first runs (seventeenth
  session) had PREFETCH 1 as the module's default at BLOCK_H 32 and on sm_120 at 64; the module
  then took PREFETCH 2 there, and the variants now flip each one back.

Prints the span of each variant per case (profiler trace of CUDA-graph replays, L2 flushed, best
of two) and whether each variant matches the reference within FlashMLA's tolerances. Run once
as is (sm_90 configs) and once with SM12X_KERNEL_CONFIGS=sm_120.

    python scripts/probes/rope_load_probe.py [--variants "as is,rope [N,1,64]"]
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

from decode_variants import compare, config_key

ROPE = [("rope = tl.load(rope_row[:, None, None] + d[None, None, :] + (c * 0)[None, :, None],\n"
         "                       mask=v3 & (c == 7)[None, :, None], other=0.0)",
         "rope = tl.load(rope_row[:, None, None] + d[None, None, :], mask=v3, other=0.0)")]
# The model1 config tuples (the module adopted PREFETCH 2 at BLOCK_H 32 on both config sets and
# at BLOCK_H 64 on sm_120 after this probe's first runs): each PREFETCH variant swaps one entry.
MODEL1 = {"sm_90": '"model1": (_H16_N64, _H32_N64_PF2, _H64_N64)',
          "sm_120": '"model1": (_H16, _H32_PF2, _H64_PF2)'}
H64_SWAP = {"sm_90": '"model1": (_H16_N64, _H32_N64_PF2, {**_H64_N64, "PREFETCH": 2})',
            "sm_120": '"model1": (_H16, _H32_PF2, _H64)'}
H32_SWAP = {"sm_90": '"model1": (_H16_N64, _H32_N64, _H64_N64)',
            "sm_120": '"model1": (_H16, _H32, _H64_PF2)'}
H16_SWAP = {"sm_120": '"model1": ({**_H16, "BLOCK_N": 16, "PREFETCH": 2}, _H32_PF2, _H64_PF2)'}

CASES = [("b2 h64 128+512p64", dict(b=2, h_q=64, extra_topk=512, extra_page=64)),
         ("b64 h64 128+512p64", dict(b=64, h_q=64, extra_topk=512, extra_page=64)),
         ("b256 h64 128+512p64", dict(b=256, h_q=64, extra_topk=512, extra_page=64)),
         ("b64 h128 128+1024p64", dict(b=64, h_q=128, extra_topk=1024, extra_page=64)),
         ("b74 h64 128+1024p2 len", dict(b=74, h_q=64, extra_topk=1024, extra_page=2,
                                         extra_topk_length=True)),
         ("b1 h64 128+512p64", dict(b=1, h_q=64, extra_topk=512, extra_page=64)),
         ("b1 s1 h16 128+1024p2", dict(b=1, s_q=1, h_q=16, extra_topk=1024, extra_page=2)),
         ("b64 h32 128+512p64", dict(b=64, h_q=32, extra_topk=512, extra_page=64)),
         ("b256 h32 128+512p64", dict(b=256, h_q=32, extra_topk=512, extra_page=64))]


def variants(key):
    """Variant name -> source edits, for config set ``key``. The PREFETCH variants flip the
    depth of one head block's config (sm_90 BLOCK_H 64: PREFETCH 2; BLOCK_H 32: PREFETCH 1; sm_120
    BLOCK_H 64 and 32: PREFETCH 1; sm_120 BLOCK_H 16: 16-token tiles with PREFETCH 2)."""
    out = {"as is": [], "rope [N,1,64]": ROPE,
           f"H64 PF{1 if key == 'sm_120' else 2}": [(MODEL1[key], H64_SWAP[key])],
           "H32 PF1": [(MODEL1[key], H32_SWAP[key])]}
    if key in H16_SWAP:
        out["H16 N16 PF2"] = [(MODEL1[key], H16_SWAP[key])]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="", help="comma-separated subset of the variant names")
    args = ap.parse_args()
    key = config_key()
    chosen = variants(key)
    if args.variants:
        chosen = {n: chosen[n] for n in args.variants.split(",")}
    compare(chosen, CASES)


if __name__ == "__main__":
    main()

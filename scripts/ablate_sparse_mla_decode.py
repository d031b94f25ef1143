"""Where does the sparse MLA decode kernel spend its time? Times variants of the kernel that leave
one stage out (no hardware counters needed): each variant is the module's source with one stage
replaced, loaded as a separate module. Results are wrong by design; only the times matter.

    python scripts/ablate_sparse_mla_decode.py
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton

from gpu_timing import time_us
from source_variant import edited_module
from sm12x.kernels.sparse_mla import decode as base
from sm12x.kernels.sparse_mla.reference import make_case

LOAD = '''        raw = tl.load(row[:, None, None] + (c * 64)[None, :, None] + d[None, None, :],
                      mask=v3 & is_nope, other=0)'''
ROPE = '''        rope = tl.load(rope_row[:, None, None] + d[None, None, :] + (c * 0)[None, :, None],
                       mask=v3 & (c == 7)[None, :, None], other=0.0)'''
SCALE = "nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32) * e[:, :, None]"
QK = "        s = _dot(q, tl.trans(k), tl.zeros((q.shape[0], k.shape[0]), dtype=tl.float32), INTERPRET)"
QK_LOOP = "    for _ in range(0, one):\n"
PV = "acc = _dot(_to_bf16(p, INTERPRET), k, acc * alpha[:, None], INTERPRET)"
PREFETCH = 'PREFETCH=cfg.get("PREFETCH", 1)'

VARIANTS = {
    "baseline": [],
    "no cache loads (synthetic bytes)": [(LOAD, "        raw = ((c[None, :, None] + d[None, None, :] + safe[:, None, None]) & 0x37).to(tl.uint8)")],
    "no RoPE load": [(ROPE, "        rope = tl.zeros((idx.shape[0], 8, 64), dtype=tl.bfloat16)")],
    "no scale multiply": [(SCALE, "nope = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)")],
    "no QK dot": [(QK, "        s = tl.zeros((q.shape[0], k.shape[0]), dtype=tl.float32) + valid[None, :].to(tl.float32) * 1e-3")],
    "QK dot on both warpgroups (no one-trip loop)": [(QK_LOOP, "    if True:\n")],
    "no PV dot": [(PV, "acc = acc * alpha[:, None] + tl.sum(p, 1)[:, None]")],
    "no index prefetch (PREFETCH 0)": [(PREFETCH, "PREFETCH=0")],
}

CASES = [("b64 h64 128+512p64", dict(b=64, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64)),
         ("b2 h64 128+512p64", dict(b=2, s_q=2, h_q=64, topk=128, page=256, extra_topk=512, extra_page=64))]


def load_variant(name, edits, tmp):
    return edited_module(open(base.__file__).read(), edits, f"ablate_{abs(hash(name))}", tmp)


def main():
    if not torch.cuda.is_available():
        raise SystemExit("ablate_sparse_mla_decode: needs a CUDA GPU")
    print(f"# sparse MLA decode ablation, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}\n")
    cases = [(label, make_case(device="cuda", sink=True, **kw)) for label, kw in CASES]
    print("| variant | " + " | ".join(f"{label} us" for label, _ in cases) + " |")
    print("|---|" + "---|" * len(cases))
    with tempfile.TemporaryDirectory() as tmp:
        for name, edits in VARIANTS.items():
            mod = load_variant(name, edits, tmp)
            times = []
            for _, case in cases:
                try:
                    times.append(f"{time_us(lambda: mod.sparse_mla_decode(**case)):.1f}")
                except Exception as e:  # a variant that does not compile is a result too
                    times.append(type(e).__name__)
            print(f"| {name} | " + " | ".join(times) + " |", flush=True)


if __name__ == "__main__":
    main()

"""Probe: the sparse MLA decode's combine step (H200, SM12X_FORCE=1). Variants, each the module's
source with edits, loaded as a separate module: the module as it is (the combine launched as
the split kernel's programmatic dependent where ``Plan.pdl`` says so), and without PDL; with
``scripts/probes/_before_sparse_mla_decode.py`` present (an older copy of the module:
``git show 00ef7ae:sm12x/kernels/sparse_mla_decode.py > <that path>``), that too.
Prints each kernel's mean time and the gap between them (profiler trace of CUDA-graph replays,
L2 flushed) and the span, and each variant's result against the reference, eager and replayed
from a CUDA graph.

    python scripts/probes/combine_probe.py
"""
import itertools
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch
import triton

from gpu_timing import graphed, kernel_span_us, traced_calls
from source_variant import edited_module
from sm12x.kernels.sparse_mla import decode as base
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
from sm12x.kernels.common.tolerance import failures, flashmla_decode_close

NO_PDL = [("pdl=_combine_fits_beside(pl, b * s_q, h_q, sms) and pdl_supported(device)",
           "pdl=False")]
CASES = [("b2 h64 128+512p64", dict(b=2, h_q=64, extra_topk=512, extra_page=64)),
         ("b2 h128 128+1024p64", dict(b=2, h_q=128, extra_topk=1024, extra_page=64)),
         ("b2 h64 128+1024p2 len", dict(b=2, h_q=64, extra_topk=1024, extra_page=2,
                                        extra_topk_length=True)),
         ("b74 h64 128+512p64", dict(b=74, h_q=64, extra_topk=512, extra_page=64)),
         ("b74 h64 128+1024p2 len", dict(b=74, h_q=64, extra_topk=1024, extra_page=2,
                                         extra_topk_length=True)),
         ("b148 h128 128+1024p64", dict(b=148, h_q=128, extra_topk=1024, extra_page=64)),
         ("b1 s1 h16 128+1024p2", dict(b=1, s_q=1, h_q=16, extra_topk=1024, extra_page=2)),
         ("b1 s1 h16 128+1024p2 len", dict(b=1, s_q=1, h_q=16, extra_topk=1024, extra_page=2,
                                           extra_topk_length=True)),
         ("b1 s2 h16 128+512p64", dict(b=1, h_q=16, extra_topk=512, extra_page=64))]


VARIANTS = {"as is": [], "no PDL": NO_PDL}
BEFORE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_before_sparse_mla_decode.py")


def load_variant(name, tmp):
    if name == "before":
        return edited_module(open(BEFORE).read(), [], "variant_before", tmp)
    return edited_module(open(base.__file__).read(), VARIANTS[name],
                         f"variant_{abs(hash(name))}", tmp)


def kernel_times(fn, iters=30):
    """Mean (split µs, gap µs, combine µs) over graph replays, L2 flushed before each."""
    split, gap, comb = [], [], []
    for call in traced_calls(fn, iters):
        s = next((start, end) for start, end, name in call if "split" in name)
        c = next(((start, end) for start, end, name in call if "combine" in name), None)
        split.append(s[1] - s[0])
        if c is not None:
            gap.append(c[0] - s[1])
            comb.append(c[1] - c[0])
    if not comb:
        return statistics.mean(split), float("nan"), float("nan")
    return statistics.mean(split), statistics.mean(gap), statistics.mean(comb)


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    cases = [(label, make_case(device="cuda", sink=True, **{"s_q": 2, **kw}))
             for label, kw in CASES]
    with tempfile.TemporaryDirectory() as tmp:
        names = (["before"] if os.path.exists(BEFORE) else []) + list(VARIANTS)
        mods = {name: load_variant(name, tmp) for name in names}
        print("\n| case | plan | " + " | ".join(f"{n}: split / gap / combine µs | {n}: span µs"
                                             for n in mods) + " |")
        print("|---|---|" + "---:|---:|" * len(mods))
        for label, case in cases:
            pl = base.plan(*case["q"].shape[:3], case["indices"].shape[-1],
                           case["extra_indices"].shape[-1], case["q"].device,
                           ragged=case.get("extra_topk_length") is not None)
            row = []
            for name, mod in mods.items():
                call = lambda: mod.sparse_mla_decode(**case)  # noqa: E731
                s, g, c = kernel_times(call)
                span = min(kernel_span_us(call) for _ in range(2))
                row += [f"{s:.1f} / {g:.1f} / {c:.1f}", f"{span:.1f}"]
            flags = (" direct" if pl.direct else "") + (" pdl" if pl.pdl else "")
            print(f"| {label} | H{pl.cfg['BLOCK_H']} {pl.programs}p{flags} | "
                  + " | ".join(row) + " |", flush=True)
        for (label, case), (name, mod) in itertools.product(cases, mods.items()):
            ref = ref_sparse_mla_decode(**case)
            eager = mod.sparse_mla_decode(**case)
            out = torch.empty_like(eager[0])
            lse = torch.empty_like(case["q"][..., 0], dtype=torch.float32)
            run = graphed(lambda: mod.sparse_mla_decode(**case, out=out, lse=lse))
            out.fill_(float("nan")); lse.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            bad = failures(flashmla_decode_close(eager, ref))
            same = torch.equal(out, eager[0]) and torch.equal(lse.transpose(1, 2), eager[1])
            print(f"{name} {label}: eager {bad or 'matches the reference'}; graph replay "
                  f"{'equals eager' if same else 'DIFFERS from eager'}", flush=True)


if __name__ == "__main__":
    main()

"""Probe: where the paged indexer logits kernel's time goes, program by program (H200,
SM12X_FORCE=1).

A copy of ``paged_mqa_logits`` whose kernel writes, per program, its start and end
(``%globaltimer``, ns), its SM (``%smid``) and its number of live cache blocks. On the benchmark's
inputs (``bench_indexer.paged_case``, unclean fp32 logits as the frameworks call them; a case's
optional fourth field sets max_context_len, e.g. a model's limit as vLLM passes it) each case is
called ``--reps`` times with L2 flushed before every call. Per case and variant it prints: programs
(live / all), live blocks per live program, the kernel span from the stamps, the mean duration of
a live program, a least-squares fit of that duration to its live blocks, the mean empty program,
the gap before an SM starts its next program, the mean time an SM sits idle after its own last
program ends, and how many programs ran per SM on average in each tenth of the span. The last
column is the variant's kernel unmodified, timed as ``bench_indexer`` times it (profiler trace,
L2 flushed). A variant is [name, config change, source]: source "" is the module as it is,
"file:PATH" another copy of it (``git show REV:sm12x/kernels/paged_mqa_logits.py > PATH``, inside
the working tree so the device gets it), or a key of SOURCE_EDITS. Every variant must give the
module's logits on the visible positions.

    python scripts/probes/paged_timeline_probe.py [--reps 5] [--variants JSON] [--cases JSON]
        [--flush write|read] [--out FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "scripts")]

import torch  # noqa: E402
import triton  # noqa: E402

from bench_indexer import paged_case  # noqa: E402
from gpu_timing import FLUSH_BYTES, kernel_span_us  # noqa: E402
from source_variant import edited_module  # noqa: E402
from sm12x.kernels import configs  # noqa: E402
from sm12x.kernels.indexer import paged_mqa_logits as pm  # noqa: E402

CASES = ((256, 8192, 1), (256, 16384, 1), (1024, 8192, 1), (256, 65536, 1), (256, 8192, 2),
         (256, 8192, 1, 262144))
# [name, config change, source edits (a key of SOURCE_EDITS or "")]
VARIANTS = [["now", {}, ""]]

# Kernel source variants (``--variants`` entries name one as their third field). "maxnreg 64":
# launch every variant under 64 registers, spills or not (the ladder would give a spilling variant
# more). "i32 parts": see below. The eighteenth session also timed loading the chunk's block-table entries before the
# request's length was known (no change; RESULTS.md).
SOURCE_EDITS = {
    "maxnreg 64": [("budget = {} if interpreting() else launch_budget(", "budget = {'maxnreg': 64} or (")],
    # the part bounds in 32-bit arithmetic (64-bit division is a long instruction sequence)
    "i32 parts": [(".to(tl.int64) * n_req // parts).to(tl.int32)", " * n_req // parts)")],
}

HELPERS = '''

@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                     pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _entry('''

# the start, SM and live count are stored at once so that the stamps hold no registers in the loop
BEGIN = '''    pid_n = tl.program_id(1)
    _slot = (pid_n * tl.num_programs(0) + pid_r).to(tl.int64) * 4
    tl.store(stamp_ptr + _slot, _now())
    tl.store(stamp_ptr + _slot + 2, _smid().to(tl.int64))
'''

STAMP = '''
    _end_slot = (tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)).to(tl.int64) * 4
    tl.store(stamp_ptr + _end_slot + 3, (LIVE_BLOCKS).to(tl.int64))
    tl.store(stamp_ptr + _end_slot + 1, _now())


def key_rows('''


def module_source(key):
    """(source text, edits) of a variant: "" the module as it is, "file:PATH" another copy of it
    (e.g. ``git show HEAD~1:sm12x/kernels/paged_mqa_logits.py``), else a key of SOURCE_EDITS."""
    if key.startswith("file:"):
        with open(key[5:]) as f:
            return f.read(), []
    with open(pm.__file__) as f:
        return f.read(), list(SOURCE_EDITS[key]) if key else []


def module_name(prefix, key):
    return prefix + "".join(ch if ch.isalnum() else "_" for ch in (key or "now"))


def source_module(tmp, key):
    """The kernel module of a variant (the module itself for "")."""
    if not key:
        return pm
    src, edits = module_source(key)
    return edited_module(src, edits, module_name("paged_variant_", key), tmp)


def stamped_module(tmp, key=""):
    src, edits = module_source(key)
    # live blocks of a program: the parts version walks [lo, hi); the chunk version has n_live
    live = "hi - lo" if "for blk0 in range(lo, hi, N_ITERS)" in src else "n_live"
    edits += [
        ("\n\n@triton.jit\ndef _entry(", HELPERS),
        ("    HEAD_MMA: tl.constexpr,  # 0, or the head sum as an MMA (``key_tile_scores``; 2: inline PTX)\n):",
         "    HEAD_MMA: tl.constexpr,  # 0, or the head sum as an MMA (``key_tile_scores``; 2: inline PTX)\n"
         "    stamp_ptr=None,\n):"),
        ("    pid_n = tl.program_id(1)  #", BEGIN + "    #"),
        ("\n\ndef key_rows(", STAMP.replace("LIVE_BLOCKS", live)),
        ("    kwargs = dict(H=h,", "    kwargs = dict(stamp_ptr=STAMPS, H=h,"),
    ]
    return edited_module(src, edits, module_name("paged_stamped_", key), tmp)


def timeline(stamps):
    """Stats of one call's stamps ([programs, 4] int64: start, end, sm, live blocks; slots of
    programs that did not run are zero)."""
    st = stamps.cpu()
    st = st[st[:, 0] != 0]
    t0 = int(st[:, 0].min())
    start = (st[:, 0] - t0).double() / 1e3
    end = (st[:, 1] - t0).double() / 1e3
    sm = st[:, 2]
    live = st[:, 3]
    span = float(end.max())
    busy = live > 0
    dur_live = float((end - start)[busy].mean()) if bool(busy.any()) else float("nan")
    blocks_live = float(live[busy].double().mean()) if bool(busy.any()) else float("nan")
    sms = torch.unique(sm)
    last = torch.stack([end[sm == s].max() for s in sms])
    tail = float((span - last).mean())
    bins = []
    for k in range(10):
        a, b = span * k / 10, span * (k + 1) / 10
        overlap = (torch.minimum(end, torch.tensor(b)) - torch.maximum(start, torch.tensor(a))).clamp(min=0)
        bins.append(float(overlap.sum()) / (b - a) / len(sms))
    dur = end - start
    empty = live == 0
    dur_empty = float(dur[empty].mean()) if bool(empty.any()) else float("nan")
    # per-block cost and fixed cost per live program: least squares of duration on live blocks
    lv = live[live > 0].double()
    dl = dur[live > 0]
    a = torch.stack([lv, torch.ones_like(lv)], 1)
    slope, icept = torch.linalg.lstsq(a, dl[:, None]).solution[:, 0].tolist()
    # gap: how long after a program ends on an SM the next one starts there (block launch latency)
    gaps = []
    for s_ in sms:
        on = sm == s_
        ends = torch.sort(end[on]).values
        for t in torch.sort(start[on]).values[8:]:  # past the first wave
            before = ends[ends <= t]
            if before.numel():
                gaps.append(float(t - before[-1]))
    gap = statistics.mean(gaps) if gaps else float("nan")
    steps = torch.diff(torch.unique(st[:, 1]))
    res = int(steps.min()) if steps.numel() else 0
    return dict(span=span, dur_live=dur_live, blocks_live=blocks_live, tail=tail, dur_empty=dur_empty,
                per_block=slope, fixed=icept, gap=gap, bins=bins, live=int((live > 0).sum()),
                programs=st.shape[0], sms=len(sms), res_ns=res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default="")
    ap.add_argument("--cases", default="", help="JSON list of [batch, ctx, next_n(, max_context_len)]")
    ap.add_argument("--out", default="")
    ap.add_argument("--flush", choices=("write", "read"), default="write",
                    help="evict L2 before each stamped call by writing 512 MB (leaves dirty lines, as the "
                         "benchmark and DeepGEMM's harness do) or by reading it (clean lines)")
    args = ap.parse_args()
    variants = json.loads(args.variants) if args.variants else VARIANTS
    cases = [tuple(c) for c in json.loads(args.cases)] if args.cases else CASES
    dev = torch.device("cuda")
    lines = [f"# paged logits timeline, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{torch.cuda.get_device_name()} ({configs.sm_count(dev)} SMs), configs {configs.arch_key(dev)}, "
             f"torch {torch.__version__}, triton {triton.__version__}; mean of {args.reps} calls, L2 flushed "
             f"by a 512 MB {args.flush} (stamps)\n",
             "| case | variant | programs live/all | live blocks per live program | span µs (stamps) "
             "| live program µs "
             "| µs per block + fixed µs per live program | empty program µs | launch gap µs "
             "| SM idle at end µs | programs per SM by tenth of span | span µs (profiler) |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|"]
    print("\n".join(lines), flush=True)
    scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=dev)
    with tempfile.TemporaryDirectory() as tmp:
        mods = {}
        for _, _, key in variants:
            if key not in mods:
                mods[key] = (stamped_module(tmp, key), source_module(tmp, key))
        for case in cases:
            b, ctx_avg, next_n = case[:3]
            torch.manual_seed(0)
            ctx, cache, bt, cl, (q, _), w, mcl = paged_case(b, ctx_avg, next_n, False)
            label = f"B={b} ctx~{ctx_avg} next_n={next_n}"
            if len(case) > 3:  # max_context_len as vLLM passes it: the model's limit, not the batch's
                mcl = case[3]
                bt = torch.nn.functional.pad(bt, (0, triton.cdiv(mcl, cache.shape[1]) - bt.shape[1]))
                label += f" max_context_len={mcl}"
            seen = torch.arange(mcl, device=dev)[None, :] < cl.reshape(-1)[:, None]
            ref = pm.launch(q, None, cache, w, cl, bt, mcl, pm.alloc_logits(b * next_n, mcl, torch.float32, dev),
                            clean=False, out_mode=0)
            ref = torch.where(seen, ref, 0)
            slots = b * next_n * triton.cdiv(mcl, cache.shape[1])  # more than any grid here
            for name, change, key in variants:
                sm_mod, var_mod = mods[key]
                cfgs = [configs.pick(m.CONFIGS, dev)["fp8"] for m in (sm_mod, pm, var_mod)]
                saved = [dict(c) for c in cfgs]
                try:
                    for c in cfgs:
                        c.update(change)
                    out = pm.alloc_logits(b * next_n, mcl, torch.float32, dev)
                    sm_mod.STAMPS = torch.zeros(slots * 4, dtype=torch.int64, device=dev)
                    stats = []
                    for rep in range(args.reps + 1):
                        sm_mod.STAMPS.zero_()
                        if args.flush == "write":
                            torch.bitwise_not(scratch, out=scratch)
                        else:
                            scratch.view(torch.int64).sum()
                        got = sm_mod.launch(q, None, cache, w, cl, bt, mcl, out, clean=False, out_mode=0)
                        torch.cuda.synchronize()
                        if rep == 0:  # compile + check the stamped copy computes the same logits
                            if not torch.equal(torch.where(seen, got, 0), ref):
                                raise SystemExit(f"stamped kernel differs: {label} {name}")
                            continue
                        stats.append(timeline(sm_mod.STAMPS.view(slots, 4)))
                    prof = kernel_span_us(lambda: var_mod.launch(q, None, cache, w, cl, bt, mcl, out, clean=False,
                                                                 out_mode=0), iters=20)
                    if not torch.equal(torch.where(seen, out, 0), ref):
                        raise SystemExit(f"variant differs: {label} {name}")
                finally:
                    for c, s in zip(cfgs, saved):
                        c.clear()
                        c.update(s)
                mean = lambda k: statistics.mean(s[k] for s in stats)  # noqa: E731
                bins = [statistics.mean(s["bins"][i] for s in stats) for i in range(10)]
                line = (f"| {label} | {name} | {stats[0]['live']}/{stats[0]['programs']} "
                        f"| {mean('blocks_live'):.1f} "
                        f"| {mean('span'):.1f} | {mean('dur_live'):.1f} "
                        f"| {mean('per_block'):.2f} + {mean('fixed'):.2f} | {mean('dur_empty'):.2f} | {mean('gap'):.2f} "
                        f"| {mean('tail'):.1f} "
                        f"| {' '.join(f'{x:.1f}' for x in bins)} | {prof:.1f} |")
                lines.append(line)
                print(line, f"(timer step {stats[0]['res_ns']} ns, {stats[0]['sms']} SMs)", flush=True)
            del cache, bt, q, w, out, ref, seen
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

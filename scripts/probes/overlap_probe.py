"""Probe (GPU): the fused prefill top-k with the logits of the next window computed on a second
stream while the current window is selected (two workspaces), against the sequential loop."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "scripts"))
import torch
from probe_timing import ev_time
from bench_indexer import H, make_q, make_keys
from sm12x.kernels.common import configs
from sm12x.kernels.indexer import mqa_logits as _mqa
from sm12x.kernels.indexer.fused_topk import _plan, _RunningTopk, decode_keys, mqa_topk_indices




def overlapped(q, kv, w, ks, ke, topk, budget, logits_only=False):
    s, s_kv = q.shape[0], kv[0].shape[0]
    cfg = configs.pick(_mqa.CONFIGS, q.device)["fp8"]
    row_block, win = _plan(s, s_kv, cfg["BLOCK_N"] * cfg["N_ITERS"], topk, budget)
    bufs = [torch.empty((row_block, win), dtype=torch.float32, device=q.device) for _ in range(2)]
    run = _RunningTopk(row_block, topk, q.device)
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    free = [torch.cuda.Event(), torch.cuda.Event()]
    for e in free:
        e.record(main)
    result = torch.empty((s, topk), dtype=torch.int32, device=q.device)
    for r0 in range(0, s, row_block):
        r1 = min(s, r0 + row_block)
        run.start()
        for i, c0 in enumerate(range(0, s_kv, win)):
            n = min(win, s_kv - c0)
            w_ = bufs[i % 2][: r1 - r0, :n]
            ready = torch.cuda.Event()
            with torch.cuda.stream(side):
                side.wait_event(free[i % 2])
                _mqa.launch(q[r0:r1], None, kv[0], kv[1], w[r0:r1], ks[r0:r1], ke[r0:r1], w_, clean=True,
                            compressed=False, out_mode=0, col_start=c0, num_cols=n)
                ready.record(side)
            main.wait_event(ready)
            if not logits_only:
                run.add(w_, c0, ks[r0:r1])
            free[i % 2].record(main)
        if not logits_only:
            decode_keys(run.result(r1 - r0, q.device), topk, out=result[r0:r1])
    return result


for s in [int(x) for x in os.environ.get("SS", "4096,8192").split(",")]:
    s_kv = 262144
    q, _ = make_q((s, H), False)
    kv = make_keys(s_kv, False)
    w = torch.randn(s, H, device="cuda")
    ks = torch.zeros(s, dtype=torch.int32, device="cuda")
    ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
    for topk in (512, 2048):
        ref = mqa_topk_indices(q, kv, w, ks, ke, topk)
        t_seq = ev_time(lambda: mqa_topk_indices(q, kv, w, ks, ke, topk))
        row = [f"S={s} top-{topk}: sequential {t_seq:.2f} ms"]
        for mib in (256, 128):
            got = overlapped(q, kv, w, ks, ke, topk, mib << 20)
            same = torch.equal(got, ref)
            t = ev_time(lambda: overlapped(q, kv, w, ks, ke, topk, mib << 20))
            t_l = ev_time(lambda: overlapped(q, kv, w, ks, ke, topk, mib << 20, logits_only=True))
            row.append(f"2 x {mib} MiB: {t:.2f} ms (equal {same}; logits alone {t_l:.2f})")
        print(" | ".join(row), flush=True)

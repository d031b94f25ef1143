"""Probe (GPU, the fold of topk_fold): per-window time of the fused prefill top-k with the fold."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "scripts"))
import torch
from probe_timing import ev_time
from bench_indexer import H, make_q, make_keys
from sm12x.kernels.common import configs
from sm12x.kernels.indexer import mqa_logits as _mqa
from sm12x.kernels.indexer.fused_topk import _plan, _RunningTopk


s, s_kv, topk = 4096, 262144, int(os.environ.get("TOPK", 512))
q, _ = make_q((s, H), False)
kv = make_keys(s_kv, False)
w = torch.randn(s, H, device="cuda")
ks = torch.zeros(s, dtype=torch.int32, device="cuda")
ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
cfg = configs.pick(_mqa.CONFIGS, q.device)["fp8"]
row_block, win = _plan(s, s_kv, cfg["BLOCK_N"] * cfg["N_ITERS"], topk, 256 << 20)
ws = torch.empty((row_block, win), dtype=torch.float32, device="cuda")
run = _RunningTopk(row_block, topk, q.device)
run.start()
tot = 0
print(f"topk {topk}: win | logits ms | update ms | rows folded")
for i, c0 in enumerate(range(0, s_kv, win)):
    n = min(win, s_kv - c0)
    w_ = ws[:, :n]
    lt = ev_time(lambda: _mqa.launch(q, None, kv[0], kv[1], w, ks, ke, w_, clean=True, compressed=False,
                                     out_mode=0, col_start=c0, num_cols=n))
    keep = None if run.best is None else run.best.clone()
    def upd():
        if keep is not None:
            run.best.copy_(keep)
        run.best = None if keep is None else run.best
        run.add(w_, c0, ks)
    ut = ev_time(upd) - (ev_time(lambda: run.best.copy_(keep)) if keep is not None else 0)
    if keep is not None:
        run.best.copy_(keep)
    run.add(w_, c0, ks)
    tot += ut
    print(f"{i:2d} | {lt:.3f} | {ut:.3f} | {int(run.done.sum()) if keep is not None else '-'}")
print(f"update total {tot:.2f} ms")

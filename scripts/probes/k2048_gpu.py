"""Probe (topk-fold branch, GPU): the fold at top-2048 on the GPU against torch, then the fused top-k at top-2048."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))
import torch
from test_topk_fold import window_keys
import importlib
mod = importlib.import_module(os.environ.get("FOLD_MOD", "sm12x.kernels.topk_fold"))
fold_above_floor = mod.fold_above_floor
mod.MERGE_WARPS = int(os.environ.get("MW", 4))
print("module", mod.__name__, "merge warps", mod.MERGE_WARPS)
for R, K, wprev, W in [(64, 2048, 16384 * 8, 16384), (4096, 2048, 16384 * 8, 16384), (4096, 2048, 16384 * 2, 16384),
                       (4096, 512, 16384 * 2, 16384)]:
    torch.manual_seed(0)
    base = torch.zeros(R, dtype=torch.int32, device="cuda")
    best = window_keys(torch.randn(R, wprev, device="cuda"), 0, base).topk(K, dim=1).values.contiguous()
    x = torch.randn(R, W, device="cuda")
    keys = window_keys(x, wprev, base)
    above = (keys > best[:, -1:]).sum(1)
    want = torch.cat([best, keys], 1).topk(K, dim=1).values
    b = best.clone()
    scratch = torch.empty(R, K, dtype=torch.int64, device="cuda")
    done = torch.empty(R, dtype=torch.int32, device="cuda")
    fold_above_floor(x, b, wprev, base, scratch, done)
    torch.cuda.synchronize()
    ok_done = torch.equal(done.bool(), above <= min(256, K))
    ok = torch.equal(torch.where(done.bool()[:, None], want, best), b)
    print(f"R={R} K={K} prev {wprev}: folded {int(done.sum())}, done flags {ok_done}, rows {ok}", flush=True)

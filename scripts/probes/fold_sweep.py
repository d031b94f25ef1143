"""Probe (GPU): the fused prefill top-k (S=4096, S_kv=262,144) with other fold limits and
skipping-merge widths (topk_merge.MAX_WIDTH_SKIPPING); results must equal the defaults' exactly."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "scripts"))
import torch
from bench_indexer import H, make_q, make_keys
from sm12x.kernels.indexer import topk_fold, topk_merge
from sm12x.kernels.indexer.fused_topk import mqa_topk_indices
from probe_timing import ev_time

s, s_kv = 4096, 262144
q, _ = make_q((s, H), False)
kv = make_keys(s_kv, False)
w = torch.randn(s, H, device="cuda")
ks = torch.zeros(s, dtype=torch.int32, device="cuda")
ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
# (fold candidates, fold merge warps, topk_merge.MAX_WIDTH_SKIPPING); the first is the default
variants = {512: [(256, 4, 4096), (512, 8, 4096)],
            2048: [(1024, 8, 4096), (256, 4, 1024), (1024, 8, 1024), (512, 8, 4096), (1024, 16, 4096),
                   (2048, 16, 4096)]}
names = {512: ("CANDIDATES", "MERGE_WARPS"), 2048: ("WIDE_CANDIDATES", "WIDE_MERGE_WARPS")}
for topk, vs in variants.items():
    ref = mqa_topk_indices(q, kv, w, ks, ke, topk)
    c_name, w_name = names[topk]
    default = (getattr(topk_fold, c_name), getattr(topk_fold, w_name), topk_merge.MAX_WIDTH_SKIPPING)
    for cand, warps, width in vs:
        setattr(topk_fold, c_name, cand); setattr(topk_fold, w_name, warps); topk_merge.MAX_WIDTH_SKIPPING = width
        same = torch.equal(mqa_topk_indices(q, kv, w, ks, ke, topk), ref)
        t = ev_time(lambda: mqa_topk_indices(q, kv, w, ks, ke, topk))
        print(f"top-{topk} {c_name} {cand} {w_name} {warps} MAX_WIDTH_SKIPPING {width}: {t:.2f} ms "
              f"equal {same}", flush=True)
    setattr(topk_fold, c_name, default[0]); setattr(topk_fold, w_name, default[1])
    topk_merge.MAX_WIDTH_SKIPPING = default[2]

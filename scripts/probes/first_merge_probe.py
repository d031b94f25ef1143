"""Probe (GPU): the first window's merge of the fused top-k at top-2048 (no running set yet: a
sort of [4096, 2048] int64 keys) by torch.topk or by topk_merge's kernel (MAX_WIDTH 1024 / 2048),
alone and in the whole fused top-k (S=4096, S_kv=262,144; results must be equal)."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "scripts"))
import torch
from probe_timing import ev_time
from bench_indexer import H, make_q, make_keys
from sm12x.kernels.indexer import topk_merge
from sm12x.kernels.indexer.fused_topk import mqa_topk_indices

s, s_kv, topk = 4096, 262144, 2048
q, _ = make_q((s, H), False)
kv = make_keys(s_kv, False)
w = torch.randn(s, H, device="cuda")
ks = torch.zeros(s, dtype=torch.int32, device="cuda")
ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
cand = torch.randint(-(1 << 62), 1 << 62, (s, topk), device="cuda")
out = torch.empty_like(cand)
ref = mqa_topk_indices(q, kv, w, ks, ke, topk)
print(f"torch.sort of the candidates alone: {ev_time(lambda: cand.sort(dim=1, descending=True), 10):.3f} ms")
for width in (1024, 2048):
    topk_merge.MAX_WIDTH = width
    m = ev_time(lambda: topk_merge.merge_topk_keys(None, cand, out), 10)
    same = torch.equal(mqa_topk_indices(q, kv, w, ks, ke, topk), ref)
    t = ev_time(lambda: mqa_topk_indices(q, kv, w, ks, ke, topk))
    print(f"MAX_WIDTH {width}: first merge {m:.3f} ms; fused top-2048 {t:.2f} ms, equal {same}", flush=True)

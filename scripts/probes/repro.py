"""Probe (GPU, the fold of topk_fold): the fused prefill top-k at bench shapes, repeated; results must repeat exactly."""
import os, sys
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT); sys.path.insert(0, os.path.join(ROOT, "scripts"))
import torch
from bench_indexer import H, make_q, make_keys
from sm12x.kernels.indexer.fused_topk import mqa_topk_indices
s, s_kv = int(os.environ.get("S", 4096)), 262144
q, _ = make_q((s, H), False)
kv = make_keys(s_kv, False)
w = torch.randn(s, H, device="cuda")
ks = torch.zeros(s, dtype=torch.int32, device="cuda")
ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
for topk in [int(t) for t in os.environ.get("TOPKS", "512,2048").split(",")]:
    ws = int(os.environ.get("WS", 256 << 20))
    a = mqa_topk_indices(q, kv, w, ks, ke, topk, workspace_bytes=ws)
    b = mqa_topk_indices(q, kv, w, ks, ke, topk, workspace_bytes=ws)
    torch.cuda.synchronize()
    print(f"S={s} topk {topk}: repeat equal {torch.equal(a, b)}", flush=True)

"""The float32 reference of the V4-Flash layer: every op the patched backend hands to a kernel,
computed in float32 PyTorch from the dequantised weights.

What the checkpoint's own math quantises is quantised here too, so the reference is the model and
not a wider one: activations are cast to FP8 per 1 x 128 (UE8M0) before every FP8 linear and before
wo_a and w2, the KV cache holds FP8 NoPE per 64 and bf16 RoPE, the indexer's q and keys are FP8 per
token. Everything else (norms, RoPE, mHC, attention, the gate, SwiGLU) stays float32; the patched
path rounds its activations to bf16 between ops as the frameworks do.

``dtype`` bf16 runs the GEMMs (linears, wo_a, experts) in bf16 and keeps bf16 activations (a
plain torch path to time beside the patched one; softmax, norms and mHC stay float32).

Discrete choices are taken from the patched run when ``trace`` holds them (the indexer's top-k sets
and the routed experts), so that a near-tie decided the other way does not swamp the comparison;
how often the reference's own choice agrees is recorded in ``decisions`` (recall of the top-k sets
per step; for the experts, per step, the (agreeing, total) counts of single picks and of whole sets).
"""
from __future__ import annotations

import torch

from sm12x.layer import blocks
from sm12x.layer.forward import visible_entries

ROW_CHUNK = 256


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| (Frobenius, float64)."""
    g, w = got.detach().double(), want.detach().double()
    return float((g - w).norm() / w.norm().clamp_min(1e-30))


def attend(q, kv, idx, sink, scale):
    """Sparse attention with a sink (FlashMLA's semantics): q [R, H, 512], kv rows [N, 512]
    (float32; K = V = the row), idx [R, K] (-1 invalid) -> float32 [R, H, 512]; a row with no
    valid index gives 0."""
    out = torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.float32, device=q.device)
    for r0 in range(0, q.shape[0], ROW_CHUNK):
        ix = idx[r0:r0 + ROW_CHUNK].long()
        sel = kv[ix.clamp_min(0)]                                         # [r, K, 512]
        s = torch.einsum("rhd,rkd->rhk", q[r0:r0 + ROW_CHUNK].float(), sel) * scale
        s = s.masked_fill((ix < 0)[:, None, :], float("-inf"))
        lse = torch.logsumexp(s, -1, keepdim=True)
        p = torch.exp(s - lse).nan_to_num(0.0)
        o = torch.einsum("rhk,rkd->rhd", p, sel[..., :512])
        if sink is not None:
            o = o * torch.sigmoid(lse - sink.float()[None, :, None]).nan_to_num(0.0)
        out[r0:r0 + ROW_CHUNK] = o
    return out


def index_scores(q, weights, keys, ks, ke):
    """Indexer scores sum_h relu(q[r, h] . k[j]) w[r, h] over flat keys [N, D], -inf outside each
    row's [ks, ke) -> float32 [R, N]."""
    out = torch.empty(q.shape[0], keys.shape[0], dtype=torch.float32, device=q.device)
    cols = torch.arange(keys.shape[0], device=q.device)
    for r0 in range(0, q.shape[0], ROW_CHUNK):
        sl = slice(r0, r0 + ROW_CHUNK)
        s = torch.einsum("rhd,nd->rhn", q[sl].float(), keys.float()).relu()
        s = (s * weights[sl].float()[:, :, None]).sum(1)
        vis = (cols[None, :] >= ks[sl, None]) & (cols[None, :] < ke[sl, None])
        out[sl] = s.masked_fill(~vis, float("-inf"))
    return out


def recall(got: torch.Tensor, want: torch.Tensor) -> float:
    """Share of the valid (>= 0) entries of ``want`` found in ``got`` (1 when ``want`` has none)."""
    w = set(want[want >= 0].tolist())
    return len(set(got[got >= 0].tolist()) & w) / len(w) if w else 1.0


def topk_desc(scores, k, ks):
    """Top ``k`` columns per row, best first, as positions relative to ks (-1 for the missing)."""
    kk = min(k, scores.shape[1])
    v, i = torch.topk(scores, kk, dim=-1) if kk else (scores[:, :0], scores[:, :0].long())
    rel = torch.where(v > float("-inf"), i - ks[:, None].long(), -1)
    return torch.nn.functional.pad(rel, (0, k - kk), value=-1).to(torch.int32)


class ReferenceBackend:
    def __init__(self, cfg, attn_sink, trace: dict | None = None, layer: int = 0, dtype=torch.float32):
        self.cfg, self.attn_sink, self.layer, self.dtype = cfg, attn_sink, layer, dtype
        self.trace = trace if trace is not None else {}
        self.tokens, self.comp, self.index_keys, self.history = {}, {}, {}, {}
        self.decisions: dict = {}
        self._deq: dict = {}
        self.step_no = 0

    def act(self, x):
        return x.to(self.dtype)

    def _w(self, name, w):
        if name not in self._deq:
            self._deq[name] = w.dequant().to(self.dtype)
        return self._deq[name]

    def hc_prenorm(self, x_flat, fn):
        xf = x_flat.float()
        return xf @ fn.float().T, (xf * xf).sum(-1)

    def linear(self, name, x, w):
        return blocks.fake_quant(x, 128).to(self.dtype) @ self._w(name, w).T

    def wo_a(self, o, w):
        return torch.einsum("bhr,hdr->bhd", blocks.fake_quant(o, 128).to(self.dtype), self._w("wo_a", w))

    # --------------------------------------------------------------------------------------------
    @staticmethod
    def _put(store, req, at, rows):
        cur = store.get(req)
        need = int(at.max()) + 1
        if cur is None or cur.shape[0] < need:
            grown = rows.new_zeros((max(need, 2 * (0 if cur is None else cur.shape[0])), rows.shape[1]))
            if cur is not None:
                grown[:cur.shape[0]] = cur
            cur = grown
        cur[at.long()] = rows
        store[req] = cur

    def write_tokens(self, step, positions, kv):
        kv = blocks.fake_quant_kv(kv, self.cfg.nope_dim)
        for r, s, n, row in step.spans():
            self._put(self.tokens, r, positions[row:row + n], kv[row:row + n])

    def write_entries(self, req, entries, comp, index_keys):
        self._put(self.comp, req, entries, blocks.fake_quant_kv(comp, self.cfg.nope_dim))
        self._put(self.index_keys, req, entries, blocks.fake_quant(index_keys, index_keys.shape[-1]))

    def index_topk(self, step, iq, iw):
        cfg = self.cfg
        qq, qs = blocks.quant_fp8(iq, iq.shape[-1])
        q, weights = qq.float(), iw.float() * qs.squeeze(-1)
        pos = step.positions(iq.device)
        keys, ks, off = [], torch.empty(step.rows, dtype=torch.long, device=iq.device), 0
        for r, s, n, row in step.spans():
            count = int(visible_entries(torch.tensor(s + n - 1), cfg.compress_ratio))
            keys.append(self.index_keys[r][:count] if count else iq.new_zeros((0, cfg.index_dim)))
            ks[row:row + n] = off
            off += count
        ke = ks + visible_entries(pos, cfg.compress_ratio)
        own = topk_desc(index_scores(q, weights, torch.cat(keys).float(), ks, ke), cfg.index_topk, ks)
        forced = self.trace.get(("topk", self.layer, self.step_no))
        if forced is None:
            return own
        hit = [recall(a, b) for a, b in zip(forced.cpu(), own.cpu())]
        self.decisions.setdefault("indexer_topk_recall", []).append(min(hit) if hit else 1.0)
        return forced

    def attention(self, step, q, picked):
        cfg, dev = self.cfg, q.device
        pos = step.positions(dev)
        out = []
        for r, s, n, row in step.spans():
            comp = self.comp.get(r, q.new_zeros((0, 512), dtype=torch.float32))
            n_ent = int(visible_entries(torch.tensor(s + n - 1), cfg.compress_ratio))
            kv = torch.cat((comp[:n_ent].float(), self.tokens[r][:s + n].float()))
            t = pos[row:row + n]
            win = t[:, None] - torch.arange(cfg.window, device=dev)[None, :]
            pk = picked[row:row + n]
            idx = torch.cat((torch.where(pk >= 0, pk, -1), torch.where(win >= 0, win + n_ent, -1)), 1)
            out.append(attend(q[row:row + n].float(), kv, idx, self.attn_sink, cfg.head_dim ** -0.5))
        return torch.cat(out)

    # --------------------------------------------------------------------------------------------
    def route(self, step, ids):
        forced = self.trace.get(("experts", self.layer, self.step_no))
        if forced is None:
            return ids
        # counts, pooled over the steps by the report: a share per step would make a one-token
        # step (decode batch 1) read 0 or 1 and swamp a minimum over steps
        in_both = (forced[:, :, None] == ids[:, None, :]).any(-1)                # [T, k]
        self.decisions.setdefault("expert_pick_agreement", []).append((int(in_both.sum()), in_both.numel()))
        self.decisions.setdefault("expert_set_agreement", []).append((int(in_both.all(1).sum()), ids.shape[0]))
        return forced

    def experts(self, step, h, ids, weights, w13, w2):
        cfg = self.cfg
        out = torch.zeros(h.shape[0], cfg.hidden, dtype=torch.float32, device=h.device)
        a = blocks.fake_quant(h, 128)
        for e in torch.unique(ids).tolist():
            tok, slot = (ids == e).nonzero(as_tuple=True)
            dt = self.dtype
            y = blocks.swiglu(a[tok].to(dt) @ w13.dequant(e).to(dt).T, cfg.swiglu_limit) * weights[tok, slot][:, None]
            out.index_add_(0, tok, (blocks.fake_quant(y, 128).to(dt) @ w2.dequant(e).to(dt).T).float())
        return out

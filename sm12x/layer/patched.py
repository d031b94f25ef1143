"""The layer's kernel calls as the frameworks make them, through the upstream-compatible front ends.

``dg`` is a ``deep_gemm`` module and ``fmla`` a ``flash_mla`` module: by default the modules sm12x
installs (the stand-in ``deep_gemm`` assembled exactly as ``sm12x.shims`` assembles it, and the
FlashMLA functions the patches put on every FlashMLA route); a real DeepGEMM / FlashMLA can be passed
instead (``scripts/bench_layer.py`` does where they are importable). The indexer top-k is the fused
one the indexer patches route vLLM's and SGLang's DeepSeek-V4 indexers to.

With ``check_ops`` every call is also computed by the float32 reference on the same inputs it got
(the dequantised operands, the caches as written) and its error recorded in ``op_errors``: the
kernel's own error at each op boundary, apart from what earlier ops contributed.
"""
from __future__ import annotations

import types

import torch

from sm12x.kernels.indexer.cache import paged_cache_parts
from sm12x.kernels.indexer.fused_topk import mqa_topk_indices, paged_mqa_topk_indices
from sm12x.kernels.sparse_mla.kv_cache import dequantize_model1_cache
from sm12x.layer import blocks
from sm12x.layer.caches import PagedCaches
from sm12x.layer.forward import visible_entries
from sm12x.layer.reference import attend, index_scores, recall, rel_error, topk_desc


def sm12x_deep_gemm():
    """A ``deep_gemm`` module built the way ``sm12x.shims`` builds the stand-in (same sources)."""
    from sm12x.shims import _ShimLoader

    module = types.ModuleType("deep_gemm")
    _ShimLoader("deep_gemm").exec_module(module)
    return module


def sm12x_flash_mla():
    """The FlashMLA-compatible functions the flash_mla patches install."""
    from sm12x.frontends.flash_mla import api

    return api


class PatchedBackend:
    # the grouped GEMMs the routed experts go through (MXFP4 weights: DeepGEMM's FP8 x FP4 forms)
    EXPERT_OPS = ("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked")

    def __init__(self, cfg, caches: PagedCaches, attn_sink: torch.Tensor, dg=None, fmla=None,
                 check_ops: bool = False, trace: dict | None = None, layer: int = 0,
                 scale_format: str = "packed"):
        self.cfg, self.caches, self.attn_sink, self.layer = cfg, caches, attn_sink, layer
        self.dg = dg or sm12x_deep_gemm()
        self.fmla = fmla or sm12x_flash_mla()
        self.check_ops = check_ops
        self.op_errors: dict = {}
        self.trace = {} if trace is None else trace
        self.history: dict = {}
        self.scale_format = scale_format  # "packed": SM100 / SM120 callers' UE8M0 int32; "fp32": SM90's
        self._wsf: dict = {}
        self.step_no = 0

    # --------------------------------------------------------------------------------------------
    def act(self, x):
        return x.to(torch.bfloat16)

    def _record(self, name, got, want):
        if self.check_ops:
            self.op_errors.setdefault(name, []).append(rel_error(got, want))

    def _a_scales(self, sf):
        """Per-token 1 x 128 activation scales [M, K/128] in the callers' format."""
        if self.scale_format == "fp32":
            return self.dg.get_mn_major_tma_aligned_tensor(sf)
        return self.dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)

    def _w_scales(self, key, w, mn, k, groups=None, recipe=(1, 128, 128)):
        if key not in self._wsf:
            if self.scale_format == "fp32":
                self._wsf[key] = w.sf
            else:
                self._wsf[key] = self.dg.transform_sf_into_required_layout(
                    w.sf, mn, k, recipe, num_groups=groups, is_sfa=False)
        return self._wsf[key]

    # --------------------------------------------------------------------------------------------
    def hc_prenorm(self, x_flat, fn):
        """SGLang's call: bf16 streams [T, hc * hidden], float32 hc_fn [24, hc * hidden]."""
        a = x_flat.to(torch.bfloat16).contiguous()
        d = torch.empty((a.shape[0], fn.shape[0]), dtype=torch.float32, device=a.device)
        s = torch.empty((a.shape[0],), dtype=torch.float32, device=a.device)
        self.dg.tf32_hc_prenorm_gemm(a, fn.float().contiguous(), d, s, num_splits=None)
        if self.check_ops:
            af = a.float()
            self._record("tf32_hc_prenorm_gemm", torch.cat((d, s[:, None]), 1),
                         torch.cat((af @ fn.float().T, (af * af).sum(-1, keepdim=True)), 1))
        return d, s

    def linear(self, name, x, w):
        """An FP8 linear: activations cast per 1 x 128 (UE8M0), ``fp8_gemm_nt`` into bf16."""
        xq, xs = blocks.quant_fp8(x, 128)
        n, k = w.q.shape
        out = torch.empty((x.shape[0], n), dtype=torch.bfloat16, device=x.device)
        self.dg.fp8_gemm_nt((xq, self._a_scales(xs)), (w.q, self._w_scales(name, w, n, k)), out)
        if self.check_ops:
            ref = (xq.float() * xs.repeat_interleave(128, -1)) @ w.dequant().T
            self._record("fp8_gemm_nt", out, ref)
        return out

    def wo_a(self, o, w):
        """vLLM's grouped output projection: ``fp8_einsum("bhr,hdr->bhd")`` on per-128 cast o."""
        t, g, r = o.shape
        oq, os_ = blocks.quant_fp8(o, 128)                                  # [T, G, R], [T, G, R/128]
        z = torch.empty((t, g, self.cfg.o_lora), dtype=torch.bfloat16, device=o.device)
        if self.scale_format == "fp32":
            sfa, sfb, recipe = os_, w.sf, (1, 128, 128)
        else:
            # per group: MN-major packed UE8M0 over tokens, viewed back as [T, G, words]
            sfa = self.dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(os_.transpose(0, 1)).transpose(0, 1)
            sfb, recipe = self._w_scales("wo_a", w, self.cfg.o_lora, r, groups=g), (1, 1, 128)
        self.dg.fp8_einsum("bhr,hdr->bhd", (oq, sfa), (w.q, sfb), z, recipe=recipe)
        if self.check_ops:
            of = oq.float() * os_.repeat_interleave(128, -1)
            self._record("fp8_einsum", z, torch.einsum("bhr,hdr->bhd", of, w.dequant()))
        return z

    # --------------------------------------------------------------------------------------------
    def write_tokens(self, step, positions, kv):
        self.caches.write_tokens(step.row_reqs(kv.device), positions, kv)

    def write_entries(self, req, entries, comp, index_keys):
        self.caches.write_entries(req, entries, comp, index_keys)

    def _index_q(self, iq, iw):
        """FP8 indexer q per (token, head) with its scale folded into the weights (vLLM's FP8 form)."""
        qq, qs = blocks.quant_fp8(iq, iq.shape[-1])                        # [T, H, 128], [T, H, 1]
        return qq.contiguous(), (iw.float() * qs.squeeze(-1)).contiguous()

    def index_topk(self, step, iq, iw):
        c, cfg = self.caches, self.cfg
        qq, weights = self._index_q(iq, iw)
        vals, scales = paged_cache_parts(c.index, cfg.index_dim, fp4=False)
        pos = step.positions(iq.device)
        if not step.decode:
            # the visible entries of each request, gathered flat (vLLM gathers its indexer keys so)
            keys, ks_list, k_off = [], [], 0
            ks = torch.empty(step.rows, dtype=torch.int32, device=iq.device)
            for r, s, n, row in step.spans():
                count = int(visible_entries(torch.tensor(s + n - 1), cfg.compress_ratio))
                slots = c.slots(c.index_table, r, torch.arange(count, device=iq.device), c.block).long()
                keys.append((vals.reshape(-1, cfg.index_dim)[slots], scales.reshape(-1)[slots]))
                ks[row:row + n] = k_off
                k_off += count
            k = torch.cat([x[0] for x in keys]).view(torch.float8_e4m3fn).contiguous()
            k_sf = torch.cat([x[1] for x in keys]).contiguous()
            ke = (ks + visible_entries(pos, cfg.compress_ratio)).to(torch.int32)
            picked = self._select_flat(qq, weights, k, k_sf, ks, ke)
            if self.check_ops:
                kf = k.float() * k_sf[:, None]
                self._record_topk(picked, qq, weights, kf, ks, ke)
        else:
            b, next_n = len(step.reqs), step.lens[0]
            ctx = visible_entries(pos, cfg.compress_ratio).view(b, next_n).to(torch.int32).contiguous()
            table = c.index_table[torch.tensor(step.reqs, device=iq.device)].contiguous()
            max_len = table.shape[1] * c.block
            picked = self._select_paged(qq.view(b, next_n, *qq.shape[1:]), weights, ctx, table, max_len)
            if self.check_ops:
                # the keys each request sees, dequantised from the paged cache, flattened per request
                deq = vals.contiguous().view(torch.float8_e4m3fn).float() * scales[..., None]
                flat, ks = [], torch.empty(step.rows, dtype=torch.int32, device=iq.device)
                off = 0
                for i, (r, s, n, row) in enumerate(step.spans()):
                    count = int(ctx[i].max())
                    slots = c.slots(c.index_table, r, torch.arange(count, device=iq.device), c.block).long()
                    flat.append(deq.reshape(-1, cfg.index_dim)[slots])
                    ks[row:row + n] = off
                    off += count
                self._record_topk(picked, qq, weights, torch.cat(flat), ks, ks + ctx.reshape(-1))
        self.trace[("topk", self.layer, self.step_no)] = picked
        return picked

    def _select_flat(self, qq, weights, k, k_sf, ks, ke):
        """Prefill: each row's top-k of its keys ``k[ks:ke]`` (the fused top-k vLLM's and SGLang's
        DeepSeek-V4 indexers are routed to) -> int32 [rows, topk], relative to ``ks``, -1 padded."""
        return mqa_topk_indices(qq, (k, k_sf), weights, ks, ke, self.cfg.index_topk)

    def _select_paged(self, qq, weights, ctx, table, max_len):
        """Decode: each row's top-k of the first ``ctx`` entries of its request's paged indexer
        cache -> int32 [B * next_n, topk], -1 padded."""
        return paged_mqa_topk_indices(qq, self.caches.index, weights, ctx, table, max_len, self.cfg.index_topk)

    def _record_topk(self, picked, qq, weights, kf, ks, ke):
        """Recall of the kernel's sets against the float32 top-k of the same quantised inputs."""
        ref = topk_desc(index_scores(qq.float(), weights, kf, ks, ke), self.cfg.index_topk, ks)
        hit = [recall(a, b) for a, b in zip(picked.cpu(), ref.cpu())]
        self.op_errors.setdefault("indexer_topk_recall", []).append(min(hit) if hit else 1.0)

    # --------------------------------------------------------------------------------------------
    def _window(self, t, device):
        """Window positions of rows at positions t [R]: left-aligned, -1 padded -> [R, window]."""
        w = self.cfg.window
        p = t[:, None] - (w - 1) + torch.arange(w, device=device)[None, :]
        valid = p >= 0
        shift = (~valid).sum(1, keepdim=True)                  # move the valid ones to the front
        idx = (torch.arange(w, device=device)[None, :] + shift).clamp(max=w - 1)
        p = torch.where(torch.arange(w, device=device)[None, :] < (w - shift), p.gather(1, idx), -1)
        return p

    def attention(self, step, q, picked):
        c, cfg, dev = self.caches, self.cfg, q.device
        pos = step.positions(dev)
        sink, scale = self.attn_sink, cfg.head_dim ** -0.5
        win = self._window(pos, dev)
        if not step.decode:
            rows, idx, off = [], torch.empty((step.rows, cfg.index_topk + cfg.window), dtype=torch.int32, device=dev), 0
            for r, s, n, row in step.spans():
                n_ent = int(visible_entries(torch.tensor(s + n - 1), cfg.compress_ratio))
                n_tok = s + n
                ent = c.slots(c.comp_table, r, torch.arange(n_ent, device=dev), c.block)
                tok = c.slots(c.swa_table, r, torch.arange(n_tok, device=dev), c.block)
                rows.append(_gather_model1(c.comp, ent))
                rows.append(_gather_model1(c.swa, tok))
                pk = picked[row:row + n]
                idx[row:row + n, :cfg.index_topk] = torch.where(pk >= 0, pk + off, -1)
                wn = win[row:row + n]
                idx[row:row + n, cfg.index_topk:] = torch.where(wn >= 0, wn + off + n_ent, -1)
                off += n_ent + n_tok
            kv = torch.cat(rows).to(torch.bfloat16).unsqueeze(1).contiguous()
            out = self.fmla.flash_mla_sparse_fwd(q.contiguous(), kv, idx.unsqueeze(1), scale, d_v=512,
                                                 attn_sink=sink)[0]
            if self.check_ops:
                self._record("flash_mla_sparse_fwd", out, attend(q.float(), kv[:, 0].float(), idx, sink, scale))
            return out
        b, next_n = len(step.reqs), step.lens[0]
        reqs = torch.tensor(step.reqs, device=dev)
        row_req = reqs.repeat_interleave(next_n)
        swa_idx = _slots_rows(c.swa_table, row_req, win, c.block)
        ext_idx = _slots_rows(c.comp_table, row_req, picked, c.block)
        swa_len = (win >= 0).sum(1).view(b, next_n).amax(1).to(torch.int32)
        ext_len = (picked >= 0).sum(1).view(b, next_n).amax(1).to(torch.int32)
        sched, _ = self.fmla.get_mla_metadata()
        qd = q.view(b, next_n, cfg.heads, cfg.head_dim).contiguous()
        out, _lse = self.fmla.flash_mla_with_kvcache(
            q=qd, k_cache=c.swa, block_table=None, cache_seqlens=None, head_dim_v=512,
            tile_scheduler_metadata=sched, is_fp8_kvcache=True, indices=swa_idx.view(b, next_n, -1),
            topk_length=swa_len, softmax_scale=scale, attn_sink=sink, extra_k_cache=c.comp,
            extra_indices_in_kvcache=ext_idx.view(b, next_n, -1), extra_topk_length=ext_len)
        out = out.reshape(step.rows, cfg.heads, cfg.head_dim)
        if self.check_ops:
            swa = dequantize_model1_cache(c.swa, torch.float32).reshape(-1, cfg.head_dim)
            comp = dequantize_model1_cache(c.comp, torch.float32).reshape(-1, cfg.head_dim)
            kv = torch.cat((comp, swa))
            idx = torch.cat((ext_idx, torch.where(swa_idx >= 0, swa_idx + comp.shape[0], -1)), 1)
            self._record("flash_mla_with_kvcache", out, attend(q.float(), kv, idx, sink, scale))
        return out

    # --------------------------------------------------------------------------------------------
    def route(self, step, ids):
        self.trace[("experts", self.layer, self.step_no)] = ids
        return ids

    def experts(self, step, h, ids, weights, w13, w2):
        """Routed MXFP4 experts: contiguous grouped GEMMs for prefill, masked for decode."""
        from sm12x.layer.moe_calls import routed_experts

        return routed_experts(self, step, h, ids, weights, w13, w2)

    def contiguous_alignment(self, rows: int) -> int:
        """M alignment of each expert's segment in the contiguous layout, asked for this step's
        ``rows`` (token, expert) pairs over the experts, as the SM100 / SM120 callers ask."""
        return self.dg.get_theoretical_mk_alignment_for_contiguous_layout(rows, self.cfg.experts)


def _gather_model1(cache, slots):
    """float32 rows [n, 512] of a MODEL1 cache at slots [n] (the pages they are on, dequantised)."""
    block = cache.shape[1]
    pages = torch.unique(slots.long() // block)
    deq = dequantize_model1_cache(cache[pages], torch.float32)          # [p, block, 512]
    where = torch.searchsorted(pages, slots.long() // block)
    return deq[where, slots.long() % block]


def _slots_rows(table, row_req, positions, block):
    """int32 cache slots of per-row positions [R, n] (-1 kept) through each row's block table row."""
    p = positions.clamp_min(0).long()
    pages = table[row_req.long()].long().gather(1, p // block)
    return torch.where(positions < 0, -1, pages * block + p % block).to(torch.int32)

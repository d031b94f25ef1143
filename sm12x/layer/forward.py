"""One DeepSeek-V4-Flash CSA decoder layer, written once over a backend that does the kernel calls.

The order is the one vLLM 0.34.0 (``vllm/models/deepseek_v4``) and SGLang 0.5.23
(``sglang/srt/models/deepseek_v4.py``) run, per step of tokens (rows: a prefill chunk of several
requests, or B requests x next_n decode tokens):

 1. mHC pre (attention): ``tf32_hc_prenorm_gemm`` of the flattened streams with ``hc_fn``, the
    Sinkhorn split, the layer input sum_k pre_k x_k, RMSNorm;
 2. q: wq_a (FP8) -> RMSNorm -> wq_b (FP8) -> per-head RMS (no weight) -> RoPE on the last 64;
    kv: wkv (FP8) -> RMSNorm -> RoPE -> the MODEL1 SWA cache;
 3. the compressor (ratio 4, overlapping): entries as their blocks complete -> RMSNorm -> RoPE at
    j * 4 -> the compressed MODEL1 cache; the indexer's compressor (d 128) -> Hadamard -> the FP8
    indexer cache;
 4. indexer: q = idx_wq_b(qr) (FP8) -> RoPE -> Hadamard -> FP8 per (token, head), its scale folded
    into weights_proj(x) * 128^-0.5 * heads^-0.5; top-512 of sum_h relu(q . k) w over the visible
    entries (fused top-k, no logits matrix);
 5. sparse attention over the window (128 tokens) and the selected entries, with the sink:
    ``flash_mla_sparse_fwd`` on bf16 rows gathered from the caches (prefill) or
    ``flash_mla_with_kvcache`` on the FP8 caches (decode, window as ``indices`` / ``topk_length``,
    entries as ``extra_*``); inverse RoPE; wo_a as ``fp8_einsum("bhr,hdr->bhd")``; wo_b (FP8);
 6. mHC post, then mHC pre (FFN), RMSNorm, the sqrt-softplus gate (top 6 by score + bias), routed
    MXFP4 experts through the grouped GEMMs (contiguous layout for prefill, masked for decode;
    SwiGLU clamped at 10, routing weight before w2), the shared FP8 expert, mHC post.

Where the two frameworks differ (read in their wheels; the backends' call forms say which one the
layer takes): the mHC pre-norm GEMM is ``deep_gemm.tf32_hc_prenorm_gemm`` in SGLang (above a token
count; torch below it), while vLLM's NVIDIA model runs its own TileLang mHC kernels; the wo_a
``fp8_einsum`` takes per-128 float32 block scales with recipe (1, 128, 128) up to SM90 and packed
per-row UE8M0 with (1, 1, 128) from SM100 in vLLM (the layer takes the packed form), the checkpoint's
recipe in SGLang; vLLM's decode passes every query token as its own row (``s_q`` 1), the layer's
spec-decode steps pass the 2-4 tokens of a request as ``s_q`` (FlashMLA's own test form) so both
forms run; both keep FP8 indexer keys with an FP4 option (the layer uses FP8); SGLang's DeepGEMM MoE
runner gives V4's MXFP4 experts ``recipe_a`` (1, 128) and ``recipe_b`` (1, 32), in its contiguous
and masked forms alike (the layer: contiguous for prefill, masked for decode).

Simplified here (the same in both backends, so no kernel is spared): the SWA cache keeps every token
(the window is read through indices, not a ring buffer), RoPE has no YaRN factor, the compressor's
running state is recomputed from each request's stored projections, and the hash-routed first
layers are not modelled (this is a CSA layer).
"""
from __future__ import annotations

import dataclasses

import torch

from sm12x.layer import blocks


@dataclasses.dataclass
class Step:
    """The rows of one forward: ``reqs[i]`` gets ``lens[i]`` tokens at positions starting at
    ``starts[i]``; ``decode``: every request has the same count (next_n) and reads the caches."""

    reqs: list
    starts: list
    lens: list
    decode: bool

    def positions(self, device) -> torch.Tensor:
        return torch.cat([torch.arange(s, s + n) for s, n in zip(self.starts, self.lens)]).to(device)

    def row_reqs(self, device) -> torch.Tensor:
        return torch.tensor([r for r, n in zip(self.reqs, self.lens) for _ in range(n)], device=device)

    @property
    def rows(self) -> int:
        return sum(self.lens)

    def spans(self):
        """(request, start position, count, first row) per request."""
        row = 0
        for r, s, n in zip(self.reqs, self.starts, self.lens):
            yield r, s, n, row
            row += n


def layer_forward(be, w: dict, cfg, streams: torch.Tensor, step: Step, taps: dict | None = None):
    """Streams [T, hc, hidden] -> streams after the layer. ``be``: PatchedBackend or
    ReferenceBackend; ``taps``: filled with the activations at each op boundary (float32)."""
    taps = {} if taps is None else taps
    pos = step.positions(streams.device)
    t_rows = streams.shape[0]

    def tap(name, x):
        taps[name] = x.detach().float()
        return x

    # 1. mHC pre (attention)
    h, post, comb = _hc_pre(be, w, cfg, streams, "attn")
    h = tap("attn_in", be.act(blocks.rms_norm(h, w["attn_norm"], cfg.rms_eps)))
    # 2. q and kv
    qr = tap("qr", be.act(blocks.rms_norm(be.linear("wq_a", h, w["wq_a"]), w["q_norm"], cfg.rms_eps)))
    q = be.linear("wq_b", qr, w["wq_b"]).view(t_rows, cfg.heads, cfg.head_dim)
    q = tap("q", be.act(blocks.rope(blocks.rms_norm(q, None, cfg.rms_eps), pos, cfg.rope_dim, cfg.rope_theta)))
    kv = blocks.rope(blocks.rms_norm(be.linear("wkv", h, w["wkv"]), w["kv_norm"], cfg.rms_eps), pos,
                     cfg.rope_dim, cfg.rope_theta)
    tap("kv", kv)
    # 3. caches: tokens, then the compressed entries whose blocks completed in this step
    be.write_tokens(step, pos, kv)
    _compress(be, w, cfg, h, step)
    # 4. indexer
    iq = be.linear("idx_wq_b", qr, w["idx_wq_b"]).view(t_rows, cfg.index_heads, cfg.index_dim)
    iq = blocks.hadamard(blocks.rope(iq, pos, cfg.rope_dim, cfg.rope_theta))
    iw = (h.float() @ w["idx_weights_proj"].float().T) * (cfg.index_dim ** -0.5 * cfg.index_heads ** -0.5)
    picked = be.index_topk(step, iq, iw)                  # [T, topk] entry positions, -1 padded
    # 5. attention, output projection
    o = tap("attn", be.attention(step, q, picked))        # [T, heads, 512]
    o = blocks.rope(o, pos, cfg.rope_dim, cfg.rope_theta, inverse=True)
    z = tap("wo_a", be.wo_a(o.view(t_rows, cfg.o_groups, cfg.heads_per_group * cfg.head_dim), w["wo_a"]))
    attn_out = tap("attn_out", be.linear("wo_b", z.flatten(1), w["wo_b"]))
    streams = be.act(blocks.hc_post(attn_out, streams, post, comb))
    # 6. FFN
    h, post, comb = _hc_pre(be, w, cfg, streams, "ffn")
    h = tap("ffn_in", be.act(blocks.rms_norm(h, w["ffn_norm"], cfg.rms_eps)))
    scores = blocks.gate_scores(h, w["gate"])
    ids = be.route(step, torch.topk(scores + w["gate_bias"], cfg.experts_per_token, dim=-1).indices)
    weights = blocks.routing_weights(scores, ids, cfg.routed_scale)
    routed = tap("routed", be.experts(step, h, ids, weights, w["experts_w13"], w["experts_w2"]))
    act = be.act(blocks.swiglu(be.linear("shared_w13", h, w["shared_w13"]), None))
    shared = tap("shared", be.linear("shared_w2", act, w["shared_w2"]))
    out = be.act(blocks.hc_post(routed.float() + shared.float(), streams, post, comb))
    tap("out", out)
    return out


def _hc_pre(be, w, cfg, streams, site):
    k = cfg.hc_mult * cfg.hidden
    mix, sqr = be.hc_prenorm(streams.reshape(streams.shape[0], k), w[f"hc_{site}_fn"])
    pre, post, comb = blocks.hc_split(mix, sqr, k, w[f"hc_{site}_scale"], w[f"hc_{site}_base"], cfg.hc_mult,
                                      cfg.hc_sinkhorn_iters, cfg.rms_eps, cfg.hc_eps)
    return blocks.hc_combine(streams, pre), post, comb


def _compress(be, w, cfg, h, step):
    """Append each request's compressor projections (float32, as the frameworks keep their
    compressor state) and write the entries whose block of ``compress_ratio`` tokens completed."""
    ratio = cfg.compress_ratio
    proj = {name: (h.float() @ w[f"{name}_wkv"].float().T, h.float() @ w[f"{name}_wgate"].float().T)
            for name in ("c", "ic")}
    for r, s, n, row in step.spans():
        hist = be.history.setdefault(r, {"c": [], "ic": []})
        for name in ("c", "ic"):
            hist[name].append((proj[name][0][row:row + n], proj[name][1][row:row + n]))
        first, last = s // ratio, (s + n) // ratio          # entries complete before / after this step
        if last <= first:
            continue
        entries = torch.arange(first, last, device=h.device)
        out = {}
        for name in ("c", "ic"):
            kv_all = torch.cat([p[0] for p in hist[name]])
            sc_all = torch.cat([p[1] for p in hist[name]])
            e = blocks.compress(kv_all, sc_all, w[f"{name}_ape"], ratio, first, last - first)
            e = blocks.rope(blocks.rms_norm(e, w[f"{name}_norm"], cfg.rms_eps), entries * ratio, cfg.rope_dim,
                            cfg.rope_theta)
            out[name] = e
        be.write_entries(r, entries, out["c"], blocks.hadamard(out["ic"]))


def visible_entries(t: torch.Tensor, ratio: int) -> torch.Tensor:
    """Compressed entries token position(s) t may attend: j < (t + 1) // ratio."""
    return (t + 1) // ratio

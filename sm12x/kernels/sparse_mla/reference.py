"""PyTorch reference of FlashMLA sparse decode (``flash_mla_with_kvcache`` with ``indices``), in fp32
from the dequantised cache.

For each query token (b, s): gather the rows named by ``indices[b, s]`` (and ``extra_indices``);
a row is invalid when its index is -1 (or outside [0, num_blocks * page_size)) or its position is
>= topk_length[b]. logits = (q . k) * softmax_scale; lse = logsumexp (natural log) over valid rows;
out = softmax @ V with V = k[:, :d_v]. A sink multiplies out by 1 / (1 + exp(sink - lse)) and does
not enter the returned lse. A query with no valid row gets out = 0 and lse = +inf.
"""
from __future__ import annotations

import torch

from sm12x.kernels.sparse_mla.kv_cache import dequantize_cache


def _gather(rows_all, indices, topk_length):
    """rows_all [N, d] (any float dtype), indices [b, s_q, topk] -> (rows fp32 [b, s_q, topk, d]
    with invalid rows zeroed, invalid mask [b, s_q, topk])."""
    b, s_q, topk = indices.shape
    idx = indices.long()
    invalid = (idx < 0) | (idx >= rows_all.shape[0])
    if topk_length is not None:
        pos = torch.arange(topk, device=idx.device).view(1, 1, topk)
        invalid |= pos >= topk_length.view(b, 1, 1).long()
    rows = rows_all.index_select(0, idx.masked_fill(invalid, 0).flatten()).float()
    # Zero before any arithmetic so NaN/Inf in rows we must not read never leak.
    rows = rows.view(b, s_q, topk, -1).masked_fill(invalid.unsqueeze(-1), 0.0)
    return rows, invalid


def _attend(q, rows, invalid, softmax_scale, d_v, attn_sink):
    """q [b, s_q, h_q, d_qk] over gathered rows -> (out fp32 [b, s_q, h_q, d_v], lse, max logit;
    both fp32 [b, s_q, h_q], natural log; a query with no valid row: 0, +inf, -inf)."""
    logits = torch.einsum("bshd,bsnd->bshn", q.float(), rows) * softmax_scale
    logits = logits.masked_fill(invalid.unsqueeze(2), float("-inf"))
    max_logits = logits.max(dim=-1).values
    lse = torch.logsumexp(logits, dim=-1)
    lonely = lse == float("-inf")
    probs = torch.exp(logits - lse.masked_fill(lonely, 0.0).unsqueeze(-1))
    out = torch.einsum("bshn,bsnd->bshd", probs, rows[..., :d_v])
    if attn_sink is not None:
        sink = attn_sink.float().view(1, 1, -1)
        out = out * (1.0 / (1.0 + torch.exp(sink - lse))).unsqueeze(-1)
    out = out.masked_fill(lonely.unsqueeze(-1), 0.0)
    return out, lse.masked_fill(lonely, float("inf")), max_logits


def ref_sparse_mla_decode(q, k_cache, indices, topk_length=None, attn_sink=None, extra_k_cache=None,
                          extra_indices=None, extra_topk_length=None, softmax_scale=None, d_v=512,
                          kv_format=None, extra_kv_format=None):
    """q [b, s_q, h_q, d_qk] -> (out bf16 [b, s_q, h_q, d_v], lse fp32 [b, h_q, s_q]). The V4.1
    caches need their declared formats (``kv_cache.V41_FORMATS`` keys; the decode's ``kv_format``
    names only the main cache's arrangement, so pass both here)."""
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    rows, invalid = _gather(dequantize_cache(k_cache, torch.float32, kv_format).flatten(0, 1),
                            indices, topk_length)
    if extra_k_cache is not None:
        rows1, invalid1 = _gather(
            dequantize_cache(extra_k_cache, torch.float32, extra_kv_format).flatten(0, 1),
            extra_indices, extra_topk_length)
        rows, invalid = torch.cat([rows, rows1], 2), torch.cat([invalid, invalid1], 2)
    out, lse, _ = _attend(q, rows, invalid, softmax_scale, d_v, attn_sink)
    return out.to(torch.bfloat16), lse.transpose(1, 2)


def ref_sparse_mla_prefill(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,
                           chunk=256, kv_format=None):
    """FlashMLA's ``flash_mla_sparse_fwd`` (contract in ``sparse_mla_prefill``): q bf16 [s_q, h_q,
    d_qk], kv bf16 [s_kv, 1, d_qk], indices int32 [s_q, 1, topk] -> (out bf16 [s_q, h_q, d_v],
    max_logits fp32 [s_q, h_q], lse fp32 [s_q, h_q]); empty rows: 0, -inf, +inf. Each query token
    is a decode request of one token; ``chunk`` of them at a time (the gathered rows are
    s_q x topk x d_qk fp32). ``kv_format`` (a V4.1 format): kv is that cache, dequantised to
    float32 rows [num_blocks * B, 1, 512] (indices are cache slots)."""
    if kv_format is not None:
        kv = dequantize_cache(kv, torch.float32, kv_format).flatten(0, 1).unsqueeze(1)
    parts = []
    for i in range(0, q.shape[0], chunk):
        length = None if topk_length is None else topk_length[i:i + chunk]
        rows, invalid = _gather(kv[:, 0], indices[i:i + chunk], length)
        out, lse, max_logits = _attend(q[i:i + chunk].unsqueeze(1), rows, invalid, sm_scale, d_v,
                                       attn_sink)
        parts.append((out[:, 0].to(torch.bfloat16), max_logits[:, 0], lse[:, 0]))
    return tuple(torch.cat(p) for p in zip(*parts))


def _make_scope(fmt, b, s_q, topk, page, s_k, gen, device, invalid_frac, with_length):
    """One cache + its indices: each request owns ceil(s_k / page) randomly placed pages."""
    from sm12x.kernels.sparse_mla import kv_cache as kvc

    d = 576 if fmt == "v32" else 512
    pages_per_req = -(-s_k // page)
    nb = b * pages_per_req
    kv = (torch.randn(nb, page, d, generator=gen, device=device) / 10).clamp(-1, 1)
    if fmt in kvc.V41_FORMATS:
        bpt, interleaved = kvc.V41_FORMATS[fmt]
        quant = kvc.quantize_v41_cache if bpt == 528 else kvc.quantize_v41_fp4_cache
        cache = quant(kv.to(torch.bfloat16), interleaved)
    else:
        quant = kvc.quantize_model1_cache if fmt == "model1" else kvc.quantize_v32_cache
        cache = quant(kv.to(torch.bfloat16))
    block_table = torch.randperm(nb, generator=gen, device=device).view(b, pages_per_req)
    pos = torch.rand(b * s_q, s_k, generator=gen, device=device).argsort(-1)[:, :topk]
    pos = pos.view(b, s_q, topk)
    pos = pos.masked_fill(torch.rand(pos.shape, generator=gen, device=device) < invalid_frac, -1)
    idx = kvc.indices_from_positions(pos, block_table, page)
    length = None
    if with_length:
        length = torch.randint(1, topk + 1, (b,), generator=gen, device=device, dtype=torch.int32)
    # Poison every row no query reads with NaN bytes: the kernel must never let them leak.
    live = idx.long()
    if length is not None:
        live = live.masked_fill(torch.arange(topk, device=device) >= length.view(b, 1, 1), -1)
    used = torch.zeros(nb * page + 1, dtype=torch.bool, device=device)
    used[live.flatten().clamp_min(-1) + 1] = True
    unused = ~used[1:].view(nb, page)
    raw = cache.as_strided((nb, cache.stride(0)), (cache.stride(0), 1))
    if fmt == "model1":
        raw[:, : page * 576].view(nb, page, 576).masked_fill_(unused.unsqueeze(-1), 0xFF)
        raw[:, page * 576: page * 584].view(nb, page, 8).masked_fill_(unused.unsqueeze(-1), 0xFF)
    elif fmt in kvc.V41_FORMATS:
        bpt, interleaved = kvc.V41_FORMATS[fmt]
        data = 512 if bpt == 528 else 256
        if interleaved:
            raw[:, : page * bpt].view(nb, page, bpt).masked_fill_(unused.unsqueeze(-1), 0xFF)
        else:
            raw[:, : page * data].view(nb, page, data).masked_fill_(unused.unsqueeze(-1), 0xFF)
            raw[:, page * data: page * bpt].view(nb, page, bpt - data).masked_fill_(
                unused.unsqueeze(-1), 0xFF)
    else:
        raw[:, : page * 656].view(nb, page, 656).masked_fill_(unused.unsqueeze(-1), 0xFF)
    return cache, idx, length


def make_case(fmt="model1", b=2, s_q=1, h_q=64, topk=128, page=256, extra_topk=None,
              extra_page=64, topk_length=False, extra_topk_length=False, sink=True, device="cpu",
              seed=0, invalid_frac=0.05, extra_fmt=None):
    """Random FlashMLA-style decode inputs (FlashMLA's test distribution: q ~ N(0,1) clamped to
    +-1, kv ~ N(0, 0.01) clamped, sink ~ N(0,1) with some +-inf, unused cache rows NaN).
    ``fmt`` "model1", "v32" or a V4.1 format (``kv_cache.V41_FORMATS``; ``extra_fmt`` for the extra
    cache, default ``fmt``; the case then carries ``kv_format`` / ``extra_kv_format``, which the
    reference takes as they are and the decode as its declared arrangement).
    -> dict of keyword arguments for ``sparse_mla_decode`` / ``ref_sparse_mla_decode``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    d = 576 if fmt == "v32" else 512
    q = torch.randn(b, s_q, h_q, d, generator=gen, device=device).clamp(-1, 1).to(torch.bfloat16)
    case = dict(q=q, softmax_scale=d ** -0.55)
    cache, idx, length = _make_scope(fmt, b, s_q, topk, page, max(2 * topk, page), gen, device,
                                     invalid_frac, topk_length)
    case.update(k_cache=cache, indices=idx, topk_length=length)
    if extra_topk:
        xcache, xidx, xlength = _make_scope(extra_fmt or fmt, b, s_q, extra_topk, extra_page,
                                            max(2 * extra_topk, extra_page), gen, device,
                                            invalid_frac, extra_topk_length)
        case.update(extra_k_cache=xcache, extra_indices=xidx, extra_topk_length=xlength)
    if sink:
        s = torch.randn(h_q, generator=gen, device=device)
        r = torch.randn(h_q, generator=gen, device=device)
        case["attn_sink"] = s.masked_fill(r > 1.0, float("inf")).masked_fill(r < -1.0, float("-inf"))
    if fmt not in ("model1", "v32"):
        case["kv_format"] = fmt
        if extra_topk:
            case["extra_kv_format"] = extra_fmt or fmt
    return case


def make_prefill_case(d_qk=512, s_q=4, h_q=64, topk=128, s_kv=256, topk_length=False, sink=True,
                      row_pad=0, device="cpu", seed=0, invalid_frac=0.05, kv_format=None, page=64):
    """Random ``flash_mla_sparse_fwd`` inputs with the decode cases' distribution (q ~ N(0,1)
    clamped to +-1, kv ~ N(0, 0.01) clamped, sm_scale d_qk^-0.55), distinct candidates per query,
    some -1 and some >= s_kv, NaN in every kv row no query reads; ``row_pad`` > 0 makes kv a
    strided view (rows of d_qk + row_pad elements). ``kv_format`` (a V4.1 format, d_qk 512): kv
    becomes that cache in pages of ``page`` tokens placed in random order, the indices its slots
    (out-of-range ones past the cache's end), unread rows' bytes 0xFF (NaN scales).
    -> dict of keyword arguments for ``sparse_mla_prefill`` / ``ref_sparse_mla_prefill``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(s_q, h_q, d_qk, generator=gen, device=device).clamp(-1, 1).to(torch.bfloat16)
    arena = (torch.randn(s_kv, 1, d_qk + row_pad, generator=gen, device=device) / 10).clamp(-1, 1)
    kv = arena.to(torch.bfloat16)[:, :, :d_qk]
    idx = torch.rand(s_q, max(s_kv, topk), generator=gen, device=device).argsort(-1)[:, :topk]
    odd = torch.rand(idx.shape, generator=gen, device=device)
    idx = idx.masked_fill(odd < invalid_frac / 2, -1)
    idx = torch.where((odd >= invalid_frac / 2) & (odd < invalid_frac), idx + s_kv, idx)
    idx = idx.to(torch.int32).view(s_q, 1, topk)
    length = None
    if topk_length:
        length = torch.randint(0, topk + 1, (s_q,), generator=gen, device=device,
                               dtype=torch.int32)
    live = idx[:, 0].long()
    if length is not None:
        live = live.masked_fill(torch.arange(topk, device=device) >= length.view(s_q, 1), -1)
    used = torch.zeros(s_kv + 1, dtype=torch.bool, device=device)
    used[torch.where(live < s_kv, live, -1).flatten() + 1] = True
    kv[~used[1:]] = float("nan")
    case = dict(q=q, kv=kv, indices=idx, sm_scale=d_qk ** -0.55, topk_length=length)
    if kv_format is not None:
        case.update(_v41_prefill_cache(kv, idx, ~used[1:], kv_format, page, gen))
    if sink:
        s = torch.randn(h_q, generator=gen, device=device)
        r = torch.randn(h_q, generator=gen, device=device)
        case["attn_sink"] = s.masked_fill(r > 1.0, float("inf")).masked_fill(r < -1.0, float("-inf"))
    return case


def _v41_prefill_cache(kv, idx, unread, kv_format, page, gen):
    """A prefill case's bf16 rows [s_kv, 1, 512] as a V4.1 cache of ``kv_format``: token i at slot
    block_of[i // page] * page + i % page; -> dict(kv=cache, indices=slots, kv_format=...)."""
    from sm12x.kernels.sparse_mla import kv_cache as kvc

    s_kv, device = kv.shape[0], kv.device
    nb = -(-s_kv // page)
    rows = torch.zeros(nb * page, 512, device=device)
    rows[:s_kv] = kv[:, 0].float().nan_to_num(0.0)
    bpt, interleaved = kvc.V41_FORMATS[kv_format]
    quant = kvc.quantize_v41_cache if bpt == 528 else kvc.quantize_v41_fp4_cache
    cache = quant(rows.view(nb, page, 512), interleaved)
    block_of = torch.randperm(nb, generator=gen, device=device)
    i = idx.long()
    inside = (i >= 0) & (i < s_kv)
    slots = block_of[(i.clamp(0, s_kv - 1) // page)] * page + i.clamp(0, s_kv - 1) % page
    slots = torch.where(inside, slots, torch.where(i < 0, -1, i - s_kv + nb * page))
    # poison the bytes of every row no query reads (its data and its scales)
    dead = torch.ones(nb * page, dtype=torch.bool, device=device)
    dead[:s_kv] = unread
    dead_slots = block_of.repeat_interleave(page) * page + torch.arange(page, device=device).repeat(nb)
    dead_mask = torch.zeros(nb * page, dtype=torch.bool, device=device)
    dead_mask[dead_slots[dead]] = True
    raw = cache.as_strided((nb, cache.stride(0)), (cache.stride(0), 1))
    data = 512 if bpt == 528 else 256
    dead_mask = dead_mask.view(nb, page, 1)
    if interleaved:
        raw[:, : page * bpt].view(nb, page, bpt).masked_fill_(dead_mask, 0xFF)
    else:
        raw[:, : page * data].view(nb, page, data).masked_fill_(dead_mask, 0xFF)
        raw[:, page * data: page * bpt].view(nb, page, bpt - data).masked_fill_(dead_mask, 0xFF)
    return dict(kv=cache, indices=slots.to(torch.int32), kv_format=kv_format)

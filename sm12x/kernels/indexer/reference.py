"""PyTorch references for the lightning indexer (DeepGEMM MQA logits) and its top-k.

Score of query row i and key j:  logits[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j] * k_scale[j]).

Everything is computed in float32 on dequantised inputs; the kernels must match to DeepGEMM's test
tolerance (calc_diff < 1e-3 FP8, < 0.02 FP4 against unquantised data; much tighter against these
references, which see the same quantised values).
"""
from __future__ import annotations

import torch

from sm12x.kernels.indexer.cache import dequant_fp4, dequant_paged_cache

NEG_INF = float("-inf")
# The indexer logits kernels' stated rounding (``mqa_logits``' docstring): a logit may differ from
# these references by up to HEAD_SUM_TOL of its size, sum_h |w_h| relu(q_h . k) k_scale
# (``ref_logit_sizes``). sm_90's configs round each head's score to bf16 before the head sum; a
# float32 head sum stays far inside it, but beyond a 1e-5 tie of a k-th score that its heads'
# weights nearly cancel.
HEAD_SUM_TOL = 2.0 ** -8


def _scores(q: torch.Tensor, k: torch.Tensor, weights: torch.Tensor, chunk: int = 4096) -> torch.Tensor:
    """q [M, H, D] fp32, k [N, D] fp32, weights [M, H] -> [M, N] (chunked over N)."""
    out = torch.empty(q.shape[0], k.shape[0], dtype=torch.float32, device=q.device)
    for n0 in range(0, k.shape[0], chunk):
        s = torch.einsum("mhd,nd->mhn", q, k[n0:n0 + chunk]).relu()
        out[:, n0:n0 + chunk] = torch.einsum("mhn,mh->mn", s, weights.float())
    return out


def ref_mqa_logits(q, k, k_scale, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
    """q [S, H, D], k [S_kv, D] (any float dtype, fp8 included), k_scale [S_kv] or None,
    weights [S, H], ks/ke [S] int. Returns fp32 [S, S_kv] (or [S, max_seqlen_k] compressed:
    out[i, j - ks[i]]). Entries outside ks[i] <= j < ke[i] are -inf when clean_logits (always -inf
    in the compressed form: the kernel leaves them undefined)."""
    kf = k.float()
    if k_scale is not None:
        kf = kf * k_scale.float().unsqueeze(-1)
    full = _scores(q.float(), kf, weights)
    j = torch.arange(k.shape[0], device=q.device)
    valid = (j[None, :] >= ks.long()[:, None]) & (j[None, :] < ke.long()[:, None])
    if max_seqlen_k > 0:
        out = torch.full((q.shape[0], max_seqlen_k), NEG_INF, device=q.device)
        c = torch.arange(max_seqlen_k, device=q.device)
        src = ks.long()[:, None] + c[None, :]
        ok = src < ke.long()[:, None]
        vals = full.gather(1, src.clamp(0, max(k.shape[0] - 1, 0))) if k.shape[0] else out
        return torch.where(ok, vals, out)
    return full.masked_fill(~valid, NEG_INF) if clean_logits else full


def ref_logit_sizes(q, k, k_scale, weights, ks, ke) -> torch.Tensor:
    """The size of each logit, sum_h |w_h| relu(q_h . k) k_scale (``ref_mqa_logits`` with |weights|):
    the scale of a kernel's rounding in that logit (``HEAD_SUM_TOL``). fp32 [S, S_kv], -inf where a
    row sees no key."""
    return ref_mqa_logits(q, k, k_scale, weights.abs(), ks, ke)


def ref_fp4_mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, clean_logits=True, max_seqlen_k=0):
    """FP4 variant: q int8 [S, H, D/2] + int32 [S, H], k int8 [S_kv, D/2] + int32 [S_kv]."""
    return ref_mqa_logits(dequant_fp4(q, q_sf), dequant_fp4(k, k_sf), None, weights, ks, ke,
                          clean_logits, max_seqlen_k)


def paged_valid_ends(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """Per logits row (b*next_n + t), the exclusive end of the visible key positions.

    2-D context_lens [B, next_n]: row (b, t) sees positions < context_lens[b, t].
    1-D context_lens [B] (old API): query t sits at position ctx - next_n + t and sees positions up to
    and including it, i.e. < ctx - next_n + t + 1."""
    if context_lens.dim() == 2:
        return context_lens.reshape(-1).long()
    t = torch.arange(next_n, device=context_lens.device)
    return (context_lens.long()[:, None] - next_n + t[None, :] + 1).reshape(-1)


def ref_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                         clean_logits=True):
    """q: float8 [B, next_n, H, D] or a tuple (values, scale|None) where scale != None means FP4
    (values int8 [B, next_n, H, D/2], scale int32 [B, next_n, H]). kv_cache: fused uint8 cache
    (indexer_cache). weights [B*next_n, H]. Returns fp32 [B*next_n, max_context_len]; positions at or
    beyond the row's visible end are -inf when clean_logits (the kernel leaves them undefined unless
    asked to clean)."""
    if isinstance(q, (tuple, list)):
        qv, qs = q
    else:
        qv, qs = q, None
    fp4 = qs is not None
    if fp4:
        qf = dequant_fp4(qv, qs)
    else:
        qf = qv.float()
    b, next_n, h, d = qf.shape
    cache = dequant_paged_cache(kv_cache, d, fp4)  # [nb, bkv, d]
    bkv = cache.shape[1]
    ends = paged_valid_ends(context_lens, next_n)
    out = torch.full((b * next_n, max_context_len), NEG_INF, device=qf.device)
    for i in range(b):
        rows = ends[i * next_n:(i + 1) * next_n]
        span = int(rows.max().item()) if next_n else 0
        span = min(max(span, 0), max_context_len)
        if span == 0:
            continue
        nblk = (span + bkv - 1) // bkv
        k = cache[block_table[i, :nblk].long()].reshape(-1, d)[:span]
        s = _scores(qf[i], k, weights[i * next_n:(i + 1) * next_n])
        p = torch.arange(span, device=qf.device)
        s = s.masked_fill(p[None, :] >= rows[:, None], NEG_INF) if clean_logits else s
        out[i * next_n:(i + 1) * next_n, :span] = s
    return out


def ref_indexer_topk(logits: torch.Tensor, topk: int, starts=None, ends=None) -> torch.Tensor:
    """Top-k of logits [R, N] restricted to starts[r] <= j < ends[r] (defaults 0 / N), returned as
    int32 [R, topk] local indices j - starts[r], ordered by descending score, equal scores lower index
    first, -1 padded when fewer than topk positions are visible."""
    r, n = logits.shape
    j = torch.arange(n, device=logits.device)
    lo = starts.long()[:, None] if starts is not None else torch.zeros(r, 1, dtype=torch.long, device=logits.device)
    hi = ends.long()[:, None] if ends is not None else torch.full((r, 1), n, device=logits.device)
    valid = (j[None, :] >= lo) & (j[None, :] < hi)
    masked = logits.float().masked_fill(~valid, NEG_INF)
    vals, idx = torch.sort(masked, dim=1, descending=True, stable=True)
    k = min(topk, n)
    out = torch.full((r, topk), -1, dtype=torch.int32, device=logits.device)
    sel_ok = valid.gather(1, idx[:, :k])
    out[:, :k] = torch.where(sel_ok, idx[:, :k] - lo, torch.full_like(idx[:, :k], -1)).int()
    return out


def topk_rows_differing(got: torch.Tensor, want: torch.Tensor, logits: torch.Tensor, starts=None,
                        rel_tol: float = 1e-5, slack=None) -> int:
    """Rows whose index sets differ other than by ties: got / want int32 [R, topk] (-1 padded,
    relative to starts), logits [R, N] the scores ``want`` ranks. A row passes when both hold the
    same number of indices and every index in one set only scores within ``rel_tol`` (relative) of
    the row's k-th score in ``logits``: a tie that a kernel summing in another order may break
    the other way. ``slack`` (float32 [R, N], or None): an absolute allowance per entry added to
    that tie, the larger of the differing key's and the k-th key's (a kernel's stated rounding,
    ``HEAD_SUM_TOL`` x ``ref_logit_sizes``, where ``logits`` are the float32 reference's)."""
    lo = starts.long() if starts is not None else torch.zeros(got.shape[0], dtype=torch.long, device=got.device)
    bad = 0
    unequal = (got.sort(dim=1).values != want.sort(dim=1).values).any(dim=1)
    for r in unequal.nonzero().flatten().tolist():
        g = set(got[r].tolist()) - {-1}
        w = set(want[r].tolist()) - {-1}
        if len(g) != len(w):
            bad += 1
            continue
        diff = sorted(g ^ w)
        if not diff:
            continue
        row = logits[r].float()
        cols = [i + int(lo[r]) for i in w]
        kth_col = cols[int(row[cols].argmin())]
        kth = float(row[kth_col])
        for i in diff:
            c = i + int(lo[r])
            allow = rel_tol * max(abs(kth), 1e-6)
            if slack is not None:
                allow += max(float(slack[r, c]), float(slack[r, kth_col]), 0.0)
            if abs(float(row[c]) - kth) > allow:
                bad += 1
                break
    return bad


def ref_topk_sort_keys(x: torch.Tensor, col_start: int = 0, base=None) -> torch.Tensor:
    """The int64 sort key of every entry of a float32 logits window [R, W] as ``topk_select`` builds
    them: the float's order-preserving int32 in the high half, 2**31-1 - (col_start + j - base[r])
    in the low half (lower index wins ties), INT64_MIN where the entry is -inf (invisible)."""
    b = x.contiguous().view(torch.int32)
    b = torch.where(b < 0, b ^ 0x7FFFFFFF, b).long()
    idx = torch.arange(x.shape[1], device=x.device)[None, :] + col_start
    if base is not None:
        idx = idx - base.long()[:, None]
    key = (b << 32) | (0x7FFFFFFF - idx)
    return torch.where(torch.isneginf(x), torch.full_like(key, -(1 << 63)), key)


def ref_paged_sparse_mqa_logits(q, q_sf, kv_cache, weights, seq_lens, page_table, blocks, block_size=8):
    """DeepSeek-V4.1's candidate-only logits from the logical inputs (not the schedule): q int8
    [rows, H, D/2] + int32 q_sf [rows, H] (FP4), the fused FP4 pool kv_cache [pages, page_size, 1,
    D/2+4], weights [rows, H], seq_lens int32 [rows], page_table int32 [rows, pages], blocks int32
    [rows, topk_blocks] (ascending logical block ids; the first min(topk_blocks, ceil(len / bs)) are
    read). Returns fp32 [rows, topk_blocks * bs]: column j scores position blocks[r, j // bs] * bs +
    j % bs; -inf at and past the row's valid length (the kept blocks back to back, the newest partial)."""
    rows, topk_blocks = blocks.shape
    qf = dequant_fp4(q, q_sf)  # [rows, H, D]
    d = qf.shape[-1]
    cache = dequant_paged_cache(kv_cache, d, True)  # [pages, page_size, d]
    page_size = cache.shape[1]
    out = torch.full((rows, topk_blocks * block_size), NEG_INF, device=qf.device)
    for r in range(rows):
        n = int(seq_lens[r])
        if n <= 0:
            continue
        kept = min(topk_blocks, -(-n // block_size))
        valid = block_size * (kept - 1) + (n - 1) % block_size + 1
        j = torch.arange(valid, device=qf.device)
        pos = blocks[r, j // block_size].long() * block_size + j % block_size
        k = cache[page_table[r, pos // page_size].long(), pos % page_size]  # [valid, d]
        out[r, :valid] = _scores(qf[r:r + 1], k, weights[r:r + 1])[0]
    return out


def ref_select_candidate_blocks(logits, ends, topk_blocks: int, block_size: int) -> torch.Tensor:
    """DeepSeek-V4.1's candidate-source block selection (vLLM 0.34's ``select_candidate_blocks``
    without DeepSelect) on row-local logits [R, W] (column c = position c), rows seeing positions
    < ends[r]: each block's maximum over its visible columns (NaN propagating; -inf without any),
    the newest block (ends[r] - 1) // block_size pinned to +inf, then ``torch.topk`` of min(K,
    nblocks) blocks; int64 [R, topk_blocks], a block whose score is -inf (and every slot past
    nblocks) -1."""
    r, w = logits.shape
    nblocks = -(-w // block_size)
    cols = torch.arange(nblocks * block_size, device=logits.device)
    padded = torch.full((r, nblocks * block_size), NEG_INF, device=logits.device)
    padded[:, :w] = logits.float()
    visible = cols[None, :] < ends.long().clamp(max=w)[:, None]
    padded = torch.where(visible, padded, torch.full_like(padded, NEG_INF))
    blocks = padded.view(r, nblocks, block_size)
    scores = blocks.amax(dim=2)  # NaN propagates (torch.amax does)
    pin = (ends.long() - 1).clamp(min=0) // block_size
    pinned = (ends.long() > 0) & (pin < nblocks)
    # a scatter, not indexing by the mask: no host sync, so a CUDA graph can capture it
    slot = pin.clamp(max=nblocks - 1)[:, None]
    scores.scatter_(1, slot, torch.where(pinned[:, None], float("inf"), scores.gather(1, slot)))
    k = min(topk_blocks, nblocks)
    top = scores.topk(k, dim=-1)
    out = torch.full((r, topk_blocks), -1, dtype=torch.int64, device=logits.device)
    out[:, :k] = torch.where(top.values != NEG_INF, top.indices, -1)
    return out


def ref_candidate_mask(logits, ends, candidates, block_size: int, fill: float = NEG_INF) -> torch.Tensor:
    """DeepSeek-V4.1's consumer mask (vLLM 0.34's ``apply_candidate_mask``) on row-local logits
    [R, W]: visible columns (c < ends[r]) whose block c // block_size is not among the row's
    candidates (entries < 0 ignored) become ``fill``, except column W - 1 when a candidate block
    starts at or past W; columns past a row's end become -inf. Returns a new tensor."""
    r, w = logits.shape
    nblocks = -(-w // block_size)
    flags = torch.zeros((r, nblocks + 2), dtype=torch.bool, device=logits.device)
    blk = candidates.long()
    blk = torch.where(blk * block_size >= w, nblocks, blk)
    blk = torch.where(blk < 0, nblocks + 1, blk)
    flags.scatter_(1, blk, True)
    cols = torch.arange(w, device=logits.device)
    visible = cols[None, :] < ends.long()[:, None]
    keep = flags[:, :nblocks].repeat_interleave(block_size, dim=1)[:, :w]
    keep = keep | ((cols == w - 1)[None, :] & flags[:, nblocks:nblocks + 1])
    out = logits.float().clone()
    out = torch.where(visible & ~keep, torch.full_like(out, fill), out)
    return torch.where(visible, out, torch.full_like(out, NEG_INF))

"""DeepSeek-V4.1's consumer indexer layers over their candidate keys only: the ``write=False``
form of :mod:`sm12x.kernels.indexer.candidate_topk` for long rows.

A consumer row keeps only the keys of its ``K`` candidate blocks (``K * block_size`` positions,
e.g. 512 x 8 = 4,096) plus vLLM's edge key, yet scoring every visible key and masking the rest
costs the whole row: at 1M tokens of context a decode row sees 262,144 compressed keys, 64 times
its candidates. Here each row's candidate positions are listed (blocks deduplicated, ascending),
their key rows are copied into a small per-row paged cache (DeepGEMM's fused layout, pages of
``PAGE`` tokens), and the fused paged top-k (:func:`fused_topk.paged_mqa_topk_indices`, one row
per "request") ranks them. The same per-key math runs on the same key bytes, so the scores are the
dense path's; the positions come back through the list.

Semantics are those of the dense consumer (see ``candidate_topk``'s docstring): a row returns
``min(visible, topk)`` positions, its candidate keys by descending score (equal scores: lower
position first), then, when fewer candidate keys are visible than that, the lowest visible
positions outside the candidates (the dense path's masked keys, tied at -FLT_MAX and taken lowest
position first); -1 after them.

Memory: O(group x candidate keys x bytes per key) for the gathered pages (``GROUP_BYTES`` per row
group) and O(group x (topk + candidate keys)) for the fill; nothing of the row's width. No host
sync: every shape comes from the call's shapes (CUDA-graph safe).
"""
from __future__ import annotations

import torch

from sm12x.kernels.indexer import fused_topk

PAGE = 64  # tokens per page of the gathered cache (a block_kv the paged kernels take)
# A consumer call takes this path when its width is at least this many times its candidate keys:
# then the dense path scores at least 4x the keys (per row up to its visible end) and the copy of
# the candidates' key rows (read once, written once, read again) is small beside it.
MIN_WIDTH_RATIO = 4
GROUP_BYTES = 128 << 20  # gathered pages of one row group
_FAR = 1 << 62  # sorts after every real position


def worthwhile(width: int, k_blocks: int, block_size: int) -> bool:
    """Whether a consumer call of this width is cheaper over its candidate keys only."""
    return k_blocks > 0 and width >= MIN_WIDTH_RATIO * (k_blocks * block_size + 1)


def candidate_positions(candidates: torch.Tensor, ends: torch.Tensor, width: int, block_size: int):
    """Per row, the visible positions the consumer ranks: int64 [rows, K*block_size + 1] ascending
    (``_FAR`` after them) and their int32 count [rows]. Candidate entries < 0 are ignored,
    duplicates count once; an entry starting at or past ``width`` adds the edge key ``width - 1``
    (vLLM's clamp); a position is visible below ``min(ends[r], width)``."""
    rows, k = candidates.shape
    nblocks = -(-width // block_size)
    blk = candidates.to(torch.int64)
    edge = ((blk >= 0) & (blk >= nblocks)).any(dim=1, keepdim=True)
    blk = torch.where((blk >= 0) & (blk < nblocks), blk, _FAR).sort(dim=1).values
    repeat = torch.zeros_like(blk, dtype=torch.bool)
    repeat[:, 1:] = blk[:, 1:] == blk[:, :-1]
    blk = torch.where(repeat, _FAR, blk)
    offs = torch.arange(block_size, dtype=torch.int64, device=blk.device)
    pos = (blk[:, :, None] * block_size + offs).reshape(rows, k * block_size)
    pos = torch.where(blk.repeat_interleave(block_size, dim=1) == _FAR, _FAR, pos)
    # the edge key counts once: not when the last block (which holds it) is a candidate itself
    last_in = (blk == nblocks - 1).any(dim=1, keepdim=True)
    pos = torch.cat([pos, torch.where(edge & ~last_in, width - 1, _FAR)], dim=1)
    limit = ends.to(torch.int64).clamp(max=width)[:, None]
    pos = torch.where(pos < limit, pos, _FAR).sort(dim=1).values
    return pos, (pos != _FAR).sum(dim=1).to(torch.int32)


def _gathered_cache(key_bytes: torch.Tensor, scale_bytes: torch.Tensor):
    """[rows, n, DB] value bytes and [rows, n, 4] scale bytes (n a multiple of PAGE) -> the fused
    uint8 cache [rows * n / PAGE, PAGE, 1, DB + 4] (per page: PAGE x DB values, then PAGE scales)
    and its block table int32 [rows, n / PAGE]."""
    rows, n, db = key_bytes.shape
    pages = rows * n // PAGE
    cache = torch.cat([key_bytes.reshape(pages, PAGE * db), scale_bytes.reshape(pages, PAGE * 4)], dim=1)
    table = torch.arange(pages, dtype=torch.int32, device=cache.device).view(rows, n // PAGE)
    return cache.view(pages, PAGE, 1, db + 4), table


def _padded(pos: torch.Tensor) -> torch.Tensor:
    n = pos.shape[1]
    pad = -(-n // PAGE) * PAGE - n
    return torch.nn.functional.pad(pos, (0, pad), value=_FAR) if pad else pos


def _fill_and_map(found: torch.Tensor, pos: torch.Tensor, count: torch.Tensor, visible: torch.Tensor,
                  topk: int, out: torch.Tensor):
    """``found`` int32 [rows, topk] (indices into ``pos``, -1 padded) -> positions in ``out``,
    then the lowest visible non-candidate positions up to ``min(visible, topk)``."""
    rows, device = found.shape[0], found.device
    mapped = pos.gather(1, found.clamp(min=0).to(torch.int64))
    got = count.clamp(max=topk).to(torch.int64)
    need = (visible.to(torch.int64).clamp(max=topk) - got).clamp(min=0)
    # the fill's positions lie below topk + (candidate keys): at most that many are candidates
    span = topk + pos.shape[1]
    is_cand = torch.zeros((rows, span + 1), dtype=torch.bool, device=device)
    is_cand.scatter_(1, torch.where(pos < span, pos, span), True)
    cols = torch.arange(span, dtype=torch.int64, device=device)
    free = ~is_cand[:, :span] & (cols < visible.to(torch.int64)[:, None])
    rank = free.cumsum(dim=1) - 1
    take = free & (rank < need[:, None])
    wide = torch.full((rows, topk + 1), -1, dtype=torch.int64, device=device)
    wide[:, :topk] = torch.where(found >= 0, mapped, -1)
    wide.scatter_(1, torch.where(take, got[:, None] + rank, topk), cols.expand(rows, span).clone())
    out.copy_(wide[:, :topk])


def _rank(q_rows, weights, key_bytes, scale_bytes, pos, count, visible, topk, out, workspace_bytes):
    cache, table = _gathered_cache(key_bytes, scale_bytes)
    found = fused_topk.paged_mqa_topk_indices(q_rows, cache, weights, count.view(-1, 1).contiguous(), table,
                                              key_bytes.shape[1], topk, workspace_bytes=workspace_bytes)
    _fill_and_map(found, pos, count, visible, topk, out)


def _group_rows(rows: int, n: int, bytes_per_key: int) -> int:
    return max(1, min(rows, GROUP_BYTES // max(1, n * (bytes_per_key + 24))))


def _row_q(q, r0, r1):
    """Rows r0:r1 of q (prefill [S, H, D], decode [B, next_n, H, D]; a tensor or (values,
    scale|None)) as a paged call's [rows, 1, H, D] (scales [rows, 1, H])."""
    def cut(t, lead):
        return t.reshape(-1, *t.shape[lead:])[r0:r1].unsqueeze(1).contiguous()
    if isinstance(q, (tuple, list)):
        return cut(q[0], -2), None if q[1] is None else cut(q[1], -1)
    return cut(q, -2)


def flat_consumer_topk(q, kv, weights, ks, ke, topk: int, width: int, block_size: int,
                       candidates: torch.Tensor, out: torch.Tensor, workspace_bytes: int) -> torch.Tensor:
    """Prefill consumer rows (``mqa_candidate_topk_indices`` arguments): row r's key at position
    ``rel`` is row ``ks[r] + rel`` of kv = (k [N, D or D/2], k_scale [N])."""
    k, k_sf = kv
    rows = weights.shape[0]
    if k.shape[0] == 0:  # no key: no row sees one
        return out.fill_(-1)
    kb, sb = k.view(torch.uint8), k_sf.contiguous().view(torch.uint8).view(k.shape[0], 4)
    step = _group_rows(rows, candidates.shape[1] * block_size + PAGE, kb.shape[1] + 4)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        visible = (ke[r0:r1] - ks[r0:r1]).clamp(min=0)
        pos, count = candidate_positions(candidates[r0:r1], visible, width, block_size)
        pos = _padded(pos)
        rows_k = ks[r0:r1].to(torch.int64)[:, None] + torch.where(pos == _FAR, 0, pos)
        rows_k = rows_k.clamp(0, max(k.shape[0] - 1, 0))
        _rank(_row_q(q, r0, r1), weights[r0:r1], kb[rows_k], sb[rows_k], pos, count,
              visible.clamp(max=width), topk, out[r0:r1], workspace_bytes)
    return out


def paged_consumer_topk(q, kv_cache, weights, context_lens, block_table, max_context_len: int, topk: int,
                        block_size: int, candidates: torch.Tensor, out: torch.Tensor,
                        workspace_bytes: int) -> torch.Tensor:
    """Decode consumer rows (``paged_mqa_candidate_topk_indices`` arguments): row b*next_n + t's
    position p sits in page ``block_table[b, p // block_kv]`` of the fused cache."""
    qv = q[0] if isinstance(q, (tuple, list)) else q
    next_n = qv.shape[1]
    rows = qv.shape[0] * next_n
    cache = kv_cache if kv_cache.dim() == 4 else kv_cache.unsqueeze(2)
    pages, block_kv, tok = cache.shape[0], cache.shape[1], cache.shape[3]
    db = tok - 4
    # values of page n start at n*stride(0) bytes, its scales after block_kv*DB of them: views of
    # the cache, so that only the candidates' rows are copied
    flat = torch.as_strided(cache.view(torch.uint8), (pages, block_kv * tok), (cache.stride(0), 1))
    values = flat[:, : block_kv * db].unflatten(1, (block_kv, db))
    scales = flat[:, block_kv * db:].unflatten(1, (block_kv, 4))
    ends = fused_topk.row_ends(context_lens, next_n, max_context_len)
    step = _group_rows(rows, candidates.shape[1] * block_size + PAGE, tok)
    step = max(next_n, step // next_n * next_n)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        pos, count = candidate_positions(candidates[r0:r1], ends[r0:r1], max_context_len, block_size)
        pos = _padded(pos)
        p = torch.where(pos == _FAR, 0, pos)
        req = (torch.arange(r0, r1, device=pos.device) // next_n)[:, None]
        # positions past a row's end read its first page (rows without one: page 0); never ranked
        page = block_table[req, p // block_kv].to(torch.int64).clamp(0, max(pages - 1, 0))
        off = p % block_kv
        _rank(_row_q(q, r0, r1), weights[r0:r1], values[page, off], scales[page, off], pos, count, ends[r0:r1],
              topk, out[r0:r1], workspace_bytes)
    return out

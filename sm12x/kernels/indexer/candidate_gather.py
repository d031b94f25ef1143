"""DeepSeek-V4.1's consumer indexer layers over their candidate keys only: the ``write=False``
form of :mod:`sm12x.kernels.indexer.candidate_topk` for long rows.

A consumer row keeps only the keys of its ``K`` candidate blocks (``K * block_size`` positions,
e.g. 512 x 8 = 4,096) plus vLLM's edge key, yet scoring every visible key and masking the rest
costs the whole row: at 1M tokens of context a decode row sees 262,144 compressed keys, 64 times
its candidates. Here:

1. each row's candidate blocks are sorted with invalid entries (< 0 or past the width) and
   repeats moved last (torch: a where, two sorts);
2. ``_gather_kernel`` lists the row's visible candidate positions ascending (whole blocks, the
   block holding the row's end cut there, then the edge key ``width - 1`` when an entry starts at
   or past the width, its block is not a candidate and the row sees it) and copies their key rows
   into a small per-row paged cache in DeepGEMM's fused layout (pages of ``PAGE`` tokens: values,
   then the 4-byte scales);
3. the fused paged top-k (:func:`fused_topk.paged_mqa_topk_indices`, one "request" per row, its
   length the row's candidate count) ranks them: the same per-key math on the same key bytes;
4. ``_map_fill_kernel`` maps the indices back to positions and, where a row has fewer visible
   candidate keys than ``min(visible, topk)``, appends the lowest visible positions outside them
   (the dense path's masked keys, tied at -FLT_MAX and taken lowest position first).

So a row returns, as the dense consumer does, ``min(visible, topk)`` positions: its candidate keys
by descending score (equal scores: lower position first), then that fill, -1 after them. Scores
may differ from the dense path's in the last bits where the two logits kernels sum in another
order (a tie at the k-th score may then break the other way); on sm_90, where the prefill
``mqa_logits`` rounds each head's score to bf16 (``head_mma``), by up to 2**-8 of the scores'
size: this path's head sums are float32, as every SM12x configuration's are.

Memory: per row group (``GROUP_BYTES``) the gathered pages and the positions, O(rows x candidate
keys); nothing of the row's width. No host sync: every shape comes from the call's shapes
(CUDA-graph safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.indexer import fused_topk

PAGE = 64  # tokens per page of the gathered cache (a block_kv the paged kernels take)
# A consumer call takes this path when its width is at least this many times its candidate keys:
# then the dense path scores up to 4x the keys per row (the width is vLLM's max_model_len or the
# chunk's longest row) and the copy of the candidates' key rows is small beside it.
MIN_WIDTH_RATIO = 4
GROUP_BYTES = 128 << 20  # gathered pages of one row group
FAR = 1 << 40  # an invalid block: sorts after every real one; FAR * block_size stays in int64
_FAR = tl.constexpr(FAR)
GATHER_SLOTS = 32  # positions per program of _gather_kernel
GATHER_WARPS = 8  # (4 warps, or 64 slots, spill a few bytes under Triton 3.6 or 3.9 on sm_120)
MAP_COLS = 256  # output columns per step of _map_fill_kernel's map
# the fill (rare: a row whose candidates hold fewer than topk visible keys): positions per step and
# candidate positions per step of their rank search, a [FILL_COLS, FILL_SCAN] compare within registers
FILL_COLS = 32
FILL_SCAN = 128


def worthwhile(width: int, k_blocks: int, block_size: int) -> bool:
    """Whether a consumer call of this width is cheaper over its candidate keys only."""
    return k_blocks > 0 and width >= MIN_WIDTH_RATIO * (k_blocks * block_size + 1)


@triton.jit
def _gather_kernel(blk_ptr, raw_ptr, k_blocks, ends_ptr, width, nblocks, val_ptr, sf_ptr, ks_ptr, table_ptr,
                   stride_t, stride_page, next_n, out_ptr, pos_ptr, count_ptr, n_pad,
                   BS: tl.constexpr, KP2: tl.constexpr, DB: tl.constexpr, BLOCK_KV: tl.constexpr,
                   PAGED: tl.constexpr, PG: tl.constexpr, SLOTS: tl.constexpr):
    """Row r, slots [SLOTS*j, +SLOTS) of its candidate list: positions (int32, -1 past the count),
    the count (program 0), and each listed key's DB value bytes and 4 scale bytes copied into
    page r * n_pad / PG + slot / PG of the gathered cache (int32 words)."""
    r = tl.program_id(0).to(tl.int64)
    kk = tl.arange(0, KP2)
    blk = tl.load(blk_ptr + r * k_blocks + kk, mask=kk < k_blocks, other=_FAR)
    raw = tl.load(raw_ptr + r * k_blocks + kk, mask=kk < k_blocks, other=-1).to(tl.int64)
    end = tl.minimum(tl.load(ends_ptr + r).to(tl.int64), width)
    # blocks are sorted, unique and real first, so only the last real one can be cut by the end
    seen = tl.where(blk < _FAR, tl.minimum(tl.maximum(end - blk * BS, 0), BS), 0)
    n_blk = tl.sum(seen, axis=0)
    edge = (tl.max(tl.where(raw >= nblocks, 1, 0), axis=0) > 0) & \
        (tl.max(tl.where(blk == nblocks - 1, 1, 0), axis=0) == 0) & (width - 1 < end)
    if tl.program_id(1) == 0:
        tl.store(count_ptr + r, (n_blk + edge.to(tl.int64)).to(tl.int32))
    j = tl.program_id(1) * SLOTS + tl.arange(0, SLOTS)
    pos, page = _slot_positions(j, blk_ptr + r * k_blocks, n_blk, edge, width, table_ptr + (r // next_n) * stride_t,
                                BS, BLOCK_KV, PAGED)
    tl.store(pos_ptr + r * n_pad + j, pos.to(tl.int32), mask=j < n_pad)
    dst = (r * n_pad + j - j % PG) * (DB + 4) // 4  # the word where the slot's page starts
    p = tl.maximum(pos, 0)
    if PAGED:  # DeepGEMM's fused pages: BLOCK_KV x DB value bytes, then BLOCK_KV scales
        sf_byte = page * stride_page + BLOCK_KV * DB + (p % BLOCK_KV) * 4
    else:  # row r's key at position p is row ks[r] + p of the flat keys
        sf_byte = (tl.load(ks_ptr + r).to(tl.int64) + p) * 4
    tl.store(out_ptr + dst + PG * DB // 4 + j % PG, tl.load(sf_ptr + sf_byte // 4, mask=pos >= 0, other=0),
             mask=j < n_pad)
    # The value words as a [SLOTS, DB/4] tile whose slot quantities are recomputed in 2-D (cached
    # loads): Triton 3.6 / 3.7 fail to lay out 1-D values that also feed [:, None] masks.
    w = tl.arange(0, DB // 4)
    j2 = j[:, None] + 0 * w[None, :]
    pos2, page2 = _slot_positions(j2, blk_ptr + r * k_blocks, n_blk, edge, width,
                                  table_ptr + (r // next_n) * stride_t, BS, BLOCK_KV, PAGED)
    p2 = tl.maximum(pos2, 0)
    if PAGED:
        val_byte = page2 * stride_page + (p2 % BLOCK_KV) * DB
    else:
        val_byte = (tl.load(ks_ptr + r).to(tl.int64) + p2) * DB
    vals = tl.load(val_ptr + val_byte // 4 + w[None, :], mask=pos2 >= 0, other=0)
    dst2 = (r * n_pad + j2 - j2 % PG) * (DB + 4) // 4 + (j2 % PG) * (DB // 4)
    tl.store(out_ptr + dst2 + w[None, :], vals, mask=j2 < n_pad)


@triton.jit
def _slot_positions(j, row_blk_ptr, n_blk, edge, width, row_table_ptr, BS: tl.constexpr, BLOCK_KV: tl.constexpr,
                    PAGED: tl.constexpr):
    """Slots j of a row's list: the position (-1 past the count) and, paged, its page (0 there)."""
    in_blk = j < n_blk
    b = tl.load(row_blk_ptr + j // BS, mask=in_blk, other=0)
    pos = tl.where(in_blk, b * BS + j % BS, tl.where((j == n_blk) & edge, width - 1, -1))
    page = pos * 0
    if PAGED:
        page = tl.load(row_table_ptr + tl.maximum(pos, 0) // BLOCK_KV, mask=pos >= 0, other=0).to(tl.int64)
    return pos, page


@triton.jit
def _map_fill_kernel(found_ptr, pos_ptr, count_ptr, ends_ptr, width, n_pad, topk, out_ptr, stride_o,
                     MAP: tl.constexpr, COLS: tl.constexpr, SCAN: tl.constexpr):
    """Row r: out[c] = pos[found[c]] (-1 where found[c] < 0), then, when the row sees more keys
    than it lists (up to topk), the lowest unlisted visible positions from column min(count,
    topk): the i-th is i + #{t : pos[t] - t <= i} (pos ascending, so pos[t] - t counts the free
    positions below pos[t])."""
    r = tl.program_id(0).to(tl.int64)
    count = tl.load(count_ptr + r)
    visible = tl.minimum(tl.load(ends_ptr + r), width)
    got = tl.minimum(count, topk)
    need = tl.maximum(tl.minimum(visible, topk) - got, 0)
    for c0 in range(0, topk, MAP):
        c = c0 + tl.arange(0, MAP)
        f = tl.load(found_ptr + r * topk + c, mask=c < topk, other=-1)
        p = tl.load(pos_ptr + r * n_pad + f, mask=(c < topk) & (f >= 0), other=-1)
        tl.store(out_ptr + r * stride_o + c, p, mask=c < topk)
    for i0 in range(0, need, COLS):  # no trip for almost every row (its candidates give topk keys)
        i = i0 + tl.arange(0, COLS)
        below = tl.zeros((COLS,), dtype=tl.int32)
        for t0 in range(0, count, SCAN):
            t = t0 + tl.arange(0, SCAN)
            free_before = tl.load(pos_ptr + r * n_pad + t, mask=t < count, other=0) - t
            hit = (free_before[None, :] <= i[:, None]) & (t < count)[None, :]
            below += tl.sum(hit.to(tl.int32), axis=1)
        tl.store(out_ptr + r * stride_o + got + i, i + below, mask=i < need)


def _sorted_blocks(candidates: torch.Tensor, nblocks: int) -> torch.Tensor:
    """int64 [rows, K]: each row's real candidate blocks ascending, each once, then FAR."""
    blk = candidates.to(torch.int64)
    blk = torch.where((blk >= 0) & (blk < nblocks), blk, FAR).sort(dim=1).values
    blk[:, 1:].masked_fill_(blk[:, 1:] == blk[:, :-1], FAR)
    return blk.sort(dim=1).values


def _rank_rows(q_rows, weights, candidates, ends, width, block_size, topk, out, workspace_bytes, *, values, scales,
               db, ks=None, table=None, stride_page=0, block_kv=PAGE, next_n=1):
    """One row group: list and gather (``_gather_kernel``), rank, map and fill into ``out``."""
    rows, k = candidates.shape
    device = candidates.device
    nblocks = -(-width // block_size)
    n_pad = -(-(k * block_size + 1) // PAGE) * PAGE
    blk = _sorted_blocks(candidates, nblocks)
    raw = candidates.contiguous()
    pos = torch.empty((rows, n_pad), dtype=torch.int32, device=device)
    count = torch.empty((rows,), dtype=torch.int32, device=device)
    cache = torch.empty((rows * n_pad // PAGE, PAGE, 1, db + 4), dtype=torch.uint8, device=device)
    paged = table is not None
    _gather_kernel[(rows, triton.cdiv(n_pad, GATHER_SLOTS))](
        blk, raw, k, ends, width, nblocks, values, scales, ks if ks is not None else ends,
        table if paged else ends, table.stride(0) if paged else 0, stride_page, next_n, cache.view(torch.int32),
        pos, count, n_pad, BS=block_size, KP2=triton.next_power_of_2(k), DB=db, BLOCK_KV=block_kv, PAGED=paged,
        PG=PAGE, SLOTS=GATHER_SLOTS, num_warps=GATHER_WARPS)
    own = torch.arange(rows * n_pad // PAGE, dtype=torch.int32, device=device).view(rows, n_pad // PAGE)
    found = fused_topk.paged_mqa_topk_indices(q_rows, cache, weights, count.view(rows, 1), own, n_pad, topk,
                                              workspace_bytes=workspace_bytes)
    _map_fill_kernel[(rows,)](found, pos, count, ends, width, n_pad, topk, out, out.stride(0), MAP=MAP_COLS,
                              COLS=FILL_COLS, SCAN=FILL_SCAN)


def _group_rows(rows: int, n: int, bytes_per_key: int, unit: int = 1) -> int:
    group = max(unit, GROUP_BYTES // max(1, n * (bytes_per_key + 8)) // unit * unit)
    return min(max(rows, 1), group)


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
    """Prefill consumer rows (``mqa_candidate_topk_indices`` arguments, checked there): row r's
    key at position ``rel`` is row ``ks[r] + rel`` of kv = (k [N, D or D/2], k_scale [N])."""
    k, k_sf = kv
    rows = weights.shape[0]
    if k.shape[0] == 0:  # no key: no row sees one
        return out.fill_(-1)
    db = k.shape[1] * k.element_size()
    step = _group_rows(rows, candidates.shape[1] * block_size + PAGE, db + 4)
    values, scales = k.view(torch.int32), k_sf.contiguous().view(torch.int32)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        ends = (ke[r0:r1] - ks[r0:r1]).clamp(min=0).to(torch.int32)
        _rank_rows(_row_q(q, r0, r1), weights[r0:r1], candidates[r0:r1], ends, width, block_size, topk,
                   out[r0:r1], workspace_bytes, values=values, scales=scales, db=db, ks=ks[r0:r1].contiguous())
    return out


def paged_consumer_topk(q, kv_cache, weights, context_lens, block_table, max_context_len: int, topk: int,
                        block_size: int, candidates: torch.Tensor, out: torch.Tensor,
                        workspace_bytes: int) -> torch.Tensor:
    """Decode consumer rows (``paged_mqa_candidate_topk_indices`` arguments, checked there): row
    b*next_n + t's position p sits in page ``block_table[b, p // block_kv]`` of the fused cache."""
    qv = q[0] if isinstance(q, (tuple, list)) else q
    next_n = qv.shape[1]
    rows = qv.shape[0] * next_n
    cache = kv_cache if kv_cache.dim() == 4 else kv_cache.unsqueeze(2)
    block_kv, db = cache.shape[1], cache.shape[3] - 4
    if cache.shape[0] == 0:  # no page: no row sees a key
        return out.fill_(-1)
    # the cache as int32 words from its first byte (stride(0) and the offset are multiples of 4)
    span = (cache.shape[0] - 1) * cache.stride(0) + block_kv * (db + 4)
    words = torch.as_strided(cache.view(torch.uint8), (span,), (1,)).view(torch.int32)
    ends = fused_topk.row_ends(context_lens, next_n, max_context_len)
    step = _group_rows(rows, candidates.shape[1] * block_size + PAGE, db + 4, next_n)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        b0 = r0 // next_n
        _rank_rows(_row_q(q, r0, r1), weights[r0:r1], candidates[r0:r1], ends[r0:r1], max_context_len, block_size,
                   topk, out[r0:r1], workspace_bytes, values=words, scales=words, db=db,
                   table=block_table[b0:b0 + (r1 - r0) // next_n], stride_page=cache.stride(0),
                   block_kv=block_kv, next_n=next_n)
    return out


def compile_reports(targets=("sm_120", "sm_121"), block_sizes=(64, 8), k_blocks=(18, 512)):
    """Compile the gather (FP8 and FP4 key rows, flat and paged; vLLM's V4.1 candidate shapes: 18
    blocks of 64, 512 of 8) and the map / fill kernel."""
    from sm12x.kernels.common.compile_check import compile_kernel

    gather_sig = {"blk_ptr": "*i64", "raw_ptr": "*i32", "k_blocks": "i32", "ends_ptr": "*i32", "width": "i32",
                  "nblocks": "i32", "val_ptr": "*i32", "sf_ptr": "*i32", "ks_ptr": "*i32", "table_ptr": "*i32",
                  "stride_t": "i64", "stride_page": "i64", "next_n": "i32", "out_ptr": "*i32", "pos_ptr": "*i32",
                  "count_ptr": "*i32", "n_pad": "i32", "BS": "constexpr", "KP2": "constexpr", "DB": "constexpr",
                  "BLOCK_KV": "constexpr", "PAGED": "constexpr", "PG": "constexpr", "SLOTS": "constexpr"}
    fill_sig = {"found_ptr": "*i32", "pos_ptr": "*i32", "count_ptr": "*i32", "ends_ptr": "*i32", "width": "i32",
                "n_pad": "i32", "topk": "i32", "out_ptr": "*i32", "stride_o": "i64", "MAP": "constexpr",
                "COLS": "constexpr", "SCAN": "constexpr"}
    reports = []
    for t in targets:
        for bs, kb in zip(block_sizes, k_blocks):
            for db in (128, 64):
                for paged in (False, True):
                    reports.append(compile_kernel(
                        _gather_kernel, gather_sig,
                        {"BS": bs, "KP2": triton.next_power_of_2(kb), "DB": db, "BLOCK_KV": 64, "PAGED": paged,
                         "PG": PAGE, "SLOTS": GATHER_SLOTS}, target=t, num_warps=GATHER_WARPS, num_stages=1,
                        config_name=f"candidate gather B{bs} K{kb} {'FP8' if db == 128 else 'FP4'} "
                                    f"{'paged' if paged else 'flat'}"))
        reports.append(compile_kernel(_map_fill_kernel, fill_sig, {"MAP": MAP_COLS, "COLS": FILL_COLS,
                                                                   "SCAN": FILL_SCAN},
                                      target=t, num_warps=4, num_stages=1, config_name="candidate map and fill"))
    return reports

"""Exact per-row top-k of a float32 matrix by radix select, returned as int64 sort keys.

Contract: ``row_topk_keys(x, k, col_start, base)`` with x float32 [R, W] (unit column stride,
-inf = a column the row cannot see), 1 <= k <= W. Returns int64 [R, k]: for the k largest values
of each row (equal values: lower column first), the key

    (order-preserving int32 of the float) << 32 | (2**31 - 1 - index),  index = col_start + c - base[r]

(``base`` int32 [R] or None for 0), and INT64_MIN for -inf values. With ``ends`` (int32 [R]),
columns whose position col_start + c is >= ends[r] are not read and count as -inf: a decode row
of a window far longer than its request reads only the request's keys. ``starts`` does the same
below starts[r]: a prefill row of a chunk of several requests reads only its own request's keys.
Keys compare like (value desc, index asc), so ``torch.topk`` / ``sort`` of them is a
deterministic ordering; the keys are returned in no particular order. This is the same key the
indexer's top-k merges.

How: 32 / RADIX_BITS passes over the row build histograms of successive digits of the
order-preserving uint32 image of each value, narrowing down to the exact k-th largest value T and
how many entries equal to T are needed; a last pass writes every entry > T and the first needed
entries == T (by column). Rows up to SEGMENT columns: one program per row does it all; given a
``floor`` key per row, it first counts the entries above it and, when there are at most k, writes
just those (two passes instead of five). Wider rows are cut into segments, one program each, so a
few long rows still fill the GPU:
each histogram pass is a launch whose programs add their segment's histogram into the row's (int32
atomics; every program re-derives the digits chosen so far from the earlier passes' histograms), a
count launch gives each segment its number of entries > T and == T, and the write launch places
each segment's entries after those of the segments before it. Segments are SEGMENT columns, or
narrower (down to BLOCK) when there are too few rows for that to give every SM two programs (one
row of 262,144 keys: 118 µs in 16 segments, 36 µs in 256; H200). Many rows much wider than k
(without a floor) can first go through ``topk_filter.topk_keys``: a threshold from a sample of
each row, and the passes above over only the entries that reach it. Memory: the output, plus
(4 + 2 * segments) int32 per row for wide rows (and the filter's candidate rows); no host sync
(CUDA-graph safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common.checks import require, require_dtype

OP = "row_topk_keys"
INT64_MIN = -(1 << 63)
BLOCK = 1024
NUM_WARPS = 8  # faster than 4 on long rows (docs/performance.md, "Tuning provenance")
RADIX_BITS = 8  # digit width of each histogram pass (32 / RADIX_BITS passes)
PASSES = 32 // RADIX_BITS
SEGMENT = 16384  # columns per program in the segmented path (wider rows are split)
NEG_INF_IMAGE = tl.constexpr(0x007FFFFF)  # _ordered_u32(-inf)


@triton.jit
def _ordered_u32(v):
    """float32 -> uint32 with the same order (-0.0 just below +0.0)."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, ~b, b ^ (-2147483648))
    return b.to(tl.uint32, bitcast=True)


@triton.jit
def sort_key(v, c, col_start, base):
    """The int64 sort key of value ``v`` at column ``c`` (see the module docstring)."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)  # signed order of the float
    idx = col_start + c - base
    key = (b.to(tl.int64) << 32) | (0x7FFFFFFF - idx).to(tl.int64)
    return tl.where(v == float("-inf"), -9223372036854775807 - 1, key)


@triton.jit
def _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS: tl.constexpr, HAS_ENDS: tl.constexpr):
    """Columns [lo, hi) of row r that are read: all W, or those from the row's start (``starts``)
    and before its end (``ends``); lo = hi = 0 when there are none."""
    hi = W
    if HAS_ENDS:
        hi = tl.minimum(W, tl.maximum(tl.load(ends_ptr + r) - col_start, 0))
    lo = hi * 0  # a zero of hi's type
    if HAS_STARTS:
        lo = tl.minimum(tl.maximum(tl.load(starts_ptr + r) - col_start, 0), hi)
        hi = tl.where(lo < hi, hi, 0)
        lo = tl.where(lo < hi, lo, 0)
    return lo, hi


@triton.jit
def _aligned(lo, BLOCK: tl.constexpr):
    """Where a loop over columns lo.. starts: lo rounded down to a multiple of BLOCK, so its
    loads stay vectorised (the columns before lo are masked off)."""
    return lo // BLOCK * BLOCK


@triton.jit
def _outside(g, lo, hi, SEGMENT: tl.constexpr):
    """Segment g holds none of the row's read columns [lo, hi) and is not its first (the one
    holding column lo): nothing to do (a row of a window far longer than its request, or of a
    chunk of several requests, has many such segments)."""
    return (g != lo // SEGMENT) & ((g * SEGMENT >= hi) | ((g + 1) * SEGMENT <= lo))


@triton.jit
def _segment_span(g, lo, hi, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """(first loop column, end) of segment g's share of the row's columns [lo, hi)."""
    return tl.maximum(_aligned(lo, BLOCK), g * SEGMENT), tl.minimum(hi, (g + 1) * SEGMENT)


@triton.jit
def _add_unread(hist, unread, prefix, pmask, shift, NBINS: tl.constexpr):
    """Count ``unread`` -inf entries (columns outside the row's range) into a digit histogram."""
    img = tl.full((), NEG_INF_IMAGE, tl.uint32)
    d = ((img >> shift) & (NBINS - 1)).to(tl.int32)
    take = ((img & pmask) == prefix) & (unread > 0)
    return hist + tl.where((tl.arange(0, NBINS) == d) & take, unread, 0)


@triton.jit
def _pad_unread(t, n_eq, need, first_eq, out_row, BLOCK: tl.constexpr):
    """When the k-th largest is -inf, the needed == T entries the real columns did not give are
    unread ones: their key is INT64_MIN."""
    if t == NEG_INF_IMAGE:
        for c0 in range(tl.minimum(n_eq, need), need, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            tl.store(out_row + first_eq + c, tl.full((BLOCK,), -9223372036854775807 - 1, tl.int64),
                     mask=c < need)


@triton.jit
def _write_keys(v, c, read, t, n_gt, n_eq, need, first_eq, col_start, base, out_row):
    """Store the keys of the entries of block ``v`` (columns ``c`` where ``read``) that are > T
    (image ``t``), after the ``n_gt`` already written, and of the entries == T whose rank among
    them (after ``n_eq`` earlier ones) is below ``need``, from slot ``first_eq`` on
    -> updated (n_gt, n_eq)."""
    u = _ordered_u32(v)
    gt = read & (u > t)
    eq = read & (u == t)
    pos_gt = n_gt + tl.cumsum(gt.to(tl.int32), 0) - 1
    rank_eq = n_eq + tl.cumsum(eq.to(tl.int32), 0) - 1
    key = sort_key(v, c, col_start, base)
    tl.store(out_row + pos_gt, key, mask=gt)
    tl.store(out_row + first_eq + rank_eq, key, mask=eq & (rank_eq < need))
    return n_gt + tl.sum(gt.to(tl.int32)), n_eq + tl.sum(eq.to(tl.int32))


@triton.jit
def _row_topk_keys_kernel(x_ptr, stride_x, W, base_ptr, col_start, out_ptr, stride_o, K, floor_ptr,
                          skip_ptr, starts_ptr, ends_ptr, cols_ptr, HAS_BASE: tl.constexpr, HAS_FLOOR: tl.constexpr,
                          HAS_SKIP: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_ENDS: tl.constexpr,
                          HAS_COLS: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr):
    r = tl.program_id(0)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    unread = W - (hi - lo)
    row = x_ptr + r.to(tl.int64) * stride_x
    base = 0
    if HAS_BASE:
        base = tl.load(base_ptr + r)
    out_row = out_ptr + r.to(tl.int64) * stride_o
    # With a floor, first count the entries above it: when they are no more than K, they are the
    # answer (written in column order, INT64_MIN after them) and the radix passes are skipped.
    floor = tl.full((), -9223372036854775807 - 1, tl.int64)
    above = K + 1
    if HAS_FLOOR:
        floor = tl.load(floor_ptr + r)
        counts = tl.zeros((BLOCK,), dtype=tl.int32)  # summed once after the loop, not per block
        for c0 in range(_aligned(lo, BLOCK), hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            read = (c >= lo) & (c < hi)
            v = tl.load(row + c, mask=read, other=float("-inf"))
            counts += (read & (sort_key(v, c, col_start, base) > floor)).to(tl.int32)
        above = tl.sum(counts)
    if above <= K:
        _write_above_floor(row, lo, hi, floor, above, K, col_start, base, out_row, BLOCK)
    else:
        _radix_select_row(row, lo, hi, unread, K, col_start, base, out_row, cols_ptr + r.to(tl.int64) * stride_x,
                          HAS_COLS, BLOCK, RADIX_BITS)


@triton.jit
def _write_above_floor(row, lo, hi, floor, above, K, col_start, base, out_row, BLOCK: tl.constexpr):
    """Write the keys > ``floor`` of a row's columns [lo, hi) in column order, then INT64_MIN up
    to K."""
    n = 0
    for c0 in range(_aligned(lo, BLOCK), hi, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < hi)
        v = tl.load(row + c, mask=read, other=float("-inf"))
        key = sort_key(v, c, col_start, base)
        take = read & (key > floor)
        tl.store(out_row + n + tl.cumsum(take.to(tl.int32), 0) - 1, key, mask=take)
        n += tl.sum(take.to(tl.int32))
    for c0 in range(above, K, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        tl.store(out_row + c, tl.full((BLOCK,), -9223372036854775807 - 1, tl.int64), mask=c < K)


@triton.jit
def _radix_select_row(row, lo, hi, unread, K, col_start, base, out_row, cols_row, HAS_COLS: tl.constexpr,
                      BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr):
    """The K best keys of one row by radix select (see the module docstring); columns [lo, hi)
    are read, ``unread`` more count as -inf. With HAS_COLS the keys name column cols_row[c] for
    entry c (a row of candidates gathered from a wider row, ``topk_filter``)."""
    NBINS: tl.constexpr = 1 << RADIX_BITS
    bins = tl.arange(0, NBINS)
    prefix = tl.zeros((), dtype=tl.uint32)
    pmask = tl.zeros((), dtype=tl.uint32)
    need = K  # entries still to take at or below the current prefix
    for p in tl.static_range(32 // RADIX_BITS):
        shift = 32 - RADIX_BITS * (p + 1)
        hist = tl.zeros((NBINS,), dtype=tl.int32)
        for c0 in range(_aligned(lo, BLOCK), hi, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            read = (c >= lo) & (c < hi)
            u = _ordered_u32(tl.load(row + c, mask=read, other=float("-inf")))
            sel = read & ((u & pmask) == prefix)
            digit = ((u >> shift) & (NBINS - 1)).to(tl.int32)
            # excluded entries are counted in bin 0 and taken out again (no masked histogram)
            hist += tl.histogram(tl.where(sel, digit, 0), NBINS)
            hist -= tl.where(bins == 0, tl.sum(tl.where(sel, 0, 1)), 0)
        hist = _add_unread(hist, unread, prefix, pmask, shift, NBINS)
        # the digit d of the k-th largest: count(digit >= d) >= need > count(digit > d)
        at_or_above = tl.sum(hist) - tl.cumsum(hist, 0) + hist
        d = tl.sum((at_or_above >= need).to(tl.int32)) - 1
        need -= tl.sum(tl.where(bins > d, hist, 0))
        prefix = prefix | (d.to(tl.uint32) << shift)
        pmask = pmask | (tl.full((), NBINS - 1, tl.uint32) << shift)
    # prefix is now the k-th largest value's image; take all above it and `need` equal ones
    n_gt = 0
    n_eq = 0
    first_eq = K - need
    for c0 in range(_aligned(lo, BLOCK), hi, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < hi)
        v = tl.load(row + c, mask=read, other=float("-inf"))
        if HAS_COLS:
            c = tl.load(cols_row + c, mask=read, other=0)
        n_gt, n_eq = _write_keys(v, c, read, prefix, n_gt, n_eq, need, first_eq, col_start, base,
                                 out_row)
    _pad_unread(prefix, n_eq, need, first_eq, out_row, BLOCK)


@triton.jit
def _digits_so_far(hist_ptr, r, R, K, P: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Replay passes 0..P-1 of row r from their histograms -> (prefix, pmask, need)."""
    NBINS: tl.constexpr = 1 << RADIX_BITS
    bins = tl.arange(0, NBINS)
    prefix = tl.zeros((), dtype=tl.uint32)
    pmask = tl.zeros((), dtype=tl.uint32)
    need = K
    for p in tl.static_range(P):
        shift = 32 - RADIX_BITS * (p + 1)
        hist = tl.load(hist_ptr + (p * R + r).to(tl.int64) * NBINS + bins)
        at_or_above = tl.sum(hist) - tl.cumsum(hist, 0) + hist
        d = tl.sum((at_or_above >= need).to(tl.int32)) - 1
        need -= tl.sum(tl.where(bins > d, hist, 0))
        prefix = prefix | (d.to(tl.uint32) << shift)
        pmask = pmask | (tl.full((), NBINS - 1, tl.uint32) << shift)
    return prefix, pmask, need


@triton.jit
def _segment_hist_kernel(x_ptr, stride_x, W, hist_ptr, R, K, skip_ptr, starts_ptr, ends_ptr, col_start,
                         P: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
                         HAS_SKIP: tl.constexpr, HAS_STARTS: tl.constexpr, HAS_ENDS: tl.constexpr):
    """Pass P: add the digit histogram of one segment of row r into hist[P, r] (the row's first
    segment also counts its unread columns)."""
    r = tl.program_id(0)
    g = tl.program_id(1)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    if _outside(g, lo, hi, SEGMENT):
        return
    row = x_ptr + r.to(tl.int64) * stride_x
    NBINS: tl.constexpr = 1 << RADIX_BITS
    bins = tl.arange(0, NBINS)
    prefix, pmask, need = _digits_so_far(hist_ptr, r, R, K, P, RADIX_BITS)
    shift: tl.constexpr = 32 - RADIX_BITS * (P + 1)
    hist = tl.zeros((NBINS,), dtype=tl.int32)
    if g == lo // SEGMENT:
        hist = _add_unread(hist, W - (hi - lo), prefix, pmask, shift, NBINS)
    start, end = _segment_span(g, lo, hi, SEGMENT, BLOCK)
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < end)
        u = _ordered_u32(tl.load(row + c, mask=read, other=float("-inf")))
        sel = read & ((u & pmask) == prefix)
        digit = ((u >> shift) & (NBINS - 1)).to(tl.int32)
        hist += tl.histogram(tl.where(sel, digit, 0), NBINS)
        hist -= tl.where(bins == 0, tl.sum(tl.where(sel, 0, 1)), 0)
    tl.atomic_add(hist_ptr + (P * R + r).to(tl.int64) * NBINS + bins, hist)


@triton.jit
def _segment_count_kernel(x_ptr, stride_x, W, hist_ptr, R, K, cnt_ptr, G, skip_ptr, starts_ptr, ends_ptr,
                          col_start, PASSES: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr,
                          RADIX_BITS: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_STARTS: tl.constexpr,
                          HAS_ENDS: tl.constexpr):
    """Entries > T and == T in one segment of row r -> cnt[r, g, 0:2] (segments past the read
    columns store nothing: no write program reads them)."""
    r = tl.program_id(0)
    g = tl.program_id(1)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    if _outside(g, lo, hi, SEGMENT):
        return
    row = x_ptr + r.to(tl.int64) * stride_x
    t, _, need = _digits_so_far(hist_ptr, r, R, K, PASSES, RADIX_BITS)
    n_gt = 0
    n_eq = 0
    start, end = _segment_span(g, lo, hi, SEGMENT, BLOCK)
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < end)
        u = _ordered_u32(tl.load(row + c, mask=read, other=float("-inf")))
        n_gt += tl.sum((read & (u > t)).to(tl.int32))
        n_eq += tl.sum((read & (u == t)).to(tl.int32))
    cnt = cnt_ptr + (r.to(tl.int64) * G + g) * 2
    tl.store(cnt, n_gt)
    tl.store(cnt + 1, n_eq)


@triton.jit
def _segment_write_kernel(x_ptr, stride_x, W, hist_ptr, R, K, cnt_ptr, G, base_ptr, col_start,
                          out_ptr, stride_o, skip_ptr, starts_ptr, ends_ptr, HAS_BASE: tl.constexpr,
                          PASSES: tl.constexpr, SEGMENT: tl.constexpr, G_POW2: tl.constexpr, BLOCK: tl.constexpr,
                          RADIX_BITS: tl.constexpr, HAS_SKIP: tl.constexpr, HAS_STARTS: tl.constexpr,
                          HAS_ENDS: tl.constexpr):
    """Write the keys of one segment's entries > T and of its share of the needed == T ones
    (the last segment with read columns also the unread columns' share)."""
    r = tl.program_id(0)
    g = tl.program_id(1)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    if _outside(g, lo, hi, SEGMENT):
        return
    row = x_ptr + r.to(tl.int64) * stride_x
    t, _, need = _digits_so_far(hist_ptr, r, R, K, PASSES, RADIX_BITS)
    before = tl.arange(0, G_POW2)
    counted = (before < g) & (before >= lo // SEGMENT)  # earlier segments with read columns
    cnt = cnt_ptr + (r.to(tl.int64) * G + before) * 2
    n_gt = tl.sum(tl.load(cnt, mask=counted, other=0))      # > T in earlier segments
    n_eq = tl.sum(tl.load(cnt + 1, mask=counted, other=0))  # == T in earlier segments
    base = 0
    if HAS_BASE:
        base = tl.load(base_ptr + r)
    out_row = out_ptr + r.to(tl.int64) * stride_o
    first_eq = K - need
    start, end = _segment_span(g, lo, hi, SEGMENT, BLOCK)
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < end)
        v = tl.load(row + c, mask=read, other=float("-inf"))
        n_gt, n_eq = _write_keys(v, c, read, t, n_gt, n_eq, need, first_eq, col_start, base,
                                 out_row)
    if HAS_STARTS or HAS_ENDS:
        if g == tl.maximum(tl.cdiv(hi, SEGMENT) - 1, 0):  # n_eq now counts all the row's == T
            _pad_unread(t, n_eq, need, first_eq, out_row, BLOCK)


def segment_width(rows: int, width: int, device) -> int:
    """Columns per program: ``width`` itself up to SEGMENT (one program per row; cutting 256
    rows of 10,688 into two segments each was slower on the H200: 129 µs in the segment launches
    against 93-101 in one), else
    SEGMENT halved (not below BLOCK) while the rows' segments would give fewer than two programs
    per SM."""
    from sm12x.kernels.common import configs

    if width <= SEGMENT:
        return width
    sms = configs.sm_count(device)
    seg = SEGMENT
    while seg // 2 >= BLOCK and rows * triton.cdiv(width, seg) < 2 * sms:
        seg //= 2
    return seg


def validate(x, k, base=None, out=None, floor=None, skip=None, ends=None, starts=None, cols=None):
    """Check ``row_topk_keys``'s arguments (raising ValueError naming the argument); returns
    ``out``, allocated when None."""
    require_dtype(x, (torch.float32,), OP, "x")
    require(x.dim() == 2 and x.stride(1) == 1, OP, "x",
            lambda: f"shape {list(x.shape)} strides {tuple(x.stride())}",
            "a [R, W] matrix with unit column stride")
    require(isinstance(k, int) and 1 <= k <= x.shape[1], OP, "k", k, lambda: f"1 <= k <= W ({x.shape[1]})")
    if base is not None:
        require_dtype(base, (torch.int32,), OP, "base")
        require(base.shape == (x.shape[0],) and base.stride(0) == 1, OP, "base",
                lambda: f"shape {list(base.shape)}", lambda: f"contiguous [{x.shape[0]}]")
    if floor is not None:
        require_dtype(floor, (torch.int64,), OP, "floor")
        require(floor.shape == (x.shape[0],) and floor.stride(0) == 1, OP, "floor",
                lambda: f"shape {list(floor.shape)}", lambda: f"contiguous [{x.shape[0]}]")
    for name, t in (("skip", skip), ("ends", ends), ("starts", starts)):
        if t is not None:
            require_dtype(t, (torch.int32,), OP, name)
            require(t.shape == (x.shape[0],) and t.stride(0) == 1, OP, name,
                    lambda: f"shape {list(t.shape)}", lambda: f"contiguous [{x.shape[0]}]")
    if out is None:
        out = torch.empty((x.shape[0], k), dtype=torch.int64, device=x.device)
    require(out.shape == (x.shape[0], k) and out.dtype == torch.int64 and out.stride(1) == 1, OP,
            "out", lambda: f"{out.dtype} {list(out.shape)}", lambda: f"int64 [{x.shape[0]}, {k}]")
    w = x.shape[1]
    if cols is not None:
        require(cols.dtype == torch.int32 and cols.shape == x.shape and cols.stride() == x.stride()
                and w <= SEGMENT and floor is None, OP, "cols", lambda: f"{cols.dtype} {list(cols.shape)}",
                f"int32 of x's shape and strides, at most {SEGMENT} columns, no floor")
    return out


def row_topk_keys(x: torch.Tensor, k: int, col_start: int = 0, base: torch.Tensor | None = None,
                  out: torch.Tensor | None = None, floor: torch.Tensor | None = None,
                  skip: torch.Tensor | None = None, ends: torch.Tensor | None = None,
                  starts: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> torch.Tensor:
    """Keys of the k largest entries of each row of ``x`` (see the module docstring).
    ``floor`` (int64 [R], optional): only entries whose key is > floor[r] count; rows with fewer
    than k of them are padded with INT64_MIN. A running top-k passes its k-th best key here:
    then most windows skip the radix passes (one counting pass and one writing pass instead).
    ``skip`` (int32 [R], optional): rows r with skip[r] != 0 need no answer: they are not read and
    their out rows are left as they are. ``ends`` / ``starts`` (int32 [R], optional): row r reads
    only the columns c with starts[r] <= col_start + c < ends[r]; the others count as -inf.
    ``cols`` (int32, x's shape and strides; rows of at most SEGMENT columns, no floor): the keys
    name column cols[r, c] for entry c (``topk_filter``'s candidate rows).
    ``topk_filter.topk_keys`` takes the same call without floor, skip or cols and first filters
    candidates where many rows are much wider than k (the same keys)."""
    out = validate(x, k, base, out, floor, skip, ends, starts, cols)
    r, w = x.shape
    if r == 0:
        return out
    base_arg = base if base is not None else x
    ends_arg = ends if ends is not None else x
    starts_arg = starts if starts is not None else x
    seg = segment_width(r, w, x.device)
    if seg >= w:
        _row_topk_keys_kernel[(r,)](
            x, x.stride(0), w, base_arg, col_start, out, out.stride(0), k,
            floor if floor is not None else out, skip if skip is not None else base_arg, starts_arg, ends_arg,
            cols if cols is not None else base_arg,
            HAS_BASE=base is not None, HAS_FLOOR=floor is not None, HAS_SKIP=skip is not None,
            HAS_STARTS=starts is not None, HAS_ENDS=ends is not None, HAS_COLS=cols is not None, BLOCK=BLOCK,
            RADIX_BITS=RADIX_BITS, num_warps=NUM_WARPS)
        return out
    g = triton.cdiv(w, seg)
    # Wide rows: the floor is only a shortcut, and this path does not take it (the keys <= floor
    # it may return lose to the running top-k that set the floor anyway).
    hist = torch.zeros((PASSES, r, 1 << RADIX_BITS), dtype=torch.int32, device=x.device)
    cnt = torch.empty((r, g, 2), dtype=torch.int32, device=x.device)
    skip_arg = skip if skip is not None else cnt
    common = dict(SEGMENT=seg, BLOCK=BLOCK, RADIX_BITS=RADIX_BITS, HAS_SKIP=skip is not None,
                  HAS_STARTS=starts is not None, HAS_ENDS=ends is not None, num_warps=NUM_WARPS)
    for p in range(PASSES):
        _segment_hist_kernel[(r, g)](x, x.stride(0), w, hist, r, k, skip_arg, starts_arg, ends_arg, col_start,
                                     P=p, **common)
    _segment_count_kernel[(r, g)](x, x.stride(0), w, hist, r, k, cnt, g, skip_arg, starts_arg, ends_arg,
                                  col_start, PASSES=PASSES, **common)
    _segment_write_kernel[(r, g)](
        x, x.stride(0), w, hist, r, k, cnt, g, base_arg, col_start, out, out.stride(0), skip_arg, starts_arg,
        ends_arg,
        HAS_BASE=base is not None, PASSES=PASSES, G_POW2=triton.next_power_of_2(g), **common)
    return out


def compile_reports(targets=("sm_120", "sm_121")):
    """Compile the kernels for ``targets`` -> list of CompileReport."""
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets))
    rows = {"x_ptr": "*fp32", "stride_x": "i64", "W": "i32", "starts_ptr": "*i32", "ends_ptr": "*i32",
            "col_start": "i32"}
    seg = {**rows, "hist_ptr": "*i32", "R": "i32", "K": "i32", "skip_ptr": "*i32"}
    consts = {"BLOCK": BLOCK, "RADIX_BITS": RADIX_BITS}
    row = {**rows, "base_ptr": "*i32", "out_ptr": "*i64", "stride_o": "i64", "K": "i32", "floor_ptr": "*i64",
           "skip_ptr": "*i32", "cols_ptr": "*i32"}
    kernels = []
    for starts, ends in ((False, False), (False, True), (True, True)):  # whole rows, decode, prefill
        tag = (" starts" if starts else "") + (" ends" if ends else "")
        ranged = {"HAS_STARTS": starts, "HAS_ENDS": ends}
        kernels.append((_row_topk_keys_kernel, row,
                        {"HAS_BASE": True, "HAS_FLOOR": True, "HAS_SKIP": True, "HAS_COLS": False, **ranged},
                        "row" + tag))
        for width in (SEGMENT, BLOCK):  # segment_width's range
            sized = {"SEGMENT": width, "HAS_SKIP": True, **ranged}
            kernels += [
                (_segment_hist_kernel, seg, {**sized, "P": PASSES - 1}, f"segment histogram{tag} S{width}"),
                (_segment_count_kernel, {**seg, "cnt_ptr": "*i32", "G": "i32"}, {**sized, "PASSES": PASSES},
                 f"segment count{tag} S{width}"),
                (_segment_write_kernel, {**seg, "cnt_ptr": "*i32", "G": "i32", "base_ptr": "*i32",
                                         "out_ptr": "*i64", "stride_o": "i64"},
                 {**sized, "HAS_BASE": True, "PASSES": PASSES, "G_POW2": 256 if width == BLOCK else 64},
                 f"segment write{tag} S{width}"),
            ]
    # topk_filter's candidate rows: ends, a column map, no floor
    kernels.append((_row_topk_keys_kernel, row,
                    {"HAS_BASE": True, "HAS_FLOOR": False, "HAS_SKIP": True, "HAS_COLS": True, "HAS_STARTS": False,
                     "HAS_ENDS": True}, "row candidates"))
    reports = []
    for fn, sig, const, name in kernels:
        const = {**const, **consts}
        full = {**sig, **{k: "constexpr" for k in const}}
        full = {n: full[n] for n in fn.arg_names}
        for t in targets:
            reports.append(compile_kernel(fn, full, const, target=t, num_warps=NUM_WARPS,
                                          num_stages=1, config_name=f"{name} B{BLOCK}"))
    return reports

"""The radix select's candidate filter: a threshold from a sample of each row, then the radix
passes over only the entries that reach it.

Contract: ``filtered_topk_keys(x, k, col_start, base, out, ends, starts, cap)`` writes the same
keys into ``out`` as ``topk_select.row_topk_keys(x, k, col_start, base, out=out, ends=ends,
starts=starts)`` would (arguments as there; ``cap`` from :func:`capacity`). No host sync.

Why: the select's histogram passes cost per entry they read, not per byte (H200: one pass over
[256, 262,144] float32 takes about 330 µs against about 70 µs to read it; cheaper ways to build
the histogram did not change that). So the passes should see
fewer entries.

How, per row (columns [lo, hi) visible, n of them):
1. SAMPLE evenly spaced visible entries are sorted; the j-th largest is the threshold t, with j
   (``sample_rank``) k SAMPLE / n plus room for the sample's spread: the number of entries that
   reach t falls below k about as rarely as a normal variable 5 standard deviations out. Where
   that would keep more than half the row, the row takes all its entries instead (t below every
   value) if it has at most ``cap``.
2. A counting pass finds how many entries are >= t, per segment of the row (wide rows spread over
   the GPU as in the segmented select).
3. When that count is at most ``cap``, and at least k (or the row takes all its entries), a
   gathering pass writes those entries and their columns, in column order, into a [R, cap]
   candidate row. Every key of the top k is then >= t, so the radix select over the candidates
   (``row_topk_keys(..., cols=)``) gives the row's answer; candidates in column order keep equal
   values' lower columns first.
4. Other rows (a sample far off, or more than ``cap`` entries tied at t) take the full radix
   select over the row.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from sm12x.kernels.indexer.topk_select import (BLOCK, NUM_WARPS, SEGMENT, _ordered_u32, _outside, _read_range, _segment_span,
                                       row_topk_keys, segment_width, validate)

SAMPLE = 1024  # entries sampled per row
SPREAD = 2.5  # half the standard deviations of room in the threshold's sample rank (``sample_rank``)
MIN_ROWS = 16  # fewer rows: the candidates' select runs on too few programs to pay for the passes


def sample_rank(k: int, n: int) -> int:
    """1-based rank in the sorted sample of a row of n entries that gives its threshold: r with
    r - 2 SPREAD sqrt(r) = k SAMPLE / n (the sample's expected count above the k-th largest plus
    2 SPREAD standard deviations of a count with mean r); the kernel computes the same."""
    return min(math.ceil((SPREAD + math.sqrt(SPREAD * SPREAD + k * SAMPLE / n)) ** 2), SAMPLE)


def capacity(rows: int, width: int, k: int) -> int:
    """Candidate columns per row for a filtered top-k of [rows, width], or 0 where the filter does
    not pay: the entries expected to reach the threshold in a row of ``width`` visible entries
    (the most) plus 2 SPREAD of their standard deviations, in BLOCKs; at most half the row and
    one row-kernel row (SEGMENT)."""
    rank = sample_rank(k, width)
    want = width * rank / SAMPLE * (1 + 2 * SPREAD / math.sqrt(rank))
    cap = math.ceil(want / BLOCK) * BLOCK
    return cap if rows >= MIN_ROWS and 2 * cap <= width and cap <= SEGMENT else 0


@triton.jit
def _threshold_kernel(x_ptr, stride_x, W, starts_ptr, ends_ptr, col_start, K, thr_ptr,
                      HAS_STARTS: tl.constexpr, HAS_ENDS: tl.constexpr, SAMPLE: tl.constexpr,
                      SPREAD: tl.constexpr):
    """thr[r]: the image of the j-th largest of SAMPLE evenly spaced visible entries, when that
    keeps at most half of them (and the row has SAMPLE entries); else 0, below every value (the
    row then takes all its entries, if the candidate row holds them)."""
    r = tl.program_id(0)
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    n = hi - lo
    root = SPREAD + tl.sqrt(SPREAD * SPREAD + (K * SAMPLE).to(tl.float32) / tl.maximum(n, 1).to(tl.float32))
    rank = tl.ceil(root * root).to(tl.int32)  # sample_rank
    t = tl.zeros((), dtype=tl.uint32)
    if (n >= SAMPLE) & (2 * rank <= SAMPLE):
        i = tl.arange(0, SAMPLE)
        pos = lo + (i.to(tl.int64) * n // SAMPLE).to(tl.int32)
        u = tl.sort(_ordered_u32(tl.load(x_ptr + r.to(tl.int64) * stride_x + pos)), descending=True)
        t = tl.max(tl.where(i == rank - 1, u, 0))
    tl.store(thr_ptr + r, t.to(tl.int32, bitcast=True))


@triton.jit
def _count_kernel(x_ptr, stride_x, W, starts_ptr, ends_ptr, col_start, thr_ptr, cnt_ptr, G, total_ptr,
                  HAS_STARTS: tl.constexpr, HAS_ENDS: tl.constexpr, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Entries of segment g of row r at or above thr[r] -> cnt[r, g], added into total[r]."""
    r = tl.program_id(0)
    g = tl.program_id(1)
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    if _outside(g, lo, hi, SEGMENT):
        return
    row = x_ptr + r.to(tl.int64) * stride_x
    t = tl.load(thr_ptr + r).to(tl.uint32, bitcast=True)
    start, end = _segment_span(g, lo, hi, SEGMENT, BLOCK)
    counts = tl.zeros((BLOCK,), dtype=tl.int32)
    for c0 in range(start, end, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        read = (c >= lo) & (c < end)
        u = _ordered_u32(tl.load(row + c, mask=read, other=float("-inf")))
        counts += (read & (u >= t)).to(tl.int32)
    n = tl.sum(counts)
    tl.store(cnt_ptr + r.to(tl.int64) * G + g, n)
    tl.atomic_add(total_ptr + r, n)


@triton.jit
def _gather_kernel(x_ptr, stride_x, W, starts_ptr, ends_ptr, col_start, K, CAP, thr_ptr, cnt_ptr, G, total_ptr,
                   vals_ptr, cols_ptr, stride_c, ok_ptr, full_ptr, cand_end_ptr, HAS_STARTS: tl.constexpr,
                   HAS_ENDS: tl.constexpr, SEGMENT: tl.constexpr, G_POW2: tl.constexpr, BLOCK: tl.constexpr):
    """Segment g's entries at or above thr[r] and their columns -> the row's candidates, after those of
    the segments before it, when the row's count suits (ok[r] = 1, full[r] = 0; else the reverse);
    cand_end[r] = col_start + the row's count (the candidates' ``ends``)."""
    r = tl.program_id(0)
    g = tl.program_id(1)
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    if _outside(g, lo, hi, SEGMENT):
        return
    t = tl.load(thr_ptr + r).to(tl.uint32, bitcast=True)
    total = tl.load(total_ptr + r)
    good = (total <= CAP) & ((total >= K) | (t == 0))
    if g == lo // SEGMENT:  # the row's first segment records the outcome
        tl.store(ok_ptr + r, good.to(tl.int32))
        tl.store(full_ptr + r, 1 - good.to(tl.int32))
        tl.store(cand_end_ptr + r, col_start + total)
    if good:
        before = tl.arange(0, G_POW2)
        counted = (before < g) & (before >= lo // SEGMENT)  # earlier segments with read columns
        n = tl.sum(tl.load(cnt_ptr + r.to(tl.int64) * G + before, mask=counted, other=0))
        row = x_ptr + r.to(tl.int64) * stride_x
        start, end = _segment_span(g, lo, hi, SEGMENT, BLOCK)
        for c0 in range(start, end, BLOCK):
            c = c0 + tl.arange(0, BLOCK)
            read = (c >= lo) & (c < end)
            v = tl.load(row + c, mask=read, other=float("-inf"))
            take = read & (_ordered_u32(v) >= t)
            at = r.to(tl.int64) * stride_c + n + tl.cumsum(take.to(tl.int32), 0) - 1
            tl.store(vals_ptr + at, v, mask=take)
            tl.store(cols_ptr + at, c, mask=take)
            n += tl.sum(take.to(tl.int32))


def topk_keys(x, k, col_start=0, base=None, out=None, ends=None, starts=None):
    """``topk_select.row_topk_keys(x, k, col_start, base, out=out, ends=ends, starts=starts)``, the
    same keys, through the candidate filter where ``capacity`` says it pays (many rows much wider
    than k), else straight to the radix select."""
    out = validate(x, k, base, out, ends=ends, starts=starts)
    cap = capacity(x.shape[0], x.shape[1], k) if x.shape[0] else 0
    if not cap:
        return row_topk_keys(x, k, col_start, base, out=out, ends=ends, starts=starts)
    return filtered_topk_keys(x, k, col_start, base, out, ends, starts, cap)


def filtered_topk_keys(x, k, col_start, base, out, ends, starts, cap):
    """See the module docstring (inputs already validated)."""
    r, w = x.shape
    dev = x.device
    seg = segment_width(r, w, dev)
    g = triton.cdiv(w, seg)
    ints = torch.empty((5, r), dtype=torch.int32, device=dev)  # threshold, ok, full, candidates' end, total
    thr, ok, full, cand_end, total = ints
    total.zero_()
    cnt = torch.empty((r, g), dtype=torch.int32, device=dev)
    cands = torch.empty((2, r, cap), dtype=torch.int32, device=dev)
    vals, cols = cands[0].view(torch.float32), cands[1]
    starts_arg = starts if starts is not None else ints
    ends_arg = ends if ends is not None else ints
    ranged = dict(HAS_STARTS=starts is not None, HAS_ENDS=ends is not None)
    _threshold_kernel[(r,)](x, x.stride(0), w, starts_arg, ends_arg, col_start, k, thr, **ranged,
                            SAMPLE=SAMPLE, SPREAD=SPREAD, num_warps=NUM_WARPS)
    _count_kernel[(r, g)](x, x.stride(0), w, starts_arg, ends_arg, col_start, thr, cnt, g, total, **ranged,
                          SEGMENT=seg, BLOCK=BLOCK, num_warps=NUM_WARPS)
    _gather_kernel[(r, g)](x, x.stride(0), w, starts_arg, ends_arg, col_start, k, cap, thr, cnt, g, total, vals,
                           cols, vals.stride(0), ok, full, cand_end, **ranged, SEGMENT=seg,
                           G_POW2=triton.next_power_of_2(g), BLOCK=BLOCK, num_warps=NUM_WARPS)
    row_topk_keys(vals, k, col_start, base, out=out, skip=full, ends=cand_end, cols=cols)
    return row_topk_keys(x, k, col_start, base, out=out, skip=ok, ends=ends, starts=starts)


def compile_reports(targets=("sm_120", "sm_121")):
    """Compile the filter's kernels for ``targets`` -> list of CompileReport."""
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets))
    rows = {"x_ptr": "*fp32", "stride_x": "i64", "W": "i32", "starts_ptr": "*i32", "ends_ptr": "*i32",
            "col_start": "i32"}
    kernels = [(_threshold_kernel, {**rows, "K": "i32", "thr_ptr": "*i32"},
                {"SAMPLE": SAMPLE, "SPREAD": SPREAD}, "threshold")]
    for width in (SEGMENT, BLOCK):  # segment_width's range
        kernels += [
            (_count_kernel, {**rows, "thr_ptr": "*i32", "cnt_ptr": "*i32", "G": "i32", "total_ptr": "*i32"},
             {"SEGMENT": width, "BLOCK": BLOCK}, f"count S{width}"),
            (_gather_kernel, {**rows, "K": "i32", "CAP": "i32", "thr_ptr": "*i32", "cnt_ptr": "*i32", "G": "i32",
                              "total_ptr": "*i32", "vals_ptr": "*fp32", "cols_ptr": "*i32", "stride_c": "i64",
                              "ok_ptr": "*i32", "full_ptr": "*i32", "cand_end_ptr": "*i32"},
             {"SEGMENT": width, "G_POW2": 256 if width == BLOCK else 64, "BLOCK": BLOCK}, f"gather S{width}"),
        ]
    reports = []
    for fn, sig, const, name in kernels:
        const = {**const, "HAS_STARTS": True, "HAS_ENDS": True}
        full = {**sig, **{c: "constexpr" for c in const}}
        full = {a: full[a] for a in fn.arg_names}
        for t in targets:
            reports.append(compile_kernel(fn, full, const, target=t, num_warps=NUM_WARPS, num_stages=1,
                                          config_name=f"filter {name}"))
    return reports

"""Merge a running top-k with a window's candidates, both as int64 sort keys (``topk_select``).

Contract: ``merge_topk_keys(best, cand, out)`` with ``best`` int64 [R, k] sorted descending (as
this function leaves it; or None), ``cand`` int64 [R, m] in any order (it may be reordered) and
``out`` int64 [R, k] (it may be ``best`` itself): out[r] holds the
k largest keys of best[r] and cand[r] together, sorted descending, INT64_MIN where there are fewer
than k. Sort keys are distinct apart from INT64_MIN (invisible), so the result is deterministic.

How, by width (both lists together, rounded up to a power of two):
- up to ``MAX_WIDTH`` (top-512 + 512): one program per row loads both lists into one vector,
  padded with INT64_MIN, sorts it (``tl.sort``, a bitonic network) and stores the first k;
- wider, with a running set of up to top-2048 and up to 2048 candidates: one program per row
  sorts only the candidates and puts each key of both lists at its place by binary search
  (``_merge_sorted_kernel``);
- a first window (no running set) of 2048 keys for at most ``FIRST_SORT_MAX_ROWS`` rows: the
  first kernel with 32 warps;
- anything wider: ``torch`` (a sort, or ``topk`` of the concatenation), or the first kernel up to
  ``MAX_WIDTH_SKIPPING`` when a skip vector is given (torch cannot skip rows).
The fused indexer top-k merges once per window, so these merges are a share of its time that
``torch.topk`` of the concatenation made large (docs/performance.md, "Tuning provenance").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common.checks import require, require_dtype

OP = "merge_topk_keys"
INT64_MIN = -(1 << 63)
# The widths and warps below are where this kernel beats torch.topk of the concatenation, and the
# fused top-k as a whole (measurements: docs/performance.md, "Tuning provenance").
# Entries one program sorts; wider merges stay with torch.
MAX_WIDTH = 1024
# With a skip vector (the fused top-k's windows after the first, where topk_fold has merged most
# rows) merges up to this width stay here.
MAX_WIDTH_SKIPPING = 4096
NUM_WARPS = 16
# A first window of top-2048 (no running set, nothing skipped) is a plain sort of 2048 keys per
# row: this kernel with 32 warps beats torch's sort up to about that many rows.
FIRST_SORT_WIDTH = 2048
FIRST_SORT_MAX_ROWS = 2048
FIRST_SORT_WARPS = 32
# Wider merges with a running set (top-2048: 2048 + up to 2048 candidates) sort only the
# candidates and place both lists by binary search (``_merge_sorted_kernel``).
SORTED_MERGE_MAX = 2048
SORTED_MERGE_WARPS = 32


@triton.jit
def _merge_kernel(best_ptr, stride_b, cand_ptr, stride_c, M, out_ptr, stride_o, K, skip_ptr,
                  HAS_BEST: tl.constexpr, HAS_SKIP: tl.constexpr, WIDTH: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    i = tl.arange(0, WIDTH)
    lowest = tl.full((WIDTH,), -9223372036854775807 - 1, tl.int64)
    if HAS_BEST:  # entries 0..K-1 from best, K..K+M-1 from cand
        j = i - K
        keys = tl.load(cand_ptr + r * stride_c + j, mask=(j >= 0) & (j < M), other=lowest)
        keys = tl.where(i < K, tl.load(best_ptr + r * stride_b + i, mask=i < K, other=lowest), keys)
    else:
        keys = tl.load(cand_ptr + r * stride_c + i, mask=i < M, other=lowest)
    keys = tl.sort(keys, descending=True)
    tl.store(out_ptr + r * stride_o + i, keys, mask=i < K)


@triton.jit
def count_before(row_ptr, n, x, STRICT: tl.constexpr, STEPS: tl.constexpr):
    """For each key of ``x``: how many of the descending keys row[0:n] come before it: those
    greater (``STRICT``) or greater or equal. A binary search, STEPS >= bit length of n."""
    lo = tl.zeros(x.shape, tl.int32)
    hi = tl.full(x.shape, 0, tl.int32) + n
    for _ in tl.static_range(STEPS):
        active = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(row_ptr + mid, mask=active, other=0)
        before = (v > x) if STRICT else (v >= x)
        lo = tl.where(active & before, mid + 1, lo)
        hi = tl.where(active & ~before, mid, hi)
    return lo


@triton.jit
def _merge_sorted_kernel(best_ptr, stride_b, cand_ptr, stride_c, M, out_ptr, stride_o, K, skip_ptr,
                         HAS_SKIP: tl.constexpr, KW: tl.constexpr, CW: tl.constexpr, STEPS: tl.constexpr):
    """Row r with a sorted running set: sort the candidates (written back in place), then put every
    key of both lists at its place in their union (its index in its own list plus how many keys of
    the other come before it; on equal keys best's first), keeping the first K. Sorting only the
    candidates costs less than sorting both lists together."""
    r = tl.program_id(0).to(tl.int64)
    if HAS_SKIP:
        if tl.load(skip_ptr + r) != 0:
            return
    cand_row = cand_ptr + r * stride_c
    best_row = best_ptr + r * stride_b
    j = tl.arange(0, CW)
    c = tl.sort(tl.load(cand_row + j, mask=j < M, other=-9223372036854775807 - 1), descending=True)
    # A narrow window's candidates fit in fewer threads than the program has: the sort then needs
    # no barrier of its own, and one thread's store could land before another's load.
    tl.debug_barrier()
    tl.store(cand_row + j, c, mask=j < M)
    tl.debug_barrier()  # the sorted candidates are read back by every thread of the program
    i = tl.arange(0, KW)
    b = tl.load(best_row + i, mask=i < K, other=-9223372036854775807 - 1)
    at_b = i + count_before(cand_row, M, b, True, STEPS)
    at_c = j + count_before(best_row, K, c, False, STEPS)
    tl.debug_barrier()  # out may be best: every read of it is done
    out_row = out_ptr + r * stride_o
    tl.store(out_row + at_b, b, mask=(i < K) & (at_b < K))
    tl.store(out_row + at_c, c, mask=(j < M) & (at_c < K))


def _rows(t, name, rows=None):
    require_dtype(t, (torch.int64,), OP, name)
    require(t.dim() == 2 and t.stride(1) == 1 and (rows is None or t.shape[0] == rows), OP, name,
            lambda: f"shape {list(t.shape)} strides {tuple(t.stride())}",
            f"an int64 [{'R' if rows is None else rows}, n] matrix with unit column stride")


def merge_topk_keys(best: torch.Tensor | None, cand: torch.Tensor, out: torch.Tensor,
                    skip: torch.Tensor | None = None) -> torch.Tensor:
    """The ``out.shape[1]`` largest keys of each row of ``best`` and ``cand``, sorted descending,
    into ``out`` (see the module docstring); returns ``out``. Rows r with ``skip[r]`` != 0 (int32
    [R], optional) are left as they are in ``out``."""
    _rows(cand, "cand")
    rows = cand.shape[0]
    _rows(out, "out", rows)
    k = out.shape[1]
    require(k >= 1, OP, "out", lambda: f"shape {list(out.shape)}", "at least one column")
    if skip is not None:
        require_dtype(skip, (torch.int32,), OP, "skip")
        require(skip.shape == (rows,) and skip.stride(0) == 1, OP, "skip",
                lambda: f"shape {list(skip.shape)}", f"contiguous [{rows}]")
    if best is not None:
        _rows(best, "best", rows)
        require(best.shape[1] == k, OP, "best", lambda: f"shape {list(best.shape)}",
                f"[{rows}, {k}] (as out)")
    width = triton.next_power_of_2(max(k, (k if best is not None else 0) + cand.shape[1]))  # >= k: out
    if rows == 0:
        return out
    first_sort = best is None and skip is None and width == FIRST_SORT_WIDTH and rows <= FIRST_SORT_MAX_ROWS
    if best is not None and width > MAX_WIDTH and max(k, cand.shape[1]) <= SORTED_MERGE_MAX:
        kw, cw = triton.next_power_of_2(k), triton.next_power_of_2(cand.shape[1])
        _merge_sorted_kernel[(rows,)](best, best.stride(0), cand, cand.stride(0), cand.shape[1], out, out.stride(0),
                                      k, skip if skip is not None else cand, HAS_SKIP=skip is not None, KW=kw,
                                      CW=cw, STEPS=max(kw, cw).bit_length(), num_warps=SORTED_MERGE_WARPS)
        return out
    if width > (MAX_WIDTH if skip is None else MAX_WIDTH_SKIPPING) and not first_sort:
        merged = cand if best is None else torch.cat([best, cand], dim=1)
        if merged.shape[1] < k:
            pad = torch.full((rows, k - merged.shape[1]), INT64_MIN, dtype=torch.int64, device=cand.device)
            merged = torch.cat([merged, pad], dim=1)
        # a full sort when nothing is dropped: torch.topk of all k columns sorts and then gathers.
        # Without a skip vector straight into out (a copy of it cost 7 us of a 311 us decode call).
        target = (out, torch.empty(out.shape, dtype=torch.int64, device=out.device)) if skip is None else None
        if merged.shape[1] == k:  # torch sorts a copy: out may be cand
            merged = torch.sort(merged, dim=1, descending=True, out=target).values
        else:
            merged = torch.topk(merged, k, dim=1, sorted=True, out=target).values
        if skip is not None:
            out.copy_(torch.where(skip[:, None] != 0, out, merged))
        return out
    _merge_kernel[(rows,)](best if best is not None else cand, best.stride(0) if best is not None else 0,
                           cand, cand.stride(0), cand.shape[1], out, out.stride(0), k,
                           skip if skip is not None else cand, HAS_BEST=best is not None,
                           HAS_SKIP=skip is not None, WIDTH=width,
                           num_warps=FIRST_SORT_WARPS if first_sort else NUM_WARPS)
    return out


def compile_reports(targets=("sm_120", "sm_121")):
    """Compile the merges for ``targets`` at their widest, without and with skipping (top-512 + 512
    and top-2048 + 2048, by sorting both or only the candidates), and a first window's sort of 2048
    -> list of CompileReport."""
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets))
    sig = {"best_ptr": "*i64", "stride_b": "i64", "cand_ptr": "*i64", "stride_c": "i64", "M": "i32",
           "out_ptr": "*i64", "stride_o": "i64", "K": "i32", "skip_ptr": "*i32", "HAS_BEST": "constexpr",
           "HAS_SKIP": "constexpr", "WIDTH": "constexpr"}
    reports = []
    for t in targets:
        for width, best, skipping, warps in ((MAX_WIDTH, True, False, NUM_WARPS),
                                             (MAX_WIDTH_SKIPPING, True, True, NUM_WARPS),
                                             (FIRST_SORT_WIDTH, False, False, FIRST_SORT_WARPS)):
            reports.append(compile_kernel(_merge_kernel, sig, {"HAS_BEST": best, "HAS_SKIP": skipping,
                                                                "WIDTH": width}, target=t, num_warps=warps,
                                          num_stages=1, config_name=f"merge W{width}" + ("" if best else " first")))
        sorted_sig = {k: v for k, v in sig.items() if k not in ("HAS_BEST", "WIDTH")}
        sorted_sig.update(KW="constexpr", CW="constexpr", STEPS="constexpr")
        for skipping in (False, True):
            reports.append(compile_kernel(_merge_sorted_kernel, sorted_sig,
                                          {"HAS_SKIP": skipping, "KW": SORTED_MERGE_MAX, "CW": SORTED_MERGE_MAX,
                                           "STEPS": SORTED_MERGE_MAX.bit_length()}, target=t,
                                          num_warps=SORTED_MERGE_WARPS, num_stages=1,
                                          config_name=f"sorted merge {SORTED_MERGE_MAX}" + (" skip" if skipping else "")))
    return reports

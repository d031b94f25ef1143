"""Fold a window's few keys above a running top-k's floor straight into it.

Contract: ``fold_above_floor(x, best, col_start, base, scratch, done, ends=None, starts=None)``
with x float32 [R, W] (a logits window as ``topk_select.row_topk_keys`` takes it, ``ends`` /
``starts`` as there), ``best`` int64 [R, k] sorted descending (the running top-k as
``topk_merge`` keeps it) and ``scratch`` int64 [R, >= k]. For each row, the window's keys
(``topk_select``'s int64 sort key of each visible value) above best[r, k-1] are counted. When
there are at most ``fold_limits(k)[0]`` of them, they are merged into best[r] in place (best[r]
becomes the k largest of both, sorted descending) and done[r] = 1; otherwise best[r] is left as
it was and done[r] = 0, for ``row_topk_keys(..., skip=done)`` and ``merge_topk_keys(...,
skip=done)`` to finish. No host sync (CUDA-graph safe).

Why: after the first windows of a long row, a window holds only about k / (windows so far) keys
that can still enter the top-k. The radix select + sort merge spent 0.38 + 0.20 ms per such
window on 4096 x 16,384 logits (H200); this reads the window once and merges the few candidates
by binary search instead of sorting k + k keys.

How: a collect launch, one program per COLS columns of a row, appends the row's keys above its
floor to the row's scratch list (places from an atomic add on the row's count in ``done``). One
program per row was no faster than the radix select: 0.37 ms per window, a serial loop of
loads. A merge launch, one program per row, sorts the candidates when they are few enough;
each candidate's and each best key's place in the merged list is its own rank plus the number
of keys of the other list above it (binary search in the other sorted list), and both are stored
at those places below k.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common.checks import require, require_dtype
from sm12x.kernels.indexer.topk_merge import count_before
from sm12x.kernels.indexer.topk_select import _read_range, sort_key

OP = "fold_above_floor"
# One warp per 512 columns collects a row's few keys above the floor at about twice a read of the
# window; more warps per row pay the cumsum's cross-warp steps (measurements: docs/performance.md,
# "Tuning provenance").
COLS = 512
COLLECT_WARPS = 1
# Most candidates a row may have to be folded here, and the merge's warps: CANDIDATES / MERGE_WARPS
# up to top-512, WIDE_* above: sorting more candidates costs every folded row, fewer leave more rows
# to the select + merge (the fused top-k's times per choice: docs/performance.md, "Tuning
# provenance").
CANDIDATES = 256
MERGE_WARPS = 4
WIDE_CANDIDATES = 1024
WIDE_MERGE_WARPS = 8
MAX_K = 2048  # best rows are loaded whole: wider ones are not folded (done stays 0)


def fold_limits(k: int) -> tuple[int, int]:
    """(most candidates a row of a top-``k`` may have to be folded, warps of the merge)."""
    cand, warps = (CANDIDATES, MERGE_WARPS) if k <= 512 else (WIDE_CANDIDATES, WIDE_MERGE_WARPS)
    return min(cand, k), warps


@triton.jit
def _collect_kernel(x_ptr, stride_x, W, base_ptr, col_start, best_ptr, stride_b, K, cand_ptr,
                    stride_c, count_ptr, limit, starts_ptr, ends_ptr, HAS_BASE: tl.constexpr,
                    HAS_STARTS: tl.constexpr, HAS_ENDS: tl.constexpr, COLS: tl.constexpr):
    """Append the keys above row r's floor in one COLS-column tile to the row's candidate list
    (after an atomic add on the row's count; the merge sorts them)."""
    r = tl.program_id(0).to(tl.int64)
    c0 = tl.program_id(1) * COLS
    lo, hi = _read_range(W, starts_ptr, ends_ptr, r, col_start, HAS_STARTS, HAS_ENDS)
    if (c0 >= hi) | (c0 + COLS <= lo):  # the row reads none of this tile
        return
    base = 0
    if HAS_BASE:
        base = tl.load(base_ptr + r)
    c = c0 + tl.arange(0, COLS)
    v = tl.load(x_ptr + r * stride_x + c, mask=(c >= lo) & (c < hi), other=float("-inf"))
    key = sort_key(v, c, col_start, base)
    take = key > tl.load(best_ptr + r * stride_b + K - 1)
    n = tl.sum(take.to(tl.int32))
    if n > 0:
        pos = tl.atomic_add(count_ptr + r, n) + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(cand_ptr + r * stride_c + pos, key, mask=take & (pos >= 0) & (pos < limit))


@triton.jit
def _merge_kernel(best_ptr, stride_b, K, cand_ptr, stride_c, done_ptr, limit,
                  CAND: tl.constexpr, KP: tl.constexpr, STEPS_K: tl.constexpr,
                  STEPS_C: tl.constexpr):
    """Merge row r's done[r] candidates into best[r] when there are at most ``limit``; done[r]
    becomes 1 then, else 0."""
    r = tl.program_id(0).to(tl.int64)
    best_row = best_ptr + r * stride_b
    cand_row = cand_ptr + r * stride_c
    n = tl.load(done_ptr + r)
    done = (n >= 0) & (n <= limit)
    # no branch on done: the barriers stay outside control flow; an undone row masks every store
    # (with an early return for rows without candidates this kernel faulted on the H200, triton 3.6)
    m = tl.where(done, n, 0)  # candidates to merge
    j = tl.arange(0, CAND)
    lowest = tl.full((CAND,), -9223372036854775807 - 1, tl.int64)
    cand = tl.sort(tl.load(cand_row + j, mask=j < m, other=lowest), descending=True)
    i = tl.arange(0, KP)
    kept = tl.load(best_row + i, mask=i < K, other=0)
    cand_place = j + count_before(best_row, K, cand, True, STEPS_K)
    tl.debug_barrier()  # everyone has read the unsorted candidates
    tl.store(cand_row + j, cand, mask=j < m)
    tl.debug_barrier()
    kept_place = i + count_before(cand_row, m, kept, True, STEPS_C)
    tl.debug_barrier()  # every read of best is done before it is overwritten
    tl.store(best_row + cand_place, cand, mask=(j < m) & (cand_place < K))
    tl.store(best_row + kept_place, kept, mask=(i < tl.where(done, K, 0)) & (kept_place < K))
    tl.store(done_ptr + r, done.to(tl.int32))


def fold_above_floor(x: torch.Tensor, best: torch.Tensor, col_start: int, base: torch.Tensor | None,
                     scratch: torch.Tensor, done: torch.Tensor, ends: torch.Tensor | None = None,
                     starts: torch.Tensor | None = None) -> torch.Tensor:
    """Merge each row's window keys above best[r, -1] into best[r] when they are few (see the
    module docstring); returns ``done`` (int32 [R]: 1 where folded). ``ends`` / ``starts`` (int32
    [R]): row r reads only the columns c with starts[r] <= col_start + c < ends[r]."""
    require_dtype(x, (torch.float32,), OP, "x")
    require(x.dim() == 2 and x.stride(1) == 1, OP, "x",
            lambda: f"shape {list(x.shape)} strides {tuple(x.stride())}",
            "a [R, W] matrix with unit column stride")
    rows = x.shape[0]
    require_dtype(best, (torch.int64,), OP, "best")
    require(best.dim() == 2 and best.shape[0] == rows and 1 <= best.shape[1] and best.stride(1) == 1, OP,
            "best", lambda: f"shape {list(best.shape)}", f"[{rows}, k] with unit column stride")
    k = best.shape[1]
    require_dtype(scratch, (torch.int64,), OP, "scratch")
    require(scratch.dim() == 2 and scratch.shape[0] == rows and scratch.shape[1] >= k
            and scratch.stride(1) == 1, OP, "scratch", lambda: f"shape {list(scratch.shape)}",
            f"[{rows}, >= {k}] with unit column stride")
    require_dtype(done, (torch.int32,), OP, "done")
    require(done.shape == (rows,) and done.stride(0) == 1, OP, "done",
            lambda: f"shape {list(done.shape)}", f"contiguous [{rows}]")
    for name, t in (("base", base), ("ends", ends), ("starts", starts)):
        if t is not None:
            require_dtype(t, (torch.int32,), OP, name)
            require(t.shape == (rows,) and t.stride(0) == 1, OP, name,
                    lambda: f"shape {list(t.shape)}", f"contiguous [{rows}]")
    if rows == 0:
        return done
    if k > MAX_K:
        return done.zero_()
    kp = triton.next_power_of_2(k)
    limit, merge_warps = fold_limits(k)
    cand = triton.next_power_of_2(limit)
    done.zero_()  # the collect counts each row's candidates here
    _collect_kernel[(rows, triton.cdiv(x.shape[1], COLS))](
        x, x.stride(0), x.shape[1], base if base is not None else done, col_start, best, best.stride(0),
        k, scratch, scratch.stride(0), done, limit, starts if starts is not None else done,
        ends if ends is not None else done, HAS_BASE=base is not None, HAS_STARTS=starts is not None,
        HAS_ENDS=ends is not None, COLS=COLS, num_warps=COLLECT_WARPS)
    _merge_kernel[(rows,)](best, best.stride(0), k, scratch, scratch.stride(0), done, limit, CAND=cand,
                           KP=kp, STEPS_K=k.bit_length(), STEPS_C=cand.bit_length(),
                           num_warps=merge_warps)
    return done


def compile_reports(targets=("sm_120", "sm_121")):
    """Compile the fold for ``targets`` at top-512, top-1024 (DeepSeek-V4.1's index top-k) and
    top-2048 (its widest best row) -> list of CompileReport."""
    from sm12x.kernels.common.compile_check import compile_kernel
    from sm12x.kernels.common.compile_check import interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets))
    collect = {"x_ptr": "*fp32", "stride_x": "i64", "W": "i32", "base_ptr": "*i32",
               "col_start": "i32", "best_ptr": "*i64", "stride_b": "i64", "K": "i32", "cand_ptr": "*i64",
               "stride_c": "i64", "count_ptr": "*i32", "limit": "i32", "starts_ptr": "*i32", "ends_ptr": "*i32"}
    merge = {"best_ptr": "*i64", "stride_b": "i64", "K": "i32", "cand_ptr": "*i64", "stride_c": "i64",
             "done_ptr": "*i32", "limit": "i32"}
    kernels = [*[(_collect_kernel, collect, {"HAS_BASE": True, "HAS_STARTS": starts, "HAS_ENDS": ends, "COLS": COLS},
                  COLLECT_WARPS, f"collect {COLS}" + (" starts" if starts else "") + (" ends" if ends else ""))
                 for starts, ends in ((False, False), (False, True), (True, True))],
               *[(_merge_kernel, merge, {"CAND": cand, "KP": kp, "STEPS_K": kp.bit_length(),
                                         "STEPS_C": cand.bit_length()}, warps, f"merge K{kp} C{cand}")
                 for kp, (cand, warps) in ((k, fold_limits(k)) for k in (512, 1024, MAX_K))]]
    reports = []
    for fn, sig, const, warps, name in kernels:
        sig = {**sig, **{c: "constexpr" for c in const}}
        reports += [compile_kernel(fn, sig, const, target=t, num_warps=warps, num_stages=1, config_name=name)
                    for t in targets]
    return reports

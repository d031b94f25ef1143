"""Fused lightning-indexer top-k: top-k key indices straight from q and the (flat or paged) key
cache, without materialising the [rows, S_kv] logits.

How: the MQA-logits kernels fill a float32 workspace of at most ``workspace_bytes`` (default
256 MiB) with the logits of a block of rows over a window of key columns;
``topk_select.row_topk_keys`` picks each row's best ``topk`` of the window by radix select and
returns them as int64 sort keys -- the float mapped to an order-preserving int32
in the high half, (2**31-1 - index) in the low half, INT64_MIN for invisible keys. Windows are
merged into a running [rows, topk] set (``topk_merge``). Once that set is full, only a window's
keys above its worst can enter: rows with few of them (most rows after the first windows) fold
them in with one pass and a binary-search merge (``topk_fold``); the others count and write just
those keys, or run the radix passes when there are more than topk. Each row is read only where
it can see keys, so the logits kernels skip their -inf fill: prefill rows inside their own
[ks, ke) (a chunk of several requests costs each row its own request's keys), decode rows up to
their end (``row_ends``; a window of vLLM's max_context_len, the model's limit, costs only the
requests' keys). Memory is O(rows x topk) plus the workspace, independent of S_kv (the default
budget holds e.g. 256 rows x 262,144 keys or 4096 rows x 16,384). No host sync: the loop bounds
come from shapes and ``max_context_len`` only (CUDA-graph safe).

Index conventions (int32 output, -1 padded at the end when a row sees fewer than topk keys):

- prefill (``mqa_topk_indices``): j - ks[i], the key's position inside the row's visible range
  [ks[i], ke[i]) -- vLLM's local index in the request's (compressed) sequence when ks is the
  request's first key in the gathered k buffer; ``relative=False`` returns j itself.
- decode (``paged_mqa_topk_indices``): the position p in the request's sequence (0 <= p < visible
  end of the row, see ``paged_mqa_logits``). SGLang's topk_transform takes the same local positions
  and maps them to pages itself.

Ordering is deterministic: descending score, equal scores lower index first (the int64 key makes
this exact), matching ``reference.indexer.ref_indexer_topk`` applied to the kernel's own logits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sm12x.kernels.common import configs
from sm12x.kernels.indexer import mqa_logits as _mqa
from sm12x.kernels.indexer import paged_mqa_logits as _paged
from sm12x.kernels.indexer.topk_fold import fold_above_floor
from sm12x.kernels.indexer.topk_merge import merge_topk_keys
from sm12x.kernels.indexer.topk_filter import topk_keys
from sm12x.kernels.indexer.topk_select import row_topk_keys

DEFAULT_WORKSPACE_BYTES = 256 << 20
# Top-k above 512: windows of at least this many x topk columns, fewer rows per pass. Each window
# after a row's first folds in with a merge that sorts up to 1024 candidates per row, even for rows
# that see nothing in it, so fewer, wider windows pay for a prefill chunk of several requests. Rows
# that see whole windows already get 16,384 columns; wider ones cost them (the select's wide-row
# path takes no floor shortcut). Measurements: docs/performance.md, "Tuning provenance".
WIDE_TOPK_WINDOW = 8
INT64_MIN = -(1 << 63)


INDEX_BLOCK = 512


@triton.jit
def _key_indices_kernel(keys_ptr, stride_k, n, out_ptr, stride_o, stride_oc, topk, shift_ptr,
                        HAS_SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """Row r of ``decode_keys``: the indices of its first n keys, -1 after them up to topk."""
    r = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + r.to(tl.int64) * stride_k + c, mask=c < n, other=-9223372036854775807 - 1)
    idx = (0x7FFFFFFF - (key & 0xFFFFFFFF)).to(tl.int32)
    if HAS_SHIFT:
        idx += tl.load(shift_ptr + r)
    idx = tl.where(key == -9223372036854775807 - 1, -1, idx)
    tl.store(out_ptr + r.to(tl.int64) * stride_o + c.to(tl.int64) * stride_oc, idx, mask=c < topk)


def decode_keys(keys: torch.Tensor, topk: int, out: torch.Tensor | None = None,
                shift: torch.Tensor | None = None) -> torch.Tensor:
    """int64 sort keys [R, n] (best first, unit column stride) -> int32 indices [R, topk] (into
    ``out`` when given), -1 for invisible / missing keys; ``shift`` (int32 [R]) is added to row
    r's real indices. One launch where the torch form takes six kernels and a copy (its cost:
    docs/performance.md, "Tuning provenance")."""
    rows, n = keys.shape
    if out is None:
        out = torch.empty((rows, topk), dtype=torch.int32, device=keys.device)
    if rows and topk:
        _key_indices_kernel[(rows, triton.cdiv(topk, INDEX_BLOCK))](
            keys, keys.stride(0), n, out, out.stride(0), out.stride(1), topk, shift if shift is not None else out,
            HAS_SHIFT=shift is not None, BLOCK=INDEX_BLOCK)
    return out


def _plan(rows: int, cols: int, unit: int, topk: int, budget: int, elem_bytes: int = 4):
    """(rows per pass, columns per window): window a multiple of ``unit``, workspace <= budget
    (a window is never narrower than topk columns, nor than WIDE_TOPK_WINDOW x topk for
    top-k above 512 while the budget holds such a window)."""
    cols_needed = -(-cols // unit) * unit
    elems = max(budget // elem_bytes, unit)  # workspace entries the budget holds
    win = min(cols_needed, max(unit, (elems // max(rows, 1)) // unit * unit))
    if topk > 512:
        win = max(win, min(cols_needed, -(-WIDE_TOPK_WINDOW * topk // unit) * unit, elems // unit * unit))
    win = max(win, min(cols_needed, -(-topk // unit) * unit))  # a window never yields fewer than topk
    row_block = max(1, min(rows, elems // win))
    return row_block, win


class _RunningTopk:
    """The running top-k of a block of rows as windows of logits come in: int64 sort keys,
    sorted best first (``best``, a view of a buffer allocated once per call)."""

    def __init__(self, rows, topk, device):
        self.topk = topk
        self.best_ws = torch.empty((rows, topk), dtype=torch.int64, device=device)
        self.scratch = torch.empty((rows, topk), dtype=torch.int64, device=device)  # candidates
        self.done = torch.empty((rows,), dtype=torch.int32, device=device)
        self.best = None

    def start(self):
        self.best = None

    def add(self, logits, col_start, base, ends=None, starts=None):
        """Fold a window ([rows, width] float32, columns from ``col_start``; with ``ends`` /
        ``starts``, row r is read only at positions starts[r] <= p < ends[r]) in. Once the set is
        full, only keys above its last one can enter: rows with few of them are merged in place
        (``fold_above_floor``); the rest take the window's best keys above that floor (radix
        select) and a sort merge."""
        rows, width = logits.shape
        k_w = min(self.topk, width)
        cand = self.scratch[:rows, :k_w]
        out = self.best_ws[:rows]
        if self.best is None:
            self.best = merge_topk_keys(
                None, topk_keys(logits, k_w, col_start, base, out=cand, ends=ends, starts=starts), out)
            return
        done = fold_above_floor(logits, self.best, col_start, base, self.scratch[:rows], self.done[:rows], ends,
                                starts)
        # a clone, not .contiguous(): one row's [1] view keeps its stride of topk
        floor = self.best[:, -1].clone(memory_format=torch.contiguous_format)
        cand = row_topk_keys(logits, k_w, col_start, base, out=cand, floor=floor,
                             skip=done, ends=ends, starts=starts)
        self.best = merge_topk_keys(self.best, cand, out, skip=done)

    def result(self, rows, device):
        if self.best is None:
            return torch.full((rows, 0), INT64_MIN, dtype=torch.int64, device=device)
        return self.best


def split_q(q):
    """q as (values, scale or None): a tensor, or the (values, scale) pair of the FP4 form."""
    if isinstance(q, (tuple, list)):
        return q[0], q[1]
    return q, None


def mqa_topk_indices(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, topk: int, *,
                     relative: bool = True, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                     out: torch.Tensor | None = None, window_hook=None) -> torch.Tensor:
    """Prefill top-k. q: float8 [S, H, D] or (values, scale|None) (FP4: int8 [S, H, D/2] + int32
    [S, H]); kv = (k, k_scale) as for ``fp8_fp4_mqa_logits``; weights [S, H]; ks/ke int32 [S].
    Returns int32 [S, topk] (into ``out`` when given). ``window_hook(window, col_start, r0, r1)``,
    when given, sees each window of logits (rows r0:r1, key columns from col_start; only each
    row's visible columns are defined) before the top-k reads it, and may rewrite those columns
    (:mod:`sm12x.kernels.indexer.candidate_topk`)."""
    from sm12x.kernels.indexer.validation import check_mqa

    qv, qs = split_q(q)
    k, k_sf = kv
    check_mqa("mqa_topk_indices", qv, qs, k, k_sf, weights, cu_seq_len_k_start, cu_seq_len_k_end)
    check_topk("mqa_topk_indices", topk, out, qv.shape[0], qv.device)
    ks, ke = cu_seq_len_k_start, cu_seq_len_k_end
    s, s_kv = qv.shape[0], k.shape[0]
    cfg = configs.pick(_mqa.CONFIGS, qv.device)["fp4" if qs is not None else "fp8"]
    unit = cfg["BLOCK_N"] * cfg["N_ITERS"]
    result = out if out is not None else torch.empty((s, topk), dtype=torch.int32, device=qv.device)
    if s == 0:
        return result
    row_block, win = _plan(s, s_kv, unit, topk, workspace_bytes)
    ws = torch.empty((row_block, win), dtype=torch.float32, device=qv.device)
    running = _RunningTopk(row_block, topk, qv.device)
    for r0 in range(0, s, row_block):
        r1 = min(s, r0 + row_block)
        running.start()
        for c0 in range(0, max(s_kv, 1), win):
            n = min(win, s_kv - c0)
            if n <= 0:
                break
            w_ = ws[: r1 - r0, :n]
            # No -inf fill (clean=False): each row is read only inside its own [ks, ke), so a
            # chunk of several requests costs each row its request's keys, not the chunk's.
            _mqa.launch(qv[r0:r1], None if qs is None else qs[r0:r1], k, k_sf, weights[r0:r1],
                        ks[r0:r1], ke[r0:r1], w_, clean=False, compressed=False, out_mode=0, col_start=c0,
                        num_cols=n)
            if window_hook is not None:
                window_hook(w_, c0, r0, r1)
            running.add(w_, c0, ks[r0:r1], ends=ke[r0:r1], starts=ks[r0:r1])
        decode_keys(running.result(r1 - r0, qv.device), topk, out=result[r0:r1],
                    shift=None if relative else ks[r0:r1])
    return result


def paged_mqa_topk_indices(q, kv_cache, weights, context_lens, block_table, max_context_len: int,
                           topk: int, *, workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
                           out: torch.Tensor | None = None, window_hook=None) -> torch.Tensor:
    """Decode top-k over the paged cache. Arguments as ``fp8_fp4_paged_mqa_logits`` (q a tensor or
    (values, scale|None); context_lens [B, next_n] or [B]). Returns int32 [B*next_n, topk] positions
    (into ``out`` when given). ``window_hook`` as for ``mqa_topk_indices`` (rows r0:r1 are
    b*next_n + t)."""
    from sm12x.kernels.indexer.validation import check_paged

    qv, qs = split_q(q)
    kv_cache = check_paged("paged_mqa_topk_indices", qv, qs, kv_cache, weights, context_lens, block_table, None,
                 max_context_len)
    rows = qv.shape[0] * qv.shape[1]
    check_topk("paged_mqa_topk_indices", topk, out, rows, qv.device)
    cfg = configs.pick(_paged.CONFIGS, qv.device)["fp4" if qs is not None else "fp8"]
    block_kv = kv_cache.shape[1]
    unit = block_kv * cfg["N_ITERS"]
    result = out if out is not None else torch.empty((rows, topk), dtype=torch.int32, device=qv.device)
    if rows == 0:
        return result
    # rows are whole requests (b, all t) so a row block maps onto a slice of q / block_table
    next_n = qv.shape[1]
    ends = row_ends(context_lens, next_n, max_context_len)
    row_block, win = _plan(rows, max_context_len, unit, topk, workspace_bytes)
    req_block = max(1, row_block // next_n)
    ws = torch.empty((req_block * next_n, win), dtype=torch.float32, device=qv.device)
    running = _RunningTopk(req_block * next_n, topk, qv.device)
    for b0 in range(0, qv.shape[0], req_block):
        b1 = min(qv.shape[0], b0 + req_block)
        r0, r1 = b0 * next_n, b1 * next_n
        running.start()
        for c0 in range(0, max_context_len, win):
            n = min(win, max_context_len - c0)
            w_ = ws[: r1 - r0, :n]
            # No -inf fill (clean=False): the select reads each row only up to its end, and
            # every position before it is visible. With vLLM's max_context_len (the model's
            # limit) most of a window lies past the requests' ends.
            _paged.launch(qv[b0:b1], None if qs is None else qs[b0:b1], kv_cache, weights[r0:r1],
                          context_lens[b0:b1], block_table[b0:b1], max_context_len, w_,
                          clean=False, out_mode=0, col_start=c0, num_cols=n)
            if window_hook is not None:
                window_hook(w_, c0, r0, r1)
            running.add(w_, c0, None, ends[r0:r1])
        decode_keys(running.result(r1 - r0, qv.device), topk, out=result[r0:r1])
    return result


def row_ends(context_lens: torch.Tensor, next_n: int, max_context_len: int) -> torch.Tensor:
    """int32 [B*next_n]: row (b, t) of a paged call sees positions < its end (context_lens
    [B, next_n]; [B]: ctx - next_n + t + 1), at most max_context_len (device ops, no sync)."""
    if context_lens.dim() == 2:
        ends = context_lens.reshape(-1)
    else:
        t = torch.arange(next_n, dtype=torch.int32, device=context_lens.device)
        ends = (context_lens[:, None] - next_n + 1 + t).reshape(-1)
    return ends.clamp(0, max_context_len).to(torch.int32).contiguous()


def check_topk(op, topk, out, rows, device):
    from sm12x.kernels.common.checks import require, require_dtype, require_shape

    require(isinstance(topk, int) and topk >= 1, op, "topk", topk, "an int >= 1")
    if out is not None:
        require_dtype(out, (torch.int32,), op, "out")
        require_shape(out, (rows, topk), op, "out")
        require(out.device == device, op, "out", f"device {out.device}", f"the device of q ({device})")


def compile_reports(targets=("sm_120", "sm_121"), heads=(64,), dims=(128,)):
    """Compile what the fused top-k runs for ``targets``: the float32 variants without the -inf
    fill of both logits kernels (2-D and 1-D context_lens for the paged one), the key-to-index
    kernel, the radix-select kernels and their candidate filter, the merge and the fold."""
    from sm12x.kernels.indexer import topk_filter, topk_fold, topk_merge, topk_select
    from sm12x.kernels.common.compile_check import compile_kernel, interpreting, reports_in_subprocess

    if interpreting():
        return reports_in_subprocess(__name__, targets=tuple(targets), heads=tuple(heads), dims=tuple(dims))
    reports = _mqa.compile_reports(targets, heads, dims, variants=((0, False, False),))
    sig = {"keys_ptr": "*i64", "stride_k": "i64", "n": "i32", "out_ptr": "*i32", "stride_o": "i64",
           "stride_oc": "i64", "topk": "i32", "shift_ptr": "*i32", "HAS_SHIFT": "constexpr", "BLOCK": "constexpr"}
    reports += [compile_kernel(_key_indices_kernel, sig, {"HAS_SHIFT": True, "BLOCK": INDEX_BLOCK}, target=t,
                               num_warps=4, num_stages=1, config_name=f"key indices B{INDEX_BLOCK}")
                for t in targets]
    reports += _paged.compile_reports(targets, heads, dims, block_kvs=(32, 64), next_ns=(1, 2),
                                      variants=((0, False, True), (0, False, False)))
    return (reports + topk_select.compile_reports(targets) + topk_filter.compile_reports(targets)
            + topk_merge.compile_reports(targets) + topk_fold.compile_reports(targets))

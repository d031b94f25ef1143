"""Folding a window's keys above a running top-k's floor into it (``topk_fold``) against
torch.topk of best + all the window's keys."""
import pytest
import torch

from sm12x.kernels.indexer import topk_fold
from sm12x.kernels.indexer.reference import ref_topk_sort_keys
from sm12x.kernels.indexer.topk_fold import fold_above_floor
from sm12x.kernels.indexer.topk_select import INT64_MIN


def running_best(r, k, w, seed, fill):
    """A sorted running top-k from an earlier window of ``w`` columns (``fill`` visible columns)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, w, generator=g)
    x[:, fill:] = float("-inf")
    return ref_topk_sort_keys(x, 0, torch.zeros(r, dtype=torch.int32)).topk(k, dim=1).values


def fold(x, best, col_start, base, device, scratch_cols=None, ends=None, starts=None):
    r, k = best.shape
    b = best.clone().to(device)
    scratch = torch.full((r, scratch_cols or k), 7, dtype=torch.int64, device=device)
    done = torch.full((r,), 5, dtype=torch.int32, device=device)
    fold_above_floor(x.to(device), b, col_start, base.to(device), scratch, done,
                     None if ends is None else ends.to(device), None if starts is None else starts.to(device))
    return b.cpu(), done.cpu()


def expected(x, best, col_start, base, limit):
    keys = ref_topk_sort_keys(x, col_start, base)
    above = (keys > best[:, -1:]).sum(1)
    merged = torch.cat([best, keys], dim=1).topk(best.shape[1], dim=1).values
    done = above <= limit
    return torch.where(done[:, None], merged, best), done.int()


@pytest.mark.parametrize("r,k,w_prev,w,fill", [(6, 64, 4096, 1000, 4096), (4, 512, 9000, 3000, 9000),
                                                (5, 7, 500, 300, 500), (3, 100, 2000, 600, 2000),
                                                (3, 600, 5000, 4000, 5000)])  # k > 512: the wide limits
def test_fold_matches_topk(device, r, k, w_prev, w, fill):
    best = running_best(r, k, w_prev, seed=r + k, fill=fill)
    g = torch.Generator().manual_seed(w)
    x = torch.randn(r, w, generator=g)
    x[0, ::4] = float("-inf")
    x[1] = torch.randint(-2, 3, (w,), generator=g).float()  # ties: the lower column wins
    x[2, : w // 2] = 4.0  # many keys above the floor: left for the radix path
    base = torch.randint(0, 3, (r,), dtype=torch.int32)
    col_start = w_prev + 10
    got, done = fold(x, best, col_start, base, device)
    want, want_done = expected(x, best, col_start, base, topk_fold.fold_limits(k)[0])
    assert torch.equal(done, want_done)
    assert torch.equal(got, want)
    assert done[2] == 0 and done.sum() > 0


def test_best_not_full_takes_every_visible_key(device):
    """A running top-k still padded with INT64_MIN has floor INT64_MIN: every visible key is a
    candidate, and the INT64_MIN padding moves behind them."""
    r, k = 4, 64
    best = running_best(r, k, 200, seed=1, fill=20)  # 20 keys + 44 INT64_MIN
    x = torch.randn(r, 100)
    x[:, 30:] = float("-inf")  # 30 visible
    x[3] = float("-inf")  # nothing visible: best unchanged, done
    base = torch.zeros(r, dtype=torch.int32)
    got, done = fold(x, best, 300, base, device)
    want, want_done = expected(x, best, 300, base, k)
    assert torch.equal(got, want) and torch.equal(done, want_done) and done.all()
    assert (got[:3, 50:] == INT64_MIN).all() and (got[:3, :50] != INT64_MIN).all()


def test_ends_limit_what_each_row_reads(device):
    """With ends, columns at positions >= ends[r] (poisoned with +inf here) are not read: rows
    ending before the window, inside it and past it."""
    r, k, col_start = 4, 64, 1000
    best = running_best(r, k, 1000, seed=3, fill=1000)
    x = torch.randn(r, 600) * 1.5
    ends = torch.tensor([900, 1000, 1250, 1700], dtype=torch.int32)
    past = (col_start + torch.arange(600))[None, :] >= ends[:, None]
    base = torch.zeros(r, dtype=torch.int32)
    got, done = fold(x.masked_fill(past, float("inf")), best, col_start, base, device, ends=ends)
    want, want_done = expected(x.masked_fill(past, float("-inf")), best, col_start, base,
                               topk_fold.fold_limits(k)[0])
    assert torch.equal(got, want) and torch.equal(done, want_done)
    assert torch.equal(got[:2], best[:2]) and done[:2].all()


def test_starts_and_ends_limit_what_each_row_reads(device):
    """With starts and ends, columns outside starts[r] <= position < ends[r] (poisoned with +inf
    here) are not read: ranges before the window, across its start, inside it, across its end,
    empty."""
    r, k, col_start = 5, 64, 1000
    best = running_best(r, k, 1000, seed=4, fill=1000)
    x = torch.randn(r, 600) * 1.5
    starts = torch.tensor([0, 900, 1100, 1450, 1200], dtype=torch.int32)
    ends = torch.tensor([1000, 1200, 1500, 1700, 1200], dtype=torch.int32)
    pos = (col_start + torch.arange(600))[None, :]
    outside = (pos < starts[:, None]) | (pos >= ends[:, None])
    base = torch.randint(0, 3, (r,), dtype=torch.int32)
    got, done = fold(x.masked_fill(outside, float("inf")), best, col_start, base, device, ends=ends,
                     starts=starts)
    want, want_done = expected(x.masked_fill(outside, float("-inf")), best, col_start, base,
                               topk_fold.fold_limits(k)[0])
    assert torch.equal(got, want) and torch.equal(done, want_done)
    assert torch.equal(got[0], best[0]) and torch.equal(got[4], best[4]) and done[[0, 4]].all()


def test_limits_leave_rows_undone(device, monkeypatch):
    r, k = 3, 32
    best = running_best(r, k, 1000, seed=2, fill=1000)
    x = torch.randn(r, 500) * 1.5
    base = torch.zeros(r, dtype=torch.int32)
    monkeypatch.setattr(topk_fold, "CANDIDATES", 4)
    got, done = fold(x, best, 1000, base, device)
    want, want_done = expected(x, best, 1000, base, 4)
    assert torch.equal(got, want) and torch.equal(done, want_done)
    monkeypatch.setattr(topk_fold, "MAX_K", 16)
    got, done = fold(x, best, 1000, base, device)
    assert torch.equal(got, best) and (done == 0).all()


def test_bad_inputs_name_the_argument():
    x = torch.zeros(2, 8)
    best = torch.zeros(2, 4, dtype=torch.int64)
    scratch = torch.zeros(2, 4, dtype=torch.int64)
    done = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="fold_above_floor.*'x'"):
        fold_above_floor(x.double(), best, 0, None, scratch, done)
    with pytest.raises(ValueError, match="fold_above_floor.*'scratch'"):
        fold_above_floor(x, best, 0, None, scratch[:, :3], done)
    with pytest.raises(ValueError, match="fold_above_floor.*'done'"):
        fold_above_floor(x, best, 0, None, scratch, done.long())
    with pytest.raises(ValueError, match="fold_above_floor.*'best'"):
        fold_above_floor(x, best[:1], 0, None, scratch, done)


@pytest.mark.gpu
@pytest.mark.parametrize("k,windows", [(512, 2), (512, 8), (2048, 2), (2048, 8)])
def test_gpu_fold_production_rows(k, windows):
    """4096 rows, a 16,384-column window after ``windows`` earlier ones (k / windows keys above
    the floor on average: some rows folded, others left), against torch."""
    r, w = 4096, 16384
    torch.manual_seed(k + windows)
    base = torch.zeros(r, dtype=torch.int32, device="cuda")
    best = ref_topk_sort_keys(torch.randn(r, w * windows, device="cuda"), 0, base).topk(k, dim=1).values
    x = torch.randn(r, w, device="cuda")
    scratch = torch.empty(r, k, dtype=torch.int64, device="cuda")
    done = torch.empty(r, dtype=torch.int32, device="cuda")
    got = best.clone()
    fold_above_floor(x, got, w * windows, base, scratch, done)
    want, want_done = expected(x, best, w * windows, base, topk_fold.fold_limits(k)[0])
    assert torch.equal(done, want_done.to(done.device)) and torch.equal(got, want)

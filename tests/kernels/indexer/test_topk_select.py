"""Radix-select row top-k (``topk_select.row_topk_keys``) against torch.topk of the same keys."""
import pytest
import torch

from sm12x.kernels.indexer.reference import ref_topk_sort_keys
from sm12x.kernels.indexer.topk_select import INT64_MIN, row_topk_keys


def ref_keys(x, k, col_start=0, base=None):
    """torch.topk of the window's int64 sort keys."""
    return ref_topk_sort_keys(x, col_start, base).topk(k, dim=1).values


def rows_with_ties(r, w, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(r, w, generator=g)
    x[0, ::3] = float("-inf")  # invisible columns
    if r > 1:
        x[1] = torch.randint(-3, 3, (w,), generator=g).float()  # many exact ties
    if r > 2:
        x[2, : w // 2], x[2, w // 2:] = -0.0, 0.0
    if r > 3:
        x[3] = float("-inf")  # a row that sees nothing
    return x


@pytest.mark.parametrize("r,w,k", [(3, 100, 7), (5, 3000, 64), (4, 2048, 2048), (6, 1500, 300)])
def test_matches_topk_of_keys(device, r, w, k):
    x = rows_with_ties(r, w, seed=r * w)
    base = torch.randint(0, 5, (r,), dtype=torch.int32)
    got = row_topk_keys(x.to(device), k, col_start=10, base=base.to(device)).cpu()
    assert got.shape == (r, k) and got.dtype == torch.int64
    assert torch.equal(got.sort(dim=1, descending=True).values, ref_keys(x, k, 10, base))


@pytest.mark.parametrize("segment", [512, 1024, 2000])
@pytest.mark.parametrize("r,w,k", [(5, 3000, 64), (4, 2048, 2048), (6, 4100, 300)])
def test_wide_rows_split_into_segments(device, monkeypatch, segment, r, w, k):
    """Rows wider than SEGMENT go through the per-segment launches (histogram passes with
    atomics, counts, ordered writes): the same keys, ties to the lower column."""
    from sm12x.kernels.indexer import topk_select

    monkeypatch.setattr(topk_select, "SEGMENT", segment)
    x = rows_with_ties(r, w, seed=r * w + segment)
    base = torch.randint(0, 5, (r,), dtype=torch.int32)
    got = row_topk_keys(x.to(device), k, col_start=10, base=base.to(device)).cpu()
    assert torch.equal(got.sort(dim=1, descending=True).values, ref_keys(x, k, 10, base))
    got = row_topk_keys(x.to(device), k).cpu()  # no base
    assert torch.equal(got.sort(dim=1, descending=True).values, ref_keys(x, k))


def test_floor_keeps_only_keys_above_it(device):
    """With a floor, the k best keys among those > floor[r]; INT64_MIN pads rows that have fewer.
    Rows: few entries above the floor (shortcut), many above it (radix passes), none above."""
    r, w, k = 5, 3000, 64
    x = rows_with_ties(r, w, seed=11)
    base = torch.randint(0, 5, (r,), dtype=torch.int32)
    all_keys = ref_keys(x, w, 10, base)  # every key of each row, best first
    floor = torch.stack([all_keys[0, 20], all_keys[1, 500], all_keys[2, 63], all_keys[3, 0],
                         torch.tensor(INT64_MIN)])
    got = row_topk_keys(x.to(device), k, col_start=10, base=base.to(device),
                        floor=floor.to(device)).cpu().sort(dim=1, descending=True).values
    want = torch.where(all_keys[:, :k] > floor[:, None], all_keys[:, :k],
                       torch.full_like(all_keys[:, :k], INT64_MIN))
    assert torch.equal(got, want)


def test_no_base_and_strided_rows(device):
    x = rows_with_ties(4, 600, seed=3)
    wide = torch.full((4, 700), 5.0)
    wide[:, :600] = x
    got = row_topk_keys(wide.to(device)[:, :600], 50).cpu()
    assert torch.equal(got.sort(dim=1, descending=True).values, ref_keys(x, 50))


def test_bad_arguments_name_the_op_and_argument():
    x = torch.zeros(2, 10)
    with pytest.raises(ValueError, match="row_topk_keys.*k"):
        row_topk_keys(x, 11)
    with pytest.raises(ValueError, match="row_topk_keys.*x"):
        row_topk_keys(x.double(), 3)
    with pytest.raises(ValueError, match="row_topk_keys.*base"):
        row_topk_keys(x, 3, base=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="row_topk_keys.*floor"):
        row_topk_keys(x, 3, floor=torch.zeros(2, dtype=torch.int32))


@pytest.mark.parametrize("segment", [None, 1024])
def test_skipped_rows_are_left_alone(device, monkeypatch, segment):
    """Rows with skip != 0 are neither read nor written, on both paths; the others are exact."""
    from sm12x.kernels.indexer import topk_select

    if segment:
        monkeypatch.setattr(topk_select, "SEGMENT", segment)
    r, w, k = 5, 3000, 64
    x = rows_with_ties(r, w, seed=7)
    skip = torch.tensor([0, 1, 0, 1, 0], dtype=torch.int32)
    out = torch.full((r, k), 123, dtype=torch.int64)
    got = row_topk_keys(x.to(device), k, out=out.to(device), skip=skip.to(device)).cpu()
    want = ref_keys(x, k)
    keep = skip == 0
    assert torch.equal(got[keep].sort(dim=1, descending=True).values, want[keep])
    assert (got[~keep] == 123).all()


@pytest.mark.parametrize("segment", [None, 512])
@pytest.mark.parametrize("k", [7, 300])
def test_ends_limit_what_each_row_reads(device, monkeypatch, segment, k):
    """With ends, row r reads only columns whose position col_start + c < ends[r]: the others,
    poisoned with +inf and NaN here, count as -inf. Rows end before the window, inside it with
    fewer than k columns left and with more, and past it; a floor on top of them too."""
    from sm12x.kernels.indexer import topk_select

    if segment:
        monkeypatch.setattr(topk_select, "SEGMENT", segment)
    r, w, col_start = 6, 3000, 100
    x = rows_with_ties(r, w, seed=k)
    ends = torch.tensor([50, 100 + k // 2, 1500, 3100, 100 + k, 2000], dtype=torch.int32)
    past = (col_start + torch.arange(w))[None, :] >= ends[:, None]
    poisoned = x.masked_fill(past, float("inf"))
    poisoned[:, ::7] = torch.where(past[:, ::7], float("nan"), poisoned[:, ::7])
    want = ref_keys(x.masked_fill(past, float("-inf")), k, col_start)
    got = row_topk_keys(poisoned.to(device), k, col_start=col_start, ends=ends.to(device)).cpu()
    assert torch.equal(got.sort(dim=1, descending=True).values, want)
    if segment:
        return  # the segmented path does not take a floor (a shortcut only)
    # a floor: the keys above it among the visible ones, INT64_MIN after them
    floor = want[:, k // 3].clone()
    got = row_topk_keys(poisoned.to(device), k, col_start=col_start, ends=ends.to(device),
                        floor=floor.to(device)).cpu().sort(dim=1, descending=True).values
    assert torch.equal(got, torch.where(want > floor[:, None], want, torch.full_like(want, INT64_MIN)))


@pytest.mark.parametrize("segment", [None, 512])
@pytest.mark.parametrize("k", [7, 300])
def test_starts_and_ends_limit_what_each_row_reads(device, monkeypatch, segment, k):
    """With starts and ends, row r reads only columns whose position starts[r] <= col_start + c
    < ends[r] (a prefill chunk of several requests): the others, poisoned with +inf and NaN,
    count as -inf. Ranges before, across, inside (fewer and more than k columns, also in a later
    segment), after; empty ones; a floor on top of them too."""
    from sm12x.kernels.indexer import topk_select

    if segment:
        monkeypatch.setattr(topk_select, "SEGMENT", segment)
    col_start = 100
    ranges = [(0, 50), (90, 100 + k), (150, 150 + k // 2), (700, 1500), (1700, 3100), (3200, 4000),
              (1300, 1300 + k // 2), (1100, 1100), (1500, 1200), (0, 5000)]
    r, w = len(ranges), 3000
    x = rows_with_ties(r, w, seed=k + 1)
    starts = torch.tensor([a for a, _ in ranges], dtype=torch.int32)
    ends = torch.tensor([b for _, b in ranges], dtype=torch.int32)
    pos = (col_start + torch.arange(w))[None, :]
    outside = (pos < starts[:, None]) | (pos >= ends[:, None])
    poisoned = x.masked_fill(outside, float("inf"))
    poisoned[:, ::7] = torch.where(outside[:, ::7], float("nan"), poisoned[:, ::7])
    base = torch.randint(0, 5, (r,), dtype=torch.int32)
    want = ref_keys(x.masked_fill(outside, float("-inf")), k, col_start, base)
    args = dict(col_start=col_start, base=base.to(device), ends=ends.to(device), starts=starts.to(device))
    got = row_topk_keys(poisoned.to(device), k, **args).cpu()
    assert torch.equal(got.sort(dim=1, descending=True).values, want)
    if segment:
        return  # the segmented path does not take a floor (a shortcut only)
    floor = want[:, k // 3].clone()
    got = row_topk_keys(poisoned.to(device), k, floor=floor.to(device), **args).cpu()
    got = got.sort(dim=1, descending=True).values
    assert torch.equal(got, torch.where(want > floor[:, None], want, torch.full_like(want, INT64_MIN)))


def test_segment_width_spreads_few_rows(monkeypatch):
    """Few wide rows get narrower segments (down to BLOCK) until every SM has two programs; rows
    up to SEGMENT wide keep one program each."""
    from sm12x.kernels.indexer import topk_select

    monkeypatch.setenv("SM12X_NUM_SMS", "132")
    cpu = torch.device("cpu")
    assert topk_select.segment_width(1, 262144, cpu) == topk_select.BLOCK  # 256 programs < 264
    assert topk_select.segment_width(4, 262144, cpu) == 2048  # 4 x 128 programs
    assert topk_select.segment_width(256, 262144, cpu) == topk_select.SEGMENT
    assert topk_select.segment_width(20, 20000, cpu) == topk_select.BLOCK  # 20 x 20, not below BLOCK
    assert topk_select.segment_width(1, 10688, cpu) == 10688  # one program per row

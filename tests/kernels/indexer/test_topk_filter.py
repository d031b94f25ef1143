"""The radix select's candidate filter (``topk_filter.topk_keys``): on many wide rows it gives
the same keys through it, on both of its paths (candidates, and the full select for rows whose
sample was far off)."""
import pytest
import torch

from sm12x.kernels.indexer import topk_filter
from tests.kernels.indexer.test_topk_select import ref_keys, rows_with_ties

ROWS = topk_filter.MIN_ROWS


def visible(x, col_start, starts, ends):
    """x with the columns outside each row's [starts, ends) set to -inf (what the select sees)."""
    pos = col_start + torch.arange(x.shape[1])[None]
    return torch.where((pos >= starts[:, None]) & (pos < ends[:, None]), x, float("-inf"))


def paths(monkeypatch):
    """Record which rows each of the filter's two selects answers."""
    seen = {}
    run = topk_filter.row_topk_keys

    def spy(x, k, *args, **kwargs):
        path = "candidates" if kwargs.get("cols") is not None else "full"
        seen[path] = (kwargs["skip"] == 0).nonzero().flatten().tolist()
        return run(x, k, *args, **kwargs)

    monkeypatch.setattr(topk_filter, "row_topk_keys", spy)
    return seen


@pytest.mark.parametrize("w,k", [(5000, 64), (40000, 100)])  # one program per row; segments of a row
def test_filtered_keys_match(device, monkeypatch, w, k):
    """Ties, -0.0 / 0.0, -inf columns, rows that see nothing or fewer than k entries, ranges and a
    base: the same keys as torch.topk of the visible keys."""
    seen = paths(monkeypatch)
    x = rows_with_ties(ROWS + 1, w, seed=w)
    g = torch.Generator().manual_seed(1)
    starts = torch.randint(0, w // 4, (ROWS + 1,), generator=g, dtype=torch.int32) + 11
    ends = torch.randint(w // 2, w, (ROWS + 1,), generator=g, dtype=torch.int32) + 11
    ends[5], ends[6] = starts[5] + k // 3, starts[6]  # fewer than k visible; none
    base = torch.randint(0, 5, (ROWS + 1,), generator=g, dtype=torch.int32)
    assert topk_filter.capacity(ROWS + 1, w, k)
    got = topk_filter.topk_keys(x.to(device), k, 11, base.to(device), starts=starts.to(device),
                                ends=ends.to(device)).cpu()
    assert torch.equal(got.sort(dim=1, descending=True).values,
                       ref_keys(visible(x, 11, starts, ends), k, 11, base))
    # only rows of ties (1: small integers, 2: -0.0 / 0.0, 3: all -inf) can have more entries at
    # the threshold than a candidate row holds; row 3 always does
    assert 3 in seen["full"] and set(seen["full"]) <= {1, 2, 3}
    assert seen["candidates"] == [r for r in range(ROWS + 1) if r not in seen["full"]]


def test_rows_whose_sample_is_off_take_the_full_select(device, monkeypatch):
    """A row where fewer than k entries reach the sample's threshold (its sample is all of its
    large values) and one where nearly every entry exceeds it (more than the candidate row holds)
    fall back to the full select; the others still take the candidates."""
    seen = paths(monkeypatch)
    w, k = 8192, 64
    x = torch.randn(ROWS, w, generator=torch.Generator().manual_seed(2))
    sampled = torch.arange(topk_filter.SAMPLE) * w // topk_filter.SAMPLE
    x[0] = -1.0
    x[0, sampled] = 10 + torch.arange(topk_filter.SAMPLE) / 1000  # only the sampled entries are
    # large: fewer than k of them reach the sample's threshold
    x[1] = 1.0
    x[1, sampled] = -1.0  # the threshold is -1: every other entry exceeds it
    got = topk_filter.topk_keys(x.to(device), k).cpu()
    assert torch.equal(got.sort(dim=1, descending=True).values, ref_keys(x, k))
    assert seen == {"candidates": list(range(2, ROWS)), "full": [0, 1]}


def test_capacity_rule():
    """The entries expected to reach the threshold in a full-width row plus 5 standard deviations,
    in BLOCKs; 0 for few rows, or where that is more than half the row or wider than one
    row-kernel row."""
    assert topk_filter.sample_rank(512, 262144) == 29  # 2 expected above k, room for the spread
    assert topk_filter.capacity(32, 262144, 512) == 14336
    assert topk_filter.capacity(4096, 16384, 512) == 2048
    assert topk_filter.capacity(4096, 16384, 2048) == 5120
    assert topk_filter.capacity(256, 10624, 2048) == 4096
    assert topk_filter.capacity(8, 262144, 512) == 0  # too few rows
    assert topk_filter.capacity(4096, 4096, 2048) == 0  # more than half the row
    assert topk_filter.capacity(32, 262144, 2048) == 0  # wider than SEGMENT

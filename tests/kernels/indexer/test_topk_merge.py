"""Merge of a running top-k with candidates (``topk_merge.merge_topk_keys``) against torch.topk."""
import pytest
import torch

from sm12x.kernels.indexer.topk_merge import INT64_MIN, merge_topk_keys


def random_keys(r, n, seed, invisible=0.1):
    """Distinct int64 keys (value in the high half, a unique index in the low half), some INT64_MIN."""
    g = torch.Generator().manual_seed(seed)
    hi = torch.randint(-1000, 1000, (r, n), generator=g)  # many equal values: the low half decides
    lo = torch.stack([torch.randperm(1 << 20, generator=g)[:n] for _ in range(r)])
    keys = (hi << 32) | lo
    return torch.where(torch.rand(r, n, generator=g) < invisible, torch.full_like(keys, INT64_MIN), keys)


def expected(best, cand, k):
    merged = cand if best is None else torch.cat([best, cand], dim=1)
    if merged.shape[1] < k:
        merged = torch.cat([merged, torch.full((merged.shape[0], k - merged.shape[1]), INT64_MIN)], dim=1)
    return merged.topk(k, dim=1, sorted=True).values


@pytest.mark.parametrize("r,k,m", [(5, 512, 512), (3, 7, 20), (4, 64, 3), (2, 2048, 2048), (2, 2048, 700), (2, 2048, 20),
                                   (3, 100, 1)])
def test_merge_matches_topk(device, r, k, m):
    both = random_keys(r, k + m, seed=k + m)
    best = both[:, :k].sort(dim=1, descending=True).values
    cand = both[:, k:]
    out = torch.empty(r, k, dtype=torch.int64)
    got = merge_topk_keys(best.to(device), cand.to(device), out.to(device)).cpu()
    assert torch.equal(got, expected(best, cand, k))


@pytest.mark.parametrize("k", [512, 2048])
def test_out_may_be_an_input(device, k):
    """The running top-k merges into its own buffer (out is best), and a first window may sort in
    place (out is cand), in the kernel (512) and in torch's sort (2048) alike."""
    both = random_keys(3, 2 * k, seed=k)
    best = both[:, :k].sort(dim=1, descending=True).values.to(device)
    cand = both[:, k:].contiguous().to(device)
    want = expected(best.cpu(), cand.cpu(), k)
    assert torch.equal(merge_topk_keys(best, cand, best).cpu(), want) and torch.equal(best.cpu(), want)
    want = expected(None, cand.cpu(), k)
    assert torch.equal(merge_topk_keys(None, cand, cand).cpu(), want)


def test_first_window_pads_with_int64_min(device):
    cand = random_keys(4, 30, seed=1)
    got = merge_topk_keys(None, cand.to(device), torch.empty(4, 50, dtype=torch.int64, device=device)).cpu()
    assert torch.equal(got, expected(None, cand, 50))
    assert (got[:, 30:] == INT64_MIN).all()


@pytest.mark.parametrize("by_torch", [False, True])
@pytest.mark.parametrize("m", [2048, 1500])
def test_wide_first_window_is_sorted(monkeypatch, device, m, by_torch):
    """A first window of top-2048: sorted by the kernel (32 warps) for up to FIRST_SORT_MAX_ROWS
    rows, by torch for more; padded when short."""
    from sm12x.kernels.indexer import topk_merge

    if by_torch:
        monkeypatch.setattr(topk_merge, "FIRST_SORT_MAX_ROWS", 2)
    cand = random_keys(3, m, seed=m)
    got = merge_topk_keys(None, cand.to(device), torch.empty(3, 2048, dtype=torch.int64, device=device)).cpu()
    assert torch.equal(got, expected(None, cand, 2048))


def test_in_place_into_best(device):
    both = random_keys(3, 96, seed=2)
    best = both[:, :64].sort(dim=1, descending=True).values.to(device)
    want = expected(best.cpu(), both[:, 64:], 64)
    assert merge_topk_keys(best, both[:, 64:].contiguous().to(device), best) is best
    assert torch.equal(best.cpu(), want)


def test_wider_than_one_program_falls_back_to_torch(device):
    both = random_keys(2, 3000 + 2000, seed=3)
    best = both[:, :3000].sort(dim=1, descending=True).values
    out = torch.empty(2, 3000, dtype=torch.int64, device=device)
    got = merge_topk_keys(best.to(device), both[:, 3000:].contiguous().to(device), out).cpu()
    assert torch.equal(got, expected(best, both[:, 3000:], 3000))


def test_bad_inputs_name_the_argument():
    cand = torch.zeros(2, 8, dtype=torch.int64)
    with pytest.raises(ValueError, match="merge_topk_keys.*cand"):
        merge_topk_keys(None, cand.float(), torch.empty(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="merge_topk_keys.*out"):
        merge_topk_keys(None, cand, torch.empty(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="merge_topk_keys.*best"):
        merge_topk_keys(torch.zeros(2, 5, dtype=torch.int64), cand, torch.empty(2, 4, dtype=torch.int64))


# the kernel; the kernel at MAX_WIDTH_SKIPPING (skip given); torch above it
@pytest.mark.parametrize("k,m", [(64, 64), (2048, 2048), (3000, 2000)])
def test_skipped_rows_are_left_alone(device, k, m):
    both = random_keys(4, k + m, seed=k)
    best = both[:, :k].sort(dim=1, descending=True).values
    skip = torch.tensor([1, 0, 0, 1], dtype=torch.int32)
    out = torch.full((4, k), 99, dtype=torch.int64)
    got = merge_topk_keys(best.to(device), both[:, k:].contiguous().to(device), out.to(device),
                          skip=skip.to(device)).cpu()
    want = expected(best, both[:, k:], k)
    assert torch.equal(got[1:3], want[1:3]) and (got[[0, 3]] == 99).all()

"""V4.1 consumer layers over their candidate keys only (:mod:`sm12x.kernels.indexer.candidate_gather`):
the positions each row ranks, and the indices against vLLM's mask + top-k on the kernels' own
logits, for FP8 and FP4 keys, prefill and paged decode, with duplicate, negative and edge-clamped
candidates and rows that see the edge key or fewer candidate keys than topk."""
import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as api
from sm12x.kernels.indexer import candidate_gather as cg
from sm12x.kernels.indexer import candidate_topk as ct
from sm12x.kernels.indexer.cache import quant_fp4_paged_cache, quant_fp4_per_token, quant_fp8_paged_cache
from sm12x.kernels.indexer.reference import (paged_valid_ends, ref_candidate_mask, ref_indexer_topk,
                                             topk_rows_differing)

from tests.kernels.indexer.test_candidate_topk import row_local
from tests.kernels.indexer.test_mqa_logits import make_inputs
from tests.kernels.indexer.test_paged_mqa_logits import make_paged


def ref_positions(cands, end, width, bs):
    """The visible positions a consumer row keeps, from vLLM's mask rule, one row in Python."""
    nblocks = -(-width // bs)
    keep = set()
    for b in cands:
        if b < 0:
            continue
        if b >= nblocks:
            keep.add(width - 1)
        else:
            keep.update(range(b * bs, (b + 1) * bs))
    return sorted(p for p in keep if p < min(end, width))


def listed(cands, ends, width, bs, device, ks_shift=3):
    """``_gather_kernel`` over flat keys whose value words and scale hold their own row number:
    (positions, counts, and per row the key rows its gathered pages hold, in slot order)."""
    import triton

    rows, k = cands.shape
    n_pad = -(-(k * bs + 1) // cg.PAGE) * cg.PAGE
    n_keys = width + ks_shift + 8
    values = torch.arange(n_keys, dtype=torch.int32, device=device)[:, None].repeat(1, 32)  # FP8 rows: 32 words
    scales = torch.arange(n_keys, dtype=torch.int32, device=device)
    ks = torch.full((rows,), ks_shift, dtype=torch.int32, device=device)
    pos = torch.empty((rows, n_pad), dtype=torch.int32, device=device)
    count = torch.empty((rows,), dtype=torch.int32, device=device)
    cache = torch.zeros((rows * n_pad // cg.PAGE, cg.PAGE * 132 // 4), dtype=torch.int32, device=device)
    blk = cg._sorted_blocks(cands.to(device), -(-width // bs))
    cg._gather_kernel[(rows, triton.cdiv(n_pad, cg.GATHER_SLOTS))](
        blk, cands.to(device).contiguous(), k, ends.to(device).int(), width, -(-width // bs), values, scales, ks, ks,
        0, 0, 1, cache, pos, count, n_pad, BS=bs, KP2=triton.next_power_of_2(k), DB=128, BLOCK_KV=64, PAGED=False,
        PG=cg.PAGE, SLOTS=cg.GATHER_SLOTS)
    pages = cache.view(rows, n_pad // cg.PAGE, -1)
    held_values = pages[:, :, : cg.PAGE * 32].reshape(rows, n_pad // cg.PAGE, cg.PAGE, 32)
    held_scales = pages[:, :, cg.PAGE * 32:]
    assert torch.equal(held_values, held_values[..., :1].expand_as(held_values))  # whole rows copied
    return pos.cpu(), count.cpu(), held_values[..., 0].reshape(rows, -1).cpu(), held_scales.reshape(rows, -1).cpu()


def test_candidates_listed_and_gathered_by_vllms_mask_rule(device):
    width, bs = 37, 8  # 5 blocks, the last one partial (32..36)
    cands = torch.tensor([[1, 1, -1, 0],     # a repeat and an ignored entry
                          [9, 2, 4, -1],     # past the width -> the edge key 36 (inside block 4 already)
                          [7, 3, -1, -1],    # past the width -> the edge key alone
                          [2, 3, 4, 0],      # a row that sees 20 positions
                          [-1, -1, -1, -1],
                          [4, 6, 0, 0]], dtype=torch.int32)  # the cut last block and an edge entry
    ends = torch.tensor([37, 40, 37, 20, 37, 35])
    pos, count, rows_held, scales_held = listed(cands, ends, width, bs, device)
    for r in range(cands.shape[0]):
        want = ref_positions(cands[r].tolist(), int(ends[r]), width, bs)
        n = int(count[r])
        assert pos[r, :n].tolist() == want and n == len(want)
        assert bool((pos[r, n:] == -1).all())
        assert rows_held[r, :n].tolist() == [3 + p for p in want] == scales_held[r, :n].tolist()


def test_the_path_is_taken_only_for_wide_rows():
    assert cg.worthwhile(4 * (512 * 8 + 1), 512, 8)
    assert not cg.worthwhile(4 * (512 * 8 + 1) - 1, 512, 8)
    assert not cg.worthwhile(1 << 20, 0, 8)


def edge_candidates(rows, k, nblocks, seed):
    """Random blocks with duplicates, -1 entries, a clamped edge entry and a row of few blocks."""
    g = torch.Generator().manual_seed(seed)
    cand = torch.randint(-1, nblocks + 2, (rows, k), generator=g, dtype=torch.int32)
    cand[0, :2] = cand[0, 2]  # duplicates
    cand[1, -1] = nblocks  # the edge key
    cand[-1, 1:] = -1  # one block: fewer candidate keys than topk
    return cand


@pytest.fixture
def gathered(monkeypatch):
    """Every consumer call on the candidate-keys path (the tests' widths are small)."""
    monkeypatch.setattr(cg, "MIN_WIDTH_RATIO", 0)


@pytest.mark.parametrize("fp4", [False, True])
def test_prefill_consumer_on_candidate_keys(device, gathered, fp4):
    # two requests; the second's rows reach its end, the width (so the edge key is visible)
    ks = torch.tensor([0, 0, 0, 120, 120, 120], dtype=torch.int32)
    ke = torch.tensor([70, 90, 120, 200, 250, 250], dtype=torch.int32)
    s, s_kv, bs, k, topk = 6, 250, 8, 5, 24
    width = int((ke - ks).max())
    inp = make_inputs(s, s_kv, 8, 64, fp4, device, seed=7)
    q = inp["q"] if fp4 else inp["q"][0]
    ks_d, ke_d = ks.to(device), ke.to(device)
    cand = edge_candidates(s, k, -(-width // bs), seed=1).to(device)
    cand[4, 0] = -(-width // bs)  # a row whose visible end is the width gets the edge key
    idx = ct.mqa_candidate_topk_indices(q, inp["kv"], inp["weights"], ks_d, ke_d, topk, width=width, block_size=bs,
                                        candidates=cand, write=False)
    flat = api.fp8_fp4_mqa_logits(q, inp["kv"], inp["weights"], ks_d, ke_d).cpu()
    ends = ke - ks
    masked = ref_candidate_mask(row_local(flat, ks, ke, width), ends, cand.cpu(), bs, fill=ct.MASKED)
    assert torch.equal(idx.cpu(), ref_indexer_topk(masked, topk, None, ends))
    assert torch.equal((idx >= 0).sum(1).cpu(), ends.clamp(max=topk))


@pytest.mark.parametrize("fp4,next_n,pad", [(False, 2, 0), (True, 1, 64)])
def test_decode_consumer_on_candidate_keys(device, gathered, fp4, next_n, pad):
    ctx, bs, k, topk = [0, 130, 256, 200], 16, 4, 30
    inp = make_paged(4, next_n, 8, 64, 32, ctx, fp4, device, pad_bytes=pad, seed=8, max_blocks=8)
    q = inp["q"] if fp4 else inp["q"][0]
    width, rows = inp["max_context_len"], 4 * next_n
    args = (q, inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"])
    cand = edge_candidates(rows, k, -(-width // bs), seed=2).to(device)
    idx = ct.paged_mqa_candidate_topk_indices(*args, width, topk, block_size=bs, candidates=cand, write=False)
    logits = api.fp8_fp4_paged_mqa_logits(*args, None, width, clean_logits=True).cpu()
    ends = paged_valid_ends(inp["context_lens"].cpu(), next_n)
    want = ref_indexer_topk(ref_candidate_mask(logits, ends, cand.cpu(), bs, fill=ct.MASKED), topk, None, ends)
    assert torch.equal(idx.cpu(), want)
    assert int(ends.max()) == width  # the 256-token request sees the edge key


def test_row_groups_cover_every_row(device, gathered, monkeypatch):
    """Row groups smaller than the call: each group's rows land in their own output rows."""
    ctx = [100, 180, 250]
    inp = make_paged(3, 2, 8, 64, 32, ctx, False, device, seed=9, max_blocks=8)
    args = (inp["q"][0], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"])
    width, bs, topk = inp["max_context_len"], 8, 16
    cand = edge_candidates(6, 6, -(-width // bs), seed=3).to(device)
    whole = ct.paged_mqa_candidate_topk_indices(*args, width, topk, block_size=bs, candidates=cand, write=False)
    monkeypatch.setattr(cg, "GROUP_BYTES", 1)
    grouped = ct.paged_mqa_candidate_topk_indices(*args, width, topk, block_size=bs, candidates=cand, write=False)
    assert torch.equal(whole, grouped)


def test_bad_input_names_the_op(device, gathered):
    inp = make_paged(1, 1, 8, 64, 32, [64], False, device, seed=1)
    args = (inp["q"][0], inp["cache"], inp["weights"][:, :4], inp["context_lens"], inp["block_table"])
    with pytest.raises(ValueError, match="candidate_topk.*'weights'"):
        ct.paged_mqa_candidate_topk_indices(*args, 64, 8, block_size=8,
                                            candidates=torch.zeros(1, 2, dtype=torch.int32, device=device),
                                            write=False)


@pytest.mark.gpu
@pytest.mark.parametrize("fp4", [False, True])
def test_gpu_v41_consumer_at_1m_on_candidate_keys(fp4):
    """V4.1 decode consumers at a 1,048,576-position window (requests up to 300,000 keys; pages drawn
    from a shared pool), 64 heads x 128, 512 candidate blocks of 8, top-1024: the candidate-keys
    path against vLLM's mask + top-k on the paged kernel's own logits (as sets; a key may differ
    only where it ties the row's k-th score within 1e-5 relative)."""
    width, bs, k, topk, block_kv, pool = 1 << 20, 8, 512, 1024, 64, 6000
    g = torch.Generator(device="cuda").manual_seed(11)
    raw = torch.randn(pool, block_kv, 128, generator=g, device="cuda")
    cache = quant_fp4_paged_cache(raw) if fp4 else quant_fp8_paged_cache(raw)
    q = torch.randn(4, 1, 64, 128, generator=g, device="cuda")
    q = quant_fp4_per_token(q) if fp4 else q.to(torch.float8_e4m3fn)
    w = torch.randn(4, 64, generator=g, device="cuda")
    cl = torch.tensor([300000, 5000, 1200, 262144], dtype=torch.int32, device="cuda")
    bt = torch.randint(0, pool, (4, width // block_kv), generator=g, device="cuda", dtype=torch.int32)
    cand = torch.full((4, k), -1, dtype=torch.int32, device="cuda")
    for r, end in enumerate(cl.tolist()):
        picks = torch.randperm(-(-end // bs), generator=g, device="cuda")[:k]
        cand[r, : picks.numel()] = picks.int()
    args = (q, cache, w, cl, bt)
    idx = ct.paged_mqa_candidate_topk_indices(*args, width, topk, block_size=bs, candidates=cand, write=False)
    logits = api.fp8_fp4_paged_mqa_logits(*args, None, width, clean_logits=True)
    ends = paged_valid_ends(cl, 1)
    masked = ref_candidate_mask(logits, ends, cand, bs, fill=ct.MASKED)
    want = ref_indexer_topk(masked, topk, None, ends)
    assert torch.equal((idx >= 0).sum(1), ends.clamp(max=topk))
    assert topk_rows_differing(idx, want, masked) == 0

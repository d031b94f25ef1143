"""Fused top-k over DeepSeek-V4.1's candidate blocks (prefill and paged decode) against the
references of vLLM's block selection / mask applied to the kernels' own logits."""
import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as api
from sm12x.kernels.indexer import candidate_topk as ct
from sm12x.kernels.indexer import fused_topk as tk
from sm12x.kernels.indexer.reference import (HEAD_SUM_TOL, paged_valid_ends, ref_candidate_mask, ref_indexer_topk,
                                             ref_logit_sizes, ref_mqa_logits, ref_select_candidate_blocks,
                                             topk_rows_differing)

from tests.kernels.indexer.test_indexer_topk import chunk_ranges
from tests_support import assert_within_sm12x_limits
from tests.kernels.indexer.test_mqa_logits import make_inputs
from tests.kernels.indexer.test_paged_mqa_logits import make_paged


def row_local(flat, ks, ke, width):
    """[S, S_kv] flat logits -> [S, width]: column c is key ks + c (vLLM's compressed logits)."""
    out = torch.full((flat.shape[0], width), float("-inf"))
    for i in range(flat.shape[0]):
        n = int(ke[i] - ks[i])
        out[i, :n] = flat[i, int(ks[i]):int(ks[i]) + n]
    return out


def some_candidates(rows, k, nblocks, seed):
    """Distinct random blocks, some -1 and one past the width (vLLM's edge clamp)."""
    g = torch.Generator().manual_seed(seed)
    cand = torch.stack([torch.randperm(nblocks + 2, generator=g)[:k] for _ in range(rows)]).to(torch.int32)
    cand[0, -1] = -1
    return cand


@pytest.mark.parametrize("block_size,k_blocks,topk", [(8, 6, 20), (64, 3, 7)])
def test_prefill_source_and_consumer(device, block_size, k_blocks, topk):
    """A chunk of two requests: the source's candidates are vLLM's selection of the logits, its
    indices the plain fused top-k; a consumer ranks only its candidate blocks."""
    ks, ke = chunk_ranges([3, 2], [150, 300])
    s, s_kv = ks.shape[0], int(ke.max())
    inp = make_inputs(s, s_kv, 8, 64, False, device, seed=3)
    ks, ke = ks.to(device), ke.to(device)
    width = int((ke - ks).max()) + 5  # DeepGEMM's max_seqlen_k may exceed every row's length
    flat = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke).cpu()
    local = row_local(flat, ks.cpu(), ke.cpu(), width)
    ends = (ke - ks).cpu()
    ws = 8 * s * 128  # several windows per row: the block maxima fold across windows

    cand = torch.full((s, k_blocks), -7, dtype=torch.int32, device=device)
    idx = ct.mqa_candidate_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, topk, width=width,
                                        block_size=block_size, candidates=cand, write=True, workspace_bytes=ws)
    assert torch.equal(cand.cpu().long(), ref_select_candidate_blocks(local, ends, k_blocks, block_size))
    assert torch.equal(idx.cpu(), tk.mqa_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, topk).cpu())

    nblocks = -(-width // block_size)
    theirs = some_candidates(s, k_blocks, nblocks, seed=block_size).to(device)
    idx = ct.mqa_candidate_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, topk, width=width,
                                        block_size=block_size, candidates=theirs, write=False, workspace_bytes=ws)
    masked = ref_candidate_mask(local, ends, theirs.cpu(), block_size, fill=ct.MASKED)
    want = ref_indexer_topk(masked, topk, None, ends)
    assert torch.equal(idx.cpu(), want)
    # each row returns min(visible, topk) positions, as vLLM's top_k_per_row does on -inf masks
    assert torch.equal((idx >= 0).sum(1).cpu(), ends.clamp(max=topk))


@pytest.mark.parametrize("next_n,ctx2d", [(1, True), (2, True), (2, False)])
def test_decode_source_and_consumer(device, next_n, ctx2d):
    ctx, block_size, k_blocks, topk = [5, 300, 650], 16, 5, 40
    inp = make_paged(3, next_n, 8, 64, 32, ctx, False, device, ctx2d=ctx2d, seed=4, max_blocks=24)
    args = (inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"])
    width = inp["max_context_len"]
    logits = api.fp8_fp4_paged_mqa_logits(*args, None, width, clean_logits=True).cpu()
    ends = paged_valid_ends(inp["context_lens"].cpu(), next_n)
    rows, ws = 3 * next_n, 8 * 3 * next_n * 128

    cand = torch.full((rows, k_blocks), -7, dtype=torch.int64, device=device)
    idx = ct.paged_mqa_candidate_topk_indices(*args, width, topk, block_size=block_size, candidates=cand, write=True,
                                              workspace_bytes=ws)
    assert torch.equal(cand.cpu(), ref_select_candidate_blocks(logits, ends, k_blocks, block_size))
    assert torch.equal(idx.cpu(), ref_indexer_topk(logits, topk, None, ends))

    theirs = some_candidates(rows, k_blocks, -(-width // block_size), seed=5).to(device)
    idx = ct.paged_mqa_candidate_topk_indices(*args, width, topk, block_size=block_size, candidates=theirs,
                                              write=False, workspace_bytes=ws)
    want = ref_indexer_topk(ref_candidate_mask(logits, ends, theirs.cpu(), block_size, fill=ct.MASKED), topk, None,
                            ends)
    assert torch.equal(idx.cpu(), want)


def test_bad_candidates_name_the_argument(device):
    inp = make_inputs(2, 64, 8, 64, False, device)
    ks = torch.zeros(2, dtype=torch.int32, device=device)
    ke = torch.full((2,), 64, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="candidate_topk.*'candidates'"):
        ct.mqa_candidate_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, 4, width=64, block_size=8,
                                      candidates=torch.zeros(3, 2, dtype=torch.int32, device=device), write=True)
    with pytest.raises(ValueError, match="candidate_topk.*'block_size'"):
        ct.mqa_candidate_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, 4, width=64, block_size=0,
                                      candidates=torch.zeros(2, 2, dtype=torch.int32, device=device), write=True)


def test_compiles_for_sm12x():
    reports = ct.compile_reports(("sm_120", "sm_121"))
    assert len(reports) == 8 + 2 * 9  # mask and block max; the gathers (2 shapes x FP8 / FP4 x flat / paged), fill
    assert_within_sm12x_limits(reports)


@pytest.mark.gpu
def test_gpu_v41_prefill_chunk():
    """A V4.1-shaped prefill chunk: 2,048 rows of one request over 65,536 compressed keys, 64 heads
    x 128, top-1024, 18 candidate blocks of 64: the source's blocks and indices, then a consumer's
    indices, exactly as vLLM's steps on the kernel's logits give them."""
    s, s_kv, topk, bs, kb = 2048, 65536, 1024, 64, 18
    inp = make_inputs(s, s_kv, 64, 128, False, "cuda", seed=21)
    ke = torch.arange(s_kv - s + 1, s_kv + 1, dtype=torch.int32, device="cuda")
    ks = torch.zeros_like(ke)
    cand = torch.empty((s, kb), dtype=torch.int32, device="cuda")
    src = ct.mqa_candidate_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, topk, width=s_kv, block_size=bs,
                                        candidates=cand, write=True)
    logits = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke)
    assert torch.equal(cand.long(), ref_select_candidate_blocks(logits, ke, kb, bs))
    assert torch.equal(src, ref_indexer_topk(logits, topk, ks, ke))
    w2 = inp["weights"].flip(-1).contiguous()
    con = ct.mqa_candidate_topk_indices(inp["q"], inp["kv"], w2, ks, ke, topk, width=s_kv, block_size=bs,
                                        candidates=cand, write=False)
    # these rows rank their candidate keys in the paged kernel (candidate_gather), not in the
    # mqa_logits the dense path ranks: against the float32 reference, as sets where a differing key
    # must be within the logits kernels' stated rounding of the k-th score (on the H100, 18 of these
    # rows differed by more than a 1e-5 tie, where the heads' weights nearly cancel)
    ref = (inp["q"][0], inp["kv"][0], inp["kv"][1], w2, ks, ke)
    masked = ref_candidate_mask(ref_mqa_logits(*ref), ke, cand, bs, fill=ct.MASKED)
    slack = HEAD_SUM_TOL * ref_logit_sizes(*ref)
    assert topk_rows_differing(con, ref_indexer_topk(masked, topk, ks, ke), masked, ks, slack=slack) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("b,next_n,avg_ctx,bs,kb", [(1, 1, 262144, 64, 18), (32, 2, 16384, 64, 18),
                                                    (8, 1, 131072, 8, 512)])
def test_gpu_v41_decode_model_length_window(b, next_n, avg_ctx, bs, kb):
    """V4.1 decode as vLLM 0.34 calls it: a 262,144-wide window, top-1024, 18 candidate blocks of
    64 or 512 of 8 (SGLang's V4.1 block size), one long request and batches of shorter ones."""
    from tests.kernels.indexer.test_paged_mqa_logits import _production

    model_len, topk = 262144, 1024
    qq, cache, w, cl, bt, _ = _production(b, next_n, avg_ctx, False)
    cl.clamp_(max=model_len)
    bt = torch.nn.functional.pad(bt, (0, model_len // 64 - bt.shape[1])) if bt.shape[1] < model_len // 64 \
        else bt[:, : model_len // 64].contiguous()
    rows = b * next_n
    ends = paged_valid_ends(cl, next_n)
    cand = torch.empty((rows, kb), dtype=torch.int32, device="cuda")
    src = ct.paged_mqa_candidate_topk_indices(qq, cache, w, cl, bt, model_len, topk, block_size=bs, candidates=cand,
                                              write=True)
    logits = api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, None, model_len, clean_logits=True)
    assert torch.equal(cand.long(), ref_select_candidate_blocks(logits, ends, kb, bs))
    assert torch.equal(src, ref_indexer_topk(logits, topk, None, ends))
    w2 = w.flip(-1).contiguous()
    con = ct.paged_mqa_candidate_topk_indices(qq, cache, w2, cl, bt, model_len, topk, block_size=bs, candidates=cand,
                                              write=False)
    logits = api.fp8_fp4_paged_mqa_logits(qq, cache, w2, cl, bt, None, model_len, clean_logits=True)
    masked = ref_candidate_mask(logits, ends, cand, bs, fill=ct.MASKED)
    assert topk_rows_differing(con, ref_indexer_topk(masked, topk, None, ends), masked) == 0


def test_rows_differing_slack():
    """topk_rows_differing: a key swapped for one within the slack of the k-th score passes, one
    beyond it (or beyond a 1e-5 tie without slack) is counted, and so is a set of another size."""
    logits = torch.tensor([[10.0, 9.0, 5.0, 4.99, 1.0]])
    want = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    near = torch.tensor([[0, 1, 3]], dtype=torch.int32)
    far = torch.tensor([[0, 1, 4]], dtype=torch.int32)
    slack = torch.full_like(logits, 0.02)
    assert topk_rows_differing(want, want, logits) == 0
    assert topk_rows_differing(near, want, logits) == 1
    assert topk_rows_differing(near, want, logits, slack=slack) == 0
    assert topk_rows_differing(far, want, logits, slack=slack) == 1
    assert topk_rows_differing(torch.tensor([[0, 1, -1]], dtype=torch.int32), want, logits, slack=slack) == 1

"""Candidate-only paged indexer logits (DeepGEMM get_paged_sparse_mqa_logits_metadata +
fp8_fp4_paged_sparse_mqa_logits, DeepSeek-V4.1's two-level indexer) against the PyTorch reference,
which reads the logical blocks and page table, not the schedule."""
import os

import pytest
import torch

from sm12x.frontends.deep_gemm import sparse_indexer as api
from sm12x.kernels.indexer.cache import quant_fp4_paged_cache, quant_fp4_per_token
from sm12x.kernels.indexer.reference import ref_paged_sparse_mqa_logits

DEVICE = os.environ.get("SM12X_TEST_DEVICE", "cpu")
pytestmark = pytest.mark.cpu_only  # inputs on the CPU; the GPU cases are marked gpu


def make_case(rows, h, lens, topk_blocks, page=64, bs=8, pad_bytes=0, seed=0, device="cpu", pages_per_row=None):
    """Random FP4 queries / pool / weights; each row owns randomly placed pages; its published blocks
    are a random ascending subset of its blocks that always holds the newest (SGLang's contract)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lens, dtype=torch.int32)
    pages_per_row = pages_per_row or int(-(-int(lens.max()) // page))
    nblocks = rows * pages_per_row + 2
    raw = torch.randn(nblocks, page, 128, generator=g)
    stride = page * 68 + pad_bytes if pad_bytes else None
    cache = quant_fp4_paged_cache(raw, stride)
    q, q_sf = quant_fp4_per_token(torch.randn(rows, h, 128, generator=g))
    w = torch.randn(rows, h, generator=g)
    table = torch.randperm(nblocks, generator=g)[: rows * pages_per_row].view(rows, pages_per_row).int()
    blocks = torch.full((rows, topk_blocks), 2**31 - 1, dtype=torch.int32)
    for r in range(rows):
        n = -(-int(lens[r]) // bs)
        if n == 0:
            continue
        if n <= topk_blocks:
            pick = torch.arange(n)
        else:
            pick = torch.cat([torch.randperm(n - 1, generator=g)[: topk_blocks - 1], torch.tensor([n - 1])]).sort().values
        blocks[r, : pick.numel()] = pick.int()
    to = lambda t: t.to(device)  # noqa: E731
    return dict(q=to(q), q_sf=to(q_sf), cache=cache.to(device) if device == "cpu" else _to_dev(cache, device),
                w=to(w), lens=to(lens), table=to(table), blocks=to(blocks), page=page, bs=bs)


def _to_dev(cache, device):
    storage = torch.empty(cache.untyped_storage().nbytes(), dtype=torch.uint8)
    storage.untyped_storage().copy_(cache.untyped_storage())
    storage = storage.to(device)
    return torch.as_strided(storage, cache.shape, cache.stride(), cache.storage_offset())


def run(c, rows_q=None, logits_dtype=None):
    rows = c["q"].shape[0] if rows_q is None else rows_q
    meta = api.get_paged_sparse_mqa_logits_metadata(c["lens"], c["table"], torch.arange(
        c["lens"].shape[0], dtype=torch.int32, device=c["lens"].device), c["page"], c["blocks"], torch.int8, c["bs"])
    q = (c["q"][:rows, None], c["q_sf"][:rows, None])
    return api.fp8_fp4_paged_sparse_mqa_logits(q, c["cache"], c["w"][:rows], meta, c["blocks"].shape[1], c["bs"])


def check(c, out, rows=None):
    rows = out.shape[0] if rows is None else rows
    ref = ref_paged_sparse_mqa_logits(c["q"][:rows].cpu(), c["q_sf"][:rows].cpu(), c["cache"].cpu(),
                                      c["w"][:rows].cpu(), c["lens"][:rows].cpu(), c["table"][:rows].cpu(),
                                      c["blocks"][:rows].cpu(), c["bs"])
    out = out.float().cpu()
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert torch.equal(out == float("-inf"), ref == float("-inf"))
    live = ref != float("-inf")
    # bf16 output: each logit is the float32 sum rounded once, within one bf16 ulp (2**-7 of its
    # magnitude: the interpreter's bf16 cast truncates; a GPU rounds to nearest, half that)
    err = (out[live] - ref[live]).abs()
    assert bool((err <= ref[live].abs() * 2**-7 + 1e-3).all()), float(err.max())


@pytest.mark.parametrize("h", [32, 64])
def test_matches_reference(h):
    # a row with fewer blocks than topk (identity table), a partial newest block, an empty row,
    # a row with more blocks than topk (a real selection)
    c = make_case(rows=4, h=h, lens=[37, 200, 0, 129], topk_blocks=12, page=64)
    out = run(c)
    assert out.dtype == torch.bfloat16 and out.shape == (4, 96)
    check(c, out)


def test_padded_page_stride_page16_block16_and_cut_rows():
    c = make_case(rows=3, h=16, lens=[250, 17, 96], topk_blocks=5, page=32, bs=16, pad_bytes=64, seed=3)
    check(c, run(c))
    # a schedule built for more rows (a CUDA-graph bucket) serves a cut q
    check(c, run(c, rows_q=2), rows=2)


def test_schedule_is_the_reference_layout():
    c = make_case(rows=2, h=32, lens=[70, 8], topk_blocks=4, page=16)
    meta = api.get_paged_sparse_mqa_logits_metadata(c["lens"], c["table"], None, 16, c["blocks"], torch.int8, 8)
    assert meta.shape == (2, 5) and meta.dtype == torch.int32
    # row 0: 9 blocks, 4 kept, newest partial (70 = 8*8 + 6): 3*8 + 6 = 30 columns
    assert meta[:, 0].tolist() == [30, 8]
    b = int(c["blocks"][0, 0])
    assert int(meta[0, 1]) == int(c["table"][0, b * 8 // 16]) * 16 + b * 8 % 16
    assert meta[1, 2:].tolist() == [-1, -1, -1]


@pytest.mark.parametrize("bad_args, arg", [
    (dict(sparse_block_kv=4), "sparse_block_kv"),
    (dict(qk_dtype=torch.float8_e4m3fn), "qk_dtype"),
    (dict(page_kv=12), "page_kv"),
    (dict(context_lens=torch.zeros(3, dtype=torch.int64)), "context_lens"),
])
def test_metadata_bad_input_names_the_argument(bad_args, arg):
    c = make_case(rows=3, h=32, lens=[40, 8, 16], topk_blocks=4, page=64)
    kw = dict(context_lens=c["lens"], block_table=c["table"], indices=None, page_kv=64,
              sparse_kv_block_indices=c["blocks"], qk_dtype=torch.int8, sparse_block_kv=8)
    kw.update(bad_args)
    with pytest.raises(ValueError, match=f"{api.META_OP}: argument '{arg}'"):
        api.get_paged_sparse_mqa_logits_metadata(**kw)


def test_logits_bad_input_names_the_argument():
    c = make_case(rows=2, h=32, lens=[40, 8], topk_blocks=4, page=64)
    meta = api.get_paged_sparse_mqa_logits_metadata(c["lens"], c["table"], None, 64, c["blocks"], torch.int8, 8)
    q = (c["q"][:, None], c["q_sf"][:, None])
    fp8 = (torch.zeros(2, 1, 32, 128, dtype=torch.float8_e4m3fn), None)
    with pytest.raises(ValueError, match=f"{api.OP}: argument 'q'.*FP4"):
        api.fp8_fp4_paged_sparse_mqa_logits(fp8, c["cache"], c["w"], meta, 4, 8)
    with pytest.raises(ValueError, match=f"{api.OP}: argument 'metadata'"):
        api.fp8_fp4_paged_sparse_mqa_logits(q, c["cache"], c["w"], meta[:, :3], 4, 8)
    with pytest.raises(ValueError, match=f"{api.OP}: argument 'weights'"):
        api.fp8_fp4_paged_sparse_mqa_logits(q, c["cache"], c["w"][:1], meta, 4, 8)


@pytest.mark.gpu
def test_gpu_v41_decode_shape():
    if DEVICE != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs SM12X_TEST_DEVICE=cuda and a GPU")
    # V4.1-shaped decode: 64 rows, 32 index heads, 512 published blocks of 8 over ~1M / 4 compressed
    # positions (page 64), every row a real selection
    lens = [int(x) for x in torch.randint(5000, 40000, (64,), generator=torch.Generator().manual_seed(1))]
    c = make_case(rows=64, h=32, lens=lens, topk_blocks=512, page=64, device="cuda")
    out = run(c)
    torch.cuda.synchronize()
    check(c, out)


def test_compiles_for_sm12x():
    from sm12x.kernels.indexer import paged_sparse_mqa_logits as kernel
    from tests_support import assert_within_sm12x_limits

    reports = kernel.compile_reports(("sm_120", "sm_121"), heads=(32, 64), pages=(64,), out_bf16=(True,))
    assert len(reports) == 4
    assert_within_sm12x_limits(reports)

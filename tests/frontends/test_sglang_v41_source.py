"""sm12x's SGLang V4.1 source-layer front end (:mod:`sm12x.frontends.sglang.v41`) called as
``publish_decode`` calls its readers: the placeholder's v2 transform writes the page slots and
publishes the blocks; ``amax_topk_blocks`` on SGLang's second stream returns them once the main
stream's work is done. Against the references on the kernel's own FP4 logits."""
import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as dg
from sm12x.frontends.sglang import indexer as sgl
from sm12x.frontends.sglang import v41
from sm12x.kernels.indexer.cache import quant_fp4_paged_cache, quant_fp4_per_token
from sm12x.kernels.indexer.reference import ref_indexer_topk, ref_select_candidate_blocks


def _inputs(device, rows, page, pages_per_row, max_len, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    pages = rows * pages_per_row
    cache = quant_fp4_paged_cache(torch.randn(pages, page, 128, generator=g, device=device))
    q = tuple(t.view(rows, 1, *t.shape[1:])
              for t in quant_fp4_per_token(torch.randn(rows, 32, 128, generator=g, device=device)))
    w = torch.randn(rows, 32, generator=g, device=device)
    lens = torch.randint(1, max_len + 1, (rows,), generator=g, device=device).int()
    lens[0] = max_len
    table = torch.randperm(pages, generator=g, device=device).view(rows, pages_per_row).int()
    return q, cache, w, lens, table


def _check(device, rows, page, pages_per_row, max_len, topk, kb, seed=0, stream=None):
    q, cache, w, lens, table = _inputs(device, rows, page, pages_per_row, max_len, seed)
    logits = v41.deferred_source_logits(q, cache, w, lens, table, None, max_len, kb)
    out = torch.empty((rows, topk), dtype=torch.int32, device=device)
    assert sgl.topk_transform(logits, lens, table, out, page)
    if stream is not None:
        with torch.cuda.stream(stream):
            blocks = v41.amax_topk_blocks(None, logits, lens, None, kb)
            blocks = blocks.clone()  # read on the second stream, as SGLang's sort does
        torch.cuda.current_stream().wait_stream(stream)
    else:
        blocks = v41.amax_topk_blocks(None, logits, lens, None, kb)
    real = dg.fp8_fp4_paged_mqa_logits(q, cache, w, lens[:, None], table, None, max_len, clean_logits=True)
    pos = ref_indexer_topk(real, topk, None, lens)
    want = torch.empty_like(out)
    sgl.write_page_indices(pos, lens, table, want, page)
    sets = lambda t: [sorted(r) for r in t.tolist()]  # noqa: E731
    assert sets(out) == sets(want)
    assert sets(blocks) == sets(ref_select_candidate_blocks(real, lens, kb, v41.BLOCK))
    assert logits.untyped_storage().nbytes() == 4


def test_source_decode_publishes_slots_and_blocks(device):
    _check(device, rows=3, page=64, pages_per_row=4, max_len=256, topk=20, kb=6)


def test_blocks_before_the_transform_is_an_error(device):
    q, cache, w, lens, table = _inputs(device, 2, 64, 2, 128, 1)
    logits = v41.deferred_source_logits(q, cache, w, lens, table, None, 128, 4)
    with pytest.raises(ValueError, match="amax_topk_blocks.*'logits'"):
        v41.amax_topk_blocks(None, logits, lens, None, 4)
    with pytest.raises(ValueError, match="deep_gemm_fp4_paged_mqa_logits.*'topk_blocks'"):
        v41.deferred_source_logits(q, cache, w, lens, table, None, 128, 0)


@pytest.mark.gpu
def test_gpu_source_decode_on_sglangs_second_stream():
    """V4.1-like decode on CUDA: 32 rows up to 65,536 positions, top-512, 512 blocks of 8; the
    blocks are read on a second stream after the transform's event."""
    _check("cuda", rows=32, page=64, pages_per_row=1024, max_len=65536, topk=512, kb=512,
           stream=torch.cuda.Stream())

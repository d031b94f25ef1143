"""vLLM's indexer top-k calls done by the fused top-k: the same indices as vLLM's own logits +
``top_k_per_row_prefill`` (its semantics written out below from vLLM 0.25.1 / 0.34.0:
``_custom_ops.top_k_per_row_prefill`` and the 0.34 ``fused_mqa_topk_prefill`` docstring), on the
logits sm12x's DeepGEMM front end gives vLLM."""
import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as deep_gemm_api
from sm12x.frontends.deferred_logits import pending
from sm12x.frontends.vllm import indexer as api
from sm12x.frontends.vllm import wrappers
from sm12x.kernels.indexer.cache import quant_fp4_per_token, quant_fp8_per_token
from sm12x.kernels.indexer.reference import ref_indexer_topk


def vllm_top_k_per_row_prefill(logits, ks, ke, out, topk):
    """vLLM's prefill top-k: per row the topk best columns of [ks, ke) as j - ks, unordered,
    -1 after the row's keys when it sees fewer than topk."""
    out.fill_(-1)
    for r in range(logits.shape[0]):
        lo, hi = int(ks[r]), int(ke[r])
        if hi <= lo:
            continue
        row = logits[r, lo:hi].float()
        n = min(topk, hi - lo)
        out[r, :n] = torch.topk(row, n).indices.int()


def as_sets(idx):
    """Each row's indices, order removed (vLLM's are unordered), -1 padding counted."""
    return [sorted(r.tolist()) for r in idx.cpu()]


def chunk(device, fp4=False, h=8, d=64, seed=3):
    """A prefill chunk of three requests gathered into one key buffer (vLLM's cu_seqlen_ks/ke:
    request i's rows see its prefix and their own causal keys)."""
    new, prefix = [3, 2, 4], [150, 0, 220]
    ks, ke, start = [], [], 0
    for n, p in zip(new, prefix):
        ks += [start] * n
        ke += [start + p + t + 1 for t in range(n)]
        start += p + n
    g = torch.Generator().manual_seed(seed)
    rows, keys = len(ks), start
    q, k = torch.randn(rows, h, d, generator=g), torch.randn(keys, d, generator=g)
    w = torch.rand(rows, h, generator=g)
    if fp4:
        (qv, qs), (kv, ksf) = quant_fp4_per_token(q), quant_fp4_per_token(k)
    else:
        (qv, qs), (kv, ksf) = (q.to(torch.float8_e4m3fn), None), quant_fp8_per_token(k)
    to = lambda t: None if t is None else t.to(device)
    return (to(qv), to(qs)), (to(kv), to(ksf)), w.to(device), torch.tensor(ks, dtype=torch.int32, device=device), \
        torch.tensor(ke, dtype=torch.int32, device=device)


@pytest.mark.parametrize("topk", [4, 64])
def test_fused_mqa_topk_prefill_matches_vllm_top_k(device, topk):
    """vLLM 0.34's fused seam: into a view of a wider index buffer, the set vLLM's logits + top-k
    give, ordered best first (lower index on ties), -1 padded for rows with fewer keys."""
    (qv, _), (k, ksf), w, ks, ke = chunk(device)
    buffer = torch.full((qv.shape[0] + 2, topk + 8), 7, dtype=torch.int32, device=device)
    out = buffer[1:-1, :topk]
    scale_bytes = ksf.view(torch.uint8).view(-1, 4)  # vLLM gathers the scales as [keys, 4] uint8
    api.fused_mqa_topk_prefill(qv, k, api.fused_mqa_topk_key_scales(scale_bytes), w, ks, ke, out)
    logits = deep_gemm_api.fp8_fp4_mqa_logits((qv, None), (k, ksf), w, ks, ke, clean_logits=False)
    want = torch.empty_like(out)
    vllm_top_k_per_row_prefill(logits.cpu(), ks.cpu(), ke.cpu(), want, topk)
    assert as_sets(out) == as_sets(want)
    assert torch.equal(out.cpu(), ref_indexer_topk(logits.cpu(), topk, ks.cpu(), ke.cpu()))
    assert bool((buffer[0] == 7).all() and (buffer[-1] == 7).all() and (buffer[:, topk:] == 7).all())
    if topk == 64:
        assert int((out[3] >= 0).sum()) == 1 and bool((out[3, 1:] == -1).all())  # the new request's first row


def test_key_scales_are_the_float32_bytes(device):
    scales = torch.rand(37, device=device) + 0.5
    got = api.fused_mqa_topk_key_scales(scales.view(torch.uint8).view(-1, 4))
    assert torch.equal(got, scales)
    with pytest.raises(ValueError, match="fused_mqa_topk_key_scales.*scales"):
        api.fused_mqa_topk_key_scales(scales)


@pytest.mark.parametrize("fp4", [False, True])
def test_deferred_logits_then_top_k_per_row_prefill(device, fp4):
    """vLLM 0.22.1-0.25.1: the logits call returns a placeholder of the logits' shape without
    their memory; ``ops.top_k_per_row_prefill`` gives vLLM's indices for it and passes real
    logits to vLLM's own kernel."""
    q, kv, w, ks, ke = chunk(device, fp4=fp4)
    topk = 32
    vllm_q = (q[0], None if q[1] is None else q[1].view(torch.uint8).view(*q[1].shape, 4))  # vLLM's MXFP4 scales
    vllm_kv = (kv[0].view(torch.int8), kv[1]) if fp4 else kv
    logits = api.deferred_mqa_logits(vllm_q, vllm_kv, w, ks, ke, clean_logits=False)
    assert logits.shape == (q[0].shape[0], kv[0].shape[0]) and logits.untyped_storage().nbytes() == 4
    assert pending(logits) is not None
    out = torch.empty((q[0].shape[0], topk), dtype=torch.int32, device=device)
    calls = []
    api.top_k_per_row_prefill(lambda *a: calls.append(a), logits, ks, ke, out, logits.shape[0],
                              logits.stride(0), logits.stride(1), topk)
    assert not calls
    real = deep_gemm_api.fp8_fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=False)
    want = torch.empty_like(out)
    vllm_top_k_per_row_prefill(real.cpu(), ks.cpu(), ke.cpu(), want, topk)
    assert as_sets(out) == as_sets(want)
    api.top_k_per_row_prefill(lambda *a: calls.append(a), real, ks, ke, out, real.shape[0], real.stride(0),
                              real.stride(1), topk)
    assert len(calls) == 1 and calls[0][0] is real


def test_deferred_logits_reject_bad_inputs(device):
    q, kv, w, ks, ke = chunk(device)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits.*cu_seq_len_k_start"):
        api.deferred_mqa_logits(q, kv, w, ks.long(), ke)
    logits = api.deferred_mqa_logits(q, kv, w, ks, ke)
    out = torch.empty((q[0].shape[0], 8), dtype=torch.int64, device=device)
    with pytest.raises(ValueError, match="mqa_topk_indices.*out"):
        api.top_k_per_row_prefill(None, logits, ks, ke, out, logits.shape[0], 0, 0, 8)
    with pytest.raises(ValueError, match="top_k_per_row_prefill.*num_rows"):
        api.top_k_per_row_prefill(None, logits, ks, ke, out.int(), 3, 0, 0, 8)


def test_eligibility_rule():
    """Layers sm12x serves: FP8, whole context, no candidate selection, supported heads / dim;
    vLLM's own switches off still mean off."""
    import types

    def original(*, query_shape, topk, fp4_cache, full_context, candidate_selection=False):
        return False

    original.__globals__["envs"] = types.SimpleNamespace(VLLM_USE_FUSED_MQA_TOPK=True, VLLM_BATCH_INVARIANT=False)
    try:
        use = wrappers.make_use_fused_mqa_topk(original)
        ok = dict(query_shape=torch.Size([64, 128]), topk=512, fp4_cache=False, full_context=True)
        assert use(**ok) and use(**{**ok, "query_shape": (32, 128), "topk": 2048})
        assert not use(**{**ok, "fp4_cache": True}) and not use(**{**ok, "full_context": False})
        assert not use(**ok, candidate_selection=True) and not use(**{**ok, "query_shape": (64, 576)})
        original.__globals__["envs"].VLLM_BATCH_INVARIANT = True
        assert not use(**ok)
    finally:
        del original.__globals__["envs"]
    chunk_rule = wrappers.make_fused_mqa_topk_chunk(lambda *a: False)
    assert chunk_rule(300000, 1 << 21, 512, 8192, 16)


def vllm_decode_top_k(logits, seq_lens, next_n, topk):
    """vLLM's decode top-k (``SparseIndexerTopk``, its torch reference backend): row ends from
    seq_lens [B, next_n] (per row) or [B, 1] (len - next_n + 1 + t), the topk best positions
    below the end, -1 where t >= the row's end."""
    rows = logits.shape[0]
    if seq_lens.numel() == rows:
        ends = seq_lens.reshape(-1)
    else:
        ends = (seq_lens.reshape(-1, 1) - next_n + 1 + torch.arange(next_n)).clamp(min=0).reshape(-1)
    cols = torch.arange(logits.shape[1])
    masked = logits.masked_fill(cols[None, :] >= ends[:, None], float("-inf"))
    idx = masked.topk(topk, dim=-1).indices
    return torch.where(torch.arange(topk)[None, :] < ends[:, None], idx, -1).int()


@pytest.mark.parametrize("next_n,lens_form", [(1, "2d"), (2, "2d"), (3, "b1")])
def test_deferred_decode_logits_then_selector(device, next_n, lens_form):
    """vLLM 0.33-0.34 decode: the placeholder of [B*next_n, max_model_len] and the selector give
    vLLM's decode top-k; real logits go to vLLM's selector."""
    from tests.kernels.indexer.test_paged_mqa_logits import make_paged

    b, h, d, bkv, topk = 3, 8, 64, 32, 24
    inp = make_paged(b, next_n, h, d, bkv, [20, 100, 150], False, device, ctx2d=lens_form == "2d", seed=4)
    q, cache, w, bt = inp["q"], inp["cache"], inp["weights"], inp["block_table"]
    lens = inp["context_lens"] if lens_form == "2d" else inp["context_lens"][:, None].contiguous()
    max_model_len = bt.shape[1] * bkv
    logits = api.deferred_paged_mqa_logits(q, cache, w, lens, bt, None, max_model_len)
    assert logits.shape == (b * next_n, max_model_len) and logits.untyped_storage().nbytes() == 4
    calls = []
    selector = api.IndexerTopkSelector(lambda *a: calls.append(a))
    buffer = torch.full((b * next_n + 1, topk + 3), 5, dtype=torch.int32, device=device)
    selector(logits, lens, next_n, buffer[:-1, :topk], topk, 150)
    assert not calls and bool((buffer[-1] == 5).all() and (buffer[:, topk:] == 5).all())
    real = deep_gemm_api.fp8_fp4_paged_mqa_logits(q, cache, w, lens if lens_form == "2d" else lens[:, 0].contiguous(),
                                                  bt, None, max_model_len, clean_logits=False)
    want = vllm_decode_top_k(real.cpu().float(), lens.cpu(), next_n, topk)
    assert as_sets(buffer[:-1, :topk]) == as_sets(want)
    selector(real, lens, next_n, buffer[:-1, :topk], topk, 150)
    assert len(calls) == 1 and calls[0][0] is real


@pytest.mark.parametrize("reader", ["radix", "per_row"])
def test_deferred_decode_logits_then_025_readers(device, reader):
    """vLLM 0.22.1-0.29.0 decode: torch.ops._C.persistent_topk / cooperative_topk (``radix_topk``)
    and ``ops.top_k_per_row_decode`` give vLLM's decode top-k for the placeholder, into a view of
    the index buffer, and pass real logits to vLLM's op; a bad topk is refused by name."""
    from tests.kernels.indexer.test_paged_mqa_logits import make_paged

    b, next_n, h, d, bkv, topk = 2, 2, 8, 64, 32, 16
    inp = make_paged(b, next_n, h, d, bkv, [40, 120], False, device, ctx2d=True, seed=6)
    q, cache, w, bt, lens = inp["q"], inp["cache"], inp["weights"], inp["block_table"], inp["context_lens"]
    max_model_len = bt.shape[1] * bkv
    logits = api.deferred_paged_mqa_logits(q, cache, w, lens, bt, None, max_model_len)
    calls = []
    buffer = torch.full((b * next_n + 1, topk + 3), 5, dtype=torch.int32, device=device)
    out = buffer[:-1, :topk]

    def run(logits, k=topk):
        if reader == "radix":
            api.radix_topk(lambda *a: calls.append(a), logits, lens, out, None, k, max_model_len)
        else:
            api.top_k_per_row_decode(lambda *a: calls.append(a), logits, next_n, lens, out, logits.shape[0],
                                     logits.stride(0), logits.stride(1), k)

    run(logits)
    assert not calls and bool((buffer[-1] == 5).all() and (buffer[:, topk:] == 5).all())
    real = deep_gemm_api.fp8_fp4_paged_mqa_logits(q, cache, w, lens, bt, None, max_model_len, clean_logits=False)
    assert as_sets(out) == as_sets(vllm_decode_top_k(real.cpu().float(), lens.cpu(), next_n, topk))
    run(real)
    assert len(calls) == 1 and calls[0][0] is real
    for bad in (topk + 4, 0):
        with pytest.raises(ValueError, match="topk_tokens"):
            run(logits, k=bad)

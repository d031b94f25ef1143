"""SGLang's DeepSeek-V4 non-paged prefill indexer done by the fused top-k: the same page slots and
positions as SGLang's logits + top-k transform (its semantics written out below from SGLang 0.5.23
``dsv4/indexer.py::_topk_transform_vectorized``), on the logits sm12x's DeepGEMM front end gives."""
import types

import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as deep_gemm_api
from sm12x.frontends.sglang import indexer as api
from sm12x.frontends.sglang import wrappers
from sm12x.kernels.indexer.cache import quant_fp8_per_token


def sglang_transform(scores, seq_lens, page_table, page_size, topk):
    """Rows with seq_len <= topk: positions 0..seq_len-1 in order, then -1; others: the topk best
    positions < seq_len (unordered). Slots: page_table[p // page_size] * page_size + p % page_size."""
    rows = scores.shape[0]
    raw = torch.full((rows, topk), -1, dtype=torch.int32)
    for r in range(rows):
        n = int(seq_lens[r])
        if n <= topk:
            raw[r, :n] = torch.arange(n, dtype=torch.int32)
        else:
            raw[r] = torch.topk(scores[r, :n].float(), topk).indices.int()
    p = raw.clamp(min=0).long()
    slots = page_table.gather(1, p // page_size).long() * page_size + p % page_size
    return torch.where(raw >= 0, slots, -1).int(), raw


def as_sets(idx):
    return [sorted(r.tolist()) for r in idx.cpu()]


def nonpaged_call(device, rows=7, keys=300, h=8, d=64, page_size=16, seed=5):
    """One request's extend: query rows r see the first seq_lens[r] compressed keys (causal),
    SGLang's plan with ks = 0 and ke = seq_lens (trivial rows emptied, as its sgl-kernel
    backend does)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, h, d, generator=g).to(torch.float8_e4m3fn)
    k, ksf = quant_fp8_per_token(torch.randn(keys, d, generator=g))
    w = torch.rand(rows, h, generator=g)
    seq_lens = torch.tensor([3, 20, 21, 150, 151, 299, 300][:rows], dtype=torch.int32)
    pages = -(-keys // page_size)
    page_table = torch.randperm(4 * pages, generator=g)[:pages].int()[None, :].expand(rows, -1).contiguous()
    topk = 20
    ke = torch.where(seq_lens > topk, seq_lens, torch.zeros_like(seq_lens))
    plan = types.SimpleNamespace(ks=torch.zeros_like(ke).to(device), ke=ke.to(device), max_seqlen_k=pages * page_size)
    to = lambda t: t.to(device)
    return dict(q_indexer=to(q), weights=to(w), kv=(to(k), to(ksf)), plan=plan), to(seq_lens), to(page_table), \
        page_size, topk


def test_placeholder_then_transform_matches_sglang(device):
    call, seq_lens, page_table, page_size, topk = nonpaged_call(device)
    rows = slice(1, 7)
    logits = api.deferred_nonpaged_mqa_logits(**call, rows=rows)
    assert logits.shape == (6, call["plan"].max_seqlen_k) and logits.untyped_storage().nbytes() == 4
    out = torch.full((6, topk), 9, dtype=torch.int32, device=device)
    raw = torch.full((6, topk), 9, dtype=torch.int32, device=device)
    assert api.topk_transform(logits, seq_lens[rows], page_table[rows], out, page_size, raw)
    q, kv, w, plan = call["q_indexer"], call["kv"], call["weights"], call["plan"]
    real = deep_gemm_api.fp8_mqa_logits(q[rows], kv, w[rows], plan.ks[rows], seq_lens[rows].contiguous(),
                                        clean_logits=False)
    want_slots, want_raw = sglang_transform(real.cpu(), seq_lens[rows].cpu(), page_table[rows].cpu(), page_size, topk)
    assert as_sets(out) == as_sets(want_slots) and as_sets(raw) == as_sets(want_raw)
    # rows that see no more than topk keys: positions in order, exactly as SGLang writes them
    assert torch.equal(raw[:1].cpu(), want_raw[:1]) and torch.equal(out[:1].cpu(), want_slots[:1])
    assert not api.topk_transform(real, seq_lens[rows], page_table[rows], out, page_size, raw)


def test_wrappers_send_real_logits_to_sglang():
    calls = []
    v1 = wrappers.make_topk_transform(lambda *a: calls.append(("v1", a)))
    v2 = wrappers.make_topk_transform_v2(lambda *a: calls.append(("v2", a)))
    scores = torch.zeros(2, 8)
    v1(scores, None, None, None, 64)
    v2(scores, None, None, None, 64, "plan")
    assert [c[0] for c in calls] == ["v1", "v2"] and calls[1][1][5] == "plan" and calls[1][1][6] is None


def test_v2_without_page_table_writes_positions(device):
    call, seq_lens, _, page_size, topk = nonpaged_call(device, rows=4)
    logits = api.deferred_nonpaged_mqa_logits(**call, rows=slice(0, 4))
    out = torch.empty((4, topk), dtype=torch.int32, device=device)
    v2 = wrappers.make_topk_transform_v2(lambda *a: pytest.fail("real logits expected only"))
    v2(logits, seq_lens[:4], None, out, page_size, torch.empty(1))
    assert out[0].tolist() == [0, 1, 2] + [-1] * (topk - 3)
    assert sorted(out[3].tolist()) != list(range(topk)) and bool((out[3] >= 0).all() and (out[3] < 150).all())


def test_bad_inputs_name_the_op(device):
    call, seq_lens, page_table, page_size, topk = nonpaged_call(device)
    bad = dict(call, weights=call["weights"].double())
    with pytest.raises(ValueError, match="_nonpaged_mqa_logits.*weights"):
        api.deferred_nonpaged_mqa_logits(**bad, rows=slice(0, 7))
    logits = api.deferred_nonpaged_mqa_logits(**call, rows=slice(0, 7))
    with pytest.raises(ValueError, match="topk_transform.*seq_lens"):
        api.topk_transform(logits, seq_lens[:3], page_table, torch.empty((7, topk), dtype=torch.int32), page_size)


def sglang_dsa_topk_unfused(logits, lengths, topk, row_starts):
    """SGLang 0.5.23 ``dsa_topk_backend._topk_unfused``: per row the topk best columns of
    [row_starts, row_starts + lengths) as column - row_starts, -1 where none is left."""
    out = torch.full((logits.shape[0], topk), -1, dtype=torch.int32)
    for r in range(logits.shape[0]):
        lo, n = int(row_starts[r]), int(lengths[r])
        m = min(topk, n)
        if m:
            out[r, :m] = torch.topk(logits[r, lo:lo + n].float(), m).indices.int()
    return out


@pytest.mark.parametrize("fused", [False, True])
def test_dsa_placeholder_then_topk_transform(device, fused):
    """SGLang's DSA ragged prefill: the placeholder logits and ``dsa_topk_transform`` give the
    row-local top-k SGLang's torch backend gives (unfused), plus topk_indices_offset for the
    fused RAGGED transform; real logits go to SGLang's method; a PAGED call without its table and an
    unknown method are refused by name."""
    g = torch.Generator().manual_seed(9)
    ks = torch.tensor([0, 0, 0, 150, 150], dtype=torch.int32)
    lengths = torch.tensor([148, 149, 150, 7, 80], dtype=torch.int32)
    q = torch.randn(5, 16, 64, generator=g).to(torch.float8_e4m3fn).to(device)
    k, k_sf = quant_fp8_per_token(torch.randn(230, 64, generator=g))
    w = torch.rand(5, 16, generator=g).to(device)
    ks, lengths, k, k_sf = ks.to(device), lengths.to(device), k.to(device), k_sf.to(device)
    logits = api.deferred_dsa_mqa_logits(q, (k, k_sf), w, ks, ks + lengths)
    assert logits.shape == (5, 230) and logits.untyped_storage().nbytes() == 4
    ragged = types.SimpleNamespace(name="RAGGED")
    offset = torch.tensor([7, 7, 7, 500, 500], dtype=torch.int32, device=device)
    calls = []
    got = api.dsa_topk_transform(lambda: calls.append(1), logits, lengths, 16, fused, ragged,
                                 topk_indices_offset=offset, row_starts=ks)
    real = deep_gemm_api.fp8_fp4_mqa_logits((q, None), (k, k_sf), w, ks, ks + lengths, clean_logits=False)
    want = sglang_dsa_topk_unfused(real.cpu(), lengths.cpu(), 16, ks.cpu())
    if fused:
        want = torch.where(want >= 0, want + offset.cpu()[:, None], -1)
    assert not calls and as_sets(got) == as_sets(want)
    assert int((got[3] >= 0).sum()) == 7  # a row seeing fewer keys than topk: -1 after them
    assert api.dsa_topk_transform(lambda: "sglang", real, lengths, 16, fused, ragged) == "sglang"
    if fused:
        with pytest.raises(ValueError, match="topk_transform.*attn_metadata"):
            api.dsa_topk_transform(None, logits, lengths, 16, True, types.SimpleNamespace(name="PAGED"),
                                   row_starts=ks)
        with pytest.raises(ValueError, match="topk_transform.*topk_transform_method"):
            api.dsa_topk_transform(None, logits, lengths, 16, True, "BLOCKWISE", row_starts=ks)


def sglang_dsa_paged(real, lengths, topk, fused, table=None, page_size=1):
    """SGLang's DSA decode top-k of real paged logits: per row the topk best positions p < lengths[row]
    (a row seeing no more than topk: 0..n-1 in order, as sgl-kernel writes it), -1 after them;
    fused: table[row, p // page_size] * page_size + p % page_size (the v2 kernel over the indexer's
    page table; page_size 1: sgl-kernel's page_size=1 table, row i for row i in decode form)."""
    rows = real.shape[0]
    pos = torch.full((rows, topk), -1, dtype=torch.int32)
    for r in range(rows):
        n = int(lengths[r])
        if n <= topk:
            pos[r, :n] = torch.arange(n, dtype=torch.int32)
        else:
            pos[r] = torch.topk(real[r, :n].float(), topk).indices.int()
    if not fused:
        return pos
    p = pos.clamp(min=0).long()
    slots = table.gather(1, p // page_size).long() * page_size + p % page_size
    return torch.where(pos >= 0, slots, -1).int()


@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("transform", ["unfused", "v2", "page_table_1", "flashinfer"])
def test_dsa_paged_placeholder_then_topk_transform(device, next_n, transform):
    """SGLang's DSA decode (next_n 1) and MTP verify (next_n 2, [B, next_n] context lengths): the
    placeholder and ``dsa_topk_transform`` give the positions SGLang's top-k of the real paged
    logits gives (unfused) or its page slots: the v2 kernel's through the indexer's page table,
    sgl-kernel's through row i of the page_size=1 table, FlashInfer's through the row's request."""
    from tests.kernels.indexer.test_paged_mqa_logits import make_paged

    b, h, d, bkv, topk = 3, 8, 64, 64, 24
    inp = make_paged(b, next_n, h, d, bkv, [20, 100, 150], False, device, ctx2d=True, seed=8)
    (q, _), cache, w, ctx, bt = inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"]
    max_seq_len = inp["max_context_len"]
    rows = b * next_n
    lengths = ctx.reshape(-1).clone()
    lengths[0] = min(int(lengths[0]), 5)  # the top-k reads fewer positions than the logits hold
    logits = api.deferred_dsa_paged_logits(q, cache, w, ctx, bt, max_seq_len)
    assert logits.shape == (rows, max_seq_len) and logits.untyped_storage().nbytes() == 4
    g = torch.Generator().manual_seed(2)
    table_1 = torch.randperm(9 * max_seq_len, generator=g)[:rows * max_seq_len].int().view(rows, max_seq_len)
    real_table = bt.repeat_interleave(next_n, dim=0).cpu()  # SGLang's expanded rows
    cu = torch.arange(0, rows + 1, next_n, dtype=torch.int32)  # a request of next_n rows
    attn = types.SimpleNamespace(real_page_table=real_table.to(device), page_size=bkv,
                                 page_table_1=(table_1[::next_n] if transform == "flashinfer" else table_1).to(device))
    paged = types.SimpleNamespace(name="PAGED")
    calls = []
    got = api.dsa_topk_transform(lambda: calls.append(1), logits, lengths, topk, transform != "unfused", paged, attn,
                                 cu.to(device), backend="flashinfer" if transform == "flashinfer" else "sgl-kernel",
                                 v2=transform == "v2")
    real = deep_gemm_api.fp8_paged_mqa_logits(q, cache, w, ctx, bt, None, max_seq_len, clean_logits=False).cpu()
    table, page_size = {"unfused": (None, 1), "v2": (real_table, bkv), "page_table_1": (table_1, 1),
                        "flashinfer": (table_1[::next_n].repeat_interleave(next_n, dim=0), 1)}[transform]
    want = sglang_dsa_paged(real, lengths.cpu(), topk, transform != "unfused", table, page_size)
    assert not calls and got.dtype == torch.int32 and as_sets(got) == as_sets(want)
    if transform != "flashinfer":  # sgl-kernel: short rows exactly as it writes them
        short = lengths.cpu() <= topk
        assert torch.equal(got.cpu()[short], want[short])
    assert api.dsa_topk_transform(lambda: "sglang", real, lengths, topk, True, paged, attn) == "sglang"


def test_dsa_paged_bad_inputs_name_the_op(device):
    from tests.kernels.indexer.test_paged_mqa_logits import make_paged

    inp = make_paged(2, 1, 8, 64, 64, [30, 70], False, device, ctx2d=True, seed=1)
    (q, _), cache, w, ctx, bt = inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"]
    with pytest.raises(ValueError, match="fp8_paged_mqa_logits.*block_table"):
        api.deferred_dsa_paged_logits(q, cache, w, ctx, bt[:1], inp["max_context_len"])
    logits = api.deferred_dsa_paged_logits(q, cache, w, ctx, bt, inp["max_context_len"])
    with pytest.raises(ValueError, match="topk_transform.*row_starts"):
        api.dsa_topk_transform(None, logits, ctx.reshape(-1), 8, False, "PAGED", row_starts=ctx.reshape(-1))
    with pytest.raises(ValueError, match="topk_transform.*lengths"):
        api.dsa_topk_transform(None, logits, ctx.reshape(-1)[:1], 8, False, "PAGED")

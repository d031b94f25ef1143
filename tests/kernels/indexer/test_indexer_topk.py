"""Fused indexer top-k (prefill and paged decode) against torch top-k of the logits."""
import pytest
import torch

from sm12x.kernels.common import configs
from sm12x.frontends.deep_gemm import indexer as api
from sm12x.kernels.indexer import mqa_logits as mq
from sm12x.kernels.indexer import fused_topk as tk
from sm12x.kernels.indexer.cache import quant_fp4_per_token, quant_fp8_per_token
from sm12x.kernels.indexer.reference import paged_valid_ends, ref_indexer_topk, ref_mqa_logits

from tests.kernels.indexer.test_mqa_logits import make_inputs, ragged_ranges
from tests.kernels.indexer.test_paged_mqa_logits import make_paged


def _value_check(idx, ref_logits, starts, topk, abs_sum=None):
    """Selected scores (by the reference) must be the top-k reference scores up to rounding; with
    ``abs_sum`` (logits whose head terms are rounded to bf16, ``head_mma``: each off by at most
    2**-8 of its sum_h |w_h| relu(q_h.k) k_scale) two such bounds more for keys swapped at the
    boundary."""
    r = ref_logits.cpu().float()
    for row in range(r.shape[0]):
        sel = idx[row].cpu()
        sel = sel[sel >= 0].long() + (int(starts[row]) if starts is not None else 0)
        got = r[row, sel].sort(descending=True).values
        want = r[row][r[row] > float("-inf")].sort(descending=True).values[:topk]
        assert got.shape == want.shape
        atol = 1e-3 if abs_sum is None else 1e-3 + 2.0**-7 * float(abs_sum[row].max())
        assert torch.allclose(got, want, atol=atol, rtol=1e-4)


def chunk_ranges(new_tokens, prefixes):
    """(ks, ke) int32 of a prefill chunk of several requests, as vLLM gathers their keys into one
    buffer: request i's keys follow request i-1's; its queries see its prefix and themselves."""
    ks, ke, start = [], [], 0
    for n, p in zip(new_tokens, prefixes):
        ks += [start] * n
        ke += [start + p + t + 1 for t in range(n)]
        start += p + n
    return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32)


@pytest.mark.parametrize("fp4,h,d", [(False, 16, 64), (True, 8, 64)])
@pytest.mark.parametrize("topk", [7, 512])
def test_prefill_topk(device, fp4, h, d, topk):
    s, s_kv = 6, 1100
    inp = make_inputs(s, s_kv, h, d, fp4, device, seed=7)
    ks, ke = ragged_ranges(s, s_kv, device)
    logits = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke)
    # a small workspace forces several key windows per row block
    idx = tk.mqa_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, topk, workspace_bytes=8 * s * 512)
    assert idx.dtype == torch.int32 and idx.shape == (s, topk)
    assert torch.equal(idx.cpu(), ref_indexer_topk(logits.cpu(), topk, ks.cpu(), ke.cpu()))
    q_sim, k_sim, k_sf = inp["sim"]
    ref = ref_mqa_logits(q_sim, k_sim, k_sf, inp["weights"].cpu(), ks.cpu(), ke.cpu())
    abs_sum = None
    if mq.head_mma(configs.pick(mq.CONFIGS, torch.device(device))["fp8"], fp4):
        abs_sum = ref_mqa_logits(q_sim, k_sim, k_sf, inp["weights"].cpu().abs(), ks.cpu(), ke.cpu())
        abs_sum = abs_sum.masked_fill(ref == float("-inf"), 0)
    _value_check(idx, ref, ks.cpu(), topk, abs_sum)
    # row blocks (workspace smaller than one window for all rows) and absolute indices
    idx2 = tk.mqa_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, topk,
                               workspace_bytes=8 * 2 * 512, relative=False)
    expect = torch.where(idx >= 0, idx + ks[:, None], idx)
    assert torch.equal(idx2, expect)


def test_prefill_topk_2048_and_padding(device):
    s, s_kv = 3, 2600
    inp = make_inputs(s, s_kv, 8, 32, False, device, seed=8)
    ks = torch.tensor([0, 100, 2599], dtype=torch.int32, device=device)
    ke = torch.tensor([2600, 1000, 2600], dtype=torch.int32, device=device)
    out = torch.empty((s, 2048), dtype=torch.int32, device=device)
    idx = tk.mqa_topk_indices(inp["q"][0], inp["kv"], inp["weights"], ks, ke, 2048, out=out)
    assert idx is out
    logits = api.fp8_mqa_logits(inp["q"][0], inp["kv"], inp["weights"], ks, ke)
    assert torch.equal(idx.cpu(), ref_indexer_topk(logits.cpu(), 2048, ks.cpu(), ke.cpu()))
    assert int((idx[1] >= 0).sum()) == 900 and bool((idx[1, 900:] == -1).all())
    assert idx[2, 0].item() == 0 and bool((idx[2, 1:] == -1).all())


@pytest.mark.parametrize("topk", [7, 512])
def test_prefill_topk_chunk_of_requests(device, topk):
    """A chunk of three requests gathered into one key buffer: each row sees its own request's
    prefix and earlier tokens; the stale workspace of earlier windows and the other requests'
    logits are never read."""
    new, prefix = [3, 2, 4], [700, 0, 650]
    ks, ke = chunk_ranges(new, prefix)
    s, s_kv = sum(new), sum(new) + sum(prefix)
    inp = make_inputs(s, s_kv, 8, 32, False, device, seed=11)
    ks, ke = ks.to(device), ke.to(device)
    idx = tk.mqa_topk_indices(inp["q"][0], inp["kv"], inp["weights"], ks, ke, topk, workspace_bytes=4 * s * 512)
    logits = api.fp8_mqa_logits(inp["q"][0], inp["kv"], inp["weights"], ks, ke)
    assert torch.equal(idx.cpu(), ref_indexer_topk(logits.cpu(), topk, ks.cpu(), ke.cpu()))


def test_plan_widens_windows_for_wide_topk():
    """Top-k above 512 gets windows of WIDE_TOPK_WINDOW x topk columns (fewer rows per pass) while
    the workspace budget holds one; top-512 keeps the budget's own split."""
    unit, budget = 4096, 256 << 20
    assert tk._plan(8192, 240152, unit, 2048, budget) == (4096, 16384)
    assert tk._plan(8192, 262144, unit, 512, budget) == (8192, 8192)
    assert tk._plan(8192, 10000, unit, 2048, budget) == (5461, 12288)  # never wider than the keys
    assert tk._plan(8, 100000, unit, 2048, 8 * 4 * 4096) == (2, 16384)
    assert tk._plan(8, 100000, unit, 2048, 4 * 4096 * 2) == (1, 8192)  # the budget caps it



def test_decode_keys(device):
    """Sort keys -> int32 indices: -1 for INT64_MIN keys and past the keys up to topk, the shift
    added to real indices only, into an out view with a non-unit column stride."""
    rows, n, topk = 3, 700, 1100
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 2**31 - 1, (rows, n), generator=g)
    val = torch.randint(-2**31, 2**31 - 1, (rows, n), generator=g)
    keys = (val << 32) | (0x7FFFFFFF - idx)
    keys[:, 600:] = tk.INT64_MIN
    shift = torch.tensor([0, 5, -3], dtype=torch.int32)
    want = torch.full((rows, topk), -1, dtype=torch.int32)
    want[:, :600] = (idx[:, :600] + shift[:, None]).to(torch.int32)
    buf = torch.zeros(topk, rows, dtype=torch.int32, device=device)
    got = tk.decode_keys(keys.to(device), topk, out=buf.t(), shift=shift.to(device))
    assert got.data_ptr() == buf.data_ptr()
    assert torch.equal(buf.t().cpu(), want)
    assert torch.equal(tk.decode_keys(keys.to(device), topk).cpu(), want + (want >= 0) * -shift[:, None])

def test_ties_lower_index_first(device):
    """Keys duplicated in blocks of 4 give exactly equal scores; lower index must come first."""
    s, s_kv, h, d = 2, 600, 8, 32
    g = torch.Generator().manual_seed(9)
    base = torch.randn(s_kv // 4, d, generator=g)
    k, ksf = quant_fp8_per_token(base.repeat_interleave(4, dim=0))
    q = torch.randn(s, h, d, generator=g).to(torch.float8_e4m3fn)
    w = torch.rand(s, h, generator=g)
    ks = torch.zeros(s, dtype=torch.int32)
    ke = torch.full((s,), s_kv, dtype=torch.int32)
    args = [t.to(device) for t in (q, k, ksf, w, ks, ke)]
    idx = tk.mqa_topk_indices(args[0], (args[1], args[2]), args[3], args[4], args[5], 10,
                              workspace_bytes=8 * s * 512).cpu()
    # top group of four equal scores comes out as 4g, 4g+1, 4g+2, 4g+3
    for row in idx:
        assert row[:4].tolist() == list(range(int(row[0]), int(row[0]) + 4)) and int(row[0]) % 4 == 0
    logits = api.fp8_mqa_logits(*args[:1], (args[1], args[2]), *args[3:]).cpu()
    assert torch.equal(idx, ref_indexer_topk(logits, 10, ks, ke))


@pytest.mark.parametrize("fp4,next_n,ctx2d", [(False, 2, True), (False, 3, False), (True, 1, True)])
@pytest.mark.parametrize("topk", [5, 512])
def test_paged_topk(device, fp4, next_n, ctx2d, topk):
    ctx = [5, 700, 1300]
    inp = make_paged(3, next_n, 8, 64, 32, ctx, fp4, device, ctx2d=ctx2d, pad_bytes=64, seed=10, max_blocks=42)
    args = (inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"])
    logits = api.fp8_fp4_paged_mqa_logits(*args, None, inp["max_context_len"], clean_logits=True)
    idx = tk.paged_mqa_topk_indices(*args, inp["max_context_len"], topk, workspace_bytes=8 * 3 * 512)
    assert idx.shape == (3 * next_n, topk) and idx.dtype == torch.int32
    ends = paged_valid_ends(inp["context_lens"].cpu(), next_n)
    assert torch.equal(idx.cpu(), ref_indexer_topk(logits.cpu(), topk, None, ends))
    counts = (idx >= 0).sum(1).cpu()
    assert torch.equal(counts, ends.clamp(min=0, max=topk))


@pytest.mark.parametrize("topk", [5, 300])
def test_paged_topk_segmented_windows(device, monkeypatch, topk):
    """Windows wider than the radix select's SEGMENT: the fold's skip flags go through the
    segmented select (and the merge) as well."""
    from sm12x.kernels.indexer import topk_select

    monkeypatch.setattr(topk_select, "SEGMENT", 128)
    test_paged_topk(device, False, 2, True, topk)


@pytest.mark.parametrize("ctx2d", [True, False])
@pytest.mark.parametrize("topk", [5, 300])
def test_paged_topk_window_past_requests(device, ctx2d, topk):
    """max_context_len far past every request, as vLLM passes it (the model's limit): the fused
    top-k skips the -inf fill and reads each row only up to its end, over windows that lie partly
    or wholly past the requests."""
    inp = make_paged(3, 2, 8, 64, 32, [5, 700, 1300], False, device, ctx2d=ctx2d, seed=12, max_blocks=90)
    args = (inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"])
    logits = api.fp8_fp4_paged_mqa_logits(*args, None, inp["max_context_len"], clean_logits=True)
    idx = tk.paged_mqa_topk_indices(*args, inp["max_context_len"], topk, workspace_bytes=8 * 3 * 512)
    ends = paged_valid_ends(inp["context_lens"].cpu(), 2)
    assert torch.equal(idx.cpu(), ref_indexer_topk(logits.cpu(), topk, None, ends))
    assert torch.equal(tk.row_ends(inp["context_lens"], 2, inp["max_context_len"]).cpu(),
                       ends.clamp(0, inp["max_context_len"]).int())


def test_topk_errors(device):
    inp = make_inputs(2, 64, 8, 32, False, device)
    ks = torch.zeros(2, dtype=torch.int32, device=device)
    ke = torch.full((2,), 64, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="mqa_topk_indices: argument 'topk'"):
        tk.mqa_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, 0)
    with pytest.raises(ValueError, match="mqa_topk_indices: argument 'out'.*shape"):
        tk.mqa_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke, 4,
                            out=torch.empty(2, 5, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="mqa_topk_indices: argument 'cu_seq_len_k_end'"):
        tk.mqa_topk_indices(inp["q"], inp["kv"], inp["weights"], ks, ke[:1], 4)
    p = make_paged(2, 1, 8, 64, 32, [40, 50], False, device, max_blocks=2)
    with pytest.raises(ValueError, match="paged_mqa_topk_indices: argument 'block_table'"):
        tk.paged_mqa_topk_indices(p["q"], p["cache"], p["weights"], p["context_lens"], p["block_table"].long(),
                                  p["max_context_len"], 4)


# ----------------------------------------------------------------------------------------------
# GPU


def _gpu_prefill_topk_check(s, s_kv, topk, seed, ks_max, workspace_bytes, ranges=None):
    """Causal prefill rows (first visible key random below ``ks_max``, or ``ranges`` = (ks, ke)):
    the fused top-k equals the reference top-k of the kernel's own logits."""
    h, d = 64, 128
    torch.manual_seed(seed)
    q = torch.randn(s, h, d, device="cuda").to(torch.float8_e4m3fn)
    kv = quant_fp8_per_token(torch.randn(s_kv, d, device="cuda"))
    w = torch.randn(s, h, device="cuda")
    ks = torch.randint(0, ks_max, (s,), dtype=torch.int32, device="cuda") if ks_max else \
        torch.zeros(s, dtype=torch.int32, device="cuda")
    ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1
    if ranges is not None:
        ks, ke = (t.to("cuda") for t in ranges)
    logits = api.fp8_mqa_logits(q, kv, w, ks, ke)
    idx = tk.mqa_topk_indices(q, kv, w, ks, ke, topk, workspace_bytes=workspace_bytes)
    assert torch.equal(idx, ref_indexer_topk(logits, topk, ks, ke))


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 2048])
def test_gpu_prefill_topk_matches_logits(topk):
    _gpu_prefill_topk_check(2048, 32768, topk, seed=0, ks_max=0, workspace_bytes=64 << 20)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 2048])
def test_gpu_prefill_topk_many_windows(topk):
    """Rows 16 windows long: the later windows fold their few new keys in (``topk_fold``)."""
    _gpu_prefill_topk_check(256, 262144, topk, seed=1, ks_max=1000, workspace_bytes=256 * 16384 * 4)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 2048])
def test_gpu_prefill_topk_chunk_of_requests(topk):
    """A chunk of 8 requests (100-500 new tokens after 0-30,000 keys of prefix): each row reads
    only its own request's keys, in several windows and row blocks."""
    new, prefix = [300, 100, 500, 256, 200, 150, 400, 142], [30000, 0, 5000, 12000, 700, 20000, 1, 9000]
    ks, ke = chunk_ranges(new, prefix)
    _gpu_prefill_topk_check(sum(new), sum(new) + sum(prefix), topk, seed=2, ks_max=0,
                            workspace_bytes=1024 * 8192 * 4, ranges=(ks, ke))


@pytest.mark.gpu
@pytest.mark.parametrize("fp4", [False, True])
def test_gpu_paged_topk_cuda_graph(fp4):
    from tests.kernels.indexer.test_paged_mqa_logits import _production

    qq, cache, w, cl, bt, mcl = _production(64, 2, 16384, fp4)
    tk.paged_mqa_topk_indices(qq, cache, w, cl, bt, mcl, 512)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        idx = tk.paged_mqa_topk_indices(qq, cache, w, cl, bt, mcl, 512)
    for shrink in (0, 3000):
        cl.sub_(shrink).clamp_(min=1)
        graph.replay()
        logits = api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, None, mcl, clean_logits=True)
        ref = ref_indexer_topk(logits, 512, None, cl.reshape(-1))
        assert torch.equal(idx, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("b,next_n,avg_ctx", [(1, 1, 262144), (16, 2, 8192)])
def test_gpu_paged_topk_model_length_window(b, next_n, avg_ctx):
    """vLLM's call: max_context_len = 262,144 (DeepSeek-V4's 1M tokens / 4). One request of up to
    that length (its select runs in narrow segments to spread over the GPU), and short requests
    in a window 30x longer than they are (read only up to each row's end)."""
    from tests.kernels.indexer.test_paged_mqa_logits import _production

    model_len = 262144
    qq, cache, w, cl, bt, mcl = _production(b, next_n, avg_ctx, False)
    cl.clamp_(max=model_len)
    bt = torch.nn.functional.pad(bt, (0, model_len // 64 - bt.shape[1])) if bt.shape[1] < model_len // 64 \
        else bt[:, : model_len // 64].contiguous()
    idx = tk.paged_mqa_topk_indices(qq, cache, w, cl, bt, model_len, 512)
    logits = api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, None, model_len, clean_logits=True)
    assert torch.equal(idx, ref_indexer_topk(logits, 512, None, cl.reshape(-1)))

"""Paged decode MQA logits (fp8_paged_mqa_logits / fp8_fp4_paged_mqa_logits) and the schedule
metadata, against the PyTorch reference."""
import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as api
from sm12x.kernels.indexer.cache import (dequant_paged_cache, quant_fp4_paged_cache, quant_fp4_per_token,
                                         quant_fp8_paged_cache)
from sm12x.kernels.common.tolerance import calc_diff
from sm12x.kernels.indexer.reference import paged_valid_ends, ref_paged_mqa_logits

NEG_INF = float("-inf")


def make_paged(b, next_n, h, d, block_kv, ctx, fp4, device, pad_bytes=0, ctx2d=True, seed=0,
               max_blocks=None):
    """Random q / cache / weights; ``ctx`` [b] request lengths; block tables are a permutation."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.tensor(ctx, dtype=torch.int32)
    max_blocks = max_blocks or int((ctx.max() + block_kv - 1) // block_kv)
    nblocks = b * max_blocks + 3
    raw_cache = torch.randn(nblocks, block_kv, d, generator=g)
    tok = d // 2 + 4 if fp4 else d + 4
    stride = block_kv * tok + pad_bytes if pad_bytes else None
    cache = quant_fp4_paged_cache(raw_cache, stride) if fp4 else quant_fp8_paged_cache(raw_cache, stride)
    q = torch.randn(b, next_n, h, d, generator=g)
    qq = quant_fp4_per_token(q) if fp4 else (q.to(torch.float8_e4m3fn), None)
    w = torch.randn(b * next_n, h, generator=g)
    bt = torch.randperm(nblocks, generator=g)[: b * max_blocks].view(b, max_blocks).int()
    if ctx2d:  # row t sees a random prefix, the last token sees the whole request
        frac = torch.rand(b, next_n, generator=g)
        cl = ((ctx[:, None] + 1) * frac).int()
        cl[:, -1] = ctx
        cl = cl.contiguous()
    else:
        cl = ctx
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return dict(q=(to(qq[0]), to(qq[1])), cache=same_layout(cache, device), weights=to(w),
                context_lens=to(cl),
                block_table=to(bt), raw=(q, raw_cache), max_context_len=max_blocks * block_kv)


def same_layout(t, device):
    """``t`` on ``device`` with its strides and padding (``Tensor.to`` makes a padded view dense)."""
    base = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=device)
    out = base.as_strided(t.shape, t.stride(), t.storage_offset())
    out.copy_(t)
    return out


def check(logits, inp, clean, fp4):
    q, qs = inp["q"]
    ref = ref_paged_mqa_logits((q.cpu(), None if qs is None else qs.cpu()), inp["cache"].cpu(),
                               inp["weights"].float().cpu(), inp["context_lens"].cpu(),
                               inp["block_table"].cpu(), inp["max_context_len"], clean_logits=True)
    out = logits.float().cpu()
    inv = ref == NEG_INF
    if clean:
        assert torch.equal(out == NEG_INF, inv)
    assert calc_diff(out.masked_fill(inv, 0), ref.masked_fill(inv, 0)) < 1e-5
    # against unquantised data, DeepGEMM's tolerance
    raw_q, raw_cache = inp["raw"]
    ends = paged_valid_ends(inp["context_lens"].cpu(), raw_q.shape[1])
    diffs = []
    for row in range(out.shape[0]):
        bi = row // raw_q.shape[1]
        n = int(ends[row])
        if n <= 0:
            continue
        keys = raw_cache[inp["block_table"].cpu()[bi].long()].reshape(-1, raw_cache.shape[-1])[:n]
        s = (raw_q[bi, row % raw_q.shape[1]] @ keys.T).relu()
        diffs.append((out[row, :n], (s * inp["weights"].float().cpu()[row][:, None]).sum(0)))
    if diffs:
        a = torch.cat([x for x, _ in diffs])
        r = torch.cat([y for _, y in diffs])
        assert calc_diff(a, r) < (0.02 if fp4 else 1e-3)


CASES = [  # (fp4, H, D, block_kv, next_n, ctx2d, pad)
    (False, 64, 128, 64, 1, True, 0),
    (False, 8, 64, 32, 3, True, 128),
    (False, 16, 32, 32, 2, False, 0),
    (False, 32, 128, 64, 8, True, 64),  # two 2-token groups per program (pair_tokens)
    (False, 64, 64, 32, 3, False, 0),  # token pairs, the second program's second token past next_n
    (True, 64, 128, 64, 2, True, 0),
    (True, 8, 64, 32, 1, False, 64),
]


@pytest.mark.parametrize("fp4,h,d,block_kv,next_n,ctx2d,pad", CASES)
def test_paged_logits(device, fp4, h, d, block_kv, next_n, ctx2d, pad):
    ctx = [3 * block_kv + 5, next_n, 1, 7 * block_kv]
    inp = make_paged(len(ctx), next_n, h, d, block_kv, ctx, fp4, device, pad_bytes=pad, ctx2d=ctx2d,
                     max_blocks=8)
    meta = api.get_paged_mqa_logits_metadata(inp["context_lens"] if ctx2d else inp["context_lens"][:, None],
                                             block_kv, api.get_num_sms())
    for clean in (False, True):
        logits = api.fp8_fp4_paged_mqa_logits(inp["q"], inp["cache"], inp["weights"], inp["context_lens"],
                                              inp["block_table"], meta, inp["max_context_len"],
                                              clean_logits=clean)
        assert logits.shape == (len(ctx) * next_n, inp["max_context_len"])
        assert logits.stride(1) == 1 and logits.stride(0) % 256 == 0
        check(logits, inp, clean, fp4)


@pytest.mark.parametrize("fp4", [False, True])
def test_multi_block_programs(device, fp4):
    """Programs whose parts take several chunks of 3 blocks (an explicit config's N_ITERS), partly
    live, with the -inf fill."""
    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import paged_mqa_logits as pm

    ctx = [3 * 32 + 5, 2, 1, 7 * 32]
    inp = make_paged(len(ctx), 2, 16, 64, 32, ctx, fp4, device, max_blocks=8, seed=5)
    cfg = dict(configs.pick(pm.CONFIGS, torch.device(device))["fp4" if fp4 else "fp8"], N_ITERS=3)
    qv, qs = inp["q"]
    kv_cache = inp["cache"] if inp["cache"].dtype == torch.uint8 else inp["cache"].view(torch.uint8)
    for clean in (False, True):
        out = pm.alloc_logits(len(ctx) * 2, inp["max_context_len"], torch.float32, torch.device(device))
        pm.launch(qv, qs, kv_cache, inp["weights"], inp["context_lens"], inp["block_table"],
                  inp["max_context_len"], out, clean=clean, out_mode=0, config=cfg)
        check(out, inp, clean, fp4)


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("cols,min_part,n_iters", [(1, 1, 3), (5, 1, 2), (16, 4, 32), (3, 2, 1), (None, 2, 4)])
def test_parts_of_requests(monkeypatch, device, fp4, cols, min_part, n_iters):
    """Each program takes an even part of its request's live blocks: one program walking a whole
    request in chunks, more programs than a short request has parts (those find nothing to do),
    more parts than wanted where a part would be longer than a chunk (None: 6 columns, 4 parts
    wanted on a one-SM GPU, the 23-block request takes 6), and a max_context_len far past every
    request (as vLLM passes the model's limit), where the -inf fill of the dead blocks is cut
    across the same programs."""
    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import paged_mqa_logits as pm

    ctx = [3 * 32 + 5, 2, 1, 7 * 32, 0, 23 * 32]
    inp = make_paged(len(ctx), 2, 16, 64, 32, ctx, fp4, device, max_blocks=24, seed=7)
    cfg = dict(configs.pick(pm.CONFIGS, torch.device(device))["fp4" if fp4 else "fp8"], N_ITERS=n_iters,
               columns=cols, min_part=min_part)
    if cols is None:
        del cfg["columns"]
        cfg["per_sm"] = 24
        monkeypatch.setenv("SM12X_NUM_SMS", "1")
        rows = len(ctx) * (2 // pm.block_t(16, 2, cfg["rows"]))
        assert pm.grid_columns(24, rows, torch.device(device), cfg) == (6, 4, False)
    qv, qs = inp["q"]
    kv_cache = inp["cache"] if inp["cache"].dtype == torch.uint8 else inp["cache"].view(torch.uint8)
    for clean in (False, True):
        out = pm.alloc_logits(len(ctx) * 2, inp["max_context_len"], torch.float32, torch.device(device))
        out.fill_(float("nan") if clean else 0.0)  # every column must be written when clean
        pm.launch(qv, qs, kv_cache, inp["weights"], inp["context_lens"], inp["block_table"],
                  inp["max_context_len"], out, clean=clean, out_mode=0, config=cfg)
        check(out, inp, clean, fp4)


def test_grid_columns():
    """(columns, parts wanted, several chunks): PROGRAMS_PER_SM programs per SM over the grid, up
    to twice that to make every part one chunk; a window far longer than that (vLLM passes the
    model's limit) keeps the wanted count and takes the several-chunk kernel; never more columns
    than min_part-block parts."""
    from sm12x.kernels.indexer import paged_mqa_logits as pm

    cpu = torch.device("cpu")  # 188 SMs on the interpreter: 40 x 188 = 7520 programs wanted
    cfg = dict(pm.CONFIGS["sm_90"]["fp8"], N_ITERS=32)
    assert pm.grid_columns(166, 256, cpu, cfg) == (30, 30, False)  # 8K context: parts of <= 6 blocks
    assert pm.grid_columns(1331, 256, cpu, cfg) == (42, 30, False)  # 64K: 42 columns make parts one chunk
    assert pm.grid_columns(4096, 256, cpu, cfg) == (30, 30, True)  # a model-length window
    assert pm.grid_columns(4096, 1, cpu, cfg) == (1024, 1024, False)  # one request: parts of 4 blocks
    assert pm.grid_columns(5, 1, cpu, cfg) == (2, 2, False)
    assert pm.grid_columns(4096, 8192, cpu, cfg) == (1, 1, True)
    assert pm.grid_columns(0, 4, cpu, cfg) == (1, 1, False)
    assert pm.grid_columns(20, 4, cpu, dict(cfg, columns=3, N_ITERS=3, min_part=2)) == (3, 3, True)
    assert pm.grid_columns(20, 4, cpu, dict(cfg, columns=7, N_ITERS=3, min_part=2)) == (7, 7, False)


@pytest.mark.parametrize("fp4,fp4_mma", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("key_rows", [False, True])
def test_both_mma_layouts(device, fp4, fp4_mma, key_rows):
    """Heads on the MMA's M side and keys on it (``key_rows``) give the same logits; FP4 both as
    decoded e4m3 group dots and as one block-scaled ``tl.dot_scaled`` (``fp4_mma``)."""
    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import paged_mqa_logits as pm

    ctx = [2 * 32 + 5, 3, 5 * 32]
    inp = make_paged(len(ctx), 2, 16, 64, 32, ctx, fp4, device, max_blocks=6)
    cfg = dict(configs.pick(pm.CONFIGS, torch.device(device))["fp4" if fp4 else "fp8"], key_rows=key_rows,
               fp4_mma=fp4_mma)
    qv, qs = inp["q"]
    out = pm.alloc_logits(len(ctx) * 2, inp["max_context_len"], torch.float32, torch.device(device))
    kv_cache = inp["cache"] if inp["cache"].dtype == torch.uint8 else inp["cache"].view(torch.uint8)
    pm.launch(qv, qs, kv_cache, inp["weights"], inp["context_lens"], inp["block_table"],
              inp["max_context_len"], out, clean=True, out_mode=0, config=cfg)
    check(out, inp, True, fp4)


@pytest.mark.parametrize("d,block_kv,next_n,pad", [(128, 64, 1, 0), (64, 32, 3, 128), (32, 32, 2, 64),
                                                   (128, 64, 2, 8)])
def test_tma_cache_loads(device, d, block_kv, next_n, pad):
    """Key tiles through a TMA descriptor of the cache (``tma`` in the config) give the same logits
    as pointer loads; a block stride that is not a multiple of D and 16 bytes (``pad`` 8) falls
    back to pointer loads."""
    from sm12x.kernels.common import configs
    from sm12x.kernels.indexer import paged_mqa_logits as pm

    ctx = [3 * block_kv + 5, next_n, 1, 7 * block_kv]
    inp = make_paged(len(ctx), next_n, 16, d, block_kv, ctx, False, device, pad_bytes=pad, max_blocks=8)
    cfg = dict(configs.pick(pm.CONFIGS, torch.device(device))["fp8"], key_rows=True, N_ITERS=3, tma=True)
    qv, _ = inp["q"]
    kv_cache = inp["cache"] if inp["cache"].dtype == torch.uint8 else inp["cache"].view(torch.uint8)
    vals, _ = pm.cache_pointers(kv_cache, False)
    assert kv_cache.stride(0) == block_kv * (d + 4) + pad
    assert (pm.tma_cache(cfg, vals, False, True) is None) == (pad == 8)
    outs = []
    for tma in (True, False):
        out = pm.alloc_logits(len(ctx) * next_n, inp["max_context_len"], torch.float32, torch.device(device))
        pm.launch(qv, None, kv_cache, inp["weights"], inp["context_lens"], inp["block_table"],
                  inp["max_context_len"], out, clean=True, out_mode=0, config=dict(cfg, tma=tma))
        check(out, inp, True, False)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_legacy_name_keywords_indices_bf16(device):
    inp = make_paged(3, 1, 16, 64, 64, [70, 128, 5], False, device, seed=4)
    meta = api.get_paged_mqa_logits_metadata(inp["context_lens"], 64, 8)
    kw = dict(q=inp["q"][0], kv_cache=inp["cache"], weights=inp["weights"], context_lens=inp["context_lens"],
              block_table=inp["block_table"], schedule_meta=meta, max_context_len=inp["max_context_len"],
              clean_logits=True)
    a = api.fp8_paged_mqa_logits(**kw)
    b = api.fp8_paged_mqa_logits(**kw, indices=torch.arange(3, dtype=torch.int32, device=device))
    assert torch.equal(a, b)
    check(a, inp, True, False)
    bf = api.fp8_fp4_paged_mqa_logits(inp["q"], inp["cache"], inp["weights"], inp["context_lens"],
                                      inp["block_table"], meta, inp["max_context_len"],
                                      logits_dtype=torch.bfloat16)
    inv = torch.arange(bf.shape[1], device=device)[None, :] >= inp["context_lens"]
    assert bf.dtype == torch.bfloat16
    assert calc_diff(bf.float().masked_fill(inv, 0), a.masked_fill(inv, 0)) < 1e-4


def test_q_scale_as_four_bytes(device):
    """vLLM's MXFP4 indexer passes q scales as uint8 [B, next_n, H, 4]: the packed int32's bytes."""
    inp = make_paged(2, 2, 16, 128, 64, [70, 128], True, device, seed=5)
    qv, qs = inp["q"]
    args = (inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"], None, inp["max_context_len"])
    want = api.fp8_fp4_paged_mqa_logits((qv, qs), *args, clean_logits=True)
    got = api.fp8_fp4_paged_mqa_logits((qv, qs.view(torch.uint8).view(*qs.shape, 4)), *args, clean_logits=True)
    assert torch.equal(got, want)


def test_1d_context_lens_positions(device):
    """Old API: with ctx = 10 and next_n = 3, rows see 8, 9 and 10 positions."""
    inp = make_paged(1, 3, 8, 32, 32, [10], False, device, ctx2d=False, seed=5)
    logits = api.fp8_paged_mqa_logits(inp["q"][0], inp["cache"], inp["weights"], inp["context_lens"],
                                      inp["block_table"], None, inp["max_context_len"], clean_logits=True)
    visible = (logits != NEG_INF).sum(1).cpu().tolist()
    assert visible == [8, 9, 10]


def test_metadata(device):
    cl = torch.tensor([[5], [0], [6 * 64 - 3]], dtype=torch.int32, device=device)
    meta = api.get_paged_mqa_logits_metadata(cl, 64, 4)
    assert meta.shape == (5, 2) and meta.dtype == torch.int32
    # 7 blocks split over 4 SMs at block offsets 0, 1, 3, 5, 7 -> (request, block in request)
    assert meta.cpu().tolist() == [[0, 0], [2, 0], [2, 2], [2, 4], [3, 0]]
    meta2 = api.get_paged_mqa_logits_metadata(cl, block_kv=64, num_sms=188,
                                              indices=torch.arange(3, dtype=torch.int32, device=device))
    assert meta2.shape == (189, 2)


def test_unknown_kwargs_and_errors(device):
    inp = make_paged(2, 2, 8, 64, 64, [70, 128], False, device, seed=6)
    args = [inp["q"], inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"], None,
            inp["max_context_len"]]
    op = "fp8_fp4_paged_mqa_logits"
    api.fp8_fp4_paged_mqa_logits(*args, future_hint=None)
    with pytest.raises(NotImplementedError, match=f"{op}.*'histogram'"):
        api.fp8_fp4_paged_mqa_logits(*args, histogram=torch.zeros(1))
    bad = list(args)
    bad[1] = inp["cache"][:, :, :, :60]
    with pytest.raises(ValueError, match=f"{op}: argument 'kv_cache'.*bytes per token"):
        api.fp8_fp4_paged_mqa_logits(*bad)
    bad = list(args)
    bad[1] = inp["cache"].view(torch.uint8).float()
    with pytest.raises(ValueError, match=f"{op}: argument 'kv_cache'.*dtype"):
        api.fp8_fp4_paged_mqa_logits(*bad)
    bad = list(args)
    bad[3] = inp["context_lens"][:, :1].contiguous()
    with pytest.raises(ValueError, match=f"{op}: argument 'context_lens'.*shape"):
        api.fp8_fp4_paged_mqa_logits(*bad)
    bad = list(args)
    bad[4] = inp["block_table"].long()
    with pytest.raises(ValueError, match=f"{op}: argument 'block_table'.*dtype"):
        api.fp8_fp4_paged_mqa_logits(*bad)
    bad = list(args)
    bad[2] = inp["weights"][:3]
    with pytest.raises(ValueError, match=f"{op}: argument 'weights'.*shape"):
        api.fp8_fp4_paged_mqa_logits(*bad)
    bad = list(args)
    bad[6] = inp["max_context_len"] * 4
    with pytest.raises(ValueError, match=f"{op}: argument 'max_context_len'"):
        api.fp8_fp4_paged_mqa_logits(*bad)
    with pytest.raises(ValueError, match=f"{op}: argument 'indices'"):
        api.fp8_fp4_paged_mqa_logits(*args, indices=torch.zeros(2, dtype=torch.int32, device=device))
    with pytest.raises(ValueError, match="get_paged_mqa_logits_metadata: argument 'block_kv'"):
        api.get_paged_mqa_logits_metadata(inp["context_lens"], 48, 4)
    with pytest.raises(ValueError, match="fp8_paged_mqa_logits: argument 'q'"):
        api.fp8_paged_mqa_logits(inp["q"], *args[1:])


# ----------------------------------------------------------------------------------------------
# GPU: production shapes and CUDA graphs


def _production(b, next_n, avg_ctx, fp4, block_kv=64, h=64, d=128, seed=0):
    torch.manual_seed(seed)
    ctx = torch.randint(int(0.7 * avg_ctx), int(1.3 * avg_ctx), (b,), dtype=torch.int32)
    max_blocks = int((ctx.max() + block_kv - 1) // block_kv)
    nblocks = b * max_blocks
    raw = torch.randn(nblocks, block_kv, d, device="cuda", dtype=torch.bfloat16)
    cache = quant_fp4_paged_cache(raw) if fp4 else quant_fp8_paged_cache(raw)
    del raw
    q = torch.randn(b, next_n, h, d, device="cuda")
    qq = quant_fp4_per_token(q) if fp4 else (q.to(torch.float8_e4m3fn), None)
    w = torch.randn(b * next_n, h, device="cuda")
    bt = torch.randperm(nblocks, device="cuda").int().view(b, max_blocks)
    cl = ctx.cuda()[:, None] - next_n + 1 + torch.arange(next_n, device="cuda").int()[None, :]
    return qq, cache, w, cl.int().contiguous(), bt, max_blocks * block_kv


def _sample_check(logits, qq, cache, w, cl, bt, fp4, rows=8):
    """Reference on a few requests (full reference at production size is too slow)."""
    next_n = qq[0].shape[1]
    d = qq[0].shape[-1] * (2 if fp4 else 1)
    keys = dequant_paged_cache(cache, d, fp4)
    for b in torch.linspace(0, qq[0].shape[0] - 1, rows).long().tolist():
        qf = qq[0][b].float() if not fp4 else None
        if fp4:
            from sm12x.kernels.indexer.cache import dequant_fp4
            qf = dequant_fp4(qq[0][b], qq[1][b])
        for t in range(next_n):
            n = int(cl[b, t])
            k = keys[bt[b].long()].reshape(-1, d)[:n]
            ref = ((qf[t] @ k.T).relu() * w[b * next_n + t][:, None]).sum(0)
            assert calc_diff(logits[b * next_n + t, :n], ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("configs_env", ["sm_120", ""])
@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("b,next_n,avg_ctx", [(256, 1, 8192), (64, 2, 65536), (256, 2, 16384)])
def test_gpu_production(monkeypatch, configs_env, fp4, b, next_n, avg_ctx):
    if configs_env:
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", configs_env)
    else:
        monkeypatch.delenv("SM12X_KERNEL_CONFIGS", raising=False)
    qq, cache, w, cl, bt, mcl = _production(b, next_n, avg_ctx, fp4)
    meta = api.get_paged_mqa_logits_metadata(cl, 64, api.get_num_sms())
    logits = api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, meta, mcl)
    _sample_check(logits, qq, cache, w, cl, bt, fp4)


@pytest.mark.gpu
@pytest.mark.parametrize("configs_env", ["sm_120", ""])
@pytest.mark.parametrize("fp4,h,next_n", [(False, 8, 1), (False, 8, 2), (False, 16, 1), (True, 32, 4),
                                          (True, 16, 1)])
def test_gpu_production_narrow_heads(monkeypatch, configs_env, fp4, h, next_n):
    """Fewer than 32 query-head rows per program (or FP4 with 4 tokens): the loop without keys on M."""
    if configs_env:
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", configs_env)
    else:
        monkeypatch.delenv("SM12X_KERNEL_CONFIGS", raising=False)
    qq, cache, w, cl, bt, mcl = _production(128, next_n, 16384, fp4, h=h)
    meta = api.get_paged_mqa_logits_metadata(cl, 64, api.get_num_sms())
    logits = api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, meta, mcl)
    _sample_check(logits, qq, cache, w, cl, bt, fp4)


@pytest.mark.gpu
def test_gpu_register_budget_only_where_spill_free(monkeypatch):
    """A config's maxnreg is used for the variants that compile under it without spilling; the
    others take the next budget that does not spill (``register_budget.budgets``). Both give the
    reference logits. On sm_90, 64 registers suit the production variant (H64 D128 block_kv 64,
    one token) and spill in H8 D64 block_kv 64 with 8 tokens per program."""
    from sm12x.kernels.indexer import paged_mqa_logits as pm
    from sm12x.kernels.common import register_budget

    cfg = dict(pm.CONFIGS["sm_90"]["fp8"], N_ITERS=32, maxnreg=64)
    decisions = []
    for h, d, next_n in ((64, 128, 1), (8, 64, 8)):
        inp = make_paged(3, next_n, h, d, 64, [5 * 64 + 3, 1, 9 * 64], False, "cuda", max_blocks=10, seed=7)
        monkeypatch.setattr(register_budget, "_CHOSEN", {})
        out = pm.alloc_logits(3 * next_n, inp["max_context_len"], torch.float32, torch.device("cuda"))
        pm.launch(inp["q"][0], None, inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"],
                  inp["max_context_len"], out, clean=True, out_mode=0, config=cfg)
        check(out, inp, True, False)
        assert len(register_budget._CHOSEN) == 1  # the variant's budget was decided once
        decisions.extend(register_budget._CHOSEN.values())
    if torch.cuda.get_device_capability()[0] == 9:
        assert decisions[0] == {"maxnreg": 64} and decisions[1] != {"maxnreg": 64}


@pytest.mark.gpu
@pytest.mark.parametrize("fp4", [False, True])
def test_gpu_cuda_graph(fp4):
    qq, cache, w, cl, bt, mcl = _production(32, 2, 8192, fp4)
    meta = api.get_paged_mqa_logits_metadata(cl, 64, api.get_num_sms())
    api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, meta, mcl)  # compile outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta_g = api.get_paged_mqa_logits_metadata(cl, 64, api.get_num_sms())
        out = api.fp8_fp4_paged_mqa_logits(qq, cache, w, cl, bt, meta_g, mcl)
    for shrink in (0, 1000, 5000):
        cl.sub_(shrink).clamp_(min=1)
        graph.replay()
        torch.cuda.synchronize()
        _sample_check(out, qq, cache, w, cl, bt, fp4, rows=4)

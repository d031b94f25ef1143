"""Sparse MLA decode kernel vs the PyTorch reference (CPU: Triton interpreter, small shapes)."""
import pytest
import torch

from sm12x.kernels.sparse_mla import kv_cache as kvc
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
from sm12x.kernels.sparse_mla.decode import sparse_mla_decode
from sm12x.kernels.sparse_mla.decode_plan import plan
from sm12x.kernels.common.tolerance import FLASHMLA_LSE, FLASHMLA_OUT, flashmla_close

pytestmark = pytest.mark.cpu_only  # inputs on the CPU; GPU cases are marked gpu

# FlashMLA's own tolerances (tests/test_flash_mla_sparse_decoding.py).
OUT_TOL = FLASHMLA_OUT
LSE_TOL = FLASHMLA_LSE


def assert_flashmla_close(name, ans, ref, abs_tol, rel_tol, cos_tol):
    """FlashMLA's criterion (``sm12x.kernels.common.tolerance.flashmla_close``) as an assertion."""
    v = flashmla_close(ans, ref, abs_tol, rel_tol, cos_tol)
    assert v.ok, f"{name}: {v.detail}; max abs err {v.max_abs:.3g}, max rel err {v.max_rel:.3g}"


def make_cache(fmt, num_blocks, page, gen, nan_rows=None, page_stride=None, arena_offset=0,
               device="cpu"):
    """A quantised cache; ``nan_rows`` (flat token ids) are poisoned with NaN bytes afterwards.
    ``arena_offset`` > 0 makes the cache a view that starts inside a bigger allocation."""
    d = 512 if fmt == "model1" else 576
    # FlashMLA's test data (the tolerances are calibrated on it): kv ~ N(0, 0.1^2) clamped to +-1.
    kv = (torch.randn(num_blocks + (1 if arena_offset else 0), page, d, generator=gen) / 10).clamp(-1, 1)
    quant = kvc.quantize_model1_cache if fmt == "model1" else kvc.quantize_v32_cache
    cache = quant(kv.to(device=device, dtype=torch.bfloat16), page_stride=page_stride)
    if arena_offset:
        cache = cache[1:]  # storage_offset != 0
    if nan_rows is not None:
        raw = cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))
        for t in nan_rows.tolist():
            blk, off = divmod(t, page)
            if fmt == "model1":
                raw[blk, off * 576: off * 576 + 576] = 0xFF           # fp8 NaN + bf16 NaN
                raw[blk, page * 576 + off * 8: page * 576 + off * 8 + 7] = 0xFF  # e8m0 NaN
            else:
                raw[blk, off * 656: off * 656 + 656] = 0xFF
    return cache


def random_indices(b, s_q, topk, num_tokens, gen, invalid_frac=0.1, pool=None):
    pool = torch.arange(num_tokens) if pool is None else pool
    idx = torch.stack([pool[torch.randperm(len(pool), generator=gen)[:topk]]
                       for _ in range(b * s_q)]).view(b, s_q, topk).to(torch.int32)
    drop = torch.rand(b, s_q, topk, generator=gen) < invalid_frac
    return idx.masked_fill(drop, -1)


def run_case(fmt="model1", b=2, s_q=1, h_q=16, topk=64, page=64, num_blocks=4, extra=None,
             sink=None, topk_len=None, num_splits=None, seed=0, nan_unused=True, device="cpu",
             softmax_scale=None, page_stride=None, arena_offset=0, indices_hook=None):
    """extra = (extra_topk, extra_page, extra_blocks, extra_len or None)."""
    gen = torch.Generator().manual_seed(seed)
    d = 512 if fmt == "model1" else 576
    ntok = num_blocks * page
    # Half the tokens are never referenced; they hold NaN.
    used = torch.randperm(ntok, generator=gen)[: max(ntok // 2, topk)]
    unused = torch.tensor(sorted(set(range(ntok)) - set(used.tolist())), dtype=torch.long)
    cache = make_cache(fmt, num_blocks, page, gen, unused if nan_unused else None, page_stride,
                       arena_offset, device)
    indices = random_indices(b, s_q, topk, ntok, gen, pool=used)
    if indices_hook is not None:
        indices = indices_hook(indices)
    q = torch.randn(b, s_q, h_q, d, generator=gen).clamp(-1, 1).to(torch.bfloat16)
    if softmax_scale is None:
        softmax_scale = d ** -0.55  # as FlashMLA's test
    kw = dict(topk_length=None if topk_len is None else torch.tensor(topk_len, dtype=torch.int32))
    if sink is not None:
        kw["attn_sink"] = torch.tensor(sink, dtype=torch.float32).expand(h_q).contiguous() \
            if not isinstance(sink, torch.Tensor) else sink
    if extra is not None:
        xtopk, xpage, xblocks, xlen = extra
        xntok = xpage * xblocks
        xused = torch.randperm(xntok, generator=gen)[: max(xntok // 2, xtopk)]
        xunused = torch.tensor(sorted(set(range(xntok)) - set(xused.tolist())), dtype=torch.long)
        kw["extra_k_cache"] = make_cache(fmt, xblocks, xpage, gen, xunused if nan_unused else None,
                                         device=device)
        kw["extra_indices"] = random_indices(b, s_q, xtopk, xntok, gen, pool=xused)
        if xlen is not None:
            kw["extra_topk_length"] = torch.tensor(xlen, dtype=torch.int32)
    kw = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    q, indices = q.to(device), indices.to(device)
    out, lse = sparse_mla_decode(q, cache, indices, softmax_scale=softmax_scale,
                                 num_splits=num_splits, **kw)
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, indices, softmax_scale=softmax_scale, **kw)
    assert lse.shape == (b, h_q, s_q) and lse.stride(1) == 1 and out.shape == (b, s_q, h_q, 512)
    assert_flashmla_close("out", out.cpu(), ref_out.cpu(), **OUT_TOL)
    assert_flashmla_close("lse", lse.cpu(), ref_lse.cpu(), **LSE_TOL)
    return out, lse


@pytest.mark.parametrize("fmt", ["model1", "v32"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_basic(fmt, num_splits):
    run_case(fmt, b=2, s_q=2, h_q=16, topk=64, num_splits=num_splits, sink=0.5)


@pytest.mark.parametrize("sink", [float("inf"), float("-inf"), "mixed"])
def test_sink(sink):
    if sink == "mixed":
        sink = torch.tensor([float("inf"), float("-inf"), 3.0, -2.0] * 4, dtype=torch.float32)
    out, _ = run_case("model1", b=1, s_q=1, h_q=16, topk=64, sink=sink, num_splits=2)
    if isinstance(sink, float) and sink > 0:
        assert (out == 0).all()


@pytest.mark.parametrize("xpage", [64, 2])
def test_extra_cache(xpage):
    # main page 64 + extra cache with its own page size and per-request extra_topk_length
    run_case("model1", b=2, s_q=2, h_q=16, topk=64, page=64, num_splits=2, sink=1.0,
             extra=(96, xpage, 256 // xpage, [96, 37]), topk_len=[64, 50])


def test_extra_cache_v32():
    run_case("v32", b=1, s_q=1, h_q=16, topk=64, page=64, num_splits=1,
             extra=(64, 2, 96, None))


def test_topk_length_and_not_multiple_of_64():
    run_case("model1", b=3, s_q=1, h_q=16, topk=80, topk_len=[80, 33, 1], num_splits=2)


def test_all_invalid_rows():
    def kill(idx):
        idx[0] = -1              # every query of batch 0 lonely
        idx[1, 0, :] = -1
        return idx
    out, lse = run_case("model1", b=2, s_q=2, h_q=16, topk=64, sink=0.3, num_splits=2,
                        indices_hook=kill)
    assert (out[0] == 0).all() and torch.isinf(lse[0]).all() and (lse[0] > 0).all()
    assert torch.isinf(lse[1, :, 0]).all() and torch.isfinite(lse[1, :, 1]).all()


def test_zero_topk_length_and_out_of_range_indices():
    def junk(idx):
        idx[0, 0, :8] = torch.tensor([2**31 - 1, -2**31, -123456, 256, 10**6, -2, 257, 300],
                                     dtype=torch.int32)
        return idx
    run_case("model1", b=2, s_q=1, h_q=16, topk=64, num_blocks=4, page=64, topk_len=[64, 0],
             indices_hook=junk, num_splits=1)


def _padded(idx):
    """The same indices as a non-contiguous view (row stride > topk), padding full of junk."""
    junk = torch.full(idx.shape[:-1] + (16,), 7, dtype=idx.dtype)
    return torch.cat([idx, junk], -1)[..., : idx.shape[-1]]


def test_strided_arena_views():
    # page stride larger than needed, a view that does not start at the arena's beginning,
    # non-contiguous indices
    run_case("model1", b=2, s_q=2, h_q=16, topk=64, page=64, page_stride=64 * 584 + 576 * 3,
             arena_offset=1, extra=(64, 2, 64, None), indices_hook=_padded)
    run_case("v32", b=1, s_q=1, h_q=16, topk=64, page=64, page_stride=64 * 656 + 656,
             arena_offset=1)


@pytest.mark.parametrize("fmt, h_q", [("model1", 8), ("model1", 24), ("model1", 40),
                                       ("v32", 24)])
def test_head_counts(fmt, h_q):
    run_case(fmt, b=1, s_q=2, h_q=h_q, topk=64, num_splits=2, sink=-1.0)


@pytest.mark.parametrize("fmt", ["model1", "v32"])
def test_large_logits_move_the_running_max(fmt):
    """Logits spread over ~2^20 (softmax_scale 12): the running max keeps growing in later tiles,
    so acc and l are rescaled by large factors mid-list."""
    run_case(fmt, b=2, s_q=1, h_q=16, topk=256, page=64, num_blocks=8, softmax_scale=12.0,
             num_splits=1)


def test_page_256_and_scale():
    run_case("model1", b=1, s_q=1, h_q=16, topk=64, page=256, num_blocks=2, softmax_scale=0.11)


@pytest.mark.cpu_only
@pytest.mark.parametrize("fmt", ["model1", "v32"])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_prefetch_depths(monkeypatch, fmt, prefetch):
    """Every load-ahead depth, across both lists, split boundaries and short lengths."""
    monkeypatch.setenv("SM12X_SPARSE_MLA_CONFIG",
                       f"BLOCK_H=16,BLOCK_N=16,num_warps=4,PREFETCH={prefetch}")
    run_case(fmt, b=3, s_q=1, h_q=16, topk=80, topk_len=[80, 33, 1], num_splits=3,
             extra=(48, 2, 40, [48, 0, 17]), sink=0.2)


@pytest.mark.parametrize("sms", [1, 10**6])
def test_combine_reads_or_skips_empty_parts(monkeypatch, sms):
    """Rows split five ways whose lengths leave later parts empty (and 5 parts: not a multiple
    of the combine's parts per step), the combine skipping empty parts (1 SM: the programs fill
    it) or reading every part."""
    from sm12x.kernels.sparse_mla.decode_plan import plan

    monkeypatch.setenv("SM12X_NUM_SMS", str(sms))
    pl = plan(3, 1, 16, 80, 48, torch.device("cpu"), num_splits=5, ragged=True)
    assert pl.skip_empty == (sms == 1)
    run_case("model1", b=3, s_q=1, h_q=16, topk=80, topk_len=[80, 33, 1], num_splits=5,
             extra=(48, 2, 40, [48, 0, 17]), sink=0.2)


def test_combine_skips_empty_parts_only_when_ragged_and_filling_the_gpu():
    from sm12x.kernels.sparse_mla.decode_plan import plan

    cpu = torch.device("cpu")  # 188 SMs
    big = plan(74, 2, 64, 128, 1024, cpu, ragged=True)
    small = plan(2, 2, 64, 128, 1024, cpu, ragged=True)
    assert big.programs >= 188 > small.programs
    assert big.skip_empty and not small.skip_empty
    assert not plan(74, 2, 64, 128, 1024, cpu).skip_empty


def test_pdl_only_where_the_combine_fits_beside(monkeypatch):
    """The combine is launched as a programmatic dependent only where the split kernel leaves
    parts and its programs fit on the SMs the split kernel leaves idle (8 each), and only where
    PDL is supported."""
    from sm12x.kernels.sparse_mla import decode_plan as mod

    cpu = torch.device("cpu")  # 188 SMs
    monkeypatch.setattr(mod, "_PLANS", {})
    assert not plan(2, 2, 64, 128, 512, cpu).pdl  # the interpreter: never
    monkeypatch.setattr(mod, "_PLANS", {})
    monkeypatch.setattr(mod, "pdl_supported", lambda device: True)
    small = plan(2, 2, 64, 128, 512, cpu)  # 4 queries: 128 combine programs
    assert not small.direct and small.programs <= 188 - 16 and small.pdl
    one_row_each = plan(64, 2, 64, 128, 512, cpu, num_splits=1)
    assert one_row_each.direct and not one_row_each.pdl
    waves = plan(74, 2, 64, 128, 1024, cpu, ragged=True)
    assert not waves.direct and waves.programs > 188 and not waves.pdl
    crowded = plan(20, 2, 64, 128, 512, cpu, num_splits=4)  # 1280 combine programs
    assert not crowded.direct and crowded.programs == 160 and not crowded.pdl


def test_pdl_switch(monkeypatch):
    from sm12x.kernels.sparse_mla import decode_plan as mod

    assert not mod.pdl_supported(torch.device("cpu"))
    monkeypatch.setattr(mod, "_pdl_supported", lambda index: True)
    gpu = torch.device("cuda", 0)
    assert mod.pdl_supported(gpu)
    monkeypatch.setenv("SM12X_PDL", "0")
    assert not mod.pdl_supported(gpu)


def test_program_count_model():
    from sm12x.kernels.sparse_mla.decode_plan import _best_program_count

    part = 64 * 512 * 8
    # One program per SM, 10 tiles each: splitting only adds waves and combine traffic.
    assert _best_program_count(128, 10, 132, part) == (128, False)
    assert _best_program_count(512, 10, 132, part) == (512, False)
    # A few rows on a big GPU: one tile per program.
    assert _best_program_count(4, 10, 132, part) == (40, False)
    # 148 rows on 132 SMs: one program per SM with the 1,480 tiles dealt out evenly (12 tiles
    # each) beats 2 waves x 10 tiles and 3 waves x 5 tiles (two parts per row) ...
    assert _best_program_count(148, 10, 132, part) == (132, True)
    # ... a multiple of the head blocks, rows numbered head block first ...
    assert _best_program_count(296, 10, 133, part, head_blocks=2) == (132, True)
    # ... unless the rows are ragged: then the hardware balances them, 3 waves x 5 tiles.
    assert _best_program_count(148, 10, 132, part, ragged=True) == (296, False)


def test_split_rows():
    from sm12x.kernels.sparse_mla.decode_plan import split_rows

    assert split_rows(4, 10, 4) == (0, 0)            # one row per program
    assert split_rows(4, 10, 2) == (0, 0)            # two whole rows per program
    assert split_rows(4, 10, 12) == (4, 12)          # every row in three parts
    assert split_rows(3, 5, 4) == (3, 6)             # units 0-2 | 3-6 | 7-10 | 11-14
    assert split_rows(2, 3, 6) == (2, 6)             # one unit per program


@pytest.mark.parametrize("programs, head_major, wide", [
    (1, True, False), (2, True, False), (4, True, True), (5, False, False), (7, False, True),
    (30, True, True), (6, False, False), (12, False, False), (24, False, False)])
def test_rows_cut_anywhere(monkeypatch, programs, head_major, wide):
    """Dealt-out program counts that put several rows, part rows and many-part rows on one
    program, in both row orders, with 32- and 64-bit unit arithmetic; one row per program; and
    rows cut in 2 and 4 equal parts (6 rows here)."""
    from sm12x.kernels.sparse_mla import decode_plan as sd

    if wide:
        monkeypatch.setattr(sd, "WIDE_PRODUCT", 0)
    monkeypatch.setattr(sd, "_best_program_count", lambda *a: (programs, head_major))
    monkeypatch.setattr(sd, "_PLANS", {})
    monkeypatch.setenv("SM12X_SPARSE_MLA_CONFIG", "BLOCK_H=16,BLOCK_N=16,num_warps=4")
    # rows: 3 queries x 2 head blocks; tiles: 5 main + 3 extra -> 48 units
    run_case("model1", b=3, s_q=1, h_q=24, topk=80, topk_len=[80, 33, 1],
             extra=(48, 2, 40, [48, 0, 17]), sink=0.2)
    p = sd.plan(3, 1, 24, 80, 48, torch.device("cpu"), ragged=True)
    assert p.programs == programs
    assert p.dealt == (head_major or programs % 6 != 0 or programs == 6)


def test_small_calls_take_smaller_head_blocks(monkeypatch):
    from sm12x.kernels.sparse_mla.decode_plan import pick_config

    monkeypatch.setenv("SM12X_NUM_SMS", "188")
    cpu = torch.device("cpu")  # the sm_120 configs: H16 N32, H32 N16, H64 N16
    # h_q 64, 128+512: 10 programs of 64 candidates per query at BLOCK_H 64 (40 tiles of 16).
    # Nine queries (90) cannot give half of 188 SMs one: the smallest head block (not the
    # middle one); ten (100) can.
    assert pick_config(64, cpu, queries=9, topk=128, extra_topk=512)["BLOCK_H"] == 16
    assert pick_config(64, cpu, queries=10, topk=128, extra_topk=512)["BLOCK_H"] == 64
    assert pick_config(64, cpu, queries=128, topk=128, extra_topk=512)["BLOCK_H"] == 64
    assert pick_config(32, cpu, queries=1, topk=64)["BLOCK_H"] == 16
    assert pick_config(16, cpu, queries=1, topk=64)["BLOCK_H"] == 16


def test_auto_splits_fill_gpu(monkeypatch):
    monkeypatch.setenv("SM12X_NUM_SMS", "6")
    p = plan(1, 1, 16, 64, 64, torch.device("cpu"))
    assert p.programs >= 4 and not p.direct
    run_case("model1", b=1, s_q=1, h_q=16, topk=64, extra=(64, 64, 2, None))
    p = plan(256, 2, 64, 128, 512, torch.device("cpu"))
    assert p.programs == 256 * 2 * p.head_blocks and p.direct


def test_quantiser_round_trip():
    gen = torch.Generator().manual_seed(1)
    for fmt, d, quant, dequant, tile in (("model1", 512, kvc.quantize_model1_cache,
                                           kvc.dequantize_model1_cache, 64),
                                          ("v32", 576, kvc.quantize_v32_cache,
                                           kvc.dequantize_v32_cache, 128)):
        kv = (torch.randn(3, 64, d, generator=gen) * torch.logspace(-3, 2, d)).to(torch.bfloat16)
        cache = quant(kv)
        bpt = 584 if fmt == "model1" else 656
        assert cache.shape == (3, 64, 1, bpt) and cache.stride(1) == bpt
        if fmt == "model1":
            assert cache.stride(0) == 37440  # 64 * 584 padded to a multiple of 576
        back = dequant(cache)
        nope = 448 if fmt == "model1" else 512
        assert torch.equal(back[..., nope:], kv[..., nope:])          # RoPE is stored as is
        amax = kv[..., :nope].float().unflatten(-1, (-1, tile)).abs().amax(-1, keepdim=True)
        err = (back[..., :nope].float() - kv[..., :nope].float()).unflatten(-1, (-1, tile)).abs()
        assert (err <= amax / 448 * 32 + 1e-30).all()   # e4m3: 3 mantissa bits, pow2 scale <= 2x
        assert torch.equal(dequant(quant(back)), back)                  # idempotent


def test_indices_from_positions():
    block_table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    pos = torch.tensor([[[0, 5, 64, -1]], [[63, 64, 100, 1]]])
    idx = kvc.indices_from_positions(pos, block_table, 64)
    assert idx.tolist() == [[[192, 197, 64, -1]], [[63, 128, 164, 1]]]


def test_checker_can_fail():
    ref = torch.randn(4, 512) / 10
    with pytest.raises(AssertionError):
        assert_flashmla_close("out", ref * (1 + 2**-5) + 2e-3, ref, **OUT_TOL)
    with pytest.raises(AssertionError):
        assert_flashmla_close("lse", ref.abs() + 5 + 1e-3, ref.abs() + 5, **LSE_TOL)
    with pytest.raises(AssertionError):
        assert_flashmla_close("lse", torch.tensor([float("inf")]), torch.tensor([1.0]), **LSE_TOL)


def test_make_case_matches_kernel():
    case = make_case(b=2, s_q=2, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2,
                     topk_length=True, extra_topk_length=True)
    check_case(case, num_splits=2)


def check_case(case, **kw):
    out, lse = sparse_mla_decode(**case, **kw)
    ref_out, ref_lse = ref_sparse_mla_decode(**case)
    assert_flashmla_close("out", out.cpu(), ref_out.cpu(), **OUT_TOL)
    assert_flashmla_close("lse", lse.cpu(), ref_lse.cpu(), **LSE_TOL)
    return out, lse


# ---------------------------------------------------------------------------------------------
# GPU: production shapes (SM12X_TEST_DEVICE=cuda)

PROD = [  # (h_q, topk, page, extra_topk, extra_page, extra_topk_length)
    (64, 128, 256, 512, 64, False),    # V4-Flash CSA layer (FlashMLA CONFIG1)
    (128, 128, 256, 1024, 64, False),  # V4-Pro (CONFIG2)
    (64, 128, 256, 1024, 2, True),     # HCA layer, per-request extra length (CONFIG3)
    (128, 128, 256, 1024, 2, True),    # CONFIG4
]


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["default", "sm_120"])
@pytest.mark.parametrize("b", [2, 74, 148])
@pytest.mark.parametrize("shape", PROD)
def test_gpu_production_model1(shape, b, arch, monkeypatch):
    if arch != "default":
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", arch)
    h_q, topk, page, xtopk, xpage, xlen = shape
    case = make_case("model1", b=b, s_q=2, h_q=h_q, topk=topk, page=page, extra_topk=xtopk,
                     extra_page=xpage, extra_topk_length=xlen, device="cuda", seed=b)
    check_case(case)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["default", "sm_120"])
@pytest.mark.parametrize("h_q, b, s_q, topk_length", [(8, 1, 1, False), (16, 1, 8, True),
                                                      (32, 3, 4, True), (128, 64, 2, False)])
def test_gpu_mixed_shapes(h_q, b, s_q, topk_length, arch, monkeypatch):
    if arch != "default":
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", arch)
    case = make_case("model1", b=b, s_q=s_q, h_q=h_q, topk=192, page=256, extra_topk=2048,
                     extra_page=2, topk_length=topk_length, extra_topk_length=True,
                     device="cuda", seed=h_q)
    check_case(case)


@pytest.mark.gpu
@pytest.mark.parametrize("b", [2, 64])
def test_gpu_v32(b):
    case = make_case("v32", b=b, s_q=2, h_q=128, topk=2048, page=64, device="cuda", seed=b)
    check_case(case)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_eager():
    from sm12x.frontends.flash_mla import api as api

    case = make_case("model1", b=8, s_q=2, h_q=64, topk=128, page=256, extra_topk=512,
                     extra_page=64, extra_topk_length=True, device="cuda", seed=3)
    args = dict(indices=case["indices"], attn_sink=case["attn_sink"],
                extra_k_cache=case["extra_k_cache"],
                extra_indices_in_kvcache=case["extra_indices"],
                extra_topk_length=case["extra_topk_length"], softmax_scale=case["softmax_scale"],
                is_fp8_kvcache=True)
    sched, _ = api.get_mla_metadata()
    q = case["q"].clone()
    full_len = case["extra_topk_length"].clone()

    def step():
        return api.flash_mla_with_kvcache(q, case["k_cache"], None, None, 512, sched, **args)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile outside the graph
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = step()
    for _ in range(3):  # new values in the captured input buffers
        q.copy_(torch.randn_like(q, dtype=torch.float32).clamp(-1, 1))
        # shorter lengths only: rows past the original lengths may be NaN-poisoned on purpose
        args["extra_topk_length"].copy_(torch.minimum(
            full_len, torch.randint_like(full_len, 1, 513)))
        graph.replay()
        e_out, e_lse = step()
        torch.cuda.synchronize()
        assert torch.equal(g_out, e_out) and torch.equal(g_lse, e_lse)
        ref_out, ref_lse = ref_sparse_mla_decode(q, case["k_cache"], case["indices"], None,
                                                 case["attn_sink"], case["extra_k_cache"],
                                                 case["extra_indices"],
                                                 args["extra_topk_length"],
                                                 case["softmax_scale"])
        assert_flashmla_close("out", g_out.cpu(), ref_out.cpu(), **OUT_TOL)
        assert_flashmla_close("lse", g_lse.cpu(), ref_lse.cpu(), **LSE_TOL)


def test_config_choice_and_env_override(monkeypatch):
    from sm12x.kernels.sparse_mla.decode_plan import pick_config

    cpu = torch.device("cpu")  # the sm_120 configs
    assert [pick_config(h, cpu)["BLOCK_H"] for h in (8, 16, 24, 32, 64, 128)] == [16, 16, 32, 32,
                                                                                64, 64]
    assert pick_config(128, cpu, "v32")["BLOCK_H"] == 32
    monkeypatch.setenv("SM12X_SPARSE_MLA_CONFIG", "BLOCK_H=16,BLOCK_N=16,num_warps=4")
    assert pick_config(64, cpu) == {"BLOCK_H": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    run_case("model1", b=1, s_q=1, h_q=24, topk=40, num_splits=2)
    monkeypatch.setenv("SM12X_SPARSE_MLA_CONFIG", "BLOCK_X=1")
    with pytest.raises(ValueError, match="SM12X_SPARSE_MLA_CONFIG"):
        pick_config(64, cpu)


@pytest.mark.gpu
def test_gpu_pdl_combine_equals_plain_launch(monkeypatch):
    """A small split call with the combine as a programmatic dependent: the same bits as
    the plain launch, eager and replayed from a CUDA graph, and within FlashMLA's tolerances."""
    from sm12x.kernels.sparse_mla import decode_plan as mod

    case = make_case("model1", b=2, s_q=2, h_q=64, topk=128, page=256, extra_topk=1024,
                     extra_page=2, extra_topk_length=True, device="cuda", seed=5)
    if not mod.pdl_supported(case["q"].device):
        pytest.skip("this GPU or Triton has no programmatic dependent launch")
    monkeypatch.setattr(mod, "_PLANS", {})
    pl = plan(2, 2, 64, 128, 1024, case["q"].device, ragged=True)
    assert pl.pdl and not pl.direct
    out, lse = check_case(case)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_lse = sparse_mla_decode(**case)
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setenv("SM12X_PDL", "0")
    monkeypatch.setattr(mod, "_PLANS", {})
    assert not plan(2, 2, 64, 128, 1024, case["q"].device, ragged=True).pdl
    p_out, p_lse = sparse_mla_decode(**case)
    for a in (out, g_out):
        assert torch.equal(a, p_out)
    for a in (lse, g_lse):
        assert torch.equal(a, p_lse)

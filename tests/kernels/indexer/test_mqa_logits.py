"""Prefill MQA logits (fp8_mqa_logits / fp8_fp4_mqa_logits) against the PyTorch reference."""
import os

import pytest
import torch

from sm12x.frontends.deep_gemm import indexer as api
from sm12x.kernels.indexer import mqa_logits as mq
from sm12x.kernels.indexer.cache import dequant_fp4, quant_fp4_per_token, quant_fp8_per_token
from sm12x.kernels.common.tolerance import calc_diff
from sm12x.kernels.indexer.reference import ref_mqa_logits

NEG_INF = float("-inf")


def make_inputs(s, s_kv, h, d, fp4, device, seed=0, weights_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, h, d, generator=g)
    k = torch.randn(s_kv, d, generator=g)
    w = torch.randn(s, h, generator=g)
    if fp4:
        qv, qs = quant_fp4_per_token(q)
        kv, ksf = quant_fp4_per_token(k)
        q_sim, k_sim, k_sim_sf = dequant_fp4(qv, qs), dequant_fp4(kv, ksf), None
    else:
        qv, qs = q.to(torch.float8_e4m3fn), None
        kv, ksf = quant_fp8_per_token(k)
        q_sim, k_sim, k_sim_sf = qv.float(), kv.float(), ksf
    to = dict(device=device)
    return dict(
        q=(qv.to(**to), None if qs is None else qs.to(**to)), kv=(kv.to(**to), ksf.to(**to)),
        weights=w.to(weights_dtype).to(**to), raw=(q, k, w), sim=(q_sim, k_sim, k_sim_sf))


def ragged_ranges(s, s_kv, device):
    """Causal-ish ranges with an empty range, a range touching S_kv and a range starting late."""
    ks = torch.zeros(s, dtype=torch.int32)
    ke = torch.zeros(s, dtype=torch.int32)
    for i in range(s):
        ks[i] = (i * 37) % max(s_kv // 3, 1)
        ke[i] = min(s_kv, int(ks[i]) + 1 + (i * 101) % s_kv)
    ks[1] = ke[1] = 5  # empty
    ke[-1] = s_kv
    ks[-1] = 0
    return ks.to(device), ke.to(device)


def check_against_reference(logits, inp, ks, ke, fp4, clean=True, max_seqlen_k=0):
    q_sim, k_sim, k_sf = inp["sim"]
    w = inp["weights"].float().cpu()
    ks_c, ke_c = ks.cpu(), ke.cpu()
    sim = ref_mqa_logits(q_sim, k_sim, k_sf, w, ks_c, ke_c, clean_logits=True, max_seqlen_k=max_seqlen_k)
    q, k, _ = inp["raw"]
    exact = ref_mqa_logits(q, k, None, w, ks_c, ke_c, clean_logits=True, max_seqlen_k=max_seqlen_k)
    out = logits.float().cpu()
    invalid = sim == NEG_INF
    if clean:
        assert torch.equal(out == NEG_INF, invalid)
    out, sim, exact = (t.masked_fill(invalid, 0) for t in (out, sim, exact))
    assert calc_diff(out, sim) < (1e-5 if logits.dtype == torch.float32 else 1e-4)
    assert calc_diff(out, exact) < (0.02 if fp4 else 1e-3)


CASES = [  # (fp4, H, D)
    (False, 8, 32), (False, 16, 64), (False, 64, 128), (True, 8, 64), (True, 64, 128),
]


@pytest.mark.parametrize("fp4,h,d", CASES)
def test_clean_logits(device, fp4, h, d):
    s, s_kv = 7, 300
    inp = make_inputs(s, s_kv, h, d, fp4, device)
    ks, ke = ragged_ranges(s, s_kv, device)
    logits = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke, clean_logits=True)
    assert logits.shape == (s, s_kv) and logits.dtype == torch.float32
    # DeepGEMM layout: 1024-byte aligned row stride with >= 256 columns of slack
    assert logits.stride(1) == 1 and logits.stride(0) % 256 == 0 and logits.stride(0) >= s_kv + 256
    check_against_reference(logits, inp, ks, ke, fp4)


@pytest.mark.parametrize("fp4,fp4_mma", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("key_rows", [False, True])
def test_both_mma_layouts(device, fp4, fp4_mma, key_rows):
    """Heads on the MMA's M side and keys on it (``key_rows``) give the same logits; FP4 both as
    decoded e4m3 group dots and as one block-scaled ``tl.dot_scaled`` (``fp4_mma``)."""
    from sm12x.kernels.common import configs

    s, s_kv, h, d = 5, 260, 16, 64
    inp = make_inputs(s, s_kv, h, d, fp4, device, seed=3)
    ks, ke = ragged_ranges(s, s_kv, device)
    cfg = dict(configs.pick(mq.CONFIGS, torch.device(device))["fp4" if fp4 else "fp8"], key_rows=key_rows,
               fp4_mma=fp4_mma)
    out = mq.alloc_logits(s, s_kv, h, torch.float32, torch.device(device))
    (qv, qs), (k, k_sf) = inp["q"], inp["kv"]
    mq.launch(qv, qs, k, k_sf, inp["weights"], ks, ke, out, clean=True, compressed=False, out_mode=0,
              config=cfg)
    check_against_reference(out, inp, ks, ke, fp4)


@pytest.mark.parametrize("fp4", [False, True])
def test_multi_tile_programs(device, fp4):
    """Programs that own several key tiles, as in production (``configs.fit_iters`` gives these
    small grids one tile per program; an explicit config is used as given): tiles no row sees
    are skipped, the last chunk's loads are clamped, and clean / unclean / compressed outputs
    stay right."""
    from sm12x.kernels.common import configs

    s, s_kv, h, d = 7, 300, 16, 64
    inp = make_inputs(s, s_kv, h, d, fp4, device, seed=4)
    ks, ke = ragged_ranges(s, s_kv, device)
    cfg = dict(configs.pick(mq.CONFIGS, torch.device(device))["fp4" if fp4 else "fp8"], N_ITERS=3)
    (qv, qs), (k, k_sf) = inp["q"], inp["kv"]
    for clean in (True, False):
        out = mq.alloc_logits(s, s_kv, h, torch.float32, torch.device(device))
        mq.launch(qv, qs, k, k_sf, inp["weights"], ks, ke, out, clean=clean, compressed=False,
                  out_mode=0, config=cfg)
        check_against_reference(out, inp, ks, ke, fp4, clean=clean)
    width = int((ke - ks).max())
    comp = mq.alloc_logits(s, width, h, torch.float32, torch.device(device), extra=0)
    mq.launch(qv, qs, k, k_sf, inp["weights"], ks, ke, comp, clean=False, compressed=True,
              out_mode=0, config=cfg)
    check_against_reference(comp, inp, ks, ke, fp4, clean=False, max_seqlen_k=width)


def test_fit_iters(monkeypatch):
    """Tiles per program: halved until the grid has ``per_sm`` programs per SM (4 by default),
    never below ``min_iters``."""
    from sm12x.kernels.common import configs

    cpu = torch.device("cpu")
    monkeypatch.setenv("SM12X_NUM_SMS", "132")
    assert configs.fit_iters(64, 64, 1024, cpu) == 64  # 1024 programs >= 528
    assert configs.fit_iters(32, 1024, 1, cpu) == 1  # one request: one block per program
    assert configs.fit_iters(32, 1024, 2, cpu) == 2  # 2 x 512 programs
    assert configs.fit_iters(64, 128, 8, cpu) == 1
    assert configs.fit_iters(32, 167, 256, cpu, per_sm=40, min_iters=4) == 8
    assert configs.fit_iters(32, 4096, 1, cpu, per_sm=40, min_iters=4) == 4  # not below min_iters
    monkeypatch.setenv("SM12X_NUM_SMS", "1")
    assert configs.fit_iters(64, 64, 4, cpu) == 64


@pytest.mark.parametrize("fp4,h,d", [CASES[1], CASES[4]])
def test_unclean_and_compressed(device, fp4, h, d):
    s, s_kv = 6, 260
    inp = make_inputs(s, s_kv, h, d, fp4, device, seed=1)
    ks, ke = ragged_ranges(s, s_kv, device)
    logits = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke, clean_logits=False)
    check_against_reference(logits, inp, ks, ke, fp4, clean=False)
    width = int((ke - ks).max())
    comp = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke, clean_logits=False,
                                  max_seqlen_k=width)
    assert comp.shape == (s, width) and comp.stride(0) % 256 == 0
    check_against_reference(comp, inp, ks, ke, fp4, clean=False, max_seqlen_k=width)


def test_q_scale_as_four_bytes(device):
    """vLLM's MXFP4 indexer passes q scales as uint8 [S, H, 4]: the packed int32's bytes."""
    s, s_kv, h, d = 4, 130, 16, 128
    inp = make_inputs(s, s_kv, h, d, True, device, seed=3)
    ks, ke = ragged_ranges(s, s_kv, device)
    qv, qs = inp["q"]
    want = api.fp8_fp4_mqa_logits((qv, qs), inp["kv"], inp["weights"], ks, ke)
    got = api.fp8_fp4_mqa_logits((qv, qs.view(torch.uint8).view(s, h, 4)), inp["kv"], inp["weights"], ks, ke)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="q_scale"):  # any other byte layout is still refused
        api.fp8_fp4_mqa_logits((qv, qs.view(torch.uint8).view(s, h, 4)[..., :2]), inp["kv"], inp["weights"], ks, ke)


def test_legacy_name_bf16_logits_and_weights(device):
    s, s_kv, h, d = 5, 200, 32, 64
    inp = make_inputs(s, s_kv, h, d, False, device, seed=2)
    ks, ke = ragged_ranges(s, s_kv, device)
    a = api.fp8_mqa_logits(inp["q"][0], inp["kv"], inp["weights"], ks, ke)
    b = api.fp8_mqa_logits(q=inp["q"][0], kv=inp["kv"], weights=inp["weights"], cu_seq_len_k_start=ks,
                           cu_seq_len_k_end=ke, clean_logits=True, max_seqlen_k=0)
    assert torch.equal(a, b)  # deterministic; keyword names as DeepGEMM
    check_against_reference(a, inp, ks, ke, False)
    bf = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"].bfloat16(), ks, ke,
                                logits_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16 and bf.stride(0) % 512 == 0
    inp["weights"] = inp["weights"].bfloat16()
    check_against_reference(bf, inp, ks, ke, False)


def test_empty_and_full_ranges(device):
    s, s_kv, h, d = 4, 130, 16, 64
    inp = make_inputs(s, s_kv, h, d, False, device, seed=3)
    ks = torch.tensor([0, 130, 64, 0], dtype=torch.int32, device=device)
    ke = torch.tensor([0, 130, 64, 130], dtype=torch.int32, device=device)
    logits = api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke)
    assert bool((logits[:3] == NEG_INF).all())
    check_against_reference(logits, inp, ks, ke, False)


def test_int64_row_offsets(device):
    """Row offsets are formed in int64: 70,000 rows x a 65,536-element stride is past 2**31."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(out_ptr, rows_ptr, stride):
        i = tl.arange(0, 4)
        rows = tl.load(rows_ptr + i)
        tl.store(out_ptr + i, mq.row_offsets(rows, stride))

    rows = torch.tensor([0, 1, 32769, 70000], dtype=torch.int32, device=device)
    out = torch.zeros(4, dtype=torch.int64, device=device)
    probe[(1,)](out, rows, 65536)
    assert out.cpu().tolist() == [r * 65536 for r in rows.cpu().tolist()]


def test_unknown_kwargs(device):
    inp = make_inputs(2, 64, 8, 32, False, device)
    ks = torch.zeros(2, dtype=torch.int32, device=device)
    ke = torch.full((2,), 64, dtype=torch.int32, device=device)
    api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke, some_future_flag=None)
    with pytest.raises(NotImplementedError, match="fp8_fp4_mqa_logits.*'some_future_flag'"):
        api.fp8_fp4_mqa_logits(inp["q"], inp["kv"], inp["weights"], ks, ke, some_future_flag=True)


def test_errors(device):
    inp = make_inputs(3, 64, 8, 32, False, device)
    ks = torch.zeros(3, dtype=torch.int32, device=device)
    ke = torch.full((3,), 64, dtype=torch.int32, device=device)
    q, kv, w = inp["q"], inp["kv"], inp["weights"]
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'q'.*dtype"):
        api.fp8_fp4_mqa_logits((q[0].float(), None), kv, w, ks, ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'q'.*heads"):
        api.fp8_fp4_mqa_logits((q[0][:, :6].contiguous(), None), kv, w[:, :6].contiguous(), ks, ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'kv'.*shape"):
        api.fp8_fp4_mqa_logits(q, (kv[0][:, :16].contiguous(), kv[1]), w, ks, ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'kv_scale'"):
        api.fp8_fp4_mqa_logits(q, (kv[0], kv[1][:10]), w, ks, ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'weights'.*shape"):
        api.fp8_fp4_mqa_logits(q, kv, w[:2], ks, ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'cu_seq_len_k_start'.*dtype"):
        api.fp8_fp4_mqa_logits(q, kv, w, ks.long(), ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'cu_seq_len_k_end'.*shape"):
        api.fp8_fp4_mqa_logits(q, kv, w, ks, ke[:2])
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'clean_logits'"):
        api.fp8_fp4_mqa_logits(q, kv, w, ks, ke, clean_logits=True, max_seqlen_k=64)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'logits_dtype'"):
        api.fp8_fp4_mqa_logits(q, kv, w, ks, ke, logits_dtype=torch.float16)
    with pytest.raises(ValueError, match="fp8_mqa_logits: argument 'q'"):
        api.fp8_mqa_logits(q, kv, w, ks, ke)
    fp4 = make_inputs(3, 64, 8, 64, True, device)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'q_scale'.*shape"):
        api.fp8_fp4_mqa_logits((fp4["q"][0], fp4["q"][1][:, :4].contiguous()), fp4["kv"], fp4["weights"], ks, ke)
    with pytest.raises(ValueError, match="fp8_fp4_mqa_logits: argument 'kv_scale'.*dtype"):
        api.fp8_fp4_mqa_logits(fp4["q"], (fp4["kv"][0], fp4["kv"][1].float()), fp4["weights"], ks, ke)


# ----------------------------------------------------------------------------------------------
# GPU: production shapes


def _cuda_ranges(s, s_kv, causal=True):
    ke = torch.arange(s, dtype=torch.int32, device="cuda") + (s_kv - s) + 1 if causal else \
        torch.full((s,), s_kv, dtype=torch.int32, device="cuda")
    ks = torch.zeros(s, dtype=torch.int32, device="cuda")
    return ks, ke


@pytest.mark.gpu
@pytest.mark.parametrize("configs_env", ["sm_120", ""])
@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("s,s_kv", [(2048, 8192), (2048, 65536)])
def test_gpu_production(monkeypatch, configs_env, fp4, s, s_kv):
    if configs_env:
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", configs_env)
    else:
        monkeypatch.delenv("SM12X_KERNEL_CONFIGS", raising=False)
    h, d = 64, 128
    torch.manual_seed(0)
    q = torch.randn(s, h, d, device="cuda")
    k = torch.randn(s_kv, d, device="cuda")
    w = torch.randn(s, h, device="cuda")
    ks, ke = _cuda_ranges(s, s_kv)
    if fp4:
        qv, qs = quant_fp4_per_token(q)
        kv, ksf = quant_fp4_per_token(k)
    else:
        qv, qs = q.to(torch.float8_e4m3fn), None
        kv, ksf = quant_fp8_per_token(k)
    logits = api.fp8_fp4_mqa_logits((qv, qs), (kv, ksf), w, ks, ke, clean_logits=True)
    again = api.fp8_fp4_mqa_logits((qv, qs), (kv, ksf), w, ks, ke, clean_logits=True)
    assert torch.equal(logits, again)
    rows = torch.arange(0, s, 97, device="cuda")
    exact = ref_mqa_logits(q[rows], k, None, w[rows], ks[rows], ke[rows])
    inv = exact == NEG_INF
    assert torch.equal(logits[rows] == NEG_INF, inv)
    assert calc_diff(logits[rows].masked_fill(inv, 0), exact.masked_fill(inv, 0)) < (0.02 if fp4 else 1e-3)


@pytest.mark.gpu
def test_gpu_large_logits_int64():
    """S x S_kv >= 2**31 elements: the last rows must land where they belong."""
    s, s_kv, h, d = 8192, 262144 + 512, 64, 128
    torch.manual_seed(0)
    q = torch.randn(s, h, d, device="cuda").to(torch.float8_e4m3fn)
    kv, ksf = quant_fp8_per_token(torch.randn(s_kv, d, device="cuda"))
    w = torch.randn(s, h, device="cuda")
    ks = torch.full((s,), s_kv - 1024, dtype=torch.int32, device="cuda")
    ke = torch.full((s,), s_kv, dtype=torch.int32, device="cuda")
    logits = api.fp8_mqa_logits(q, (kv, ksf), w, ks, ke, clean_logits=True)
    assert logits.shape[0] * logits.stride(0) >= 2 ** 31
    rows = torch.tensor([0, s - 1], device="cuda")
    ref = ref_mqa_logits(q[rows].float(), kv, ksf, w[rows], ks[rows], ke[rows])
    got = logits[rows]
    inv = ref == NEG_INF
    assert torch.equal(got == NEG_INF, inv)
    assert calc_diff(got.masked_fill(inv, 0), ref.masked_fill(inv, 0)) < 1e-5

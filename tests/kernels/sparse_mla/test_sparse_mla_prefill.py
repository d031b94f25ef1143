"""Sparse MLA prefill (``flash_mla_sparse_fwd``) vs the PyTorch reference (CPU: Triton interpreter,
small shapes; GPU: production shapes)."""
import pytest
import torch

from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill
from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill
from sm12x.kernels.common.tolerance import flashmla_prefill_close

pytestmark = pytest.mark.cpu_only  # inputs on the CPU; GPU cases are marked gpu
PATHS = ["split", "pipelined"]  # the two kernels (prefill.use_pipelined picks one by shape)


@pytest.fixture(params=PATHS)
def path(request, monkeypatch):
    """Run the test through each kernel path."""
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", request.param)
    return request.param


def check(case, **kw):
    """The kernel against the reference at FlashMLA's prefill tolerances."""
    got = sparse_mla_prefill(**case, **kw)
    for name, v in flashmla_prefill_close(got, ref_sparse_mla_prefill(**case)).items():
        assert v.ok, f"{name}: {v.detail}; max abs {v.max_abs:.3g}, max rel {v.max_rel:.3g}"
    return got


@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("h_q, s_q, topk, s_kv, topk_length, sink", [
    (16, 3, 64, 200, True, True),
    (5, 2, 96, 40, False, True),      # odd heads; fewer keys than topk (indices >= s_kv)
    (64, 2, 48, 128, True, False),    # topk not a multiple of the tile
])
def test_matches_reference(d_qk, h_q, s_q, topk, s_kv, topk_length, sink, path):
    check(make_prefill_case(d_qk, s_q, h_q, topk, s_kv, topk_length, sink, seed=h_q))


@pytest.mark.parametrize("d_qk", [512, 576])
@pytest.mark.parametrize("num_splits", [2, 3])
def test_split_rows_merge(d_qk, num_splits):
    """Rows cut into parts (few query tokens): the combine step merges out, lse and max_logits."""
    case = make_prefill_case(d_qk, 3, 16, 96, 200, topk_length=True, seed=8)
    case["indices"][0] = -1
    check(case, num_splits=num_splits)


@pytest.mark.parametrize("skip_empty", [False, True])
@pytest.mark.parametrize("programs, head_major", [(5, False), (7, True), (4, True)])
def test_rows_dealt_out(monkeypatch, programs, head_major, skip_empty):
    """Program counts that cut rows anywhere (3 queries x 2 head blocks, 4 tiles each); the
    combine step reading every part or skipping empty ones (query 1 has none within its
    length)."""
    from sm12x.kernels.sparse_mla import decode_plan as sd

    monkeypatch.setattr(sd, "_best_program_count", lambda *a: (programs, head_major))
    monkeypatch.setattr(sd, "_PLANS", {})
    monkeypatch.setenv("SM12X_NUM_SMS", "1" if skip_empty else str(10**6))  # programs fill it?
    monkeypatch.setenv("SM12X_SPARSE_MLA_CONFIG", "BLOCK_H=16,BLOCK_N=16,num_warps=4")
    case = make_prefill_case(512, 3, 24, 64, 200, topk_length=True, seed=9)
    case["topk_length"][1] = 0
    check(case)
    p = sd.plan(3, 1, 24, 64, 0, torch.device("cpu"), fmt="bf16_512", ragged=True)
    assert p.programs == programs and p.dealt and not p.direct and p.skip_empty == skip_empty


def test_reference_chunks_agree():
    case = make_prefill_case(576, 5, 8, 64, 100, topk_length=True, seed=6)
    for a, b in zip(ref_sparse_mla_prefill(**case), ref_sparse_mla_prefill(**case, chunk=2)):
        assert torch.equal(a, b)


def test_strided_kv_and_out_buffer(path):
    case = make_prefill_case(512, 3, 16, 64, 100, row_pad=64, seed=1)
    assert not case["kv"].is_contiguous()
    out = torch.full((3, 16, 512), 7.0, dtype=torch.bfloat16)
    got, _, _ = check(case, out=out)
    assert got.data_ptr() == out.data_ptr()


def test_empty_rows_and_sinks(path):
    case = make_prefill_case(512, 3, 8, 64, 100, topk_length=True, seed=2)
    case["indices"][0] = -1                       # no valid candidate
    case["topk_length"][1] = 0                    # none within the length
    case["attn_sink"] = torch.tensor([float("inf"), float("-inf"), 0.0, 3.0] * 2)
    out, max_logits, lse = check(case)
    for row in (0, 1):
        assert bool((out[row] == 0).all())
        assert bool((max_logits[row] == float("-inf")).all())
        assert bool((lse[row] == float("inf")).all())
    assert bool((out[2, 0] == 0).all()) and bool(out[2, 1].abs().sum() > 0)  # +inf / -inf sink


def test_nan_in_unread_rows_does_not_leak(path):
    case = make_prefill_case(576, 2, 16, 64, 300, topk_length=True, seed=3)
    assert bool(case["kv"].isnan().any())
    out, max_logits, lse = sparse_mla_prefill(**case)
    assert not bool(out.isnan().any() or max_logits.isnan().any() or lse.isnan().any())


@pytest.mark.parametrize("block", [(16, 16, 4, 1), (32, 16, 4, 3), (16, 32, 8, 2)])
def test_pipelined_tiles(monkeypatch, block):
    """The pipelined kernel with other head/key tiles and stage counts: heads and candidates
    that do not fill the last tile, a query with no candidate within its length."""
    h, n, w, st = block
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", "pipelined")
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL_CONFIG",
                       f"BLOCK_H={h},BLOCK_N={n},num_warps={w},num_stages={st}")
    for d_qk in (512, 576):
        case = make_prefill_case(d_qk, 3, 20, 40, 90, topk_length=True, seed=11)
        case["topk_length"][2] = 0
        check(case)


def test_path_choice(monkeypatch):
    """The pipelined path takes calls whose whole-row programs fill the GPU twice, where the arch
    enables it; the environment forces either path."""
    from sm12x.kernels.sparse_mla import prefill as pf

    cpu = torch.device("cpu")
    monkeypatch.setenv("SM12X_NUM_SMS", "10")
    block_h = pf.pipelined_config(512, cpu)["BLOCK_H"]
    monkeypatch.setitem(pf.PIPELINED_PATH, "sm_120", (512,))
    assert pf.use_pipelined(20 * block_h // 64, 64, 512, cpu)
    assert not pf.use_pipelined(20 * block_h // 64 - 1, 64, 512, cpu)
    assert not pf.use_pipelined(4096, 128, 576, cpu)
    monkeypatch.setitem(pf.PIPELINED_PATH, "sm_120", ())
    assert not pf.use_pipelined(4096, 128, 512, cpu)
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", "pipelined")
    assert pf.use_pipelined(1, 1, 512, cpu)
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", "fast")
    with pytest.raises(ValueError, match="SM12X_SPARSE_MLA_PREFILL"):
        pf.use_pipelined(1, 1, 512, cpu)


@pytest.mark.parametrize("change, arg", [
    (lambda c: c.update(q=c["q"].float()), "q"),
    (lambda c: c.update(kv=c["kv"][:, :, :448]), "kv"),
    (lambda c: c.update(indices=c["indices"].long()), "indices"),
    (lambda c: c.update(indices=c["indices"][:1]), "indices"),
    (lambda c: c.update(topk_length=torch.zeros(5, dtype=torch.int32)), "topk_length"),
    (lambda c: c.update(attn_sink=torch.zeros(3)), "attn_sink"),
    (lambda c: c.update(d_v=448), "d_v"),
])
def test_bad_inputs_name_the_argument(change, arg):
    case = make_prefill_case(512, 2, 8, 64, 100, topk_length=True, seed=4)
    change(case)
    with pytest.raises(ValueError, match=f"flash_mla_sparse_fwd: argument '{arg}'"):
        sparse_mla_prefill(**case)


# ---------------------------------------------------------------------------------------------
# GPU: production shapes (SM12X_TEST_DEVICE=cuda)

PROD = [  # (d_qk, h_q, topk, s_kv, topk_length)
    (512, 64, 640, 65536, True),      # V4: compressed top-512 + 128 window rows, per-query length
    (512, 128, 1152, 65536, True),    # V4-Pro-like: 1024 + 128
    (576, 128, 2048, 131072, False),  # V3.2 / GLM-5 DSA prefill
    (576, 64, 2048, 8192, False),
]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["default", "pipelined"])
@pytest.mark.parametrize("arch", ["default", "sm_120"])
@pytest.mark.parametrize("shape", PROD)
@pytest.mark.parametrize("s_q", [3, 1024])
def test_gpu_production(shape, s_q, arch, kernel, monkeypatch):
    if arch != "default":
        monkeypatch.setenv("SM12X_KERNEL_CONFIGS", arch)
    if kernel != "default":
        monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", kernel)
    d_qk, h_q, topk, s_kv, topk_length = shape
    check(make_prefill_case(d_qk, s_q, h_q, topk, s_kv, topk_length, device="cuda", seed=s_q))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["split", "pipelined"])
def test_gpu_cuda_graph_replay_equals_eager(kernel, monkeypatch):
    monkeypatch.setenv("SM12X_SPARSE_MLA_PREFILL", kernel)
    case = make_prefill_case(512, 256, 64, 640, 16384, topk_length=True, device="cuda", seed=5)
    out = torch.empty((256, 64, 512), dtype=torch.bfloat16, device="cuda")
    eager = [t.clone() for t in sparse_mla_prefill(**case)]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparse_mla_prefill(**case, out=out)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, max_logits, lse = sparse_mla_prefill(**case, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip((out, max_logits, lse), eager):
        assert torch.equal(got, want)


def test_api_units_and_future_kwargs():
    from sm12x.frontends.flash_mla import api as api

    case = make_prefill_case(512, 2, 8, 64, 100, seed=7)
    case["indices"][0] = -1
    out, max_logits, lse = api.flash_mla_sparse_fwd(**case, some_future_flag=None)
    assert bool((lse[0] == float("inf")).all())
    # FlashMLA's nv_dev branch adds indexer_topk (default 0: the usual three results)
    assert all(torch.equal(a, b) for a, b in zip(api.flash_mla_sparse_fwd(**case, indexer_topk=0),
                                                 (out, max_logits, lse)))
    with pytest.raises(NotImplementedError, match="flash_mla_sparse_fwd: argument 'indexer_topk'"):
        api.flash_mla_sparse_fwd(**case, indexer_topk=512)
    # sgl-kernel / pre-2026 FlashMLA units: base 2; the old interface's empty rows: lse -inf
    _, m2, l2 = api.to_log2_units((out, max_logits.clone(), lse.clone()), float("-inf"))
    assert torch.allclose(m2[1], max_logits[1] * 1.4426950408889634)
    assert torch.allclose(l2[1], lse[1] * 1.4426950408889634)
    assert bool((l2[0] == float("-inf")).all())

"""FlashMLA-compatible surface: metadata APIs, lse layout, argument handling, errors."""
import pytest
import torch

from sm12x.frontends.flash_mla import api
from sm12x.frontends.flash_mla.convention import DECODE_ORDER, is_sparse_fp8_call
from sm12x.kernels.sparse_mla import kv_cache as kvc
from sm12x.kernels.sparse_mla.reference import ref_sparse_mla_decode

pytestmark = pytest.mark.cpu_only  # inputs on the CPU (interpreter); GPU cases: test_sparse_mla_decode -m gpu


def inputs(b=2, s_q=1, h_q=16, topk=64, fmt="model1", extra=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    d = 512 if fmt == "model1" else 576
    kv = (torch.randn(4, 64, d, generator=gen) / 10).to(torch.bfloat16)
    cache = (kvc.quantize_model1_cache if fmt == "model1" else kvc.quantize_v32_cache)(kv)
    q = torch.randn(b, s_q, h_q, d, generator=gen).clamp(-1, 1).to(torch.bfloat16)
    idx = torch.randint(0, 256, (b, s_q, topk), generator=gen, dtype=torch.int32)
    kw = dict(indices=idx, is_fp8_kvcache=True)
    if extra:
        xkv = (torch.randn(32, 2, d, generator=gen) / 10).to(torch.bfloat16)
        kw["extra_k_cache"] = kvc.quantize_model1_cache(xkv)
        kw["extra_indices_in_kvcache"] = torch.randint(0, 64, (b, s_q, 64), generator=gen,
                                                       dtype=torch.int32)
        kw["extra_topk_length"] = torch.full((b,), 40, dtype=torch.int32)
    return q, cache, kw


def test_current_metadata_api_and_call():
    sched, none = api.get_mla_metadata()
    assert isinstance(sched, api.SchedMeta) and none is None and not sched.have_initialized
    q, cache, kw = inputs(s_q=2, extra=True)
    sink = torch.randn(16)
    out, lse = api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, attn_sink=sink, **kw)
    assert sched.have_initialized and sched.config.topk == 64 and sched.config.extra_topk == 64
    assert sched.config.extra_page_block_size == 2 and sched.config.b == 2
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, kw["indices"], None, sink,
                                             kw["extra_k_cache"], kw["extra_indices_in_kvcache"],
                                             kw["extra_topk_length"], 512 ** -0.5)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-3, rtol=2 / 128)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=8 / 65536)
    # lse: [b, h_q, s_q] transposed view of a contiguous [b, s_q, h_q] buffer
    assert lse.shape == (2, 16, 2) and lse.stride() == (32, 1, 16)
    assert lse.transpose(1, 2).is_contiguous()
    # same object reused with the same configuration: fine; different topk: rejected
    api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, attn_sink=sink, **kw)
    kw2 = dict(kw, indices=kw["indices"][..., :32].contiguous())
    with pytest.raises(ValueError, match=r"flash_mla_with_kvcache.*tile_scheduler_metadata.*topk"):
        api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, **kw2)


def test_old_metadata_api():
    seqlens = torch.tensor([100, 7, 300], dtype=torch.int32)
    meta, splits = api.get_mla_metadata(seqlens, 1 * 64, 1, 64, True, 128)
    assert meta.dtype == torch.int32 and meta.dim() == 2 and meta.shape[1] == 8
    assert splits.dtype == torch.int32 and splits.shape == (4,)
    meta2, splits2 = api.get_mla_metadata(cache_seqlens=seqlens, num_heads_per_head_k=64,
                                          num_heads_k=1)
    assert meta2.shape == meta.shape and splits2.shape == (4,)
    # old-style call with the pair: num_splits is a tensor here and is accepted
    q, cache, kw = inputs(b=3)
    out, lse = api.flash_mla_with_kvcache(q, cache, None, seqlens, 512, meta, splits, **kw)
    ref_out, _ = ref_sparse_mla_decode(q, cache, kw["indices"])
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-3, rtol=2 / 128)


def test_sparse_decode_fwd_mirror():
    q, cache, kw = inputs(fmt="v32")
    out, lse, meta, splits = api.sparse_decode_fwd(q, cache, kw["indices"], None, None, None, None,
                                                   None, None, None, 512, 0.04)
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, kw["indices"], softmax_scale=0.04)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-3, rtol=2 / 128)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=8 / 65536)
    assert meta.dtype == torch.int32 and splits.shape == (3,)


def test_unknown_kwargs():
    q, cache, kw = inputs()
    sched, _ = api.get_mla_metadata()
    api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, descale_q=None, descale_k=None,
                               some_future_flag=None, **kw)
    with pytest.raises(NotImplementedError, match=r"flash_mla_with_kvcache.*descale_q"):
        api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, descale_q=torch.ones(2), **kw)
    with pytest.raises(NotImplementedError, match=r"flash_mla_with_kvcache.*descale_k"):
        api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, descale_k=torch.ones(2), **kw)


def test_out_buffer():
    """``out`` (vLLM's vendored interface; its DeepSeek-V4 layer passes a strided view of its
    output and drops the result) is filled in place; a wrong shape is rejected by name."""
    q, cache, kw = inputs(b=2, s_q=1, h_q=16)
    sched, _ = api.get_mla_metadata()
    want, want_lse = api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, **kw)
    buf = torch.zeros(2, 20, 512, dtype=torch.bfloat16)
    view = buf[:, 2:18].unsqueeze(1)  # [b, 1, 16, 512], row stride 20 * 512
    out, lse = api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, out=view, **kw)
    assert out.data_ptr() == view.data_ptr() and torch.equal(view, want)
    assert torch.equal(lse, want_lse) and bool((buf[:, :2] == 0).all() and (buf[:, 18:] == 0).all())
    with pytest.raises(ValueError, match=r"flash_mla_with_kvcache.*'out'"):
        api.flash_mla_with_kvcache(q, cache, None, None, 512, sched, out=buf[:, :8].unsqueeze(1), **kw)


def _call(q, cache, **over):
    _, _, kw = inputs()
    kw.update(over)
    return api.flash_mla_with_kvcache(q, cache, None, None, kw.pop("head_dim_v", 512),
                                      api.get_mla_metadata()[0], **kw)


@pytest.mark.parametrize("mutate, exc, pattern", [
    (lambda q, c, kw: (q.float(), c, kw), ValueError, r"flash_mla_with_kvcache.*'q'.*dtype"),
    (lambda q, c, kw: (q[..., :256], c, kw), ValueError, r"flash_mla_with_kvcache.*'q'.*shape"),
    (lambda q, c, kw: (q, c, dict(kw, head_dim_v=576)), ValueError,
     r"flash_mla_with_kvcache.*'head_dim_v'"),
    (lambda q, c, kw: (q, c.view(torch.uint8)[..., :576], kw), ValueError,
     r"flash_mla_with_kvcache.*'k_cache'.*584"),
    (lambda q, c, kw: (q, c.float(), kw), ValueError, r"flash_mla_with_kvcache.*'k_cache'.*dtype"),
    (lambda q, c, kw: (q, c, dict(kw, indices=kw["indices"].long())), ValueError,
     r"flash_mla_with_kvcache.*'indices'.*dtype"),
    (lambda q, c, kw: (q, c, dict(kw, indices=kw["indices"][:1])), ValueError,
     r"flash_mla_with_kvcache.*'indices'.*shape"),
    (lambda q, c, kw: (q, c, dict(kw, causal=True)), ValueError, r"flash_mla_with_kvcache.*'causal'"),
    (lambda q, c, kw: (q, c, dict(kw, is_fp8_kvcache=False)), ValueError,
     r"flash_mla_with_kvcache.*'is_fp8_kvcache'"),
    (lambda q, c, kw: (q, c, dict(kw, indices=None)), NotImplementedError,
     r"flash_mla_with_kvcache.*'indices'"),
    (lambda q, c, kw: (q, c, dict(kw, attn_sink=torch.zeros(16, dtype=torch.float64))), ValueError,
     r"flash_mla_with_kvcache.*'attn_sink'.*dtype"),
    (lambda q, c, kw: (q, c, dict(kw, attn_sink=torch.zeros(8))), ValueError,
     r"flash_mla_with_kvcache.*'attn_sink'.*shape"),
    (lambda q, c, kw: (q, c, dict(kw, topk_length=torch.zeros(2, dtype=torch.int64))), ValueError,
     r"flash_mla_with_kvcache.*'topk_length'.*dtype"),
    (lambda q, c, kw: (q, c, dict(kw, extra_k_cache=c)), ValueError,
     r"flash_mla_with_kvcache.*'extra_indices_in_kvcache'"),
    (lambda q, c, kw: (q, c, dict(kw, extra_topk_length=torch.zeros(2, dtype=torch.int32))),
     ValueError, r"flash_mla_with_kvcache.*'extra_topk_length'"),
])
def test_errors(mutate, exc, pattern):
    q, cache, kw = inputs()
    q, cache, kw = mutate(q, cache, kw)
    head_dim_v = kw.pop("head_dim_v", 512)
    with pytest.raises(exc, match=pattern):
        api.flash_mla_with_kvcache(q, cache, None, None, head_dim_v, api.get_mla_metadata()[0],
                                   **kw)


def test_bad_cache_stride():
    q, cache, kw = inputs()
    arena = torch.zeros(4, 64, 1, 600, dtype=torch.uint8)[..., :584]  # stride(1) = 600
    with pytest.raises(ValueError, match=r"flash_mla_with_kvcache.*'k_cache'.*stride\(1\)"):
        api.flash_mla_with_kvcache(q, arena, None, None, 512, None, **kw)
    with pytest.raises(ValueError, match=r"sparse_decode_fwd.*'k_cache'"):
        api.sparse_decode_fwd(q, arena, kw["indices"], None, None, None, None, None, None, None,
                              512, None)


def test_fp8_dtype_cache_and_default_scale():
    q, cache, kw = inputs(h_q=8)
    out, lse = api.flash_mla_with_kvcache(q, cache.view(torch.float8_e4m3fn), None, None, 512,
                                          None, **kw)
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, kw["indices"])
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=8 / 65536)


def test_api_follows_flashmla_positional_order():
    import inspect

    assert tuple(inspect.signature(api.flash_mla_with_kvcache).parameters)[:len(DECODE_ORDER)] == DECODE_ORDER


def test_is_sparse_fp8_call():
    q, cache, kw = inputs()
    idx = kw["indices"]
    sched = api.get_mla_metadata()[0]
    assert is_sparse_fp8_call(q, cache, None, None, 512, sched, indices=idx, is_fp8_kvcache=True)
    # positional, FlashMLA's order (as FlashMLA's own test calls it)
    assert is_sparse_fp8_call(q, cache, None, None, 512, sched, None, 0.1, False, True, idx)
    assert not is_sparse_fp8_call(q, cache, None, None, 512, sched, None, 0.1, False, False, idx)
    assert not is_sparse_fp8_call(q, cache, torch.zeros(2, 1), torch.ones(2), 512, sched)
    assert not is_sparse_fp8_call(q, cache, None, None, 512, sched, indices=idx)
    assert is_sparse_fp8_call(q, cache, None, None, 512, sched, indices=idx,
                              is_fp8_kvcache=True, descale_q=None)
    assert not is_sparse_fp8_call()  # unbindable: not ours


def test_misaligned_cache_rejected():
    q, cache, kw = inputs()
    arena = torch.zeros(4 * 37440 + 8, dtype=torch.uint8)
    bad = arena[8:].as_strided((4, 64, 1, 584), (37440, 584, 584, 1))
    with pytest.raises(ValueError, match=r"flash_mla_with_kvcache.*'k_cache'.*16"):
        api.flash_mla_with_kvcache(q, bad, None, None, 512, None, **kw)


def test_patch_binds_sgl_kernel_positional_order():
    """sgl_kernel.flash_mla puts descale_q/descale_k before is_fp8_kvcache: the patch binds
    positional calls by the original's own signature, so they still reach the kernel."""
    from sm12x.frontends.flash_mla.wrappers import make_flash_mla_with_kvcache

    def original(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                 num_splits=None, softmax_scale=None, causal=False, descale_q=None,
                 descale_k=None, is_fp8_kvcache=False, indices=None, attn_sink=None,
                 extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                 extra_topk_length=None):
        raise RuntimeError("Unsupported architecture for sparse decode fwd")

    patched = make_flash_mla_with_kvcache(original)
    q, cache, kw = inputs()
    idx = kw["indices"]
    pos = (q, cache, None, None, 512, None, None, None, False, None, None, True, idx)
    out, lse = patched(*pos)
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, idx)
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=8 / 65536)
    with pytest.raises(NotImplementedError, match="descale_q"):
        patched(*pos[:9], torch.ones(2), torch.ones(2), True, idx)


def test_misaligned_q_is_copied_not_rejected():
    q, cache, kw = inputs()
    wide = torch.zeros(q.shape[:-1] + (520,), dtype=q.dtype)
    wide[..., 3:515] = q
    qv = wide[..., 3:515]  # 6-byte offset rows
    assert qv.data_ptr() % 16 != 0
    out, lse = api.flash_mla_with_kvcache(qv, cache, None, None, 512, None, **kw)
    ref_out, ref_lse = ref_sparse_mla_decode(q, cache, kw["indices"])
    torch.testing.assert_close(lse, ref_lse, atol=1e-6, rtol=8 / 65536)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-3, rtol=2 / 128)


def test_patch_reads_calls_as_each_original_names_them():
    """vLLM's stub ``(*_args, **_kwargs)`` stands for its own interface (sm12x's order): eleven
    positional arguments still reach the kernel. sgl-flash-mla's prefill has use_legacy and
    return_log2_lse where sm12x has out: passed by position they keep their meaning. A current-API
    ``get_mla_metadata(*args, **kwargs)`` given tensors (vLLM's dense backend) returns its own
    object; one that raises (the stub) gives sm12x's placeholders."""
    from sm12x.kernels.sparse_mla.reference import make_prefill_case
    from sm12x.frontends.flash_mla.wrappers import make_flash_mla_sparse_fwd, make_flash_mla_with_kvcache, make_get_mla_metadata

    def stub(*_args, **_kwargs):
        raise RuntimeError("FlashMLA is not available")

    patched = make_flash_mla_with_kvcache(stub)
    q, cache, kw = inputs()
    idx = kw["indices"]
    out, lse = patched(q, cache, None, None, 512, None, None, None, False, True, idx)
    torch.testing.assert_close(lse, ref_sparse_mla_decode(q, cache, idx)[1], atol=1e-6, rtol=8 / 65536)

    def sgl_prefill(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None, use_legacy=False,
                    return_log2_lse=None):
        raise RuntimeError("Sparse Attention Forward Kernel is only supported on SM90a and SM100f")

    prefill = make_flash_mla_sparse_fwd(sgl_prefill)
    c = make_prefill_case(s_q=2, h_q=16, topk=64, s_kv=128)
    args = (c["q"], c["kv"], c["indices"], c["sm_scale"], 512, c["attn_sink"], None)
    by_name = prefill(*args, use_legacy=True, return_log2_lse=True)
    by_place = prefill(*args, True, True)
    for a, b in zip(by_name, by_place):
        assert torch.equal(a, b)

    class Sched:
        pass

    def current(*args, **kwargs):
        return Sched(), None

    lens = torch.tensor([5, 9], dtype=torch.int32)
    assert isinstance(make_get_mla_metadata(current)(lens, 1, 1, is_fp8_kvcache=False)[0], Sched)
    placeholders = make_get_mla_metadata(stub)(lens, 1, 1)
    assert isinstance(placeholders[0], torch.Tensor) and placeholders[1].shape == (3,)



def test_sglang_sm120_entry_ignores_what_its_original_ignores():
    """SGLang's keyword-only SM120 entry ignores a block table, sequence lengths and scheduler
    metadata; passing them must not turn into 'multiple values' errors."""
    from sm12x.frontends.flash_mla.wrappers import make_flash_mla_with_kvcache_sm120

    def original(**kwargs):
        raise RuntimeError("no SM120 backend here")

    entry = make_flash_mla_with_kvcache_sm120(original)
    q, cache, kw = inputs()
    out, lse = entry(q=q, k_cache=cache, head_dim_v=512, indices=kw["indices"], block_table=None,
                     cache_seqlens=None, tile_scheduler_metadata=None, num_splits=None)
    torch.testing.assert_close(lse, ref_sparse_mla_decode(q, cache, kw["indices"])[1], atol=1e-6, rtol=8 / 65536)


@pytest.mark.parametrize("arch", ["12.0", "9.0"])
def test_metadata_is_the_originals_where_it_runs(monkeypatch, arch):
    """Forced onto a GPU with FlashMLA's kernels (SM12X_FORCE=1 on SM90), the tensor schedulers
    are the originals' own (dense calls still reach the original decode, which needs them); on
    SM12x they are sm12x's placeholders."""
    from sm12x.frontends.flash_mla.wrappers import make_get_mla_decoding_metadata, make_get_mla_metadata

    monkeypatch.setenv("SM12X_ARCH", arch)

    def tensor_api(cache_seqlens, num_q_tokens_per_head_k, h_k, h_q=None, is_fp8_kvcache=False, topk=None):
        return "original schedule", None

    lens = torch.tensor([5, 9], dtype=torch.int32)
    native = arch == "9.0"
    for make in (make_get_mla_metadata, make_get_mla_decoding_metadata):
        got = make(tensor_api)(lens, 1, 1, 16)
        assert (got[0] == "original schedule") == native, (make.__name__, arch)


def test_one_validation_per_call(monkeypatch):
    """A patched call is checked once: the wrapper decides sparse FP8 (no second routing check in
    the API) and the kernel launcher validates the tensors (the API does not validate first)."""
    from sm12x.frontends.flash_mla import convention, wrappers
    from sm12x.kernels.sparse_mla import decode

    seen = {"validate": 0, "wants": 0}
    validate, wants = decode.validate, convention.wants_sparse_fp8

    def counting_validate(*args, **kwargs):
        seen["validate"] += 1
        return validate(*args, **kwargs)

    def counting_wants(*args, **kwargs):
        seen["wants"] += 1
        return wants(*args, **kwargs)

    monkeypatch.setattr(decode, "validate", counting_validate)
    monkeypatch.setattr(convention, "wants_sparse_fp8", counting_wants)
    monkeypatch.setattr(api, "wants_sparse_fp8", counting_wants)

    def original(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits=None,
                 softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None):
        raise AssertionError("the sparse FP8 call went to the original")

    q, cache, kw = inputs()
    out, _ = wrappers.make_flash_mla_with_kvcache(original)(q, cache, None, None, 512, None, **kw)
    assert seen == {"validate": 1, "wants": 1} and out.shape == (2, 1, 16, 512)

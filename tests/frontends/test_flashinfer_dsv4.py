"""vLLM's FlashInfer SM120 DeepSeek-V4 call: which shapes each FlashInfer release serves, how a call
is read, and the calls routed to sm12x against the PyTorch reference, laid out as vLLM passes them
(query [T, H, 512], packed 584-byte caches [pages, page, 1, 584], indices [T, 1, topk])."""
import types

import pytest
import torch

from sm12x.frontends.vllm import flashinfer_dsv4 as fi
from sm12x.frontends.vllm import wrappers
from sm12x.kernels.sparse_mla import kv_cache as kvc
from sm12x.kernels.sparse_mla.reference import ref_sparse_mla_decode

pytestmark = pytest.mark.cpu_only

S = fi.CallShape
RULES = {"0.6.13": fi.rule_for("0.6.13"), "0.6.14": fi.rule_for("0.6.14"),
         "0.6.17": fi.rule_for("0.6.17"), "0.6.18": fi.rule_for("0.6.18"),
         "0.7.2": fi.rule_for("0.7.2.post1")}

# (FlashInfer release, shape, who computes it); DeepSeek-V4-Flash: 64 heads, SWA width 128 (256
# with DSpark), C4 extra top-512 on 64-entry pages, C128 extra on 2-entry pages
CASES = [
    ("0.6.14", S(4, 64, 128, 64, 512, 64), "flashinfer"),     # plain decode, C4 layer, TP1
    ("0.6.14", S(8, 16, 128, 64, 0, 0), "flashinfer"),        # MTP verify (4 requests x 2), SWA layer
    ("0.6.14", S(8, 16, 256, 64, 512, 64), "sm12x"),          # DSpark SWA width 256 (vllm#50720)
    ("0.6.14", S(64, 16, 256, 64), "sm12x"),
    ("0.6.14", S(65, 16, 256, 64), "sm12x"),                  # prefill: one cache, topk 256 missing
    ("0.6.14", S(200, 16, 128, 64, 512, 64), "flashinfer"),   # prefill chunk, C4 layer
    ("0.6.14", S(200, 16, 128, 64, 40, 2), "flashinfer"),     # prefill chunk, C128 layer
    ("0.6.14", S(200, 16, 128, 64, 512, 256), "sm12x"),       # compressed page not 64 or 2
    ("0.6.14", S(200, 8, 128, 64, 512, 64), "sm12x"),         # TP16 heads in a prefill chunk
    ("0.6.14", S(2, 8, 128, 64, 512, 64), "flashinfer"),      # ... but decode has 8 heads
    ("0.6.14", S(4, 64, 128, 256), "sm12x"),                  # SWA page 256 at decode size
    ("0.6.14", S(4, 48, 128, 64), "sm12x"),                   # heads outside the table
    ("0.6.17", S(8, 16, 256, 64), "sm12x"),
    ("0.6.18", S(8, 16, 256, 64, 512, 64), "flashinfer"),     # flashinfer#4380: topk 192 / 256
    ("0.6.18", S(200, 8, 128, 64, 512, 64), "flashinfer"),    # ... and 8-head prefill
    ("0.6.18", S(200, 16, 256, 64, 512, 64), "sm12x"),        # dual-cache prefill needs 128
    ("0.6.18", S(200, 16, 256, 64), "flashinfer"),
    ("0.7.2", S(8, 16, 256, 64, 512, 64), "flashinfer"),
    ("0.7.2", S(8, 24, 1152, 128, 512, 2), "flashinfer"),     # 0.7's decode predicate
    ("0.7.2", S(200, 16, 256, 64, 512, 64), "flashinfer"),
    ("0.7.2", S(200, 16, 200, 64), "sm12x"),                  # prefill topk not a multiple of 64
    ("0.7.2", S(200, 16, 128, 64, 40, 2), "flashinfer"),      # any compressed width (C128)
    ("0.7.2", S(200, 24, 128, 64), "sm12x"),                  # prefill heads not instantiated
    ("0.6.13", S(1, 64, 128, 64, 512, 64), "sm12x"),          # no SM120 path (vllm#48054)
    ("0.6.13", S(300, 64, 128, 64), "sm12x"),
    ("0.6.14", S(4, 256, 128, 64), "flashinfer"),             # neither serves: FlashInfer's error
]


@pytest.mark.parametrize("release,shape,route", CASES)
def test_route_per_shape(release, shape, route):
    assert fi.routes_to_sm12x(shape, RULES[release]) == (route == "sm12x")


def test_rule_reads_the_installed_table():
    """The installed module's table, token limit and page win over the release's own."""
    module = types.SimpleNamespace(_DECODE_DSV4_DISPATCH=frozenset({(16, 256)}), _DECODE_MAX_TOKENS=8,
                                   _DECODE_DSV4_PAGE_BLOCK_SIZE=64)
    rule = fi.rule_for("0.6.16.post4", module)
    assert fi.routes_to_sm12x(S(4, 64, 128, 64), rule)          # not in this table
    assert not fi.routes_to_sm12x(S(8, 16, 256, 64), rule)
    assert fi.routes_to_sm12x(S(9, 16, 256, 64), rule)          # past its token limit
    assert fi.rule_for("0.6.14", None) == fi.RULE_0614
    assert fi.rule_for(None) is fi.NO_SM120


def test_rule_era_from_the_installed_table():
    """A table holding (16, 256) comes with 8-head prefill (flashinfer#4380); a predicate table is
    0.7's envelope; the release number only decides when the module does not import."""
    old = types.SimpleNamespace(_DECODE_DSV4_DISPATCH=fi._TABLE_0614)
    new = types.SimpleNamespace(_DECODE_DSV4_DISPATCH=fi._TABLE_0618)
    prefill_8_heads = S(200, 8, 128, 64, 512, 64)
    assert fi.routes_to_sm12x(prefill_8_heads, fi.rule_for("0.6.18rc1", old))
    assert not fi.routes_to_sm12x(prefill_8_heads, fi.rule_for(None, new))
    envelope = types.SimpleNamespace(_DECODE_DSV4_DISPATCH=fi._HeadsUpTo(), _DECODE_MAX_TOKENS=64)
    rule = fi.rule_for(None, envelope)
    assert not fi.routes_to_sm12x(S(8, 24, 1152, 128), rule)
    assert fi.routes_to_sm12x(S(200, 24, 128, 64), rule)


def call_inputs(tokens=3, heads=16, topk=24, extra_topk=16, extra_page=2, layout="NHD", seed=0):
    """A call as vLLM's DeepseekV4FlashInferSM120Attention makes it (keywords, packed caches)."""
    gen = torch.Generator().manual_seed(seed)
    swa = kvc.quantize_model1_cache((torch.randn(3, 64, 512, generator=gen) / 10).to(torch.bfloat16))
    extra = kvc.quantize_model1_cache(
        (torch.randn(40, extra_page, 512, generator=gen) / 10).to(torch.bfloat16))
    if layout == "HND":
        swa, extra = swa.transpose(1, 2), extra.transpose(1, 2)
    q = torch.randn(tokens, heads, 512, generator=gen).clamp(-1, 1).to(torch.bfloat16)
    idx = torch.randint(0, 3 * 64, (tokens, 1, topk), generator=gen, dtype=torch.int32)
    idx[0, 0, :3] = -1
    xidx = torch.randint(0, 40 * extra_page, (tokens, 1, extra_topk), generator=gen, dtype=torch.int32)
    sinks = torch.randn(heads, generator=gen)
    sinks[-1] = float("-inf")  # vLLM's padded heads
    return dict(query=q, swa_kv_cache=swa, workspace_buffer=torch.zeros(16, dtype=torch.uint8),
                sparse_indices=idx, compressed_kv_cache=extra,
                out=torch.full((tokens, heads, 512), 7.0, dtype=torch.bfloat16),
                bmm1_scale=512 ** -0.5, sinks=sinks, kv_layout=layout,
                swa_topk_lens=torch.tensor([topk, 5, 17][:tokens], dtype=torch.int32),
                extra_sparse_indices=xidx,
                extra_sparse_topk_lens=torch.tensor([extra_topk, 0, 9][:tokens], dtype=torch.int32))


def reference(kw):
    nhd = (lambda c: c.transpose(1, 2)) if kw["kv_layout"] == "HND" else (lambda c: c)
    out, _ = ref_sparse_mla_decode(kw["query"].unsqueeze(1), nhd(kw["swa_kv_cache"]), kw["sparse_indices"],
                                   kw["swa_topk_lens"], kw["sinks"], nhd(kw["compressed_kv_cache"]),
                                   kw["extra_sparse_indices"], kw["extra_sparse_topk_lens"],
                                   kw["bmm1_scale"])
    return out[:, 0]


def original_that_must_not_run(*args, **kwargs):
    raise AssertionError("FlashInfer was called for a shape it does not serve")


@pytest.fixture
def flashinfer_0614(monkeypatch):
    monkeypatch.setattr(fi, "installed_rule", lambda: fi.RULE_0614)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_routed_call_matches_reference(flashinfer_0614, layout):
    """topk 24 is in no FlashInfer table: sm12x computes it, in place in vLLM's ``out``."""
    decode = wrappers.make_flashinfer_dsv4_decode(original_that_must_not_run)
    kw = call_inputs(layout=layout)
    out = kw["out"]
    result = decode(**kw)
    assert result is out
    ref = reference(kw)
    torch.testing.assert_close(out.float(), ref.float(), atol=1e-3, rtol=2 / 128)
    assert (out[1] != 7).all()


def test_routed_call_four_d_query_and_positional(flashinfer_0614):
    """FlashInfer's dense form ([b, s_q, H, 512], lengths [b, s_q]) and positional arguments."""
    decode = wrappers.make_flashinfer_dsv4_decode(original_that_must_not_run)
    kw = call_inputs(tokens=2, heads=8)
    ref = reference(kw)
    kw4 = dict(kw, query=kw["query"].view(1, 2, 8, 512), sparse_indices=kw["sparse_indices"].view(1, 2, -1),
               swa_topk_lens=kw["swa_topk_lens"].view(1, 2), out=None,
               extra_sparse_indices=kw["extra_sparse_indices"].view(2, -1))
    args = [kw4.pop(name) for name in fi.PARAMETERS[:3]]
    result = decode(*args, **kw4)
    assert result.shape == (1, 2, 8, 512)
    torch.testing.assert_close(result[0].float(), ref.float(), atol=1e-3, rtol=2 / 128)


def test_served_shapes_and_other_calls_stay_with_flashinfer(flashinfer_0614):
    calls = []

    def original(*args, **kwargs):
        calls.append(kwargs)
        return "flashinfer"

    decode = wrappers.make_flashinfer_dsv4_decode(original)
    kw = call_inputs(topk=128)
    kw.update(sparse_indices=kw["sparse_indices"].expand(3, 1, 128).contiguous(),
              extra_sparse_indices=torch.zeros(3, 1, 512, dtype=torch.int32))
    kw["compressed_kv_cache"] = kvc.quantize_model1_cache(torch.zeros(2, 64, 512))
    assert decode(**kw) == "flashinfer"                                    # in 0.6.14's table
    small = call_inputs()
    assert decode(**dict(small, seq_lens=torch.ones(3, dtype=torch.int32))) == "flashinfer"  # SM100 form
    assert decode(**dict(small, backend="cute-dsl")) == "flashinfer"
    bf16_cache = torch.zeros(3, 64, 1, 512, dtype=torch.bfloat16)
    assert decode(**dict(small, swa_kv_cache=bf16_cache)) == "flashinfer"
    assert decode(**dict(small, bmm2_scale=0.5)) == "flashinfer"
    assert len(calls) == 5


def test_call_shape_reads_vllm_calls():
    kw = call_inputs(tokens=3, heads=16, topk=24, extra_topk=16, extra_page=2)
    assert fi.call_shape(kw) == S(3, 16, 24, 64, 16, 2)
    hnd = call_inputs(layout="HND")
    assert fi.call_shape(hnd) == S(3, 16, 24, 64, 16, 2)
    three_d = dict(kw, swa_kv_cache=kw["swa_kv_cache"][:, :, 0], extra_sparse_indices=None,
                   compressed_kv_cache=None, extra_sparse_topk_lens=None)
    assert fi.call_shape(three_d) == S(3, 16, 24, 64)
    assert fi.call_shape(dict(kw, query=kw["query"].float())) is None
    assert fi.bind((1,) * 19, {}) is None and fi.bind((1,), {"query": 1}) is None


def test_bad_input_names_op_and_argument(monkeypatch):
    monkeypatch.setattr(fi, "installed_rule", lambda: fi.NO_SM120)
    decode = wrappers.make_flashinfer_dsv4_decode(original_that_must_not_run)
    kw = call_inputs()
    with pytest.raises(ValueError, match=r"trtllm_batch_decode_sparse_mla_dsv4.*'out'"):
        decode(**dict(kw, out=torch.zeros(3, 8, 512, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match=r"trtllm_batch_decode_sparse_mla_dsv4.*'attn_sink'"):
        decode(**dict(kw, sinks=torch.zeros(4)))


def test_constructor_check_passes_where_sm12x_serves(monkeypatch):
    """vLLM 0.33+'s has_flashinfer_sparse_mla_sm120_config: yes for DSpark's (16, 256) with
    FlashInfer 0.6.x once the decode wrapper is sm12x's; no while it is not."""
    module = types.ModuleType("standin_vllm_flashinfer")
    module.has_flashinfer_sparse_mla_sm120 = lambda: True
    module.flashinfer_trtllm_batch_decode_sparse_mla_dsv4 = original_that_must_not_run

    def has_flashinfer_sparse_mla_sm120_config(num_q_heads, top_k):
        return (num_q_heads, top_k) in fi._TABLE_0614

    has_flashinfer_sparse_mla_sm120_config.__module__ = module.__name__
    monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    check = wrappers.make_has_sparse_mla_sm120_config(has_flashinfer_sparse_mla_sm120_config)
    assert check(16, 128) and not check(16, 256)
    decode = wrappers.make_flashinfer_dsv4_decode(original_that_must_not_run)
    decode.__sm12x_patch__ = "vllm.flashinfer_dsv4.decode"
    module.flashinfer_trtllm_batch_decode_sparse_mla_dsv4 = decode
    assert check(16, 256) and check(8, 1152) and not check(256, 128)
    module.has_flashinfer_sparse_mla_sm120 = lambda: False
    assert not check(16, 256)

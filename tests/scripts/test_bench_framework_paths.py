"""scripts/bench_framework_paths.py: the framework functions it calls are fed the way their
frameworks call them, the results are checked against the reference, and a wrong result is
reported (stand-in modules shaped like SGLang's and DeepGEMM's, our kernels under the
interpreter at small shapes)."""
import importlib.util
import os
import sys
import types

import pytest
import torch

from sm12x.kernels.indexer.reference import ref_paged_mqa_logits
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode

pytestmark = pytest.mark.cpu_only

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "scripts"))
    spec = importlib.util.spec_from_file_location(
        "bench_framework_paths", os.path.join(REPO, "scripts", "bench_framework_paths.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _install(monkeypatch, name, **attrs):
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _path(bench, label_start):
    return next(p for p in bench.PATHS if p[0].startswith(label_start))


def test_resolve_reads_under_our_patch_and_names_what_is_missing(bench, monkeypatch):
    def original():
        pass

    def ours():
        pass
    ours.__sm12x_original__ = original
    _install(monkeypatch, "fw_stand_in", fn=ours)
    assert bench.resolve("fw_stand_in:fn") == (original, "")
    fn, why = bench.resolve("no_such_framework.module:fn")
    assert fn is None and why.startswith("not importable (ModuleNotFoundError")


@pytest.mark.parametrize("drop_sink", [False, True])
def test_sglang_sm120_decode_calls(bench, monkeypatch, drop_sink):
    """SGLang's entry takes keywords, its backends take positions; ours answers the entry's call."""
    def backend(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache,
                extra_indices, extra_topk_length):
        out, lse = ref_sparse_mla_decode(q, k_cache, indices, topk_length, None if drop_sink else attn_sink,
                                         extra_k_cache, extra_indices, extra_topk_length, softmax_scale)
        return out, lse.permute(0, 2, 1)

    def entry(**kw):
        return backend(kw["q"], kw["k_cache"], kw["indices"], kw["topk_length"], kw["attn_sink"],
                       kw["head_dim_v"], kw["softmax_scale"], kw["extra_k_cache"],
                       kw["extra_indices_in_kvcache"], kw["extra_topk_length"])

    _install(monkeypatch, bench._SGL_SM120, flash_mla_with_kvcache_sm120=entry, _sm120_sparse_decode_fwd=backend)
    case = make_case(b=2, s_q=1, h_q=16, topk=64, page=64, extra_topk=64, extra_page=2, extra_topk_length=True)
    case["attn_sink"] = torch.full((16,), 0.5)  # finite: dropping it changes every output row
    ref = ref_sparse_mla_decode(**case)
    for label in ("SGLang SM120 decode entry", "SGLang SM120 decode, torch backend"):
        _, target, kind, patch = _path(bench, label)
        original, _ = bench.resolve(target)
        theirs, mine = bench.decode_calls(kind, original, bench.replacement(patch, original), case)
        verdict = bench.decode_check(theirs(), ref, False)
        assert (verdict != "ok") == drop_sink, verdict
        assert bench.decode_check(mine(), ref, True) == "ok"


@pytest.mark.parametrize("shift", [0, 1])
def test_paged_logits_calls(bench, monkeypatch, shift):
    """SGLang's torch fallback gets 1-D lengths (it asserts them); DeepGEMM's gets its own
    scheduler metadata; a result one column off is reported."""
    metas = []

    def sglang_torch(q, kv, w, seq_lens, page_table, meta, max_seq_len, clean_logits=True):
        assert seq_lens.dim() == 1 and clean_logits is False
        out = ref_paged_mqa_logits(q, kv, w, seq_lens.view(-1, 1), page_table, max_seq_len, clean_logits=False)
        return out.roll(shift, 1)

    def metadata(context_lens, block_kv, num_sms):
        metas.append((block_kv, num_sms))
        return "their metadata"

    def deep_gemm_paged(q, kv, w, context_lens, block_table, schedule_meta, max_context_len, clean_logits=False):
        assert schedule_meta == "their metadata"
        return sglang_torch(q, kv, w, context_lens.view(-1), block_table, None, max_context_len, False)

    _install(monkeypatch, "sglang.srt.layers.attention.dsv4.indexer", fp8_paged_mqa_logits_torch=sglang_torch)
    _install(monkeypatch, "deep_gemm", fp8_paged_mqa_logits=deep_gemm_paged, get_paged_mqa_logits_metadata=metadata)
    c = bench.make_logits_case(2, 150, device="cpu")
    ref = ref_paged_mqa_logits(c["q"], c["cache"], c["weights"], c["context_lens"], c["block_table"],
                               c["max_context_len"])
    for label in ("SGLang paged logits, torch", "DeepGEMM fp8_paged_mqa_logits"):
        _, target, kind, patch = _path(bench, label)
        original, _ = bench.resolve(target)
        makers = bench.metadata_makers(target) if kind.startswith("logits_deepgemm") else (None, None)
        theirs, mine = bench.logits_calls(kind, original, bench.replacement(patch, original), c, *makers)
        verdict = bench.logits_check(theirs(), ref)
        assert (verdict != "ok") == bool(shift), verdict
        assert bench.logits_check(mine(), ref) == "ok"
    assert metas and metas[0][0] == 64

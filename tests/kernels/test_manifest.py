"""The op manifest is the single list of ops and of the upstream names they back: the registry,
the front ends' name lists, the DeepGEMM factories, the stand-in ``deep_gemm`` and the records'
replacements all follow it, so a name added in one place only fails here."""
import importlib
import inspect

import pytest

from sm12x.kernels import manifest, registry

FRONT_ENDS = ("sm12x.frontends.deep_gemm.indexer", "sm12x.frontends.deep_gemm.gemm",
              "sm12x.frontends.deep_gemm.moe", "sm12x.frontends.flash_mla.api")
# public functions of those front ends that no upstream caller reaches by name: sm12x's own
# plumbing between a factory and its front end
PLUMBING = {"mk_alignment", "to_log2_units", "sparse_fp8_decode"}


def _resolve(path):
    module, _, name = path.partition(":")
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return getattr(mod, name)
    factories = getattr(mod, "FACTORIES", {})
    assert name.startswith("make_") and name[len("make_"):] in factories, path
    return factories[name[len("make_"):]]


def test_registry_is_the_manifest():
    assert [op.name for op in registry.all_ops()] == [spec.name for spec in manifest.OPS]
    assert len({spec.name for spec in manifest.OPS}) == len(manifest.OPS)
    names = [api.name for api in manifest.apis()]
    assert len(names) == len(set(names)), "an upstream name backed twice"


def test_every_entry_resolves_to_a_plain_function():
    """Kernel, reference, self-test and every upstream-compatible function are ``def``
    definitions (or a plain alias of one the same module defines); every factory resolves."""
    for spec in manifest.OPS:
        for path in (spec.kernel, spec.reference, spec.selftest):
            fn = _resolve(path)
            assert inspect.isfunction(fn), path
        if spec.compile:
            assert callable(importlib.import_module(spec.compile).compile_reports), spec.name
        for api in spec.backs:
            fn = _resolve(api.function)
            assert inspect.isfunction(fn), api.name
            # defined under its own name, or an alias of a function defined under a name it backs
            assert fn.__name__ == api.function.partition(":")[2] or fn.__code__.co_name in \
                {a.function.partition(":")[2] for a in manifest.apis()} | {fn.__name__}, api.name
            for wrapper in api.wrappers:
                assert callable(_resolve(wrapper)), wrapper


def test_front_ends_implement_what_the_manifest_says_and_nothing_more():
    """A public function added to a front end without a manifest entry, or a manifest entry
    without its function, fails."""
    listed = {api.function for api in manifest.apis()}
    for module in FRONT_ENDS:
        mod = importlib.import_module(module)
        for name, value in vars(mod).items():
            if name.startswith("_") or not inspect.isfunction(value) or value.__module__ != module:
                continue
            assert f"{module}:{name}" in listed or name in PLUMBING, f"{module}.{name} is not in the manifest"
    for module in ("sm12x.frontends.deep_gemm.indexer", "sm12x.frontends.deep_gemm.gemm",
                   "sm12x.frontends.deep_gemm.moe"):
        mod = importlib.import_module(module)
        assert mod.NAMES == manifest.names_in(module) and mod.HELPER_NAMES == manifest.names_in(module, True)


def test_factories_and_the_stand_in_follow_the_manifest():
    from sm12x.frontends.deep_gemm import gemm_wrappers, sparse_wrappers, wrappers

    factories = []
    for module in (gemm_wrappers, wrappers, sparse_wrappers):
        assert set(module.FACTORIES) == set(manifest.wrapped_in(module.__name__)), module.__name__
        factories += [(module.__name__, name, make) for name, make in module.FACTORIES.items()]
    assert sparse_wrappers.SPARSE_NAMES == ("fp8_fp4_paged_sparse_mqa_logits", "get_paged_sparse_mqa_logits_metadata")
    for module, name, make in factories:
        assert manifest.factory_path(make) == f"{module}:make_{name}"
    deep_gemm = manifest.library_functions("deep_gemm")
    assert "fp8_gemm_nt" in deep_gemm and "m_grouped_fp8_fp4_gemm_nt_masked" in deep_gemm
    assert all(name == fn.partition(":")[2] or name.startswith("fp8_fp4_gemm") for name, fn in deep_gemm.items())


DEEP_GEMM_MODULES = ("deep_gemm", "vllm.third_party.deep_gemm")


def test_records_install_the_manifest_factories():
    """A record on a DeepGEMM or FlashMLA function installs a factory the manifest lists for that
    name (a DeepGEMM record for a name the manifest lacks fails), and every op is reached by some
    record."""
    from sm12x import apply
    from sm12x.patches import all_patches

    by_name = {}
    for api in manifest.apis():
        by_name.setdefault((api.library, api.attribute), set()).update(api.wrappers)
    for p in all_patches():
        attribute = p.qualname.rpartition(".")[2]
        if p.module in DEEP_GEMM_MODULES:
            assert ("deep_gemm", attribute) in by_name, f"{p.name}: deep_gemm.{attribute} is not in the manifest"
            assert manifest.factory_path(p.make) in by_name["deep_gemm", attribute], p.name
        if p.module.startswith(("flash_mla", "sgl_kernel.flash_mla")) and ("flash_mla", attribute) in by_name:
            assert manifest.factory_path(p.make) in by_name["flash_mla", attribute], p.name
    routes = apply.op_routes(rows=[])
    assert set(routes) == {spec.name for spec in manifest.OPS}
    assert all(routes[op] for op in routes), [op for op in routes if not routes[op]]
    assert {r["record"] for r in routes["fp8_gemm_nt"]} >= {"deep_gemm.fp8_gemm_nt",
                                                            "vllm.third_party.deep_gemm.fp8_gemm_nt"}
    assert "sglang.dsv4.paged_indexer.tilelang" in {r["record"] for r in routes["indexer_topk"]}


def test_a_name_in_one_place_only_fails(monkeypatch):
    """The checks above catch a planted front-end function the manifest does not list."""
    mod = importlib.import_module("sm12x.frontends.deep_gemm.gemm")

    def fp8_gemm_xx(*args):
        return None

    fp8_gemm_xx.__module__ = mod.__name__
    monkeypatch.setattr(mod, "fp8_gemm_xx", fp8_gemm_xx, raising=False)
    with pytest.raises(AssertionError, match="fp8_gemm_xx"):
        test_front_ends_implement_what_the_manifest_says_and_nothing_more()


# records whose factory the manifest does not list: gates and expert-method choices, which run no op
GATES = {"sglang.gb10.deep_gemm_gate", "sglang.moe.Fp8Config.get_quant_method",
         "sglang.moe.HybridFp8NvFp4Config.get_quant_method", "sglang.moe.runner_choice",
         "vllm.fused_moe.DeepGemmFP4Experts._supports_current_device", "vllm.platforms.cuda.support_deep_gemm",
         # answers yes only while the FP4 logits vLLM resolves are sm12x's (so a guard refusal of
         # those logits turns the gate off with them)
         "vllm.indexer.mxfp4_cache_gate"}


def test_every_record_that_runs_an_op_takes_its_factory_from_the_manifest():
    """A record (or layer) installs a factory the manifest lists, unless it is one of the gates;
    the runtime guard checks exactly the op the manifest names for that factory (the indexer
    top-k set: the fused top-k). A record written with a factory of its own fails here."""
    from sm12x import guard
    from sm12x.patches import all_patches, indexer_topk

    by_factory = manifest.op_of_wrapper()
    topk = {p.name for p in indexer_topk.PATCHES}
    unlisted = set()
    for p in all_patches():
        for r in (p,) + tuple(p.layers):
            hit = by_factory.get(manifest.factory_path(r.make))
            if hit is None:
                unlisted.add(r.name)
        hit = by_factory.get(manifest.factory_path(p.make))
        expected = guard.TOPK if p.name in topk else ((hit[0],) if hit else ())
        assert guard.ops_for(p) == expected, p.name
    assert unlisted == GATES


def test_factory_names_what_the_manifest_lists():
    assert manifest.factory("flash_mla.get_mla_metadata") == "sm12x.frontends.flash_mla.wrappers:make_get_mla_metadata"
    assert manifest.factory("flash_mla.flash_mla_with_kvcache", "make_flash_mla_with_kvcache_sm120").endswith(
        "wrappers:make_flash_mla_with_kvcache_sm120")
    with pytest.raises(ValueError, match="no upstream function 'flash_mla.nope'"):
        manifest.factory("flash_mla.nope")
    with pytest.raises(ValueError, match="name one of them"):
        manifest.factory("flash_mla.flash_mla_with_kvcache")
    with pytest.raises(ValueError, match="lists no factory 'make_nope'"):
        manifest.factory("flash_mla.flash_mla_with_kvcache", "make_nope")

"""The op manifest: every op sm12x provides, declared once, with the upstream-compatible functions
it backs.

Each :class:`OpSpec` names, as ``"module:function"`` strings (nothing is imported here, so the
import watcher, the shims and the patch tables can read this at start-up without torch):

- ``kernel``: the launcher that computes the op (``sm12x.kernels.<family>.<op>``);
- ``reference``: the plain PyTorch function it is checked against (the source of truth);
- ``selftest``: ``selftest(device, full) -> iterable of result rows`` (its cases);
- ``compile``: the module whose ``compile_reports(targets, **compile_fixed)`` lists every launch
  configuration for sm_120 / sm_121 ("" when the op launches another op's kernel);
- ``benchmark``: the script in ``scripts/`` that races the op against what it replaces;
- ``backs``: the upstream-compatible functions (:class:`Api`) whose calls the op computes, e.g.
  ``deep_gemm.fp8_gemm_nt -> sm12x.frontends.deep_gemm.gemm:fp8_gemm_nt``, each with the
  factories (``wrappers``) that patch records install for it.

Everything else is derived from this table: the registry (:func:`sm12x.kernels.registry.all_ops`),
the front ends' name lists (``NAMES`` / ``HELPER_NAMES``), the DeepGEMM wrapper factories, the
stand-in ``deep_gemm`` module (:mod:`sm12x.shims`), the factory every record that runs an op
installs (:func:`factory`), the ops the runtime guard checks per record (:mod:`sm12x.guard`) and
the per-op routes ``sm12x status`` prints (:func:`sm12x.apply.op_routes`). Stdlib only.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Api:
    """One upstream-compatible function.

    name: ``"<library>.<function>"`` as upstream callers reach it (``deep_gemm.fp8_gemm_nt``,
        ``flash_mla.flash_mla_with_kvcache``, ``vllm.fused_mqa_topk.fused_mqa_topk_prefill``).
    function: sm12x's function with upstream's contract, ``"module:function"``.
    wrappers: the factories (``factory(original) -> replacement``, ``"module:function"``) that
        patch records install for it; a factory that its module makes per name (the DeepGEMM
        forwarders, ``FACTORIES``) is ``"module:make_<name>"``, its ``__name__``.
    helper: a layout or bookkeeping call the op's callers make around it (scale layouts, SM
        counts, scheduler metadata), served by the same front end, not computed by the op.
    """

    name: str
    function: str
    wrappers: tuple = ()
    helper: bool = False

    @property
    def library(self) -> str:
        return self.name.partition(".")[0]

    @property
    def attribute(self) -> str:
        return self.name.rpartition(".")[2]

    @property
    def module(self) -> str:
        return self.function.partition(":")[0]


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op (see the module docstring for the fields)."""

    name: str
    family: str
    kernel: str
    reference: str
    selftest: str
    benchmark: str
    compile: str = ""
    compile_fixed: tuple = ()  # (keyword, value) pairs passed to compile_reports
    backs: tuple = ()


def _deep_gemm(names, module, wrappers_module="", helper=False, wrapper=None):
    """Api entries for DeepGEMM functions that ``module`` implements under the same names."""
    out = []
    for name in names:
        if wrapper is not None:
            wrappers = wrapper(name)
        elif wrappers_module:
            wrappers = (f"{wrappers_module}:make_{name}",)
        else:
            wrappers = ()
        out.append(Api(f"deep_gemm.{name}", f"{module}:{name}", wrappers, helper))
    return tuple(out)


_FLASH_MLA = "sm12x.frontends.flash_mla.api"
_FLASH_MLA_WRAPPERS = "sm12x.frontends.flash_mla.wrappers"
_DG_INDEXER = "sm12x.frontends.deep_gemm.indexer"
_DG_GEMM = "sm12x.frontends.deep_gemm.gemm"
_DG_MOE = "sm12x.frontends.deep_gemm.moe"
_DG_SPARSE = "sm12x.frontends.deep_gemm.sparse_indexer"
_VLLM = "sm12x.frontends.vllm"
_SGLANG = "sm12x.frontends.sglang"
_GEMM_FORMS = ("fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
               "fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt")


def _moe_wrappers(name):
    return (f"sm12x.frontends.deep_gemm.moe_wrappers:make_{name}",)


OPS = (
    OpSpec(
        name="sparse_mla_decode", family="sparse_mla",
        kernel="sm12x.kernels.sparse_mla.decode:sparse_mla_decode",
        reference="sm12x.kernels.sparse_mla.reference:ref_sparse_mla_decode",
        selftest="sm12x.kernels.sparse_mla.cases:check_sparse_mla_decode",
        compile="sm12x.kernels.sparse_mla.decode", benchmark="scripts/bench_sparse_mla_decode.py",
        backs=(
            Api("flash_mla.flash_mla_with_kvcache", f"{_FLASH_MLA}:flash_mla_with_kvcache",
                (f"{_FLASH_MLA_WRAPPERS}:make_flash_mla_with_kvcache",
                 f"{_FLASH_MLA_WRAPPERS}:make_flash_mla_with_kvcache_sm120")),
            Api("flash_mla.cuda.sparse_decode_fwd", f"{_FLASH_MLA}:sparse_decode_fwd",
                (f"{_FLASH_MLA_WRAPPERS}:make_sparse_decode_fwd",)),
            Api("flash_mla.get_mla_metadata", f"{_FLASH_MLA}:get_mla_metadata",
                (f"{_FLASH_MLA_WRAPPERS}:make_get_mla_metadata",), helper=True),
            Api("flash_mla.get_mla_decoding_metadata", f"{_FLASH_MLA}:get_mla_decoding_metadata",
                (f"{_FLASH_MLA_WRAPPERS}:make_get_mla_decoding_metadata",), helper=True),
            # the constructor check answers yes where sm12x serves the pair, so the calls can come
            Api("vllm.flashinfer_dsv4.sparse_mla_dsv4", f"{_VLLM}.flashinfer_dsv4:sparse_mla_dsv4",
                (f"{_VLLM}.wrappers:make_flashinfer_dsv4_decode", f"{_VLLM}.wrappers:make_has_sparse_mla_sm120_config")),
        )),
    # the prefill's split path runs the decode's kernel on bf16 rows (its configurations are the
    # decode's); its compile reports are its pipelined path's
    OpSpec(
        name="sparse_mla_prefill", family="sparse_mla",
        kernel="sm12x.kernels.sparse_mla.prefill:sparse_mla_prefill",
        reference="sm12x.kernels.sparse_mla.reference:ref_sparse_mla_prefill",
        selftest="sm12x.kernels.sparse_mla.cases:check_sparse_mla_prefill",
        compile="sm12x.kernels.sparse_mla.prefill", benchmark="scripts/bench_sparse_mla_prefill.py",
        backs=(
            Api("flash_mla.flash_mla_sparse_fwd", f"{_FLASH_MLA}:flash_mla_sparse_fwd",
                (f"{_FLASH_MLA_WRAPPERS}:make_flash_mla_sparse_fwd",
                 f"{_FLASH_MLA_WRAPPERS}:make_sgl_kernel_flash_mla_sparse_fwd")),
        )),
    OpSpec(
        name="mqa_logits", family="indexer",
        kernel="sm12x.kernels.indexer.mqa_logits:mqa_logits",
        reference="sm12x.kernels.indexer.reference:ref_mqa_logits",
        selftest="sm12x.kernels.indexer.cases:check_mqa_logits",
        compile="sm12x.kernels.indexer.mqa_logits", benchmark="scripts/bench_indexer.py",
        backs=_deep_gemm(("fp8_mqa_logits", "fp8_fp4_mqa_logits"), _DG_INDEXER,
                         "sm12x.frontends.deep_gemm.wrappers")),
    OpSpec(
        name="paged_mqa_logits", family="indexer",
        kernel="sm12x.kernels.indexer.paged_mqa_logits:paged_mqa_logits",
        reference="sm12x.kernels.indexer.reference:ref_paged_mqa_logits",
        selftest="sm12x.kernels.indexer.cases:check_paged_mqa_logits",
        compile="sm12x.kernels.indexer.paged_mqa_logits", benchmark="scripts/bench_indexer.py",
        backs=_deep_gemm(("fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits"), _DG_INDEXER,
                         "sm12x.frontends.deep_gemm.wrappers")
        + _deep_gemm(("get_paged_mqa_logits_metadata",), _DG_INDEXER, "sm12x.frontends.deep_gemm.wrappers")
        + _deep_gemm(("get_num_sms", "set_num_sms"), _DG_INDEXER, helper=True)
        + (Api("sglang.fp8_paged_mqa_logits_torch", f"{_DG_INDEXER}:fp8_paged_mqa_logits",
               ("sm12x.frontends.deep_gemm.wrappers:make_sglang_paged_logits_torch",)),)),
    OpSpec(
        name="indexer_topk", family="indexer",
        kernel="sm12x.kernels.indexer.fused_topk:mqa_topk_indices",
        reference="sm12x.kernels.indexer.reference:ref_indexer_topk",
        selftest="sm12x.kernels.indexer.cases:check_indexer_topk",
        compile="sm12x.kernels.indexer.fused_topk", benchmark="scripts/bench_indexer.py",
        backs=(
            # the eligibility and chunk rules send vLLM's planner to the op
            Api("vllm.fused_mqa_topk.fused_mqa_topk_prefill", f"{_VLLM}.indexer:fused_mqa_topk_prefill",
                (f"{_VLLM}.wrappers:make_fused_mqa_topk_prefill", f"{_VLLM}.wrappers:make_use_fused_mqa_topk",
                 f"{_VLLM}.wrappers:make_fused_mqa_topk_chunk")),
            Api("vllm.fused_mqa_topk.fused_mqa_topk_key_scales", f"{_VLLM}.indexer:fused_mqa_topk_key_scales",
                (f"{_VLLM}.wrappers:make_fused_mqa_topk_key_scales",), helper=True),
            Api("vllm.sparse_attn_indexer.fp8_fp4_mqa_logits", f"{_VLLM}.indexer:deferred_mqa_logits",
                (f"{_VLLM}.wrappers:make_deferred_mqa_logits",
                 f"{_VLLM}.wrappers:make_deferred_compressed_mqa_logits")),
            Api("vllm.sparse_attn_indexer.fp8_fp4_paged_mqa_logits", f"{_VLLM}.indexer:deferred_paged_mqa_logits",
                (f"{_VLLM}.wrappers:make_deferred_paged_mqa_logits",)),
            Api("vllm.sparse_attn_indexer.ops", f"{_VLLM}.indexer:top_k_per_row_prefill",
                (f"{_VLLM}.wrappers:make_indexer_ops", f"{_VLLM}.wrappers:make_get_indexer_topk",
                 f"{_VLLM}.wrappers:make_radix_topk")),
            Api("sglang.dsv4.indexer.paged_mqa_logits", f"{_SGLANG}.indexer:deferred_paged_logits",
                (f"{_SGLANG}.wrappers:make_paged_logits", f"{_SGLANG}.wrappers:make_deep_gemm_paged_logits")),
            Api("sglang.dsv4.indexer.nonpaged_mqa_logits", f"{_SGLANG}.indexer:deferred_nonpaged_mqa_logits",
                (f"{_SGLANG}.wrappers:make_nonpaged_mqa_logits",)),
            Api("sglang.dsv4.indexer.topk_transform", f"{_SGLANG}.indexer:topk_transform",
                (f"{_SGLANG}.wrappers:make_topk_transform", f"{_SGLANG}.wrappers:make_topk_transform_v2")),
            Api("sglang.dsa.indexer.mqa_logits", f"{_SGLANG}.indexer:deferred_dsa_mqa_logits",
                (f"{_SGLANG}.wrappers:make_resolve_fp8_mqa_logits_fn",
                 f"{_SGLANG}.wrappers:make_indexer_deep_gemm")),
            Api("sglang.dsa.indexer.paged_mqa_logits", f"{_SGLANG}.indexer:deferred_dsa_paged_logits",
                (f"{_SGLANG}.wrappers:make_dsa_paged_logits_split",
                 f"{_SGLANG}.wrappers:make_dsa_paged_logits_native")),
            Api("sglang.dsa.topk_backend.topk_transform", f"{_SGLANG}.indexer:dsa_topk_transform",
                (f"{_SGLANG}.wrappers:make_dsa_topk_transform",)),
        )),
    # DeepSeek-V4.1's candidate-only paged logits (SGLang 0.5.23's V4.1 indexer)
    OpSpec(
        name="paged_sparse_mqa_logits", family="indexer",
        kernel="sm12x.kernels.indexer.paged_sparse_mqa_logits:paged_sparse_mqa_logits",
        reference="sm12x.kernels.indexer.reference:ref_paged_sparse_mqa_logits",
        selftest="sm12x.kernels.indexer.cases:check_paged_sparse_mqa_logits",
        compile="sm12x.kernels.indexer.paged_sparse_mqa_logits", benchmark="scripts/bench_v41_indexer.py",
        backs=_deep_gemm(("fp8_fp4_paged_sparse_mqa_logits",), _DG_SPARSE, "sm12x.frontends.deep_gemm.sparse_wrappers")
        + _deep_gemm(("get_paged_sparse_mqa_logits_metadata",), _DG_SPARSE,
                     "sm12x.frontends.deep_gemm.sparse_wrappers", helper=True)
        + (Api("sglang.v41_indexer.make_candidate_indexer",
               "sm12x.frontends.deep_gemm.sparse_wrappers:make_candidate_indexer",
               ("sm12x.frontends.deep_gemm.sparse_wrappers:make_candidate_indexer",), helper=True),)),
    # DeepSeek-V4.1's two-level selection (candidate blocks) fused with the indexer top-k (vLLM 0.34)
    OpSpec(
        name="candidate_topk", family="indexer",
        kernel="sm12x.kernels.indexer.candidate_topk:mqa_candidate_topk_indices",
        reference="sm12x.kernels.indexer.reference:ref_candidate_mask",
        selftest="sm12x.kernels.indexer.cases:check_candidate_topk",
        compile="sm12x.kernels.indexer.candidate_topk", benchmark="scripts/bench_v41_indexer.py",
        backs=(
            Api("vllm.sparse_attn_indexer.select_candidate_blocks", f"{_VLLM}.candidates:select_candidate_blocks",
                (f"{_VLLM}.wrappers:make_select_candidate_blocks",)),
            Api("vllm.sparse_attn_indexer.apply_candidate_mask", f"{_VLLM}.candidates:apply_candidate_mask",
                (f"{_VLLM}.wrappers:make_apply_candidate_mask",)),
            Api("sglang.v41.deep_gemm_fp4_paged_mqa_logits", f"{_SGLANG}.v41:deferred_source_logits",
                (f"{_SGLANG}.wrappers:make_v41_source_logits",)),
            Api("sglang.v41.amax_topk_blocks", f"{_SGLANG}.v41:amax_topk_blocks",
                (f"{_SGLANG}.wrappers:make_amax_topk_blocks",)),
        )),
    OpSpec(
        name="fp8_gemm_nt", family="gemm",
        kernel="sm12x.kernels.gemm.fp8_gemm:fp8_gemm",
        reference="sm12x.kernels.gemm.reference:ref_fp8_gemm_nt",
        selftest="sm12x.kernels.gemm.cases:check_fp8_gemm",
        compile="sm12x.kernels.gemm.fp8_gemm", benchmark="scripts/bench_gemm.py",
        backs=_deep_gemm(_GEMM_FORMS + ("transform_sf_into_required_layout",), _DG_GEMM,
                         "sm12x.frontends.deep_gemm.gemm_wrappers")
        + _deep_gemm(("get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor"), _DG_GEMM,
                     "sm12x.frontends.deep_gemm.gemm_wrappers", helper=True)
        + _deep_gemm(("get_mn_major_tma_aligned_packed_ue8m0_tensor", "get_tma_aligned_size",
                      "ceil_to_ue8m0", "pack_ue8m0_to_int", "ceil_div", "align"), _DG_GEMM, helper=True)),
    # the einsum launches fp8_gemm's kernel (one group per head): its compile reports are
    # fp8_gemm_nt's; DeepGEMM's bf16 ``einsum`` forms ride along (computed with torch, by the
    # same front end)
    OpSpec(
        name="fp8_einsum", family="gemm",
        kernel="sm12x.kernels.gemm.fp8_einsum:fp8_einsum",
        reference="sm12x.kernels.gemm.reference:ref_fp8_einsum_bhr_hdr",
        selftest="sm12x.kernels.gemm.cases:check_fp8_einsum", benchmark="scripts/bench_gemm.py",
        backs=_deep_gemm(("fp8_einsum",), _DG_GEMM, "sm12x.frontends.deep_gemm.gemm_wrappers")
        + _deep_gemm(("einsum",), _DG_GEMM, "sm12x.frontends.deep_gemm.gemm_wrappers")),
    OpSpec(
        name="tf32_hc_prenorm_gemm", family="gemm",
        kernel="sm12x.kernels.gemm.hc_prenorm_gemm:hc_prenorm_gemm",
        reference="sm12x.kernels.gemm.reference:ref_tf32_hc_prenorm_gemm",
        selftest="sm12x.kernels.gemm.cases:check_hc_prenorm",
        compile="sm12x.kernels.gemm.hc_prenorm_gemm", benchmark="scripts/bench_gemm.py",
        backs=_deep_gemm(("tf32_hc_prenorm_gemm",), _DG_GEMM, "sm12x.frontends.deep_gemm.gemm_wrappers")),
    # the psum layout compiles the same kernel with one constexpr more: the self-test's check
    # covers the expert-id layout; the compile test sweeps both
    OpSpec(
        name="m_grouped_fp8_fp4_gemm_nt_contiguous", family="moe",
        kernel="sm12x.kernels.moe.grouped_contiguous:grouped_contiguous",
        reference="sm12x.kernels.moe.reference:ref_grouped_contiguous",
        selftest="sm12x.kernels.moe.cases:check_contiguous",
        compile="sm12x.kernels.moe.grouped_contiguous", compile_fixed=(("psum", (False,)),),
        benchmark="scripts/bench_moe.py",
        backs=_deep_gemm(("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_contiguous"), _DG_MOE,
                         wrapper=_moe_wrappers)
        + _deep_gemm(("get_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
                      "get_theoretical_mk_alignment_for_contiguous_layout"), _DG_MOE, helper=True)),
    OpSpec(
        name="m_grouped_fp8_fp4_gemm_nt_masked", family="moe",
        kernel="sm12x.kernels.moe.grouped_masked:grouped_masked",
        reference="sm12x.kernels.moe.reference:ref_grouped_masked",
        selftest="sm12x.kernels.moe.cases:check_masked",
        compile="sm12x.kernels.moe.grouped_masked", benchmark="scripts/bench_moe.py",
        backs=_deep_gemm(("m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked",
                          "fp8_m_grouped_gemm_nt_masked"), _DG_MOE, wrapper=_moe_wrappers)),
)


def apis() -> tuple:
    """Every Api of every op, op by op."""
    return tuple(api for op in OPS for api in op.backs)


def names_in(module: str, helper: bool = False) -> tuple:
    """The upstream names that front-end ``module`` implements under the same name (its
    ``NAMES``; with ``helper`` its ``HELPER_NAMES``), in manifest order."""
    return tuple(api.attribute for api in apis()
                 if api.function == f"{module}:{api.attribute}" and api.helper == helper)


def wrapped_in(wrappers_module: str) -> tuple:
    """The upstream names whose factory ``wrappers_module`` makes per name (the keys of its
    ``FACTORIES``): every Api listing ``"<wrappers_module>:make_<name>"``."""
    return tuple(api.attribute for api in apis() if f"{wrappers_module}:make_{api.attribute}" in api.wrappers)


def library_functions(library: str) -> dict:
    """``{upstream name: "module:function"}`` for every function of ``library`` (the stand-in
    module :mod:`sm12x.shims` assembles)."""
    return {api.attribute: api.function for api in apis() if api.library == library}


def factory(api_name: str, name: str = "") -> str:
    """The factory (``"module:function"``) that a patch record installs for the upstream function
    ``api_name`` (``"flash_mla.flash_mla_with_kvcache"``): the Api's only one, or the one whose
    function is ``name`` where it lists several. Records take their replacement from here, so a
    record cannot install a factory the manifest does not list (ValueError naming the Api)."""
    api = next((a for a in apis() if a.name == api_name), None)
    if api is None:
        raise ValueError(f"op manifest: no upstream function {api_name!r}")
    if name:
        hits = [w for w in api.wrappers if w.rpartition(":")[2] == name]
    else:
        hits = list(api.wrappers)
    if len(hits) != 1:
        raise ValueError(f"op manifest: {api_name} lists the factories {list(api.wrappers)}; name one of them"
                         if not name else f"op manifest: {api_name} lists no factory {name!r} "
                                          f"(it lists {list(api.wrappers)})")
    return hits[0]


def factory_path(make) -> str:
    """A record's factory as this table names it: ``"module:function"`` (a ``"module:function"``
    string, what :func:`factory` returns, stays as it is)."""
    if isinstance(make, str):
        return make
    return f"{getattr(make, '__module__', '')}:{getattr(make, '__name__', '')}"


def op_of_wrapper() -> dict:
    """``{factory path: (op name, api name)}`` for every factory an Api lists."""
    return {w: (op.name, api.name) for op in OPS for api in op.backs for w in api.wrappers}

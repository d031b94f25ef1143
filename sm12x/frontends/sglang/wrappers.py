"""The factories the SGLang indexer top-k records install (:mod:`sm12x.patches.indexer_topk`).
Stdlib only at import; the API module (:mod:`sm12x.frontends.sglang.indexer`) is imported when a
patch is made.

SGLang 0.5.23's DeepSeek-V4 paged indexer: the TileLang / torch paged-logits functions return a
placeholder when ``forward_c4_indexer``'s ``run_paged_indexer`` calls them and the transforms that
read it are ours; every other call (SGLang's DSA indexers, tests, a transform left as SGLang's) gets
the real logits of sm12x's DeepGEMM-route replacement (``make_sglang_paged_logits_torch``): these
factories are layers (:class:`sm12x.patches.Layer`) that the DeepGEMM-route records stack on their
replacement.

With the TileLang and torch logits off, ``run_paged_indexer`` imports DeepGEMM's
``fp8_paged_mqa_logits`` at call time: the same placeholder answers that call
(``make_deep_gemm_paged_logits``, on the ``deep_gemm`` module's function, which SGLang's DSA
indexers and vLLM share: they get the DeepGEMM record's real logits).

SGLang 0.5.23's DeepSeek-V4 non-paged prefill indexer: ``C4IndexerBackendMixin._nonpaged_mqa_logits``
returns a placeholder, and the top-k transforms that ``forward_c4_indexer`` may call next (the
``sglang.srt.layers.attention.dsv4.indexer`` module's own functions and its copies of
``topk_transform_paged`` / ``_v2``) run the fused top-k for it. Only that module's names are
replaced: the transforms in ``sglang.kernels.ops.attention.dsv4`` stay SGLang's for every other
caller.

SGLang's DSA indexer (DeepSeek-V3.2 / GLM-5) ragged prefill: the logits function
``_get_topk_ragged`` calls (0.5.23: through the indexer module's copy of
``resolve_fp8_mqa_logits_fn``; 0.5.15-0.5.19: ``deep_gemm.fp8_mqa_logits`` of the module's
``deep_gemm``, replaced by ``IndexerDeepGemm``) returns a placeholder, and
``DSATopKBackend.topk_transform`` (every DSA top-k goes through it) computes the fused top-k for
it; real logits everywhere else.

SGLang's DSA indexer decode and MTP verify / draft extend (``_get_topk_paged``, 0.5.15-0.5.23):
the indexer module's copies of ``deepgemm_paged_mqa_logits_split`` / ``_native`` (what it calls on
CUDA, whichever logits function it hands them) return a placeholder under the same conditions,
for the same transform method.
"""
from __future__ import annotations

import functools
import sys

from sm12x.frontends import callers

DSV4_INDEXER = "sglang.srt.layers.attention.dsv4.indexer"
DSA_INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer"
DSA_TOPK = "sglang.srt.layers.attention.dsa.dsa_topk_backend"
# the transforms forward_c4_indexer's run_topk_transform may call (module globals there; the
# FlashInfer ones are bound to the backend instance from these globals at construction)
TRANSFORMS = ("topk_transform_paged", "topk_transform_paged_v2", "topk_transform_pytorch_vectorized",
              "topk_transform_flashinfer_fused", "topk_transform_flashinfer_unfused")


def _api():
    from sm12x.frontends.sglang import indexer

    return indexer


def transforms_are_ours() -> bool:
    """Every transform the indexer module binds is sm12x's (each record applied)."""
    module = sys.modules.get(DSV4_INDEXER)
    if module is None:
        return False
    bound = [getattr(module, name) for name in TRANSFORMS if hasattr(module, name)]
    return all(getattr(f, "__sm12x_patch__", None) for f in bound)


def _called_from_paged_indexer(frame) -> bool:
    """Whether a paged-logits call comes from ``forward_c4_indexer``'s ``run_paged_indexer``, whose
    logits go to one top-k transform and nowhere else."""
    return (frame is not None and frame.f_code.co_name == "run_paged_indexer"
            and frame.f_globals.get("__name__") == DSV4_INDEXER)


def make_paged_logits(original, dense):
    """A layer on SGLang's paged-logits functions of the torch fallback's signature (TileLang,
    torch, torch SM120): a placeholder for ``run_paged_indexer`` while the transforms are ours,
    ``dense`` otherwise (the replacement below this layer: the record's, sm12x's kernel with real
    logits)."""
    api = _api()

    @functools.wraps(original)
    def paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata=None,
                         max_seq_len=None, clean_logits=True):
        if (max_seq_len is None or not _one_fp8_query_per_row(q_fp8)
                or not _called_from_paged_indexer(callers.caller()) or not transforms_are_ours()):
            return dense(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                         clean_logits)
        return api.deferred_paged_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                         max_seq_len, clean_logits)

    return paged_mqa_logits


def _one_fp8_query_per_row(q) -> bool:
    """q of the run_paged_indexer call a placeholder serves: FP8 [rows, 1, H, D] (the FP4 indexer
    passes a (values, scales) tuple)."""
    import torch

    return isinstance(q, torch.Tensor) and q.dim() == 4 and q.shape[1] == 1 and q.dtype == torch.float8_e4m3fn


def make_deep_gemm_paged_logits(original, dense):
    """A layer on ``deep_gemm.fp8_paged_mqa_logits`` as SGLang's DeepSeek-V4 paged indexer imports
    it at call time when the TileLang and torch logits are off: a placeholder for
    ``run_paged_indexer``'s call (FP8 queries, the eight positional arguments it passes) while the
    transforms are ours; for every other caller (SGLang's DSA indexers, vLLM, anyone) ``dense``,
    the replacement below (the DeepGEMM record's: sm12x's kernel with real logits)."""
    api = _api()

    @functools.wraps(original)
    def fp8_paged_mqa_logits(*args, **kwargs):
        if (len(args) == 8 and not kwargs and isinstance(args[6], int) and _one_fp8_query_per_row(args[0])
                and _called_from_paged_indexer(callers.caller()) and transforms_are_ours()):
            return api.deferred_paged_logits(*args)
        return dense(*args, **kwargs)

    return fp8_paged_mqa_logits


def make_nonpaged_mqa_logits(original):
    """``_nonpaged_mqa_logits`` (a staticmethod): a placeholder while the transforms that read it
    are ours, the original DeepGEMM logits otherwise."""
    api = _api()

    @functools.wraps(original)
    def _nonpaged_mqa_logits(*, q_indexer, weights, kv, plan, rows):
        if not transforms_are_ours():
            return original(q_indexer=q_indexer, weights=weights, kv=kv, plan=plan, rows=rows)
        return api.deferred_nonpaged_mqa_logits(q_indexer=q_indexer, weights=weights, kv=kv, plan=plan, rows=rows)

    return _nonpaged_mqa_logits


def make_topk_transform(original):
    """The ``(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None)``
    transforms."""
    api = _api()

    @functools.wraps(original)
    def topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices=None):
        if not api.topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices):
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)
        return None

    return topk_transform


def make_topk_transform_v2(original):
    """``topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size,
    metadata, out_raw_indices=None)``: the plan (``metadata``) only schedules SGLang's kernel."""
    api = _api()

    @functools.wraps(original)
    def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                                out_raw_indices=None):
        if not api.topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices):
            return original(scores, seq_lens, page_tables, out_page_indices, page_size, metadata, out_raw_indices)
        return None

    return topk_transform_paged_v2


def _dsa_env(name, default):
    """An SGLang env flag as the DSA top-k module reads it (``default`` when unreadable)."""
    envs = getattr(sys.modules.get(DSA_TOPK), "envs", None)
    try:
        return getattr(envs, name).get() if envs is not None else default
    except Exception:
        return default


def _dsa_fused_topk() -> bool:
    """SGLANG_DSA_FUSE_TOPK (on by default)."""
    return bool(_dsa_env("SGLANG_DSA_FUSE_TOPK", True))


def _dsa_topk_v2(backend) -> bool:
    """Whether SGLang's v2 top-k kernel may take a PAGED call: ``should_use_topk_v2()`` (0.5.19 on:
    sgl-kernel backend and SGLANG_OPT_USE_TOPK_V2), SGLANG_OPT_USE_TOPK_V2 alone before it."""
    rule = getattr(backend, "should_use_topk_v2", None)
    return bool(rule()) if callable(rule) else bool(_dsa_env("SGLANG_OPT_USE_TOPK_V2", True))


def _dsa_serves(q, kv) -> bool:
    """Whether sm12x's fused top-k takes a DSA logits call: FP8 queries of a head count and head
    dim the kernels take, FP8 keys with float32 scales (other calls get DeepGEMM's logits)."""
    import torch

    from sm12x.kernels.indexer.validation import FP8_DIMS, HEADS

    k, scale = kv if isinstance(kv, (tuple, list)) and len(kv) == 2 else (None, None)
    return (isinstance(q, torch.Tensor) and q.dim() == 3 and q.dtype == torch.float8_e4m3fn
            and q.shape[1] in HEADS and q.shape[2] in FP8_DIMS and isinstance(k, torch.Tensor)
            and k.dtype == torch.float8_e4m3fn and isinstance(scale, torch.Tensor) and scale.dtype == torch.float32)


def _dsa_paged_serves(q, kv_cache, weights) -> bool:
    """Whether sm12x's fused paged top-k takes a DSA decode call: FP8 queries [rows, H, D] of a
    head count and head dim the kernels take, a cache of D + 4 bytes per token, float32 weights."""
    import torch

    from sm12x.kernels.indexer.validation import FP8_DIMS, HEADS

    return (isinstance(q, torch.Tensor) and q.dim() == 3 and q.dtype == torch.float8_e4m3fn
            and q.shape[1] in HEADS and q.shape[2] in FP8_DIMS and isinstance(kv_cache, torch.Tensor)
            and kv_cache.dim() == 4 and kv_cache.shape[3] == q.shape[2] + 4 and isinstance(weights, torch.Tensor)
            and weights.dtype == torch.float32)


def _dsa_transform_is_ours(indexer, metadata, row_starts: bool) -> bool:
    """Whether only a top-k sm12x writes reads the logits of a DSA indexer call: no init / local
    token marks (``_mask_init_and_local_tokens`` writes into the logits), DSAIndexerMetadata over
    a DSATopKBackend whose ``topk_transform`` is ours, and a transform it writes (``row_starts``:
    whether the call passes row starts): unfused; fused sgl-kernel; fused FlashInfer RAGGED, or
    PAGED without row_starts (with them it offsets the table by row_starts - cu_seqlens_k), and
    FlashInfer only with its tie-break left unset; never SGLang's fused torch backend (which
    raises)."""
    if getattr(indexer, "num_init_tokens", 1) or getattr(indexer, "num_local_tokens", 1):
        return False
    backend = getattr(metadata, "topk_backend", None)
    if (type(metadata).__name__ != "DSAIndexerMetadata"
            or not getattr(getattr(type(backend), "topk_transform", None), "__sm12x_patch__", None)):
        return False
    kind = getattr(backend, "value", None)
    if kind == "flashinfer" and _dsa_env("SGLANG_DSA_TOPK_FLASHINFER_TIE_BREAK", None) is not None:
        return False
    if not _dsa_fused_topk() or getattr(metadata, "force_unfused_topk", False):
        return True
    method = getattr(getattr(metadata, "topk_transform_method", None), "name", None)
    if kind == "sgl-kernel":
        return method in ("RAGGED", "PAGED")
    if kind == "flashinfer":
        return method == "RAGGED" or (method == "PAGED" and not row_starts)
    return False


# the DSA indexer's methods that call the logits functions: prefill rows, and decode / verify rows
RAGGED_CALLER, PAGED_CALLER = "_get_topk_ragged", "_get_topk_paged"


def _dsa_reads_only_topk(frame, caller: str) -> bool:
    """Whether a logits call comes from the DSA indexer's ``caller`` with only a top-k sm12x
    writes to read them (``_dsa_transform_is_ours``): ``_get_topk_ragged`` (prefill; its rows pass
    row starts) or ``_get_topk_paged`` (decode, MTP verify, draft extend;
    ``metadata.topk_transform(logits, topk)`` passes none)."""
    if frame is None or frame.f_code.co_name != caller or frame.f_globals.get("__name__") != DSA_INDEXER:
        return False
    indexer, metadata = frame.f_locals.get("self"), frame.f_locals.get("metadata")
    if "_mask_init_and_local_tokens" not in frame.f_code.co_names:  # 0.5.15.post1 marks no tokens
        indexer = _NoMarks
    return _dsa_transform_is_ours(indexer, metadata, row_starts=caller == RAGGED_CALLER)


class _NoMarks:
    num_init_tokens = num_local_tokens = 0


def _dsa_logits_fn(fn):
    """``fn`` (SGLang's DSA prefill logits function, DeepGEMM's ``fp8_mqa_logits`` signature) with
    ``_get_topk_ragged``'s calls answered by a placeholder when ``_dsa_reads_only_topk``
    and ``_dsa_serves``."""
    api = _api()

    @functools.wraps(fn)
    def fp8_mqa_logits(q, kv, weights, ks, ke, *rest, **kwargs):
        if (rest or set(kwargs) - {"clean_logits"} or not _dsa_serves(q, kv)
                or not _dsa_reads_only_topk(callers.caller(), RAGGED_CALLER)):
            return fn(q, kv, weights, ks, ke, *rest, **kwargs)
        return api.deferred_dsa_mqa_logits(q, kv, weights, ks, ke)

    return fp8_mqa_logits


class IndexerDeepGemm:
    """``deep_gemm`` as SGLang 0.5.15-0.5.19's DSA indexer module sees it: every attribute is
    the module's own (looked up at call time, so sm12x's DeepGEMM records serve them), except
    ``fp8_mqa_logits``, which ``_dsa_logits_fn`` wraps."""

    def __init__(self, module):
        self.__sm12x_module__ = module
        self.__name__ = getattr(module, "__name__", "deep_gemm")
        self._wrapped = (None, None)

    def __getattr__(self, name):
        return getattr(self.__sm12x_module__, name)

    @property
    def fp8_mqa_logits(self):
        # the wrapped function itself (not a method calling it), so that the indexer is its caller
        fn = self.__sm12x_module__.fp8_mqa_logits
        if self._wrapped[0] is not fn:
            self._wrapped = (fn, _dsa_logits_fn(fn))
        return self._wrapped[1]

    def __repr__(self):
        return f"<sm12x DSA indexer view of {self.__name__}>"


def make_indexer_deep_gemm(original):
    if isinstance(original, BaseException):  # the indexer binds the ImportError when deep_gemm is missing
        raise ImportError(f"the DSA indexer has no deep_gemm ({original})")
    return IndexerDeepGemm(original)


def make_resolve_fp8_mqa_logits_fn(original):
    """The DSA indexer module's ``resolve_fp8_mqa_logits_fn``: SGLang's resolved function (DeepGEMM's
    ``fp8_mqa_logits``, or its torch fallback), wrapped so that ``_get_topk_ragged``'s calls
    return a placeholder when ``_dsa_reads_only_topk`` and ``_dsa_serves``."""
    wrapped = {}

    @functools.wraps(original)
    def resolve_fp8_mqa_logits_fn():
        fn = original()
        if id(fn) not in wrapped:
            wrapped[id(fn)] = (fn, _dsa_logits_fn(fn))
        return wrapped[id(fn)][1]

    return resolve_fp8_mqa_logits_fn


def make_dsa_topk_transform(original):
    """``DSATopKBackend.topk_transform``: the fused top-k for placeholder logits, SGLang's method
    for real ones."""
    api = _api()

    @functools.wraps(original)
    def topk_transform(self, logits, lengths, topk, topk_transform_method, attn_metadata, cu_seqlens_q_topk=None,
                       topk_indices_offset=None, row_starts=None, batch_idx_list=None, force_unfused_topk=False):
        def sglang():
            return original(self, logits, lengths, topk, topk_transform_method, attn_metadata, cu_seqlens_q_topk,
                            topk_indices_offset, row_starts, batch_idx_list, force_unfused_topk)

        return api.dsa_topk_transform(sglang, logits, lengths, topk, _dsa_fused_topk(), topk_transform_method,
                                      attn_metadata, cu_seqlens_q_topk, topk_indices_offset, row_starts,
                                      batch_idx_list, force_unfused_topk, backend=getattr(self, "value", None),
                                      v2=_dsa_topk_v2(self))

    return topk_transform


def make_dsa_paged_logits_split(original):
    """The DSA indexer module's ``deepgemm_paged_mqa_logits_split`` (decode, and verify / draft
    extend rows as their own requests): a placeholder for ``_get_topk_paged`` when
    ``_dsa_reads_only_topk`` and ``_dsa_paged_serves``, SGLang's wrapper (real logits)
    otherwise."""
    api = _api()

    @functools.wraps(original)
    def deepgemm_paged_mqa_logits_split(fp8_paged_mqa_logits_fn, q_fp8, kv_cache_fp8, weights, ctx_lens_2d,
                                        block_tables, schedule_metadata, max_seq_len, *, q_offset):
        if (not _dsa_paged_serves(q_fp8, kv_cache_fp8, weights)
                or not _dsa_reads_only_topk(callers.caller(), PAGED_CALLER)):
            return original(fp8_paged_mqa_logits_fn, q_fp8, kv_cache_fp8, weights, ctx_lens_2d, block_tables,
                            schedule_metadata, max_seq_len, q_offset=q_offset)
        # DeepGEMM reads the first q_offset rows of each per-row argument
        return api.deferred_dsa_paged_logits(q_fp8[:q_offset].unsqueeze(1), kv_cache_fp8, weights[:q_offset],
                                             ctx_lens_2d[:q_offset], block_tables[:q_offset], max_seq_len)

    return deepgemm_paged_mqa_logits_split


def make_dsa_paged_logits_native(original):
    """The DSA indexer module's ``deepgemm_paged_mqa_logits_native`` (MTP verify with [B, next_n]
    context lengths, one DeepGEMM call of next_n rows per request): a placeholder for
    ``_get_topk_paged`` under the same conditions as the split wrapper's."""
    api = _api()

    @functools.wraps(original)
    def deepgemm_paged_mqa_logits_native(fp8_paged_mqa_logits_fn, q_fp8, kv_cache_fp8, weights, ctx_lens_2d,
                                         block_tables, schedule_metadata, max_seq_len, *, q_offset, B, next_n):
        if (not _dsa_paged_serves(q_fp8, kv_cache_fp8, weights)
                or not _dsa_reads_only_topk(callers.caller(), PAGED_CALLER)):
            return original(fp8_paged_mqa_logits_fn, q_fp8, kv_cache_fp8, weights, ctx_lens_2d, block_tables,
                            schedule_metadata, max_seq_len, q_offset=q_offset, B=B, next_n=next_n)
        q = q_fp8[:q_offset].view(B, next_n, q_fp8.shape[1], q_fp8.shape[2])
        # block_tables repeats each request's row next_n times; DeepGEMM reads every next_n-th
        return api.deferred_dsa_paged_logits(q, kv_cache_fp8, weights[:q_offset], ctx_lens_2d,
                                             block_tables[::next_n][:B], max_seq_len)

    return deepgemm_paged_mqa_logits_native


# SGLang 0.5.23's DeepSeek-V4.1 sparse-table scheme (sm12x.frontends.sglang.v41)
V41_SPARSE_TABLE = "sglang.srt.layers.attention.dsv4.v41_indexer.sparse_table"
# the names of that module a candidate source's decode logits go to (each must be sm12x's record)
V41_READERS = ("topk_transform_paged_v2", "amax_topk_blocks")
# the chunked decode (``_publish_decode_chunked``, a row chunk's logits at a time) reads them through
# ``topk_transform_paged_from_metadata``, the DeepSeek-V4 indexer module's function, which calls that
# module's own transform by ``metadata.use_topk_v2``: both of those must be sm12x's records too
V41_CHUNKED_VIA = "topk_transform_paged_from_metadata"
V41_CHUNKED_TRANSFORMS = ("topk_transform_paged", "topk_transform_paged_v2")


def _v41():
    from sm12x.frontends.sglang import v41

    return v41


def _v41_readers(frame):
    """The functions a candidate source's decode in ``frame`` hands its logits to, or None for any
    other caller: ``publish_decode`` (one v2 transform and ``amax_topk_blocks``, the module's
    copies) or ``_publish_decode_chunked`` (per row chunk ``topk_transform_paged_from_metadata``,
    i.e. the DeepSeek-V4 indexer module's transforms, and ``amax_topk_blocks``)."""
    if frame is None or frame.f_globals.get("__name__") != V41_SPARSE_TABLE:
        return None
    names = frame.f_globals
    if frame.f_code.co_name == "publish_decode":
        return [names.get(n) for n in V41_READERS]
    if frame.f_code.co_name == "_publish_decode_chunked":
        via = getattr(names.get(V41_CHUNKED_VIA), "__globals__", {})
        if via.get("__name__") != DSV4_INDEXER:
            return None
        return [names.get("amax_topk_blocks")] + [via.get(n) for n in V41_CHUNKED_TRANSFORMS]
    return None


def _v41_source_decode(frame):
    """``topk_blocks`` when a logits call comes from a candidate source layer's decode
    (``SparseTableBackend.publish_decode`` or its chunked form, :func:`_v41_readers`) and every
    reader of the logits there is sm12x's; None otherwise."""
    readers = _v41_readers(frame)
    if not readers or not all(getattr(r, "__sm12x_patch__", None) for r in readers):
        return None
    blocks = getattr(frame.f_locals.get("self"), "topk_blocks", None)
    return blocks if isinstance(blocks, int) and blocks > 0 else None


def make_v41_source_logits(original):
    """``deep_gemm_fp4_paged_mqa_logits`` as the sparse-table module binds it: a placeholder for
    ``publish_decode``'s readers when ``_v41_source_decode``, SGLang's function (DeepGEMM's logits,
    which sm12x's DeepGEMM records serve on SM12x) otherwise."""
    api = _v41()

    @functools.wraps(original)
    def deep_gemm_fp4_paged_mqa_logits(q_fp4, k_cache, weights, seq_lens, page_table, deep_gemm_metadata,
                                       max_seq_len):
        blocks = _v41_source_decode(callers.caller())
        if blocks is None:
            return original(q_fp4, k_cache, weights, seq_lens, page_table, deep_gemm_metadata, max_seq_len)
        return api.deferred_source_logits(q_fp4, k_cache, weights, seq_lens, page_table, deep_gemm_metadata,
                                          max_seq_len, blocks)

    return deep_gemm_fp4_paged_mqa_logits


def make_amax_topk_blocks(original):
    """``amax_topk_blocks`` as the sparse-table module binds it: the blocks a placeholder's top-k
    published, SGLang's kernels for real logits."""
    api = _v41()

    @functools.wraps(original)
    def amax_topk_blocks(logits, seq_lens, nblocks, topk_blocks, max_seq_len=None):
        return api.amax_topk_blocks(original, logits, seq_lens, nblocks, topk_blocks, max_seq_len)

    return amax_topk_blocks

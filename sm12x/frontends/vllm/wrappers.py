"""The factories the vLLM indexer top-k records install (:mod:`sm12x.patches.indexer_topk`).
Stdlib only at import; the API module (:mod:`sm12x.frontends.vllm.indexer`) is imported when a
patch is made.

vLLM 0.34 (``vllm.model_executor.kernels.attention.dsa.fused_mqa_topk``): its planner and indexer
ask ``use_fused_mqa_topk`` whether a layer may skip the logits, ``fused_mqa_topk_chunk`` whether a
chunk does, ``fused_mqa_topk_key_scales`` for float32 key scales and ``fused_mqa_topk_prefill`` for
the indices. vLLM answers no on every GPU outside the SM100 family; the replacements answer yes
where sm12x's fused top-k serves the layer and do the work.

``vllm.model_executor.layers.sparse_attn_indexer``, decode (0.22.1-0.34.0): the module's copy of
``fp8_fp4_paged_mqa_logits`` returns a placeholder when every top-k its decode may hand the
logits to is sm12x's placeholder-aware one, which computes the fused paged top-k for it: from
0.30.0 the selector ``get_indexer_topk(backend)`` (the module's copy, replaced); up to 0.29.0 the
ops looked up through ``torch.ops._C`` at call time, ``persistent_topk`` (0.24.0 on also
``cooperative_topk``), whose attributes on that namespace are replaced by ``RadixTopk`` (in
0.22.1-0.28.0 sparse_attn_indexer is their only caller; 0.29.0's qsa.py, an AMD path, is the
other; real logits go to vLLM's op), and ``ops.top_k_per_row_decode``.

Same module, prefill (0.22.1-0.34.0): the copy of ``fp8_fp4_mqa_logits`` (0.33.0 on: DeepGEMM's
compressed layout, ``make_deferred_compressed_mqa_logits``) and ``ops`` (``vllm._custom_ops``) are
replaced as a pair: the logits come back as a placeholder and ``ops.top_k_per_row_prefill``
computes the fused top-k for it (0.34.0 runs this dense path only for layers its fused seam does
not take, e.g. an FP4 indexer cache).

Both pairs keep real logits where another reader needs them: DCP's merge, and v4.1 candidate
blocks unless the indexer's candidate steps are sm12x's (vLLM 0.34: ``make_select_candidate_blocks``,
``make_apply_candidate_mask``, which record the step on the placeholder for the fused candidate
top-k). GLM-5-next's pool indexer (``sparse_attn_indexer_kpool``, vLLM 0.34) takes the decode
pair through its own copies.
"""
from __future__ import annotations

import functools
import sys

from sm12x.frontends import callers


INDEXER_MODULE = "vllm.model_executor.layers.sparse_attn_indexer"


def _api():
    from sm12x.frontends.vllm import indexer

    return indexer


def _env(original, name, default):
    """A ``vllm.envs`` flag as the original's module reads it (``default`` without one)."""
    envs = getattr(original, "__globals__", {}).get("envs")
    try:
        return getattr(envs, name) if envs is not None else default
    except Exception:
        return default


def sm12x_serves(query_shape, topk, fp4_cache, full_context, candidate_selection) -> bool:
    """Whether vLLM 0.34's fused seam may take an indexer layer: FP8 queries of a head count and
    head dim the kernels take, every rank ranking the whole context (no DCP shard merge, which
    needs the logits) and no v4.1 candidate-block selection (the seam's op has no candidate
    arguments: those layers take the dense path, whose candidate steps sm12x records on its
    placeholder logits)."""
    from sm12x.kernels.indexer.validation import FP8_DIMS, HEADS

    shape = tuple(int(s) for s in query_shape)
    return (not fp4_cache and bool(full_context) and not candidate_selection and len(shape) == 2
            and shape[0] in HEADS and shape[1] in FP8_DIMS and isinstance(topk, int) and topk >= 1)


def make_use_fused_mqa_topk(original):
    """vLLM 0.34's eligibility rule, answered for sm12x: True where ``sm12x_serves`` the layer,
    unless the user turned the fused path off (``VLLM_USE_FUSED_MQA_TOPK=0``) or asked for
    batch invariance (``VLLM_BATCH_INVARIANT``: vLLM then keeps every chunk on one path)."""

    @functools.wraps(original)
    def use_fused_mqa_topk(*, query_shape, topk, fp4_cache, full_context, candidate_selection=False):
        if not _env(original, "VLLM_USE_FUSED_MQA_TOPK", True) or _env(original, "VLLM_BATCH_INVARIANT", False):
            return False
        return sm12x_serves(query_shape, topk, fp4_cache, full_context, candidate_selection)

    return use_fused_mqa_topk


def make_fused_mqa_topk_chunk(original):
    """Every chunk of an eligible layer takes the fused path: vLLM's rule weighs its SM100
    kernel's waves against the dense path (and reads the SM count through torch.cuda); sm12x's
    fused top-k has no key limit, and one path per layer keeps the indices independent of how a
    batch was chunked."""

    @functools.wraps(original)
    def fused_mqa_topk_chunk(max_seqlen_k, keys, topk, rows, dense_rows):
        return True

    return fused_mqa_topk_chunk


def make_fused_mqa_topk_key_scales(original):
    api = _api()

    @functools.wraps(original)
    def fused_mqa_topk_key_scales(scales):
        return api.fused_mqa_topk_key_scales(scales)

    return fused_mqa_topk_key_scales


def make_fused_mqa_topk_prefill(original):
    api = _api()

    @functools.wraps(original)
    def fused_mqa_topk_prefill(q, k, scales, weights, starts, ends, output):
        return api.fused_mqa_topk_prefill(q, k, scales, weights, starts, ends, output)

    return fused_mqa_topk_prefill


def make_deferred_mqa_logits(original):
    """``sparse_attn_indexer``'s ``fp8_fp4_mqa_logits`` (vLLM 0.22.1-0.32.0): a placeholder for
    ``ops.top_k_per_row_prefill`` when the indexer's ``ops`` is ours (its record applied) and
    ``_caller_reads_only_topk``: under DCP vLLM merges the shards' top-k by reading the logits
    (0.25.0 on), and v4.1 candidate blocks select or mask on them (0.30.0 on); those calls go to
    ``original`` (DeepGEMM's logits, which sm12x's DeepGEMM records serve)."""
    api = _api()

    @functools.wraps(original)
    def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits=True):
        indexer = sys.modules.get(INDEXER_MODULE)
        if (not isinstance(getattr(indexer, "ops", None), IndexerOps)
                or not _caller_reads_only_topk(callers.caller())):
            return original(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)
        return api.deferred_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, clean_logits)

    return fp8_fp4_mqa_logits


def _mx_inputs(q, kv) -> bool:
    """Whether a logits call carries the SM100 MX inputs (FP8 queries with UE8M0 scales, int32
    key scales) that vLLM 0.33+ builds on the SM100 family only; sm12x's kernels take FP8 with
    float32 key scales, or MXFP4."""
    values, scale = q
    fp8 = str(values.dtype).startswith("torch.float8")
    return (fp8 and scale is not None) or (scale is None and str(kv[1].dtype) != "torch.float32")


def make_deferred_compressed_mqa_logits(original):
    """``sparse_attn_indexer``'s ``fp8_fp4_mqa_logits`` (vLLM 0.33.0-0.34.0: compressed logits,
    ``max_seqlen_k``, 0.34 ``logits_dtype=``): a placeholder for ``ops.top_k_per_row_prefill``
    under the same conditions as ``make_deferred_mqa_logits``, for float32 logits of inputs sm12x
    takes; ``original`` otherwise (0.34's DeepSelect ranks BF16 logits, and only on SM100)."""
    api = _api()

    @functools.wraps(original)
    def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k, logits_dtype=None):
        indexer = sys.modules.get(INDEXER_MODULE)
        if ((logits_dtype is not None and str(logits_dtype) != "torch.float32")
                or not isinstance(getattr(indexer, "ops", None), IndexerOps) or _mx_inputs(q, kv)
                or not _caller_reads_only_topk(callers.caller())):
            more = {} if logits_dtype is None else {"logits_dtype": logits_dtype}  # 0.33.0 has no such argument
            return original(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k, **more)
        return api.deferred_compressed_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k)

    return fp8_fp4_mqa_logits


class IndexerOps:
    """``vllm._custom_ops`` as ``sparse_attn_indexer`` sees it: every attribute is the module's
    own, except ``top_k_per_row_prefill`` and ``top_k_per_row_decode``, which compute the fused
    top-k for placeholder logits and call vLLM's kernels for real ones."""

    def __init__(self, ops):
        self.__sm12x_ops__ = ops
        self.__name__ = getattr(ops, "__name__", "vllm._custom_ops")

    def __getattr__(self, name):
        return getattr(self.__sm12x_ops__, name)

    def top_k_per_row_prefill(self, *args, **kwargs):
        return _api().top_k_per_row_prefill(self.__sm12x_ops__.top_k_per_row_prefill, *args, **kwargs)

    def top_k_per_row_decode(self, *args, **kwargs):
        return _api().top_k_per_row_decode(self.__sm12x_ops__.top_k_per_row_decode, *args, **kwargs)

    def __repr__(self):
        return f"<sm12x indexer view of {self.__name__}>"


def make_indexer_ops(original):
    return IndexerOps(original)


class RadixTopk:
    """``torch.ops._C.persistent_topk`` / ``cooperative_topk`` (vLLM 0.22.1-0.29.0; cooperative_topk
    from 0.24.0), as ``sparse_attn_indexer``'s decode looks them up on ``torch.ops._C``: a call with
    placeholder logits gets the fused paged top-k, any other vLLM's op; every attribute (its
    overloads, ``.default``) is the op's own."""

    def __init__(self, op):
        self.__sm12x_op__ = op
        self.__name__ = getattr(op, "__name__", "persistent_topk")

    def __getattr__(self, name):
        return getattr(self.__sm12x_op__, name)

    def __call__(self, logits, lengths, output, workspace, k, max_seq_len):
        # the op's own schema: (Tensor logits, Tensor lengths, Tensor! output, Tensor workspace,
        # int k, int max_seq_len) -> ()
        return _api().radix_topk(self.__sm12x_op__, logits, lengths, output, workspace, k, max_seq_len)

    def __repr__(self):
        return f"<sm12x placeholder-aware {self.__name__}>"


def make_radix_topk(original):
    """The ``torch.ops._C`` op ``original`` (``persistent_topk`` / ``cooperative_topk``) as
    ``RadixTopk``."""
    return RadixTopk(original)


def _torch_op_is_ours(name) -> bool:
    torch = sys.modules.get("torch")
    namespace = getattr(getattr(torch, "ops", None), "_C", None)
    return isinstance(getattr(namespace, "__dict__", {}).get(name), RadixTopk)


class _Globals:
    """A frame's module globals as attributes (what the calling indexer module binds now)."""

    def __init__(self, frame):
        self._names = frame.f_globals

    def __getattr__(self, name):
        return self._names.get(name)


def _decode_readers_are_ours(frame) -> bool:
    """Whether every decode top-k the calling code may hand the logits to is one of sm12x's
    placeholder-aware readers: the names it uses (0.30.0-0.34.0: ``get_indexer_topk``; 0.22.1-0.29.0:
    ``persistent_topk``, ``cooperative_topk``, ``ops.top_k_per_row_decode``) against what the
    calling module (``sparse_attn_indexer``, or GLM-5-next's indexer) binds now (a reader whose
    record was skipped would read a placeholder as NaN logits)."""
    indexer = _Globals(frame)
    used = [ours for name, ours in _DECODE_READERS.items() if name in frame.f_code.co_names]
    return bool(used) and all(ours(indexer) for ours in used)


# a decode top-k reader's name in the indexer's code -> whether the installed one (given the
# indexer module) is sm12x's placeholder-aware reader
_DECODE_READERS = {
    "get_indexer_topk": lambda indexer: isinstance(getattr(indexer, "get_indexer_topk", None), CachedSelectors),
    "top_k_per_row_decode": lambda indexer: isinstance(getattr(indexer, "ops", None), IndexerOps),
    "persistent_topk": lambda indexer: _torch_op_is_ours("persistent_topk"),
    "cooperative_topk": lambda indexer: _torch_op_is_ours("cooperative_topk"),
}


# the indexer functions whose logits calls may be deferred: vLLM's DSA / DeepSeek-V4 indexer and
# (0.34.0) GLM-5-next's pool indexer, whose only readers are the top-k (and DCP's merge)
_INDEXER_FUNCTIONS = ("sparse_attn_indexer", "sparse_attn_indexer_kpool")
# the names vLLM 0.34's sparse_attn_indexer binds vLLM's V4.1 candidate steps to
CANDIDATE_STEPS = ("_select_candidate_blocks", "_apply_candidate_mask")


def _candidate_steps_are_ours(frame) -> bool:
    """Whether the calling module's V4.1 candidate steps are sm12x's (their records applied), so
    that they read placeholder logits (:mod:`sm12x.frontends.vllm.candidates`)."""
    names = frame.f_globals
    return all(getattr(names.get(n), "__sm12x_candidate_step__", False) for n in CANDIDATE_STEPS)


def _caller_reads_only_topk(frame) -> bool:
    """Whether a logits call comes from the indexer function itself (``sparse_attn_indexer``;
    GLM-5-next's ``sparse_attn_indexer_kpool``) with nothing but the top-k to read the logits:
    no DCP (its merge reads them), and v4.1 candidate blocks only where the candidate steps that
    read them are sm12x's. Those are the function's own arguments (absent in releases without the
    feature); the logits call cannot see them otherwise."""
    if frame is None or frame.f_code.co_name not in _INDEXER_FUNCTIONS:
        return False
    names = frame.f_locals
    if names.get("dcp_world_size", 1) != 1:
        return False
    return names.get("candidate_blocks") is None or _candidate_steps_are_ours(frame)


def make_deferred_paged_mqa_logits(original):
    """``sparse_attn_indexer``'s ``fp8_fp4_paged_mqa_logits`` (vLLM 0.22.1-0.34.0):
    a placeholder for the decode top-k when ``_decode_readers_are_ours``, the logits are float32
    (so 0.33's ``as_fp32_logits`` passes them through) and ``_caller_reads_only_topk``;
    ``original`` (DeepGEMM's logits, which sm12x's DeepGEMM records serve) otherwise.
    ``clean_logits`` (0.22.1-0.32.0 pass False) only says whether DeepGEMM fills the columns past
    a row's end with -inf; the fused top-k never reads them."""
    api = _api()

    @functools.wraps(original)
    def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                 max_model_len, *rest, **kwargs):
        dtype = kwargs.get("logits_dtype")
        caller = callers.caller()
        if (rest or (dtype is not None and str(dtype) != "torch.float32")
                or set(kwargs) - {"logits_dtype", "indices", "clean_logits"}
                or not _caller_reads_only_topk(caller) or not _decode_readers_are_ours(caller)
                or _shared_bounds(caller, q, context_lens)):
            return original(q, kv_cache, weights, context_lens, block_tables, schedule_metadata, max_model_len,
                            *rest, **kwargs)
        return api.deferred_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                             max_model_len, indices=kwargs.get("indices"))

    return fp8_fp4_paged_mqa_logits


def _shared_bounds(frame, q, context_lens) -> bool:
    """Whether a V4.1 decode's candidate step would bound every row of a request by the
    request's length ([B, 1] lengths with next_n > 1: vLLM's ``row_repeat``), where the fused
    top-k bounds each row by its own; those calls keep real logits."""
    values = q[0] if isinstance(q, (tuple, list)) else q
    return (frame.f_locals.get("candidate_blocks") is not None and getattr(values, "dim", lambda: 0)() == 4
            and values.shape[1] > 1 and getattr(context_lens, "dim", lambda: 0)() == 2
            and context_lens.shape[1] == 1)


def _candidates():
    from sm12x.frontends.vllm import candidates

    return candidates


def make_select_candidate_blocks(original):
    """vLLM 0.34's ``select_candidate_blocks`` as ``sparse_attn_indexer`` binds it: the step is
    recorded on placeholder logits, vLLM's kernel runs for real ones."""
    api = _candidates()

    @functools.wraps(original)
    def select_candidate_blocks(logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat=1,
                                score_dtype=None):
        return api.select_candidate_blocks(original, logits, row_ks, row_ke, topk_blocks, block_size, out,
                                           row_repeat, score_dtype)

    select_candidate_blocks.__sm12x_candidate_step__ = True
    return select_candidate_blocks


def make_apply_candidate_mask(original):
    """vLLM 0.34's ``apply_candidate_mask`` as ``sparse_attn_indexer`` binds it (see
    ``make_select_candidate_blocks``)."""
    api = _candidates()

    @functools.wraps(original)
    def apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat=1):
        return api.apply_candidate_mask(original, logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat)

    apply_candidate_mask.__sm12x_candidate_step__ = True
    return apply_candidate_mask


class CachedSelectors:
    """``get_indexer_topk`` as ``sparse_attn_indexer`` sees it: vLLM's selector for a backend,
    wrapped once in the API module's ``IndexerTopkSelector``."""

    def __init__(self, original):
        self.__sm12x_original_get__ = original
        self.__name__ = getattr(original, "__name__", "get_indexer_topk")
        self._wrapped = {}

    def __call__(self, backend):
        if backend not in self._wrapped:
            self._wrapped[backend] = _api().IndexerTopkSelector(self.__sm12x_original_get__(backend))
        return self._wrapped[backend]


def make_get_indexer_topk(original):
    return CachedSelectors(original)


def _flashinfer_dsv4():
    from sm12x.frontends.vllm import flashinfer_dsv4

    return flashinfer_dsv4


def make_flashinfer_dsv4_decode(original):
    """vLLM's ``flashinfer_trtllm_batch_decode_sparse_mla_dsv4`` (``*args, **kwargs``, read by
    FlashInfer's signature): a DeepSeek-V4 SM120 call whose shape the installed FlashInfer does not
    serve goes to sm12x's sparse decode, every other call to ``original``
    (:mod:`sm12x.frontends.vllm.flashinfer_dsv4`)."""
    api = _flashinfer_dsv4()

    @functools.wraps(original)
    def flashinfer_trtllm_batch_decode_sparse_mla_dsv4(*args, **kwargs):
        named = api.bind(args, kwargs)
        shape = api.call_shape(named) if named is not None else None
        if shape is not None and api.routes_to_sm12x(shape, api.installed_rule()):
            return api.sparse_mla_dsv4(named)
        return original(*args, **kwargs)

    return flashinfer_trtllm_batch_decode_sparse_mla_dsv4


def make_has_sparse_mla_sm120_config(original):
    """vLLM 0.33+'s constructor check ``has_flashinfer_sparse_mla_sm120_config(num_q_heads,
    top_k)``: also True where sm12x's decode serves the heads and FlashInfer's sparse MLA API is
    present, while the decode wrapper in the same module is sm12x's (so every call of such a layer
    reaches ``make_flashinfer_dsv4_decode``'s routing)."""
    api = _flashinfer_dsv4()
    module = original.__module__

    @functools.wraps(original)
    def has_flashinfer_sparse_mla_sm120_config(num_q_heads, top_k):
        if original(num_q_heads, top_k):
            return True
        owner = sys.modules.get(module)
        decode = getattr(owner, "flashinfer_trtllm_batch_decode_sparse_mla_dsv4", None)
        has_api = getattr(owner, "has_flashinfer_sparse_mla_sm120", None)
        return (getattr(decode, "__sm12x_patch__", None) is not None and has_api is not None and has_api()
                and api.sm12x_serves(api.CallShape(1, int(num_q_heads), int(top_k), 64)))

    return has_flashinfer_sparse_mla_sm120_config

"""The factories of the DeepSeek-V4.1 sparse-indexer records (:mod:`sm12x.patches.v41`): DeepGEMM's
candidate-only paged logits and their schedule, and SGLang 0.5.23's V4.1 candidate-indexer gate.
Stdlib only at import.

The DeepGEMM replacements read a call by the installed function's own signature (as the other
DeepGEMM records do, :mod:`sm12x.frontends.deep_gemm.wrappers`) and pass it to
:mod:`sm12x.frontends.deep_gemm.sparse_indexer`.

The gate: SGLang 0.5.23's ``v41_indexer.make_candidate_indexer`` counts SM120 as "SM100 or newer",
then asks the DeepGEMM configurer's ``DEEPGEMM_PAGED_SPARSE_MQA_LOGITS`` (computed once at import,
true only on SM100 with DeepGEMM's JIT on) and raises ``RuntimeError`` at attention-backend init
when it is false. On SM12x the question it means, "do ``deep_gemm.get_paged_sparse_mqa_logits_metadata``
and ``fp8_fp4_paged_sparse_mqa_logits`` run here?", is answered yes exactly when both are sm12x's
(a record applied, or sm12x's stand-in ``deep_gemm``). The replacement asks that and, only then
and only for this call, lets the function read the configurer's flag as true; every other reader
of the flag keeps SGLang's answer (the memory pool's ``dsv41_index_page_size`` then pages the
index-K pool at 64 slots, which sm12x's sparse logits read as well as 128).
"""
from __future__ import annotations

import functools
import sys

from sm12x.frontends.deep_gemm.wrappers import by_signature
from sm12x.kernels import manifest

CONFIGURER = "sglang.srt.layers.deep_gemm_wrapper.configurer"
FLAG = "DEEPGEMM_PAGED_SPARSE_MQA_LOGITS"

# factory per DeepGEMM name the manifest says this module makes (the schedule and the sparse
# logits): what the records install (``FACTORIES[name]``)
FACTORIES = {name: by_signature("sm12x.frontends.deep_gemm.sparse_indexer", name, __name__)
             for name in manifest.wrapped_in(__name__)}
SPARSE_NAMES = tuple(FACTORIES)


def sm12x_serves_sparse_logits() -> bool:
    """Whether the ``deep_gemm`` a framework imports has sm12x's paged sparse logits and schedule."""
    try:
        import deep_gemm
    except Exception:
        return False
    if getattr(deep_gemm, "__sm12x_shim__", False):
        return all(callable(getattr(deep_gemm, n, None)) for n in SPARSE_NAMES)
    return all(getattr(getattr(deep_gemm, n, None), "__sm12x_patch__", None) for n in SPARSE_NAMES)


def make_candidate_indexer(original):
    """SGLang's ``make_candidate_indexer`` with the paged-sparse-logits question answered for
    SM12x (module docstring); the original runs in every case."""

    @functools.wraps(original)
    def make_candidate_indexer(*args, **kwargs):
        configurer = sys.modules.get(CONFIGURER)
        if configurer is None:
            import importlib

            configurer = importlib.import_module(CONFIGURER)
        if getattr(configurer, FLAG, False) or not sm12x_serves_sparse_logits():
            return original(*args, **kwargs)
        setattr(configurer, FLAG, True)
        try:
            return original(*args, **kwargs)
        finally:
            setattr(configurer, FLAG, False)

    return make_candidate_indexer

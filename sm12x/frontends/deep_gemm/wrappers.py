"""How DeepGEMM's callers reach sm12x: the factories that the DeepGEMM patch records install.

Each replacement reads a call by the installed front end's own signature (DeepGEMM's Python front
ends, vLLM's vendored DeepGEMM 2.8, sgl-deep-gemm) and passes it on, by sm12x's names, to the
DeepGEMM-compatible functions in :mod:`sm12x.frontends.deep_gemm.indexer`. SGLang's own
paged-logits functions, which take DeepGEMM's argument order, map onto the same function. Stdlib
only at import.
"""
from __future__ import annotations

import functools

from sm12x.frontends.signatures import signature_of, takes_args
from sm12x.kernels import manifest


def _indexer():
    """The DeepGEMM-compatible indexer functions (imported on first patch: they need torch)."""
    from sm12x.frontends.deep_gemm import indexer

    return indexer


def _positional_names(fn):
    """Names of ``fn``'s parameters that may be passed by position, and all its parameters; None
    for compiled functions and ``*args`` stubs."""
    signature = signature_of(fn)
    if signature is None or takes_args(signature):
        return None
    params = signature.parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)], params


def _by_name(fn, ours, name):
    """For a Python ``fn`` with named parameters only (DeepGEMM's Python front ends): a function
    (args, kwargs) -> every argument by ``ours``'s name for it, ``fn``'s defaults filled in. A
    parameter of ``fn`` that ``ours`` does not name is ``ours``'s parameter in the same place
    (sgl-deep-gemm calls ``fp8_mqa_logits``'s ranges ``ks`` / ``ke``). None for compiled functions
    and ``*args`` stubs. Worked out once here, not per call: the logits functions run once per
    layer and step (``inspect``'s bind took about 7 µs a call)."""
    theirs = _positional_names(fn)
    if theirs is None:
        return None
    names, params = theirs
    our_names = (_positional_names(ours) or ([], ()))[0]
    own = {p.name for p in params}
    rename = {}
    for i, n in enumerate(names):
        if n not in our_names and i < len(our_names) and our_names[i] not in own:
            rename[n] = our_names[i]
    defaults = {rename.get(p.name, p.name): p.default for p in params if p.default is not p.empty}
    names = [rename.get(n, n) for n in names]

    def read(args, kwargs):
        if len(args) > len(names):
            raise TypeError(f"{name}() takes at most {len(names)} positional arguments ({len(args)} given)")
        given = dict(zip(names, args))
        if rename:
            kwargs = {rename.get(k, k): v for k, v in kwargs.items()}
        twice = given.keys() & kwargs.keys()
        if twice:
            raise TypeError(f"{name}() got multiple values for {', '.join(sorted(twice))}")
        return {**defaults, **given, **kwargs}

    return read


def by_signature(frontend: str, name: str, owner: str):
    """The factory (``make_<name>``, of module ``owner``, whose ``FACTORIES`` holds it) for
    DeepGEMM's ``name`` where sm12x's ``frontend`` module implements it under the same name and in
    the same parameter order: the replacement reads each call as the original names its parameters
    (defaults included) and calls ours by our names; an original without a Python signature
    (DeepGEMM's compiled functions) takes ours positionally."""
    def make(original):
        import importlib

        ours = getattr(importlib.import_module(frontend), name)  # on first patch: it needs torch
        read = _by_name(original, ours, name)

        @functools.wraps(ours)
        def replacement(*args, **kwargs):
            if read is None:
                return ours(*args, **kwargs)
            return ours(**read(args, kwargs))

        return replacement

    make.__name__ = make.__qualname__ = f"make_{name}"
    make.__module__ = owner  # the manifest names it "<owner>:make_<name>"
    return make


def forwarder(name):
    """The factory for DeepGEMM's indexer function ``name`` (see ``make`` below)."""
    def make(original):
        """The replacement reads a call's arguments as ``original`` names them. DeepGEMM 2.8 (vLLM
        0.33's vendored copy) dropped ``clean_logits`` and ``logits_dtype``: ``max_seqlen_k`` is
        the sixth argument of ``fp8_fp4_mqa_logits`` and the logits are never cleaned.
        sgl-deep-gemm defaults ``clean_logits`` to False. So a call's arguments are named by the
        original's signature, with its defaults, and passed on by our names for them
        (``_by_name``); an original without ``clean_logits`` gets uncleaned logits. Originals
        without a Python signature (DeepGEMM's compiled functions) take ours positionally, in the
        same order."""
        ours = getattr(_indexer(), name)
        read = _by_name(original, ours, name)
        never_cleans = (read is not None and "clean_logits" not in signature_of(original).parameters
                        and "clean_logits" in signature_of(ours).parameters)

        @functools.wraps(ours)
        def replacement(*args, **kwargs):
            if read is None:
                return ours(*args, **kwargs)
            kwargs = read(args, kwargs)
            if never_cleans:
                kwargs["clean_logits"] = False
            return ours(**kwargs)

        return replacement

    make.__name__ = f"make_{name}"
    return make


# factory per name, ``make_<name>``, for the DeepGEMM names whose factory the manifest says this
# module makes: what the records install (``FACTORIES[name]``)
FACTORIES = {name: forwarder(name) for name in manifest.wrapped_in(__name__)}


def make_sglang_paged_logits_torch(original):
    """SGLang's paged-logits functions that share the signature of ``fp8_paged_mqa_logits_torch(
    q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
    clean_logits=True)`` (the torch fallbacks, the TileLang kernel): DeepGEMM's argument order, so
    they map onto our kernel; ``seq_lens`` may be [T] or [T, 1] (the originals assert 1-D)."""
    api = _indexer()

    @functools.wraps(original)
    def fp8_paged_mqa_logits_torch(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                   deep_gemm_metadata=None, max_seq_len=None, clean_logits=True):
        if max_seq_len is None:
            max_seq_len = page_table.shape[1] * kvcache_fp8.shape[1]
        return api.fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                        deep_gemm_metadata, max_seq_len, clean_logits=clean_logits)

    return fp8_paged_mqa_logits_torch

"""Route DeepGEMM's lightning-indexer functions to sm12x's Triton kernels on SM12x.

DeepGEMM main builds these kernels for SM90/SM100 only and raises "Unsupported architecture"
(attention.hpp:211) on SM12x; on stock vLLM 0.25.1 a single request past 256K dies with CUDA
error 719 in this path (seed 002). The replacements never call the original: on SM12x it is known
to fail. When no ``deep_gemm`` is installed at all, ``sm12x.shims`` provides a stand-in module with
the same functions, so vLLM's ``has_deep_gemm()`` and SGLang's ``import deep_gemm`` find them.

Consumers: vLLM's ``vllm.utils.deep_gemm`` resolves ``_fp8_fp4_*_impl`` from the module lazily
(``_lazy_init``), after our import-time patch; SGLang looks ``deep_gemm.<name>`` up at call time.
"""
from __future__ import annotations

import functools

from sm12x.patches import Patch, signature_of, takes_args

_API = "sm12x.kernels.deep_gemm_api"
NAMES = ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata",
         "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits")
_WHY = ("DeepGEMM main has no SM120/SM121 indexer kernels: 'Unsupported architecture' "
        "(attention.hpp:211); >256K single requests crash with CUDA error 719 on vLLM 0.25.1")
_FIXED = "DeepGEMM PR #324 (nv_dev branch only, not in main as of 2026-06)"


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


def _factory(name):
    def make(original):
        """The replacement reads a call's arguments as ``original`` names them. DeepGEMM 2.8 (vLLM
        0.33's vendored copy) dropped ``clean_logits`` and ``logits_dtype``: ``max_seqlen_k`` is
        the sixth argument of ``fp8_fp4_mqa_logits`` and the logits are never cleaned.
        sgl-deep-gemm defaults ``clean_logits`` to False. So a call's arguments are named by the
        original's signature, with its defaults, and passed on by our names for them
        (``_by_name``); an original without ``clean_logits`` gets uncleaned logits. Originals
        without a Python signature (DeepGEMM's compiled functions) take ours positionally, in the
        same order."""
        import importlib

        ours = getattr(importlib.import_module(_API), name)
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


for _name in NAMES:
    globals()[f"make_{_name}"] = _factory(_name)

def make_sglang_paged_logits_torch(original):
    """SGLang's paged-logits functions that share the signature of ``fp8_paged_mqa_logits_torch(
    q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
    clean_logits=True)`` (the torch fallbacks, the TileLang kernel): DeepGEMM's argument order, so
    they map onto our kernel; ``seq_lens`` may be [T] or [T, 1] (the originals assert 1-D)."""
    import importlib

    api = importlib.import_module(_API)

    @functools.wraps(original)
    def fp8_paged_mqa_logits_torch(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                   deep_gemm_metadata=None, max_seq_len=None, clean_logits=True):
        if max_seq_len is None:
            max_seq_len = page_table.shape[1] * kvcache_fp8.shape[1]
        return api.fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                        deep_gemm_metadata, max_seq_len, clean_logits=clean_logits)

    return fp8_paged_mqa_logits_torch


# vLLM's wrappers resolve `_<name>_impl` globals from the module once (`_lazy_init`); when that ran
# before us (plugin route) those globals hold the originals and are rebound. The second module is
# the same wrapper file in a later vLLM source layout.
_CONSUMERS = ("vllm.utils.deep_gemm", "vllm.foundation.utilities.deep_gemm")


def _sglang_paged(name, target, why):
    """A patch that sends one of SGLang's own paged-logits functions to our kernel."""
    return Patch(name=name, target=target, make=f"{__name__}:make_sglang_paged_logits_torch",
                 why=why, fixed_in="none known", library="sglang", versions="*")


_WHY_TORCH = ("SGLang's torch fallback for paged MQA logits asserts 1-D seq_lens but gets [T, 1] "
              "under EAGLE/MTP (crashes on the first multi-token batch), and is a slow per-request "
              "loop; on SM12x it is the path SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1 selects")

PATCHES = tuple(
    Patch(name=f"{module}.{name}", target=f"{module}:{name}", make=f"{__name__}:make_{name}",
          why=_WHY, fixed_in=_FIXED, consumers=_CONSUMERS)
    for module in ("deep_gemm", "vllm.third_party.deep_gemm") for name in NAMES
) + tuple(
    _sglang_paged(f"sglang.{era}.indexer.paged_logits_torch",
                  f"sglang.srt.layers.attention.{era}.indexer:fp8_paged_mqa_logits_torch",
                  _WHY_TORCH)
    for era in ("compressed", "dsv4")
) + (
    # SGLang main (2026-07) on SM120 forces its own paged-logits paths for DeepSeek-V4 and never
    # calls DeepGEMM there: server_args sets SGLANG_OPT_USE_TILELANG_INDEXER and
    # SGLANG_FP8_PAGED_MQA_LOGITS_TORCH; dsv4/indexer.py then picks the TileLang kernel, else the
    # vectorised torch version. Both take the torch fallback's arguments.
    _sglang_paged("sglang.dsa.tilelang_paged_logits",
                  "sglang.kernels.ops.attention.dsa.tilelang_kernel:tilelang_fp8_paged_mqa_logits",
                  "SGLang's default DeepSeek-V4 paged indexer on SM120 (TileLang) asserts one query "
                  "token per row, 1-D seq_lens, head_dim 128 and 64-token blocks"),
    _sglang_paged("sglang.dsv4.indexer.paged_logits_torch_sm120",
                  "sglang.srt.layers.attention.dsv4.indexer:fp8_paged_mqa_logits_torch_sm120",
                  "SGLang's SM120 torch paged indexer (chosen when TileLang is off) copies every "
                  "row's pages up to the longest request into bf16 (rows x max_seq_len x 128) on "
                  "each call"),
)

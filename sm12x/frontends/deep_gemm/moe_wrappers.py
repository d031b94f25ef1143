"""How DeepGEMM's grouped-GEMM callers reach sm12x: the factories the ``deep_gemm_moe`` patch
records install. Stdlib only at import.

The grouped GEMMs of DeepGEMM's Python front ends and compiled modules take the same parameters in
the same order as :mod:`sm12x.frontends.deep_gemm.moe`, so a call is passed on as it came, except
for the contiguous layout's M alignment: callers set it on the module they call
(``set_mk_alignment_for_contiguous_layout``; vLLM's ``mk_alignment_scope``) and pad their rows
to it, so each call reads it from that module's own getter and runs with it.
"""
from __future__ import annotations

import functools
import sys

from sm12x.kernels import manifest


def _moe_api():
    """The DeepGEMM-compatible grouped functions (imported on first patch: they need torch)."""
    from sm12x.frontends.deep_gemm import moe

    return moe


def _module_alignment(module_name: str):
    """The M alignment the caller set on ``module_name`` (None when it has no getter). vLLM's
    wrapper module returns [align, align]; DeepGEMM's returns an int."""
    getter = getattr(sys.modules.get(module_name), "get_mk_alignment_for_contiguous_layout", None)
    if getter is None or getattr(getter, "__sm12x_patch__", None):
        return None
    value = getter()
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def factory(module_name: str, name: str):
    """The factory for ``module_name``'s grouped GEMM ``name`` (``make_<name>``): contiguous names
    run under the caller's M alignment, masked ones as they come."""
    return _contiguous_factory(module_name, name) if "contiguous" in name else _masked_factory(name)


def _contiguous_factory(module_name: str, name: str):
    """The factory for ``module_name``'s contiguous grouped GEMM ``name``."""
    def make(original):
        """Calls ours with the caller's arguments, under the M alignment set on the caller's module."""
        api = _moe_api()
        ours = getattr(api, name)

        @functools.wraps(ours)
        def replacement(*args, **kwargs):
            alignment = _module_alignment(module_name)
            if alignment is None:
                return ours(*args, **kwargs)
            with api.mk_alignment(alignment):
                return ours(*args, **kwargs)

        return replacement

    make.__name__ = f"make_{name}"
    return make


def _masked_factory(name: str):
    """The factory for a masked grouped GEMM ``name`` (no alignment involved)."""
    def make(original):
        """Calls ours with the caller's arguments."""
        ours = getattr(_moe_api(), name)

        @functools.wraps(ours)
        def replacement(*args, **kwargs):
            return ours(*args, **kwargs)

        return replacement

    make.__name__ = f"make_{name}"
    return make


# factory per name for the ``deep_gemm`` module's grouped GEMMs, as the manifest lists them
FACTORIES = {name: factory("deep_gemm", name) for name in manifest.wrapped_in(__name__)}

VLLM_VENDORED = "vllm.third_party.deep_gemm"
FP4_CONTIGUOUS = "m_grouped_fp8_fp4_gemm_nt_contiguous"


def _routed(module_name: str, name: str) -> bool:
    """Whether ``module_name.name`` is sm12x's replacement now."""
    fn = getattr(sys.modules.get(module_name), name, None)
    return bool(getattr(fn, "__sm12x_patch__", None))


def make_supports_current_device(original):
    """vLLM's ``DeepGemmFP4Experts._supports_current_device`` on SM12x: True while the grouped
    FP8 x MXFP4 GEMM it calls (the vendored DeepGEMM's) is routed to sm12x, else the original's
    answer (so skipping that route also restores the original backend choice). Called on the
    class, with no arguments."""
    @functools.wraps(original)
    def supports_current_device(*args):
        if _routed(VLLM_VENDORED, FP4_CONTIGUOUS):
            return True
        return original(*args)

    return supports_current_device

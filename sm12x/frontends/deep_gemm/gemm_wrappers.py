"""How DeepGEMM's dense-GEMM callers reach sm12x: the factories the ``deep_gemm_dense`` patch
records install.

Each replacement reads a call by the installed function's own signature (DeepGEMM's compiled
functions take ours positionally, in the same order; a Python front end with other parameter
names, such as DeepGEMM 1.x's ``lhs`` / ``rhs`` / ``out``, is read by position where the names
differ) and passes it on to :mod:`sm12x.frontends.deep_gemm.gemm`. Stdlib only at import.
"""
from __future__ import annotations

import functools

from sm12x.frontends.deep_gemm.wrappers import _by_name
from sm12x.kernels import manifest

# the DeepGEMM names whose factory the manifest says this module makes
NAMES = manifest.wrapped_in(__name__)


def _gemm_api():
    """The DeepGEMM-compatible dense functions (imported on first patch: they need torch)."""
    from sm12x.frontends.deep_gemm import gemm

    return gemm


def forwarder(name):
    """The factory for DeepGEMM's dense function ``name``: a replacement that reads the call by
    the original's signature and calls :mod:`sm12x.frontends.deep_gemm.gemm`'s ``name``."""
    def make(original):
        """The replacement reads each call as ``original`` names its parameters (defaults
        included) and calls ours by our names; an original without a Python signature takes
        ours positionally."""
        ours = getattr(_gemm_api(), name)
        read = _by_name(original, ours, name)

        @functools.wraps(ours)
        def replacement(*args, **kwargs):
            if read is None:
                return ours(*args, **kwargs)
            return ours(**read(args, kwargs))

        return replacement

    make.__name__ = f"make_{name}"
    return make


# factory per name, ``make_<name>``: what the records install (``FACTORIES[name]``)
FACTORIES = {name: forwarder(name) for name in NAMES}

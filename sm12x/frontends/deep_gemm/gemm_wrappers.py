"""How DeepGEMM's dense-GEMM callers reach sm12x: the factories the ``deep_gemm_dense`` patch
records install.

Each replacement reads a call by the installed function's own signature (DeepGEMM's compiled
functions take ours positionally, in the same order; a Python front end with other parameter
names, such as DeepGEMM 1.x's ``lhs`` / ``rhs`` / ``out``, is read by position where the names
differ) and passes it on to :mod:`sm12x.frontends.deep_gemm.gemm`. Stdlib only at import.
"""
from __future__ import annotations

from sm12x.frontends.deep_gemm.wrappers import by_signature
from sm12x.kernels import manifest

# the DeepGEMM names whose factory the manifest says this module makes
NAMES = manifest.wrapped_in(__name__)

# factory per name, ``make_<name>``: what the records install (``FACTORIES[name]``)
FACTORIES = {name: by_signature("sm12x.frontends.deep_gemm.gemm", name, __name__) for name in NAMES}

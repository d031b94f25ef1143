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

from sm12x.patches import Patch

_API = "sm12x.kernels.deep_gemm_api"
NAMES = ("fp8_mqa_logits", "fp8_fp4_mqa_logits", "get_paged_mqa_logits_metadata",
         "fp8_paged_mqa_logits", "fp8_fp4_paged_mqa_logits")
_WHY = ("DeepGEMM main has no SM120/SM121 indexer kernels: 'Unsupported architecture' "
        "(attention.hpp:211); >256K single requests crash with CUDA error 719 on vLLM 0.25.1")
_FIXED = "DeepGEMM PR #324 (nv_dev branch only, not in main as of 2026-06)"


def _factory(name):
    def make(original):
        import importlib

        ours = getattr(importlib.import_module(_API), name)

        @functools.wraps(ours)
        def replacement(*args, **kwargs):
            return ours(*args, **kwargs)

        return replacement

    make.__name__ = f"make_{name}"
    return make


for _name in NAMES:
    globals()[f"make_{_name}"] = _factory(_name)

PATCHES = tuple(
    Patch(name=f"{module}.{name}", target=f"{module}:{name}", make=f"{__name__}:make_{name}",
          why=_WHY, fixed_in=_FIXED)
    for module in ("deep_gemm", "vllm.third_party.deep_gemm") for name in NAMES
)

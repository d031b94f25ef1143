"""The factory the vLLM DeepGEMM gate record installs (:mod:`sm12x.patches.deep_gemm_dense`).
Stdlib only at import.

vLLM 0.24.0's ``CudaPlatformBase.support_deep_gemm()`` (a classmethod, read by
``vllm.utils.deep_gemm.is_deep_gemm_supported`` for every DeepGEMM choice: FP8 linears and their
weight post-processing, the MoE experts, the kernel warmup, the mHC pre-norm) answers yes for the
SM120 family (vllm #43477), while the DeepGEMM that 0.24.0 vendors (2.5.0, commit 891d57b4) has no
SM120 kernels: every one of those paths stops on SM12x (``Unknown SF transformation`` at weight
loading, ``Unknown recipe`` in the warmup; vllm #47130, #47436). 0.23.0 answered no there, and
0.25.0 vendors a DeepGEMM with SM120 kernels. The replacement gives 0.23.0's answer on the SM120
family, so vLLM takes its own non-DeepGEMM kernels there as 0.23.0 does, and sm12x's records for
the DeepGEMM calls vLLM makes regardless of the gate (DeepSeek-V4's ``fp8_einsum``, the indexer
logits) serve those.
"""
from __future__ import annotations

import functools


def make_support_deep_gemm(original):
    """``support_deep_gemm(cls)`` answering no on the SM120 family (``cls.is_device_capability_family(120)``,
    vLLM's own capability query, so no CUDA call of ours), the original's answer everywhere else.
    ``original`` is the classmethod as read from the class (a bound method): its function is called
    with the class the call came through, so that a subclass's capability query (NVML) is used."""
    function = getattr(original, "__func__", original)

    @functools.wraps(original)
    def support_deep_gemm(cls):
        answer = function(cls)
        family = getattr(cls, "is_device_capability_family", None)
        if answer and family is not None and family(120):
            return False
        return answer

    return support_deep_gemm

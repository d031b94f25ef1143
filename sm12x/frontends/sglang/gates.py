"""The factories the GB10 (sm_121) gate records install for SGLang (:mod:`sm12x.patches.gb10`).
Stdlib only at import.

SGLang 0.5.15.post1 and 0.5.19 decide once, while ``sglang.srt.layers.deep_gemm_wrapper.configurer``
is being imported, whether SGLang uses DeepGEMM at all: ``_compute_enable_deep_gemm`` asks
``get_device_sm()`` (major * 10 + minor) and turns DeepGEMM off for 120 only. Its result is a module
constant (``ENABLE_JIT_DEEPGEMM``) copied by the wrapper package, so the question has to be answered
while it is asked: ``get_device_sm`` itself is wrapped (in ``sglang.srt.utils.common``, before the
configurer imports it) and answers 120 for 121 to that one caller; every other caller keeps 121.
"""
from __future__ import annotations

import functools
import sys

CONFIGURER = "sglang.srt.layers.deep_gemm_wrapper.configurer"
DEEP_GEMM_GATE = "_compute_enable_deep_gemm"
GB10_SM, SM120 = 121, 120


def asked_by_deep_gemm_gate(frame) -> bool:
    """Whether ``frame`` is the configurer's ``_compute_enable_deep_gemm``."""
    return (frame is not None and frame.f_code.co_name == DEEP_GEMM_GATE
            and frame.f_globals.get("__name__") == CONFIGURER)


def make_get_device_sm(original):
    """``get_device_sm()`` as SGLang's DeepGEMM gate should see GB10: 120 where the original says
    121 and the caller is ``_compute_enable_deep_gemm``; the original's answer everywhere else."""

    @functools.wraps(original)
    def get_device_sm():
        sm = original()
        if sm == GB10_SM and asked_by_deep_gemm_gate(sys._getframe(1)):
            return SM120
        return sm

    return get_device_sm

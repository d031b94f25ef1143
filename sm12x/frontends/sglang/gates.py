"""The factories the GB10 (sm_121) gate records install for SGLang (:mod:`sm12x.patches.gb10`).
Stdlib only at import.

SGLang 0.5.15-0.5.20 decide once, while ``sglang.srt.layers.deep_gemm_wrapper.configurer`` is
being imported, how SGLang uses DeepGEMM, from ``get_device_sm()`` (major * 10 + minor) compared with
120 only: whether DeepGEMM is on at all (``_compute_enable_deep_gemm``; 0.5.15-0.5.19 turn it
off for 120, 0.5.20 keeps it on for 120 when DeepGEMM has its SM120 entry point) and, in 0.5.20,
whether its scales are UE8M0 (a module-level constant). The answers are module constants
(``ENABLE_JIT_DEEPGEMM``, ``DEEPGEMM_SCALE_UE8M0``) copied by the wrapper package, so the question
has to be answered while it is asked: ``get_device_sm`` itself is wrapped (in
``sglang.srt.utils.common``, before the configurer imports it) and answers 120 for 121 to the
configurer; every other caller keeps 121.
"""
from __future__ import annotations

import functools
import sys

CONFIGURER = "sglang.srt.layers.deep_gemm_wrapper.configurer"
GB10_SM, SM120 = 121, 120


def asked_by_configurer(frame) -> bool:
    """Whether ``frame`` runs the configurer's code (its gate function or its module body)."""
    return frame is not None and frame.f_globals.get("__name__") == CONFIGURER


def make_get_device_sm(original):
    """``get_device_sm()`` as SGLang's DeepGEMM configurer should see GB10: 120 where the original
    says 121 and the configurer asks; the original's answer everywhere else."""

    @functools.wraps(original)
    def get_device_sm():
        sm = original()
        if sm == GB10_SM and asked_by_configurer(sys._getframe(1)):
            return SM120
        return sm

    return get_device_sm

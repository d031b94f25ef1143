"""The framework frame that called a replacement, for front ends that decide by their caller's code
(``sys._getframe(1)``): past the runtime guard's wrapper (:mod:`sm12x.guard`), which sits between
the framework and every replacement that runs an sm12x op. Stdlib only, imports nothing of sm12x."""
from __future__ import annotations

import sys

# code objects of the guard's wrappers (filled by sm12x.guard when it wraps its first replacement)
WRAPPER_CODES: set = set()


def caller(depth: int = 1):
    """The frame ``depth`` levels above the function that calls this (1: its caller), not
    counting guard wrappers."""
    frame = sys._getframe(depth + 1)
    while frame is not None and frame.f_code in WRAPPER_CODES:
        frame = frame.f_back
    return frame

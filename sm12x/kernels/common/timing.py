"""Timing one call for the self-test."""
from __future__ import annotations

import time


def time_us(fn, device, iters=20):
    """Median µs per call: CUDA events on a GPU; one wall-clock call on the CPU interpreter (where
    the figure means nothing)."""
    import torch

    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]

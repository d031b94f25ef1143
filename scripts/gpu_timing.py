"""GPU timing shared by the benchmark and tuning scripts."""
import json
import os
import statistics
import tempfile
import warnings

import torch

FLUSH_BYTES = 512 * 1024 * 1024  # > L2 (50-60 MB on H200, 128 MB on RTX PRO 6000)
TRACED = ("kernel", "gpu_memset", "gpu_memcpy")  # trace categories that are GPU work


def time_us(fn, iters=20):
    """GPU time per call: ``iters`` calls captured in one CUDA graph, replayed (median of 5), so
    host overhead (argument checks, launch) is not counted."""
    run = graphed(fn, calls=iters)
    run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / iters)
    return sorted(ts)[2]


def graphed(fn, calls=1):
    """``calls`` calls of ``fn`` captured in one CUDA graph; returns the graph's replay."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


def kernel_span_us(fn, iters=30, flush=True):
    """Mean µs per call from the start of a call's first GPU kernel to the end of its last, read
    from a profiler trace (``fn`` is replayed from a CUDA graph, so host launch time does not
    open gaps between its kernels). With ``flush`` a 512 MB pass evicts L2 before every call.
    This is how FlashMLA's and DeepGEMM's own test harnesses time kernels (kernel time, L2
    flushed), so it is the figure to hold against theirs; ``time_us`` also counts the launch gaps."""
    run = graphed(fn)
    scratch = torch.empty(FLUSH_BYTES if flush else 16, dtype=torch.uint8, device="cuda")

    def separator():  # a kernel no call of ours launches: it marks where each call starts
        torch.bitwise_not(scratch, out=scratch)

    run()
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch warns that events are cleared per cycle: one cycle here
        warnings.simplefilter("ignore", UserWarning)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                separator()
                run()
            separator()
            torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.unlink(path)
    work = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") in TRACED)
    spans, first, last = [], None, None
    for start, end, name in work:
        if "bitwise_not" in name:
            if first is not None:
                spans.append(last - first)
            first = last = None
        else:
            first = start if first is None else first
            last = end if last is None else max(last, end)
    if len(spans) != iters:
        raise RuntimeError(f"kernel_span_us: found {len(spans)} calls in the profiler trace, expected {iters}")
    return statistics.mean(spans)

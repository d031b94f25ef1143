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


def median_us(run, iters, flush=True):
    """Median µs of ``iters`` calls of ``run`` between CUDA events; with ``flush`` a 512 MB write
    evicts L2 before every call (as FlashMLA's and DeepGEMM's harnesses do)."""
    scratch = torch.empty(FLUSH_BYTES if flush else 16, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(iters):
        if flush:
            scratch.zero_()  # evict L2 (50-60 MB on H200 / 128 MB on RTX PRO 6000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


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


def traced_calls(fn, iters=30, flush=True):
    """GPU work of ``iters`` calls of ``fn`` replayed from a CUDA graph under the profiler: one
    list per call of (start µs, end µs, name) of its kernels, memsets and copies. With ``flush``
    a 512 MB pass evicts L2 before every call."""
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
    return calls_in_trace(events, iters)


def calls_in_trace(events, iters):
    """Chrome-trace ``events`` of ``traced_calls`` -> one list per call of (start, end, name) of
    its GPU work (the work between two separator kernels)."""
    work = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") in TRACED)
    calls, current = [], None
    for item in work:
        if "bitwise_not" in item[2]:
            if current:
                calls.append(current)
            current = []
        elif current is not None:
            current.append(item)
    if len(calls) != iters:
        raise RuntimeError(f"traced_calls: found {len(calls)} calls in the profiler trace, "
                           f"expected {iters}")
    return calls


def kernel_span_us(fn, iters=30, flush=True):
    """Mean µs per call from the start of a call's first GPU kernel to the end of its last, read
    from a profiler trace (``traced_calls``: CUDA-graph replays, so host launch time does not
    open gaps between its kernels; with ``flush`` L2 is evicted before every call).
    This is how FlashMLA's and DeepGEMM's own test harnesses time kernels (kernel time, L2
    flushed), so it is the figure to hold against theirs; ``time_us`` also counts the launch gaps."""
    calls = traced_calls(fn, iters, flush)
    return statistics.mean(max(end for _, end, _ in call) - call[0][0] for call in calls)

"""Time the radix-select row top-k (``topk_select.row_topk_keys``) against ``torch.topk`` on rows
shaped like the indexer's windows: one program per row versus SEGMENT-column segments.

    python scripts/bench_topk_select.py

GPU time from ``triton.testing.do_bench``; fp32 ``randn`` rows."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton

from sm12x.kernels.indexer import topk_select

CASES = [(1, 1 << 20, 2048), (2, 1 << 20, 512), (8, 262144, 512), (64, 65536, 2048),
         (256, 262144, 512)]


def main():
    if not torch.cuda.is_available():
        raise SystemExit("bench_topk_select: needs a CUDA GPU")
    print(f"# row_topk_keys, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}\n")
    print("| rows x columns, k | one program per row (us) | segments of "
          f"{topk_select.SEGMENT} (us) | torch.topk (us) |\n|---|---:|---:|---:|")
    default = topk_select.SEGMENT
    for r, w, k in CASES:
        x = torch.randn(r, w, device="cuda")
        times = []
        for segment in (1 << 30, default):  # 1 << 30: every row is one segment
            topk_select.SEGMENT = segment
            times.append(triton.testing.do_bench(lambda: topk_select.row_topk_keys(x, k)) * 1e3)
        topk_select.SEGMENT = default
        t = triton.testing.do_bench(lambda: x.topk(k, dim=1)) * 1e3
        print(f"| {r} x {w}, k={k} | {times[0]:.0f} | {times[1]:.0f} | {t:.0f} |", flush=True)


if __name__ == "__main__":
    main()

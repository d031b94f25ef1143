"""Benchmark sm12x's sparse MLA prefill (FlashMLA ``flash_mla_sparse_fwd``, bf16 rows) here.

Prints a markdown table: time per call, TFLOPS as FlashMLA counts them (2 * s_q * h_q * topk *
(d_qk + d_v), every listed key), the PyTorch reference's time and whether the output matches it
at FlashMLA's prefill tolerances. Needs a CUDA GPU (on an H200, SM12X_FORCE=1 is not needed: the
kernel is called directly).

  python scripts/bench_sparse_mla_prefill.py [--quick] [--arch sm_120] [--no-ref]
"""
import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (name, d_qk, s_q, h_q, topk, s_kv, topk_length)
CASES = [
    ("V4 h64 512+128 window", 512, 4096, 64, 640, 65536, True),
    ("V4 h128 1024+128 window", 512, 4096, 128, 1152, 65536, True),
    ("V3.2 h128 top-2048", 576, 4096, 128, 2048, 131072, False),
    ("V3.2 h64 top-2048 (TP2)", 576, 4096, 64, 2048, 131072, False),
    ("V4 h64, 16 query tokens", 512, 16, 64, 640, 65536, True),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first and third case only")
    ap.add_argument("--no-ref", action="store_true", help="skip the PyTorch reference")
    ap.add_argument("--arch", help="force a config set (sets SM12X_KERNEL_CONFIGS)")
    args = ap.parse_args()
    if args.arch:
        os.environ["SM12X_KERNEL_CONFIGS"] = args.arch

    import torch
    import triton

    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("bench_sparse_mla_prefill: needs a CUDA GPU; nothing was measured.", file=sys.stderr)
        return 2

    from gpu_timing import time_us
    from sm12x.kernels.common import configs
    from sm12x.kernels.sparse_mla.reference import make_prefill_case, ref_sparse_mla_prefill
    from sm12x.kernels.sparse_mla.decode import plan
    from sm12x.kernels.sparse_mla.prefill import sparse_mla_prefill
    from sm12x.kernels.common.tolerance import failures, flashmla_prefill_close

    dev = torch.device("cuda")
    print("# sm12x sparse MLA prefill benchmark\n")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"- GPU: {torch.cuda.get_device_name()} ({configs.sm_count(dev)} SMs, config set "
          f"{configs.arch_key(dev)})")
    print(f"- torch {torch.__version__}, triton {triton.__version__}")
    print("- timing: CUDA-graph replay of 20 calls, median of 5 (L2 warm; the inputs exceed it "
          "except the 16-token case); reference timed the same way\n")
    print("| case | d_qk | s_q | h_q | topk | config | µs | TFLOPS | ref µs | speed-up | "
          "matches ref |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [CASES[0], CASES[2]] if args.quick else CASES
    failed = False
    for name, d_qk, s_q, h_q, topk, s_kv, with_len in cases:
        case = make_prefill_case(d_qk, s_q, h_q, topk, s_kv, with_len, device="cuda", seed=1)
        cfg = plan(s_q, 1, h_q, topk, 0, dev, num_splits=1, fmt=f"bf16_{d_qk}").cfg
        us = time_us(lambda: sparse_mla_prefill(**case))
        flops = 2 * s_q * h_q * topk * (d_qk + 512)
        ref_us, ok = float("nan"), "-"
        if not args.no_ref:
            ref_us = time_us(lambda: ref_sparse_mla_prefill(**case), iters=3)
            bad = failures(flashmla_prefill_close(sparse_mla_prefill(**case),
                                                  ref_sparse_mla_prefill(**case)))
            ok = f"NO ({bad})" if bad else "yes"
            failed |= bool(bad)
        print(f"| {name} | {d_qk} | {s_q} | {h_q} | {topk} | H{cfg['BLOCK_H']} N{cfg['BLOCK_N']} "
              f"w{cfg['num_warps']} | {us:.1f} | {flops / us / 1e6:.1f} | {ref_us:.0f} | "
              f"{ref_us / us:.1f}x | {ok} |", flush=True)
        del case
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

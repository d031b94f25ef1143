"""The indexer logits' weighted head sum on the CUDA cores (a max and an FMA per key and head) vs
as a second MMA (config key ``head_mma``: relu(q.k) rounded to bf16 times a matrix of the weights'
bf16 halves), in the prefill and paged decode kernels, on ``bench_indexer.py``'s inputs. Each
variant patches the picked configuration in place and must agree with the first variant to
DeepGEMM's calc_diff < 1e-5 ("DIFFERS" otherwise). Prints TFLOPS / GB/s as markdown.

    python scripts/tune_head_mma.py [--skip-prefill] [--skip-paged]   # the GPU's own configs
    SM12X_KERNEL_CONFIGS=sm_120 python scripts/tune_head_mma.py
"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import torch  # noqa: E402
import triton  # noqa: E402

from sm12x.kernels import configs  # noqa: E402
from tune_logits_variants import agree, prefill_table  # noqa: E402
from tune_tma import paged_table  # noqa: E402

PREFILL = [("CUDA-core sum, BLOCK_N 128", {"head_mma": False, "BLOCK_N": 128, "rows": 128}),
           ("CUDA-core sum, BLOCK_N 64", {"head_mma": False, "BLOCK_N": 64, "rows": 128}),
           ("head MMA, BLOCK_N 64", {"head_mma": True, "BLOCK_N": 64, "rows": 128}),
           ("head MMA, BLOCK_N 64, 256 rows", {"head_mma": True, "BLOCK_N": 64, "rows": 256}),
           ("head MMA, BLOCK_N 64, 256 rows, 4 stages",
            {"head_mma": True, "BLOCK_N": 64, "rows": 256, "num_stages": 4})]
PAGED = [("CUDA-core sum", {"head_mma": False}),
         ("head MMA", {"head_mma": True}),
         ("head MMA, 3 stages", {"head_mma": True, "num_stages": 3, "pair_stages": 3}),
         # next_n 2: both tokens' heads in one dot (128 rows) instead of a dot per token
         ("CUDA-core sum, 128 rows", {"head_mma": False, "rows": 128, "pair": False}),
         ("head MMA, 128 rows", {"head_mma": True, "rows": 128, "pair": False})]


def main():
    if not torch.cuda.is_available():
        raise SystemExit("tune_head_mma: needs a CUDA GPU")
    dev = torch.device("cuda")
    print(f"# Head sum on CUDA cores vs MMA, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()}, configs {configs.arch_key(dev)}, torch {torch.__version__}, "
          f"triton {triton.__version__}\n")
    if "--skip-prefill" not in sys.argv:
        prefill_table(dev, PREFILL)
    if "--skip-paged" not in sys.argv:
        print()
        paged_table(dev, PAGED, ((256, 8192), (256, 65536), (1024, 8192), (4096, 8192), (4, 65536)), agree,
                    "paged (GB/s)")


if __name__ == "__main__":
    main()

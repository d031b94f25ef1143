"""Time edited copies of the sparse MLA decode module against the module as it is, case by case:
the table the decode probes print. Per case, the span of each variant (profiler trace of
CUDA-graph replays, L2 flushed, best of two) and whether it matches the reference within
FlashMLA's tolerances."""
import tempfile

import torch
import triton

from gpu_timing import kernel_span_us
from source_variant import edited_module
from sm12x.kernels.common import configs
from sm12x.kernels.sparse_mla import decode as base
from sm12x.kernels.sparse_mla.reference import make_case, ref_sparse_mla_decode
from sm12x.kernels.common.tolerance import failures, flashmla_decode_close


def config_key() -> str:
    """The config set the decode takes on this GPU (sm_121 runs sm_120's)."""
    key = configs.arch_key(torch.device("cuda"))
    return "sm_120" if key == "sm_121" else key


def compare(variants: dict, cases: list) -> None:
    """``variants``: name -> source edits of the module (``source_variant``); ``cases``: (label,
    ``make_case`` keyword arguments; s_q 2 unless given). Prints a markdown table."""
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"configs {config_key()}")
    built = [(label, make_case(device="cuda", sink=True, **{"s_q": 2, **kw})) for label, kw in cases]
    with tempfile.TemporaryDirectory() as tmp:
        mods = {name: edited_module(open(base.__file__).read(), edits, f"variant_{i}", tmp)
                for i, (name, edits) in enumerate(variants.items())}
        print("\n| case | plan (as is) | " + " | ".join(f"{n} µs" for n in mods) + " |")
        print("|---|---|" + "---:|" * len(mods))
        checks = []
        for label, case in built:
            pl = base.plan(*case["q"].shape[:3], case["indices"].shape[-1],
                           case["extra_indices"].shape[-1], case["q"].device,
                           ragged=case.get("extra_topk_length") is not None)
            ref = ref_sparse_mla_decode(**case)
            row = []
            for name, mod in mods.items():
                bad = failures(flashmla_decode_close(mod.sparse_mla_decode(**case), ref))
                if bad:
                    checks.append(f"{name} {label}: {bad}")
                call = lambda: mod.sparse_mla_decode(**case)  # noqa: E731
                row.append(f"{min(kernel_span_us(call) for _ in range(2)):.1f}")
            print(f"| {label} | H{pl.cfg['BLOCK_H']} {pl.programs}p | " + " | ".join(row) + " |", flush=True)
        print("\nall variants match the reference on every case" if not checks else "\n".join(checks))

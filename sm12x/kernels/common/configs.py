"""Which per-architecture launch configuration a kernel call uses.

Every kernel module keeps a dict ``{"sm_120": ..., "sm_90": ...}`` of launch configurations.
``arch_key(device)`` picks the key for the device a call runs on:

- ``SM12X_KERNEL_CONFIGS=sm_120|sm_121|sm_90`` forces a key (how the sm_120 configurations are run
  for correctness on a GPU that is not SM12x);
- a CUDA device of compute capability 12.x gives ``sm_120`` (``sm_121`` for 12.1), 9.x ``sm_90``;
- any other CUDA device and the CPU (Triton interpreter) use the ``sm_120`` configurations, the most
  constrained ones (101,376 B of shared memory per block).

This is only called inside kernel launches, after the framework initialised CUDA.
"""
from __future__ import annotations

import functools
import os

KEYS = ("sm_120", "sm_121", "sm_90")


@functools.lru_cache(maxsize=None)
def _cuda_arch_key(index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    if major == 12:
        return "sm_121" if minor == 1 else "sm_120"
    if major == 9:
        return "sm_90"
    return "sm_120"


def arch_key(device) -> str:
    forced = os.environ.get("SM12X_KERNEL_CONFIGS", "").strip()
    if forced:
        if forced not in KEYS:
            raise ValueError(f"SM12X_KERNEL_CONFIGS={forced!r}: supported values are {', '.join(KEYS)}")
        return forced
    if getattr(device, "type", "cpu") != "cuda":
        return "sm_120"
    index = device.index if device.index is not None else __import__("torch").cuda.current_device()
    return _cuda_arch_key(index)


def for_target(configs: dict, key: str):
    """The configuration for arch key ``key``; ``sm_121`` falls back to ``sm_120`` when it has none."""
    if key not in configs and key == "sm_121":
        key = "sm_120"
    return configs[key]


def pick(configs: dict, device):
    """The configuration for ``device`` (``for_target`` of its ``arch_key``)."""
    return for_target(configs, arch_key(device))


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device) -> int:
    """Streaming multiprocessors of ``device``; 188 (RTX PRO 6000 class) on the CPU interpreter,
    or ``SM12X_NUM_SMS`` when set (lets tests and benchmarks model another GPU)."""
    forced = os.environ.get("SM12X_NUM_SMS", "").strip()
    if forced:
        return int(forced)
    if getattr(device, "type", "cpu") != "cuda":
        return 188
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def fit_iters(n_iters: int, tiles: int, row_programs: int, device, per_sm: int = 4,
              min_iters: int = 1) -> int:
    """Tiles per program for a grid of ``row_programs`` x cdiv(tiles, n_iters): ``n_iters``
    halved until the grid holds ``per_sm`` programs per SM (or it reaches ``min_iters``), so long
    chunks (which amortise each program's set-up) do not leave SMs idle or a long tail."""
    sms = sm_count(device)
    while n_iters > min_iters and row_programs * -(-tiles // n_iters) < per_sm * sms:
        n_iters //= 2
    return max(n_iters, 1)

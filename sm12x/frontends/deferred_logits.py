"""Indexer logits that are never materialised.

Where a framework computes the indexer logits with one call and hands them straight to its top-k
with the next, with no other reader in between, both calls are replaced: the logits call returns a
placeholder of the promised shape ([rows, width] float32, one NaN element expanded, 4 bytes of
storage) that carries a closure over the call's inputs; the top-k call finds the closure and runs
the fused logits -> top-k (:mod:`sm12x.kernels.indexer.fused_topk`) into the framework's own index
buffer. Memory is then O(rows x topk) plus the fused op's bounded workspace, whatever the width.

A placeholder reaching any other reader would be read as NaN logits, so a front end defers only
where the source of the release it was checked on shows a single top-k reader (each patch record
names the release range), and computes real logits otherwise (e.g. when vLLM's DCP merge reads
them).
"""
from __future__ import annotations

import torch

_ATTR = "_sm12x_fused_topk"
_STATE = "_sm12x_deferred_state"


def placeholder(rows: int, width: int, device, compute, state: dict | None = None) -> torch.Tensor:
    """A [rows, width] float32 tensor without storage of its own that carries ``compute``
    (``compute(topk, out, **call)`` writes int32 indices into ``out``) and ``state``, a dict
    that readers between the logits call and the top-k (DeepSeek-V4.1's candidate-block select /
    mask) fill for ``compute`` to read."""
    logits = torch.full((), float("nan"), dtype=torch.float32, device=device).expand(rows, width)
    setattr(logits, _ATTR, compute)
    setattr(logits, _STATE, state if state is not None else {})
    return logits


def pending(logits):
    """The closure a placeholder carries, or None for real logits."""
    return getattr(logits, _ATTR, None)


def state(logits):
    """The state dict a placeholder carries, or None for real logits."""
    return getattr(logits, _STATE, None)

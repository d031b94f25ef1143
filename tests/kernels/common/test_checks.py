"""Validation helpers: messages name the op and argument, and lazy texts are rendered."""
import pytest
import torch

from sm12x.kernels.common import checks
from sm12x.frontends.deep_gemm.indexer import fp8_paged_mqa_logits


def test_lazy_texts_are_formatted_only_on_failure():
    calls = []

    def got():
        calls.append(1)
        return "shape [3]"

    checks.require(True, "op", "x", got, lambda: "never")
    assert calls == []
    with pytest.raises(ValueError, match=r"sm12x op: argument 'x' got shape \[3\]; supported: \[2\]"):
        checks.require(False, "op", "x", got, lambda: "[2]")


def test_paged_cache_stride_message_is_text():
    q = torch.zeros(1, 1, 64, 128).to(torch.float8_e4m3fn)
    cache = torch.zeros(2, 64, 1, 136, dtype=torch.uint8)[:, :, :, :132]  # stride(1) 136 != 132
    with pytest.raises(ValueError, match=r"kv_cache' got strides \("):
        fp8_paged_mqa_logits(q, cache, torch.zeros(1, 64), torch.ones(1, 1, dtype=torch.int32),
                             torch.zeros(1, 2, dtype=torch.int32), None, 64)

"""Which sparse MLA decode path serves, by ``SM12X_ATTENTION_PRECISION`` (exact | fast; default
exact). Pure Python (no torch, Triton or CUDA): ``sm12x status`` reads it too.

- ``exact``: the cache's FP8 rows dequantised to bf16 in registers (exact: the scales are powers
  of two), bf16 MMAs with float32 accumulation.
- ``fast``: on SM12x, sparse decode on both FP8 caches through block-scaled MXFP8 MMAs on the
  cache's e4m3 bytes (:mod:`sm12x.kernels.sparse_mla.decode_mxfp8`), and the sparse prefill
  through the same kernel after packing its bf16 rows into that cache layout
  (:mod:`sm12x.kernels.sparse_mla.prefill_mxfp8`). Opt-in until it is measured faster than the
  exact path on SM12x and its cosine difference against the float32 reference is <= 1e-4 on
  every production case (``scripts/bench_sparse_mla_precision.py [--prefill]``); the
  performance model puts both below the exact path on the RTX PRO 6000 and RTX 5090 today
  (docs/performance.md, "Sparse MLA precision").

The V4 "MODEL1" cache stores one UE8M0 byte per 64 values, which the block-scaled MMA takes as it
is. V3.2 / GLM caches carry float32 scales per 128 values, which frameworks may write as
amax / 448 (not powers of two): there each 128-wide group runs as unit-scale MMAs whose logits the
float32 scale multiplies afterwards, and the scale is folded into W on the PV side, so any scale
is read at full float32 precision (the exact path rounds each dequantised value to bf16). The
sparse prefill's bf16 rows are packed with power-of-two scales per group (the rule the cache
writers use): rows read back from an FP8 cache, what frameworks pass where the KV cache is FP8,
pack exactly; other bf16 rows are rounded to e4m3 (cosine difference about 3e-4 on FlashMLA's
random test rows).
"""
from __future__ import annotations

import os

PRECISIONS = ("exact", "fast")
DEFAULT = "exact"


def attention_precision() -> str:
    """The ``SM12X_ATTENTION_PRECISION`` setting; a value other than exact / fast raises a
    one-line ValueError naming the variable."""
    value = os.environ.get("SM12X_ATTENTION_PRECISION", "").strip() or DEFAULT
    if value not in PRECISIONS:
        raise ValueError(f"SM12X_ATTENTION_PRECISION={value!r}: supported values are exact, fast")
    return value


def native_mxfp8(capability, triton_version) -> bool:
    """Triton lowers ``tl.dot_scaled`` to the hardware block-scaled MMA on this GPU: 12.0; 12.1
    from Triton 3.8."""
    if not capability or capability[0] != 12:
        return False
    if capability[1] == 0:
        return True
    try:
        parts = tuple(int("".join(c for c in p if c.isdigit()) or 0)
                      for p in str(triton_version).split("+")[0].split(".")[:2])
    except Exception:
        return False
    return parts >= (3, 8)


def serving(capability, triton_version) -> str:
    """One line for ``sm12x status``: the precision set and what serves sparse MLA decode."""
    try:
        value = attention_precision()
    except ValueError as e:
        return f"invalid: {e}; decode calls will raise"
    if value == "exact":
        return "exact (SM12X_ATTENTION_PRECISION unset or exact): bf16 MMAs on dequantised rows"
    if native_mxfp8(capability, triton_version):
        return ("fast: sparse MLA decode (V4 and V3.2 / GLM caches) and prefill through block-scaled "
                "MXFP8 MMAs")
    return ("fast requested, exact serves: no native block-scaled MMA here (SM12x only; GB10 "
            "needs Triton >= 3.8)")

"""Comparison criteria of the libraries we replace, as functions that return a verdict (used by
the self-test; tests assert on them).

- ``flashmla_close``: FlashMLA's decode test criterion: +-inf at the same places, no NaN, every
  element within ``abs_tol`` OR ``rel_tol``, cosine difference at most ``cos_tol``.
- ``flashmla_prefill_close``: the same criterion for the three results of the sparse prefill.
- ``deepgemm_diff``: DeepGEMM's ``calc_diff`` (1 - 2<x,y>/(|x|^2+|y|^2)) on finite entries.
"""
from __future__ import annotations

from dataclasses import dataclass

FLASHMLA_OUT = dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_tol=5e-6)
FLASHMLA_LSE = dict(abs_tol=1e-6, rel_tol=8.01 / 65536, cos_tol=0.0)
# FlashMLA's sparse prefill test (tests/test_flash_mla_sparse_prefill.py): out against the fp32
# reference; max_logits and lse with their own bounds.
FLASHMLA_PREFILL_OUT = dict(abs_tol=8e-4, rel_tol=3.01 / 128, cos_tol=7e-6)
FLASHMLA_PREFILL_STATS = dict(abs_tol=1e-6, rel_tol=2.01 / 65536, cos_tol=0.0)


@dataclass
class Verdict:
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def flashmla_close(ans, ref, abs_tol, rel_tol, cos_tol) -> Verdict:
    if ans.shape != ref.shape:
        return Verdict(False, float("nan"), float("nan"), f"shape {tuple(ans.shape)} vs {tuple(ref.shape)}")
    ans, ref = ans.double().clone(), ref.double().clone()
    for special in (float("inf"), float("-inf")):
        a, r = ans == special, ref == special
        if not bool((a == r).all()):
            return Verdict(False, float("inf"), float("inf"),
                           f"{special} at {int(a.sum())} places vs {int(r.sum())} in reference")
        ans[a], ref[r] = 0.0, 0.0
    if bool(ans.isnan().any()) or bool(ref.isnan().any()):
        where = "output" if bool(ans.isnan().any()) else "reference"
        return Verdict(False, float("nan"), float("nan"), f"NaN in {where}")
    err = (ans - ref).abs()
    rel = err / (ref.abs() + 1e-6)
    max_abs = float(err.max()) if err.numel() else 0.0
    max_rel = float(rel.max()) if rel.numel() else 0.0
    bad = (err >= abs_tol) & (rel >= rel_tol)
    if bool(bad.any()):
        return Verdict(False, max_abs, max_rel, f"{int(bad.sum())}/{bad.numel()} elements off")
    denom = float((ans * ans + ref * ref).sum())
    cos_diff = 0.0 if denom == 0 else 1 - 2 * float((ans * ref).sum()) / denom
    if cos_tol and cos_diff > cos_tol:
        return Verdict(False, max_abs, max_rel, f"cosine diff {cos_diff:.3g} > {cos_tol}")
    return Verdict(True, max_abs, max_rel)


def flashmla_decode_close(got, ref) -> dict:
    """(out, lse) of the sparse decode vs the reference's -> {name: Verdict}."""
    return {"out": flashmla_close(got[0], ref[0], **FLASHMLA_OUT),
            "lse": flashmla_close(got[1], ref[1], **FLASHMLA_LSE)}


def failures(verdicts: dict) -> str:
    """"name: detail; ..." of the failing verdicts ("" when all pass)."""
    return "; ".join(f"{n}: {v.detail}" for n, v in verdicts.items() if not v.ok)


def flashmla_prefill_close(got, ref) -> dict:
    """(out, max_logits, lse) of ``flash_mla_sparse_fwd`` vs the reference's -> {name: Verdict}."""
    tols = (FLASHMLA_PREFILL_OUT, FLASHMLA_PREFILL_STATS, FLASHMLA_PREFILL_STATS)
    return {name: flashmla_close(g.float(), r.float(), **tol)
            for name, g, r, tol in zip(("out", "max_logits", "lse"), got, ref, tols)}


def calc_diff(x, y) -> float:
    """DeepGEMM's similarity metric (its tests' tolerance): 1 - 2<x,y> / (|x|^2 + |y|^2)."""
    x, y = x.double(), y.double()
    den = (x * x + y * y).sum()
    if den == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / den)


def deepgemm_diff(x, y) -> float:
    """DeepGEMM's ``calc_diff`` over the entries finite in both (masked logits are -inf)."""
    finite = x.isfinite() & y.isfinite()
    return calc_diff(x[finite], y[finite])


def assert_gemm_close(d, ref):
    """DeepGEMM GEMM output ``d`` against its float32 reference ``ref`` (AssertionError when off).
    Exact products (interpreter: float32 accumulation) up to output rounding. On sm_90 the FP8
    MMA accumulates a K-block with about 14 mantissa bits (why DeepGEMM promotes to float32 every
    128 K): there a few outputs land several bf16 ulps off, so the bound also allows 2e-3 of the
    largest output, and DeepGEMM's calc_diff must stay below 1e-5 (a wrong K-block scale gives
    ~1e-2)."""
    import torch

    spread = 2e-3 * float(ref.abs().max()) if d.is_cuda else 0.0
    if d.dtype == torch.float32:
        torch.testing.assert_close(d, ref, rtol=1e-4, atol=1e-3 + spread)
    else:
        torch.testing.assert_close(d.float(), ref, rtol=8e-3, atol=2e-2 + spread)
    assert calc_diff(d.float(), ref) < 1e-5

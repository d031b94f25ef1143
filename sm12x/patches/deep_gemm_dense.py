"""Patch records for DeepGEMM's dense paths (FP8 block GEMM, FP8 einsum, mHC pre-norm GEMM) on SM12x."""
from __future__ import annotations

PATCHES = ()

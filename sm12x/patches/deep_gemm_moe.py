"""Patch records for DeepGEMM's grouped MoE GEMMs (FP8 and FP8 x MXFP4, contiguous and masked) on SM12x."""
from __future__ import annotations

PATCHES = ()

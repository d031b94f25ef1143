"""Grouped (MoE expert) GEMMs compatible with DeepGEMM's ``m_grouped_fp8_gemm_nt_*`` and
``m_grouped_fp8_fp4_gemm_nt_*``: FP8 activations times FP8 or MXFP4 (packed e2m1 + UE8M0) expert
weights, in the contiguous (expert id per row, or psum) and masked layouts.

``reference`` is the PyTorch source of truth, ``fp4`` the e2m1 decoding, ``expert_tile`` the K loop
both layouts share, ``grouped_contiguous`` / ``grouped_masked`` the ops, ``cases`` their registry
entries.
"""

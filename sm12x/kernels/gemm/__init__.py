"""Dense GEMM ops (DeepGEMM ``fp8_gemm_nt``, ``fp8_einsum``, ``tf32_hc_prenorm_gemm``) and the
block-scaled base the MoE grouped GEMMs share (:mod:`scales`, :mod:`block_scaled`)."""

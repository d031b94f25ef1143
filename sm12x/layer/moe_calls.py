"""The routed experts' DeepGEMM calls as the frameworks lay them out.

- prefill: the contiguous layout (vLLM's DeepGEMM MoE): rows sorted by expert, each expert's
  segment padded to the M alignment the caller sets for the call
  (``get_theoretical_mk_alignment_for_contiguous_layout``), ``grouped_layout`` an int32 expert id
  per row (-1 padding), ``m_grouped_fp8_fp4_gemm_nt_contiguous`` for w13 and again for w2;
- decode: the masked layout (SGLang's low-latency path, vLLM's batched experts): A
  [E, M_max, hidden] with ``masked_m`` rows per expert, ``m_grouped_fp8_fp4_gemm_nt_masked``.

Activations are cast to FP8 per 1 x 128 (UE8M0); the MXFP4 weights keep their (1, 32) scales
(packed UE8M0 int32 as DeepGEMM's ``transform_sf_into_required_layout`` makes them, or float32).
SwiGLU (clamped at ``swiglu_limit``) times the routing weight runs in float32 between the two GEMMs.

Experts given as FP8 (``Fp8Weight`` [E, N, K] with float32 128 x 128 block scales, what
``sm12x.layer.native`` hands in on Hopper, where DeepGEMM has no FP4 grouped GEMM) go through
``m_grouped_fp8_gemm_nt_contiguous`` / ``_masked`` in the SM90 call form: float32 scales, no recipe
(DeepGEMM's default for float32 scales is (1, 128, 128)).
"""
from __future__ import annotations

import torch

from sm12x.layer import blocks
from sm12x.layer.weights import Fp8Weight

# SGLang 0.5.23's DeepSeek-V4 MXFP4 experts name the granularities (its DeepGEMM MoE runner):
# activations per 1 x 128, weights per 1 x 32
RECIPE_A, RECIPE_B = (1, 128), (1, 32)


def _weight_scales(be, key, w):
    if key not in be._wsf:
        e, n, k2 = w.q.shape
        be._wsf[key] = w.sf if be.scale_format == "fp32" else \
            be.dg.transform_sf_into_required_layout(w.sf, n, 2 * k2, (1, 32), num_groups=e)
    return be._wsf[key]


def _expert_weight(w, e: int) -> torch.Tensor:
    """float32 [N, K] of expert ``e`` (MXFP4 or FP8 experts)."""
    return Fp8Weight(w.q[e], w.sf[e]).dequant() if isinstance(w, Fp8Weight) else w.dequant(e)


def _call_form(be, w13):
    """(contiguous name, masked name, recipe kwargs) for the experts' weight format."""
    if isinstance(w13, Fp8Weight):
        if be.scale_format != "fp32":
            raise ValueError("sm12x layer: FP8 routed experts are the SM90 call form (scale_format 'fp32'), "
                             f"got scale_format {be.scale_format!r}")
        return "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked", {}
    return ("m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nt_masked",
            {"recipe_a": RECIPE_A, "recipe_b": RECIPE_B})


def _a_scales(be, sf):
    if be.scale_format == "fp32":
        return sf.contiguous()
    return be.dg.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)


def routed_experts(be, step, h, ids, weights, w13, w2):
    cfg, dg = be.cfg, be.dg
    t_rows, k = ids.shape
    flat_e = ids.reshape(-1)
    flat_t = torch.arange(t_rows, device=h.device).repeat_interleave(k)
    flat_w = weights.reshape(-1).float()
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=cfg.experts)
    hq, hs = blocks.quant_fp8(h, 128)
    contiguous, masked, recipe = _call_form(be, w13)
    if isinstance(w13, Fp8Weight):
        sf13, sf2 = w13.sf, w2.sf
    else:
        sf13, sf2 = _weight_scales(be, "experts_w13", w13), _weight_scales(be, "experts_w2", w2)
    out = torch.zeros(t_rows, cfg.hidden, dtype=torch.float32, device=h.device)
    if not step.decode:
        name = contiguous
        align = be.contiguous_alignment(t_rows * k)
        seg = (counts + align - 1) // align * align
        seg_start = torch.cumsum(seg, 0) - seg
        e_sorted = flat_e[order]
        rank = torch.arange(order.numel(), device=h.device) - (torch.cumsum(counts, 0) - counts)[e_sorted]
        dest = seg_start[e_sorted] + rank                                   # row of each (token, choice)
        m = int(seg.sum())
        layout = torch.full((m,), -1, dtype=torch.int32, device=h.device)
        layout[dest] = e_sorted.to(torch.int32)
        tok = flat_t[order]

        def gemm(a_q, a_s, w, sf, n):
            aq = torch.zeros((m, a_q.shape[1]), dtype=torch.float8_e4m3fn, device=h.device)
            asf = torch.ones((m, a_s.shape[1]), dtype=torch.float32, device=h.device)
            aq[dest], asf[dest] = a_q, a_s
            d = torch.empty((m, n), dtype=torch.bfloat16, device=h.device)
            previous = dg.get_mk_alignment_for_contiguous_layout()
            if align != previous:
                dg.set_mk_alignment_for_contiguous_layout(align)
            try:
                getattr(dg, contiguous)((aq, _a_scales(be, asf)), (w.q, sf), d, layout, **recipe)
            finally:
                if align != previous:
                    dg.set_mk_alignment_for_contiguous_layout(previous)
            return d[dest]
        d1 = gemm(hq[tok], hs[tok], w13, sf13, 2 * cfg.moe_inter)
        y = blocks.swiglu(d1, cfg.swiglu_limit) * flat_w[order][:, None]
        yq, ys = blocks.quant_fp8(y, 128)
        d2 = gemm(yq, ys, w2, sf2, cfg.hidden)
    else:
        name = masked
        # rows per expert: in the SM90 FP8 call form (no recipe) DeepGEMM's masked kernel stores
        # whole 64 / 128-row blocks, so a narrower group lets one expert's block overwrite the
        # next expert's rows (no error, wrong output); sm12x's kernel stores only each expert's rows
        align = 16 if recipe else 128
        m_max = max(align, -(-t_rows // align) * align)
        e_sorted = flat_e[order]
        rank = torch.arange(order.numel(), device=h.device) - (torch.cumsum(counts, 0) - counts)[e_sorted]
        masked_m = counts.to(torch.int32).contiguous()
        expected_m = max(1, -(-t_rows * k // cfg.experts))
        tok = flat_t[order]

        def gemm(a_q, a_s, w, sf, n):
            aq = torch.zeros((cfg.experts, m_max, a_q.shape[1]), dtype=torch.float8_e4m3fn, device=h.device)
            asf = torch.ones((cfg.experts, m_max, a_s.shape[1]), dtype=torch.float32, device=h.device)
            aq[e_sorted, rank], asf[e_sorted, rank] = a_q, a_s
            d = torch.empty((cfg.experts, m_max, n), dtype=torch.bfloat16, device=h.device)
            getattr(dg, masked)((aq, _a_scales(be, asf)), (w.q, sf), d, masked_m, expected_m, **recipe)
            return d[e_sorted, rank]
        d1 = gemm(hq[tok], hs[tok], w13, sf13, 2 * cfg.moe_inter)
        y = blocks.swiglu(d1, cfg.swiglu_limit) * flat_w[order][:, None]
        yq, ys = blocks.quant_fp8(y, 128)
        d2 = gemm(yq, ys, w2, sf2, cfg.hidden)
    out.index_add_(0, tok, d2.float())
    if be.check_ops:
        a1 = hq[tok].float() * hs[tok].repeat_interleave(128, -1)
        a2 = yq.float() * ys.repeat_interleave(128, -1)
        r1, r2 = torch.empty_like(d1, dtype=torch.float32), torch.empty_like(d2, dtype=torch.float32)
        for e in torch.unique(e_sorted).tolist():
            rows = e_sorted == e
            r1[rows] = a1[rows] @ _expert_weight(w13, e).T
            r2[rows] = a2[rows] @ _expert_weight(w2, e).T
        be._record(name, torch.cat((d1.flatten(), d2.flatten())).float(), torch.cat((r1.flatten(), r2.flatten())))
    return out

"""The same V4-Flash layer on FlashMLA's and DeepGEMM's own kernels, in their SM90 (Hopper) call
forms: the proxy for what the layer costs with native kernels, timed beside sm12x's in
``scripts/bench_layer.py``.

``NativeBackend`` is ``PatchedBackend`` (same layer, same caches, same call order) with the calls a
Hopper deployment of vLLM / SGLang makes where they differ from the SM100 / SM120 forms:

- float32 scales everywhere (``scale_format`` "fp32"): activations per 1 x 128 made TMA-aligned and
  MN-major by ``get_mn_major_tma_aligned_tensor``, weights' 128 x 128 block scales as stored; the
  FP8 linears, ``fp8_einsum`` (recipe (1, 128, 128)) and ``tf32_hc_prenorm_gemm`` as on SM12x;
- the indexer as DeepGEMM's logits then a top-k: ``fp8_mqa_logits`` over each prefill row's keys,
  ``get_paged_mqa_logits_metadata`` + ``fp8_paged_mqa_logits`` over the paged indexer cache in
  decode (a request's spec-decode tokens as rows of their own above 2, the kernel's limit there),
  then ``torch.topk`` of each row's valid columns (vLLM's Hopper path runs its own top-k
  kernel there; sm12x's row runs the fused top-k that never writes the logits);
- the routed experts in FP8: DeepGEMM has no FP8 x FP4 grouped GEMM on SM90, so the MXFP4 weights
  are re-quantised once to e4m3 with float32 128 x 128 block scales (``fp8_experts``) and run
  through ``m_grouped_fp8_gemm_nt_contiguous`` (prefill) / ``m_grouped_fp8_gemm_nt_masked``
  (decode). That reads twice the weight bytes of the MXFP4 form, which the table marks; the values
  are the same where a 128 x 128 block's 1 x 32 exponents span less than e4m3's range (always here:
  ``conversion_error`` measures it);
- the contiguous layout's M alignment is DeepGEMM's fixed one on SM90
  (``get_mk_alignment_for_contiguous_layout``, 128), not asked per step.

FlashMLA's ``flash_mla_sparse_fwd`` and ``flash_mla_with_kvcache`` (MODEL1 cache, ``extra_*``
entries, sinks, ``topk_length``) are called exactly as in the sm12x row. Any module pair with
DeepGEMM's and FlashMLA's names can be passed; the tests pass sm12x's stand-ins to check the wiring
against the float32 reference on the CPU.
"""
from __future__ import annotations

import torch

from sm12x.layer.patched import PatchedBackend
from sm12x.layer.weights import Fp4Experts, Fp8Weight, _fp8_block


def fp8_experts(w: Fp4Experts) -> Fp8Weight:
    """MXFP4 experts [E, N, K/2] -> e4m3 [E, N, K] with float32 UE8M0 scales per 128 x 128 block
    ([E, N/128, K/128]), one expert at a time (V4-Flash's w13 in float32 is 16 GiB)."""
    qs, sfs = [], []
    for e in range(w.q.shape[0]):
        fp8 = _fp8_block(w.dequant(e))
        qs.append(fp8.q)
        sfs.append(fp8.sf)
    return Fp8Weight(torch.stack(qs), torch.stack(sfs))


def conversion_error(w: Fp4Experts, converted: Fp8Weight, experts: int = 2) -> float:
    """Largest relative error (Frobenius) of the FP8 re-quantisation over the first ``experts``."""
    worst = 0.0
    for e in range(min(experts, w.q.shape[0])):
        want = w.dequant(e).double()
        got = Fp8Weight(converted.q[e], converted.sf[e]).dequant().double()
        worst = max(worst, float((got - want).norm() / want.norm().clamp_min(1e-30)))
    return worst


def rows_topk(logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-``topk`` columns of each row of ``logits`` [R, N] within [ks, ke) -> int32 [R, topk],
    relative to ``ks``, -1 where a row has fewer valid columns. Columns outside the range are
    masked here, whatever the kernel left in them."""
    cols = torch.arange(logits.shape[1], device=logits.device)
    valid = (cols[None, :] >= ks[:, None].long()) & (cols[None, :] < ke[:, None].long())
    masked = torch.where(valid, logits.float(), float("-inf"))
    k = min(topk, logits.shape[1])
    vals, idx = masked.topk(k, dim=1)
    idx = torch.where(torch.isfinite(vals), idx - ks[:, None].long(), -1)
    return torch.nn.functional.pad(idx, (0, topk - k), value=-1).to(torch.int32)


class NativeBackend(PatchedBackend):
    """The layer's calls on DeepGEMM / FlashMLA in their SM90 forms (see the module docstring)."""

    EXPERT_OPS = ("m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nt_masked")

    def __init__(self, cfg, caches, attn_sink, dg, fmla, experts: tuple | None = None, **kwargs):
        """``experts``: the routed experts' (w13, w2) already in FP8 (``fp8_experts``), so that a
        timed step does not include the conversion; converted on first use otherwise."""
        kwargs["scale_format"] = "fp32"
        super().__init__(cfg, caches, attn_sink, dg=dg, fmla=fmla, **kwargs)
        self._experts: dict = {} if experts is None else dict(zip(("w13", "w2"), experts))

    def _num_sms(self, device) -> int:
        if device.type == "cuda":
            return torch.cuda.get_device_properties(device).multi_processor_count
        return self.dg.get_num_sms()

    def _select_flat(self, qq, weights, k, k_sf, ks, ke):
        logits = self.dg.fp8_mqa_logits(qq, (k, k_sf), weights, ks, ke, clean_logits=True)
        return rows_topk(logits, ks, ke, self.cfg.index_topk)

    def _select_paged(self, qq, weights, ctx, table, max_len):
        b, next_n = ctx.shape
        if next_n > 2:
            # DeepGEMM's SM90 paged kernel takes 1 or 2 query tokens per request: each token is
            # its own row then (vLLM flattens its spec-decode tokens so), with its own length
            qq = qq.reshape(b * next_n, 1, *qq.shape[2:])
            ctx = ctx.reshape(b * next_n, 1)
            table = table.repeat_interleave(next_n, 0)
        meta = self.dg.get_paged_mqa_logits_metadata(ctx, self.caches.block, self._num_sms(qq.device))
        logits = self.dg.fp8_paged_mqa_logits(qq, self.caches.index, weights, ctx, table, meta, max_len,
                                              clean_logits=False)
        ends = ctx.reshape(-1)
        return rows_topk(logits, torch.zeros_like(ends), ends, self.cfg.index_topk)

    def experts(self, step, h, ids, weights, w13, w2):
        from sm12x.layer.moe_calls import routed_experts

        for key, w in (("w13", w13), ("w2", w2)):
            if key not in self._experts:
                self._experts[key] = fp8_experts(w) if isinstance(w, Fp4Experts) else w
        return routed_experts(self, step, h, ids, weights, self._experts["w13"], self._experts["w2"])

    def contiguous_alignment(self, rows: int) -> int:
        return self.dg.get_mk_alignment_for_contiguous_layout()

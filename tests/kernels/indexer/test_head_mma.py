"""The indexer logits' head sum as an MMA (config key ``head_mma``) in the prefill and paged
kernels: exact where every relu(q.k) term is a bf16 value, and within the documented rounding
(2**-8 of sum_h |w_h| relu(q_h.k) k_scale) on random data."""
import pytest
import torch

from sm12x.kernels.common import configs
from sm12x.kernels.indexer import mqa_logits as mq
from sm12x.kernels.indexer import paged_mqa_logits as pm
from sm12x.kernels.indexer.cache import quant_fp8_paged_cache
from sm12x.kernels.indexer.reference import ref_mqa_logits, ref_paged_mqa_logits

from tests.kernels.indexer.test_mqa_logits import make_inputs, ragged_ranges
from tests.kernels.indexer.test_paged_mqa_logits import make_paged, same_layout

NEG_INF = float("-inf")


def _config(module, device, head_mma: bool) -> dict:
    return dict(configs.pick(module.CONFIGS, device)["fp8"], key_rows=True, head_mma=head_mma)


def _prefill(inp, ks, ke, device, head_mma):
    q, _ = inp["q"]
    k, k_sf = inp["kv"]
    out = mq.alloc_logits(q.shape[0], k.shape[0], q.shape[1], torch.float32, device)
    return mq.launch(q, None, k, k_sf, inp["weights"], ks, ke, out, clean=True, compressed=False, out_mode=0,
                     config=_config(mq, device, head_mma)).float().cpu()


def _paged(inp, device, head_mma):
    q, _ = inp["q"]
    rows = q.shape[0] * q.shape[1]
    out = pm.alloc_logits(rows, inp["max_context_len"], torch.float32, device)
    return pm.launch(q, None, inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"],
                     inp["max_context_len"], out, clean=True, out_mode=0,
                     config=_config(pm, device, head_mma)).float().cpu()


def _paged_ref(inp, weights):
    q, _ = inp["q"]
    return ref_paged_mqa_logits((q.cpu(), None), inp["cache"].cpu(), weights, inp["context_lens"].cpu(),
                                inp["block_table"].cpu(), inp["max_context_len"])


def _assert_within(out, ref, abs_sum, rel):
    """|out - ref| <= rel * abs_sum (+ float32 slack) wherever ref is finite; -inf at the same places."""
    inv = ref == NEG_INF
    assert torch.equal(out == NEG_INF, inv)
    err = (out - ref).masked_fill(inv, 0).abs()
    bound = (rel * abs_sum + 1e-6 * (ref.abs() + abs_sum)).masked_fill(inv, 1.0)
    assert bool((err <= bound).all()), f"max err / bound {float((err / bound).max()):.3g}"


def _small_ints(shape, g, m):
    """Integers in [-m, m]: with q in [-1, 1] and k in [-2, 2], |q.k| <= 2 D <= 256 is a bf16 value."""
    return torch.randint(-m, m + 1, shape, generator=g).float()


@pytest.mark.parametrize("h,d", [(16, 64), (64, 128)])
def test_prefill_exact_on_bf16_terms(device, h, d):
    """q and k small integers (every relu(q.k) <= 256 is a bf16 value), scale 1: the MMA sum must
    match the float32 reference to the weights' split (w = bf16 high + bf16 low, ~2**-16)."""
    g = torch.Generator().manual_seed(1)
    s, s_kv = 5, 200
    q, k = _small_ints((s, h, d), g, 1), _small_ints((s_kv, d), g, 2)
    w = torch.randn(s, h, generator=g)
    inp = dict(q=(q.to(torch.float8_e4m3fn).to(device), None),
               kv=(k.to(torch.float8_e4m3fn).to(device), torch.ones(s_kv, device=device)), weights=w.to(device))
    ks, ke = ragged_ranges(s, s_kv, device)
    ref = ref_mqa_logits(q, k, None, w, ks.cpu(), ke.cpu())
    abs_sum = ref_mqa_logits(q, k, None, w.abs(), ks.cpu(), ke.cpu())
    _assert_within(_prefill(inp, ks, ke, device, True), ref, abs_sum, 2.0**-14)


@pytest.mark.parametrize("h,d,fp32_sum", [(16, 64, False), (64, 128, False), (64, 128, True)])
def test_prefill_rounding_bound(device, h, d, fp32_sum):
    inp = make_inputs(6, 300, h, d, False, device, seed=3)
    ks, ke = ragged_ranges(6, 300, device)
    q_sim, k_sim, k_sf = inp["sim"]
    w = inp["weights"].float().cpu()
    ref = ref_mqa_logits(q_sim, k_sim, k_sf, w, ks.cpu(), ke.cpu())
    abs_sum = ref_mqa_logits(q_sim, k_sim, k_sf, w.abs(), ks.cpu(), ke.cpu()).masked_fill(ref == NEG_INF, 0)
    out = _prefill(inp, ks, ke, device, not fp32_sum)
    # the CUDA-core sum as a contrast: only the QK accumulation's error (Hopper's FP8 MMA keeps
    # ~14 bits: 5.5e-5 of the bound's sum measured on the H200)
    _assert_within(out, ref, abs_sum, 2.0**-8 if not fp32_sum else 2.0**-12)


@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_exact_on_bf16_terms(device, next_n):
    """As the prefill case on a paged cache (power-of-2 scales keep the stored keys integers)."""
    g = torch.Generator().manual_seed(2)
    b, h, d, bkv = 3, 64, 128, 32
    inp = make_paged(b, next_n, h, d, bkv, [70, 5, 96], False, "cpu", seed=4)
    # keys k/4 with k in [-2, 2]: the power-of-2 scale 2**-9 stores them as 128 k
    cache = quant_fp8_paged_cache(_small_ints(inp["raw"][1].shape, g, 2) / 4, use_ue8m0=True)
    q = _small_ints((b, next_n, h, d), g, 1)
    inp.update(q=(q.to(torch.float8_e4m3fn).to(device), None), cache=same_layout(cache, device),
               weights=inp["weights"].to(device), context_lens=inp["context_lens"].to(device),
               block_table=inp["block_table"].to(device))
    w = inp["weights"].cpu()
    ref, abs_sum = _paged_ref(inp, w), _paged_ref(inp, w.abs())
    _assert_within(_paged(inp, device, True), ref, abs_sum.masked_fill(ref == NEG_INF, 0), 2.0**-14)


@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_rounding_bound(device, next_n):
    inp = make_paged(2, next_n, 64, 128, 64, [150, 77], False, device, seed=5)
    w = inp["weights"].float().cpu()
    ref, abs_sum = _paged_ref(inp, w), _paged_ref(inp, w.abs())
    _assert_within(_paged(inp, device, True), ref, abs_sum.masked_fill(ref == NEG_INF, 0), 2.0**-8)

"""The FP8 indexer's q.k dots as unit-scale block-scaled MMAs (config key ``fp8_mx``, the sm_120
and sm_121 configs): the same logits as the plain ``tl.dot`` path. Under the interpreter (and on
SM12x hardware, where both products are exact and accumulate in float32) bit for bit; the GPU twin
on sm_90, where Triton emulates ``tl.dot_scaled`` with bf16 MMAs of the same exact products, to
float32 rounding of the sum order."""
import pytest
import torch

from sm12x.kernels.common import configs
from sm12x.kernels.common.fp8_dot import native_block_scaled
from sm12x.kernels.common.tolerance import calc_diff
from sm12x.kernels.indexer import mqa_logits as mq
from sm12x.kernels.indexer import paged_mqa_logits as pm

from tests.kernels.indexer.test_mqa_logits import make_inputs, ragged_ranges
from sm12x.kernels.indexer.reference import ref_paged_mqa_logits

from tests.kernels.indexer.test_paged_mqa_logits import make_paged

NEG_INF = float("-inf")


def _prefill(inp, ks, ke, device, cfg):
    q, _ = inp["q"]
    k, k_sf = inp["kv"]
    out = mq.alloc_logits(q.shape[0], k.shape[0], q.shape[1], torch.float32, torch.device(device))
    return mq.launch(q, None, k, k_sf, inp["weights"], ks, ke, out, clean=True, compressed=False, out_mode=0,
                     config=cfg).float().cpu()


def _paged(inp, device, cfg):
    q, _ = inp["q"]
    out = pm.alloc_logits(q.shape[0] * q.shape[1], inp["max_context_len"], torch.float32, torch.device(device))
    return pm.launch(q, None, inp["cache"], inp["weights"], inp["context_lens"], inp["block_table"],
                     inp["max_context_len"], out, clean=True, out_mode=0, config=cfg).float().cpu()


def _check_paged(out, inp):
    q, _ = inp["q"]
    ref = ref_paged_mqa_logits((q.cpu(), None), inp["cache"].cpu(), inp["weights"].float().cpu(),
                               inp["context_lens"].cpu(), inp["block_table"].cpu(), inp["max_context_len"],
                               clean_logits=True)
    inv = ref == NEG_INF
    assert torch.equal(out == NEG_INF, inv)
    assert calc_diff(out.masked_fill(inv, 0), ref.masked_fill(inv, 0)) < 1e-5


def _same(a, b, exact):
    assert torch.equal(a == NEG_INF, b == NEG_INF)
    fin = a != NEG_INF
    if exact:
        assert torch.equal(a[fin], b[fin])
    else:
        # sm_90 emulates tl.dot_scaled (Triton's bf16 decomposition), so the two sums differ in
        # rounding: calc_diff 8.1e-9 on an H100 (2026-12-06), DeepGEMM's own bound is 1e-3
        assert calc_diff(a[fin], b[fin]) < 1e-7


def test_sm12x_configs_take_it():
    assert mq.CONFIGS["sm_120"]["fp8"]["fp8_mx"] and pm.CONFIGS["sm_120"]["fp8"]["fp8_mx"]
    assert not mq.CONFIGS["sm_90"]["fp8"].get("fp8_mx") and not pm.CONFIGS["sm_90"]["fp8"].get("fp8_mx")
    for m in (mq, pm):
        assert m.CONFIGS["sm_121"]["fp8"]["fp8_mx"] == native_block_scaled("sm_121")
        assert not m.fp8_mx(m.CONFIGS["sm_120"]["fp4"], True)


@pytest.mark.cpu_only
@pytest.mark.parametrize("key_rows,head_mma", [(False, False), (True, False), (True, True)])
def test_prefill_identical(device, key_rows, head_mma):
    s, s_kv, h, d = 5, 200, 16, 64
    inp = make_inputs(s, s_kv, h, d, False, device, seed=5)
    ks, ke = ragged_ranges(s, s_kv, device)
    base = dict(configs.pick(mq.CONFIGS, torch.device(device))["fp8"], key_rows=key_rows, head_mma=head_mma)
    plain = _prefill(inp, ks, ke, device, dict(base, fp8_mx=False))
    mx = _prefill(inp, ks, ke, device, dict(base, fp8_mx=True))
    _same(mx, plain, exact=True)


@pytest.mark.cpu_only
@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_identical(device, next_n):
    inp = make_paged(2, next_n, 16, 64, 32, [70, 33], False, device, seed=2)
    base = configs.pick(pm.CONFIGS, torch.device(device))["fp8"]
    plain = _paged(inp, device, dict(base, fp8_mx=False))
    mx = _paged(inp, device, dict(base, fp8_mx=True))
    _same(mx, plain, exact=True)
    _check_paged(mx, inp)


@pytest.mark.gpu
@pytest.mark.parametrize("h,d", [(64, 128), (32, 128)])
def test_gpu_same_logits(monkeypatch, h, d):
    """The sm_120 configs on the GPU (dot_scaled emulated on sm_90): the unit-scale path against
    tl.dot, prefill and paged, at a production head count."""
    monkeypatch.setenv("SM12X_KERNEL_CONFIGS", "sm_120")
    dev = "cuda"
    native = torch.cuda.get_device_capability()[0] == 12
    s, s_kv = 300, 4096
    inp = make_inputs(s, s_kv, h, d, False, dev, seed=7)
    ks, ke = ragged_ranges(s, s_kv, dev)
    base = configs.pick(mq.CONFIGS, torch.device(dev))["fp8"]
    _same(_prefill(inp, ks, ke, dev, dict(base, fp8_mx=True)), _prefill(inp, ks, ke, dev, dict(base, fp8_mx=False)),
          exact=native)
    inp = make_paged(8, 2, h, d, 64, [4000, 77, 1500, 64, 3000, 1, 2048, 999], False, dev, seed=3)
    base = configs.pick(pm.CONFIGS, torch.device(dev))["fp8"]
    mx = _paged(inp, dev, dict(base, fp8_mx=True))
    _same(mx, _paged(inp, dev, dict(base, fp8_mx=False)), exact=native)
    _check_paged(mx, inp)

"""The MoE grouped GEMMs on the GPU at DeepSeek-V4-Flash expert shapes (hidden 4096,
moe_intermediate_size 2048: gate+up N=4096 x K=4096, down N=4096 x K=2048), a slice of the 256
experts so that the float32 reference fits; run again with SM12X_KERNEL_CONFIGS=sm_120 for the
sm_120 configurations. Also: a masked call captured in a CUDA graph sees new masked_m values on
replay (no host read)."""
import pytest
import torch
from moe_support import check, run_contiguous, run_masked

from sm12x.frontends.deep_gemm import moe as api

pytestmark = pytest.mark.gpu
HIDDEN, INTER = 4096, 2048


def _segments(tokens, experts, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts = torch.bincount(torch.randint(0, experts, (tokens,), generator=g), minlength=experts)
    counts[3] = 0  # an empty expert
    return counts.tolist()


@pytest.mark.parametrize("n,k", [(2 * INTER, HIDDEN), (HIDDEN, INTER)])
@pytest.mark.parametrize("alignment", [128, 16])
def test_contiguous_fp4(n, k, alignment):
    out, ref, defined = run_contiguous(api, _segments(3000, 24), n, k, fp4=True, alignment=alignment,
                                       fmt_a="packed", device="cuda", recipe_kwargs=dict(recipe_a=(1, 128), recipe_b=(1, 32)))
    check(out, ref, defined)


@pytest.mark.parametrize("per_row", [True, False])
def test_contiguous_fp8(per_row):
    # per-row packed UE8M0 weight scales (SM100 style) or 128x128 float32 blocks with float32
    # activation scales (SM90 style)
    out, ref, defined = run_contiguous(api, _segments(3000, 24), 2 * INTER, HIDDEN, fp4=False, alignment=128,
                                       fmt_a="packed" if per_row else "fp32", fmt_b="packed" if per_row else "fp32",
                                       fp8_per_row=per_row, device="cuda")
    check(out, ref, defined)


def test_contiguous_psum_mxfp8_activations():
    out, ref, defined = run_contiguous(api, _segments(2000, 16), 2 * INTER, HIDDEN, fp4=True, alignment=128,
                                       psum=True, gran_k_a=32, fmt_a="packed", device="cuda",
                                       recipe_kwargs=dict(recipe=(1, 1, 32)))
    check(out, ref, defined)


@pytest.mark.parametrize("fp4", [True, False])
@pytest.mark.parametrize("expected_m", [6, 24])
def test_masked(fp4, expected_m):
    g = torch.Generator().manual_seed(1)
    masked = torch.randint(0, 2 * expected_m + 1, (24,), generator=g).clamp(max=64).tolist()
    masked[0], masked[1] = 0, 64
    out, ref, defined = run_masked(api, 24, 64, 2 * INTER, HIDDEN, masked, fp4=fp4, expected_m=expected_m,
                                   fmt_a="packed", device="cuda", fp8_per_row=True)
    check(out, ref, defined)


def test_masked_graph_replay_reads_masked_m_on_device():
    from sm12x.kernels.moe.cases import make_masked, make_weights

    a, sa, masked = make_masked(8, 32, HIDDEN, [0] * 8, fmt="packed", device="cuda")
    b, sb = make_weights(8, 256, HIDDEN, fp4=True, device="cuda")
    d = torch.zeros(8, 32, 256, dtype=torch.bfloat16, device="cuda")
    run = lambda: api.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (b, sb), d, masked, 16)
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    masked.copy_(torch.tensor([5, 0, 32, 1, 0, 7, 16, 3], dtype=torch.int32))
    graph.replay()
    want = torch.zeros_like(d)
    api.m_grouped_fp8_fp4_gemm_nt_masked((a, sa), (b, sb), want, masked, 16)
    torch.cuda.synchronize()
    assert torch.equal(d, want) and bool(d[2].abs().sum() > 0)

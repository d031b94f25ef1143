"""The FlashInfer DeepSeek-V4 records on stand-ins shaped like vLLM 0.25.1 and 0.34.0 (the lazy
wrapper in ``vllm.utils.flashinfer``, the attention modules' ``from ... import`` copies, 0.34's
constructor check reading FlashInfer's dispatch table) over a FlashInfer 0.6.14 stand-in that, like
the real one, serves its table and aborts on the rest. The frameworks are imported before sm12x
(the plugin route), so the copies must be rebound."""

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

ABORT = "Check failed: num_tokens > 64 ... must go through sparse_mla_sm120_decode_dsv4"

FLASHINFER_0614 = {
    "flashinfer/__init__.py": "",
    "flashinfer/decode.py": "from flashinfer.mla._core import trtllm_batch_decode_sparse_mla_dsv4\n",
    "flashinfer/mla/__init__.py": "",
    "flashinfer/mla/_sparse_mla_sm120.py": """
        _DECODE_MAX_TOKENS = 64
        _DECODE_DSV4_PAGE_BLOCK_SIZE = 64
        _DECODE_DSV4_DISPATCH = frozenset((h, k) for h in (8, 16, 32, 64, 128) for k in (128, 512, 1024))
    """,
    # FlashInfer's SM120 path as far as routing goes: its decode table at <= 64 tokens, the
    # orchestrator's abort otherwise; a served call fills ``out`` with 3
    "flashinfer/mla/_core.py": f"""
        from flashinfer.mla import _sparse_mla_sm120 as t
        CALLS = []
        def trtllm_batch_decode_sparse_mla_dsv4(query, swa_kv_cache, workspace_buffer, sparse_indices,
                compressed_kv_cache=None, sparse_topk_lens=None, seq_lens=None, out=None, bmm1_scale=1.0,
                bmm2_scale=1.0, sinks=None, kv_layout="HND", cum_seq_lens_q=None, max_q_len=None,
                enable_pdl=None, swa_topk_lens=None, extra_sparse_indices=None, extra_sparse_topk_lens=None):
            tokens, heads, topk = query.shape[0], query.shape[1], sparse_indices.shape[-1]
            CALLS.append([tokens, heads, topk])
            if tokens <= t._DECODE_MAX_TOKENS and (heads, topk) not in t._DECODE_DSV4_DISPATCH:
                raise RuntimeError({ABORT!r})
            return out.fill_(3.0)
    """,
    **dist_infos({"flashinfer-python": "0.6.14"}),
}

# FlashInfer 0.6.13 (the pin of vLLM 0.25.x; 0.24.0's 0.6.12 has the same signature): no SM120 path,
# and a signature without the SM120 keywords, so vLLM's call raises TypeError (vllm#48054)
FLASHINFER_0613 = {
    "flashinfer/__init__.py": "",
    "flashinfer/decode.py": "from flashinfer.mla._core import trtllm_batch_decode_sparse_mla_dsv4\n",
    "flashinfer/mla/__init__.py": "",
    "flashinfer/mla/_core.py": """
        CALLS = []
        def trtllm_batch_decode_sparse_mla_dsv4(query, swa_kv_cache, workspace_buffer, sparse_indices,
                compressed_kv_cache, sparse_topk_lens, seq_lens, out=None, bmm1_scale=1.0, bmm2_scale=1.0,
                sinks=None, kv_layout="HND", cum_seq_lens_q=None, max_q_len=None, enable_pdl=None):
            CALLS.append([query.shape[0], query.shape[1], sparse_indices.shape[-1]])
            return out.fill_(3.0)
    """,
    **dist_infos({"flashinfer-python": "0.6.13"}),
}

VLLM_UTILS = """
    import functools, importlib

    def _get_submodule(name):
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    def _lazy_import_wrapper(module_name, attr_name):
        def wrapper(*args, **kwargs):
            return getattr(importlib.import_module(module_name), attr_name)(*args, **kwargs)
        return wrapper

    flashinfer_trtllm_batch_decode_sparse_mla_dsv4 = _lazy_import_wrapper(
        "flashinfer.decode", "trtllm_batch_decode_sparse_mla_dsv4")

    @functools.cache
    def has_flashinfer_sparse_mla_sm120():
        from flashinfer.decode import trtllm_batch_decode_sparse_mla_dsv4
        return callable(trtllm_batch_decode_sparse_mla_dsv4)
"""
VLLM_034_CONFIG = """
    @functools.cache
    def has_flashinfer_sparse_mla_sm120_config(num_q_heads, top_k):
        if not has_flashinfer_sparse_mla_sm120():
            return False
        mod = _get_submodule("flashinfer.mla._sparse_mla_sm120")
        dispatch = getattr(mod, "_DECODE_DSV4_DISPATCH", None) if mod else None
        return dispatch is not None and (int(num_q_heads), int(top_k)) in dispatch
"""
# DeepseekV4FlashInferSM120Attention's decode call and (0.33+) its constructor check
ATTENTION = """
    from vllm.utils.flashinfer import flashinfer_trtllm_batch_decode_sparse_mla_dsv4

    def forward_decode(q, swa_cache, swa_indices, swa_lens, extra_cache, extra_indices, extra_lens,
                       sinks, output, scale):
        flashinfer_trtllm_batch_decode_sparse_mla_dsv4(
            query=q, swa_kv_cache=swa_cache, workspace_buffer=None, sparse_indices=swa_indices,
            compressed_kv_cache=extra_cache, out=output, bmm1_scale=scale, sinks=sinks,
            kv_layout="NHD", swa_topk_lens=swa_lens, extra_sparse_indices=extra_indices,
            extra_sparse_topk_lens=extra_lens)

    def construct(padded_heads, required_topk):
        from vllm.utils import flashinfer
        if not hasattr(flashinfer, "has_flashinfer_sparse_mla_sm120_config"):
            return "no check"
        from vllm.utils.flashinfer import has_flashinfer_sparse_mla_sm120_config
        if not has_flashinfer_sparse_mla_sm120_config(padded_heads, required_topk):
            raise RuntimeError("requires a FlashInfer DSV4 sparse MLA decode specialization")
        return "constructed"
"""
PACKAGES = ("vllm", "vllm/utils", "vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/nvidia",
            "vllm/models/deepseek_v41", "vllm/models/deepseek_v41/nvidia")


def vllm_tree(release):
    tree = {f"{p}/__init__.py": "" for p in PACKAGES}
    later = release >= (0, 33)
    tree["vllm/utils/flashinfer.py"] = VLLM_UTILS + (VLLM_034_CONFIG if later else "")
    tree["vllm/models/deepseek_v4/nvidia/flashinfer_sparse.py"] = ATTENTION
    if later:
        tree["vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"] = ATTENTION
    return tree


CALLS = """
import json, sys, torch
sys.path.insert(0, {repo!r})
from sm12x.kernels.sparse_mla import kv_cache as kvc
from sm12x.kernels.sparse_mla.reference import ref_sparse_mla_decode

import vllm.utils.flashinfer
from vllm.models.deepseek_v4.nvidia import flashinfer_sparse as attention
try:
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse as v41
except ImportError:  # before 0.33
    v41 = None
import sm12x.plugin; sm12x.plugin.register()
import flashinfer.mla._core as fi_core

g = torch.Generator().manual_seed(0)
swa = kvc.quantize_model1_cache((torch.randn(4, 64, 512, generator=g) / 10).to(torch.bfloat16))
extra = kvc.quantize_model1_cache((torch.randn(32, 2, 512, generator=g) / 10).to(torch.bfloat16))

def call(tokens, heads, topk):
    q = torch.randn(tokens, heads, 512, generator=g).clamp(-1, 1).to(torch.bfloat16)
    idx = torch.randint(0, 256, (tokens, 1, topk), generator=g, dtype=torch.int32)
    lens = torch.randint(1, topk + 1, (tokens,), generator=g, dtype=torch.int32)
    xidx = torch.randint(0, 64, (tokens, 1, 16), generator=g, dtype=torch.int32)
    xlens = torch.full((tokens,), 12, dtype=torch.int32)
    sinks = torch.randn(heads, generator=g)
    out = torch.zeros(tokens, heads, 512, dtype=torch.bfloat16)
    try:
        attention.forward_decode(q, swa, idx, lens, extra, xidx, xlens, sinks, out, 512 ** -0.5)
    except RuntimeError as e:
        return str(e)
    if bool((out == 3).all()):
        return "flashinfer"
    ref, _ = ref_sparse_mla_decode(q.unsqueeze(1), swa, idx, lens, sinks, extra, xidx, xlens, 512 ** -0.5)
    return float((out.float() - ref[:, 0].float()).abs().max())

res = {{"dspark_verify": call(3, 16, 256),      # DSpark's SWA width 256: not in FlashInfer's table
        "mtp_verify": call(4, 16, 128),         # served by FlashInfer
        "constructor_dspark": attention.construct(16, 256),
        "flashinfer_calls": fi_core.CALLS}}
if v41 is not None:
    res["v41_copy_rebound"] = (v41.flashinfer_trtllm_batch_decode_sparse_mla_dsv4
                               is vllm.utils.flashinfer.flashinfer_trtllm_batch_decode_sparse_mla_dsv4)
from sm12x import apply
res["outcomes"] = {{k: v[0] for k, v in apply.OUTCOMES.items() if "flashinfer_dsv4" in k}}
print(json.dumps(res))
"""


def run_release(tmp_path, vllm_release, flashinfer=FLASHINFER_0614):
    release = tuple(int(p) for p in vllm_release.split("."))
    root = write_tree(tmp_path, {**flashinfer, **vllm_tree(release),
                                 **dist_infos({"vllm": vllm_release})})
    return last_json(run_py(CALLS.format(repo=REPO), pythonpath=[root], env={"TRITON_INTERPRET": "1"}))


@pytest.mark.parametrize("vllm_release", ["0.25.1", "0.34.0"])
def test_unserved_shapes_reach_sm12x(tmp_path, vllm_release):
    pytest.importorskip("triton")
    out = run_release(tmp_path, vllm_release)
    assert isinstance(out["dspark_verify"], float) and out["dspark_verify"] < 2e-3, out
    assert out["mtp_verify"] == "flashinfer", out
    assert out["flashinfer_calls"] == [[4, 16, 128]], out   # the DSpark call never reached it
    assert out["outcomes"]["vllm.flashinfer_dsv4.decode"] == "applied"
    if vllm_release == "0.34.0":
        assert out["constructor_dspark"] == "constructed"
        assert out["outcomes"]["vllm.flashinfer_dsv4.config_check"] == "applied"
        assert out["v41_copy_rebound"] is True
    else:
        assert out["constructor_dspark"] == "no check"
        assert out["outcomes"]["vllm.flashinfer_dsv4.config_check"] == "skipped"


def test_release_outside_the_range_keeps_flashinfer(tmp_path):
    """vLLM 0.22.1 (no SM120 DeepSeek-V4 path; outside the checked range): nothing is replaced and
    the stand-in FlashInfer aborts on the DSpark shape as the real one does."""
    out = run_release(tmp_path, "0.22.1")
    assert out["dspark_verify"].startswith("Check failed: num_tokens > 64"), out
    assert out["mtp_verify"] == "flashinfer"
    assert set(out["outcomes"].values()) == {"skipped"}, out


@pytest.mark.parametrize("vllm_release,flashinfer_release", [("0.24.0", "0.6.12"), ("0.25.1", "0.6.13")])
def test_flashinfer_without_sm120_path(tmp_path, vllm_release, flashinfer_release):
    """vLLM 0.24.0 / 0.25.1 with the FlashInfer each pins (0.6.12 / 0.6.13, the same function
    signature): every SM120 call is sm12x's, including the MTP shape FlashInfer 0.6.14 would have
    served."""
    pytest.importorskip("triton")
    flashinfer = {**{path: text for path, text in FLASHINFER_0613.items() if ".dist-info" not in path},
                  **dist_infos({"flashinfer-python": flashinfer_release})}
    out = run_release(tmp_path, vllm_release, flashinfer)
    for call in ("dspark_verify", "mtp_verify"):
        assert isinstance(out[call], float) and out[call] < 2e-3, out
    assert out["flashinfer_calls"] == [], out

"""The DeepSeek-V4.1 records (:mod:`sm12x.patches.v41`) on a stand-in SGLang 0.5.23 tree: without
sm12x the V4.1 candidate indexer raises at backend init on SM120 (as the released code does); with
it the gate answers yes, SGLang builds its sparse-table scheme, the configurer's flag is left as
SGLang set it, and DeepGEMM's sparse functions are sm12x's and compute the reference's logits.

``v41_indexer/__init__.py`` is the released module itself when the SGLang 0.5.23 wheel is on this
machine (``SM12X_FRAMEWORK_WHEELS``, default /tmp/wheels), else a stand-in with its gate; the
modules around it are stand-ins (the backends record what they were built with)."""
import glob
import os
import zipfile

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

WHEELS = os.environ.get("SM12X_FRAMEWORK_WHEELS", "/tmp/wheels")
V41 = "sglang/srt/layers/attention/dsv4/v41_indexer/__init__.py"

STANDIN_V41 = '''
import functools
import torch
from sglang.srt.utils import is_cuda

@functools.cache
def is_sm100_or_newer():
    return is_cuda() and torch.cuda.get_device_capability()[0] >= 10

def make_candidate_indexer(*, token_to_kv_pool, req_to_token, page_size, candidate_topk_blocks,
                           candidate_block_size):
    from .dense_blocks import DenseBlocksBackend
    dense = DenseBlocksBackend()
    if not is_sm100_or_newer() or candidate_topk_blocks <= 0:
        return dense, dense
    from sglang.srt.layers.deep_gemm_wrapper.configurer import DEEPGEMM_PAGED_SPARSE_MQA_LOGITS
    if not DEEPGEMM_PAGED_SPARSE_MQA_LOGITS:
        raise RuntimeError("the candidate indexer needs DeepGEMM's paged sparse MQA logits")
    from .sparse_table import SparseTableBackend
    return dense, SparseTableBackend()
'''

TREE = {
    "deep_gemm/__init__.py": """
        def get_paged_sparse_mqa_logits_metadata(context_lens, block_table, indices, page_kv,
                                                 sparse_kv_block_indices, qk_dtype, sparse_block_kv):
            raise RuntimeError("stand-in: SM100 only")
        def fp8_fp4_paged_sparse_mqa_logits(q, kv_cache, weights, metadata, num_max_sparse_blocks,
                                            sparse_block_kv):
            raise RuntimeError("stand-in: SM100 only")
        def fp8_fp4_mqa_logits(*args, **kwargs):
            raise RuntimeError("stand-in")
    """,
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/utils/__init__.py": "def is_cuda():\n    return True\n",
    "sglang/srt/runtime_context.py": """
        class _Parallel:
            attn_cp_size = 1
        def get_parallel():
            return _Parallel()
    """,
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/deep_gemm_wrapper/__init__.py": "",
    # SGLang 0.5.23 computes this once at import: DeepGEMM's JIT on SM100 only
    "sglang/srt/layers/deep_gemm_wrapper/configurer.py": "DEEPGEMM_PAGED_SPARSE_MQA_LOGITS = False\n",
    "sglang/srt/layers/attention/__init__.py": "",
    "sglang/srt/layers/attention/dsv4/__init__.py": "",
    "sglang/srt/layers/attention/dsv4/v41_indexer/full_topk.py": "class FullTopKIndexer:\n    pass\n",
    "sglang/srt/layers/attention/dsv4/v41_indexer/types.py": """
        class CandidateMetadata: pass
        class CapturedPrefillInputs: pass
        class DecodeCandidates: pass
        class DecodeInputs: pass
        class PrefillCandidates: pass
        class PrefillInputs: pass
    """,
    "sglang/srt/layers/attention/dsv4/v41_indexer/dense_blocks.py": """
        class DenseBlocksBackend:
            def __init__(self, **kwargs):
                self.kwargs = kwargs
    """,
    "sglang/srt/layers/attention/dsv4/v41_indexer/sparse_table.py": """
        class SparseTableBackend:
            def __init__(self, **kwargs):
                self.kwargs = kwargs
    """,
    # the backend takes its copy by name, as deepseek_v4_backend.py does
    "sglang/srt/layers/attention/deepseek_v4_backend.py": """
        from sglang.srt.layers.attention.dsv4.v41_indexer import make_candidate_indexer

        def init_backend(blocks):
            return make_candidate_indexer(token_to_kv_pool=None, req_to_token=None, page_size=256,
                                          candidate_topk_blocks=blocks, candidate_block_size=8)
    """,
}


def released_v41():
    for whl in sorted(glob.glob(os.path.join(WHEELS, "sglang-0.5.23-*.whl"))):
        with zipfile.ZipFile(whl) as z:
            return z.read(V41).decode()
    return None


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("v41")
    files = dict(TREE, **dist_infos())
    source = released_v41()
    files[V41] = source if source is not None else STANDIN_V41
    write_tree(root, files)
    # the released module imports msgspec-free siblings only through the stand-ins above
    return root, source is not None


CHILD = """
import json, os, torch
torch.cuda.get_device_capability = lambda *a: (12, 0)   # what SGLang reads on an RTX PRO 6000
import deep_gemm
from sglang.srt.layers.attention import deepseek_v4_backend as b
from sglang.srt.layers.deep_gemm_wrapper import configurer
out = {}
try:
    prefill, decode = b.init_backend(64)
    out["decode"] = type(decode).__name__
except RuntimeError as e:
    out["error"] = str(e)
out["flag_after"] = configurer.DEEPGEMM_PAGED_SPARSE_MQA_LOGITS
out["dense_only"] = [type(x).__name__ for x in b.init_backend(0)]
out["sparse_ours"] = [bool(getattr(getattr(deep_gemm, n), "__sm12x_patch__", None))
                      for n in ("get_paged_sparse_mqa_logits_metadata", "fp8_fp4_paged_sparse_mqa_logits")]
if os.environ.get("WITH_SM12X") == "1":
    import sys
    sys.path.insert(0, os.path.join(os.environ["REPO"], "tests", "kernels", "indexer"))
    from test_paged_sparse_mqa_logits import make_case, check
    c = make_case(rows=3, h=32, lens=[300, 40, 129], topk_blocks=8, page=64)
    # SGLang's call order: sort_candidate_blocks, then the schedule, then the consumer's logits
    meta = deep_gemm.get_paged_sparse_mqa_logits_metadata(c["lens"], c["table"], torch.arange(3, dtype=torch.int32),
                                                         64, c["blocks"], torch.int8, 8)
    logits = deep_gemm.fp8_fp4_paged_sparse_mqa_logits((c["q"][:, None], c["q_sf"][:, None]), c["cache"],
                                                      c["w"].bfloat16(), meta, 8, 8)
    c["w"] = c["w"].bfloat16().float()
    check(c, logits)
    out["logits"] = list(logits.shape)
print(json.dumps(out))
"""


def run_child(root, with_sm12x):
    # the repository's sitecustomize installs the import watcher, as the mounted bundle's does
    env = {"WITH_SM12X": "1" if with_sm12x else "0", "REPO": REPO, "TRITON_INTERPRET": "1",
           "SM12X_DISABLE": None if with_sm12x else "1"}
    return last_json(run_py(CHILD, pythonpath=[REPO, root, os.path.join(REPO, "tests")], env=env))


def test_v41_backend_init_fails_on_sm120_without_sm12x(tree):
    root, _ = tree
    out = run_child(root, with_sm12x=False)
    assert "paged sparse MQA logits" in out["error"]


def test_v41_backend_init_builds_the_sparse_table_with_sm12x(tree):
    root, released = tree
    out = run_child(root, with_sm12x=True)
    assert "error" not in out, out
    assert out["decode"] == "SparseTableBackend"
    # the flag is SGLang's again after the call (the memory pool's page size reads it)
    assert out["flag_after"] is False
    # a V4 model (no candidate blocks) is untouched
    assert out["dense_only"] == ["DenseBlocksBackend", "DenseBlocksBackend"]
    assert out["sparse_ours"] == [True, True]
    assert out["logits"] == [3, 64]
    print("released v41_indexer module:" if released else "stand-in v41_indexer module", released)

"""The MXFP4 indexer-cache record (:mod:`sm12x.patches.fp4_indexer`) on a stand-in vLLM 0.34.0
tree: without sm12x ``dsa_indexer_uses_fp4`` refuses ``indexer_kv_dtype='mxfp4'`` on SM120 (as
the released function does); with it DeepSeek-V4 / V4.1 get the FP4 cache (through the module's
attribute and a consumer's ``from`` copy), DeepSeek-V3.2 keeps the refusal, FP8 is untouched, and
the FP4 logits the indexer then calls are sm12x's.

``dsa_indexer_uses_fp4`` (and ``DSA_INDEXER_KV_DTYPES``) is the released function itself, read
from the vLLM 0.34.0 wheel when it is on this machine (``SM12X_FRAMEWORK_WHEELS``, default
/tmp/wheels), else a stand-in with its checks; the rest of its module is a stand-in."""
import ast
import glob
import os
import zipfile

import pytest

from tests_support import REPO, dist_infos, last_json, run_py, write_tree

WHEELS = os.environ.get("SM12X_FRAMEWORK_WHEELS", "/tmp/wheels")
INDEXER = "vllm/v1/attention/backends/mla/indexer.py"

HEADER = '''
from vllm.config import VllmConfig
from vllm.platforms import current_platform
'''

STANDIN_GATE = '''
DSA_INDEXER_KV_DTYPES = ("fp8", "mxfp4")

def dsa_indexer_uses_fp4(vllm_config: VllmConfig) -> bool:
    kv_dtype = vllm_config.attention_config.resolve_indexer_kv_dtype("fp8")
    if kv_dtype not in DSA_INDEXER_KV_DTYPES:
        raise ValueError(f"indexer_kv_dtype={kv_dtype!r} is not supported")
    use_fp4 = kv_dtype == "mxfp4"
    if use_fp4 and not current_platform.is_device_capability_family(100):
        raise ValueError("indexer_kv_dtype='mxfp4' requires Blackwell datacenter GPUs "
                         "(sm_10x, e.g. B200/GB200); sm_120 (consumer Blackwell) and "
                         "earlier architectures are not supported.")
    return use_fp4
'''

TREE = {
    "vllm/__init__.py": "",
    "vllm/config/__init__.py": "class VllmConfig:\n    pass\n",
    # an RTX PRO 6000 as vLLM's platform sees it
    "vllm/platforms/__init__.py": """
        class _Cuda:
            def is_rocm(self):
                return False
            def is_cuda(self):
                return True
            def is_device_capability_family(self, major):
                return major == 120
        current_platform = _Cuda()
    """,
    "vllm/v1/__init__.py": "",
    "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/backends/__init__.py": "",
    "vllm/v1/attention/backends/mla/__init__.py": "",
    "vllm/models/__init__.py": "",
    "vllm/models/deepseek_v41/__init__.py": "",
    # a consumer's copy, taken at import as the released attention module does
    "vllm/models/deepseek_v41/attention.py": """
        from vllm.v1.attention.backends.mla.indexer import dsa_indexer_uses_fp4

        def indexer_uses_fp4(cfg):
            return dsa_indexer_uses_fp4(cfg)
    """,
    "vllm/third_party/__init__.py": "",
    "vllm/third_party/deep_gemm/__init__.py": """
        def fp8_fp4_mqa_logits(*args, **kwargs):
            raise RuntimeError("stand-in: the vendored SM100 kernel")
        def fp8_fp4_paged_mqa_logits(*args, **kwargs):
            raise RuntimeError("stand-in: the vendored SM100 kernel")
        def get_paged_mqa_logits_metadata(*args, **kwargs):
            raise RuntimeError("stand-in")
    """,
}


def released_gate():
    """The released module's ``DSA_INDEXER_KV_DTYPES`` and ``dsa_indexer_uses_fp4`` source."""
    for whl in sorted(glob.glob(os.path.join(WHEELS, "vllm-0.34.0-*.whl"))):
        with zipfile.ZipFile(whl) as z:
            source = z.read(INDEXER).decode()
        parts = []
        for node in ast.parse(source).body:
            names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
            if getattr(node, "name", None) == "dsa_indexer_uses_fp4" or "DSA_INDEXER_KV_DTYPES" in names:
                parts.append(ast.get_source_segment(source, node))
        assert len(parts) == 2, "the released module no longer has the gate this test reads"
        return "\n\n".join(parts) + "\n"
    return None


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp4_gate")
    released = released_gate()
    files = dict(TREE, **dist_infos())
    files[INDEXER] = HEADER + (released if released is not None else STANDIN_GATE)
    write_tree(root, files)
    return root, released is not None


CHILD = """
import json, os
from types import SimpleNamespace as NS
from vllm.v1.attention.backends.mla import indexer
from vllm.models.deepseek_v41 import attention

def cfg(kv_dtype, model_type):
    return NS(attention_config=NS(resolve_indexer_kv_dtype=lambda default: kv_dtype),
              model_config=NS(hf_config=NS(model_type=model_type)))

def ask(fn, *a):
    try:
        return fn(cfg(*a))
    except ValueError as e:
        return "ValueError: " + str(e)[:60]

out = {
    "v41": ask(indexer.dsa_indexer_uses_fp4, "mxfp4", "deepseek_v41"),
    "v41_copy": ask(attention.indexer_uses_fp4, "mxfp4", "deepseek_v41"),
    "v4": ask(indexer.dsa_indexer_uses_fp4, "mxfp4", "deepseek_v4"),
    "v32": ask(indexer.dsa_indexer_uses_fp4, "mxfp4", "deepseek_v32"),
    "fp8": ask(indexer.dsa_indexer_uses_fp4, "fp8", "deepseek_v41"),
    "bad": ask(indexer.dsa_indexer_uses_fp4, "fp16", "deepseek_v41"),
}
import vllm.third_party.deep_gemm as vendored
out["logits_ours"] = [bool(getattr(getattr(vendored, n), "__sm12x_patch__", None))
                      for n in ("fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits")]
print(json.dumps(out))
"""


def run_child(root, env):
    # the repository's sitecustomize installs the import watcher, as the mounted bundle's does
    return last_json(run_py(CHILD, pythonpath=[REPO, root], env=dict(env, SM12X_SHIMS="0")))


def test_refused_on_sm120_without_sm12x(tree):
    root, _ = tree
    out = run_child(root, {"SM12X_DISABLE": "1"})
    for key in ("v41", "v41_copy", "v4", "v32"):
        assert out[key].startswith("ValueError: indexer_kv_dtype='mxfp4' requires Blackwell"), out
    assert out["fp8"] is False


def test_v4_and_v41_get_the_fp4_cache_with_sm12x(tree):
    root, released = tree
    out = run_child(root, {})
    assert out["logits_ours"] == [True, True], out
    assert out["v41"] is True and out["v41_copy"] is True and out["v4"] is True, out
    # V3.2's indexer inserts keys unfused, which has no FP4 form: its refusal stands
    assert out["v32"].startswith("ValueError: indexer_kv_dtype='mxfp4' requires Blackwell"), out
    assert out["fp8"] is False and out["bad"].startswith("ValueError: indexer_kv_dtype='fp16'"), out
    print("released dsa_indexer_uses_fp4" if released else "stand-in dsa_indexer_uses_fp4")


def test_the_refusal_stands_where_the_fp4_logits_are_not_sm12x(tree):
    """SM12X_SKIP keeps the vendored DeepGEMM's logits: then vLLM's refusal is the answer."""
    root, _ = tree
    out = run_child(root, {"SM12X_SKIP": "vllm.third_party.deep_gemm"})
    assert out["logits_ours"] == [False, False]
    assert out["v41"].startswith("ValueError: indexer_kv_dtype='mxfp4' requires Blackwell"), out

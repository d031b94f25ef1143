"""``sm12x status``'s model rows (:mod:`sm12x.commands.model_paths`): what serves DeepSeek-V4.1 and
GLM-5-next's attention and indexer on SM12x per installed release, and through which records."""
import json

from tests_support import REPO, dist_infos, run_py, write_tree

from sm12x.commands import model_paths
from sm12x.patches import all_patches

GATE = "sglang.v41.candidate_indexer_gate"
SPARSE = ("deep_gemm.get_paged_sparse_mqa_logits_metadata", "deep_gemm.fp8_fp4_paged_sparse_mqa_logits")


def _rows(versions, states):
    patch_rows = [{"name": n, "state": s, "reason": r} for n, (s, r) in states.items()]
    return {(r["framework"], r["part"]): r for r in model_paths.model_rows(versions, patch_rows)}


def test_sglang_v41_indexer_follows_the_records():
    served = {GATE: ("applied", ""), SPARSE[0]: ("applied", ""), SPARSE[1]: ("applied", "")}
    row = _rows({"sglang": "0.5.23"}, served)[("sglang", "DeepSeek-V4.1 indexer")]
    assert row["serves"].startswith("SGLang's sparse-table candidate indexer") and GATE in row["via"]
    # sm12x's stand-in deep_gemm carries the sparse functions itself
    shim = dict(served, **{n: ("skipped", "deep_gemm is sm12x's own stand-in module") for n in SPARSE})
    assert _rows({"sglang": "0.5.23"}, shim)[("sglang", "DeepSeek-V4.1 indexer")]["serves"].startswith("SGLang's")
    off = dict(served, **{GATE: ("skipped", "turned off by SM12X_SKIP")})
    row = _rows({"sglang": "0.5.23"}, off)[("sglang", "DeepSeek-V4.1 indexer")]
    assert row["serves"].startswith("nothing: SGLang raises RuntimeError") and "SM12X_SKIP" in row["via"]


def test_vllm_0340_rows_and_ranges():
    rows = _rows({"vllm": "0.34.0", "sglang": "0.5.23"}, {})
    assert "FlashInfer's SM120 sparse MLA" in rows[("vllm", "DeepSeek-V4.1 attention")]["serves"]
    assert rows[("vllm", "GLM-5-next indexer")]["serves"].startswith("the vendored DeepGEMM's own")
    assert rows[("sglang", "DeepSeek-V4.1 attention")]["via"] == ""
    # releases without either model's code get no row
    assert _rows({"vllm": "0.33.0", "sglang": "0.5.22"}, {}) == {}


def test_top_k_rows_follow_the_records():
    """The V4.1 and GLM-5-next top-k rows say the fused top-k serves only with every record they
    take applied, and name the first that is not."""
    versions = {"vllm": "0.34.0", "sglang": "0.5.23"}
    for framework, part, served_text, other_text in (
            ("vllm", "DeepSeek-V4.1 indexer top-k", "sm12x's fused", "[rows, max_model_len] FP32 logits"),
            ("vllm", "GLM-5-next indexer top-k", "sm12x's fused", "[rows, max_model_len] FP32 logits"),
            ("sglang", "DeepSeek-V4.1 indexer top-k", "the candidate source layer's decode on sm12x's fused",
             "SGLang's own")):
        path = next(p for p in model_paths.PATHS if p.experts == part and p.framework == framework)
        served = {n: ("applied", "") for n in path.records}
        row = _rows(versions, served)[(framework, part)]
        assert row["serves"].startswith(served_text) and path.records[-1] in row["via"], row
        off = dict(served, **{path.records[-1]: ("skipped", "turned off by SM12X_SKIP")})
        row = _rows(versions, off)[(framework, part)]
        assert row["serves"].startswith(other_text) and "SM12X_SKIP" in row["via"], row


def test_paths_name_registered_records():
    names = {p.name for p in all_patches()}
    for path in model_paths.PATHS:
        assert set(path.records) <= names, path


def test_status_prints_the_rows(tmp_path):
    root = write_tree(tmp_path, {"sglang/__init__.py": "", **dist_infos({"sglang": "0.5.23"})})
    code = f"import sys; sys.path.insert(0, {REPO!r}); from sm12x.cli import main; sys.exit(main(%r))"
    text = run_py(code % (["status"],), pythonpath=[root], check=False).stdout
    assert "models:     sglang 0.5.23: DeepSeek-V4.1 attention: SGLang's SM120 decode" in text, text
    data = json.loads(run_py(code % (["status", "--json"],), pythonpath=[root], check=False).stdout)
    assert {r["part"] for r in data["models"]} == {"DeepSeek-V4.1 attention", "DeepSeek-V4.1 indexer",
                                                   "DeepSeek-V4.1 indexer top-k"}

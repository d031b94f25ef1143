"""``sm12x status``'s MoE rows (:mod:`sm12x.commands.moe_paths`): per installed release, what serves
DeepSeek-V4's experts on SM12x and through which records, or what runs when a record does not
apply."""
import json

from tests_support import REPO, dist_infos, run_py, write_tree

from sm12x.commands import moe_paths

HYBRID = "sglang.moe.HybridFp8NvFp4Config.get_quant_method"
FP8 = "sglang.moe.Fp8Config.get_quant_method"
RUNNER = "sglang.moe.runner_choice"


def _rows(versions, states):
    patch_rows = [{"name": n, "state": s, "reason": r} for n, (s, r) in states.items()]
    return {r["experts"]: r for r in moe_paths.moe_rows(versions, patch_rows)}


def test_sglang_rows_follow_the_records():
    rows = _rows({"sglang": "0.5.15.post1"}, {HYBRID: ("would-apply", ""), FP8: ("applied", "")})
    draft = rows["MTP draft's MXFP4 experts of NVFP4 checkpoints"]
    assert draft["serves"].startswith("SGLang's MXFP4 Marlin") and draft["via"] == f"sm12x records: {HYBRID}"
    target = rows["MXFP4 experts of FP8 checkpoints (target and MTP draft)"]
    assert target["serves"].startswith("Marlin W4A16") and FP8 in target["via"]
    assert rows["DeepGEMM runner (--moe-runner-backend deep_gemm, DeepEP)"]["serves"].startswith("unavailable")

    rows = _rows({"sglang": "0.5.15.post1"}, {HYBRID: ("skipped", "turned off by SM12X_SKIP"),
                                              FP8: ("applied", "")})
    draft = rows["MTP draft's MXFP4 experts of NVFP4 checkpoints"]
    assert "SM100-only" in draft["serves"] and draft["via"] == f"{HYBRID} skipped (turned off by SM12X_SKIP)"


def test_own_kernels_and_ranges():
    rows = _rows({"sglang": "0.5.23", "vllm": "0.34.0"}, {HYBRID: ("would-apply", ""), RUNNER: ("applied", "")})
    assert rows["MXFP4 routed experts"]["via"] == ""
    assert "vendored DeepGEMM's own SM120" in rows["MXFP4 routed experts"]["serves"]
    assert "CUTLASS" in rows["MXFP4 experts of FP8 checkpoints (target and MTP draft)"]["serves"]
    nvfp4 = rows["NVFP4 routed experts (target)"]
    assert nvfp4["serves"].startswith("SGLang's NVFP4 Marlin") and nvfp4["via"] == f"sm12x records: {RUNNER}"
    rows = _rows({"sglang": "0.5.15.post1"}, {RUNNER: ("skipped", "sglang 0.5.15.post1 outside the checked range")})
    assert rows["NVFP4 routed experts (target)"]["serves"].startswith("nothing correct")
    # a release no statement was checked for gets no row
    assert _rows({"sglang": "0.5.10", "vllm": "0.22.0"}, {}) == {}


def test_vllm_0221_without_the_records_names_marlin():
    rows = _rows({"vllm": "0.22.1"}, {
        "vllm.third_party.deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous": ("would-apply", ""),
        "vllm.fused_moe.DeepGemmFP4Experts._supports_current_device": ("skipped", "turned off by SM12X_SKIP")})
    row = rows["MXFP4 routed experts"]
    assert row["serves"].startswith("Marlin W4A16") and "_supports_current_device skipped" in row["via"]


def test_status_prints_the_rows(tmp_path):
    # an SGLang 0.5.23 install whose files hold the hybrid record's target
    root = write_tree(tmp_path, {
        "sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/srt/layers/__init__.py": "",
        "sglang/srt/layers/quantization/__init__.py": "",
        "sglang/srt/layers/quantization/modelopt_quant.py":
            "class HybridFp8NvFp4Config:\n    def get_quant_method(self, layer, prefix):\n        pass\n",
        **dist_infos({"sglang": "0.5.23"})})
    code = f"import sys; sys.path.insert(0, {REPO!r}); from sm12x.cli import main; sys.exit(main(%r))"
    text = run_py(code % (["status"],), pythonpath=[root], check=False).stdout
    assert "MoE:        sglang 0.5.23: MTP draft's MXFP4 experts of NVFP4 checkpoints: SGLang's MXFP4" in text, text
    data = json.loads(run_py(code % (["status", "--json"],), pythonpath=[root], check=False).stdout)
    draft = [r for r in data["moe"] if r["experts"].startswith("MTP draft")]
    assert draft and draft[0]["via"] == f"sm12x records: {HYBRID}", data["moe"]


def test_every_checked_release_has_each_sglang_row():
    """Every SGLang release 0.5.15-0.5.23 gets one row per kind of experts (no gap, no overlap);
    every vLLM release 0.22.1-0.34.0 one row."""
    for release in ("0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
                    "0.5.22", "0.5.23"):
        rows = moe_paths.moe_rows({"sglang": release}, [])
        kinds = [r["experts"] for r in rows]
        assert len(kinds) == len(set(kinds)) == 4, (release, kinds)
    for release in ("0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.30.0", "0.34.0"):
        assert len(moe_paths.moe_rows({"vllm": release}, [])) == 1, release


def test_vllm_0240_names_the_gate():
    gate = "vllm.platforms.cuda.support_deep_gemm"
    row = _rows({"vllm": "0.24.0"}, {gate: ("applied", "")})["MXFP4 routed experts"]
    assert row["serves"].startswith("Marlin W4A16") and row["via"] == f"sm12x records: {gate}"
    row = _rows({"vllm": "0.24.0"}, {gate: ("skipped", "turned off by SM12X_SKIP")})["MXFP4 routed experts"]
    assert "no SM120 kernels: fails" in row["serves"] and "VLLM_USE_DEEP_GEMM=0" in row["serves"]


def test_sglang_0517_nvfp4_experts_take_the_runner_choice():
    row = _rows({"sglang": "0.5.17"}, {RUNNER: ("applied", "")})["NVFP4 routed experts (target)"]
    assert row["serves"].startswith("SGLang's NVFP4 Marlin") and row["via"] == f"sm12x records: {RUNNER}"
    rows = _rows({"sglang": "0.5.16"}, {})
    assert rows["NVFP4 routed experts (target)"]["serves"].startswith("nothing correct")
    assert "CUTLASS" in rows["MXFP4 experts of FP8 checkpoints (target and MTP draft)"]["serves"]


def test_paths_name_registered_records():
    """A path's record names are real records (a misspelt one would read as 'not registered' and
    show the path's fallback as what serves)."""
    from sm12x.patches import all_patches

    names = {p.name for p in all_patches()}
    assert [r for path in moe_paths.PATHS for r in path.records if r not in names] == []

"""The plan (``sm12x status``, and so ``doctor``) says would-apply only for a patch that will apply:
its target sub-module and attribute exist in the installed version, and what the replacement runs
on (torch, triton) is installed; otherwise skipped, naming what is missing. Nothing is imported to
find out. Real interpreters, with a stand-in pip FlashMLA (``flash_mla`` 1.2.0) written here."""
import json

from tests_support import REPO, last_json, run_py, write_tree

FLASH_MLA = {
    "flash_mla/__init__.py": """
        from flash_mla.flash_mla_interface import flash_mla_with_kvcache, get_mla_metadata
    """,
    # this version has no get_mla_decoding_metadata and no compiled flash_mla.cuda
    "flash_mla/flash_mla_interface.py": """
        def flash_mla_with_kvcache(*args, **kwargs):
            return "original"

        def get_mla_metadata(*args, **kwargs):
            return "original-meta"
    """,
    "flash_mla-1.2.0.dist-info/METADATA": """
        Metadata-Version: 2.1
        Name: flash-mla
        Version: 1.2.0
    """,
}

PLAN = """
import json, sys
from sm12x.commands.status import status_data
data = status_data()
print(json.dumps({"plan": {p["name"]: [p["state"], p["reason"]] for p in data["patches"]
                           if p["target"].startswith("flash_mla")},
                  "deep_gemm": [[p["state"], p["reason"]] for p in data["patches"]
                                if p["target"].startswith("deep_gemm:")],
                  "imported": sorted(m for m in ("flash_mla", "torch", "triton") if m in sys.modules)}))
"""


def test_missing_submodule_and_attribute_are_skipped_with_the_reason(tmp_path):
    write_tree(tmp_path, FLASH_MLA)
    out = last_json(run_py(PLAN, pythonpath=[REPO, tmp_path]))
    plan = out["plan"]
    assert plan["flash_mla.interface.decode"] == ["would-apply", ""]
    assert plan["flash_mla.metadata"] == ["would-apply", ""]
    assert plan["flash_mla.cuda.sparse_decode_fwd"] == [
        "skipped", "module flash_mla.cuda does not exist in the installed version"]
    assert plan["flash_mla.interface.decoding_metadata"] == [
        "skipped", "flash_mla.flash_mla_interface of the installed version has no get_mla_decoding_metadata"]
    assert plan["flash_mla.decoding_metadata"] == [
        "skipped", "flash_mla of the installed version has no get_mla_decoding_metadata"]
    assert out["imported"] == []


def test_without_torch_nothing_would_apply(tmp_path):
    """python -S: no site-packages, so neither torch nor triton is importable (as in an image
    without them); the stand-in FlashMLA is still installed."""
    write_tree(tmp_path, FLASH_MLA)
    out = last_json(run_py(PLAN, pythonpath=[REPO, tmp_path], flags=("-S",)))
    states = {tuple(v) for v in out["plan"].values()}
    assert ("skipped", "needs torch, which is not installed") in states
    assert not [n for n, (s, _) in out["plan"].items() if s == "would-apply"]


def test_the_deep_gemm_stand_in_is_not_an_installed_target(tmp_path):
    """No deep_gemm installed: sm12x's own stand-in would be imported instead, and the patches skip
    it at import, so the plan must not say would-apply for deep_gemm's patches."""
    out = last_json(run_py(PLAN, pythonpath=[REPO, tmp_path]))
    assert out["deep_gemm"] and all(s == ["skipped", "deep_gemm is not installed"] for s in out["deep_gemm"])


def test_plan_agrees_with_what_applies(tmp_path):
    """What the plan says would apply is what applies when the framework is imported."""
    write_tree(tmp_path, FLASH_MLA)
    proc = run_py("""
import json
from sm12x import apply
planned = {p["name"]: p["state"] for p in apply.plan() if p["target"].startswith("flash_mla")}
import sm12x
sm12x.install()
import flash_mla, flash_mla.flash_mla_interface
done = {n: s for n, (s, _) in apply.OUTCOMES.items() if n in planned}
print(json.dumps({"planned": planned, "done": done}))
""", pythonpath=[REPO, tmp_path])
    out = last_json(proc)
    would = sorted(n for n, s in out["planned"].items() if s == "would-apply")
    applied = sorted(n for n, s in out["done"].items() if s == "applied")
    assert would and would == applied, json.dumps(out, indent=1)

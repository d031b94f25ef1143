"""`sm12x status` tells the truth where a new user meets it: a Python without torch, SM12X_DISABLE,
records whose release is outside their range, and `--json --apply` in a process whose frameworks
print on stdout. Each case runs the real CLI in a fresh interpreter."""
import json
import os
import subprocess
import sys

from tests_support import REPO, dist_infos, run_py, write_tree


def status(*args, pythonpath, env=None, flags=()):
    full = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_") and k != "PYTHONPATH"}
    full.update({"PYTHONPATH": os.pathsep.join(map(str, pythonpath)), **(env or {})})
    return subprocess.run([sys.executable, *flags, "-m", "sm12x", "status", *args], capture_output=True,
                          text=True, env=full, cwd=str(pythonpath[-1]), timeout=300)


def test_without_torch_reasons_are_not_split_and_no_stand_in_is_promised(tmp_path):
    # -S: no site-packages, so neither torch nor triton; a FlashMLA stand-in is installed
    write_tree(tmp_path, {"flash_mla/__init__.py": "def flash_mla_with_kvcache(*a):\n    pass\n"})
    proc = status(pythonpath=[REPO, tmp_path], env={"SM12X_ARCH": "12.0"}, flags=("-S",))
    assert proc.returncode == 0, proc.stderr
    not_installed = next((x for x in proc.stdout.splitlines() if "not installed here:" in x), "")
    assert "which" not in not_installed and "needs torch" not in not_installed, proc.stdout
    assert "deep_gemm: available" not in proc.stdout, proc.stdout
    data = json.loads(status("--json", pythonpath=[REPO, tmp_path], env={"SM12X_ARCH": "12.0"}, flags=("-S",)).stdout)
    assert data["shims"]["deep_gemm"] == "off (needs torch, which is not installed)"


def test_disable_says_the_bootstrap_ran_and_patched_nothing(tmp_path):
    proc = status(pythonpath=[REPO], env={"SM12X_DISABLE": "1", "SM12X_ARCH": "12.0"})
    line = next(x for x in proc.stdout.splitlines() if x.startswith("bootstrap:"))
    assert "ran, but SM12X_DISABLE=1" in line and "did not run" not in proc.stdout, proc.stdout
    data = json.loads(status("--json", pythonpath=[REPO], env={"SM12X_DISABLE": "1"}).stdout)
    assert data["bootstrap"]["disabled"] is True and data["bootstrap"]["active"] is False


def test_the_release_range_is_checked_first(tmp_path):
    """A record for a release range the installed one is outside of says so, before its arch
    (a 12.1-only gate on a 12.0 GPU) and before importing a target module that this release lacks."""
    write_tree(tmp_path, {**dist_infos({"sglang": "0.5.23"}), "sglang/__init__.py": ""})
    proc = run_py("""
        import json
        from sm12x import apply
        from sm12x.patches import Patch
        gate = Patch(name="t.gate", target="sglang.srt.utils.common:get_device_sm", make="x:y", why="t",
                     upstream="t", library="sglang", versions=">=0.5.15,<0.5.20", arch="12.1",
                     retire_when="t")
        gone = Patch(name="t.gone", target="sglang.srt.no_such_module:f", make="x:y", why="t",
                     upstream="t", library="sglang", versions=">=0.5.15,<0.5.20", retire_when="t")
        apply.all_patches = lambda: [gate, gone]
        rows = {r["name"]: r["reason"] for r in apply.apply_installed()}
        print(json.dumps([apply.eligibility(gate)[1], rows["t.gone"]]))
    """, pythonpath=[REPO, tmp_path], env={"SM12X_ARCH": "12.0"})
    gate_reason, gone_reason = json.loads(proc.stdout.strip().splitlines()[-1])
    assert gate_reason == "sglang 0.5.23 outside the checked range >=0.5.15,<0.5.20"
    assert gone_reason == "sglang 0.5.23 outside the checked range >=0.5.15,<0.5.20"


def test_json_apply_keeps_framework_output_off_stdout(tmp_path):
    write_tree(tmp_path, {"flash_mla/__init__.py": """
        import logging, os, sys
        print("INFO a framework's log line on stdout")
        os.write(1, b"a line written to file descriptor 1\\n")
        handler = logging.StreamHandler(sys.stdout)
        log = logging.getLogger("framework")
        log.addHandler(handler)
        log.warning("a logger that holds sys.stdout")
        def flash_mla_with_kvcache(*a):
            log.warning("called later")
    """})
    proc = status("--json", "--apply", pythonpath=[REPO, tmp_path], env={"SM12X_ARCH": "12.0"})
    data = json.loads(proc.stdout)  # the JSON alone
    assert "bootstrap" in data
    for line in ("a framework's log line", "file descriptor 1", "holds sys.stdout"):
        assert line in proc.stderr, proc.stderr


def test_a_torch_ops_library_is_not_a_module_to_patch(tmp_path):
    """sgl-flash-mla ships flash_mla/cuda.abi3.so as a torch.ops library (no PyInit_cuda): the
    record for flash_mla.cuda says so instead of would-apply."""
    write_tree(tmp_path, {"flash_mla/__init__.py": "def flash_mla_with_kvcache(*a):\n    pass\n",
                          "flash_mla/cuda.abi3.so": "\x7fELF sparse_decode_fwd torch ops only",
                          **dist_infos({"sgl-flash-mla": "1.0.0"})})
    data = json.loads(status("--json", pythonpath=[REPO, tmp_path], env={"SM12X_ARCH": "12.0"}).stdout)
    row = next(p for p in data["patches"] if p["name"] == "flash_mla.cuda.sparse_decode_fwd")
    assert row["state"] == "skipped" and "loaded through torch.ops" in row["reason"], row

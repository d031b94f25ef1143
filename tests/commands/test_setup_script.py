"""scripts/setup.sh installs what its header and the README say: the CPU build of torch 2.13.0 (not
PyPI's multi-GB CUDA build) when no torch is there, Triton 3.9.0 when none came with torch, and
another torch build only when asked. A stand-in ``python`` records every pip command instead of
installing anything."""
import os
import subprocess

import pytest

from tests_support import REPO

FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_STATE/calls"
if [ "$1" = "-c" ]; then
    case "$2" in
        "import torch") [ -e "$FAKE_STATE/torch" ]; exit $? ;;
        "import triton") [ -e "$FAKE_STATE/triton" ]; exit $? ;;
    esac
    exit 0
fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    case "$*" in *" torch=="*) touch "$FAKE_STATE/torch"
                              [ -n "${FAKE_TORCH_BRINGS_TRITON:-}" ] && touch "$FAKE_STATE/triton" ;; esac
    case "$*" in *" triton=="*) touch "$FAKE_STATE/triton" ;; esac
    exit 0
fi
[ "$1" = "-" ] && cat >/dev/null
exit 0
"""


def setup(tmp_path, have=(), **env):
    state = tmp_path / "state"
    state.mkdir()
    for name in have:
        (state / name).touch()
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    full = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    full.update({"PYTHON": str(python), "FAKE_STATE": str(state), **env})
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "setup.sh")], capture_output=True, text=True,
                          env=full, timeout=300)
    calls = (state / "calls").read_text().splitlines() if (state / "calls").exists() else []
    return proc, [c for c in calls if c.startswith("-m pip install")]


def test_fresh_machine_gets_the_cpu_torch_and_triton_3_9(tmp_path):
    proc, pips = setup(tmp_path)
    assert proc.returncode == 0, proc.stderr
    torch = [c for c in pips if " torch" in c]
    assert torch == ["-m pip install -q torch==2.13.0+cpu --extra-index-url https://download.pytorch.org/whl/cpu"]
    assert "-m pip install -q triton==3.9.0" in pips
    assert any(c.endswith("-e .") for c in pips)


def test_an_installed_torch_and_triton_are_kept(tmp_path):
    proc, pips = setup(tmp_path, have=("torch", "triton"))
    assert proc.returncode == 0, proc.stderr
    assert not [c for c in pips if "torch" in c or "triton" in c]


def test_a_cuda_build_on_request_keeps_its_own_triton(tmp_path):
    proc, pips = setup(tmp_path, SM12X_TORCH="cu130", FAKE_TORCH_BRINGS_TRITON="1")
    assert proc.returncode == 0, proc.stderr
    assert [c for c in pips if "torch" in c or "triton" in c] == [
        "-m pip install -q torch==2.13.0+cu130 --extra-index-url https://download.pytorch.org/whl/cu130"]


@pytest.mark.parametrize("choice, expected", [("pypi", "torch==2.13.0"), ("skip", None)])
def test_other_choices(tmp_path, choice, expected):
    proc, pips = setup(tmp_path, SM12X_TORCH=choice)
    assert proc.returncode == 0, proc.stderr
    torch = [c for c in pips if " torch" in c]
    assert torch == ([f"-m pip install -q {expected}"] if expected else [])


def test_unknown_choice_is_one_line(tmp_path):
    proc, pips = setup(tmp_path, SM12X_TORCH="banana")
    assert proc.returncode == 2 and not pips
    assert proc.stderr.strip() == "setup: SM12X_TORCH=banana: use cpu (default), a CUDA tag such as cu130, pypi or skip"


FAKE_TOOL = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$FAKE_STATE/tools"
exit 1
"""


@pytest.mark.parametrize("opt_in", [None, "0", "1"])
def test_docker_engine_only_on_request(tmp_path, opt_in):
    """No Docker engine is installed or started unless SM12X_SETUP_DOCKER=1 (which CI sets). The
    engine tools are stand-ins that only record their calls."""
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("dockerd", "apt-get", "pgrep"):
        (tools / name).write_text(FAKE_TOOL)
        (tools / name).chmod(0o755)
    env = {"PATH": f"{tools}:{os.environ['PATH']}", "DOCKER_HOST": f"unix://{tmp_path}/no.sock",
           "SM12X_DOCKERD_WAIT": "1", "SM12X_DOCKERD_LOG": str(tmp_path / "dockerd.log")}
    if opt_in is not None:
        env["SM12X_SETUP_DOCKER"] = opt_in
    proc, _ = setup(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    touched = "ci_docker:" in proc.stderr
    assert touched == (opt_in == "1"), proc.stderr
    if opt_in != "1":
        assert not (tmp_path / "state" / "tools").exists()
        assert "SM12X_SETUP_DOCKER=1" in proc.stderr  # says how to get the docker tests


def test_ci_asks_for_the_docker_engine():
    with open(os.path.join(REPO, ".ci", "run")) as f:
        assert "SM12X_SETUP_DOCKER=1 bash scripts/setup.sh" in f.read()

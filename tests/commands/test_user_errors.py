"""What a user touches: ``sm12x bundle`` never deletes what it did not write, and every user error
in the CLI is one line naming the argument and the fix, with a non-zero exit, never a traceback.

Each case runs the real CLI (``python -m sm12x``) in a subprocess, as a user would."""
import os
import stat
import subprocess
import sys

import pytest

from tests_support import REPO, run_py

NO_ENGINE = "unix:///nonexistent/sm12x-test-docker.sock"


def cli(*args, env=None, cwd=REPO):
    full = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_")}
    full.update({"PYTHONPATH": REPO, "DOCKER_HOST": NO_ENGINE, **(env or {})})
    return subprocess.run([sys.executable, "-m", "sm12x", *args], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=300)


def one_line_error(proc, *needles):
    """The process failed with exactly one stderr line that names every needle, no traceback."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# ---------------------------------------------------------------------------------------------------
# bundle
# ---------------------------------------------------------------------------------------------------

def test_bundle_refuses_a_folder_with_user_files(tmp_path):
    dest = tmp_path / "mine"
    (dest / "sm12x").mkdir(parents=True)
    (dest / "sm12x" / "notes.txt").write_text("mine")
    (dest / "keep.py").write_text("x = 1\n")
    before = tree(dest)
    line = one_line_error(cli("bundle", str(dest)), "DIR", str(dest), "not empty", "new or empty folder")
    assert line.startswith("sm12x bundle: ")
    assert tree(dest) == before and (dest / "sm12x" / "notes.txt").read_text() == "mine"


def test_rebundle_replaces_only_its_own_files(tmp_path):
    dest = tmp_path / "bundle"
    first = cli("bundle", str(dest))
    assert first.returncode == 0, first.stderr
    ours = set(tree(dest))
    record = next(p for p in ours if p.endswith("RECORD"))
    assert "sm12x/__init__.py" in (dest / record).read_text()
    # the user adds files next to and inside the bundle; a file the old bundle wrote goes stale
    (dest / "sm12x" / "notes.txt").write_text("mine")
    (dest / "extra.py").write_text("x = 1\n")
    stale = dest / "sm12x" / "old_module.py"
    stale.write_text("OLD = 1\n")
    with open(dest / record, "a") as fh:
        fh.write("sm12x/old_module.py,,\n")
    second = cli("bundle", str(dest))
    assert second.returncode == 0, second.stderr
    assert "replaced the previous bundle with" in second.stdout and "2 other file(s)" in second.stdout
    assert (dest / "sm12x" / "notes.txt").read_text() == "mine"
    assert (dest / "extra.py").read_text() == "x = 1\n"
    assert not stale.exists()  # listed in the old RECORD, not shipped any more: it was ours
    assert set(tree(dest)) == ours | {"sm12x/notes.txt", "extra.py"}
    assert not list(dest.rglob("extra*.pyc"))  # the user's modules are not byte-compiled by us


def test_bundle_byte_code_only_for_the_interpreters_asked(tmp_path):
    dest = tmp_path / "bundle"
    assert cli("bundle", str(dest)).returncode == 0
    tag = sys.implementation.cache_tag
    assert (dest / "__pycache__" / f"sitecustomize.{tag}.pyc").exists()
    out = cli("bundle", str(dest), "--no-compile")
    assert out.returncode == 0 and "byte code for: none" in out.stdout
    assert not list(dest.rglob("*.pyc"))  # the previous bundle's byte code was its own: gone


@pytest.mark.parametrize("case", ["file", "repo", "package", "unwritable", "python"])
def test_bundle_user_errors_are_one_line(tmp_path, case):
    if case == "file":
        target = tmp_path / "a-file"
        target.write_text("x")
        proc, needles = cli("bundle", str(target)), ["DIR", "is a file"]
    elif case == "repo":
        proc, needles = cli("bundle", "."), ["DIR .", "source tree"]
    elif case == "package":
        proc, needles = cli("bundle", os.path.join(REPO, "sm12x", "out")), ["inside the source folder sm12x/"]
    elif case == "unwritable":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders: run as a normal user to check this case")
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        proc, needles = cli("bundle", str(locked / "b")), ["not writable"]
    else:
        proc, needles = cli("bundle", str(tmp_path / "b"), "--compile-with", "python9.99"), \
            ["--compile-with python9.99", "no such interpreter"]
    one_line_error(proc, *needles)
    assert proc.returncode == 2


def _fake_python(tmp_path, body):
    exe = tmp_path / "fake-python"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize("body, needle", [("echo 'cannot load libpython' >&2; exit 127", "does not run"),
                                          ("echo 3.8", "is Python 3.8")])
def test_bundle_checks_compile_with_before_writing(tmp_path, body, needle):
    """A broken or too old --compile-with interpreter is refused before anything is written, and a
    previous bundle (its byte code included) stays as it was."""
    dest = tmp_path / "bundle"
    assert cli("bundle", str(dest)).returncode == 0
    before = tree(dest)
    assert any(p.endswith(".pyc") for p in before)
    line = one_line_error(cli("bundle", str(dest), "--compile-with", _fake_python(tmp_path, body)), needle)
    assert "needs Python 3.10" not in line or needle.startswith("is Python")
    assert tree(dest) == before
    fresh = tmp_path / "fresh"
    one_line_error(cli("bundle", str(fresh), "--compile-with", _fake_python(tmp_path, body)), needle)
    assert not fresh.exists()


def test_bundle_under_umask_077_is_readable_by_the_container_user(tmp_path):
    dest = tmp_path / "bundle"
    proc = subprocess.run(["sh", "-c", f"umask 077 && exec {sys.executable} -m sm12x bundle {dest}"],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    for d, dirs, files in os.walk(dest):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o755, d
        for f in files:
            assert stat.S_IMODE(os.stat(os.path.join(d, f)).st_mode) == 0o644, f
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    mine.chmod(0o700)
    proc = cli("bundle", str(mine))
    assert proc.returncode == 0 and "not readable by other users" in proc.stderr and f"chmod 755 {mine}" in proc.stderr


def test_bundle_into_read_only_folder_is_one_line(tmp_path):
    """As root (CI), a read-only bind mount is the unwritable case: writing fails inside the copy."""
    if os.geteuid() != 0 or not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("needs root to make a read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    made = subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], capture_output=True)
    if made.returncode != 0:
        made = subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True)
    if made.returncode != 0 or os.access(ro, os.W_OK) and _writable(ro):
        subprocess.run(["umount", str(ro)], capture_output=True)
        pytest.skip("cannot make a read-only mount here")
    try:
        one_line_error(cli("bundle", str(ro / "b")), "DIR", "not writable")
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def _writable(folder):
    try:
        (folder / ".probe").write_text("x")
        (folder / ".probe").unlink()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------
# SM12X_ARCH
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, cap", [
    ("12.0", (12, 0)), ("12.1", (12, 1)), ("120", (12, 0)), ("121", (12, 1)), ("sm_120", (12, 0)),
    ("sm120", (12, 0)), ("sm_121", (12, 1)), ("sm121", (12, 1)), ("9.0", (9, 0)), ("90", (9, 0)),
    ("sm_90", (9, 0)), ("sm90", (9, 0)), (" SM_120 ", (12, 0)),
])
def test_arch_spellings_accepted(value, cap):
    from sm12x import platform

    assert platform.parse_arch(value) == cap


@pytest.mark.parametrize("value", ["12", "sm_12", "banana", "1.2", "12.2", "8.9", "sm_120a", "120.0", ""])
def test_arch_spellings_refused(value):
    from sm12x import platform

    with pytest.raises(platform.ArchError, match="SM12X_ARCH"):
        platform.parse_arch(value)


@pytest.mark.parametrize("value", ["banana", "12", "sm_12"])
def test_bad_arch_in_the_cli_is_one_line(value):
    one_line_error(cli("status", env={"SM12X_ARCH": value}), f"SM12X_ARCH={value!r}", "12.0", "unset it")


def test_bad_arch_in_the_bundle_is_one_log_line(tmp_path):
    """Inside a process with the mount, a bad SM12X_ARCH is one warning line, not an internal error
    per watched module, and nothing is patched."""
    (tmp_path / "flash_mla").mkdir()
    (tmp_path / "flash_mla" / "__init__.py").write_text("def flash_mla_with_kvcache(x):\n    return x\n")
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("")
    proc = run_py("""
import flash_mla, sgl_kernel
from sm12x import apply
print(sorted({s for s, _ in apply.OUTCOMES.values()}))
""", pythonpath=[REPO, tmp_path], env={"SM12X_ARCH": "banana"})
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "SM12X_ARCH='banana'" in lines[0] and "no sm12x patch applies" in lines[0]
    assert "internal error" not in proc.stderr
    assert proc.stdout.strip() in ("['skipped']", "[]")


# ---------------------------------------------------------------------------------------------------
# launch --dry-run and doctor: every problem found, one line each
# ---------------------------------------------------------------------------------------------------

def test_dry_run_reports_every_problem(tmp_path):
    proc = cli("launch", "vllm", "--model", str(tmp_path / "no-model"), "--bundle", str(tmp_path / "no-bundle"),
               "--tp", "0", "--dry-run")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, proc.stderr
    assert lines[0].startswith("sm12x launch: --model ") and "no such folder" in lines[0]
    assert lines[1].startswith("sm12x launch: --bundle ") and "sm12x bundle" in lines[1]
    assert lines[2].startswith("sm12x launch: --tp 0:") and "1 or more" in lines[2]


@pytest.mark.parametrize("args, needle", [
    (["--tp", "-3"], "--tp -3"),
    (["--gpus", "0", "--tp", "2"], "--tp 2 needs 2 GPUs but --gpus 0 gives 1"),
    (["--port", "0"], "--port 0"),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS'"),
    (["--gpus", "banana"], "--gpus 'banana'"),
    (["--gpus", "0,x"], "--gpus '0,x'"),
])
def test_dry_run_bad_values(tmp_path, args, needle):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    one_line_error(cli("launch", "sglang", "--model", str(tmp_path), "--dry-run", *args), needle)


def test_dry_run_refuses_a_folder_without_a_model(tmp_path):
    (tmp_path / "empty").mkdir()
    one_line_error(cli("launch", "vllm", "--model", str(tmp_path / "empty"), "--bundle", REPO, "--dry-run"),
                   "--model", "no config.json")


def test_launch_help_names_the_framework_argument():
    proc = cli("launch", "--help")
    assert proc.returncode == 0 and "{vllm,sglang}" not in proc.stdout and "FRAMEWORK" in proc.stdout


def test_version_flag():
    from sm12x import __version__

    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"sm12x {__version__}"


def test_dry_run_bundle_that_is_not_a_bundle(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    (tmp_path / "b").mkdir()
    one_line_error(cli("launch", "vllm", "--model", str(tmp_path), "--bundle", str(tmp_path / "b"), "--dry-run"),
                   "not an sm12x bundle", "sm12x bundle DIR")


def test_dry_run_without_engine_still_prints_the_line(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    proc = cli("launch", "vllm", "--model", str(tmp_path), "--tp", "2", "--dry-run")
    assert proc.returncode == 1, proc.stderr  # the image could not be checked: not a clean pass
    assert proc.stdout.startswith("docker run ") and "--tensor-parallel-size 2" in proc.stdout
    assert "not checked" in proc.stderr


def test_doctor_reports_every_problem(tmp_path):
    proc = cli("doctor", "--image", "x:y", "--bundle", str(tmp_path), "--arch", "12", "--env", "BAD")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert [line.split(":")[1].strip().split()[0] for line in lines] == ["--bundle", "--arch", "--env", "no"]


def test_docker_folder_of_the_checkout_is_not_the_sdk(tmp_path):
    """Run from the repository root without the Docker SDK importable (python -S: no site-packages),
    the checkout's own docker/ folder must not pass for the SDK."""
    (tmp_path / "config.json").write_text("{}")  # a model folder
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["DOCKER_HOST"] = NO_ENGINE
    for argv in (["doctor", "--image", "x:y", "--bundle", REPO],
                 ["launch", "vllm", "--model", str(tmp_path), "--bundle", REPO]):
        proc = subprocess.run([sys.executable, "-S", "-m", "sm12x", *argv], capture_output=True, text=True,
                              cwd=REPO, env=env, timeout=120)
        line = one_line_error(proc, "Docker SDK", "pip install docker")
        assert "AttributeError" not in line and "engine" not in line


def test_help_is_for_users():
    for argv in (["--help"], ["launch", "--help"], ["launch", "vllm", "--help"], ["doctor", "--help"],
                 ["status", "--help"], ["bundle", "--help"]):
        proc = cli(*argv)
        assert proc.returncode == 0, proc.stderr
        assert "examples:" in proc.stdout, argv
        for internal in ("Contract:", "Pure helpers", "unit-tested", "``"):
            assert internal not in proc.stdout, (argv, internal)


def test_skip_typo_is_a_warning_in_every_process(tmp_path):
    """In the bundle, an SM12X_SKIP entry that names no patch is one warning per process (at the
    first watched import), so a typo is seen where the framework runs, not only in `status`."""
    for pkg in ("flash_mla", "sgl_kernel"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    proc = run_py("import flash_mla, sgl_kernel", pythonpath=[REPO, tmp_path],
                  env={"SM12X_SKIP": "flash_mla.decode,flash_mla.decod"})
    lines = [x for x in proc.stderr.splitlines() if "SM12X_SKIP" in x]
    assert len(lines) == 1, proc.stderr
    assert "SM12X_SKIP names no sm12x patch: flash_mla.decod (a typo skips nothing" in lines[0]


# ---------------------------------------------------------------------------------------------------
# selftest: what cannot work is said before any kernel runs
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("where, needle", [("no/such/dir/x.json", "does not exist"), ("", "is a folder")])
def test_selftest_json_path_checked_first(tmp_path, where, needle):
    proc = cli("selftest", "--json", str(tmp_path / where) if where else str(tmp_path))
    one_line_error(proc, "sm12x selftest: --json", needle)
    assert proc.returncode == 2 and proc.stdout == ""  # nothing ran


def test_selftest_without_torch_is_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_") and k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", "-m", "sm12x", "selftest"], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=120)  # -S: no site-packages, so no torch
    one_line_error(proc, "sm12x selftest: needs torch and triton", "scripts/setup.sh")


# ---------------------------------------------------------------------------------------------------
# contract
# ---------------------------------------------------------------------------------------------------

def test_contract_on_a_folder_without_a_release_is_one_line(tmp_path):
    one_line_error(cli("contract", str(tmp_path)), "sm12x contract:", "no Python distribution", "wheel")


def test_contract_without_torch_is_not_a_record_bug(tmp_path):
    """In a Python without torch the front ends cannot be built: the signatures are 'not checked',
    not 'incompatible' (the records this one-function release lacks are its only problems)."""
    (tmp_path / "deep_gemm").mkdir()
    (tmp_path / "deep_gemm" / "__init__.py").write_text(
        "def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True):\n"
        "    pass\n")
    (tmp_path / "deep_gemm-2.5.0.dist-info").mkdir()
    (tmp_path / "deep_gemm-2.5.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: deep_gemm\nVersion: 2.5.0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM12X_") and k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", "-m", "sm12x", "contract", str(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)  # -S: no site-packages, no torch
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "signature: incompatible" not in proc.stdout and "not checked: the front end needs torch" in proc.stdout

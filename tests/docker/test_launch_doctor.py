"""Unit tests of sm12x.commands.launch and sm12x.commands.doctor: no Docker engine needed (one test runs the doctor probe
with this machine's python instead of a container)."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from sm12x.commands import doctor, launch
from sm12x.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_ENGINE = "unix:///nonexistent/sm12x-test-docker.sock"


# ---------------------------------------------------------------------------------------------------
# launch: pure helpers
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("image_env, expected", [
    (None, "/sm12x"),
    ([], "/sm12x"),
    (["PATH=/usr/bin"], "/sm12x"),
    (["PYTHONPATH=/opt/a:/opt/b"], "/sm12x:/opt/a:/opt/b"),
    (["PYTHONPATH=/sm12x:/opt/a"], "/sm12x:/opt/a"),        # never twice
    (["PYTHONPATH=/opt/a:/sm12x/"], "/sm12x:/opt/a"),       # ours moves to the front
    ({"PYTHONPATH": "::/opt/a"}, "/sm12x:/opt/a"),           # empty entries (= CWD) dropped
])
def test_pythonpath_with_bundle(image_env, expected):
    assert launch.pythonpath_with_bundle(image_env) == expected


def _spec(framework="vllm", **kw):
    kw.setdefault("bundle", "/srv/sm12x-bundle")
    return launch.build_spec(framework, "/models/DeepSeek-V4-Flash", "img:tag",
                             ["PYTHONPATH=/opt/image-lib", "PATH=/usr/bin"], **kw)


@pytest.mark.parametrize("framework", ["vllm", "sglang"])
def test_run_line_mounts_env_gpus_ipc(framework):
    line = launch.docker_run_line(_spec(framework, tp=2, port=9000))
    argv = shlex.split(line)
    assert argv[:2] == ["docker", "run"]
    assert "-v" in argv and "/srv/sm12x-bundle:/sm12x:ro" in argv          # bundle read-only
    assert "/models/DeepSeek-V4-Flash:/model:ro" in argv                     # model read-only
    assert "PYTHONPATH=/sm12x:/opt/image-lib" in argv                        # prepended, image kept
    assert argv[argv.index("--gpus") + 1] == "all"
    assert "--ipc=host" in argv and any(a.startswith("--shm-size=") for a in argv)
    assert "-p" in argv and "9000:9000" in argv
    assert "NCCL_P2P_DISABLE=1" in argv
    i = argv.index("img:tag")
    entry = [argv[argv.index("--entrypoint") + 1]] + argv[i + 1:]
    assert not doctor.python_flags(entry) & {"I", "E", "S"}
    assert "2" == argv[argv.index("--tensor-parallel-size") + 1]


def test_vllm_recipe_flags():
    cmd = _spec("vllm").command
    assert cmd[0] == "/model"
    for flag, value in [("--kv-cache-dtype", "fp8"), ("--block-size", "256"),
                        ("--tool-call-parser", "deepseek_v4"), ("--reasoning-parser", "deepseek_v4"),
                        ("--tokenizer-mode", "deepseek_v4")]:
        assert cmd[cmd.index(flag) + 1] == value
    assert "--disable-custom-all-reduce" in cmd
    assert json.loads(cmd[cmd.index("--compilation-config") + 1])["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "mtp"
    assert "--speculative-config" not in _spec("vllm", spec_decode=False).command


def test_sglang_recipe_flags():
    spec = _spec("sglang")
    cmd = spec.command
    assert spec.entrypoint == ["python3", "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == "/model"
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert cmd[cmd.index("--tool-call-parser") + 1] == "deepseekv4"
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "EAGLE"
    assert spec.environment["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"


def test_no_recipe_and_extra_args_last():
    spec = _spec("vllm", recipe=False, extra=["--max-model-len", "4096"])
    assert "--kv-cache-dtype" not in spec.command
    assert spec.command[-2:] == ["--max-model-len", "4096"]
    assert spec.environment == {"PYTHONPATH": "/sm12x:/opt/image-lib"}
    # extra flags override recipe values: they come after them
    cmd = _spec("vllm", extra=["--max-model-len", "4096"]).command
    assert cmd.index("4096") > cmd.index("262144")


def test_gpu_list_and_user_env():
    spec = _spec(gpus="0,2", env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONPATH": "/mine:/sm12x"})
    argv = shlex.split(launch.docker_run_line(spec))
    assert argv[argv.index("--gpus") + 1] == '"device=0,2"'
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in argv
    assert spec.environment["PYTHONPATH"] == "/sm12x:/mine"  # the user's value, but never ahead of ours


def test_gpus_none_and_no_ulimits():
    spec = _spec(gpus="none", ulimits=False)
    argv = shlex.split(launch.docker_run_line(spec))
    assert "--gpus" not in argv and not any(a.startswith("--ulimit") for a in argv)
    assert any(a == "--ulimit=memlock=-1" for a in shlex.split(launch.docker_run_line(_spec())))


def test_sdk_kwargs():
    docker = pytest.importorskip("docker")
    kw = _spec(gpus="all").sdk_kwargs()
    assert kw["volumes"]["/srv/sm12x-bundle"] == {"bind": "/sm12x", "mode": "ro"}
    assert kw["ipc_mode"] == "host" and kw["shm_size"]
    (req,) = kw["device_requests"]
    assert isinstance(req, docker.types.DeviceRequest) and req["Count"] == -1
    assert req["Capabilities"] == [["gpu"]]
    (req,) = _spec(gpus="1,3").sdk_kwargs()["device_requests"]
    assert req["DeviceIDs"] == ["1", "3"]
    assert _spec(gpus="none").sdk_kwargs()["device_requests"] == []
    assert {u["Name"]: u["Hard"] for u in kw["ulimits"]} == {"memlock": -1, "stack": 67108864}


# ---------------------------------------------------------------------------------------------------
# launch: the CLI without an engine
# ---------------------------------------------------------------------------------------------------

def test_dry_run_without_engine(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    rc = main(["launch", "sglang", "--model", str(tmp_path), "--tp", "4", "--bundle", REPO,
               "--dry-run", "--", "--max-running-requests", "4"])
    out, err = capsys.readouterr()
    assert rc == 1  # the line is printed, but the image could not be checked
    (line,) = out.strip().splitlines()  # stdout is exactly the docker run line
    argv = shlex.split(line)
    assert f"{REPO}:/sm12x:ro" in argv and "PYTHONPATH=/sm12x" in argv
    assert argv[-2:] == ["--max-running-requests", "4"]
    assert "not checked" in err


def test_dry_run_without_docker_package(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    monkeypatch.setitem(sys.modules, "docker", None)  # `import docker` now raises ImportError
    assert main(["launch", "vllm", "--model", str(tmp_path), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("docker run ") and "pip install docker" in err


def test_dry_run_subprocess_no_engine(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    env = dict(os.environ, DOCKER_HOST=NO_ENGINE, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-m", "sm12x", "launch", "vllm", "--model", str(tmp_path),
                        "--dry-run"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stdout.startswith("docker run ") and f"{tmp_path}:/model:ro" in r.stdout


def test_launch_without_engine_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    rc = main(["launch", "vllm", "--model", str(tmp_path), "--bundle", REPO])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "no Docker engine reachable" in err


def test_launch_missing_model_exit_2(capsys, tmp_path):
    assert main(["launch", "vllm", "--model", str(tmp_path / "nope"), "--bundle", REPO]) == 2
    assert "--model" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# doctor: pure helpers
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, flags", [
    (["python3", "-I", "-m", "vllm.entrypoints.openai.api_server"], {"I", "m"}),
    (["/usr/bin/python3.12", "-Esm", "sglang.launch_server"], {"E", "s", "m"}),
    (["python", "-u", "app.py", "-I"], {"u"}),                     # flags after the script are its own
    (["python3", "-m", "x", "-S"], {"m"}),
    (["/bin/bash", "-c", "exec python3 -S -m sglang.launch_server"], {"S", "m"}),
    (["vllm", "serve"], set()),
    (["python3", "-X", "importtime", "-I", "x.py"], {"X", "I"}),
    (["python3", "-Wignore", "-E"], {"W", "E"}),
    (None, set()),
])
def test_python_flags(argv, flags):
    assert doctor.python_flags(argv) == flags


def good_report(**over):
    status = {
        "arch": {"capability": [12, 0], "source": "env", "detail": "SM12X_ARCH=12.0"},
        "versions": {"vllm": "0.25.1", "sglang": None, "torch": "2.9.0"},
        "torch_build": "cuda 12.8",
        "python": {"version": "3.12.3", "cache_tag": "cpython-312", "executable": "/usr/bin/python3"},
        "patches": [
            {"name": "vllm.ops.flashmla.decode", "target": "vllm.v1.attention.ops.flashmla:f",
             "state": "would-apply", "reason": ""},
            {"name": "sgl_kernel.flash_mla.decode", "target": "sgl_kernel.flash_mla:f", "state": "skipped",
             "reason": "sgl_kernel is not installed"},
        ],
        "bootstrap": {"sitecustomize": "/sm12x/sitecustomize.py",
                      "chained": "/usr/lib/python3.12/sitecustomize.py", "active": True},
    }
    report = {
        "uid": 1000, "python": "/usr/bin/python3", "status_python": "/usr/bin/python3",
        "sys_path": ["", "/sm12x", "/usr/lib/python3.12"],
        "sitecustomize_candidates": ["/sm12x/sitecustomize.py", "/usr/lib/python3.12/sitecustomize.py"],
        "nvcc": "/usr/local/cuda/bin/nvcc", "nvcc_off_path": "/usr/local/cuda/bin/nvcc",
        "triton_cache": {"dir": "/root/.triton/cache", "source": "HOME", "exists": True,
                         "checked": "/root/.triton/cache",
                         "writable": True, "error": None},
        "entry_interpreter": "/usr/bin/python3", "entry_shebang": None,
        "status": status, "status_rc": 0,
    }
    for k, v in over.items():
        if k in status:
            status[k] = v
        else:
            report[k] = v
    return report


def codes(findings, level=None):
    return {f.code for f in findings if level is None or f.level == level}


VLLM_CFG = {"Env": ["PATH=/usr/bin"], "Entrypoint": ["vllm", "serve"], "Cmd": None, "User": ""}


def test_analyse_good_image():
    f = doctor.analyse(VLLM_CFG, good_report())
    assert doctor.exit_code(f) == 0
    assert {"bootstrap", "chained", "patch-applies", "triton-cache"} <= codes(f, "ok")
    assert "patch-not-installed" in codes(f, "info")
    assert not codes(f, "warn") and not codes(f, "error")
    assert doctor.verdict(f) == "the mount takes effect: 1 patch(es) will apply"


def test_analyse_cpu_torch_in_the_image_applies_nothing():
    """The plan in the image ran without a GPU, so a CPU build of torch did not stop it; the image
    is meant for a GPU, where the kernels need a CUDA build: nothing will apply."""
    f = doctor.analyse(VLLM_CFG, good_report(torch_build="cpu"))
    assert "patch-applies" not in codes(f)
    (line,) = [x for x in f if x.code == "dependency-missing"]
    assert line.level == "warn" and "CPU build" in line.text
    assert doctor.verdict(f) == ("the bootstrap loads, but no sm12x patch will apply in this image (needs a "
                                 "CUDA build of torch; the installed torch is a CPU build)")


def test_analyse_byte_code_mismatch_names_the_fix():
    report = good_report(python={"version": "3.12.3", "cache_tag": "cpython-312", "executable": "/usr/bin/python3"})
    f = doctor.analyse(VLLM_CFG, report, bundle_tags=["cpython-311"], bundle="/srv/my bundle")
    (line,) = [x for x in f if x.code == "byte-code"]
    assert line.level == "warn" and "is for cpython-311, but the image runs Python 3.12.3" in line.text
    assert "fix: python3 -m sm12x bundle '/srv/my bundle' --compile-with python3.12 " in line.text
    f = doctor.analyse(VLLM_CFG, report, bundle_tags=["cpython-311", "cpython-312"])
    assert [x.level for x in f if x.code == "byte-code"] == ["ok"]


@pytest.mark.parametrize("entry, cmd, flag", [
    (["python3", "-I", "-m", "vllm.entrypoints.openai.api_server"], None, "-I"),
    (["python3"], ["-E", "-m", "sglang.launch_server"], "-E"),
])
def test_analyse_entrypoint_disables_site(entry, cmd, flag):
    f = doctor.analyse({"Entrypoint": entry, "Cmd": cmd}, good_report())
    (bad,) = [x for x in f if x.code == "entrypoint-disables-site"]
    assert bad.level == "error" and flag in bad.text
    assert doctor.exit_code(f) == 1


def test_analyse_dash_S_is_a_warning_plugin_route_remains():
    f = doctor.analyse({"Entrypoint": ["python3", "-S", "-m", "vllm.entrypoints.cli.main"]}, good_report())
    (w,) = [x for x in f if x.code == "entrypoint-disables-site"]
    assert w.level == "warn" and "plugin" in w.text and doctor.exit_code(f) == 0


def test_analyse_plugin_route_and_allow_list():
    f = doctor.analyse({"Env": ["VLLM_PLUGINS=lora"]}, good_report(
        plugins={"vllm.general_plugins": ["sm12x"], "sglang.srt.plugins": ["sm12x"]}))
    assert "plugin-route" in codes(f, "ok") and "plugin-allow-list" in codes(f, "info")
    f = doctor.analyse({}, good_report(plugins={"vllm.general_plugins": [], "sglang.srt.plugins": []}))
    assert "plugin-route" in codes(f, "info")


def test_analyse_shebang_with_isolated_flag():
    f = doctor.analyse(VLLM_CFG, good_report(entry_shebang="#!/usr/bin/python3 -I"))
    assert "entrypoint-disables-site" in codes(f, "error")
    f = doctor.analyse(VLLM_CFG, good_report(entry_shebang="#!/usr/bin/env -S python3 -s"))
    assert "entrypoint-disables-site" not in codes(f)  # -s keeps sitecustomize


def test_analyse_image_pythonpath_advice():
    f = doctor.analyse({"Env": ["PYTHONPATH=/workspace/lib"]}, good_report())
    (pp,) = [x for x in f if x.code == "image-pythonpath"]
    assert "PYTHONPATH=/sm12x:/workspace/lib" in pp.text and doctor.exit_code(f) == 0


def test_analyse_pythonpath_order():
    f = doctor.analyse(VLLM_CFG, good_report(pythonpath="/opt/lib:/sm12x"))
    (w,) = [x for x in f if x.code == "pythonpath-order"]
    assert w.level == "warn" and "/opt/lib ahead of /sm12x" in w.text
    assert "pythonpath-order" not in codes(doctor.analyse(VLLM_CFG, good_report(pythonpath="/sm12x:/opt/lib")))


def test_analyse_shadowed_sitecustomize():
    report = good_report(bootstrap={"sitecustomize": None, "chained": None, "active": False},
                         sitecustomize_candidates=["/opt/venv/site/sitecustomize.py", "/sm12x/sitecustomize.py"])
    f = doctor.analyse(VLLM_CFG, report)
    assert "shadowed" in codes(f, "error") and doctor.exit_code(f) == 1
    assert "not-chained" in codes(f, "warn")


def test_analyse_bootstrap_inactive_and_disabled():
    report = good_report(bootstrap={"sitecustomize": None, "chained": None, "active": False},
                         sitecustomize_candidates=[])
    f = doctor.analyse({"Env": ["SM12X_DISABLE=1"]}, report)
    assert {"bootstrap-inactive", "disabled"} <= codes(f, "error")
    assert "nothing-to-chain" in codes(f, "info")


def test_analyse_versions_out_of_range():
    patches = [{"name": f"vllm.p{i}", "target": f"vllm.mod{i}:f", "state": "skipped",
                "reason": "vllm 0.40.0 outside >=0.20,<0.34"} for i in range(3)]
    f = doctor.analyse(VLLM_CFG, good_report(patches=patches, versions={"vllm": "0.40.0"}))
    (w,) = [x for x in f if x.code == "version-out-of-range"]
    assert "vllm 0.40.0" in w.text
    assert "nothing-applies" in codes(f, "warn") and doctor.exit_code(f) == 0


def test_analyse_skip_that_names_no_patch():
    report = good_report()
    report["status"]["skip"] = {"items": ["vllm.thirdparty"], "unmatched": ["vllm.thirdparty"]}
    assert "skip-unmatched" in codes(doctor.analyse(VLLM_CFG, report), "warn")
    assert "skip-unmatched" not in codes(doctor.analyse(VLLM_CFG, good_report()))


def test_analyse_nvcc():
    f = doctor.analyse(VLLM_CFG, good_report(nvcc=None, nvcc_off_path=None))
    assert "nvcc-missing" in codes(f, "warn")  # vllm installed: its JIT kernels need nvcc
    f = doctor.analyse(VLLM_CFG, good_report(nvcc=None, nvcc_off_path="/usr/local/cuda/bin/nvcc"))
    assert "nvcc-off-path" in codes(f, "warn")
    f = doctor.analyse(VLLM_CFG, good_report(nvcc=None, nvcc_off_path=None, versions={"vllm": None}))
    assert "nvcc-missing" in codes(f, "info")


def test_analyse_triton_cache_read_only():
    tc = {"dir": "/.triton/cache", "source": "HOME", "exists": False, "checked": "/", "writable": False,
          "error": "PermissionError: [Errno 13] Permission denied: '/'"}
    f = doctor.analyse(VLLM_CFG, good_report(triton_cache=tc))
    (w,) = [x for x in f if x.code == "triton-cache"]
    assert w.level == "warn" and "TRITON_CACHE_DIR" in w.text and doctor.exit_code(f) == 0


def test_analyse_probe_or_status_failed():
    assert "probe-failed" in codes(doctor.analyse(VLLM_CFG, None), "error")
    f = doctor.analyse(VLLM_CFG, good_report(status=None, status_stderr="No module named sm12x\n"))
    (e,) = [x for x in f if x.code == "status-failed"]
    assert "No module named sm12x" in e.text


def test_parse_probe_output():
    assert doctor.parse_probe_output('noise\nSM12X_DOCTOR {"a": 1}\n') == {"a": 1}
    assert doctor.parse_probe_output("nothing here") is None


def test_probe_runs_with_local_python(tmp_path):
    """The probe itself, run by this machine's python with the checkout on PYTHONPATH (no container)."""
    env = dict(os.environ, PYTHONPATH=REPO, SM12X_ARCH="12.0", TRITON_CACHE_DIR=str(tmp_path / "tc"))
    r = subprocess.run([sys.executable, "-c", doctor.PROBE, json.dumps([sys.executable, "-c", "pass"])],
                       capture_output=True, text=True, env=env, timeout=120)
    report = doctor.parse_probe_output(r.stdout)
    assert report is not None, r.stderr
    assert report["status"]["bootstrap"]["active"] is True
    assert report["status"]["bootstrap"]["sitecustomize"] == os.path.join(REPO, "sitecustomize.py")
    assert report["triton_cache"] == {"dir": str(tmp_path / "tc"), "source": "TRITON_CACHE_DIR", "exists": False,
                                      "checked": str(tmp_path), "writable": True, "error": None}
    assert report["entry_interpreter"] == sys.executable
    f = doctor.analyse({"Env": []}, report, mount=REPO)
    assert "bootstrap" in codes(f, "ok") and doctor.exit_code(f) == 0


def test_doctor_without_engine_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    assert main(["doctor", "--image", "x:y", "--bundle", REPO]) == 2
    assert "no Docker engine reachable" in capsys.readouterr().err


def test_doctor_bundle_without_sitecustomize_exit_2(capsys, tmp_path):
    assert main(["doctor", "--image", "x:y", "--bundle", str(tmp_path)]) == 2
    assert "sitecustomize.py" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------
# docker/compose.*.yaml: the properties every service must keep
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["compose.vllm.yaml", "compose.sglang.yaml"])
def test_compose_services_mount_and_prepend(name):
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(REPO, "docker", name)) as f:
        doc = yaml.safe_load(f)
    services = doc["services"]
    assert {s for svc in services.values() for s in svc["profiles"]} >= {"rtx"}
    for sname, svc in services.items():
        assert any(v.endswith(":/sm12x:ro") for v in svc["volumes"]), sname
        assert any(v.endswith(":/model:ro") for v in svc["volumes"]), sname
        assert svc["environment"]["PYTHONPATH"].startswith("/sm12x:"), sname
        assert svc["pull_policy"] == "never" and svc["ipc"] == "host", sname
        assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
        argv = list(svc["entrypoint"]) + list(svc["command"])
        assert not doctor.python_flags(argv) & {"I", "E", "S"}, sname
    rtx = [svc for svc in services.values() if "rtx" in svc["profiles"]]
    (svc,) = rtx
    assert svc["environment"]["NCCL_P2P_DISABLE"] == "1"
    assert "--disable-custom-all-reduce" in svc["command"]
    assert any("fp8" in a for a in svc["command"] if a.startswith("--kv-cache-dtype"))


def test_probe_reads_console_script_shebang(tmp_path):
    """`vllm serve` entrypoints: the probe finds the interpreter in the console script's #! line."""
    script = tmp_path / "fakeserve"
    script.write_text(f"#!{sys.executable} -I\nprint('serving')\n")
    script.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=REPO, PATH=f"{tmp_path}:{os.environ['PATH']}")
    r = subprocess.run([sys.executable, "-c", doctor.PROBE, json.dumps(["fakeserve", "--port", "1"])],
                       capture_output=True, text=True, env=env, timeout=120)
    report = doctor.parse_probe_output(r.stdout)
    assert report["entry_interpreter"] == sys.executable
    assert report["entry_shebang"] == f"#!{sys.executable} -I"
    f = doctor.analyse({"Entrypoint": ["fakeserve"]}, report, mount=REPO)
    assert "entrypoint-disables-site" in codes(f, "error")


def test_probe_reads_status_after_an_image_sitecustomize_that_prints(tmp_path):
    """An image whose own sitecustomize prints to stdout: status --json is still read."""
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("print('hello from the image')\nprint('{not json}')\n")
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{image}", SM12X_ARCH="12.0", TRITON_CACHE_DIR=str(tmp_path / "tc"))
    r = subprocess.run([sys.executable, "-c", doctor.PROBE, json.dumps([sys.executable, "-c", "pass"])],
                       capture_output=True, text=True, env=env, timeout=120)
    report = doctor.parse_probe_output(r.stdout)
    assert report is not None and report["status"] is not None, r.stdout + r.stderr
    assert report["status"]["bootstrap"]["chained"] == str(image / "sitecustomize.py")
    f = doctor.analyse({"Env": []}, report, mount=REPO)
    assert {"bootstrap", "chained"} <= codes(f, "ok") and "status-failed" not in codes(f)


def test_analyse_disable_for_the_run_is_named_not_pythonpath():
    report = good_report(bootstrap={"sitecustomize": "/sm12x/sitecustomize.py", "chained": None, "active": False,
                                    "disabled": True})
    f = doctor.analyse(VLLM_CFG, report)
    assert "disabled" in codes(f, "error") and "bootstrap-inactive" not in codes(f)
    text = next(str(x) for x in f if x.code == "disabled")
    assert "SM12X_DISABLE=1" in text and "PYTHONPATH" not in text


def test_doctor_json_on_errors_is_json(tmp_path):
    env = dict(os.environ, DOCKER_HOST=NO_ENGINE, PYTHONPATH=REPO)
    r = subprocess.run([sys.executable, "-m", "sm12x", "doctor", "--image", "x:y", "--bundle", REPO, "--json"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    data = json.loads(r.stdout)
    assert r.returncode == 2 and data["exit_code"] == 2 and data["problems"]
    assert any("Docker" in p for p in data["problems"])

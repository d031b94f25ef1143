"""sm12x against a real Docker engine: the bundle mounted read-only into a locally built image.

The image (docker/test-image/build_test_image.py) is the host's Debian python3 with Debian's own
sitecustomize, a pre-set PYTHONPATH and a non-root USER: built offline in seconds, no registry.
Every test here skips, with the reason printed, when no engine can be reached (start one with
scripts/ci_docker.sh). About 30 s in all.
"""
import importlib.util
import json
import os
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Per-session names: two test sessions on one engine (CI and a developer) must not remove each other's.
TAG = f"sm12x-test:pytest-{os.getpid()}"
ISOLATED_TAG = f"sm12x-test:pytest-{os.getpid()}-isolated"
VLLM_TAG = f"sm12x-test:pytest-{os.getpid()}-vllm"
VLLM_GPU_TAG = f"sm12x-test:pytest-{os.getpid()}-vllm-gpu"
USER = "1000:1000"
# Debian's sitecustomize does `import apport_python_hook; apport_python_hook.install()`. A fake module on
# the image's PYTHONPATH entry records that call, which proves the chained file really ran.
FAKE_APPORT = "import sys\n\ndef install():\n    sys.sm12x_test_apport_installed = True\n"


def _say(request, text):
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(text)


@pytest.fixture(scope="session")
def engine(request):
    """A connected docker client; skips the module (reason printed) when no engine answers."""
    try:
        import docker
    except ImportError:
        reason = "docker tests skipped: the `docker` Python package is not installed (pip install docker)"
        _say(request, reason)
        pytest.skip(reason)
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as e:
        reason = (f"docker tests skipped: no Docker engine reachable "
                  f"({os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}: {type(e).__name__}); "
                  "start one with scripts/ci_docker.sh")
        _say(request, reason)
        pytest.skip(reason)
    return client


@pytest.fixture(scope="session")
def images(engine):
    """Build the test image, its `python3 -I` twin and the vLLM look-alike; removed at the end."""
    path = os.path.join(REPO, "docker", "test-image", "build_test_image.py")
    spec = importlib.util.spec_from_file_location("sm12x_build_test_image", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    info = mod.build(engine, tag=TAG, isolated_tag=ISOLATED_TAG, vllm_tag=VLLM_TAG, vllm_gpu_tag=VLLM_GPU_TAG)
    yield info
    for tag in (TAG, ISOLATED_TAG, VLLM_TAG, VLLM_GPU_TAG):
        try:
            engine.images.remove(tag, force=True)
        except Exception:
            pass


def _tree(root):
    """{relative path: (size, mtime_ns)} for every file and dir under root."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture(scope="session")
def bundle(tmp_path_factory):
    """A bundle made by `python -m sm12x bundle`, readable by the container's non-root user."""
    dest = tmp_path_factory.mktemp("bundle") / "sm12x"
    r = subprocess.run([sys.executable, "-m", "sm12x", "bundle", str(dest)], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stdout + r.stderr
    for d, dirs, files in os.walk(dest):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    return str(dest)


@pytest.fixture(scope="session")
def image_lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("image-lib")
    (d / "apport_python_hook.py").write_text(FAKE_APPORT)
    os.chmod(d, 0o755)
    os.chmod(d / "apport_python_hook.py", 0o644)
    return str(d)


def _run(engine, image, command, bundle, image_lib, env=None, user=USER):
    """Run python3 in the image with the bundle ro at /sm12x; returns (exit code, stdout, stderr)."""
    c = engine.containers.create(
        image, entrypoint=["python3"], command=command, user=user, network_disabled=True,
        environment={"PYTHONPATH": "/sm12x:/opt/image-lib", **(env or {})},
        volumes={bundle: {"bind": "/sm12x", "mode": "ro"}, image_lib: {"bind": "/opt/image-lib", "mode": "ro"}})
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs(stderr=False).decode(), c.logs(stdout=False).decode()
    finally:
        c.remove(force=True)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sm12x", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=REPO))


def test_status_in_container_bootstrap_chains_debian_sitecustomize(engine, images, bundle, image_lib):
    before = _tree(bundle)
    code, out, err = _run(engine, TAG, ["-m", "sm12x", "status", "--json"], bundle, image_lib,
                          env={"SM12X_ARCH": "12.0"})
    assert code in (0, 1), err  # 1 only when a patch failed; the JSON is what matters
    status = json.loads(out)
    boot = status["bootstrap"]
    assert boot["active"] is True
    assert boot["sitecustomize"] == "/sm12x/sitecustomize.py"
    assert boot["chained"] == f"/usr/lib/python{images['python']}/sitecustomize.py"  # Debian's own file
    assert status["arch"]["capability"] == [12, 0] and status["arch"]["source"] == "env"
    assert _tree(bundle) == before, "the container wrote to the read-only mount"


def test_chained_file_ran_as_non_root(engine, images, bundle, image_lib):
    probe = ("import os, sys, sitecustomize; print(os.getuid(), sitecustomize.__file__, "
             "getattr(sys, 'sm12x_test_apport_installed', False), "
             "sys.path.index('/sm12x') < sys.path.index('/opt/image-lib'))")
    code, out, err = _run(engine, TAG, ["-c", probe], bundle, image_lib)
    assert code == 0, err
    assert out.split() == ["1000", "/sm12x/sitecustomize.py", "True", "True"]


def test_disable_switch_still_chains(engine, images, bundle, image_lib):
    code, out, err = _run(engine, TAG, ["-c", "import sys, sitecustomize as s; print(s._sm12x_active, "
                                              "getattr(sys, 'sm12x_test_apport_installed', False))"],
                          bundle, image_lib, env={"SM12X_DISABLE": "1"})
    assert code == 0, err
    assert out.split() == ["False", "True"]


def test_doctor_on_test_image(engine, images, bundle):
    r = _cli("doctor", "--image", TAG, "--bundle", bundle)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok     bootstrap ran: /sm12x/sitecustomize.py" in r.stdout
    assert f"chained the image's own sitecustomize: /usr/lib/python{images['python']}/sitecustomize.py" in r.stdout
    assert "PYTHONPATH=/sm12x:/opt/image-lib" in r.stdout
    assert "uid 1000" in r.stdout  # the image's USER, not root
    assert "plugin entry points registered: vllm.general_plugins, sglang.srt.plugins" in r.stdout
    # a plain Python image: the bootstrap loads, and there is nothing for it to patch
    assert r.stdout.splitlines()[-1] == "verdict: the bootstrap loads, but no sm12x patch will apply in this image"


def test_doctor_on_vllm_look_alike(engine, images, bundle):
    """ENTRYPOINT ["vllm", "serve"] with a console script, as vllm/vllm-openai: the probe finds the
    interpreter in its #! line and sees vllm's version. The image has no torch, so no patch will
    apply, and doctor says so and why instead of "will apply"."""
    r = _cli("doctor", "--image", VLLM_TAG, "--bundle", bundle, "--json")
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["exit_code"] == 0, r.stdout + r.stderr
    report = data["report"]
    assert report["entry_shebang"] == "#!/usr/bin/python3"
    assert report["status_python"] == "/usr/bin/python3"
    assert report["status"]["versions"]["vllm"] == "0.25.1"
    findings = data["findings"]
    assert any(f["code"] == "versions" and "vllm 0.25.1" in f["text"] for f in findings)
    assert not any(f["code"] == "patch-applies" for f in findings)
    assert any(f["code"] == "dependency-missing" and "needs torch, which is not installed in the image" in f["text"]
               for f in findings)
    assert any(f["code"] == "nvcc-missing" and f["level"] == "warn" for f in findings)
    text = _cli("doctor", "--image", VLLM_TAG, "--bundle", bundle)
    assert text.stdout.splitlines()[-1] == ("verdict: the bootstrap loads, but no sm12x patch will apply in this "
                                            "image (needs torch, which is not installed)")


def test_doctor_counts_only_what_exists_in_the_image(engine, images, bundle):
    """The look-alike with a CUDA torch, triton and vLLM's FlashMLA ops module, but none of the
    vendored vllm.third_party copies: only the three patches of that module will apply."""
    r = _cli("doctor", "--image", VLLM_GPU_TAG, "--bundle", bundle, "--json")
    data = json.loads(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    applies = sorted(f["text"] for f in data["findings"] if f["code"] == "patch-applies")
    assert applies == [f"will apply: vllm.ops.flashmla.{n} -> vllm.v1.attention.ops.flashmla:{t}" for n, t in
                       (("decode", "flash_mla_with_kvcache"), ("metadata", "get_mla_metadata"),
                        ("sparse_fwd", "flash_mla_sparse_fwd"))]
    plan = {p["name"]: p for p in data["report"]["status"]["patches"]}
    vendored = [p for n, p in plan.items() if n.startswith("vllm.third_party.")]
    assert vendored and all(p["state"] == "skipped" for p in vendored)
    in_range = [p for p in vendored if " outside the checked range " not in p["reason"]]
    assert in_range and all("does not exist in the installed version" in p["reason"] for p in in_range)
    assert data["report"]["status"]["torch_build"] == "cuda 12.8"
    text = _cli("doctor", "--image", VLLM_GPU_TAG, "--bundle", bundle)
    assert text.stdout.splitlines()[-1] == "verdict: the mount takes effect: 3 patch(es) will apply"


def test_doctor_json_and_unwritable_triton_cache(engine, images, bundle):
    r = _cli("doctor", "--image", TAG, "--bundle", bundle, "--json", "--env", "TRITON_CACHE_DIR=/usr/lib/triton")
    data = json.loads(r.stdout)
    assert r.returncode == 0 and data["exit_code"] == 0
    levels = {f["code"]: f["level"] for f in data["findings"]}
    assert levels["bootstrap"] == "ok" and levels["chained"] == "ok"
    assert levels["triton-cache"] == "warn"
    assert data["report"]["triton_cache"]["dir"] == "/usr/lib/triton"


def test_doctor_with_users_pythonpath_order(engine, images, bundle):
    """--env passes the user's real settings: here /sm12x second. Our bootstrap still wins (no other
    sitecustomize ahead), but doctor warns about the order."""
    r = _cli("doctor", "--image", TAG, "--bundle", bundle, "--env", "PYTHONPATH=/opt/image-lib:/sm12x")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warn   PYTHONPATH=/opt/image-lib:/sm12x puts /opt/image-lib ahead of /sm12x" in r.stdout
    assert "ok     bootstrap ran" in r.stdout


def test_doctor_reports_python_isolated_entrypoint(engine, images, bundle):
    r = _cli("doctor", "--image", ISOLATED_TAG, "--bundle", bundle)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error  image command python3 -I" in r.stdout
    assert "verdict: the mount would NOT take effect" in r.stdout


def test_isolated_entrypoint_really_skips_sitecustomize(engine, images, bundle, image_lib):
    """What doctor warns about, shown for real: the image's own `python3 -I` never loads our bootstrap."""
    c = engine.containers.create(ISOLATED_TAG, command=["-c", "import sitecustomize; print(sitecustomize.__file__)"],
                                 environment={"PYTHONPATH": "/sm12x:/opt/image-lib"}, network_disabled=True,
                                 volumes={bundle: {"bind": "/sm12x", "mode": "ro"}})
    try:
        c.start()
        assert c.wait(timeout=60)["StatusCode"] == 0
        # site still loads the image's own sitecustomize; PYTHONPATH (and so ours) is ignored
        assert c.logs(stderr=False).decode().split() == [f"/usr/lib/python{images['python']}/sitecustomize.py"]
    finally:
        c.remove(force=True)


def test_doctor_missing_image_exit_2(engine, bundle):
    r = _cli("doctor", "--image", "sm12x-test:does-not-exist", "--bundle", bundle)
    assert r.returncode == 2 and "not present locally" in r.stderr


@pytest.mark.parametrize("command", ["doctor", "launch"])
def test_image_name_the_engine_refuses_is_one_line(engine, bundle, tmp_path, command):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    args = ["--image", "Not A:Name", "--bundle", bundle]
    r = _cli(*(["doctor", *args] if command == "doctor" else
               ["launch", "vllm", "--model", str(tmp_path), "--dry-run", *args]))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"sm12x {command}: --image 'Not A:Name': the Docker engine refused it (")
    assert "invalid reference format" in line and line.endswith("give a name such as vllm/vllm-openai:TAG")


def test_launch_dry_run_reads_image_pythonpath(engine, images, bundle, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    r = _cli("launch", "sglang", "--model", str(tmp_path), "--image", TAG, "--bundle", bundle, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "PYTHONPATH=/sm12x:/opt/image-lib" in r.stdout and f"{bundle}:/sm12x:ro" in r.stdout
    assert r.stderr == ""  # the image was inspected: no "assumed" note


def test_launch_missing_image_exit_2(engine, bundle, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model folder
    r = _cli("launch", "vllm", "--model", str(tmp_path), "--image", "sm12x-test:does-not-exist", "--bundle", bundle)
    assert r.returncode == 2
    assert r.stderr.strip() == ("sm12x launch: image sm12x-test:does-not-exist is not present locally "
                                "(sm12x never pulls): docker pull sm12x-test:does-not-exist")


def test_launch_runs_container_with_mounts_env_and_cleans_up(engine, images, bundle, tmp_path):
    """A real (GPU-less) launch: the engine accepts every option, output streams, the container goes away.
    The test image has no sglang, so the framework itself fails: that failure is the expected output."""
    (tmp_path / "config.json").write_text("{}")  # a model folder
    name = f"sm12x-pytest-launch-{os.getpid()}"
    for old in engine.containers.list(all=True, filters={"name": name}):  # left over by an interrupted run
        old.remove(force=True)
    with socket.socket() as s:  # a free host port for -p
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["launch", "sglang", "--model", str(tmp_path), "--image", TAG, "--bundle", bundle, "--gpus", "none",
            "--name", name, "--no-recipe", "--port", str(port)]
    r = _cli(*argv)
    if "rlimit" in r.stderr:  # hosts (like sandboxed CI) that forbid --ulimit memlock=-1: say how, then retry
        assert "rerun with --no-ulimits" in r.stderr
        assert not engine.containers.list(all=True, filters={"name": name})
        r = _cli(*argv, "--no-ulimits")
    assert r.returncode == 1, r.stdout + r.stderr
    first, *rest = r.stdout.splitlines()
    assert first.startswith("docker run ") and "--gpus" not in first
    assert "No module named 'sglang'" in "\n".join(rest)
    assert f"started {name}" in r.stderr
    assert not engine.containers.list(all=True, filters={"name": name})


def test_doctor_byte_code_for_the_images_python(engine, images, bundle, tmp_path):
    """The bundle fixture was compiled by this interpreter; the image runs the host's Debian python3.
    When their versions match doctor says ok; a bundle compiled for another Python (or none) gets a
    warning with the exact command that fixes it."""
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    r = _cli("doctor", "--image", TAG, "--bundle", bundle)
    assert r.returncode == 0, r.stdout + r.stderr
    if host == images["python"]:
        assert f"ok     the bundle has byte code for the image's Python {images['python']}" in r.stdout
    plain = tmp_path / "plain"
    made = _cli("bundle", str(plain), "--no-compile")
    assert made.returncode == 0, made.stderr
    for d, dirs, files in os.walk(plain):
        os.chmod(d, 0o755)
    r = _cli("doctor", "--image", TAG, "--bundle", str(plain))
    assert r.returncode == 0, r.stdout + r.stderr  # slower start-up is a warning, not a failure
    line = next(x for x in r.stdout.splitlines() if "byte code" in x)
    assert line.startswith("warn ") and f"runs Python {images['python']}." in line
    assert line.endswith(f"fix: python3 -m sm12x bundle {plain} --compile-with python{images['python']} "
                         f"(any Python {images['python']} on this machine)")


# ---------------------------------------------------------------------------------------------------
# The image's own sitecustomize behaves as without the mount (real engine, uid 1000, read-only, no net)
# ---------------------------------------------------------------------------------------------------

def _image_lib_with(tmp_path, files):
    """An image-lib folder (mounted at /opt/image-lib, on PYTHONPATH after /sm12x) holding ``files``."""
    lib = tmp_path / "lib"
    for rel, text in files.items():
        path = lib / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for d, dirs, fs in os.walk(lib):
        os.chmod(d, 0o755)
        for f in fs:
            os.chmod(os.path.join(d, f), 0o644)
    return str(lib)


def _run_paths(engine, command, volumes, pythonpath, env=None):
    c = engine.containers.create(TAG, entrypoint=["python3"], command=command, user=USER, network_disabled=True,
                                 environment={"PYTHONPATH": pythonpath, **(env or {})},
                                 volumes={src: {"bind": dst, "mode": "ro"} for src, dst in volumes.items()})
    try:
        c.start()
        code = c.wait(timeout=120)["StatusCode"]
        return code, c.logs(stderr=False).decode(), c.logs(stdout=False).decode()
    finally:
        c.remove(force=True)


def _with_and_without(engine, bundle, lib, command, env=None):
    volumes = {bundle: "/sm12x", lib: "/opt/image-lib"}
    plain = _run_paths(engine, command, volumes, "/opt/image-lib", env)
    mounted = _run_paths(engine, command, volumes, "/sm12x:/opt/image-lib", env)
    return plain, mounted


@pytest.mark.parametrize("raise_line, last", [("raise SystemExit(3)", "SystemExit: 3"),
                                               ("raise KeyboardInterrupt", "KeyboardInterrupt")])
@pytest.mark.parametrize("disable", [None, "1"])
def test_image_sitecustomize_exit_ends_start_up_as_without_us(engine, images, bundle, tmp_path, raise_line, last,
                                                               disable):
    lib = _image_lib_with(tmp_path, {"sitecustomize.py": raise_line + "\n"})
    env = {"SM12X_DISABLE": disable} if disable else {}
    (pc, pout, perr), (mc, mout, merr) = _with_and_without(engine, bundle, lib, ["-c", "print('host ran')"], env)
    assert pc != 0 and "Fatal Python error" in perr
    assert mc == pc and mout == pout == "" and "Fatal Python error" in merr
    assert merr.strip().splitlines()[-1] == perr.strip().splitlines()[-1] == last


def test_image_package_form_sitecustomize(engine, images, bundle, tmp_path):
    lib = _image_lib_with(tmp_path, {"sitecustomize/__init__.py": "from . import helper\nDEFINED = helper.VALUE\n",
                                     "sitecustomize/helper.py": "VALUE = 'from the helper'\n"})
    probe = ["-c", "import sitecustomize; print(sitecustomize.DEFINED)"]
    (pc, pout, perr), (mc, mout, merr) = _with_and_without(engine, bundle, lib, probe)
    assert pc == mc == 0 and pout == mout == "from the helper\n", (perr, merr)
    assert merr == perr == ""


def test_bundle_mounted_twice_still_chains_the_image(engine, images, bundle, tmp_path):
    lib = _image_lib_with(tmp_path, {"sitecustomize.py": "print('image ran')\n"})
    code, out, err = _run_paths(engine, ["-c", "import sitecustomize as s; print(s._sm12x_active)"],
                                {bundle: "/sm12x", lib: "/opt/image-lib"} | {bundle + "/.": "/sm12x-again"},
                                "/sm12x:/sm12x-again:/opt/image-lib")
    assert code == 0 and out.split() == ["image", "ran", "True"], err


def test_bundle_written_under_umask_077_serves_uid_1000(engine, images, image_lib, tmp_path):
    dest = tmp_path / "private-umask-bundle"
    r = subprocess.run(["sh", "-c", f"umask 077 && exec {sys.executable} -m sm12x bundle {dest}"], cwd=REPO,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr
    os.chmod(tmp_path, 0o755)  # pytest's own folders are private; the bundle's are sm12x's business
    code, out, err = _run(engine, TAG, ["-c", "import sitecustomize as s; print(s.__file__, s._sm12x_active)"],
                          str(dest), image_lib)
    assert code == 0 and out.split() == ["/sm12x/sitecustomize.py", "True"], err


def test_doctor_names_disable_for_the_run(engine, images, bundle):
    r = _cli("doctor", "--image", TAG, "--bundle", bundle, "--env", "SM12X_DISABLE=1")
    assert "SM12X_DISABLE=1 is set for the run" in r.stdout and "check PYTHONPATH" not in r.stdout, r.stdout

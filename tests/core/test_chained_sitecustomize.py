"""The image's own sitecustomize under the mount behaves as it does without it (real interpreters).

Each case runs one image ``sitecustomize.py`` twice: once as Python finds it on its own (no mount)
and once shadowed by ours (``PYTHONPATH=<repo>:<image dir>``), and compares what the program and
the user see: the file's ``__name__`` and ``__file__``, what it prints, the error lines Python
writes for it, and the names it defines.
"""
import pytest

from tests_support import REPO, run_py

SHOW = """
import sys, sitecustomize
print("host ran", getattr(sitecustomize, "DEFINED", None))
"""


def _both(tmp_path, body, code=SHOW):
    image = tmp_path / "image"
    image.mkdir(exist_ok=True)
    (image / "sitecustomize.py").write_text(body)
    plain = run_py(code, pythonpath=[image], check=False)
    mounted = run_py(code, pythonpath=[REPO, image], check=False)
    return image, plain, mounted


def test_guarded_body_runs_under_its_own_name_and_file(tmp_path):
    image, plain, mounted = _both(tmp_path, (
        "import sys\n"
        "if __name__ == 'sitecustomize':\n"
        "    print('image body', __name__, __file__, sys.modules[__name__].__file__)\n"
        "DEFINED = 'yes'\n"))
    expected = f"image body sitecustomize {image / 'sitecustomize.py'} {image / 'sitecustomize.py'}"
    assert plain.stdout.splitlines() == [expected, "host ran yes"]
    assert mounted.stdout.splitlines() == [expected, "host ran yes"]
    assert mounted.stderr == plain.stderr == ""


@pytest.mark.parametrize("raise_line, shown", [
    ("raise ValueError('boom')", "ValueError: boom"),
    ("import sm12x_test_no_such_module", "ModuleNotFoundError: No module named 'sm12x_test_no_such_module'"),
])
def test_an_error_prints_what_python_prints(tmp_path, raise_line, shown):
    _, plain, mounted = _both(tmp_path, f"DEFINED = 'before'\n{raise_line}\n",
                              code="print('host ran')")
    assert plain.returncode == mounted.returncode == 0
    assert plain.stderr == f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{shown}\n"
    assert mounted.stderr == plain.stderr
    assert mounted.stdout == plain.stdout == "host ran\n"


@pytest.mark.parametrize("raise_line, last", [("raise SystemExit(3)", "SystemExit: 3"),
                                               ("raise KeyboardInterrupt", "KeyboardInterrupt")])
@pytest.mark.parametrize("disable", [None, "1"])
def test_system_exit_and_interrupt_end_start_up_as_without_the_mount(tmp_path, raise_line, last, disable):
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text(raise_line + "\n")
    env = {"SM12X_DISABLE": disable}
    plain = run_py("print('host ran')", pythonpath=[image], check=False, env=env)
    mounted = run_py("print('host ran')", pythonpath=[REPO, image], check=False, env=env)
    assert plain.returncode != 0 and "Fatal Python error" in plain.stderr  # Python's own behaviour
    assert mounted.returncode == plain.returncode and mounted.stdout == plain.stdout == ""
    assert "Fatal Python error" in mounted.stderr
    assert mounted.stderr.strip().splitlines()[-1] == plain.stderr.strip().splitlines()[-1] == last


def test_package_form_sitecustomize_keeps_its_relative_imports(tmp_path):
    image = tmp_path / "image"
    (image / "sitecustomize").mkdir(parents=True)
    (image / "sitecustomize" / "__init__.py").write_text("from . import helper\nDEFINED = helper.VALUE\n")
    (image / "sitecustomize" / "helper.py").write_text("VALUE = 'from the helper'\n")
    plain = run_py(SHOW, pythonpath=[image], check=False)
    mounted = run_py(SHOW, pythonpath=[REPO, image], check=False)
    assert plain.stdout == mounted.stdout == "host ran from the helper\n"
    assert plain.stderr == mounted.stderr == ""


@pytest.mark.parametrize("twice", ["spelling", "symlink", "copy"])
def test_a_bundle_reachable_twice_still_chains_the_image(tmp_path, twice):
    import shutil

    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("print('image ran')\nDEFINED = 'yes'\n")
    if twice == "spelling":
        second = REPO + "/."
    elif twice == "symlink":
        second = tmp_path / "link"
        second.symlink_to(REPO)
    else:  # a second bundle: a folder with its own sitecustomize and sm12x package
        second = tmp_path / "copy"
        second.mkdir()
        shutil.copy(REPO + "/sitecustomize.py", second)
        (second / "sm12x").mkdir()
        (second / "sm12x" / "hooks.py").write_text("def install_watcher():\n    pass\n")
        (second / "sm12x" / "__init__.py").write_text("")
    mounted = run_py(SHOW, pythonpath=[REPO, second, image], check=False)
    assert mounted.stdout == "image ran\nhost ran yes\n", mounted.stdout + mounted.stderr
    assert mounted.stderr == ""


def test_runs_exactly_once_and_ours_stays_the_module(tmp_path):
    counter = tmp_path / "count.txt"
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text(f"open({str(counter)!r}, 'a').write('x')\n")
    mounted = run_py("""
import json, sitecustomize
print(json.dumps({"ours": sitecustomize.__file__, "active": sitecustomize._sm12x_active}))
""", pythonpath=[REPO, image])
    assert counter.read_text() == "x"
    assert f'"ours": "{REPO}/sitecustomize.py"' in mounted.stdout

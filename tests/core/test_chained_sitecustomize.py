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


def test_system_exit_is_reported_and_the_host_still_runs(tmp_path):
    _, plain, mounted = _both(tmp_path, "raise SystemExit(3)\n", code="print('host ran')")
    assert plain.returncode != 0  # without the mount Python aborts start-up here
    assert mounted.returncode == 0 and mounted.stdout == "host ran\n"
    assert mounted.stderr == "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nSystemExit: 3\n"


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

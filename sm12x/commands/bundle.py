"""``sm12x bundle DIR``: a self-contained folder to mount at /sm12x.

It holds ``sitecustomize.py``, the ``sm12x`` package (without tests, scripts or caches) and the
``sm12x_plugin-*.dist-info`` that registers the framework plugins. sm12x needs nothing at run time
beyond the standard library and the image's own torch/triton, so no dependency is vendored, and
the folder is pure Python: one bundle serves x86_64 and aarch64 (GB10). Nothing else is on the
mount, so it cannot shadow an image's packages.
Byte code is compiled for each interpreter given (default: the one running this): a read-only mount
cannot cache .pyc files, and compiling the bootstrap costs every process ~2 ms more.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.c", "*.pyi")


def write_bundle(dest: str, compile_with=None) -> str:
    dest = os.path.abspath(dest)
    os.makedirs(dest, exist_ok=True)
    shutil.copy2(os.path.join(REPO, "sitecustomize.py"), os.path.join(dest, "sitecustomize.py"))
    pkg = os.path.join(dest, "sm12x")
    if os.path.exists(pkg):
        shutil.rmtree(pkg)
    shutil.copytree(os.path.join(REPO, "sm12x"), pkg, ignore=_IGNORE)
    for entry in os.listdir(REPO):
        if entry.startswith("sm12x_plugin-") and entry.endswith(".dist-info"):
            shutil.copytree(os.path.join(REPO, entry), os.path.join(dest, entry),
                            dirs_exist_ok=True)
    for python in (compile_with if compile_with is not None else [sys.executable]):
        subprocess.run([python, "-m", "compileall", "-q", dest], check=True,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    return dest

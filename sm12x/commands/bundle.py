"""``sm12x bundle DIR``: a self-contained folder to mount at /sm12x.

It holds ``sitecustomize.py``, the ``sm12x`` package (without tests, scripts or caches) and the
``sm12x_plugin-*.dist-info`` that registers the framework plugins. sm12x needs nothing at run time
beyond the standard library and the image's own torch/triton, so no dependency is vendored, and
the folder is pure Python: one bundle serves x86_64 and aarch64 (GB10). Nothing else is on the
mount, so it cannot shadow an image's packages.

Byte code is compiled for each interpreter given (default: the one running this): a read-only mount
cannot cache .pyc files, and compiling the bootstrap costs every process ~2 ms more.

Files of the user are never touched: DIR must be new, empty, or a bundle written before. The
bundle's ``RECORD`` (in the dist-info, pip's format: path, sha256, size) lists every file it
wrote, byte code included; writing into a previous bundle replaces the files its RECORD lists and
nothing else.
"""
from __future__ import annotations

import base64
import csv
import fnmatch
import glob
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_SKIP = ("__pycache__", "*.pyc", "*.so", "*.c", "*.pyi")
RECORD_GLOB = "sm12x_plugin-*.dist-info/RECORD"


class BundleError(Exception):
    """A problem with the arguments of ``sm12x bundle``: one line naming the argument and the fix."""


def _sources() -> dict:
    """{path inside the bundle: source path} for every file the bundle ships."""
    out = {"sitecustomize.py": os.path.join(REPO, "sitecustomize.py")}
    roots = ["sm12x"] + sorted(e for e in os.listdir(REPO)
                               if e.startswith("sm12x_plugin-") and e.endswith(".dist-info"))
    for top in roots:
        for d, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = sorted(x for x in dirs if not any(fnmatch.fnmatch(x, p) for p in _SKIP))
            for f in sorted(files):
                if f == "RECORD" or any(fnmatch.fnmatch(f, p) for p in _SKIP):
                    continue
                src = os.path.join(d, f)
                out[os.path.relpath(src, REPO).replace(os.sep, "/")] = src
    return out


def _record_path(sources: dict) -> str:
    dist = next((p.split("/")[0] for p in sources if p.endswith(".dist-info/METADATA")), None)
    return f"{dist or 'sm12x_plugin-0.dist-info'}/RECORD"


def read_record(dest: str) -> list | None:
    """Paths (relative to ``dest``) a previous ``sm12x bundle`` wrote there, or None when ``dest``
    holds no bundle RECORD."""
    records = sorted(glob.glob(os.path.join(dest, RECORD_GLOB)))
    if not records:
        return None
    paths = []
    for record in records:
        with open(record, newline="") as fh:
            for row in csv.reader(fh):
                rel = os.path.normpath(row[0]) if row else ""
                if rel and not rel.startswith("..") and not os.path.isabs(rel):
                    paths.append(rel.replace(os.sep, "/"))
        paths.append(os.path.relpath(record, dest).replace(os.sep, "/"))
    return sorted(set(paths))


def _write_record(dest: str, record_rel: str, files) -> None:
    rows = []
    for rel in sorted(set(files) - {record_rel}):
        path = os.path.join(dest, rel)
        if not os.path.isfile(path):  # not written yet: listed, so the folder stays ours
            rows.append((rel, "", ""))
            continue
        with open(path, "rb") as fh:
            data = fh.read()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append((rel, f"sha256={digest}", str(len(data))))
    rows.append((record_rel, "", ""))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    with open(os.path.join(dest, record_rel), "w") as fh:
        fh.write(buf.getvalue())


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_destination(dest: str) -> list | None:
    """Raise BundleError when ``dest`` cannot take a bundle; return the previous bundle's files
    (None when ``dest`` is new or empty)."""
    shown = dest
    dest = os.path.realpath(dest)
    repo = os.path.realpath(REPO)
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise BundleError(f"DIR {shown} is a file, not a folder: give a new or empty folder, "
                          "e.g. python3 -m sm12x bundle ./sm12x-bundle")
    if dest == repo:
        raise BundleError(f"DIR {shown} is the sm12x source tree itself: give a new folder, "
                          "e.g. python3 -m sm12x bundle ./sm12x-bundle")
    for top in ["sm12x"] + [e for e in os.listdir(REPO) if e.endswith(".dist-info")]:
        if _inside(dest, os.path.join(repo, top)):
            raise BundleError(f"DIR {shown} is inside the source folder {top}/ that the bundle copies: "
                              "give a folder outside it, e.g. ./sm12x-bundle")
    previous = None
    if os.path.isdir(dest) and os.listdir(dest):
        try:
            previous = read_record(dest)
        except (OSError, ValueError, csv.Error) as e:
            raise BundleError(f"DIR {shown}: its bundle RECORD cannot be read ({e}); "
                              "give a new or empty folder") from None
        if previous is None:
            raise BundleError(f"DIR {shown} is not empty and holds no sm12x bundle (no {RECORD_GLOB}): "
                              "give a new or empty folder; sm12x never deletes files it did not write "
                              "(delete a bundle made by an older sm12x yourself)")
    near = dest
    while not os.path.isdir(near):
        near = os.path.dirname(near)
    if not os.access(near, os.W_OK | os.X_OK):
        raise BundleError(f"DIR {shown}: {near} is not writable by this user: give a folder you can write to")
    return previous


def check_interpreters(pythons) -> list:
    """Resolve each ``--compile-with`` value to (an executable that runs and is Python 3.10 or newer,
    its byte-code tag); BundleError for one that is not, before anything is written."""
    out = []
    for python in pythons:
        exe = shutil.which(python) or (python if os.path.isfile(python) and os.access(python, os.X_OK) else None)
        if exe is None:
            raise BundleError(f"--compile-with {python}: no such interpreter on this machine: give the "
                              "image's Python (e.g. python3.12; its version is what matters), or --no-compile")
        if exe == sys.executable:
            out.append((exe, sys.implementation.cache_tag))
        else:
            try:
                proc = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2], "
                                                  "sys.implementation.cache_tag)"],
                                      capture_output=True, text=True, timeout=60)
                version, _, tag = (proc.stdout.strip() if proc.returncode == 0 else "").partition(" ")
                why = "" if version else ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]
            except (OSError, subprocess.SubprocessError) as e:
                version, why = "", str(getattr(e, "strerror", None) or e)
            if not version:
                raise BundleError(f"--compile-with {python}: it does not run ({why}): give a working "
                                  "interpreter of the image's Python version, or --no-compile")
            if tuple(int(x) for x in version.split(".")) < (3, 10):
                raise BundleError(f"--compile-with {python}: it is Python {version}; sm12x needs Python 3.10 "
                                  "or newer")
            out.append((exe, tag or None))
    return out


def _compile(dest: str, py_files: list, python: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    try:
        proc = subprocess.run([python, "-m", "compileall", "-q", "-i", "-"], cwd=dest, env=env,
                              input="\n".join(py_files) + "\n", capture_output=True, text=True, timeout=600)
    except OSError as e:
        raise BundleError(f"--compile-with {python}: cannot run it ({e.strerror or e})") from None
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        raise BundleError(f"--compile-with {python}: byte-compiling the bundle failed"
                          + (f" ({lines[-1].strip()})" if lines else "")
                          + f"; {dest} holds this version's files without that byte code: run the "
                          "command again, or with --no-compile")


def _byte_code(dest: str, py_files: list, tags) -> list:
    """The .pyc files of our modules for the interpreter tags of this run
    (``__pycache__/<stem>.<tag>[.opt-N].pyc``; a None tag: any)."""
    out = []
    for rel in py_files:
        folder, name = os.path.split(rel)
        cache = os.path.join(dest, folder, "__pycache__")
        stem = re.escape(name[:-3])
        if os.path.isdir(cache):
            out += [os.path.join(folder, "__pycache__", f).replace(os.sep, "/") for f in os.listdir(cache)
                    if any(re.fullmatch(stem + r"\." + (re.escape(t) if t else r"[\w-]+") + r"(\.[\w-]+)?\.pyc", f)
                           for t in tags)]
    return out


def byte_code_tags(bundle: str) -> list:
    """Interpreter tags (``cpython-312``) the bundle's bootstrap byte code was made for."""
    cache = os.path.join(bundle, "__pycache__")
    try:
        names = os.listdir(cache)
    except OSError:
        return []
    return sorted({m.group(1) for n in names for m in [re.fullmatch(r"sitecustomize\.([\w-]+)\.pyc", n)] if m})


def _remove_stale(dest: str, stale) -> None:
    dirs = set()
    for rel in stale:
        path = os.path.join(dest, rel)
        if os.path.isfile(path) or os.path.islink(path):
            os.remove(path)
            dirs.add(os.path.dirname(path))
    # folders that only held our files go too; a folder with anything else in it stays
    for d in sorted(dirs, key=len, reverse=True):
        while _inside(d, dest) and d != dest and os.path.isdir(d) and not os.listdir(d):
            os.rmdir(d)
            d = os.path.dirname(d)


def write_bundle(dest: str, compile_with=None) -> dict:
    """Write the bundle into ``dest``; returns {"path", "files", "replaced", "kept", "byte_code"}.

    ``compile_with``: interpreters to write byte code for (None: this one; []: none). Raises
    BundleError for any problem with ``dest`` or an interpreter, before writing anything where it can.
    """
    pythons = check_interpreters(compile_with if compile_with is not None else [sys.executable])
    previous = check_destination(dest)
    dest = os.path.abspath(dest)
    created = not os.path.exists(dest)
    sources = _sources()
    record_rel = _record_path(sources)
    try:
        os.makedirs(dest, exist_ok=True)
        os.makedirs(os.path.dirname(os.path.join(dest, record_rel)), exist_ok=True)
        # A RECORD of everything ours first, so an interrupted run still leaves a folder we own.
        _write_record(dest, record_rel, list(previous or []) + list(sources))
        # A previous bundle's byte code stays until this run has written its own (a failure on the
        # way leaves it, and Python ignores a .pyc whose source changed); what this run did not
        # write, such as byte code for another Python, goes at the end.
        for rel, src in sources.items():
            path = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.islink(path):
                os.remove(path)
            shutil.copy2(src, path)
        py_files = [rel for rel in sources if rel.endswith(".py")]
        for python, _ in pythons:
            _compile(dest, py_files, python)
        written = set(sources) | set(_byte_code(dest, py_files, [tag for _, tag in pythons])) | {record_rel}
        _remove_stale(dest, sorted(set(previous or []) - written))
        _write_record(dest, record_rel, written)
        _make_readable(dest, written, created)
    except OSError as e:
        raise BundleError(f"DIR {dest}: cannot write {e.filename or dest} ({e.strerror or e})") from None
    kept = 0
    for d, _, files in os.walk(dest):
        kept += sum(1 for f in files
                    if os.path.relpath(os.path.join(d, f), dest).replace(os.sep, "/") not in written)
    mode = os.stat(dest).st_mode
    return {"path": dest, "files": len(written), "replaced": previous is not None, "kept": kept,
            "byte_code": byte_code_tags(dest), "private": (mode & 0o005) != 0o005}


def _make_readable(dest: str, written, created: bool) -> None:
    """Files 0644 and folders 0755 whatever the umask: the container's user (often uid 1000, not
    this one) must read the mount, or the bootstrap does nothing without a word. ``dest`` itself
    only when this run created it (a folder of the user's keeps its mode; the CLI warns)."""
    folders = {dest} if created else set()
    for rel in written:
        path = os.path.join(dest, rel)
        if os.path.isfile(path):
            os.chmod(path, 0o644)
        d = os.path.dirname(path)
        while _inside(d, dest) and d != dest:
            folders.add(d)
            d = os.path.dirname(d)
    for d in folders:
        os.chmod(d, 0o755)

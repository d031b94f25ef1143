#!/usr/bin/env python3
"""Build the local sm12x test image offline: Debian's own python3 and its sitecustomize, nothing else.

No registry is reachable in CI, so nothing can be pulled (not even `debian:bookworm`). Instead this script
packs the *host's* Debian interpreter into a root filesystem tar and `docker import`s it:

  /usr/bin/python3.X (+ python3 -> python3.X)      the Debian build, with its shared-library closure (ldd)
  /usr/lib/python3.X/                             the stdlib, incl. sitecustomize.py -> /etc/python3.X/...
  /etc/python3.X/sitecustomize.py                 Debian's apport hook: the file sm12x must chain
  /etc/passwd, /etc/group                         root and `app` (uid/gid 1000, HOME=/home/app)
  /tmp (1777), /home/app (1000:1000), /opt/image-lib (an image PYTHONPATH entry)
  bin, lib, lib64, sbin -> usr/...                usrmerge symlinks, as on the host

Image config: USER 1000:1000, ENV PYTHONPATH=/opt/image-lib, HOME=/home/app, PATH=/usr/bin:/bin.
So a test sees what a real vLLM/SGLang image gives: a Debian-family Python that ships a sitecustomize,
a pre-set PYTHONPATH that must be kept, and a non-root user. No shell, no nvcc (doctor must notice).

Requires: a Debian/Ubuntu host with /usr/bin/python3 (package python3-minimal) and a Docker engine;
the `docker` Python package. Takes a few seconds; the image is ~25 MB.

Usage: build_test_image.py [--tag sm12x-test:py3] [--isolated-tag T] [--vllm-tag T] [--vllm-gpu-tag T]
  --isolated-tag also tags the same root filesystem with ENTRYPOINT ["python3", "-I"] (sitecustomize off).
  --vllm-tag also builds a look-alike of a stock vLLM image: a stand-in `vllm` 0.25.1 distribution in
             /usr/local/lib/python3.X/dist-packages, a `vllm` console script (#!/usr/bin/python3) and
             ENTRYPOINT ["vllm", "serve"], as vllm/vllm-openai has. It serves nothing, and has no torch.
  --vllm-gpu-tag also builds that look-alike with stand-ins for a CUDA build of torch, triton and vLLM's
             FlashMLA ops module (fake_gpu_stack_files): what the patch plan reads in a GPU image.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

DEFAULT_TAG = "sm12x-test:py3"
DEFAULT_ISOLATED_TAG = "sm12x-test:py3-isolated"
# Stdlib parts no test needs; dropping them keeps the image small.
SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "__pycache__"}
BASE_CHANGES = [
    "USER 1000:1000",
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV HOME=/home/app",
    "ENV PYTHONPATH=/opt/image-lib",
    "WORKDIR /home/app",
    'CMD ["python3"]',
]
ISOLATED_CHANGES = BASE_CHANGES + ['ENTRYPOINT ["python3", "-I"]', 'CMD ["-c", "print(1)"]']
VLLM_CHANGES = BASE_CHANGES[:-1] + ['ENTRYPOINT ["vllm", "serve"]', 'CMD ["--help"]']
FAKE_VLLM_VERSION = "0.25.1"


def fake_vllm_files(ver: str) -> dict[str, tuple[str, int]]:
    """{path in the image: (text, mode)} for the stand-in vLLM distribution and console script."""
    site = f"usr/local/lib/python{ver}/dist-packages"
    v = FAKE_VLLM_VERSION
    return {
        f"{site}/vllm/__init__.py": (f'"""Stand-in for the sm12x tests: not vLLM."""\n__version__ = "{v}"\n', 0o644),
        f"{site}/vllm-{v}.dist-info/METADATA": (f"Metadata-Version: 2.1\nName: vllm\nVersion: {v}\n", 0o644),
        f"{site}/vllm-{v}.dist-info/RECORD": ("", 0o644),
        "usr/local/bin/vllm": ("#!/usr/bin/python3\nimport sys\nprint('stand-in vllm', *sys.argv[1:])\n", 0o755),
    }


def fake_gpu_stack_files(ver: str) -> dict[str, tuple[str, int]]:
    """Stand-ins, added to the vLLM look-alike, for what a GPU image also has: a CUDA build of torch
    and triton (their metadata and torch/version.py, which is all the plan reads), and vLLM's
    FlashMLA ops module (vllm/v1/attention/ops/flashmla.py), but not its vendored third_party copies."""
    site = f"usr/local/lib/python{ver}/dist-packages"
    stub = '"""Stand-in for the sm12x tests."""\n'
    files = {
        f"{site}/torch/__init__.py": (stub + '__version__ = "2.9.0"\n', 0o644),
        f"{site}/torch/version.py": (stub + "from typing import Optional\n__version__ = '2.9.0+cu128'\n"
                                            "cuda: Optional[str] = '12.8'\n", 0o644),
        f"{site}/triton/__init__.py": (stub + '__version__ = "3.5.0"\n', 0o644),
        f"{site}/vllm/v1/__init__.py": (stub, 0o644),
        f"{site}/vllm/v1/attention/__init__.py": (stub, 0o644),
        f"{site}/vllm/v1/attention/ops/__init__.py": (stub, 0o644),
        f"{site}/vllm/v1/attention/ops/flashmla.py": (stub + "".join(
            f"def {name}(*args, **kwargs):\n    raise RuntimeError('stand-in')\n\n"
            for name in ("flash_mla_with_kvcache", "get_mla_metadata", "flash_mla_sparse_fwd")), 0o644),
    }
    for dist, version in (("torch", "2.9.0+cu128"), ("triton", "3.5.0")):
        files[f"{site}/{dist}-{version}.dist-info/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n", 0o644)
    return files


def host_python() -> tuple[str, str]:
    """(real path of the host's Debian python3, its X.Y version); raises RuntimeError if unusable."""
    exe = os.path.realpath("/usr/bin/python3")
    m = re.fullmatch(r"/usr/bin/python(3\.\d+)", exe)
    if not m:
        raise RuntimeError(f"/usr/bin/python3 resolves to {exe!r}, not a Debian /usr/bin/python3.X")
    ver = m.group(1)
    if not os.path.exists(f"/usr/lib/python{ver}/sitecustomize.py"):
        raise RuntimeError(f"/usr/lib/python{ver}/sitecustomize.py missing: not a Debian-family python")
    return exe, ver


def shared_libs(paths: list[str]) -> set[str]:
    """The ELF interpreter and shared libraries the given binaries load (from `ldd`)."""
    libs: set[str] = set()
    for chunk in range(0, len(paths), 200):
        out = subprocess.run(["ldd", *paths[chunk:chunk + 200]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+) \(0x", line)
            if m:
                libs.add(m.group(1))
    return libs


def rootfs_members(exe: str, ver: str) -> list[str]:
    """Host paths (files and symlinks) that make up the root filesystem."""
    stdlib = f"/usr/lib/python{ver}"
    members = [exe, "/usr/bin/python3", f"/etc/python{ver}/sitecustomize.py"]
    sos = [exe]
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_STDLIB and not d.startswith("config-"))
        for f in sorted(files):
            p = os.path.join(root, f)
            members.append(p)
            if f.endswith(".so"):
                sos.append(p)
    for lib in sorted(shared_libs(sos)):
        members.append(lib)
        real = os.path.realpath(lib)
        if real != lib:
            members.append(real)
    return members


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
    tar.addfile(info)


def _add_text(tar: tarfile.TarFile, name: str, text: str, mode: int = 0o644) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def write_rootfs(path: str, extra: bool = False, gpu_stack: bool = False) -> str:
    """Write the root filesystem tar to `path` (with the stand-in vLLM when `extra`, and the stand-in
    GPU stack too when `gpu_stack`); returns X.Y."""
    exe, ver = host_python()
    seen: set[str] = set()
    with tarfile.open(path, "w") as tar:
        for d in ("usr", "usr/bin", "usr/lib", "usr/local", "usr/local/bin", "etc", "home", "opt",
                  "opt/image-lib", "proc", "sys", "dev", "root", "var"):
            _add_dir(tar, d)
            seen.add(d)
        _add_dir(tar, "tmp", 0o1777)
        _add_dir(tar, "home/app", 0o755, uid=1000)
        seen.update({"tmp", "home/app"})
        for link in ("bin", "lib", "lib64", "sbin"):
            if os.path.islink("/" + link):
                info = tarfile.TarInfo(link)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink("/" + link)
                tar.addfile(info)
        _add_text(tar, "etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n")
        _add_text(tar, "etc/group", "root:x:0:\napp:x:1000:\n")
        for p in rootfs_members(exe, ver):
            # Store under the real directory (host /lib -> usr/lib), keep the file's own symlink-ness.
            name = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p)).lstrip("/")
            if name in seen or not os.path.lexists(p):
                continue
            parent = os.path.dirname(name)
            while parent and parent not in seen:  # make sure every parent dir exists in the tar
                seen.add(parent)
                parent = os.path.dirname(parent)
            seen.add(name)
            tar.add(p, arcname=name, recursive=False)
        if extra:
            files = dict(fake_vllm_files(ver), **(fake_gpu_stack_files(ver) if gpu_stack else {}))
            for name, (text, mode) in sorted(files.items()):
                parent, parts = os.path.dirname(name), []
                while parent and parent not in seen:
                    parts.append(parent)
                    seen.add(parent)
                    parent = os.path.dirname(parent)
                for d in reversed(parts):
                    _add_dir(tar, d)
                _add_text(tar, name, text, mode)
    return ver


def build(client=None, tag: str = DEFAULT_TAG, isolated_tag: str | None = None,
          vllm_tag: str | None = None, vllm_gpu_tag: str | None = None) -> dict:
    """Build (or rebuild) the image(s); returns {"tag", "isolated_tag", "vllm_tag", "vllm_gpu_tag",
    "python": "3.X"}."""
    import docker  # the SDK; imported here so --help works without it

    client = client or docker.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = os.path.join(tmp, "rootfs.tar")
        ver = write_rootfs(tar_path)
        repo, _, name_tag = tag.rpartition(":") if ":" in tag else (tag, "", "latest")
        client.api.import_image(src=tar_path, repository=repo, tag=name_tag, changes=BASE_CHANGES)
        if isolated_tag:
            repo, _, name_tag = isolated_tag.rpartition(":")
            client.api.import_image(src=tar_path, repository=repo, tag=name_tag, changes=ISOLATED_CHANGES)
        if vllm_tag:
            write_rootfs(tar_path, extra=True)
            repo, _, name_tag = vllm_tag.rpartition(":")
            client.api.import_image(src=tar_path, repository=repo, tag=name_tag, changes=VLLM_CHANGES)
        if vllm_gpu_tag:
            write_rootfs(tar_path, extra=True, gpu_stack=True)
            repo, _, name_tag = vllm_gpu_tag.rpartition(":")
            client.api.import_image(src=tar_path, repository=repo, tag=name_tag, changes=VLLM_CHANGES)
    return {"tag": tag, "isolated_tag": isolated_tag, "vllm_tag": vllm_tag, "vllm_gpu_tag": vllm_gpu_tag,
            "python": ver}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=DEFAULT_TAG)
    ap.add_argument("--isolated-tag", default=None, help=f"e.g. {DEFAULT_ISOLATED_TAG}")
    ap.add_argument("--vllm-tag", default=None, help="e.g. sm12x-test:py3-vllm")
    ap.add_argument("--vllm-gpu-tag", default=None, help="e.g. sm12x-test:py3-vllm-gpu")
    ap.add_argument("--tar", help="only write the root filesystem tar to this path (no Docker needed)")
    args = ap.parse_args(argv)
    try:
        if args.tar:
            print(json.dumps({"tar": args.tar, "python": write_rootfs(args.tar)}))
        else:
            print(json.dumps(build(tag=args.tag, isolated_tag=args.isolated_tag, vllm_tag=args.vllm_tag,
                                   vllm_gpu_tag=args.vllm_gpu_tag)))
    except Exception as e:  # one line, not a traceback: this runs from CI logs
        print(f"build_test_image: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Platform facts without initialising CUDA: GPU compute capability through NVML, installed versions
through package metadata (nothing is imported).

- ``gpu_arch()``: ``Arch(capability=(12, 0) | None, source="nvml"|"env"|"none"|"invalid",
  devices=[...], detail=str)``. ``SM12X_ARCH`` pretends (see ``parse_arch`` for the accepted
  spellings); otherwise NVML (``pynvml`` when importable, else ctypes on ``libnvidia-ml.so.1``)
  reports every device visible through ``CUDA_VISIBLE_DEVICES`` and the first one is the process's
  arch. No driver means "no GPU". A value of ``SM12X_ARCH`` that is not one of those spellings
  never raises here (this runs inside the host's imports): the arch is "invalid", no SM12x patch
  applies, and one line on stderr per process says so. The CLI calls ``check_arch_env()`` first
  and stops with that line instead.
- ``wants_sm12x_patches(arch)``: SM12x (12.x), or any CUDA GPU when ``SM12X_FORCE=1``.
- ``versions()``: installed versions of the libraries we patch, ``None`` when absent.
- ``parse_release`` / ``in_range``: compare release numbers only, so NVIDIA builds such as
  ``2.9.0a0+git1234`` count as 2.9.0.
- ``plan_blocker(module, qualname)``: for the plan, what in the installed files stops a patch (a
  missing sub-module or attribute, no torch or triton), found without importing anything
  (``installed_spec``, ``find_module_file``, ``defines_name``, ``torch_build``).
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass, field

# key shown in `status` -> distribution names that provide it, first found wins
DISTRIBUTIONS = {
    "vllm": ("vllm",),
    "sglang": ("sglang",),
    "sgl-kernel": ("sglang-kernel", "sgl-kernel"),
    "flashinfer-python": ("flashinfer-python", "flashinfer"),
    "flash_mla": ("flash-mla", "sgl-flash-mla", "flash_mla"),
    "deep_gemm": ("sgl-deep-gemm", "deep-gemm", "deep_gemm"),
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton"),
}


@dataclass
class Arch:
    capability: tuple | None
    source: str  # "nvml", "env", "none" or "invalid" (SM12X_ARCH refused)
    devices: list = field(default_factory=list)  # capability of each visible device
    detail: str = ""

    @property
    def label(self) -> str:
        return "no GPU" if self.capability is None else "%d.%d" % self.capability


# SM12X_ARCH spellings -> compute capability. Only GPUs sm12x has configs for; a bare "12" or "sm_12"
# is refused rather than guessed (it could mean 12.x or capability 1.2).
_ARCH_SPELLINGS = {}
for _cap in ((12, 0), (12, 1), (9, 0)):
    _digits = "%d%d" % _cap
    for _spelling in ("%d.%d" % _cap, _digits, "sm_" + _digits, "sm" + _digits):
        _ARCH_SPELLINGS[_spelling] = _cap
ARCH_HELP = ("use 12.0 (RTX PRO 6000 / RTX 5090), 12.1 (DGX Spark GB10) or 9.0 (Hopper, for testing); "
             "120, sm_120 and sm120 spell 12.0 too; unset it to ask the GPU")


class ArchError(ValueError):
    """SM12X_ARCH holds a value sm12x does not accept; the message names it and the fix."""


def parse_arch(value: str) -> tuple:
    """``"12.0"``, ``"120"``, ``"sm_120"``, ``"sm120"`` -> (12, 0); likewise 12.1 and 9.0. Case and
    surrounding spaces are ignored; anything else raises ArchError."""
    cap = _ARCH_SPELLINGS.get(str(value).strip().lower())
    if cap is None:
        raise ArchError(f"SM12X_ARCH={value!r} is not a GPU arch sm12x knows: {ARCH_HELP}")
    return cap


def check_arch_env() -> None:
    """Raise ArchError when SM12X_ARCH is set to a value ``parse_arch`` refuses."""
    forced = os.environ.get("SM12X_ARCH", "").strip()
    if forced:
        parse_arch(forced)


_WARNED = set()


def _warn_once(message: str) -> None:
    """One line on stderr per process and message, in the format of logger ``sm12x``."""
    if message in _WARNED or os.environ.get("SM12X_LOG", "").lower() in ("error", "critical"):
        return
    _WARNED.add(message)
    try:
        sys.stderr.write(f"sm12x[{os.getpid()}] WARNING {message}\n")
    except Exception:
        pass


def _visible_selectors():
    """Entries of CUDA_VISIBLE_DEVICES, or None for "all devices"."""
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out = []
    for item in raw.split(","):
        item = item.strip()
        if not item or item == "-1":
            break  # CUDA stops at the first invalid entry
        out.append(item)
    return out


class _CtypesNvml:
    """The four NVML calls we need, through ctypes."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2())

    def _check(self, rc):
        if rc != 0:
            raise OSError(f"NVML error {rc}")

    def count(self):
        n = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)))
        return n.value

    def handle(self, selector):
        h = ctypes.c_void_p()
        if isinstance(selector, int):
            self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(selector, ctypes.byref(h)))
        else:
            self._check(self.lib.nvmlDeviceGetHandleByUUID(selector.encode(), ctypes.byref(h)))
        return h

    def capability(self, h):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major),
                                                                ctypes.byref(minor)))
        return (major.value, minor.value)

    def name(self, h):
        buf = ctypes.create_string_buffer(96)
        self._check(self.lib.nvmlDeviceGetName(h, buf, ctypes.c_uint(96)))
        return buf.value.decode(errors="replace")

    def driver(self):
        buf = ctypes.create_string_buffer(80)
        self._check(self.lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(80)))
        return buf.value.decode(errors="replace")

    def close(self):
        self.lib.nvmlShutdown()


class _PyNvml:
    def __init__(self):
        import pynvml

        self.m = pynvml
        pynvml.nvmlInit()

    def count(self):
        return self.m.nvmlDeviceGetCount()

    def handle(self, selector):
        if isinstance(selector, int):
            return self.m.nvmlDeviceGetHandleByIndex(selector)
        return self.m.nvmlDeviceGetHandleByUUID(selector)

    def capability(self, h):
        return tuple(self.m.nvmlDeviceGetCudaComputeCapability(h))

    def name(self, h):
        value = self.m.nvmlDeviceGetName(h)
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    def driver(self):
        value = self.m.nvmlSystemGetDriverVersion()
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    def close(self):
        self.m.nvmlShutdown()


def _nvml_capabilities():
    """Capabilities of the visible devices via NVML; (list, detail)."""
    try:
        import importlib.util

        nvml = _PyNvml() if importlib.util.find_spec("pynvml") else _CtypesNvml()
    except Exception as e:  # no driver, no library: no GPU
        return [], f"NVML unavailable ({type(e).__name__}: {e})"
    try:
        selectors = _visible_selectors()
        if selectors is None:
            selectors = list(range(nvml.count()))
        caps = []
        for sel in selectors:
            if isinstance(sel, str) and sel.isdigit():
                sel = int(sel)
            caps.append(nvml.capability(nvml.handle(sel)))
        return caps, "NVML"
    except Exception as e:
        return [], f"NVML query failed ({type(e).__name__}: {e})"
    finally:
        try:
            nvml.close()
        except Exception:
            pass


def gpu_identities() -> list:
    """(name, "major.minor", driver) of each visible device, in CUDA's order, through NVML (never
    CUDA); [] without NVML. The runtime guard keys its verdicts by these."""
    try:
        import importlib.util

        nvml = _PyNvml() if importlib.util.find_spec("pynvml") else _CtypesNvml()
    except Exception:
        return []
    try:
        selectors = _visible_selectors()
        if selectors is None:
            selectors = list(range(nvml.count()))
        driver = nvml.driver()
        out = []
        for sel in selectors:
            h = nvml.handle(int(sel) if isinstance(sel, str) and sel.isdigit() else sel)
            out.append((nvml.name(h), "%d.%d" % nvml.capability(h), driver))
        return out
    except Exception:
        return []
    finally:
        try:
            nvml.close()
        except Exception:
            pass


_ARCH_CACHE = {}


def gpu_arch(refresh: bool = False) -> Arch:
    """The process's GPU arch (cached per value of the environment variables that affect it)."""
    key = (os.environ.get("SM12X_ARCH"), os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not refresh and key in _ARCH_CACHE:
        return _ARCH_CACHE[key]
    forced = os.environ.get("SM12X_ARCH", "").strip()
    if forced:
        try:
            cap = parse_arch(forced)
            arch = Arch(cap, "env", [cap], f"SM12X_ARCH={forced}")
        except ArchError as e:
            _warn_once(f"{e}: no sm12x patch applies in this process")
            arch = Arch(None, "invalid", [], str(e))
    else:
        caps, detail = _nvml_capabilities()
        arch = Arch(caps[0] if caps else None, "nvml" if caps else "none", caps, detail)
    _ARCH_CACHE[key] = arch
    return arch


def force_enabled() -> bool:
    return os.environ.get("SM12X_FORCE", "") == "1"


def wants_sm12x_patches(arch: Arch):
    """(True, why) when SM12x patches apply on this arch, else (False, reason)."""
    if arch.source == "invalid":
        return False, arch.detail
    if arch.capability is None:
        return False, f"no GPU detected ({arch.detail})"
    if arch.capability[0] == 12:
        return True, f"SM12x GPU (compute capability {arch.label})"
    if force_enabled():
        return True, f"SM12X_FORCE=1 on a {arch.label} GPU"
    return False, f"GPU is {arch.label}, not SM12x (set SM12X_FORCE=1 to apply anyway)"


def versions() -> dict:
    """Installed version of every library in DISTRIBUTIONS (None when not installed)."""
    from importlib import metadata

    out = {}
    for key, dists in DISTRIBUTIONS.items():
        out[key] = None
        for dist in dists:
            try:
                out[key] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
            except Exception:
                continue
    return out


def parse_release(version: str) -> tuple:
    """Release numbers of a version string: '2.9.0a0+git12' -> (2, 9, 0); '0.5.23.post1' ->
    (0, 5, 23)."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(p) for p in m.group(1).split("."))


def _cmp(a: tuple, b: tuple) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


def in_range(version: str | None, spec: str) -> bool:
    """Whether ``version`` satisfies ``spec``: '*' or comma-separated clauses '>=0.5', '<0.6',
    '==0.5.2'. Only release numbers are compared; an unknown version satisfies only '*'."""
    spec = spec.strip()
    if spec in ("", "*"):
        return True
    if version is None:
        return False
    have = parse_release(version)
    for clause in spec.split(","):
        m = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*([\d.]+)\s*", clause)
        if not m:
            raise ValueError(f"bad version clause {clause!r} in {spec!r}")
        op, want = m.group(1), parse_release(m.group(2))
        c = _cmp(have, want)
        ok = {">=": c >= 0, "<=": c <= 0, "==": c == 0, "!=": c != 0, ">": c > 0, "<": c < 0}[op]
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------------------------------------
# What is installed, found without importing it: the plan (``sm12x status``, ``doctor``) must not
# import a framework, and must not call a patch "would apply" when its target or what the
# replacement runs on is missing.
# ---------------------------------------------------------------------------------------------------

# Every replacement sm12x installs runs Triton kernels on torch tensors.
RUNTIME_NEEDS = ("torch", "triton")


def _is_stand_in(spec) -> bool:
    return type(getattr(spec, "loader", None)).__module__ == "sm12x.shims"


def installed_spec(top: str):
    """The import spec of top-level package ``top`` as installed (nothing is imported), or None.
    sm12x's own stand-in modules (``sm12x.shims``) do not count as installed."""
    import importlib.util

    module = sys.modules.get(top)
    if module is not None:
        return None if getattr(module, "__sm12x_shim__", False) else getattr(module, "__spec__", None) or True
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    return None if spec is None or _is_stand_in(spec) else spec


def _finder(folder):
    finder = sys.path_importer_cache.get(folder)
    if finder is not None:
        return finder
    for hook in sys.path_hooks:
        try:
            return hook(folder)
        except ImportError:
            continue
    return None


def _find_in(fullname: str, folders: list):
    """(spec, namespace folders) of ``fullname`` in ``folders``, as the path finder would find it,
    without importing its parent (a namespace package's own path object would look the parent up
    in sys.modules)."""
    portions = []
    for folder in folders:
        finder = _finder(folder)
        spec = finder.find_spec(fullname) if finder is not None else None
        if spec is None:
            continue
        if spec.loader is not None:
            return spec, None
        portions += list(spec.submodule_search_locations or [])
    return None, portions


def find_module_file(name: str):
    """(found, origin) for a dotted module name, walking the package folders without importing
    anything: found is True, False, or None when it cannot be told (a parent that is not a plain
    folder, such as a module that fills ``sys.modules`` itself)."""
    parts = name.split(".")
    spec = installed_spec(parts[0])
    if spec is None:
        return False, None
    module = sys.modules.get(parts[0])
    if module is not None:
        folders, origin = list(getattr(module, "__path__", None) or []), getattr(module, "__file__", None)
    else:
        folders, origin = list(spec.submodule_search_locations or []), spec.origin
    done = parts[0]
    for part in parts[1:]:
        here = f"{done}.{part}"
        if here in sys.modules:
            module = sys.modules[here]
            folders, origin = list(getattr(module, "__path__", None) or []), getattr(module, "__file__", None)
            done = here
            continue
        if not folders:
            return None, None
        try:
            spec, portions = _find_in(here, folders)
        except (ImportError, ValueError, OSError):
            return None, None
        if spec is not None:
            folders, origin = list(spec.submodule_search_locations or []), spec.origin
        elif portions:
            folders, origin = portions, None
        else:
            return False, None
        done = here
    return True, origin


def defines_name(origin: str | None, name: str):
    """Whether the module file ``origin`` mentions ``name`` (True), surely does not (False), or
    cannot be told (None: no file, a star import, unreadable). A mention anywhere counts, so a name
    bound by an import or an assignment is found; a compiled extension is searched as bytes."""
    if not origin or not os.path.isfile(origin):
        return None
    if origin.endswith((".py", ".pyw")):
        try:
            with open(origin, "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return None
        if re.search(r"^\s*from\s+\S+\s+import\s+\*", text, re.M) or "__getattr__" in text:
            return None  # names can come from elsewhere: only an import tells
        return re.search(r"\b%s\b" % re.escape(name), text) is not None
    if origin.endswith(".pyc"):
        return None
    import mmap

    try:  # an extension module names its functions in its string table; it may be hundreds of MB
        with open(origin, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(name.encode()) != -1
    except (OSError, ValueError):
        return None


def torch_build():
    """"cuda 12.8", "rocm 6.3" or "cpu" for the installed torch (read from torch/version.py, torch
    is not imported), or None when torch is absent or the file cannot be read."""
    found, origin = find_module_file("torch.version")
    if not found or not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin) as fh:
            text = fh.read()
    except OSError:
        return None
    for key in ("cuda", "hip"):
        m = re.search(r"^%s\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]" % key, text, re.M)
        if m:
            return ("cuda " if key == "cuda" else "rocm ") + m.group(1)
    return "cpu"


def plan_blocker(module: str, qualname: str, arch: Arch | None = None) -> str:
    """Why a patch of ``module:qualname`` will not apply although its library is installed and its
    arch and version match, or "" when nothing in the installed files stands in its way: the
    target sub-module or attribute is missing from the installed version, or the replacement's
    runtime (torch, triton, on a real GPU a CUDA build of torch) is."""
    for need in RUNTIME_NEEDS:
        if installed_spec(need) is None:
            return f"needs {need}, which is not installed"
    arch = arch if arch is not None else gpu_arch()
    if arch.source == "nvml" and torch_build() == "cpu":
        return "needs a CUDA build of torch; the installed torch is a CPU build"
    found, origin = find_module_file(module)
    if found is False:
        return f"module {module} does not exist in the installed version"
    if found and origin and origin.endswith((".so", ".pyd")) \
            and defines_name(origin, "PyInit_" + module.rpartition(".")[2]) is False:
        # sgl-flash-mla's flash_mla/cuda.abi3.so: loaded with torch.ops.load_library, never imported
        return (f"{module} of the installed version is a library loaded through torch.ops, not a Python "
                f"module: nothing to patch there")
    first = qualname.split(".")[0]
    if found and defines_name(origin, first) is False:
        return f"{module} of the installed version has no {first}"
    return ""

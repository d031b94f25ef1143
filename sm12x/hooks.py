"""The import watcher and the apply loop.

``install_watcher()`` (called by our ``sitecustomize``) puts one small finder at the front of
``sys.meta_path``. It is stdlib-only and costs nothing until a module of a watched package
(``WATCHED``) is imported; then, right after that module's body ran and before any importer sees
it, ``on_module_executed`` selects the registry patches that target (or copy from) that module and
applies them. Only from that moment are the platform facts read (NVML, package metadata) and the
patch modules imported: nothing heavy happens in unrelated Python processes.

When no finder at all knows ``deep_gemm``, the watcher asks ``sm12x.shims`` for a stand-in (see
there). ``install()`` is the same for processes where the watched modules may already be imported (the
framework plugin route): it installs the watcher and applies patches to what is already there.
Both are idempotent.
"""
import os
import sys

WATCHED = ("vllm", "sglang", "sgl_kernel", "flash_mla", "deep_gemm", "flashinfer")
_MARK = "__sm12x_watcher__"


_SHIMMED = ("deep_gemm",)  # absent libraries sm12x.shims can stand in for


def _shim_spec(fullname):
    try:
        from sm12x import shims

        return shims.find_shim_spec(fullname)
    except Exception:
        return None


class _ChainedLoader:
    """Wraps a module's loader to run our hook right after the module body executed."""

    def __init__(self, loader, fullname):
        self.loader = loader
        self.fullname = fullname

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create else None

    def exec_module(self, module):
        # Hand the module its real loader back: code that inspects __loader__ sees the original.
        try:
            module.__loader__ = self.loader
            if getattr(module, "__spec__", None) is not None:
                module.__spec__.loader = self.loader
        except Exception:
            pass
        self.loader.exec_module(module)
        _fire(self.fullname, module)


class _Watcher:
    """A meta-path finder that only decorates the specs other finders produce."""

    def __init__(self, watched):
        self.watched = frozenset(watched)
        self._busy = set()
        setattr(self, _MARK, True)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] not in self.watched or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self or getattr(finder, _MARK, False):
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(fullname)
        if spec is None and fullname in _SHIMMED:
            return _shim_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ChainedLoader(spec.loader, fullname)
        return spec

    def invalidate_caches(self):
        pass


def _watcher_installed():
    return any(getattr(f, _MARK, False) for f in sys.meta_path)


def install_watcher():
    """Put the watcher first on sys.meta_path (once per process)."""
    if not _watcher_installed():
        sys.meta_path.insert(0, _Watcher(WATCHED))


def install():
    """Watcher plus patches for watched modules already imported. Idempotent."""
    install_watcher()
    for name in sorted(n for n in list(sys.modules) if n.partition(".")[0] in WATCHED):
        module = sys.modules.get(name)
        if module is not None:
            _fire(name, module)


def _fire(name, module):
    """Apply the patches for ``name``; never raises unless SM12X_STRICT=1 asked for it."""
    if os.environ.get("SM12X_DISABLE") == "1":
        return
    try:
        from sm12x import apply

        if os.environ.get("SM12X_SKIP"):
            typos = apply.unmatched_skips()
            if typos:  # logged once per process: a typo would otherwise skip nothing, silently
                apply.log_once("warning", f"sm12x: SM12X_SKIP names no sm12x patch: {', '.join(typos)} "
                                          "(a typo skips nothing; `python3 -m sm12x status --verbose` "
                                          "lists the names)")
        apply.on_module_executed(name, module)
    except Exception as e:
        if os.environ.get("SM12X_STRICT") == "1":
            raise
        try:
            from sm12x import apply

            apply.log_once("error", f"sm12x: internal error while patching {name}: "
                                    f"{type(e).__name__}: {e}")
        except Exception:
            pass

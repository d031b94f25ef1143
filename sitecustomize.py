"""sm12x bootstrap (stdlib only, valid on Python 3.10+).

1. Runs the sitecustomize this file shadows (Debian/Ubuntu Pythons ship one), exactly once.
2. Unless SM12X_DISABLE=1, installs sm12x's lazy import watcher (sm12x.hooks): nothing else is
   imported or probed until vllm, sglang, sgl_kernel, flash_mla, deep_gemm or flashinfer is.
Nothing here may stop the interpreter: every failure, ours or the chained file's, is swallowed
(shown on stderr when SM12X_LOG=debug).
"""


def _sm12x_chain():
    # importlib.util is avoided on purpose: it pulls contextlib/functools (~3 ms per process).
    import importlib.machinery
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or not spec.origin or os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return None
    name = "_sm12x_chained_sitecustomize"
    if name in sys.modules:
        return spec.origin
    if spec.origin.endswith(".py"):
        loader = importlib.machinery.SourceFileLoader(name, spec.origin)
    else:
        loader = importlib.machinery.SourcelessFileLoader(name, spec.origin)
    module = type(sys)(name)
    module.__file__ = spec.origin
    module.__loader__ = loader
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException as e:  # the image's file may even raise SystemExit: never fatal here
        _sm12x_debug("chained sitecustomize %s raised %r" % (spec.origin, e))
    return spec.origin


def _sm12x_debug(message):
    try:  # called from except blocks: must not raise itself (stderr may be closed)
        import os
        import sys

        if os.environ.get("SM12X_LOG", "").lower() == "debug":
            sys.stderr.write("sm12x: %s\n" % message)
    except BaseException:
        pass


_sm12x_chained = None
_sm12x_active = False
try:
    _sm12x_chained = _sm12x_chain()
except BaseException as _e:
    _sm12x_debug("chaining failed: %r" % (_e,))
try:
    import os as _os

    if _os.environ.get("SM12X_DISABLE") != "1":
        from sm12x import hooks as _sm12x_hooks

        _sm12x_hooks.install_watcher()
        _sm12x_active = True
except BaseException as _e:
    _sm12x_debug("bootstrap failed: %r" % (_e,))

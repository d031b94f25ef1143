"""sm12x bootstrap (stdlib only, valid on Python 3.10+).

1. Runs the sitecustomize this file shadows (Debian/Ubuntu Pythons ship one), exactly once and as
   Python itself would: under the name ``sitecustomize`` with its own ``__file__``, and when it
   raises, the same ``Error in sitecustomize; set PYTHONVERBOSE for traceback:`` lines go to stderr
   (the traceback with ``python -v``). Names it defines stay reachable as ``sitecustomize.NAME``.
2. Unless SM12X_DISABLE=1, installs sm12x's lazy import watcher (sm12x.hooks): nothing else is
   imported or probed until vllm, sglang, sgl_kernel, flash_mla, deep_gemm or flashinfer is.
Nothing here may stop the interpreter: a failure of ours is swallowed (shown on stderr when
SM12X_LOG=debug), and a SystemExit or KeyboardInterrupt from the chained file is reported like
any other error instead of ending start-up (without the mount Python would abort there).
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
    guard = "_sm12x_chained_sitecustomize"  # the image's module, kept so it never runs twice
    if guard in sys.modules:
        return spec.origin
    module = type(sys)("sitecustomize")
    module.__file__ = spec.origin
    module.__loader__ = spec.loader
    module.__spec__ = spec
    module.__package__ = ""
    try:
        module.__cached__ = spec.cached
    except Exception:
        pass
    sys.modules[guard] = module
    # While it runs, `sys.modules["sitecustomize"]` is the image's module, as during a plain import.
    previous = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as err:  # even SystemExit: never fatal here
        _sm12x_report(err)
    finally:
        if previous is None:
            sys.modules.pop("sitecustomize", None)
        else:
            sys.modules["sitecustomize"] = previous
    ours = globals()
    for name, value in list(vars(module).items()):
        if not name.startswith("__") and name not in ours:
            ours[name] = value
    return spec.origin


def _sm12x_report(err):
    """What site.execsitecustomize prints for an error in sitecustomize (CPython 3.10-3.13)."""
    import sys

    if isinstance(err, ImportError) and err.name == "sitecustomize":
        return  # site ignores this one silently
    try:
        if sys.flags.verbose:
            sys.excepthook(type(err), err, err.__traceback__)
        else:
            sys.stderr.write("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                             "%s: %s\n" % (err.__class__.__name__, err))
    except BaseException:
        pass


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

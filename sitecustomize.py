"""sm12x bootstrap (stdlib only, valid on Python 3.10+).

1. Runs the sitecustomize this file shadows (Debian/Ubuntu Pythons ship one), exactly once and as
   Python itself would: under the name ``sitecustomize`` with its own ``__file__``, and when it
   raises, the same ``Error in sitecustomize; set PYTHONVERBOSE for traceback:`` lines go to stderr
   (the traceback with ``python -v``). Names it defines stay reachable as ``sitecustomize.NAME``.
2. Unless SM12X_DISABLE=1, installs sm12x's lazy import watcher (sm12x.hooks): nothing else is
   imported or probed until vllm, sglang, sgl_kernel, flash_mla, deep_gemm or flashinfer is.
Nothing of ours may stop the interpreter: a failure of ours is swallowed (shown on stderr when
SM12X_LOG=debug). The chained file behaves as without the mount: an ``Exception`` is reported and
start-up goes on; a ``SystemExit`` or ``KeyboardInterrupt`` propagates and ends start-up, as
``site`` lets it; a package-form sitecustomize (``sitecustomize/__init__.py``) keeps its
``__path__`` for relative imports. Other sm12x bundles on ``sys.path`` (this one under another
spelling or through a symlink, or a second copy) are passed over when looking for the image's.
"""


def _sm12x_chain():
    # importlib.util is avoided on purpose: it pulls contextlib/functools (~3 ms per process).
    import importlib.machinery
    import os
    import sys

    guard = "_sm12x_chained_sitecustomize"  # the image's module, kept so it never runs twice
    if guard in sys.modules:
        return getattr(sys.modules[guard], "__file__", None), None
    real = os.path.realpath
    skip = {real(os.path.dirname(os.path.abspath(__file__)))}
    while True:  # the first sitecustomize on sys.path that is not an sm12x bootstrap
        rest = [p for p in sys.path if real(p or os.getcwd()) not in skip]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or not spec.origin:
            return None, None
        folder = os.path.dirname(spec.origin)
        if spec.submodule_search_locations is not None:  # a package: sitecustomize/__init__.py
            folder = os.path.dirname(folder)
        if not os.path.isfile(os.path.join(folder, "sm12x", "hooks.py")):
            break
        skip.add(real(folder))
    module = type(sys)("sitecustomize")
    module.__file__ = spec.origin
    module.__loader__ = spec.loader
    module.__spec__ = spec
    module.__package__ = ""
    if spec.submodule_search_locations is not None:
        module.__path__ = list(spec.submodule_search_locations)
        module.__package__ = "sitecustomize"
    try:
        module.__cached__ = spec.cached
    except Exception:
        pass
    sys.modules[guard] = module
    # While it runs, `sys.modules["sitecustomize"]` is the image's module, as during a plain import.
    previous = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module
    fatal = None
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # what site.execsitecustomize catches: reported, start-up goes on
        _sm12x_report(err)
    except BaseException as err:  # SystemExit, KeyboardInterrupt: site lets these end start-up
        fatal = err
    finally:
        if previous is None:
            sys.modules.pop("sitecustomize", None)
        else:
            sys.modules["sitecustomize"] = previous
    ours = globals()
    for name, value in list(vars(module).items()):
        if not name.startswith("__") and name not in ours:
            ours[name] = value
    return spec.origin, fatal


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
_sm12x_fatal = None
try:
    _sm12x_chained, _sm12x_fatal = _sm12x_chain()
except BaseException as _e:
    _sm12x_debug("chaining failed: %r" % (_e,))
if _sm12x_fatal is not None:  # the image's own file ended start-up: so does Python, as without us
    raise _sm12x_fatal
try:
    import os as _os

    if _os.environ.get("SM12X_DISABLE") != "1":
        from sm12x import hooks as _sm12x_hooks

        _sm12x_hooks.install_watcher()
        _sm12x_active = True
except BaseException as _e:
    _sm12x_debug("bootstrap failed: %r" % (_e,))

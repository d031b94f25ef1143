"""sm12x: SM12x (RTX PRO 6000 / RTX 5090 / DGX Spark) support for stock vLLM and SGLang images.

Mounted on PYTHONPATH, our ``sitecustomize`` installs a lazy import watcher (``sm12x.hooks``) that
swaps FlashMLA / DeepGEMM entry points for the Triton kernels in ``sm12x.kernels`` when those
libraries are imported on an SM12x GPU. Importing this package is cheap (stdlib only).
"""
from sm12x.version import __version__  # noqa: F401  (sm12x.__version__)


def install():
    """Install the watcher and patch what is already imported. Idempotent; never raises unless
    SM12X_STRICT=1."""
    import os

    if os.environ.get("SM12X_DISABLE") == "1":
        return
    from sm12x import hooks

    hooks.install()

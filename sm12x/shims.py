"""Stand-in modules for kernel libraries that are absent from an image.

vLLM and SGLang only take their DeepGEMM paths when ``import deep_gemm`` works. On SM12x, when no
``deep_gemm`` is installed at all, the import watcher provides one built from the DeepGEMM front
ends (``sm12x.frontends.deep_gemm``: indexer, dense GEMMs, grouped MoE GEMMs; the functions each
lists in ``NAMES`` and ``HELPER_NAMES``). A real installed module always wins: the import watcher
(``sm12x.hooks``) asks for a stand-in only after every other finder found nothing, and none is
made when vLLM's vendored ``vllm.third_party.deep_gemm`` exists. The stand-in carries what those
front ends implement, not all of DeepGEMM: a framework path that calls a DeepGEMM function outside
it gets an AttributeError naming the function, so keep such paths off (SGLang:
SGLANG_ENABLE_JIT_DEEPGEMM=0, as the SM12x recipes set). ``SM12X_SHIMS=0`` turns this off.
"""
import importlib
import os
import sys

# each stand-in is assembled from front-end modules that list what they provide in ``NAMES`` and
# ``HELPER_NAMES``; a module not present in this build is left out
SHIMS = {"deep_gemm": ("sm12x.frontends.deep_gemm.indexer", "sm12x.frontends.deep_gemm.sparse_indexer",
                       "sm12x.frontends.deep_gemm.gemm", "sm12x.frontends.deep_gemm.moe")}


class _ShimLoader:
    def __init__(self, sources):
        self.sources = sources

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        for source in self.sources:
            try:
                api = importlib.import_module(source)
            except ModuleNotFoundError as e:
                if e.name != source:
                    raise
                continue
            for name in tuple(api.NAMES) + tuple(getattr(api, "HELPER_NAMES", ())):
                setattr(module, name, getattr(api, name))
        module.__sm12x_shim__ = True
        module.__version__ = "0+sm12x.shim"


def find_shim_spec(fullname):
    """A spec for our stand-in of ``fullname``, or None (not shimmed, turned off, not SM12x)."""
    if fullname not in SHIMS or os.environ.get("SM12X_SHIMS", "1") == "0":
        return None
    if os.environ.get("SM12X_DISABLE") == "1":
        return None
    from sm12x import platform

    ok, _ = platform.wants_sm12x_patches(platform.gpu_arch())
    if not ok:
        return None
    import importlib.machinery
    import importlib.util

    # vLLM falls back to its vendored copy (patched by sm12x.patches.deep_gemm): a stand-in would
    # hide that copy's GEMMs from vLLM.
    if "vllm" in sys.modules:
        try:
            if importlib.util.find_spec("vllm.third_party.deep_gemm") is not None:
                return None
        except Exception:
            pass

    return importlib.machinery.ModuleSpec(fullname, _ShimLoader(SHIMS[fullname]))


def shim_state(name: str) -> str:
    """'active' (imported as our stand-in), 'available' (would be provided), or 'off'."""
    mod = sys.modules.get(name)
    if mod is not None:
        return "active" if getattr(mod, "__sm12x_shim__", False) else "off (real module imported)"
    if os.environ.get("SM12X_SHIMS", "1") == "0":
        return "off (SM12X_SHIMS=0)"
    import importlib.util

    from sm12x import platform

    ok, why = platform.wants_sm12x_patches(platform.gpu_arch())
    if not ok:
        return f"off ({why})"
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        spec = None
    if spec is not None and not isinstance(spec.loader, _ShimLoader):
        return "off (real module installed)"
    return "available"

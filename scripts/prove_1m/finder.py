"""The import finder: one framework release's real modules from the extracted sources, the
stand-ins for what they import, and nothing else."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import os
import sys

from prove_1m import sglang_v41_stand_ins
from prove_1m.stand_ins import StandInModule, _register_radix_topk, sglang_stand_ins, vllm_stand_ins

# Under the Triton interpreter (--device cpu) only: vLLM's candidate-block kernels assert CUDA
# tensors, and the interpreter rejects the mask ``~(valid & keep)`` builds; these edits of the
# extracted source let the same kernels run on CPU tensors (a GPU run loads the file unchanged)
INTERPRETER_EDITS = {
    "vllm.model_executor.kernels.attention.dsa.candidate_blocks": (
        ("assert logits.is_cuda", "pass"), ("~(valid & keep)", "((valid & keep) == 0)")),
}


class _EditedSource(importlib.machinery.SourceFileLoader):
    def get_data(self, path):
        data = super().get_data(path)
        if not path.endswith(".py"):
            return data
        text = data.decode()
        for old, new in INTERPRETER_EDITS[self.name]:
            text = text.replace(old, new)
        # the interpreter re-reads a kernel's source through linecache: it must see the edits
        linecache.cache[path] = (len(text), None, text.splitlines(keepends=True), path)
        return text.encode()


class FrameworkFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves one framework release: its real modules from ``src`` (the extracted files), the
    stand-ins above for the modules they import, plain packages for the folders between, and
    ModuleNotFoundError for anything else (so an unexpected import is seen, not stubbed)."""

    def __init__(self, top, src, stand_ins):
        self.top, self.src, self.stand_ins = top, src, stand_ins
        self.packages = {name.rsplit(".", i)[0] for name in stand_ins for i in range(name.count(".") + 1)}

    def _file(self, fullname):
        path = os.path.join(self.src, *fullname.split("."))
        return path + ".py" if os.path.isfile(path + ".py") else None

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] != self.top:
            return None
        package = os.path.join(self.src, *fullname.split("."), "__init__.py")
        if os.path.isfile(package):  # an extracted package (SGLang's v41_indexer): its own __init__
            return importlib.util.spec_from_file_location(fullname, package,
                                                          submodule_search_locations=[os.path.dirname(package)])
        real = self._file(fullname)
        if real:
            if fullname in INTERPRETER_EDITS and os.environ.get("TRITON_INTERPRET") == "1":
                return importlib.util.spec_from_file_location(fullname, real, loader=_EditedSource(fullname, real))
            return importlib.util.spec_from_file_location(fullname, real)
        folder = os.path.isdir(os.path.join(self.src, *fullname.split(".")))
        if fullname in self.stand_ins or fullname in self.packages or folder:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = StandInModule(spec.name)
        module.__path__ = [os.path.join(self.src, *spec.name.split("."))]
        module.__proof_finder__ = self
        return module

    def exec_module(self, module):
        for name, value in self.stand_ins.get(module.__name__, {}).items():
            setattr(module, name, value)


def install_framework(release, src):
    """Put the finder for ``release`` (extracted under ``src/<release>``) on sys.meta_path, after
    sm12x's import watcher, so the watcher applies the patch records as these modules import."""
    top = release.partition("-")[0]
    root = os.path.join(src, release)
    sys.path.insert(0, root)  # its dist-info first: the release sm12x reads is this one
    stand_ins = vllm_stand_ins(release) if top == "vllm" else sglang_v41_stand_ins.stand_ins(sglang_stand_ins(release))
    # after sm12x's watcher (which wraps what this finder loads), before the path finders: an
    # installed copy of the framework must not be the one that runs
    watchers = [i for i, f in enumerate(sys.meta_path) if getattr(f, "__sm12x_watcher__", False)]
    sys.meta_path.insert(watchers[-1] + 1 if watchers else 0, FrameworkFinder(top, root, stand_ins))
    if top == "vllm":
        _register_radix_topk()

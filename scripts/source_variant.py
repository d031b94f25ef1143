"""A kernel module's source with text edits, loaded as a separate module: how the ablation and
probe scripts time variants of a kernel against the module as it is, in one process."""
import importlib.util
import os


def edited_module(src, edits, name, tmp):
    """Module ``name`` from source text ``src`` with each (old, new) of ``edits`` applied to
    every occurrence of old (which must occur), written to directory ``tmp``."""
    for old, new in edits:
        if old not in src:
            raise SystemExit(f"{name}: a text to replace is not in the source (the kernel "
                             f"changed?): {old[:60]!r}")
        src = src.replace(old, new)
    path = os.path.join(tmp, f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

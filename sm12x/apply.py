"""The apply loop: select the patches for an imported module, apply each in its own try/except,
record the outcome.

Outcomes (``OUTCOMES[patch.name]``) are ``applied``, ``skipped`` (with the reason), ``retired``
(the installed library is at or past the record's ``fixed_in``) or ``failed`` (with the error).
A record's layers (behaviours stacked on its replacement for part of its range) get outcomes of
their own under their names: ``applied``, or ``skipped`` / ``retired`` with the reason.
Applying is idempotent: the replacement carries ``__sm12x_patch__`` (the patch name) and
``__sm12x_original__``, and a target already carrying our marker is left alone.
``SM12X_STRICT=1`` raises on any skip or failure other than a release outside the record's checked
range and those ``SM12X_SKIP`` asks for (patch names or dotted prefixes of them);
``SM12X_LOG=debug|info|warning`` sets the level of logger ``sm12x`` (one line per record on
stderr; at info one line per patched module).
"""
from __future__ import annotations

import functools
import importlib
import logging
import os
import sys

from sm12x import guard, platform
from sm12x.patches import Layer, Patch, all_patches

OUTCOMES: dict = {}  # patch name -> (state, reason)
_LOGGED: set = set()


class PatchError(RuntimeError):
    """Raised for a skipped or failed patch when SM12X_STRICT=1."""


@functools.lru_cache(maxsize=None)
def logger() -> logging.Logger:
    log = logging.getLogger("sm12x")
    level = os.environ.get("SM12X_LOG", "warning").upper()
    log.setLevel(getattr(logging, level, logging.WARNING))
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s[%(process)d] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    return log


def log_once(level: str, message: str) -> None:
    if message in _LOGGED:
        return
    _LOGGED.add(message)
    getattr(logger(), level)(message)


@functools.lru_cache(maxsize=None)
def _patches_by_module() -> dict:
    table: dict = {}
    for p in all_patches():
        table.setdefault(p.module, []).append(p)
    return table


@functools.lru_cache(maxsize=None)
def _consumer_index() -> dict:
    table: dict = {}
    for p in all_patches():
        for c in p.consumers:
            table.setdefault(consumer_module(c), []).append(p)
    return table


@functools.lru_cache(maxsize=None)
def _versions() -> dict:
    return platform.versions()


SKIP_REASON = "turned off by SM12X_SKIP"
# a release outside a record's checked range is skipped by design (another record, or none, is
# meant for it), so SM12X_STRICT does not raise for it
OUT_OF_RANGE = "outside the checked range"


def skip_items() -> list:
    """The entries of ``SM12X_SKIP``: comma-separated patch names or dotted prefixes of them (e.g.
    ``vllm.third_party.deep_gemm``)."""
    return [i.strip() for i in os.environ.get("SM12X_SKIP", "").split(",") if i.strip()]


def _names(item: str, name: str) -> bool:
    return name == item or name.startswith(item + ".")


def skipped_by_user(name: str) -> bool:
    """Whether ``SM12X_SKIP`` names patch ``name``."""
    return any(_names(i, name) for i in skip_items())


def unmatched_skips() -> list:
    """``SM12X_SKIP`` entries that name no registered patch or layer (a typo skips nothing)."""
    names = [n for p in all_patches() for n in (p.name,) + tuple(layer.name for layer in p.layers)]
    return [i for i in skip_items() if not any(_names(i, n) for n in names)]


def in_library_range(r):
    """(True, "") when the installed ``r.library`` is in ``r.versions`` (a record's or a layer's),
    else (False, reason)."""
    if r.library != "*" and r.versions not in ("", "*"):
        have = _versions().get(r.library)
        if have is None:
            return False, f"{r.library} version unknown (not installed as a distribution)"
        if not platform.in_range(have, r.versions):
            return False, f"{r.library} {have} {OUT_OF_RANGE} {r.versions}"
    return True, ""


def layer_state(layer: Layer):
    """(state, reason) of a layer whose record applies: skipped (SM12X_SKIP, outside its range),
    retired (at or past its ``fixed_in``) or applied."""
    if skipped_by_user(layer.name):
        return "skipped", SKIP_REASON
    ok, why = in_library_range(layer)
    if not ok:
        return "skipped", why
    retired = retirement(layer)
    if retired:
        return "retired", retired
    return "applied", ""


def retirement(p) -> str:
    """Why ``p`` is retired (its library's installed release is at or past ``fixed_in``, whose own
    code serves SM12x), or ""."""
    if not p.fixed_in:
        return ""
    have = _versions().get(p.library)
    if have is None or not platform.in_range(have, f">={p.fixed_in}"):
        return ""
    return f"{p.library} {have} serves this on SM12x itself (fixed in {p.fixed_in})"


ARCH_ONLY = "only for compute capability"


def exact_arch(spelling: str):
    """(True, "") when this process's GPU is exactly the compute capability ``spelling`` names (a
    record's ``arch`` such as "12.1": a gate that only GB10 answers wrongly), else (False,
    reason). ``SM12X_FORCE`` does not widen it: such a record answers a question as another arch
    would, which is only right on that arch."""
    try:
        want = platform.parse_arch(spelling)
    except platform.ArchError:
        return False, f"record arch {spelling!r} is not a compute capability sm12x knows"
    arch = platform.gpu_arch()
    if arch.source == "invalid":
        return False, arch.detail
    if arch.capability != want:
        return False, f"{ARCH_ONLY} {want[0]}.{want[1]} (GPU: {arch.label})"
    return True, ""


def eligibility(p: Patch):
    """(True, "") when arch and version allow ``p`` in this process and ``SM12X_SKIP`` does not
    name it, else (False, reason)."""
    if skipped_by_user(p.name):
        return False, SKIP_REASON
    # the release range first: a release outside it is the record's own answer, whatever the GPU
    # or the installed files say
    ok, why = in_library_range(p)
    if not ok:
        return False, why
    if p.arch == "sm12x":
        ok, why = platform.wants_sm12x_patches(platform.gpu_arch())
        if not ok:
            return False, why
    elif p.arch != "any":
        ok, why = exact_arch(p.arch)
        if not ok:
            return False, why
    return True, ""


def _resolve(module, qualname):
    """(owner, attribute name, current value) for a dotted qualname inside ``module``."""
    parts = qualname.split(".")
    owner = module
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1], getattr(owner, parts[-1])


def _load_factory(spec):
    """A patch's factory: the function itself, or ``"module:function"`` (test stand-ins)."""
    if callable(spec):
        return spec
    mod, _, fn = spec.partition(":")
    return getattr(importlib.import_module(mod), fn)


def consumer_module(entry: str) -> str:
    """The module of a ``consumers`` entry: ``"module"`` or ``"module:attribute"``."""
    return entry.partition(":")[0]


def _rebind(consumers, original, replacement, only_attr=None) -> int:
    """Replace copies of ``original`` in the consumers' modules; returns how many. An entry
    ``"module"`` takes `from X import f` copies under any name (only under ``only_attr`` when
    given: the target module binds ``original`` under several names); ``"module:attribute"`` takes
    that attribute whatever the aliases (a global the module filled from the target at run time,
    such as vLLM's ``_grouped_fp4_impl``)."""
    n = 0
    for entry in consumers:
        name, _, named = entry.partition(":")
        mod = sys.modules.get(name)
        if mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            wanted = attr == named if named else only_attr in (None, attr)
            if value is original and wanted:
                setattr(mod, attr, replacement)
                n += 1
    return n


def _copy_name(module, attr, original):
    """The name consumers' copies must have: None (any) unless the target module binds
    ``original`` under several names (vLLM's FlashMLA stubs are one function bound to every
    name), where only a copy of the same name is this target's."""
    names = [n for n, v in vars(module).items() if v is original] if module is not None else []
    return attr if len(names) > 1 else None


def _record(p, state: str, reason: str = "") -> None:
    OUTCOMES[p.name] = (state, reason)
    level = "debug" if state == "applied" else ("warning" if state == "failed" else "info")
    target = getattr(p, "target", "its record's target")
    log_once(level, f"patch {p.name} -> {target}: {state}" + (f" ({reason})" if reason else ""))
    by_design = reason == SKIP_REASON or OUT_OF_RANGE in reason
    if state not in ("applied", "retired") and not by_design and os.environ.get("SM12X_STRICT") == "1":
        raise PatchError(f"sm12x: patch {p.name} ({target}) {state}: {reason}")


def apply_patch(p: Patch, module) -> str:
    """Apply one patch to its (imported) target module; returns the new state."""
    if OUTCOMES.get(p.name, ("",))[0] == "applied":
        owner_ok = True
        try:
            _, _, current = _resolve(module, p.qualname)
            owner_ok = getattr(current, "__sm12x_patch__", None) == p.name
        except AttributeError:
            owner_ok = False
        if owner_ok:
            return "applied"
    try:
        ok, why = eligibility(p)
        if not ok:
            _record(p, "skipped", why)
            return "skipped"
        retired = retirement(p)
        if retired:
            _record(p, "retired", retired)
            return "retired"
        try:
            owner, attr, current = _resolve(module, p.qualname)
        except AttributeError:
            _record(p, "skipped", f"{p.target} not found in the installed {p.module}")
            return "skipped"
        marker = getattr(current, "__sm12x_patch__", None)
        if marker is not None:  # ours already: this patch, or a copy taken from another route
            _record(p, "applied", "already applied" if marker == p.name else f"via {marker}")
            return "applied"
        if getattr(module, "__sm12x_shim__", False):
            _record(p, "skipped", f"{p.module} is sm12x's own stand-in module")
            return "skipped"
        raw = vars(owner).get(attr, current) if isinstance(owner, type) else current
        copy_name = _copy_name(module, attr, current) if owner is module else None
        replacement = _load_factory(p.make)(current)
        layered = []
        for layer in p.layers:
            state, reason = layer_state(layer)
            if state == "applied":
                replacement = _load_factory(layer.make)(current, replacement)
            layered.append((layer, state, reason))
        # the runtime guard (sm12x.guard): the op's known-answer check before its first call serves
        # (around the record's replacement with its layers: the whole chain is what serves)
        replacement = guard.wrap(p, replacement, current)
        replacement.__sm12x_patch__ = p.name
        replacement.__sm12x_original__ = current
        replacement.__sm12x_copy_name__ = copy_name
        if isinstance(raw, staticmethod):
            setattr(owner, attr, staticmethod(replacement))
        elif isinstance(raw, classmethod):
            setattr(owner, attr, classmethod(replacement))
        else:
            setattr(owner, attr, replacement)
        _rebind(p.consumers, current, replacement, copy_name)
        _record(p, "applied")
        for layer, state, reason in layered:
            _record(layer, state, reason)
        return "applied"
    except PatchError:
        raise
    except Exception as e:
        _record(p, "failed", f"{type(e).__name__}: {e}")
        return "failed"


def on_module_executed(name: str, module) -> None:
    """Called by the watcher right after ``name`` executed (and by ``install`` for modules that
    were already imported)."""
    patches = _patches_by_module().get(name, [])
    states = [(p.name, apply_patch(p, module)) for p in patches]
    # consumers imported after the patch already see the replacement; this covers the plugin
    # route, where the consumer may have copied the original before we ran.
    for p in _consumer_index().get(name, []):
        if OUTCOMES.get(p.name, ("",))[0] == "applied" and p.module in sys.modules:
            try:
                _, _, current = _resolve(sys.modules[p.module], p.qualname)
                original = getattr(current, "__sm12x_original__", None)
                if original is not None:
                    entries = [c for c in p.consumers if consumer_module(c) == name]
                    _rebind(entries, original, current, getattr(current, "__sm12x_copy_name__", None))
            except Exception as e:
                log_once("warning", f"sm12x: rebinding {p.name} in {name} failed: {e}")
    if states:
        arch = platform.gpu_arch()
        summary = ", ".join(f"{n}={s}" for n, s in states)
        log_once("info", f"{name}: arch {arch.label} ({arch.source}): {summary}")


def plan() -> list:
    """Each patch's state in this process without importing targets: an actual outcome when it
    was already attempted, else would-apply (arch and version match, and the installed files hold
    the target and what the replacement runs on: ``platform.plan_blocker``) or skipped with the
    reason."""
    rows = []
    for p in all_patches():
        if p.name in OUTCOMES:
            state, reason = OUTCOMES[p.name]
        else:
            top = p.module.partition(".")[0]
            try:  # sm12x's own stand-in modules (sm12x.shims) are not an installed target
                present = platform.installed_spec(top) is not None
            except Exception:
                present = False
            ok, why = eligibility(p)
            retired = retirement(p) if ok and present else ""
            # the installed files: the target sub-module and attribute, torch and triton
            blocker = platform.plan_blocker(p.module, p.qualname) if ok and present and not retired else ""
            if not present:
                state, reason = "skipped", f"{top} is not installed"
            elif not ok:
                state, reason = "skipped", why
            elif retired:
                state, reason = "retired", retired
            elif blocker:
                state, reason = "skipped", blocker
            else:
                state, reason = "would-apply", ""
        rows.append(_row(p, p.target, state, reason))
        for layer in p.layers:
            if layer.name in OUTCOMES:
                layer_row = OUTCOMES[layer.name]
            elif state in ("applied", "would-apply"):
                layer_row = layer_state(layer)
                layer_row = ("would-apply", "") if layer_row[0] == "applied" else layer_row
            else:  # the record's own state and reason (``layer_of`` names the record)
                layer_row = (state, reason)
            rows.append(_row(layer, p.target, *layer_row, layer_of=p.name))
    return rows


def _row(r, target, state, reason, layer_of="") -> dict:
    """One plan row (a record, or a layer of record ``layer_of``)."""
    return {"name": r.name, "target": target, "state": state, "reason": reason, "library": r.library,
            "versions": r.versions, "fixed_in": r.fixed_in, "retire_when": r.retire_when,
            "upstream": r.upstream, "why": r.why, "layer_of": layer_of}


def op_routes(rows=None) -> dict:
    """Which upstream calls reach each op: ``{op name: [{"api", "record", "target", "state",
    "reason"}]}``, one entry per record whose factory the op manifest lists under one of the op's
    functions (a layer under its own name), in manifest order (ops no record reaches map to
    []); ``rows`` is :func:`plan`'s
    answer (computed when None). Records whose factory reaches no op (gates and backend choices)
    are left out."""
    from sm12x.kernels import manifest

    rows = {r["name"]: r for r in (plan() if rows is None else rows)}
    by_factory = manifest.op_of_wrapper()
    routes = {op.name: [] for op in manifest.OPS}
    for p in all_patches():
        for r in (p,) + tuple(p.layers):
            hit = by_factory.get(manifest.factory_path(r.make))
            if hit is None:
                continue
            row = rows.get(r.name, {})
            routes[hit[0]].append({"api": hit[1], "record": r.name, "target": p.target,
                                   "state": row.get("state", ""), "reason": row.get("reason", "")})
    return routes


def apply_installed() -> list:
    """Import every installed target module (which fires the patches) and return the plan."""
    import importlib.util

    for p in all_patches():
        if p.name in OUTCOMES:
            continue
        top = p.module.partition(".")[0]
        try:
            if top not in sys.modules and importlib.util.find_spec(top) is None:
                continue
        except Exception as e:
            _record(p, "skipped", f"importing {p.module} failed: {type(e).__name__}: {e}")
            continue
        ok, why = eligibility(p)
        if not ok:  # out of range, another GPU, SM12X_SKIP: said before importing the target
            _record(p, "skipped", why)
            continue
        try:
            module = importlib.import_module(p.module)
        except Exception as e:
            _record(p, "skipped", f"importing {p.module} failed: {type(e).__name__}: {e}")
            continue
        if p.name not in OUTCOMES:
            apply_patch(p, module)
    return plan()

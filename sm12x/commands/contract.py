"""``sm12x contract WHEEL_OR_DIR...``: check sm12x's patch records against a framework release's own
files, without importing anything from it.

A release is a wheel (read as a zip archive) or a folder (an unpacked wheel or a site-packages
folder). Its distribution name and version come from its ``*.dist-info`` (or the wheel's file
name, or a folder named ``NAME-VERSION``); :data:`sm12x.platform.DISTRIBUTIONS` maps that name to
the ``library`` key the records use. For every record of that library the check reports:

- ``in_range``: ``yes`` / ``no`` (the version is outside ``versions``) / ``retired`` (at or past
  ``fixed_in``); records of other libraries are ``not this library`` and not checked further;
- ``module``: whether the target module exists (a source file, a package, a compiled extension,
  a namespace folder);
- ``attribute``: what the target's qualified name is bound to, read with ``ast``: a function, a
  class, a method (with its decorator), a module, a value, a name imported from outside the
  release, or ``dynamic`` (a module ``__getattr__`` or a star import from outside decides);
  aliases (``f = g``), ``from X import f`` re-exports inside the release and base classes are
  followed; bindings under ``if TYPE_CHECKING:`` do not count;
- ``signature``: whether every call the original accepts reaches sm12x: the record's factory is
  given a stand-in with the original's parameters (read from the source) and the replacement it
  returns is read: a replacement with named parameters must take the original's calls as they
  come; one that takes ``*args`` hands each argument on, by name, to the sm12x function it wraps
  (front ends built on ``deep_gemm.wrappers._by_name`` rename by position and fill in the
  original's defaults). Incompatible means a call would fail: a parameter sm12x cannot take, one
  sm12x requires that the original does not pass, or a default sm12x refuses;
- ``consumers``: every module of the release that holds a ``from <target module> import <name>``
  copy at module level (directly or through a re-export), and whether the record lists it;
- ``layers``: for every behaviour stacked on the record (``Layer``) of this release's library, its
  own ``in_range``; a layer in range where its record is not (outside its range, or retired) would
  never stack, which is a bug in the records like a missing target.

Exit code 1 when a record whose range includes the release (and that is not retired) has a
missing target or an incompatible signature, or a layer of it is in range where the record is not:
that is a bug in the records. Uncovered copies are
reported, not counted: a copy taken after the patch already holds the replacement.
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import re
import sys
import types
from dataclasses import dataclass

from sm12x import platform
from sm12x.apply import consumer_module
from sm12x.commands.release_files import (Binding, ContractError, Release, Resolver, absolute_module, library_of,
                                          source_signature, statements)

# ---------------------------------------------------------------------------------------------------
# Signatures: the original's (from the source) against what the replacement reads
# ---------------------------------------------------------------------------------------------------

def stand_in(name: str, signature: inspect.Signature):
    """A plain function with ``signature`` (a real ``def``, so that ``functools.wraps`` copies no
    ``__signature__`` onto the replacement); calling it raises."""
    defaults, parts, star = {}, [], False
    P = inspect.Parameter
    for i, p in enumerate(signature.parameters.values()):
        if p.kind is P.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        text = {P.VAR_POSITIONAL: "*", P.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.default is not P.empty:
            defaults[f"_d{i}"] = p.default
            text += f"=_d{i}"
        parts.append(text)
        if p.kind is P.VAR_POSITIONAL:
            star = True
        if p.kind is P.POSITIONAL_ONLY and (i + 1 == len(signature.parameters) or list(
                signature.parameters.values())[i + 1].kind is not P.POSITIONAL_ONLY):
            parts.append("/")
    code = f"def {name}({', '.join(parts)}):\n    raise RuntimeError('sm12x contract stand-in')\n"
    namespace = dict(defaults)
    exec(compile(code, f"<stand-in {name}>", "exec"), namespace)  # noqa: S102 - names are identifiers
    return namespace[name]


_P = inspect.Parameter
_NAMED = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)


def _fmt(value) -> str:
    return repr(value)


def _explicit_problems(original: inspect.Signature, replacement: inspect.Signature, leading: int) -> list:
    """Calls the original accepts that a replacement with named parameters refuses or misreads.
    ``leading``: positional parameters the replacement receives before the call's own (``cls``)."""
    problems = []
    rparams = list(replacement.parameters.values())
    r_pos = [p for p in rparams if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)][leading:]
    r_named = {p.name: p for p in rparams[leading:] if p.kind in (_P.POSITIONAL_OR_KEYWORD, _P.KEYWORD_ONLY)}
    r_var_kw = any(p.kind is _P.VAR_KEYWORD for p in rparams)
    r_var_pos = any(p.kind is _P.VAR_POSITIONAL for p in rparams)
    oparams = [p for p in original.parameters.values() if p.kind in _NAMED]
    o_pos = [p for p in oparams if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(o_pos):
        if i >= len(r_pos):
            if not r_var_pos:
                problems.append(f"{p.name} passed by position (argument {i + 1}) is refused: the replacement "
                                f"takes {len(r_pos)} positional arguments")
        elif r_pos[i].name != p.name and p.kind is _P.POSITIONAL_OR_KEYWORD:
            problems.append(f"argument {i + 1} is {p.name} in the original, {r_pos[i].name} in the replacement")
    for p in oparams:
        if p.kind is not _P.POSITIONAL_ONLY and p.name not in r_named and not r_var_kw:
            problems.append(f"{p.name}= is refused by the replacement")
    o_by_name = {p.name: p for p in oparams}
    o_var_kw = any(p.kind is _P.VAR_KEYWORD for p in original.parameters.values())
    for r in rparams[leading:]:
        if r.kind not in _NAMED or r.default is not _P.empty:
            continue
        o = o_by_name.get(r.name)
        if o is None and o_var_kw:
            continue  # the original reads its arguments from **kwargs: callers pass it by name
        if o is None:
            problems.append(f"the replacement requires {r.name}, which the original does not take")
        elif o.default is not _P.empty:
            problems.append(f"a call that leaves {r.name} out (default {_fmt(o.default)} in the original) fails: "
                            f"the replacement requires it")
    return problems


def _handed_to(replacement, original):
    """(the sm12x function a ``*args`` replacement hands calls to or None, whether it reads them
    through ``deep_gemm.wrappers._by_name``: by the original's names, renamed by position,
    defaults filled in)."""
    cells = [c.cell_contents for c in (getattr(replacement, "__closure__", None) or ())
             if _cell_filled(c)]
    by_name = any(callable(v) and "_by_name" in getattr(v, "__qualname__", "") for v in cells)
    wrapped = getattr(replacement, "__wrapped__", None)
    if wrapped is not None and wrapped is not original:
        return wrapped, by_name
    for v in cells:
        if (callable(v) and not isinstance(v, type) and v is not original and v is not replacement
                and getattr(v, "__module__", "").startswith("sm12x.frontends")
                and "<locals>" not in getattr(v, "__qualname__", "")):
            return v, by_name
    for v in cells:
        if isinstance(v, types.ModuleType) and v.__name__.startswith("sm12x.frontends"):
            fn = getattr(v, getattr(original, "__name__", ""), None)
            if callable(fn):
                return fn, by_name
    return None, by_name


def _cell_filled(cell) -> bool:
    try:
        return cell.cell_contents is not cell  # reading an empty cell raises
    except ValueError:
        return False


def _handed_problems(original: inspect.Signature, callee, by_name: bool):
    """(problems, notes) for a replacement that reads each call by the original's parameter names
    and passes them on to ``callee`` by name."""
    problems, notes = [], []
    target = inspect.signature(callee)
    if any(p.kind is _P.VAR_POSITIONAL for p in target.parameters.values()):
        # sm12x's function reads the call itself (FlashMLA's get_mla_metadata: two API eras)
        return [], [f"sm12x's {getattr(callee, '__name__', 'function')} takes any arguments"]
    cparams = [p for p in target.parameters.values() if p.kind in _NAMED]
    c_names = {p.name for p in cparams}
    c_pos = [p.name for p in cparams if p.kind in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)]
    c_var_kw = any(p.kind is _P.VAR_KEYWORD for p in target.parameters.values())
    oparams = [p for p in original.parameters.values() if p.kind in _NAMED]
    o_names = {p.name for p in oparams}
    label = f"sm12x's {getattr(callee, '__name__', 'function')}"
    reaching = {}
    for i, p in enumerate(oparams):
        if p.name in c_names:
            reaching[p.name] = p
        elif by_name and i < len(c_pos) and p.kind is not _P.KEYWORD_ONLY and c_pos[i] not in o_names:
            reaching[c_pos[i]] = p
            notes.append(f"{p.name} read as {c_pos[i]}")
        elif c_var_kw:
            notes.append(f"{p.name} unknown to {label}: accepted only as None/False")
            if p.default is _P.empty:
                problems.append(f"{p.name} (required in the original) has no counterpart in {label}")
            elif by_name and p.default not in (None, False):
                problems.append(f"the original's default {p.name}={_fmt(p.default)} reaches {label}, which "
                                f"refuses anything but None/False")
        else:
            problems.append(f"{p.name} has no counterpart in {label}")
    for c in cparams:
        if c.default is not _P.empty:
            continue
        o = reaching.get(c.name)
        if o is None:
            problems.append(f"{label} requires {c.name}, which the original does not take")
        elif o.default is not _P.empty and not by_name:
            problems.append(f"a call that leaves {o.name} out fails: {label} requires it")
    return problems, notes


@dataclass
class SignatureVerdict:
    state: str  # compatible, incompatible, unknown, n/a
    detail: str = ""


def _runtime_missing(e: Exception):
    """The verdict when a factory could not be built because this Python lacks torch or triton
    (the front ends import them): not checked here, which is no record bug; else None."""
    if isinstance(e, ModuleNotFoundError) and (e.name or "").partition(".")[0] in ("torch", "triton"):
        return SignatureVerdict("unknown", f"not checked: the front end needs {e.name}, which is not "
                                           f"installed in this Python ({sys.executable})")
    return None


def check_signature(patch, binding: Binding) -> SignatureVerdict:
    """Whether the calls ``binding``'s original accepts reach sm12x through ``patch.make``."""
    from sm12x.apply import _load_factory

    if binding.kind == "module":
        try:
            _load_factory(patch.make)(types.ModuleType(binding.detail))
        except Exception as e:  # noqa: BLE001 - any failure of the factory is the verdict
            missing = _runtime_missing(e)
            if missing:
                return missing
            return SignatureVerdict("incompatible", f"the target is module {binding.detail}; the factory "
                                                    f"refuses it ({type(e).__name__}: {e})")
        return SignatureVerdict("n/a", f"module {binding.detail}")
    if binding.kind == "class":
        return SignatureVerdict("n/a", "a class")
    if binding.kind not in ("function", "method"):
        return SignatureVerdict("unknown", f"no Python signature to read ({binding.kind}: {binding.detail})")
    leading = 1 if binding.decorator == "classmethod" else 0
    signature = source_signature(binding.node, drop_first=bool(leading))
    if any(p.kind is _P.VAR_POSITIONAL for p in signature.parameters.values()):
        return SignatureVerdict("compatible", "the original takes *args: calls are read in sm12x's order")
    name = getattr(binding.node, "name", "original")
    original = stand_in(name, signature)
    try:
        replacement = _load_factory(patch.make)(original)
    except Exception as e:  # noqa: BLE001 - any failure of the factory is the verdict
        missing = _runtime_missing(e)
        if missing:
            return missing
        return SignatureVerdict("incompatible", f"the factory fails on the original "
                                                f"({type(e).__name__}: {e})")
    if not callable(replacement):
        return SignatureVerdict("incompatible", f"the factory returned {type(replacement).__name__}, not a function")
    own = inspect.signature(replacement, follow_wrapped=False)
    if any(p.kind in _NAMED for p in own.parameters.values()):
        problems = _explicit_problems(signature, own, leading)
        return SignatureVerdict("incompatible" if problems else "compatible", "; ".join(problems))
    callee, by_name = _handed_to(replacement, original)
    if callee is None:
        return SignatureVerdict("compatible", "the replacement passes each call on as it came")
    problems, notes = _handed_problems(signature, callee, by_name)
    return SignatureVerdict("incompatible" if problems else "compatible", "; ".join(problems or notes))


# ---------------------------------------------------------------------------------------------------
# Consumers: module-level `from <target module> import <name>` copies
# ---------------------------------------------------------------------------------------------------

def _import_index(release: Release, names) -> dict:
    """{(module, name): [(holder, local name)]} for every module-level ``from module import name``
    in the release with ``name`` in ``names`` (one pass over the sources, then ``ast`` on the
    files that mention one of the names)."""
    key = frozenset(names)
    cache = release.__dict__.setdefault("_import_indexes", {})
    if key in cache:
        return cache[key]
    index: dict = {}
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, key))) + r")\b") if key else None
    for candidate, (kind, _) in release.modules.items():
        if pattern is None or kind not in ("source", "package"):
            continue
        text = release.source(candidate)
        if not text or "import" not in text or not (pattern.search(text) or "import *" in text):
            continue
        tree = release.tree(candidate)
        for stmt in statements(tree.body if tree is not None else []):
            if isinstance(stmt, ast.ImportFrom):
                origin = absolute_module(candidate, kind == "package", stmt.level, stmt.module)
                for alias in stmt.names:
                    if alias.name in key or alias.name == "*":  # a star import copies public names
                        index.setdefault((origin, alias.name), []).append((candidate, alias.asname or alias.name))
    cache[key] = index
    return index


def _module_copies(release: Release, module: str, name: str, names) -> dict:
    """{module: local name} for every module of the release that binds a copy of ``module``'s
    ``name`` at module level with ``from X import``, X being ``module`` or a module that
    re-exports it that way (under a name in ``names``)."""
    index = _import_index(release, set(names) | {name})
    holders: dict = {}
    pending = [(module, name)]
    while pending:
        source = pending.pop()
        star = [(h, source[1]) for h, _ in index.get((source[0], "*"), ())] if not source[1].startswith("_") else []
        for holder, local in list(index.get(source, ())) + star:
            if holder != module and holder not in holders:
                holders[holder] = local
                pending.append((holder, local))
    return holders


def consumer_report(release: Release, patch, names=()) -> dict:
    """The record's listed consumers in this release (``copy``: a module-level ``from X import``
    copy; ``names it``: mentions the name otherwise, e.g. a ``getattr`` copy taken at run time;
    ``no copy``; ``absent``; ``in another distribution``), every module holding a copy, and
    those the record does not list. ``names``: every target name checked in this release (one
    pass over the sources serves them all)."""
    module, name = patch.module, patch.qualname.split(".")[0]
    holders = _module_copies(release, module, name, names) if "." not in patch.qualname else {}
    listed = []
    # an entry "module:attribute" names a global the module fills from the target at run time
    consumers = dict.fromkeys(consumer_module(entry) for entry in patch.consumers)
    for c in consumers:
        if not release.has_top(c):
            state = "in another distribution"
        elif c not in release.modules:
            state = "absent"
        elif c in holders:
            state = "copy"
        else:
            text = release.source(c) or ""
            state = "names it" if re.search(r"\b" + re.escape(name) + r"\b", text) else "no copy"
        listed.append({"module": c, "state": state})
    uncovered = sorted(m for m in holders if m not in consumers)
    return {"listed": listed, "copies": sorted(holders), "uncovered": uncovered}


# ---------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------

def _range_state(patch, release: Release) -> str:
    if patch.library != release.library:
        return "not this library"
    if release.version is None:
        return "unknown version"
    if not platform.in_range(release.version, patch.versions):
        return "no"
    if patch.fixed_in and platform.in_range(release.version, f">={patch.fixed_in}"):
        return "retired"
    return "yes"


def _module_state(release: Release, module: str) -> str:
    kind, rel = release.modules.get(module, (None, None))
    if kind == "extension" and not release.importable_extension(module):
        return f"missing ({rel} is a library loaded through torch.ops, not a Python module)"
    if kind:
        return {"source": "found", "package": "found (package)", "extension": "found (compiled extension)",
                "namespace": "found (namespace folder)"}[kind]
    parent, _, leaf = module.rpartition(".")
    if parent and release.modules.get(parent, (None,))[0]:
        return f"missing ({parent} has no {leaf})"
    return "missing"


def _layer_rows(release: Release, patch, record_state: str) -> list:
    """The range of each layer of ``patch`` that is of this release's library; ``problem`` where
    the layer is in range and its record (of the same library) is not, so it never stacks."""
    return [{"name": layer.name, "library": layer.library, "versions": layer.versions, "fixed_in": layer.fixed_in,
             "in_range": state, "problem": state == "yes" and record_state in ("no", "retired")}
            for layer in patch.layers if layer.library == release.library
            for state in (_range_state(layer, release),)]


def check_patch(release: Release, resolver: Resolver, patch, names=()) -> dict:
    row = {"name": patch.name, "target": patch.target, "library": patch.library, "versions": patch.versions,
           "fixed_in": patch.fixed_in, "in_range": _range_state(patch, release)}
    row["layers"] = _layer_rows(release, patch, row["in_range"])
    if row["in_range"] == "not this library":
        if not release.has_top(patch.module) and "." not in patch.qualname:
            # another distribution's target: modules of this release may still hold copies of it
            copies = consumer_report(release, patch, names)
            if copies["copies"]:
                row["consumers"] = copies
        return row
    row["module"] = _module_state(release, patch.module)
    bindings = resolver.resolve(patch.module, patch.qualname) if row["module"].startswith("found") else []
    if not row["module"].startswith("found"):
        row["attribute"] = "-"
    elif not bindings:
        row["attribute"] = "missing"
    else:
        row["attribute"] = "found: " + "; ".join(
            b.kind + (f" ({b.detail})" if b.detail else "") + (f" in {b.module}" if b.module != patch.module else "")
            for b in bindings)
    verdicts = [check_signature(patch, b) for b in bindings]
    bad = [v for v in verdicts if v.state == "incompatible"]
    if not verdicts:
        row["signature"], row["signature_detail"] = "-", ""
    elif bad:
        row["signature"], row["signature_detail"] = "incompatible", "; ".join(v.detail for v in bad)
    else:
        best = next((v for v in verdicts if v.state == "compatible"), verdicts[0])
        row["signature"], row["signature_detail"] = best.state, "; ".join(
            dict.fromkeys(v.detail for v in verdicts if v.detail))
    row["consumers"] = consumer_report(release, patch, names) if bindings else {
        "listed": [], "copies": [], "uncovered": []}
    missing = not row["module"].startswith("found") or row["attribute"] == "missing"
    row["problem"] = (row["in_range"] == "yes" and (missing or row["signature"] == "incompatible")
                      or any(layer["problem"] for layer in row["layers"]))
    return row


def check_release(path: str, patches=None) -> dict:
    """Every record checked against one wheel or folder (see the module docstring)."""
    return check_releases(path, patches)[0]


def check_releases(path: str, patches=None) -> list:
    """One report per distribution in ``path`` that sm12x patches (a wheel holds one; a
    site-packages folder may hold several), or one for its first distribution when none is."""
    from sm12x.patches import all_patches

    patches = all_patches() if patches is None else patches
    first = Release(path)
    if not first.identities:
        raise ContractError(f"'{path}' holds no Python distribution (no *.dist-info or *.egg-info): give a "
                            f"wheel file, or the site-packages folder vLLM, SGLang or a kernel library is "
                            f"installed in")
    ids = [i for i in first.identities if library_of(i[0])] or first.identities[:1] or [(None, None)]
    reports = []
    for identity in ids:
        release = first if identity == (first.dist, first.version) else Release(path, identity)
        reports.append(_report(release, patches))
    return reports


def _report(release: Release, patches) -> dict:
    path = release.path
    resolver = Resolver(release)
    names = {p.qualname.split(".")[0] for p in patches
             if p.library == release.library or not release.has_top(p.module)}
    rows = [check_patch(release, resolver, p, names) for p in patches]
    return {"path": path, "distribution": release.dist, "version": release.version, "library": release.library,
            "patches": rows}


def _consumer_cell(c: dict) -> str:
    if not c["copies"]:
        return "no module-level copies"
    cell = f"{len(c['copies']) - len(c['uncovered'])}/{len(c['copies'])} copies listed"
    return cell + ("; NOT listed: " + ", ".join(c["uncovered"]) if c["uncovered"] else "")


def render(report: dict, stream) -> None:
    rows = [r for r in report["patches"] if r["in_range"] != "not this library"]
    others = len(report["patches"]) - len(rows)
    lib = report["library"] or "no library sm12x patches"
    print(f"{report['path']}: {report['distribution']} {report['version']} ({lib}): {len(rows)} record(s) "
          f"of this library, {others} of others not checked", file=stream)
    for r in rows:
        mark = "PROBLEM " if r["problem"] else ""
        print(f"  {mark}{r['name']}  ->  {r['target']}", file=stream)
        print(f"      in range: {r['in_range']} ({r['versions']}"
              + (f", fixed in {r['fixed_in']}" if r["fixed_in"] else "") + ")", file=stream)
        print(f"      module: {r['module']}; attribute: {r['attribute']}", file=stream)
        sig = r["signature"] + (f" ({r['signature_detail']})" if r.get("signature_detail") else "")
        print(f"      signature: {sig}", file=stream)
        c = r["consumers"]
        listed = ", ".join(f"{x['module']} [{x['state']}]" for x in c["listed"]) or "none listed"
        print(f"      consumers: {_consumer_cell(c)}; listed: {listed}", file=stream)
        for layer in r["layers"]:
            print(f"      {'PROBLEM ' if layer['problem'] else ''}layer {layer['name']}: in range: {layer['in_range']} "
                  f"({layer['versions']}" + (f", fixed in {layer['fixed_in']}" if layer["fixed_in"] else "") + ")",
                  file=stream)
    held = [r for r in report["patches"] if r["in_range"] == "not this library" and r.get("consumers")]
    if held:
        print("  copies of other libraries' targets held by modules of this release:", file=stream)
    for r in held:
        c = r["consumers"]
        print(f"    {r['name']} ({r['library']}) -> {r['target']}: {_consumer_cell(c)}", file=stream)


def verdict(row: dict) -> str:
    """One cell for the support matrix: what the record (or a layer of it) does with this release."""
    if "target" not in row and row["in_range"] == "yes":  # a layer
        return "**record bug**: in range where its record is not" if row["problem"] else "stacks on the record"
    if row["in_range"] == "no":
        return f"skips: outside {row['versions']}"
    if row["in_range"] == "retired":
        return f"retired: fixed in {row['fixed_in']}"
    if row["in_range"] == "unknown version":
        return "version unknown"
    if not row["module"].startswith("found"):
        return f"**record bug**: module {row['module']}"
    if row["attribute"] == "missing":
        return "**record bug**: attribute missing"
    if row["signature"] == "incompatible":
        return f"**record bug**: signature incompatible ({row['signature_detail']})"
    how = {"compatible": "signature compatible", "unknown": "signature not readable (compiled or set at import)",
           "n/a": "not a function (" + row["signature_detail"] + ")"}.get(row["signature"], row["signature"])
    return f"resolves: target found, {how}"


def render_markdown(reports: list, stream) -> None:
    """The support matrix: per release, every record of its library and what it does there."""
    for report in reports:
        rows = [r for r in report["patches"] if r["in_range"] != "not this library"]
        print(f"### {report['distribution']} {report['version']}\n", file=stream)
        if not rows:
            print("No record of sm12x is for this library.\n", file=stream)
        else:
            print("| record | target | range | verdict |\n|---|---|---|---|", file=stream)
            for r in rows:
                print(f"| `{r['name']}` | `{r['target']}` | `{r['versions']}` | {verdict(r)} |", file=stream)
                for layer in r["layers"]:
                    print(f"| `{layer['name']}` (layer) | `{r['target']}` | `{layer['versions']}` | {verdict(layer)} |",
                          file=stream)
            print(file=stream)
        # a record that skips or is retired here installs nothing, so its copies do not matter
        held = [r for r in report["patches"] if r["in_range"] in ("yes", "not this library")
                and r.get("consumers") and r["consumers"]["uncovered"]]
        for r in held:
            print(f"- `from X import` copies of `{r['target']}` not in `{r['name']}`'s consumers: "
                  + ", ".join(f"`{m}`" for m in r["consumers"]["uncovered"]), file=stream)
        if held:
            print(file=stream)


def run(paths, as_json: bool = False, stream=None, patches=None, markdown: bool = False) -> int:
    """Check every path (``patches``: the records, all of sm12x's by default); the exit code."""
    stream = stream or sys.stdout
    for p in paths:
        if not os.path.exists(p):
            raise ContractError(f"'{p}' does not exist (give a wheel file or a folder of one)")
    reports = [r for p in paths for r in check_releases(p, patches)]
    if as_json:
        json.dump(reports, stream, indent=1, default=str)
        stream.write("\n")
    elif markdown:
        render_markdown(reports, stream)
    else:
        for report in reports:
            render(report, stream)
    problems = [r["name"] for rep in reports for r in rep["patches"] if r.get("problem")]
    if problems and not as_json and not markdown:
        print(f"{len(problems)} record(s) in range with a missing target or an incompatible signature, or "
              f"with a layer in range where the record is not", file=stream)
    return 1 if problems else 0


CONTRACT_HELP = """\
Check sm12x's patch records against a vLLM / SGLang / DeepGEMM / FlashMLA release without
installing or importing it: for each record of that library, whether the release is in its
range, whether the target module and function exist, whether the function's parameters still
reach sm12x, which modules hold `from X import f` copies of it (and whether the record lists
them), and the range of each layer stacked on it. Exit code 1 when a record in range has a missing
target or an incompatible signature, or a layer is in range where its record is not.

examples:
  python3 -m sm12x contract vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl
  python3 -m sm12x contract /usr/local/lib/python3.12/dist-packages   # what an image installed
  python3 -m sm12x contract --json sglang-0.5.23-*.whl > contract.json
  python3 -m sm12x contract --markdown wheels/*.whl      # the tables of docs/support-matrix.md
"""


def add_contract_command(subparsers):
    p = subparsers.add_parser("contract", help="check the patch records against a framework wheel or folder",
                              description=CONTRACT_HELP,
                              formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="WHEEL_OR_DIR", help="a wheel file, or a folder holding a release")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--json", action="store_true", help="every verdict as JSON (for scripts)")
    g.add_argument("--markdown", action="store_true", help="one table per release (docs/support-matrix.md)")
    p.set_defaults(func=lambda a: run(a.paths, as_json=a.json, markdown=a.markdown))

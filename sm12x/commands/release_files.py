"""A framework release's files, read without importing anything from it: the release (a wheel read
as a zip archive, an unpacked wheel or a site-packages folder) with its distribution and version,
its modules, what each qualified name is bound to (``ast``: functions, classes, methods, aliases,
re-exports inside the release, base classes; ``if TYPE_CHECKING:`` bindings ignored), and a
function's signature from its source. ``sm12x contract`` checks the patch records against them."""
from __future__ import annotations

import ast
import inspect
import os
import re
import zipfile
from dataclasses import dataclass, field

from sm12x import platform

_EXTENSION = re.compile(r"^(?P<stem>[A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z0-9_-]+)?\.(so|pyd)$")


class ContractError(ValueError):
    """A path the check cannot read (missing, not a wheel or folder); the message names it."""


# ---------------------------------------------------------------------------------------------------
# A release's files
# ---------------------------------------------------------------------------------------------------

def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def library_of(dist: str | None):
    """The ``DISTRIBUTIONS`` key a distribution name belongs to (None when sm12x patches none)."""
    if not dist:
        return None
    for key, names in platform.DISTRIBUTIONS.items():
        if _normal(dist) in {_normal(n) for n in names}:
            return key
    return None


def _name_version(stem: str):
    m = re.match(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>\d[^-]*)", stem)
    return (m.group("name"), m.group("version")) if m else (None, None)


class Release:
    """The Python files of one wheel or folder, indexed by module name; nothing is imported."""

    def __init__(self, path: str, identity=None):
        self.path = path
        if os.path.isdir(path):
            self.kind = "folder"
            self._zip = None
            names = []
            for root, dirs, files in os.walk(path):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                rel = os.path.relpath(root, path)
                names += [f if rel == "." else f"{rel}/{f}".replace(os.sep, "/") for f in files]
        elif os.path.isfile(path) and zipfile.is_zipfile(path):
            self.kind = "wheel"
            self._zip = zipfile.ZipFile(path)
            names = [n for n in self._zip.namelist() if not n.endswith("/")]
        else:
            raise ContractError(f"'{path}' is neither a wheel nor a folder")
        self.identities = self._identities(names)  # (distribution, version) of each *.dist-info
        self.dist, self.version = identity or (self.identities[0] if self.identities else (None, None))
        self.library = library_of(self.dist)
        self.modules = self._index(names)  # module -> (kind, relative path or None)
        self._sources: dict = {}
        self._trees: dict = {}

    def _identities(self, names) -> list:
        """Every distribution whose ``*.dist-info/METADATA`` is here (a site-packages folder has
        many), those sm12x patches first; else the wheel's or folder's ``NAME-VERSION``."""
        found = []
        for n in names:
            parts = n.split("/")
            if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
                text = self._read(n).decode("utf-8", "replace")
                name = re.search(r"^Name:\s*(\S+)", text, re.MULTILINE)
                version = re.search(r"^Version:\s*(\S+)", text, re.MULTILINE)
                if name and version:
                    found.append((name.group(1), version.group(1)))
        found.sort(key=lambda nv: library_of(nv[0]) is None)
        if not found:
            stem = _name_version(os.path.basename(os.path.normpath(self.path)))
            found = [stem] if stem[0] else []
        return found

    @staticmethod
    def _index(names) -> dict:
        modules = {}
        for n in names:
            parts = n.split("/")
            if not all(p.isidentifier() for p in parts[:-1]):
                continue  # *.dist-info, *.data, tools folders with dashes: not importable
            leaf = parts[-1]
            if leaf.endswith(".py") and leaf[:-3].isidentifier():
                if leaf == "__init__.py":
                    if parts[:-1]:
                        modules[".".join(parts[:-1])] = ("package", n)
                else:
                    modules.setdefault(".".join(parts[:-1] + [leaf[:-3]]), ("source", n))
            else:
                m = _EXTENSION.match(leaf)
                if m:
                    modules.setdefault(".".join(parts[:-1] + [m.group("stem")]), ("extension", n))
        for name in list(modules):  # folders without __init__.py: namespace packages
            parts = name.split(".")
            for i in range(1, len(parts)):
                modules.setdefault(".".join(parts[:i]), ("namespace", None))
        return modules

    def _read(self, rel: str) -> bytes:
        if self._zip is not None:
            return self._zip.read(rel)
        with open(os.path.join(self.path, rel), "rb") as fh:
            return fh.read()

    def has_top(self, module: str) -> bool:
        return module.partition(".")[0] in self.modules

    def source(self, module: str):
        """The module's source text, or None (no such module, an extension, a namespace)."""
        if module not in self._sources:
            kind, rel = self.modules.get(module, (None, None))
            self._sources[module] = (self._read(rel).decode("utf-8", "replace")
                                     if kind in ("source", "package") else None)
        return self._sources[module]

    def tree(self, module: str):
        if module not in self._trees:
            text = self.source(module)
            try:
                self._trees[module] = ast.parse(text) if text is not None else None
            except SyntaxError:
                self._trees[module] = None
        return self._trees[module]

    def importable_extension(self, module: str) -> bool:
        """Whether a compiled file is a Python extension module (it exports ``PyInit_<name>``);
        one without it is a library loaded through ``torch.ops.load_library`` (sgl-flash-mla's
        ``flash_mla/cuda.abi3.so``), which ``import`` cannot load."""
        return self.extension_names(module, "PyInit_" + module.rpartition(".")[2]) is not False

    def extension_names(self, module: str, name: str):
        """Whether a compiled extension module's string table holds ``name`` (see
        ``platform.defines_name``); a wheel's member is read from the archive."""
        kind, rel = self.modules.get(module, (None, None))
        if kind != "extension":
            return None
        if self._zip is None:
            return platform.defines_name(os.path.join(self.path, rel), name)
        return name.encode() in self._zip.read(rel)


# ---------------------------------------------------------------------------------------------------
# What a name is bound to, from the source
# ---------------------------------------------------------------------------------------------------

@dataclass
class Binding:
    kind: str  # function, class, method, module, value, compiled, external, dynamic
    module: str  # the module whose source binds it
    detail: str = ""
    node: object = field(default=None, repr=False)
    decorator: str = ""  # staticmethod / classmethod for methods


def _is_type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def statements(body):
    """Module- or class-level statements, those in if / try / with blocks included (not under
    ``if TYPE_CHECKING:``, which never runs)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from statements(stmt.body)
            yield from statements(stmt.orelse)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            yield from statements(stmt.body)
            for handler in stmt.handlers:
                yield from statements(handler.body)
            yield from statements(stmt.orelse)
            yield from statements(stmt.finalbody)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            yield from statements(stmt.body)


def absolute_module(module: str, is_package: bool, level: int, target: str | None) -> str:
    if not level:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def _decorators(node) -> list:
    out = []
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        out.append(ast.unparse(d))
    return out


def _assigned(stmt, name):
    if isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            if isinstance(target, ast.Name) and target.id == name:
                return stmt.value
            if isinstance(target, (ast.Tuple, ast.List)) and any(
                    isinstance(e, ast.Name) and e.id == name for e in target.elts):
                return ast.Constant(value=None)  # unpacked: a value, not followed
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
        return stmt.value
    return None


class Resolver:
    """Follows a ``module:qualname`` through one release's sources."""

    def __init__(self, release: Release):
        self.release = release

    def module_kind(self, module: str):
        return self.release.modules.get(module, (None, None))[0]

    def resolve(self, module: str, qualname: str, depth: int = 0) -> list:
        """Every binding the source can give ``qualname`` in ``module`` (several when branches
        bind it differently: a real import and a stub); [] when surely none."""
        first, _, rest = qualname.partition(".")
        found = self._name(module, first, depth)
        if not rest:
            return found
        out = []
        for b in found:
            if b.kind == "class":
                out += self._class_attribute(b, rest.split("."), depth)
            elif b.kind == "module" and self.module_kind(b.detail):
                out += self.resolve(b.detail, rest, depth + 1)
            elif b.kind in ("external", "dynamic", "value", "compiled"):
                out.append(Binding(b.kind, b.module, f"{b.detail} (its .{rest} cannot be read)"))
        return out

    def _name(self, module: str, name: str, depth: int) -> list:
        kind = self.module_kind(module)
        if kind is None:
            return []
        if depth > 8:
            return [Binding("dynamic", module, "import chain too long to follow")]
        if kind == "extension":
            mentions = self.release.extension_names(module, name)
            return [Binding("compiled", module, "compiled extension")] if mentions else []
        sub = f"{module}.{name}"
        if kind == "namespace":
            return [Binding("module", module, sub)] if sub in self.release.modules else []
        tree = self.release.tree(module)
        if tree is None:
            return [Binding("dynamic", module, "source does not parse")]
        is_package = kind == "package"
        out, stars, getattr_hook = [], [], False
        for stmt in statements(tree.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if stmt.name == name:
                    out.append(Binding("function", module, ", ".join(_decorators(stmt)), stmt))
                elif stmt.name == "__getattr__":
                    getattr_hook = True
            elif isinstance(stmt, ast.ClassDef) and stmt.name == name:
                out.append(Binding("class", module, "", stmt))
            elif isinstance(stmt, ast.ImportFrom):
                source = absolute_module(module, is_package, stmt.level, stmt.module)
                for alias in stmt.names:
                    if alias.name == "*":
                        stars.append(source)
                    elif (alias.asname or alias.name) == name:
                        out += self._imported(source, alias.name, depth)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    bound = alias.asname or alias.name.partition(".")[0]
                    if bound == name:
                        target = alias.name if alias.asname else bound
                        kind_of = "module" if self.module_kind(target) else "external"
                        out.append(Binding(kind_of, module, target))
            else:
                value = _assigned(stmt, name)
                if value is not None:
                    out += self._value(module, name, value, depth)
        if not out:
            for source in stars:
                out += (self._name(source, name, depth + 1) if self.module_kind(source)
                        else [Binding("dynamic", module, f"from {source} import *")])
        if not out and sub in self.release.modules:
            out.append(Binding("module", module, sub))  # a submodule is an attribute once imported
        if not out and getattr_hook:
            out.append(Binding("dynamic", module, "module __getattr__"))
        if not out and "globals()" in (self.release.source(module) or "") and re.search(
                r"[\"']" + re.escape(name) + r"[\"']", self.release.source(module)):
            out.append(Binding("dynamic", module, "set through globals() at import"))
        return out

    def _imported(self, source: str, name: str, depth: int) -> list:
        if not self.module_kind(source):
            return [Binding("external", source, f"from {source}")]
        found = self._name(source, name, depth + 1)
        if not found and f"{source}.{name}" in self.release.modules:
            found = [Binding("module", source, f"{source}.{name}")]
        return found

    def _value(self, module: str, name: str, value, depth: int) -> list:
        if isinstance(value, ast.Name) and value.id != name:
            return self._name(module, value.id, depth + 1)  # an alias: f = g
        if isinstance(value, ast.Lambda):
            return [Binding("function", module, "lambda", value)]
        return [Binding("value", module, ast.unparse(value)[:80])]

    def _class_attribute(self, cls: Binding, path: list, depth: int) -> list:
        attr = path[0]
        out = []
        for stmt in statements(cls.node.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
                decorators = _decorators(stmt)
                how = next((d for d in decorators if d in ("staticmethod", "classmethod")), "")
                out.append(Binding("method", cls.module, ", ".join(decorators), stmt, how))
            elif isinstance(stmt, ast.ClassDef) and stmt.name == attr:
                out.append(Binding("class", cls.module, "", stmt))
            else:
                value = _assigned(stmt, attr)
                if value is not None:
                    out.append(Binding("value", cls.module, ast.unparse(value)[:80]))
        if not out and depth < 8:
            for base in cls.node.bases:
                if isinstance(base, ast.Name):
                    for b in self._name(cls.module, base.id, depth + 1):
                        if b.kind == "class":
                            out += self._class_attribute(b, [attr], depth + 1)
                        elif b.kind in ("external", "dynamic"):
                            out.append(Binding("dynamic", b.module, f"may come from base {base.id} ({b.detail})"))
                elif isinstance(base, ast.Attribute):
                    out.append(Binding("dynamic", cls.module, f"may come from base {ast.unparse(base)}"))
        if out and len(path) > 1:
            return [x for b in out if b.kind == "class" for x in self._class_attribute(b, path[1:], depth + 1)]
        return out



class SourceDefault:
    """A default the source writes as an expression (not a literal): shown as written."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _default(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return SourceDefault(ast.unparse(node))


def source_signature(node, drop_first: bool = False) -> inspect.Signature:
    """The ``inspect.Signature`` of a ``def`` or ``lambda`` node (no annotations); ``drop_first``
    leaves out ``self`` / ``cls`` as a bound method would."""
    a = node.args
    params = []
    positional = list(a.posonlyargs) + list(a.args)
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    P = inspect.Parameter
    for i, (arg, d) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        params.append(P(arg.arg, kind, default=P.empty if d is None else _default(d)))
    if a.vararg:
        params.append(P(a.vararg.arg, P.VAR_POSITIONAL))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        params.append(P(arg.arg, P.KEYWORD_ONLY, default=P.empty if d is None else _default(d)))
    if a.kwarg:
        params.append(P(a.kwarg.arg, P.VAR_KEYWORD))
    if drop_first and params and params[0].kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
        params = params[1:]
    return inspect.Signature(params)

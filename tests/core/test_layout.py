"""The package's shape: no import circle anywhere in ``sm12x/`` (imports inside functions count
too), and the record tables in ``sm12x/patches`` reach front ends, never ops or commands."""
import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(REPO, "sm12x")


def _module_name(path):
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def import_graph():
    """{module: set of sm12x modules it imports}, every import statement of the file."""
    modules = {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                modules[_module_name(os.path.join(root, f))] = os.path.join(root, f)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(open(path).read(), path)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph):
    """One import circle as a list of modules, or None."""
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_circle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_circle_check_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_records_reach_front_ends_only():
    """Records name front-end factories, directly or through the op manifest (a stdlib table of
    "module:function" names, which is how a record that runs an op takes its factory); no kernel,
    no command."""
    graph = import_graph()
    for name, edges in graph.items():
        if name.startswith("sm12x.patches"):
            bad = [e for e in edges
                   if e.startswith(("sm12x.kernels", "sm12x.commands")) and e != "sm12x.kernels.manifest"]
            assert not bad, f"{name} imports {bad}: records name front-end factories only"


def test_ops_never_reach_up():
    """Ops know nothing of who calls them: ``sm12x.kernels`` imports no front end, record, command
    or apply machinery (front ends translate calls into ops, not the other way round)."""
    graph = import_graph()
    upward = ("sm12x.frontends", "sm12x.patches", "sm12x.commands", "sm12x.apply", "sm12x.hooks")
    for name, edges in graph.items():
        if name.startswith("sm12x.kernels"):
            bad = [e for e in edges if e.startswith(upward)]
            assert not bad, f"{name} imports {bad}"

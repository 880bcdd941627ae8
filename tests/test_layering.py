"""docs/design.md, "Layers": specs <- components <- flows, and no import circles, checked on the import graph."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "specs": {"torch", "ray", "prefect", "mlflow", "numpy", "components", "flows"},
    "components": {"prefect", "mlflow", "flows"},
}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports(layer):
    offenders = []
    for path in (ROOT / layer).rglob("*.py"):
        bad = set(_imports(path)) & FORBIDDEN[layer]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert not offenders, offenders


def _module_imports(path: Path):
    """Every module ``path`` imports, in full (``from a.b import c`` gives a.b and a.b.c)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_runtime_stands_below_the_builders():
    """The runtime (local and Ray backends) is handed what it builds (a Ray worker gets the builders'
    ``build_replica``); it never imports the builders or the specs, so the import graph has no loop."""
    offenders = [f"{path.relative_to(ROOT)} imports {name}"
                 for path in (ROOT / "components" / "runtime").rglob("*.py")
                 for name in _module_imports(path)
                 if name in ("components.builders", "specs") or name.startswith(("components.builders.", "specs."))]
    assert not offenders, offenders


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph():
    """Every project module's imports of other project modules, function-local imports included (a circle
    hidden inside a function is still a circle). ``from a import b`` is an edge to a (its __init__ runs)
    and to a.b when that is a module; a package's own __init__ is a node like any other."""
    paths = [p for layer in ("specs", "components", "flows") for p in (ROOT / layer).rglob("*.py")]
    modules = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from a import b`` runs a's __init__ too, whether b is a name or a submodule
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_anywhere():
    """No module reaches itself through imports: specs, components and flows form a graph without cycles."""
    assert _cycles(_import_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

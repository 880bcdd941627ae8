"""docs/design.md, "Layers": specs <- components <- flows, and no import circles, checked on the import graph."""
import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "specs": {"torch", "ray", "prefect", "mlflow", "numpy", "components", "flows", "reproduce"},
    "components": {"prefect", "mlflow", "flows", "reproduce"},
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


@functools.lru_cache(maxsize=1)
def _import_graph():
    """Every project module's imports of other project modules, function-local imports included (a circle
    hidden inside a function is still a circle). ``from a import b`` is an edge to a (its __init__ runs)
    and to a.b when that is a module; a package's own __init__ is a node like any other."""
    paths = [p for layer in ("specs", "components", "flows", "reproduce") for p in (ROOT / layer).rglob("*.py")]
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


# names that are also ordinary file and folder names (a spec file, a model argument): spelled out freely
COMMON_WORDS = {"spec.yaml", "model"}


def _tracking_names() -> dict:
    import flows.tracking_names as names

    return {value: key for key, value in vars(names).items() if key.isupper() and isinstance(value, str)}


def _spelled(path: Path, values: dict):
    """(line, name) for each string constant in ``path`` that is one of ``values``, docstrings included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values:
            yield node.lineno, values[node.value]


def test_tracking_names_are_spelled_in_one_module():
    """docs/design.md, "MLflow conventions": every tag, param and artifact name privzo writes or reads is a
    constant of flows/tracking_names.py; no other code, test or script spells one out."""
    values = {v: k for v, k in _tracking_names().items() if v not in COMMON_WORDS}
    offenders = [f"{path.relative_to(ROOT)}:{line} spells {name}"
                 for folder in ("specs", "components", "flows", "reproduce", "infra", "tests", "bench", "recipes", "docs")
                 for path in sorted((ROOT / folder).rglob("*.py"))
                 if path.name != "tracking_names.py"
                 for line, name in _spelled(path, values)]
    assert not offenders, offenders


def test_the_spelling_finder_finds_a_spelled_tag(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('tags = {"dp.epsilon": "1"}\nfrom x import DP_EPSILON\n')
    assert list(_spelled(path, _tracking_names())) == [(1, "DP_EPSILON")]


FLOWS = ("flows.private_train", "flows.sweep", "flows.audit", "reproduce.flow", "flows.simulate", "flows.cli")
ROOMS = ("flows.session", "flows.refusals", "flows.lineage", "flows.resume", "flows.window", "flows.registration",
         "flows.tracking", "flows.tracking_names", "flows.reporting", "flows.checkpoints", "flows.transcript",
         "flows.verify", "flows.verify_report")


def test_the_flows_rooms_stand_below_the_flows():
    """docs/design.md, "Layers": the rooms a flow calls never import a flow or the CLI (a room that did would
    pull the flow's imports into verify and the tests, and start a circle); tracking_names imports nothing."""
    graph = _import_graph()
    offenders = sorted(f"{room} imports {name}" for room in ROOMS for name in graph.get(room, ())
                       if name in FLOWS)
    assert not offenders, offenders
    assert set(ROOMS) <= set(graph), sorted(set(ROOMS) - set(graph))
    assert list(_module_imports(ROOT / "flows" / "tracking_names.py")) == []


def test_the_reproduction_harness_stands_beside_the_product():
    """docs/design.md, "Layers": reproduce/ (the papers' rate experiments) uses the product; of the product,
    only the CLI's `privzo reproduce` reaches it."""
    graph = _import_graph()
    offenders = sorted(f"{module} imports {name}" for module, names in graph.items()
                       if not module.startswith("reproduce") and module != "flows.cli"
                       for name in names if name.startswith("reproduce"))
    assert not offenders, offenders


# docs/design.md, "Layers": the direction engine stands below the queries, and both below the estimators, the
# optimizers and the runtime; each of these rooms may import only the rooms of components listed here
ROOMS_BELOW = {
    "components.directions": {"components.randomness"},
    "components.queries": {"components.directions", "components.randomness"},
}


def _room_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "components" and len(parts) > 1 else parts[0]


@pytest.mark.parametrize("room", sorted(ROOMS_BELOW))
def test_the_direction_engine_and_the_queries_stand_below_the_estimators(room):
    graph = _import_graph()
    members = [m for m in graph if m == room or m.startswith(room + ".")]
    assert members, f"no module in {room}"
    offenders = sorted(f"{m} imports {name}" for m in members for name in graph[m]
                       if _room_of(name) != room and _room_of(name) not in ROOMS_BELOW[room])
    assert not offenders, offenders


PRODUCT = ("components", "flows", "specs", "reproduce", "recipes", "infra", "bench", "docs")


def _private_imports(path: Path):
    """(line, module, name) of each name with one leading underscore this file imports from another module of
    the tree: a module's private names are its own."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in PRODUCT:
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    yield node.lineno, node.module, alias.name


def test_no_module_of_the_product_imports_another_modules_private_name():
    offenders = sorted(f"{path.relative_to(ROOT)}:{line} takes {module}.{name}"
                       for top in PRODUCT for path in (ROOT / top).rglob("*.py")
                       for line, module, name in _private_imports(path))
    assert not offenders, offenders


def test_the_private_name_finder_finds_one(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from components.data.table import Table, _hidden\nfrom os import _exit\n")
    assert list(_private_imports(sample)) == [(1, "components.data.table", "_hidden")]

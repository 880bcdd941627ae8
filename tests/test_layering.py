"""docs/design.md, "Layers": specs <- components <- flows, and no import circles, checked on the import graph."""
import ast
import re
import sys
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


def test_only_the_runtime_imports_ray():
    """docs/design.md, "Layers": Ray is the runtime's (components/runtime/: the actors of a training run, the
    tasks of a search); every other room asks it."""
    offenders = [str(path.relative_to(ROOT)) for layer in ("specs", "components", "flows", "reproduce")
                 for path in sorted((ROOT / layer).rglob("*.py"))
                 if "ray" in set(_imports(path)) and path.parent != ROOT / "components" / "runtime"]
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
    ``build_replica``); it never imports the builders or the specs, so the import graph has no loop (the
    refusal base, specs/refusal.py, imports only the standard library: its refusals derive from it)."""
    offenders = [f"{path.relative_to(ROOT)} imports {name}"
                 for path in (ROOT / "components" / "runtime").rglob("*.py")
                 for name in _module_imports(path)
                 if (name in ("components.builders", "specs") or name.startswith(("components.builders.", "specs.")))
                 and not name.startswith("specs.refusal")]
    assert {name.split(".")[0] for name in _module_imports(ROOT / "specs" / "refusal.py")} <= set(sys.stdlib_module_names)
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
    import flows.record.tracking_names as names

    return {value: key for key, value in vars(names).items() if key.isupper() and isinstance(value, str)}


def _spelled(path: Path, values: dict):
    """(line, name) for each string constant in ``path`` that is one of ``values``, docstrings included."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values:
            yield node.lineno, values[node.value]


# the shape of a name privzo writes or reads in MLflow: a tag, param or metric under one of these prefixes;
# what has that shape and is no such name (a file, a host) is listed here
TRACKING_NAME = re.compile(r"^(?:dp|privzo|audit|mlflow)\.[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*$")
NOT_TRACKING_NAMES = {"mlflow.db", "mlflow.attacker.example"}


def _shaped(path: Path):
    """(line, text) for each string constant in ``path`` shaped like a tracking name, and each f-string that
    starts like one (``f"dp.{kind}"``)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and TRACKING_NAME.match(node.value) \
                and node.value not in NOT_TRACKING_NAMES:
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) and \
                re.match(r"^(?:dp|privzo|audit|mlflow)\.", str(node.values[0].value)):
            yield node.lineno, node.values[0].value


def test_tracking_names_are_spelled_in_one_module():
    """docs/design.md, "MLflow conventions": every tag, param and artifact name privzo writes or reads is a
    constant of flows/record/tracking_names.py; no other code, test or script spells one out, whether the module holds
    it already or not (a new name shaped like one, ``dp.``/``privzo.``/``audit.``/``mlflow.``, fails here)."""
    values = {v: k for v, k in _tracking_names().items() if v not in COMMON_WORDS}
    offenders = []
    for folder in ("specs", "components", "flows", "reproduce", "infra", "tests", "bench", "recipes", "docs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "tracking_names.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line} spells {name}" for line, name in _spelled(path, values)]
            offenders += [f"{path.relative_to(ROOT)}:{line} spells {text!r}" for line, text in _shaped(path)
                          if text not in values]
    assert not offenders, offenders


def test_mlflows_own_names_are_mlflows():
    """The names of MLflow's own that flows/record/tracking_names.py spells (it imports nothing) are MLflow's."""
    from mlflow.utils import mlflow_tags

    import flows.record.tracking_names as names

    assert names.MLFLOW_RUN_NOTE == mlflow_tags.MLFLOW_RUN_NOTE
    assert names.MLFLOW_PARENT_RUN_ID == mlflow_tags.MLFLOW_PARENT_RUN_ID
    assert names.MLFLOW_SOURCE_NAME == mlflow_tags.MLFLOW_SOURCE_NAME
    assert names.MLFLOW_SOURCE_TYPE == mlflow_tags.MLFLOW_SOURCE_TYPE
    assert names.MLFLOW_GIT_COMMIT == mlflow_tags.MLFLOW_GIT_COMMIT
    assert names.MLFLOW_GIT_REPO_URL == mlflow_tags.MLFLOW_GIT_REPO_URL
    assert names.MLFLOW_DATASET_CONTEXT == mlflow_tags.MLFLOW_DATASET_CONTEXT


def test_the_spelling_finder_finds_a_spelled_tag(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('tags = {"dp.epsilon": "1"}\nfrom x import DP_EPSILON\nnew = {"privzo.new.tag": 1, f"dp.{x}": 2}\n')
    assert list(_spelled(path, _tracking_names())) == [(1, "DP_EPSILON")]
    assert [line for line, _ in sorted(_shaped(path))] == [1, 3, 3]  # the tag, and the two new names


# docs/design.md, "Layers": the rooms, lowest first; a module may import its own room and those below it. The
# ledger, the MLflow record (verify with it) and the CLI stand in rooms of their own inside flows/; what is left
# of flows/ is the flows and their tasks; reproduce/ uses the flows, and only the CLI reaches it
LEVELS = ("specs", "components", "flows.ledger", "flows.record", "flows", "reproduce", "flows.cli")


def _level(module: str) -> int:
    for room in ("flows.ledger", "flows.record", "flows.cli"):
        if module == room or module.startswith(room + "."):
            return LEVELS.index(room)
    return LEVELS.index(module.split(".")[0])


def _arrows_up(graph) -> list:
    """Each import of a module from a room above the importer's."""
    return sorted(f"{module} imports {name}" for module, names in graph.items() for name in names
                  if _level(name) > _level(module))


def test_the_rooms_import_down_only():
    graph = _import_graph()
    for room in LEVELS:
        assert any(_level(m) == LEVELS.index(room) for m in graph), f"no module in {room}"
    assert _arrows_up(graph) == []
    assert list(_module_imports(ROOT / "flows" / "record" / "tracking_names.py")) == []  # names only


@pytest.mark.parametrize("planted", [("flows.ledger.core", "flows.record.tracking"),
                                     ("flows.record.verify", "flows.private_train"),
                                     ("flows.private_train", "flows.cli.common"),
                                     ("components.builders", "flows.ledger"), ("flows.tune", "reproduce.flow")])
def test_an_import_planted_against_the_order_is_found(planted):
    module, name = planted
    graph = {m: set(names) for m, names in _import_graph().items()}
    assert module in graph and name in graph, planted
    graph[module].add(name)
    assert _arrows_up(graph) == [f"{module} imports {name}"]


def test_the_reproduction_harness_stands_beside_the_product():
    """docs/design.md, "Layers": reproduce/ (the papers' rate experiments) uses the product; of the product,
    only the CLI's `privzo reproduce` reaches it."""
    graph = _import_graph()
    offenders = sorted(f"{module} imports {name}" for module, names in graph.items()
                       if not module.startswith(("reproduce", "flows.cli"))
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


def _flows_of(path: Path) -> set:
    """The names of the Prefect flows a module defines (functions decorated ``@flow(...)``)."""
    return {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
            and any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "flow" for d in node.decorator_list)}


def test_a_flow_takes_only_flows_from_another_flow():
    """docs/design.md, "Where new code goes": the steps two flows share are tasks in a module of shared tasks
    (flows/tasks.py), never taken from another flow's module; a flow may call another flow (simulate plays
    private_train's nights)."""
    modules = {f"flows.{p.stem}": p for p in (ROOT / "flows").glob("*.py")}
    modules.update({f"reproduce.{p.stem}": p for p in (ROOT / "reproduce").glob("*.py")})
    flows = {name: _flows_of(path) for name, path in modules.items() if _flows_of(path)}
    assert {"flows.private_train", "flows.tune", "flows.sweep", "flows.audit"} <= set(flows), sorted(flows)
    offenders = sorted(f"{name} takes {node.module}.{alias.name}" for name in flows
                       for node in ast.walk(ast.parse(modules[name].read_text()))
                       if isinstance(node, ast.ImportFrom) and node.module in flows and node.module != name
                       for alias in node.names if alias.name not in flows[node.module])
    assert not offenders, offenders


# docs/design.md, "Layers": a run's steps are handed its budget (flows.ledger.Budget); only an entry point opens
# a ledger by its URL: a run's (Budget.for_spending), a command's, verify's and a consumer's loader, the nights of
# a simulation, and a killed run's checkpoint folder naming another ledger than the run's for its reservation
LEDGER_OPENERS = {"flows.ledger.core", "flows.ledger.budget", "flows.record.verify", "flows.record.promotion",
                  "flows.simulate", "flows.resume"}


def _ledger_opens(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Attribute) and f.attr == "open" and getattr(f.value, "id", None) == "PrivacyLedger") \
                    or getattr(f, "id", None) in ("PrivacyLedger", "ledger_for_spending"):
                yield node.lineno


def test_only_the_entry_points_open_the_ledger_by_url():
    opened = {_module_name(p): list(_ledger_opens(p)) for p in (ROOT / "flows").rglob("*.py")}
    offenders = sorted(f"{m}:{lines}" for m, lines in opened.items() if lines and m not in LEDGER_OPENERS
                       and not m.startswith("flows.cli"))
    assert not offenders, offenders
    assert sum(len(lines) for lines in opened.values()) <= 12, opened  # the entry points' opens, counted


ROOM_LINES = 700


def test_no_module_of_the_product_is_over_700_lines():
    """A room with one job: a module of specs/, components/ or flows/ past 700 lines holds several and is split
    where they part (docs/design.md, "Where new code goes")."""
    big = {str(p.relative_to(ROOT)): n for folder in ("specs", "components", "flows")
           for p in sorted((ROOT / folder).rglob("*.py")) if (n := len(p.read_text().splitlines())) > ROOM_LINES}
    assert big == {}, big

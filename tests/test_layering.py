"""DESIGN §1 dependency direction: specs <- components <- flows, checked on the import graph."""
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

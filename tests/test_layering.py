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

"""The PAZO comparison's specs (specs/pazo, docs/results_pazo.md): each validates, and each task's specs
differ only in what the comparison varies (estimator, clip, step), so their rows compare methods."""
from pathlib import Path

import pytest

import specs

PAZO = Path(__file__).resolve().parents[2] / "specs" / "pazo"
TASKS = sorted({p.name.split("_")[0] for p in PAZO.glob("*.yaml")})


@pytest.mark.parametrize("task", TASKS)
def test_a_tasks_specs_share_data_model_privacy_and_sampling(task):
    loaded = [specs.load_spec(p) for p in sorted(PAZO.glob(f"{task}_*.yaml"))]
    kinds = {s.estimator.kind for s in loaded}
    assert {"two_point", "pazo_m", "pazo_p", "pazo_s", "first_order", "gep", "dope_sgd", "pda_dpmd"} <= kinds
    first = loaded[0]
    for s in loaded[1:]:
        for field in ("data", "model", "privacy", "sampling", "seed"):
            assert getattr(s, field) == getattr(first, field), (s.name, field)
        assert s.optimizer.epochs == first.optimizer.epochs and s.optimizer.steps == first.optimizer.steps, s.name
        uses_public = s.estimator.kind.startswith("pazo") or getattr(s.estimator, "public_warm_start", None)
        assert s.data.split.has_public or not uses_public

"""The sweep flow: a parent MLflow run, one child per cell, a table and a plot."""
import copy

import mlflow
import pytest
import yaml

from flows.record.tracking_names import DP_EPSILON

pytestmark = pytest.mark.e2e


def test_sweep_logs_children_table_and_plot(prefect_server, tiny_spec_dict, tmp_path, mlflow_db):
    from flows.sweep import sweep

    paths = []
    for kind, extra in (("two_point", {"queries": 1}), ("pazo_m", {"public_batch_size": 8})):
        spec = copy.deepcopy(tiny_spec_dict)
        spec["name"] = f"tiny-{kind}"
        spec["estimator"] = {"kind": kind, **extra}
        spec["optimizer"]["steps"] = 15
        path = tmp_path / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(spec))
        paths.append(str(path))
    uri = mlflow_db
    out = tmp_path / "docs" / "results.md"
    result = sweep(spec_paths=paths, epsilons=[0.5, 2.0], seeds=[0, 1], tracking_uri=uri, output=str(out))
    assert len(result["cells"]) == 2 * 2 * 2
    assert all(c["spent_epsilon"] <= c["epsilon"] + 1e-9 for c in result["cells"])
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("privzo-sweep")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{result['parent_run_id']}'")
    assert len(children) == 8
    assert all(float(r.data.tags[DP_EPSILON]) <= float(r.data.params["privacy.epsilon"]) for r in children)
    table = out.read_text()
    assert "| tiny-two_point |" in table and "ε = 0.5" in table and "±" in table and "| s / run |" in table
    # every cell's wall time: in the CSV, in MLflow, and in the table as the mean per spec
    rows = out.with_suffix(".csv").read_text().splitlines()
    seconds = rows[0].split(",").index("seconds")
    assert all(float(r.split(",")[seconds]) > 0 for r in rows[1:])
    # each child's evaluation before any private step, logged at step 0 and shown beside the final one
    assert "| spec | at step 0 | ε = 0.5 | ε = 2 | s / run |" in table
    at_start = rows[0].split(",").index("accuracy_at_step0")
    for child in children:
        logged = {m.step: m.value for m in client.get_metric_history(child.info.run_id, "eval/accuracy")}
        assert sorted(logged) == [0, 15]
        row = next(r.split(",") for r in rows[1:] if r.split(",")[:4] == [
            child.data.params["name"], child.data.params["estimator.kind"], child.data.params["privacy.epsilon"],
            child.data.params["seed"]])
        assert float(row[at_start]) == pytest.approx(logged[0], abs=1e-6)
    assert all(r.data.metrics["time/seconds"] > 0 for r in children)
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    names = {a.path for a in client.list_artifacts(result["parent_run_id"])}
    assert {"results.md", "results.csv", "plots"} <= names

"""privacy.insecure_deterministic: the epsilon it names is nominal, and every output says so (docs/design.md, "Privacy invariants",
invariant 2): validate, calibrate, the run's epsilon metric, and the sweep's child runs, table, CSV and plot."""
import copy
import math

import mlflow
import pytest
import yaml

import specs
from flows.cli import main
from flows.record.registration import NOMINAL_EPSILON_METRIC, epsilon_metric
from flows.sweep import results_csv, results_table, run_cell, utility_plot
from tests.flows.recording_client import RecordingClient
from flows.record.tracking_names import DP_PRIVATE


def _insecure(tiny):
    tiny = copy.deepcopy(tiny)
    tiny["privacy"]["insecure_deterministic"] = True
    tiny["data"].setdefault("declared_private_rows", 1384)
    return tiny


def _write(tmp_path, data):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_validate_and_calibrate_say_not_private(tmp_path, tiny_spec_dict, capsys):
    path = _write(tmp_path, _insecure(tiny_spec_dict))
    assert main(["validate", path]) == 0
    line = capsys.readouterr().out.strip()
    assert "NOT private (privacy.insecure_deterministic" in line and "nominal target epsilon 2.0" in line
    assert main(["calibrate", path]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("privacy:") and "NOT private" in lines[0]
    shown = {line.split(":", 1)[0]: line for line in lines}
    assert all(shown[key].endswith("NOT private: nominal only") for key in ("epsilon", "delta"))
    # a private spec says nothing of the kind
    tiny_spec_dict["data"].setdefault("declared_private_rows", 1384)
    assert main(["validate", _write(tmp_path, tiny_spec_dict)]) == 0
    assert "NOT private" not in capsys.readouterr().out


def test_only_a_private_runs_epsilon_is_logged_as_privacy_epsilon(tiny_spec_dict):
    tiny_spec_dict["data"].setdefault("declared_private_rows", 1384)
    assert epsilon_metric(specs.spec_from_dict(tiny_spec_dict)) == "privacy/epsilon"
    assert epsilon_metric(specs.spec_from_dict(_insecure(tiny_spec_dict))) == NOMINAL_EPSILON_METRIC
    none = copy.deepcopy(tiny_spec_dict)
    del none["privacy"]
    none["mechanism"] = {"kind": "none"}
    assert epsilon_metric(specs.spec_from_dict(none)) is None


def test_a_sweep_cell_is_logged_and_marked_not_private(tiny_spec_dict, monkeypatch):
    import flows.sweep

    tiny = _insecure(tiny_spec_dict)
    tiny["optimizer"]["steps"] = 3
    tiny["mechanism"]["noise_multiplier"] = 4.0  # checked against the target, not calibrated: faster
    client = RecordingClient()
    monkeypatch.setattr(flows.sweep.mlflow, "MlflowClient", lambda: client)
    cell = run_cell.fn(specs.spec_from_dict(tiny), "parent", "0")  # the task's body, without Prefect
    assert cell["private"] is False
    assert "privacy/epsilon" not in client.metrics and client.metrics[NOMINAL_EPSILON_METRIC] > 0
    assert client.tags[DP_PRIVATE] == "false"

    private = dict(cell, name="tiny-private", private=True)
    cells = [cell, private]
    table = results_table(cells, [2.0])
    assert f"| {cell['name']} (NOT private) |" in table and "| tiny-private |" in table
    assert "NOT private: no (ε, δ) guarantee holds" in table
    csv = results_csv(cells).splitlines()
    assert csv[0].endswith(",private") and csv[1].endswith(",false") and csv[2].endswith(",true")
    assert utility_plot(cells, [2.0])[:4] == b"\x89PNG"


def test_a_mechanism_none_cell_has_its_own_column_and_is_marked():
    cells = [{"name": "mezo", "estimator": "two_point", "epsilon": math.inf, "seed": s, "accuracy": 0.9,
              "spent_epsilon": math.inf, "private": False} for s in (0, 1)]
    table = results_table(cells, [1.0])
    assert "| spec | ε = 1 | no DP |" in table and "| mezo (NOT private) | – | 90.0 ± 0.0 |" in table
    assert "| mezo (NOT private) | – | 90.0 |" in results_table(cells[:1], [1.0])  # one seed: no spread claimed
    assert utility_plot(cells, [1.0])[:4] == b"\x89PNG"


@pytest.mark.e2e
def test_an_insecure_runs_epsilon_metric_says_it_is_not_a_guarantee(prefect_server, tiny_spec_dict, tmp_path,
                                                                    mlflow_db, monkeypatch):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    tiny = _insecure(tiny_spec_dict)
    tiny["tracking"] = {"uri": mlflow_db, "log_every": 2}
    tiny["optimizer"]["steps"] = 4
    result = private_train(spec=tiny)
    run = mlflow.MlflowClient(tiny["tracking"]["uri"]).get_run(result["run_id"])
    assert "privacy/epsilon" not in run.data.metrics and "privacy/epsilon" not in result
    assert run.data.metrics[NOMINAL_EPSILON_METRIC] > 0
    assert run.data.tags[DP_PRIVATE] == "false"

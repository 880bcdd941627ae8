"""What a sweep shows and leaves behind, without Prefect or a tracking server: each cell's evaluation at
step 0 (logged to its child run and read back from the run's history) beside the final one, and the table
and CSV rewritten atomically after every finished cell, so a sweep stopped at a deadline leaves its cells."""
import logging
import math
from types import SimpleNamespace

import pytest
import yaml

import flows.sweep
import specs
from flows.sweep import results_csv, results_table, run_cell, write_atomically
from tests.flows.recording_client import RecordingClient


def _cell(name, epsilon, seed, accuracy, at_start):
    return {"name": name, "estimator": "two_point", "epsilon": epsilon, "seed": seed, "accuracy": accuracy,
            "metrics": ["accuracy"], "step0": {"accuracy": at_start}, "spent_epsilon": epsilon, "seconds": 2.0,
            "private": True}


def test_a_cell_logs_its_evaluation_at_step_0_and_reports_what_the_run_logged(tiny_spec_dict, monkeypatch):
    tiny_spec_dict["optimizer"]["steps"] = 3
    tiny_spec_dict["mechanism"]["noise_multiplier"] = 4.0  # checked against the target, not calibrated: faster
    spec = specs.spec_from_dict(tiny_spec_dict)
    client = RecordingClient()
    monkeypatch.setattr(flows.sweep.mlflow, "MlflowClient", lambda: client)
    cell = run_cell.fn(spec, "parent", "0")  # the task's body, without Prefect
    history = {m.step: m.value for m in client.history["eval/accuracy"]}
    assert sorted(history) == [0, 3] and client.status == "FINISHED"
    assert cell["step0"] == {"accuracy": history[0]} and cell["accuracy"] == history[3]
    assert {m.step for m in client.history["eval/loss"]} == {0, 3}
    assert [m.step for m in client.history["time/seconds"]] == [3]

    class Logged(RecordingClient):  # the history is what the table shows: never a second evaluation
        def get_metric_history(self, run_id, key):
            return [SimpleNamespace(step=0, value=0.125)] if key == "eval/accuracy" else []

    monkeypatch.setattr(flows.sweep.mlflow, "MlflowClient", Logged)
    assert run_cell.fn(spec, "parent", "0")["step0"] == {"accuracy": 0.125}


def test_a_cell_that_fails_marks_its_child_run_failed(tiny_spec_dict, monkeypatch):
    client = RecordingClient()
    monkeypatch.setattr(flows.sweep.mlflow, "MlflowClient", lambda: client)
    monkeypatch.setattr(flows.sweep, "evaluation", lambda built, data: (_ for _ in ()).throw(RuntimeError("lost")))
    tiny_spec_dict["mechanism"]["noise_multiplier"] = 4.0
    with pytest.raises(RuntimeError, match="lost"):
        run_cell.fn(specs.spec_from_dict(tiny_spec_dict), "parent", "0")
    assert client.status == "FAILED"


def test_the_table_shows_step_0_beside_the_final_scores():
    """One value per seed at step 0 (the same model at every epsilon), mean ± std over seeds; the CSV has a
    column for it. Cells made before step 0 was logged keep the table as it was."""
    cells = [_cell("dpzero", e, s, 0.5 + e / 10 + s / 100, 0.25 + s / 10) for e in (1.0, 4.0) for s in (0, 1)]
    cells += [_cell("zero-shot", 1.0, 0, 0.3, 0.3)]
    assert results_table(cells, [1.0, 4.0]) == (
        "| spec | at step 0 | ε = 1 | ε = 4 | s / run |\n|---|---|---|---|---|\n"
        "| dpzero | 30.0 ± 7.1 | 60.5 ± 0.7 | 90.5 ± 0.7 | 2 |\n"
        "| zero-shot | 30.0 | 30.0 | – | 2 |\n")
    csv = results_csv(cells).splitlines()
    assert csv[0] == "name,estimator,epsilon,seed,accuracy,accuracy_at_step0,spent_epsilon,seconds,private"
    assert csv[2] == "dpzero,two_point,1.0,1,0.610000,0.350000,1,2.0,true"
    before = [{k: v for k, v in c.items() if k != "step0"} for c in cells]
    assert results_table(before, [1.0, 4.0]).startswith("| spec | ε = 1 | ε = 4 | s / run |\n")
    assert results_csv(before).splitlines()[0] == "name,estimator,epsilon,seed,accuracy,spent_epsilon,seconds,private"


def test_a_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "out" / "table.md"
    write_atomically(path, "first\n")
    write_atomically(path, "second\n")
    assert path.read_text() == "second\n"

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(flows.sweep.os, "replace", crash)
    with pytest.raises(OSError):
        write_atomically(path, "third\n")
    assert path.read_text() == "second\n" and [p.name for p in path.parent.iterdir()] == ["table.md"]


class _Parent(RecordingClient):
    def create_run(self, experiment_id, run_name=None, tags=None):
        return SimpleNamespace(info=SimpleNamespace(run_id="parent"))


def _fake_sweep(monkeypatch, tmp_path, stop_at=None):
    """The sweep flow's body with MLflow in memory and cells that train nothing; each cell checks what the
    outputs held when it started; the cell ``stop_at`` is stopped (the deadline's kill)."""
    parent = _Parent()
    monkeypatch.setattr(flows.sweep.mlflow, "set_tracking_uri", lambda uri: None)
    monkeypatch.setattr(flows.sweep.mlflow, "set_experiment", lambda name: SimpleNamespace(experiment_id="0"))
    monkeypatch.setattr(flows.sweep.mlflow, "MlflowClient", lambda: parent)
    monkeypatch.setattr(flows.sweep, "get_run_logger", lambda: logging.getLogger("sweep-test"))
    out = tmp_path / "results" / "lm.md"
    seen = []

    def cell(spec, parent_run_id, experiment_id):
        done = len(seen)
        rows = out.with_suffix(".csv").read_text().splitlines()
        assert len(rows) == 1 + done and f"Partial: {done} of 4 cells finished" in out.read_text()
        assert not out.with_suffix(".png").exists()  # an earlier sweep's plot never stands beside these cells
        if done == stop_at:
            raise KeyboardInterrupt
        seen.append(_cell(spec.name, spec.privacy.epsilon, spec.seed, 0.5 + spec.seed / 10, 0.25))
        return seen[-1]

    monkeypatch.setattr(flows.sweep, "run_cell", cell)
    return out, seen, parent


def test_a_stopped_sweep_leaves_the_cells_it_finished(tiny_spec_dict, tmp_path, monkeypatch):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict))
    out, seen, parent = _fake_sweep(monkeypatch, tmp_path, stop_at=3)
    out.parent.mkdir()
    out.write_text("an earlier sweep's table\n")
    out.with_suffix(".png").write_bytes(b"an earlier plot")
    with pytest.raises(KeyboardInterrupt):
        flows.sweep.sweep.fn(spec_paths=[str(spec)], epsilons=[1.0, 4.0], seeds=[0, 1], output=str(out))
    assert parent.status == "FAILED"
    assert out.read_text() == results_table(seen, [1.0, 4.0], pending=1)
    table = out.read_text()
    assert "| tiny-digits | 25.0 ± 0.0 | 55.0 ± 7.1 | 50.0 | 2 |" in table and "Partial: 3 of 4 cells finished" in table
    assert out.with_suffix(".csv").read_text() == results_csv(seen) and len(seen) == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["lm.csv", "lm.md"]  # no temporary file left


def test_a_finished_sweep_writes_the_final_table_and_the_plot(tiny_spec_dict, tmp_path, monkeypatch):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict))
    out, seen, parent = _fake_sweep(monkeypatch, tmp_path)
    result = flows.sweep.sweep.fn(spec_paths=[str(spec)], epsilons=[1.0, 4.0], seeds=[0, 1], output=str(out))
    assert parent.status == "FINISHED" and len(seen) == 4 and not math.isinf(seen[0]["epsilon"])
    assert out.read_text() == result["table"] == results_table(seen, [1.0, 4.0]) and "Partial" not in result["table"]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in out.parent.iterdir()) == ["lm.csv", "lm.md", "lm.png"]

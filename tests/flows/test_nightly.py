"""End to end as a user runs it: the local stack up, the main job and two `prefect deployment run`s of the
nightly retrain, the MLflow runs and ledger rows they leave, and what the MLflow and Prefect UIs show of them in
a browser. Its own module: the stack lives for this module's tests only, and another stack started from the same
checkout meanwhile would take over its pid files."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from flows.record.tracking_names import DP_EPSILON

# one stack per checkout (.privzo-stack): with tests/flows/test_deployment.py, run in turn by one worker
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("local-stack")]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _ui_check():
    # infra/ is scripts, not an installed package
    spec = importlib.util.spec_from_file_location("privzo_ui_check", ROOT / "infra" / "ui_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    """As a user runs it, once for this module's tests: the local stack up, `privzo run` of the main job and
    two `prefect deployment run`s of the nightly retrain (one epoch each), charged to a ledger and tracked
    in an MLflow store of the stack's (infra/ui_check.py, which `make ui-check` runs at full length)."""
    if not (BIN / "prefect").exists():
        pytest.skip("prefect CLI not next to this interpreter")
    ui_check = _ui_check()
    if ui_check._stack_running():
        pytest.skip(f"a local stack is running from {ui_check.STATE} (make down first)")
    with ui_check.stack_with_jobs(tmp_path_factory.mktemp("nightly"), quick=True) as (env, _):
        yield ui_check, env


def test_prefect_deployment_runs_train_log_and_charge_the_ledger(nightly, monkeypatch):
    ui_check, env = nightly
    # the stack runs with its authentication on: read as the user its exports name (viewer)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", env["MLFLOW_TRACKING_USERNAME"])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", env["MLFLOW_TRACKING_PASSWORD"])
    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("digits-retrain").experiment_id])
    assert len(runs) == ui_check.RETRAINS
    assert all(r.info.status == "FINISHED" and float(r.data.tags[DP_EPSILON]) <= 2.0 for r in runs)
    from flows.ledger import PrivacyLedger

    charges = PrivacyLedger(env["PRIVZO_LEDGER_URL"]).history("sklearn-digits")
    assert [c.status for c in charges] == ["committed"] * ui_check.RETRAINS
    assert {c.run_id for c in charges} == {r.info.run_id for r in runs}
    schedules = subprocess.run([str(BIN / "prefect"), "deployment", "inspect",
                                "private-train/digits-retrain-nightly"], env=env, capture_output=True, text=True)
    assert "0 2 * * *" in schedules.stdout


def test_the_uis_show_the_runs_models_guarantees_and_flow_runs(nightly, tmp_path):
    """In headless Chromium: the experiment's training runs, the run page, its charts, version 2 (the model's
    composed epsilon before the run's own), the model, Prefect's deployment, flow run and artifact."""
    ui_check, env = nightly
    problem = ui_check.browser_problem()
    if problem:
        pytest.skip(problem)
    ui_check.check_pages(ui_check.read_facts(env), tmp_path / "shots")

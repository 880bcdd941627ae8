"""End to end as a user runs it: local stack up, `prefect deployment run`, MLflow run and ledger row."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prefect_deployment_run_trains_logs_and_charges_the_ledger(tmp_path):
    bin_dir = Path(sys.executable).parent
    if not (bin_dir / "prefect").exists():
        pytest.skip("prefect CLI not next to this interpreter")
    env = dict(os.environ, PRIVZO_PREFECT_PORT=str(_free_port()), PRIVZO_MLFLOW_PORT=str(_free_port()),
               PREFECT_HOME=str(tmp_path / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    stack = ROOT / "infra" / "local-stack.sh"
    spec = yaml.safe_load((ROOT / "specs" / "examples" / "digits_retrain.yaml").read_text())
    spec["optimizer"]["epochs"] = 1
    spec["tracking"]["uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec["budget"]["ledger"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    spec_path = tmp_path / "retrain.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    up = subprocess.run(["bash", str(stack), "up"], env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        env["PREFECT_API_URL"] = f"http://127.0.0.1:{env['PRIVZO_PREFECT_PORT']}/api"
        run = subprocess.run(
            [str(bin_dir / "prefect"), "deployment", "run", "private-train/digits-retrain-nightly",
             "--param", f"spec_path={spec_path}", "--watch", "--watch-timeout", "300"],
            env=env, capture_output=True, text=True, timeout=400, cwd=ROOT)
        assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
        client = mlflow.MlflowClient(spec["tracking"]["uri"])
        (finished,) = client.search_runs([client.get_experiment_by_name("digits-retrain").experiment_id])
        assert finished.info.status == "FINISHED" and float(finished.data.tags["dp.epsilon"]) <= 2.0
        from flows.ledger import PrivacyLedger

        (charge,) = PrivacyLedger(spec["budget"]["ledger"]).history("sklearn-digits")
        assert charge.status == "committed" and charge.run_id == finished.info.run_id
        schedules = subprocess.run([str(bin_dir / "prefect"), "deployment", "inspect",
                                    "private-train/digits-retrain-nightly"], env=env, capture_output=True, text=True)
        assert "0 2 * * *" in schedules.stdout
    finally:
        subprocess.run(["bash", str(stack), "down"], env=env, capture_output=True, timeout=120, cwd=ROOT)
        shutil.rmtree(ROOT / ".privzo-stack", ignore_errors=True)

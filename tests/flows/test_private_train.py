"""End to end: the Prefect flow trains, and MLflow holds the run as docs/design.md, "MLflow conventions" describes."""
import copy
import json
import os
import re
from pathlib import Path

import dp_accounting
import mlflow
import pytest
import yaml
from dp_accounting import rdp

from flows.record.tracking_names import (
    MLFLOW_EXPERIMENT_KIND, MLFLOW_RUN_NOTE,
    DATA_FINGERPRINT, DERIVED_N_PRIVATE, DERIVED_SAMPLING_RATE, DP_ACCOUNTANT, DP_DELTA, DP_EPSILON,
    DP_EVENT_ARTIFACT, DP_GUARANTEE, DP_MODEL_EPSILON, DP_MODEL_RUNS, DP_NEIGHBORING, DP_NOISE_SOURCE, DP_PRIVATE,
    DP_RUN_EPSILON, DP_RUN_GUARANTEE, DP_STEPS, DP_ZCDP_RHO, JOURNAL_ARTIFACT, PRIVACY_REPORT_ARTIFACT,
    PRIVZO_DIRECTIONS_STREAM, PRIVZO_DIRECTIONS_VERSION, PRIVZO_ESTIMATOR, PRIVZO_INIT, SPEC_ARTIFACT)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def _one_finished_run(prefect_server, mlflow_schema, tmp_path_factory):
    """The tiny spec's run, once for the four tests that only read it (each ran it again before)."""
    from flows.private_train import private_train
    from tests.conftest import TINY, copy_mlflow_store

    tmp_path = tmp_path_factory.mktemp("finished-run")
    spec = copy.deepcopy(TINY)
    spec["tracking"]["uri"] = copy_mlflow_store(mlflow_schema, tmp_path / "mlflow.db")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return private_train(spec=spec), spec["tracking"]["uri"], tmp_path
    finally:
        os.chdir(cwd)


@pytest.fixture
def finished_run(_one_finished_run, tiny_spec_dict, monkeypatch):
    result, uri, tmp_path = _one_finished_run
    monkeypatch.chdir(tmp_path)
    tiny_spec_dict["tracking"]["uri"] = uri  # the spec of that run, as each test reads it
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    return result, client, client.get_run(result["run_id"]), tmp_path


def test_run_is_logged_with_dp_tags_params_and_metrics(finished_run, tiny_spec_dict):
    result, client, run, _ = finished_run
    tags, params = run.data.tags, run.data.params
    assert float(tags[DP_EPSILON]) <= tiny_spec_dict["privacy"]["epsilon"]
    assert tags[DP_ACCOUNTANT] == "rdp" and tags[DP_NEIGHBORING] == "add_remove"
    assert tags[DP_GUARANTEE].endswith("-DP for add/remove of one example of digits.")
    assert tags[DP_PRIVATE] == "true"
    import specs
    from components import builders
    from flows.record.tracking import released_fingerprint

    private_fingerprint = builders.load_data(specs.spec_from_dict(tiny_spec_dict)).private.fingerprint
    assert tags[DATA_FINGERPRINT] == released_fingerprint(private_fingerprint) != private_fingerprint
    from components.directions import GENERATOR_VERSION
    assert tags[PRIVZO_DIRECTIONS_VERSION] == str(GENERATOR_VERSION)  # what its journal replays with
    assert tags[PRIVZO_DIRECTIONS_STREAM] == f"cpu-torch-v{GENERATOR_VERSION}"
    assert params["estimator.queries"] == "2" and params["optimizer.steps"] == "60"
    assert params["privacy.delta"] != "auto" and params["mechanism.noise_multiplier"] != "auto"
    eps_curve = client.get_metric_history(run.info.run_id, "privacy/epsilon")
    assert [m.step for m in eps_curve] == [20, 40, 60]
    assert all(a.value < b.value for a, b in zip(eps_curve, eps_curve[1:]))
    for key in ("eval/accuracy", "eval/loss", "public/loss"):  # step 0: the model before any private step
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, key)) == [0, 20, 40, 60]
    assert not any(k.startswith(("train/", "private/")) for k in run.data.metrics)  # no private training loss


def test_the_run_names_its_code_and_its_data_in_mlflows_own_fields(finished_run):
    """The UI's Source (mlflow.source.*: privzo, at the commit its checkout's HEAD names) and Datasets (one
    training input: where the rows are read from, their schema, the digest the run already releases; no row,
    no count)."""
    import json
    import subprocess

    from flows.record.tracking import ROOT_OF_PRIVZO
    from flows.record.tracking_names import MLFLOW_DATASET_CONTEXT, MLFLOW_GIT_COMMIT, MLFLOW_SOURCE_NAME

    _, _, run, _ = finished_run
    tags = run.data.tags
    assert tags[MLFLOW_SOURCE_NAME] == "privzo (flows/private_train.py)"
    head = subprocess.run(["git", "-C", str(ROOT_OF_PRIVZO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's fresh clone is one); an installed copy names no commit
        assert tags[MLFLOW_GIT_COMMIT] == head.stdout.strip()
    (entry,) = run.inputs.dataset_inputs
    assert {t.key: t.value for t in entry.tags} == {MLFLOW_DATASET_CONTEXT: "training"}
    dataset = entry.dataset
    assert dataset.name == "sklearn:digits" and dataset.digest == tags[DATA_FINGERPRINT][:16]
    assert json.loads(dataset.source) == {"tags": {"kind": "sklearn", "name": "digits"}}
    schema = json.loads(dataset.schema)["mlflow_colspec"]
    assert [c["name"] for c in schema] == ["features", "label"]
    assert dataset.profile in (None, "", "{}")  # no count of rows, private or not


def test_reported_epsilon_equals_independent_dp_accounting(finished_run):
    result, _, run, _ = finished_run
    params = run.data.params
    rate = float(params[DERIVED_SAMPLING_RATE])
    sigma = float(params["mechanism.noise_multiplier"])
    steps = int(params["optimizer.steps"])
    delta = float(params["privacy.delta"])
    assert rate == 64 / int(params["data.declared_private_rows"])  # never the private count (add/remove)
    assert DERIVED_N_PRIVATE not in params
    independent = rdp.RdpAccountant().compose(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps).get_epsilon(delta)
    assert result["epsilon"] == pytest.approx(independent, rel=1e-9)
    # the curve's points are shown values: rounded up at 6 significant digits, never below the spend
    assert independent <= run.data.metrics["privacy/epsilon"] <= independent * (1 + 1e-5)
    assert independent <= result["target_epsilon"]


def test_artifacts_exist_and_describe_the_run(finished_run):
    result, client, run, tmp = finished_run
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {SPEC_ARTIFACT, DP_EVENT_ARTIFACT, PRIVACY_REPORT_ARTIFACT, "journal"} <= names
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp / "dl")))
    spec = yaml.safe_load((local / "spec.yaml").read_text())
    assert spec["privacy"]["delta"] == pytest.approx(float(run.data.params["privacy.delta"]))
    event = json.loads((local / DP_EVENT_ARTIFACT).read_text())
    assert event["type"] == "SelfComposedDpEvent" and event["count"] == 60
    assert event["event"]["type"] == "PoissonSampledDpEvent"
    report = (local / PRIVACY_REPORT_ARTIFACT).read_text()
    assert "-DP for add/remove of one example of digits" in report
    journal = json.loads((local / "journal" / "journal.json").read_text())
    assert len(journal) == 60 * 2 and {"step", "seed", "coefficient"} <= set(journal[0])


def test_model_is_registered_with_dp_tags(finished_run, tiny_spec_dict):
    result, client, run, _ = finished_run
    version = client.get_model_version(tiny_spec_dict["name"], result["model_version"])
    assert version.run_id == run.info.run_id
    assert version.tags[DP_EPSILON] == run.data.tags[DP_EPSILON]
    assert DP_GUARANTEE in version.tags
    import torch

    model = mlflow.pytorch.load_model(f"models:/{tiny_spec_dict['name']}/{result['model_version']}")
    assert model(torch.zeros(5, 64)).shape == (5, 10)  # any batch size, not the example's


@pytest.mark.parametrize("trainable", ["example", "lora"])
def test_transformer_example_runs_and_registers_a_model_that_reads_token_ids(prefect_server, tmp_path, mlflow_db,
                                                                             monkeypatch, trainable):
    """The MiniLM example, cut to 2 steps in this process: the registered model takes [b, 2, length] ids;
    with LoRA adapters too (the registered model carries them)."""
    import torch

    from flows.private_train import private_train
    from tests.conftest import EXAMPLES

    monkeypatch.chdir(tmp_path)
    spec = yaml.safe_load((EXAMPLES / "chatterbot_minilm_dpzero.yaml").read_text())
    spec["optimizer"]["steps"] = 2
    if trainable == "lora":
        spec["model"].update(trainable="lora", lora={"rank": 2})
    spec["execution"] = {"backend": "local"}
    spec["tracking"] = {"uri": mlflow_db, "log_every": 2}
    result = private_train(spec=spec)
    assert result["steps"] == 2 and 0.0 <= result["eval/accuracy"] <= 1.0
    model = mlflow.pytorch.load_model(f"models:/{spec['name']}/{result['model_version']}")
    ids = torch.zeros(3, 2, 32, dtype=torch.long)
    ids[:, :, 0] = torch.tensor([101, 1])  # [CLS], unmasked
    assert model(ids).shape == (3, 21)
    if trainable == "lora":
        assert any(".lora_B." in n for n, _ in model.named_parameters())


def test_insecure_deterministic_run_is_labelled_not_private(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                            monkeypatch):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["privacy"]["insecure_deterministic"] = True
    tiny_spec_dict["optimizer"]["steps"] = 20
    result = private_train(spec=tiny_spec_dict)
    run = mlflow.MlflowClient(tiny_spec_dict["tracking"]["uri"]).get_run(result["run_id"])
    assert run.data.tags[DP_PRIVATE] == "false"
    assert run.data.tags[DP_GUARANTEE].startswith("NOT private")


def _fail_queries(monkeypatch, from_call: int, until_call: float):
    """LocalBackend.query raises on calls from_call..until_call (a lost worker)."""
    from components.runtime.local import LocalBackend

    original = LocalBackend.query
    calls = {"n": 0}

    def failing_query(self, query, indices, clip):
        calls["n"] += 1
        if from_call <= calls["n"] <= until_call:
            raise RuntimeError("worker lost")
        return original(self, query, indices, clip)

    monkeypatch.setattr(LocalBackend, "query", failing_query)


def test_a_crash_mid_training_records_the_steps_it_spent(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                         monkeypatch):
    """Retries exhausted: the run is marked FAILED and its dp tags and dp_event.json account for every
    step executed, including those of the attempt that was rolled back to the checkpoint."""
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    uri = mlflow_db
    tiny_spec_dict["tracking"]["uri"] = uri
    _fail_queries(monkeypatch, 31, float("inf"))  # step 30 fails, and every retry from step 20 too
    with pytest.raises(RuntimeError, match="worker lost"):
        private_train(spec=tiny_spec_dict)
    client = mlflow.MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(tiny_spec_dict["name"]).experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags[DP_STEPS] == "30"  # 20 checkpointed + 10 discarded by the failed attempt
    local = Path(client.download_artifacts(run.info.run_id, DP_EVENT_ARTIFACT, str(tmp_path / "dl")))
    assert json.loads(local.read_text())["count"] == 30
    assert float(run.data.tags[DP_EPSILON]) < tiny_spec_dict["privacy"]["epsilon"]


def test_a_failed_chunk_is_retried_from_its_checkpoint(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                       monkeypatch):
    """One lost worker: the chunk restarts from the step-20 checkpoint and the run finishes. The 10
    discarded steps stay charged and come out of the trajectory: 60 private steps in all, as planned and
    calibrated, so the run's epsilon is the planned one, not more."""
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    planned = private_train(spec={**tiny_spec_dict, "tracking": {"uri": f"sqlite:///{tmp_path / 'ref.db'}",
                                                                  "log_every": 20}})
    _fail_queries(monkeypatch, 31, 31)
    result = private_train(spec=tiny_spec_dict)
    assert result["steps"] == planned["steps"] == 60  # 50 on the trajectory + 10 discarded
    assert result["epsilon"] == planned["epsilon"] <= tiny_spec_dict["privacy"]["epsilon"]
    client = mlflow.MlflowClient(result["tracking_uri"])
    local = Path(client.download_artifacts(result["run_id"], JOURNAL_ARTIFACT, str(tmp_path / "dl")))
    steps = sorted({e["step"] for e in json.loads(local.read_text())})
    assert steps == list(range(50))
    run = client.get_run(result["run_id"])
    assert run.data.tags[DP_STEPS] == "60" and run.info.status == "FINISHED"
    assert max(m.step for m in client.get_metric_history(result["run_id"], "eval/accuracy")) == 50
    assert not (tmp_path / ".privzo" / "checkpoints" / "tiny-digits" / result["run_key"]).exists()


def test_mezo_run_is_labelled_not_private(prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    uri = mlflow_db
    tiny_spec_dict["tracking"]["uri"] = uri
    tiny_spec_dict["mechanism"] = {"kind": "none"}
    del tiny_spec_dict["privacy"]
    tiny_spec_dict["optimizer"]["steps"] = 20
    result = private_train(spec=tiny_spec_dict)
    run = mlflow.MlflowClient(uri).get_run(result["run_id"])
    assert run.data.tags[DP_PRIVATE] == "false" and run.data.tags[DP_EPSILON] == "inf"
    assert run.data.tags[DP_GUARANTEE].startswith("NOT private: mechanism none")
    assert "privacy/epsilon" not in run.data.metrics
    assert result["epsilon"] == float("inf")


def test_pazo_run_with_public_warm_start(prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    uri = mlflow_db
    tiny_spec_dict["tracking"]["uri"] = uri
    tiny_spec_dict["estimator"] = {"kind": "pazo_s", "public_batches": 3, "public_batch_size": 8,
                                   "public_warm_start": {"epochs": 2, "lr": 0.1, "batch_size": 8}}
    tiny_spec_dict["optimizer"]["steps"] = 20
    result = private_train(spec=tiny_spec_dict)
    client = mlflow.MlflowClient(uri)
    run = client.get_run(result["run_id"])
    assert run.data.tags[PRIVZO_ESTIMATOR] == "pazo_s"
    assert float(run.data.tags[DP_EPSILON]) <= 2.0
    assert client.get_metric_history(result["run_id"], "public/warm_start_steps")[0].value > 0


def test_run_on_ray_workers(prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    """execution.backend: ray runs the forward passes on local Ray actors and stops them at the end."""
    import ray

    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    uri = mlflow_db
    tiny_spec_dict["tracking"]["uri"] = uri
    tiny_spec_dict["execution"] = {"backend": "ray", "workers": 2}
    tiny_spec_dict["optimizer"]["steps"] = 20
    from components.runtime.ray_backend import RayBackend

    closed = []
    original_close = RayBackend.close
    monkeypatch.setattr(RayBackend, "close", lambda self: (closed.append(len(self.workers)), original_close(self)))
    try:
        result = private_train(spec=tiny_spec_dict)
        run = mlflow.MlflowClient(uri).get_run(result["run_id"])
        assert run.data.params["execution.backend"] == "ray"
        assert float(run.data.tags[DP_EPSILON]) <= 2.0 and run.data.tags[DP_STEPS] == "20"
        assert closed == [2]  # the two workers holding private rows are stopped with the run
    finally:
        ray.shutdown()


def test_budget_is_reserved_committed_and_enforced(prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    """Runs on one dataset compose in the ledger; the run that would overspend is refused before training,
    in one line: the flow run ends Failed with it as its message, and no traceback is logged."""
    import subprocess
    import sys

    from flows.ledger import BudgetExceeded, PrivacyLedger, RowsExposed
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["optimizer"]["steps"] = 20
    tiny_spec_dict["privacy"]["epsilon"] = 1.0
    tiny_spec_dict["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 1.2, "ledger": ledger_url}
    first = private_train(spec=tiny_spec_dict)
    assert first["budget_left"] == pytest.approx(1.2 - first["epsilon"], rel=1e-9)  # one run: its own epsilon
    from prefect.artifacts import Artifact

    from flows.record.reporting import shown

    artifact = Artifact.get("privacy-report-tiny-digits").data  # what the Prefect UI shows of the run
    assert f"MLflow run: {first['run_id']} in {mlflow_db}" in artifact and "Registered model: tiny-digits version 1" in artifact
    assert f"accuracy {first['eval/accuracy']:.4f}" in artifact and f"**Model guarantee:** {first['guarantee']}" in artifact
    assert "## Budget of dataset digits-patients" in artifact and f"| {first['run_id']} | {shown(first['epsilon'])} | 20/20 | committed |" in artifact
    assert "**total (exact composition)**" in artifact and "**a next run like the last fits up to**" in artifact
    with pytest.raises(BudgetExceeded, match="cannot take this run of epsilon .*; a run of epsilon <= .* still fits"):
        private_train(spec=tiny_spec_dict)
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)  # the run's logs reach the server in batches
    with get_client(sync_client=True) as prefect:
        (refused,) = prefect.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
        logs = [log.message for log in prefect.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[refused.id])))]
    assert refused.state.type.value == "FAILED"
    assert refused.state.message.startswith("budget.lifetime_epsilon: dataset 'digits-patients' cannot take this run")
    assert any("cannot take this run" in m for m in logs) and not any("Traceback" in m for m in logs), logs
    reseeded = {**tiny_spec_dict, "seed": tiny_spec_dict["seed"] + 1,
                "privacy": {**tiny_spec_dict["privacy"], "epsilon": 0.01}}  # fits the budget, moves the split
    with pytest.raises(RowsExposed, match="were private in earlier runs on dataset 'digits-patients'"):
        private_train(spec=reseeded)
    ledger = PrivacyLedger(ledger_url)
    history = ledger.history("digits-patients")
    assert [c.status for c in history] == ["committed"] and history[0].steps_run == 20
    assert history[0].run_id == first["run_id"]
    out = subprocess.run([sys.executable, "-m", "flows.cli", "budget", "show", "digits-patients", "--ledger", ledger_url],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and f"digits-patients: epsilon {shown(first['epsilon'])} spent of the lifetime 1.2 (the " \
        "largest over its 1 block;" in out.stdout
    assert "a next run shaped like the last one (its steps and sampling, more noise) fits up to epsilon " in out.stdout
    import contextlib
    import io

    from flows import cli

    with contextlib.redirect_stderr(io.StringIO()) as printed:  # a misspelt name is an error, not "nothing spent"
        assert cli.main(["budget", "show", "nobody", "--ledger", ledger_url]) == 2
    assert printed.getvalue().startswith("privzo: error: DATASET: no dataset 'nobody' in ")
    assert "(known: digits-patients); a dataset is in the ledger its runs name" in printed.getvalue()


def test_retraining_starts_from_the_latest_registered_version(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                              monkeypatch):
    """optimizer.init: latest_registered. No version yet: the seed initialisation. A MeZO (not private)
    version: a private run refuses it before reserving or writing anything. A DP version: the next run
    starts from it, so replaying the new run's journal from that version gives the new model."""
    import copy

    import torch

    import specs
    from components import builders
    from components.optimizers.sgd import replay
    from components.runtime.loop import JournalEntry
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    uri = mlflow_db
    tiny_spec_dict["tracking"]["uri"] = uri
    tiny_spec_dict["optimizer"]["steps"] = 20
    retrain = copy.deepcopy(tiny_spec_dict)
    retrain["optimizer"]["init"] = "latest_registered"
    client = mlflow.MlflowClient(uri)

    first = private_train(spec=retrain)  # nothing registered yet
    assert client.get_run(first["run_id"]).data.tags[PRIVZO_INIT] == "seed (no registered version yet)"

    mezo = copy.deepcopy(tiny_spec_dict)
    mezo["mechanism"] = {"kind": "none"}
    del mezo["privacy"]
    assert private_train(spec=mezo)["model_version"] == "2"
    runs_before = len(client.search_runs([first["experiment_id"]]))
    with pytest.raises(ValueError, match="version 2 is not differentially private"):
        private_train(spec=retrain)
    assert len(client.search_runs([first["experiment_id"]])) == runs_before  # refused before any MLflow run

    assert private_train(spec=tiny_spec_dict)["model_version"] == "3"
    second = private_train(spec=retrain)
    assert second["model_version"] == "4"
    assert client.get_run(second["run_id"]).data.tags[PRIVZO_INIT] == "models:/tiny-digits/3"
    start = mlflow.pytorch.load_model("models:/tiny-digits/3")
    end = mlflow.pytorch.load_model("models:/tiny-digits/4")
    journal_file = client.download_artifacts(second["run_id"], JOURNAL_ARTIFACT, str(tmp_path / "dl"))
    journal = [JournalEntry(e["step"], e["seed"], e["coefficient"]) for e in json.loads(Path(journal_file).read_text())]
    spec = specs.spec_from_dict(retrain)
    params = [p for p in start.parameters()]
    replay(builders.build_directions(spec, params), journal, spec.optimizer.lr)
    for a, b in zip(params, end.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

    # the model's guarantee composes every run back to the seed: version 3's, then version 4's, then this
    from components.accountants import event_from_json

    def event_of(run_id):
        return event_from_json(Path(client.download_artifacts(run_id, DP_EVENT_ARTIFACT, str(tmp_path / run_id))).read_text())

    chained = private_train(spec=retrain)  # version 5, started from version 4
    tags = client.get_run(chained["run_id"]).data.tags
    v3_run = client.get_model_version("tiny-digits", "3").run_id
    composed = dp_accounting.ComposedDpEvent([event_of(v3_run), event_of(second["run_id"]), event_of(chained["run_id"])])
    accountant = dp_accounting.rdp.RdpAccountant()
    expected = accountant.compose(composed).get_epsilon(float(tags[DP_DELTA]))
    assert float(tags[DP_MODEL_EPSILON]) == pytest.approx(expected, rel=1e-5)
    assert float(tags[DP_MODEL_EPSILON]) > float(tags[DP_EPSILON]) + 0.5  # three runs, not this one alone
    assert client.get_model_version("tiny-digits", "5").tags[DP_MODEL_EPSILON] == tags[DP_MODEL_EPSILON]
    assert client.get_run(second["run_id"]).data.tags[DP_MODEL_EPSILON] != client.get_run(second["run_id"]).data.tags[DP_EPSILON]
    assert client.get_run(v3_run).data.tags[DP_MODEL_EPSILON] == client.get_run(v3_run).data.tags[DP_EPSILON]
    report = Path(client.download_artifacts(chained["run_id"], PRIVACY_REPORT_ARTIFACT, str(tmp_path / "r"))).read_text()
    assert f"epsilon {tags[DP_MODEL_EPSILON]} at this run's delta" in report
    # what a user sees first of version 5 is the model's guarantee, the run's own spend beside it, named so
    from flows.record.reporting import shown

    version = client.get_model_version("tiny-digits", "5")
    assert version.tags[DP_EPSILON] == tags[DP_MODEL_EPSILON] and version.tags[DP_RUN_EPSILON] == tags[DP_EPSILON]
    assert version.tags[DP_RUN_GUARANTEE] == tags[DP_GUARANTEE] and tags[DP_MODEL_RUNS] == "3"
    headline = f"(" + shown(float(tags[DP_MODEL_EPSILON])) + ", "
    assert version.tags[DP_GUARANTEE].startswith(headline) and "composed over the 3 runs" in version.tags[DP_GUARANTEE]
    assert version.description.startswith(f"**Model guarantee:** {headline}")
    assert f"**Run {chained['run_id']} spent:** {tags[DP_GUARANTEE]}" in version.description
    assert "Latest: version 5.** **Model guarantee:** " + headline in client.get_registered_model("tiny-digits").description
    assert tags[MLFLOW_RUN_NOTE].startswith(f"**Model guarantee:** {headline}")
    assert report.index("**Model guarantee.** " + headline) < report.index("**This run's spend.** " + tags[DP_GUARANTEE])
    first_run = client.get_run(first["run_id"])  # a seed-initialised model's guarantee is its run's
    assert first_run.data.tags[MLFLOW_RUN_NOTE].startswith("**Guarantee:** " + first_run.data.tags[DP_GUARANTEE])
    assert first_run.info.run_name.endswith(" tiny-digits") and first_run.info.run_name != chained["run_name"]
    assert client.get_experiment(first["experiment_id"]).tags[MLFLOW_EXPERIMENT_KIND] == "custom_model_development"

    # with a budget, the version a run continues must itself be charged to the ledger, or the total misses it
    from flows.ledger import PrivacyLedger

    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    budgeted = copy.deepcopy(retrain)
    budgeted["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 10.0, "ledger": ledger_url}
    with pytest.raises(ValueError, match="version 5 was trained by a run not charged to dataset 'digits-patients'"):
        private_train(spec=budgeted)
    assert PrivacyLedger(ledger_url).history("digits-patients") == []  # refused before reserving
    from_seed = copy.deepcopy(budgeted)
    from_seed["optimizer"]["init"] = "seed"
    assert private_train(spec=from_seed)["model_version"] == "6"
    third = private_train(spec=budgeted)  # version 6 is charged: allowed
    assert client.get_run(third["run_id"]).data.tags[PRIVZO_INIT] == "models:/tiny-digits/6"
    assert [c.status for c in PrivacyLedger(ledger_url).history("digits-patients")] == ["committed"] * 2


def test_retraining_as_rows_arrive_keeps_every_private_row_private(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                                  monkeypatch):
    """The user's file grows between scheduled runs. With the hashed split both runs are charged to the
    dataset and each row keeps its part; the permutation split moves rows into public/test and is refused."""
    import copy

    import numpy as np
    from sqlalchemy import text

    import specs
    from components import builders
    from flows.ledger import PrivacyLedger, RowsExposed
    from flows.private_train import private_train
    from flows.record.tracking import keyed_rows
    from tests.conftest import write_digits_file

    monkeypatch.chdir(tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    order = np.random.default_rng(0).permutation(1797)
    path = write_digits_file(tmp_path / "clinic.csv", rows=order[:1200])
    tiny_spec_dict["data"] = {
        "declared_private_rows": 1000,
        "source": {"kind": "file", "path": str(path), "label": "digit", "classes": list(range(10))},
        "split": {"kind": "hashed", "public": 0.04, "test": 0.2, "imbalance": [1.0, 0.85]}}
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["optimizer"]["steps"] = 20
    tiny_spec_dict["privacy"]["epsilon"] = 1.0
    tiny_spec_dict["budget"] = {"dataset": "clinic", "lifetime_epsilon": 5.0, "ledger": ledger_url}

    def private_rows():
        return set(builders.load_data(specs.spec_from_dict(tiny_spec_dict)).private.fingerprints)

    before = private_rows()
    first = private_train(spec=tiny_spec_dict)
    write_digits_file(path, rows=order)  # 597 new rows arrive
    after = private_rows()
    assert before < after
    second = private_train(spec=tiny_spec_dict)
    ledger = PrivacyLedger(ledger_url)
    history = ledger.history("clinic")
    assert [c.status for c in history] == ["committed", "committed"]
    assert [c.run_id for c in history] == [first["run_id"], second["run_id"]]
    assert history[0].fingerprint != history[1].fingerprint  # each charge names the rows it ran on
    with ledger.engine.connect() as conn:
        recorded = set(conn.execute(text("SELECT row FROM privzo_private_rows WHERE dataset = 'clinic'")).scalars())
    # keyed, never the rows' plain hashes (with those, knowing a person's features reveals membership and label)
    assert recorded == set(keyed_rows(sorted(after))) and not recorded & after

    permuted = copy.deepcopy(tiny_spec_dict)
    permuted["data"]["split"]["kind"] = "fraction"
    permuted["budget"]["dataset"] = "clinic-permuted"
    # a ledger of its own: in this one, the same people under a second name are refused (laundering)
    permuted["budget"]["ledger"] = f"sqlite:///{tmp_path / 'ledger-permuted.db'}"
    write_digits_file(path, rows=order[:1200])
    private_train(spec=permuted)
    write_digits_file(path, rows=order)
    with pytest.raises(RowsExposed, match="needs data.split.kind hashed, column or source from its first run"):
        private_train(spec=permuted)
    assert [c.status for c in PrivacyLedger(permuted["budget"]["ledger"]).history("clinic-permuted")] == ["committed"]


def test_an_image_folder_that_grows_and_is_renamed_keeps_its_ledger(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                                      monkeypatch):
    """Images are known by their decoded pixels: new images arriving and every file renamed between
    scheduled runs keep the earlier runs' private images matched; another size cannot be matched."""
    from sqlalchemy import text

    import specs
    from components import builders
    from flows.ledger import PrivacyLedger, RowsUnmatched
    from flows.private_train import private_train
    from tests.components.test_images import NAMES, write_digits_images

    monkeypatch.chdir(tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    folder = tmp_path / "scans"
    write_digits_images(folder, n=900)
    tiny_spec_dict["data"] = {"declared_private_rows": 1000, "source": {"kind": "images", "path": str(folder), "classes": NAMES, "size": 8},
                              "split": {"kind": "hashed", "public": 0.04, "test": 0.2}}
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["optimizer"]["steps"] = 10
    tiny_spec_dict["privacy"]["epsilon"] = 1.0
    tiny_spec_dict["budget"] = {"dataset": "scans", "lifetime_epsilon": 5.0, "ledger": ledger_url}
    first = private_train(spec=tiny_spec_dict)

    write_digits_images(folder)  # the other 897 images arrive ...
    for file in sorted(folder.rglob("*.png")):  # ... and every file is renamed
        file.rename(file.with_name(f"scan-{file.name}"))
    after = builders.load_data(specs.spec_from_dict(tiny_spec_dict)).private
    second = private_train(spec=tiny_spec_dict)
    ledger = PrivacyLedger(ledger_url)
    assert [c.run_id for c in ledger.history("scans")] == [first["run_id"], second["run_id"]]
    with ledger.engine.connect() as conn:
        recorded = conn.execute(text("SELECT count(*) FROM privzo_private_rows WHERE dataset = 'scans'")).scalar()
    assert recorded == len(after.fingerprints)  # the renamed images were matched, not counted twice

    tiny_spec_dict["data"]["source"]["size"] = 16
    with pytest.raises(RowsUnmatched):
        private_train(spec=tiny_spec_dict)
    assert len(ledger.history("scans")) == 2


def test_fixed_size_batches_under_replace_one_are_reported_and_composed_in_the_ledger(
        prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    """sampling.kind fixed_size end to end: the run's event is sampling without replacement, its report
    and guarantee say replace-one, and two runs on one dataset compose exactly in the ledger."""
    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["sampling"] = {"kind": "fixed_size", "batch_size": 40}
    tiny_spec_dict["privacy"].update(neighboring="replace_one", epsilon=1.0)
    tiny_spec_dict["optimizer"]["steps"] = 20
    tiny_spec_dict["budget"] = {"dataset": "digits-fixed", "lifetime_epsilon": 3.0, "ledger": ledger_url}
    first = private_train(spec=tiny_spec_dict)
    second = private_train(spec=tiny_spec_dict)
    client = mlflow.MlflowClient(tiny_spec_dict["tracking"]["uri"])
    run = client.get_run(first["run_id"])
    assert run.data.tags[DP_NEIGHBORING] == "replace_one"
    assert run.data.tags[DP_GUARANTEE].endswith(
        "-DP for replacement of one example of digits; the number of private rows "
        f"({run.data.params[DERIVED_N_PRIVATE]}) is the same for every such neighbour, and the run uses and releases it.")
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "dl")))
    event = json.loads((local / DP_EVENT_ARTIFACT).read_text())
    assert event["event"]["type"] == "SampledWithoutReplacementDpEvent" and event["event"]["sample_size"] == 40
    n = int(run.data.params[DERIVED_N_PRIVATE])
    assert event["event"]["source_dataset_size"] == n
    report = (local / PRIVACY_REPORT_ARTIFACT).read_text()
    assert f"| sampling | fixed size, 40 of {n} private rows per step without replacement |" in report
    assert "sampled without replacement per step" in report
    assert "batch membership were drawn by torch's generators" in report  # privacy.noise auto: fast on digits
    assert run.data.tags[DP_NOISE_SOURCE] == "fast"
    sigma = float(run.data.params["mechanism.noise_multiplier"])
    delta = float(run.data.params["privacy.delta"])
    step = dp_accounting.SampledWithoutReplacementDpEvent(n, 40, dp_accounting.GaussianDpEvent(sigma))
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    one = rdp.RdpAccountant(neighboring_relation=relation).compose(step, 20).get_epsilon(delta)
    both = rdp.RdpAccountant(neighboring_relation=relation).compose(step, 40).get_epsilon(delta)
    assert first["epsilon"] == pytest.approx(one, rel=1e-9) and one <= 1.0
    assert PrivacyLedger(ledger_url).spent("digits-fixed") == pytest.approx(both, rel=1e-9)
    assert second["budget_left"] == pytest.approx(3.0 - both, rel=1e-9)
    assert both < 2 * one  # composed exactly, not summed


def test_full_batch_runs_under_zcdp_report_rho_and_compose_by_adding_it(prefect_server, tiny_spec_dict, tmp_path,
                                                                        mlflow_db, monkeypatch):
    """accountant zcdp end to end: each run states its rho-zCDP in its report, its tags and its registered
    model, and the ledger's total for two runs is the epsilon of the summed rho, not a sum of epsilons."""
    from components.accountants import ZCdpAccountant
    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    tiny_spec_dict["tracking"]["uri"] = mlflow_db
    tiny_spec_dict["sampling"] = {"kind": "full_batch"}
    tiny_spec_dict["privacy"].update(neighboring="replace_one", accountant="zcdp", epsilon=1.0)
    tiny_spec_dict["optimizer"]["steps"] = 10
    tiny_spec_dict["budget"] = {"dataset": "digits-zcdp", "lifetime_epsilon": 3.0, "ledger": ledger_url}
    first = private_train(spec=tiny_spec_dict)
    second = private_train(spec=tiny_spec_dict)
    client = mlflow.MlflowClient(tiny_spec_dict["tracking"]["uri"])
    run = client.get_run(first["run_id"])
    sigma = float(run.data.params["mechanism.noise_multiplier"])
    delta = float(run.data.params["privacy.delta"])
    rho = 10 / (2 * sigma ** 2)
    assert float(run.data.tags[DP_ZCDP_RHO]) == pytest.approx(rho, rel=1e-5)
    assert run.data.tags[DP_ACCOUNTANT] == "zcdp"
    from flows.record.reporting import shown

    assert run.data.tags[DP_GUARANTEE].endswith(f"It is {shown(rho)}-zCDP, which implies that.")
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "dl")))
    assert f"| zCDP rho spent | {shown(rho, 6)} |" in (local / PRIVACY_REPORT_ARTIFACT).read_text()
    event = json.loads((local / DP_EVENT_ARTIFACT).read_text())
    assert event["event"]["type"] == "GaussianDpEvent" and event["count"] == 10
    relation = dp_accounting.NeighboringRelation.REPLACE_ONE
    one = ZCdpAccountant(relation).compose(dp_accounting.ZCDpEvent(rho)).get_epsilon(delta)
    both = ZCdpAccountant(relation).compose(dp_accounting.ZCDpEvent(2 * rho)).get_epsilon(delta)
    assert first["epsilon"] == pytest.approx(one, rel=1e-9) and one <= 1.0
    assert PrivacyLedger(ledger_url).spent("digits-zcdp") == pytest.approx(both, rel=1e-9)
    assert second["budget_left"] == pytest.approx(3.0 - both, rel=1e-9)
    assert both < 2 * one
    versions = client.search_model_versions(f"run_id = '{first['run_id']}'")
    assert versions and versions[0].tags[DP_ZCDP_RHO] == run.data.tags[DP_ZCDP_RHO]


def test_the_default_ledger_never_starts_beside_the_one_earlier_privzo_kept_in_the_folder(
        prefect_server, tiny_spec_dict, tmp_path, monkeypatch):
    """Before, a spec without budget.ledger used ./privacy-ledger.db, a file that depends on the folder a
    run starts in. The default is now this user's ~/.privzo ledger; a run that would open it while a
    ./privacy-ledger.db sits in its folder is refused before anything is reserved or written, since the
    dataset's earlier runs may be recorded only there."""
    from flows.private_train import private_train

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "privacy-ledger.db").write_bytes(b"")
    tiny_spec_dict["tracking"]["uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tiny_spec_dict["budget"] = {"dataset": "digits", "lifetime_epsilon": 8.0}
    with pytest.raises(ValueError, match=r"^budget.ledger: ./privacy-ledger.db is a ledger earlier privzo kept here by "
                                         r"default; name the ledger this dataset's runs use"):
        private_train(spec=tiny_spec_dict)
    assert not (tmp_path / "home").exists() and not (tmp_path / "mlflow.db").exists()
    (tmp_path / "privacy-ledger.db").unlink()
    result = private_train(spec=tiny_spec_dict)
    from flows.ledger import PrivacyLedger

    (charge,) = PrivacyLedger(f"sqlite:///{tmp_path / 'home' / '.privzo' / 'privacy-ledger.db'}").history("digits")
    assert charge.run_id == result["run_id"] and charge.status == "committed"


@pytest.mark.parametrize("name, backend", [("p1_o2nc_001", "local"), ("p1_o2nc_001_naive", "local"),
                                           ("p1_o2nc_002", "ray"), ("p1_o2nc_002_fo", "ray"),
                                           ("p1_o2nc_002_multipass", "local"), ("p1_o2nc_002_fo_multipass", "local"),
                                           ("p1_o2nc_002_poisson", "ray")])
def test_each_nonsmooth_example_runs_end_to_end(prefect_server, tmp_path, mlflow_db, monkeypatch, name, backend):
    """The papers' algorithms go the way of every run: the flow, MLflow (params, exact certificate, epsilon,
    DP tags), the registry; 002 (zero- and first-order, and the Poisson multi-pass variant) on two Ray workers (their
    per-example points follow the row's place in the batch, so the run is the local one)."""
    import ray

    import specs
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    spec = specs.load_spec(str(Path(__file__).parents[2] / "specs" / "examples" / f"{name}.yaml")).model_dump(mode="json")
    spec["data"]["source"]["rows"] = 600 if name in ("p1_o2nc_001", "p1_o2nc_001_naive", "p1_o2nc_002", "p1_o2nc_002_fo") \
        else 300  # a multi-pass step reads every row (or a Poisson batch of them)
    if "poisson" in name:
        spec["data"]["declared_private_rows"], spec["sampling"]["expected_batch_size"] = 240, 30
    spec["tracking"]["uri"] = mlflow_db
    spec["execution"] = {"backend": backend, "workers": 2}
    try:
        result = private_train(spec=spec)
    finally:
        ray.shutdown()
    run = mlflow.MlflowClient(spec["tracking"]["uri"]).get_run(result["run_id"])
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    assert float(tags[DP_EPSILON]) <= 1.0
    assert tags[DP_NEIGHBORING] == ("add_remove" if "poisson" in name else "replace_one")
    assert params["optimizer.kind"] == "o2nc" and params["optimizer.lr"] != "auto"
    assert 0 < metrics["eval/goldstein_certificate"] <= 1.0 + 1e-9  # |mean of unit-ish gradients| on P1
    assert metrics["eval/excess_risk"] >= 0 and result["model_version"] == "1"
    report = mlflow.MlflowClient(spec["tracking"]["uri"]).download_artifacts(result["run_id"], PRIVACY_REPORT_ARTIFACT,
                                                                            str(tmp_path))
    expected = {"multipass": "every row is in every step", "poisson": "a fresh poisson batch"}
    assert next((v for k, v in expected.items() if k in name), "single pass") in Path(report).read_text().lower()


def test_each_kl_example_runs_end_to_end(prefect_server, tmp_path, mlflow_db, monkeypatch):
    """Paper 003's algorithms go the way of every run (the flow, the ledger, MLflow, the registry), each
    charged its plan or its filter's budget, at most the target epsilon; a run that stopped early is charged
    no less. KL-Spider on two Ray workers."""
    import ray

    import specs
    from components import builders
    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    examples = Path(__file__).parents[2] / "specs" / "examples"
    for name, rows, backend in (("q1_kl_spider", 1000, "ray"), ("q4_proximal_point", 60, "local"),
                                ("q1_adaptive_noisy_gd", 600, "local"), ("q5_adaptive_select", 400, "local")):
        spec = specs.load_spec(str(examples / f"{name}.yaml")).model_dump(mode="json")
        spec["data"]["source"]["rows"] = rows
        spec["tracking"]["uri"] = mlflow_db
        spec["execution"] = {"backend": backend, "workers": 2}
        spec["budget"] = {"dataset": name, "lifetime_epsilon": 10.0, "ledger": ledger}
        try:
            result = private_train(spec=spec)
        finally:
            ray.shutdown()
        run = mlflow.MlflowClient(mlflow_db).get_run(result["run_id"])
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        target = spec["privacy"]["epsilon"]
        assert target * 0.999 <= float(tags[DP_EPSILON]) <= target, name  # the whole plan, not what ran
        assert params["estimator.kind"] == "full_gradient" and params["optimizer.steps"] != "auto"
        (charge,) = PrivacyLedger(ledger).history(name)
        assert charge.status == "committed"
        resolved = specs.load_spec(mlflow.MlflowClient(mlflow_db).download_artifacts(result["run_id"], SPEC_ARTIFACT,
                                                                                    str(tmp_path / name)))
        assert charge.event == builders.planned_event(resolved, rows, resolved.mechanism.noise_multiplier), name
        assert metrics["eval/grad_norm"] >= 0 and result["model_version"] == "1"
        if name != "q5_adaptive_select":
            assert 0 <= metrics["eval/excess_risk"] < 0.51, name  # below F(w_0) - F* ~ 0.5 (mean_pl)


def test_a_deployment_run_on_a_team_worker_is_charged_to_the_team_ledger_only(prefect_server, tiny_spec_dict,
                                                                            tmp_path, monkeypatch):
    """A Prefect user's inline spec naming its own ledger (its own lifetime), or no budget at all, is refused
    on a team's worker before any row is read: the team's rows are charged to the team's ledger. On a worker
    no stack configured, every deployment run is refused; on a personal worker's, the environment's ledger."""
    import flows.private_train as pt
    import flows.tasks as tasks

    team = f"sqlite:///{tmp_path / 'team.db'}"
    monkeypatch.setenv("PRIVZO_LEDGER_URL", team)
    monkeypatch.setattr(tasks, "deployment_run", lambda: True)
    for name in ("WORKER_CONFIG", "SYSTEM_WORKER_CONFIG"):  # a worker without a configuration
        monkeypatch.setattr(f"flows.worker_config.{name}", tmp_path / "no-worker.json")
    own = copy.deepcopy(tiny_spec_dict)
    own["data"]["source"] = {"kind": "file", "path": str(tmp_path / "never-read.csv"), "label": "y", "classes": [0, 1]}
    own["budget"] = {"dataset": "team-data", "lifetime_epsilon": 1000.0, "ledger": f"sqlite:///{tmp_path / 'own.db'}"}
    # another checkout of the same code (no file beside it, none at the system's path): refused, whatever the
    # spec or the environment a job variable sets names
    for environment in (team, None):
        if environment is None:
            monkeypatch.delenv("PRIVZO_LEDGER_URL")
        with pytest.raises(ValueError, match=r"^budget.ledger: this deployment's run found no worker configuration "
                                             r"\(.*\); a worker's ledger is named by that file, never by the "
                                             r"environment a job variable sets"):
            pt.private_train(spec=own)
    monkeypatch.setenv("PRIVZO_LEDGER_URL", team)
    personal = tmp_path / "personal.json"
    personal.write_text(json.dumps({"ledger": None}))
    monkeypatch.setattr("flows.worker_config.WORKER_CONFIG", personal)
    with pytest.raises(ValueError, match=r"^budget.ledger: this deployment's run has \$PRIVZO_LEDGER_URL but its "
                                         r"worker's configuration names no ledger \(a personal worker\)"):
        pt.private_train(spec=own)
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"ledger": team}))
    monkeypatch.setattr("flows.worker_config.SYSTEM_WORKER_CONFIG", config)  # the system's comes first
    with pytest.raises(ValueError, match=r"^budget.ledger: a deployment's run on this team's worker is charged to "
                                         r"the team's ledger \(this worker's configuration, sqlite:///"):
        pt.private_train(spec=own)
    del own["budget"]
    with pytest.raises(ValueError, match=r"^budget: a deployment's run on this team's worker .* has no budget section"):
        pt.private_train(spec=own)
    assert not (tmp_path / "own.db").exists() and not (tmp_path / "team.db").exists()  # nothing read or charged


def test_a_team_workers_configuration_pins_its_ledger_whatever_the_runs_environment(tiny_spec_dict, tmp_path,
                                                                                   monkeypatch):
    """The worker's configuration (the stack's .privzo-stack/worker.json) names the team's ledger; a run's
    $PRIVZO_LEDGER_URL, which a Prefect user sets through job variables, moves nothing: a spec naming no ledger
    is charged to the team's, one naming the environment's is refused."""
    import flows.tasks as pt  # the step both flows share: the worker's ledger pin
    import specs
    from flows.worker_config import worker_ledger

    team, own = f"sqlite:///{tmp_path / 'team.db'}", f"sqlite:///{tmp_path / 'own.db'}"
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"ledger": team}))
    monkeypatch.setattr("flows.worker_config.SYSTEM_WORKER_CONFIG", config)
    monkeypatch.setattr("flows.worker_config.WORKER_CONFIG", tmp_path / "beside-the-code.json")
    monkeypatch.setattr(pt, "deployment_run", lambda: True)
    monkeypatch.setenv("PRIVZO_LEDGER_URL", own)
    d = copy.deepcopy(tiny_spec_dict)
    d["budget"] = {"dataset": "team-data", "lifetime_epsilon": 1000.0}
    assert pt.charged_to_the_team_ledger(specs.spec_from_dict(d)).budget.ledger == team
    d["budget"]["ledger"] = own
    with pytest.raises(ValueError, match=r"^budget.ledger: a deployment's run on this team's worker is charged to the "
                                         r"team's ledger \(this worker's configuration, sqlite:///.*team.db\), not "):
        pt.charged_to_the_team_ledger(specs.spec_from_dict(d))
    monkeypatch.setattr(pt, "deployment_run", lambda: False)  # the operator's own run is not the worker's
    assert pt.charged_to_the_team_ledger(specs.spec_from_dict(d)).budget.ledger == own
    config.write_text('{"ledger": "sqlite:///relative.db"}')
    with pytest.raises(ValueError, match=r"^budget.ledger: this worker's configuration .* names no usable ledger"):
        worker_ledger()


def test_a_workers_ray_runs_every_deployment_runs_steps_and_no_other_cluster(tiny_spec_dict, tmp_path, monkeypatch):
    """Where the worker's configuration names its stack's Ray head, a deployment run's steps run on it, whatever
    backend the spec wrote (its workers and resources as written); a spec naming another cluster is refused, as
    is what runs locally but not on Ray workers. Without one, or for the operator's own run, the spec as
    written."""
    import flows.tasks as pt
    import specs
    from flows.worker_config import worker_ray

    team, head = f"sqlite:///{tmp_path / 'team.db'}", "127.0.0.1:6390"
    config = tmp_path / "worker.json"
    config.write_text(json.dumps({"ledger": team, "ray": head}))
    monkeypatch.setattr("flows.worker_config.SYSTEM_WORKER_CONFIG", config)
    monkeypatch.setattr(pt, "deployment_run", lambda: True)
    d = copy.deepcopy(tiny_spec_dict)
    d["budget"] = {"dataset": "team-data", "lifetime_epsilon": 10.0}
    for written in ({}, {"backend": "local", "workers": 3}, {"backend": "ray", "address": "auto"},
                    {"backend": "ray", "address": head, "cpus_per_worker": 0.5}):
        pinned = pt.charged_to_the_team_ledger(specs.spec_from_dict({**d, "execution": written})).execution
        assert (pinned.backend, pinned.address) == ("ray", head), written
        assert pinned.workers == written.get("workers", 2) and pinned.cpus_per_worker == written.get("cpus_per_worker", 1.0)
    for elsewhere in ("ray://10.0.0.9:10001", "127.0.0.1:6379"):
        with pytest.raises(ValueError, match=rf"^execution.address: a deployment's run on this worker runs its steps "
                                             rf"on the stack's Ray at {head} .* not '{re.escape(elsewhere)}'"):
            pt.charged_to_the_team_ledger(specs.spec_from_dict({**d, "execution": {"backend": "ray", "address": elsewhere}}))
    with pytest.raises(ValueError, match=r"^execution.device: cuda with backend ray needs gpus_per_worker > 0 .*"
                                         rf"\(this worker runs every deployment's steps on its stack's Ray at {head}\)$"):
        pt.charged_to_the_team_ledger(specs.spec_from_dict({**d, "execution": {"device": "cuda"}}))
    monkeypatch.setattr(pt, "deployment_run", lambda: False)  # the operator's own run: as written
    assert pt.charged_to_the_team_ledger(specs.spec_from_dict(d)).execution.backend == "local"
    for entry, expected in (({"ledger": team}, None), ({"ledger": team, "ray": None}, None), ({"ledger": None, "ray": head}, head)):
        config.write_text(json.dumps(entry))
        assert worker_ray() == expected
    for bad in ('{"ledger": null, "ray": 6379}', '{"ledger": null, "ray": " "}'):
        config.write_text(bad)
        with pytest.raises(ValueError, match=r"^execution.address: this worker's configuration .* names no usable Ray"):
            worker_ray()

"""privzo tune: hyperparameters chosen inside the guarantee (Papernot & Steinke's repeat-and-select). The
search's epsilon computed here from dp-accounting alone equals what the ledger and the model version claim;
a losing candidate leaves nothing in MLflow, the logs or the disk; the spec's search is refused where its
bound does not hold."""
import copy
import math
import random
from pathlib import Path

import dp_accounting
import mlflow
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

import specs
from components.tuning import RepeatLaw
from flows import tune as tune_flow
from flows import tune_candidates as candidates
from flows.cli import main
from flows.ledger import PrivacyLedger
from flows.record.tracking_names import (DP_EPSILON, MLFLOW_PARENT_RUN_ID, PRIVZO_BLOCKS, PRIVZO_INIT, TUNE,
                                         TUNE_ROWS)

SPACE = {"optimizer.lr": [0.005, 0.02, 0.08], "mechanism.clip": [1.0, 2.0]}


def _tune_spec(tiny, tmp_path, **tune):
    d = copy.deepcopy(tiny)
    d["name"] = "tiny-tune"
    d["tracking"] = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "log_every": 30}
    d["budget"] = {"dataset": "digits-tune", "lifetime_epsilon": 5.0, "ledger": f"sqlite:///{tmp_path / 'ledger.db'}"}
    d["tune"] = {"space": SPACE, "candidates": {"distribution": "geometric", "mean": 3}, **tune}
    return d


@pytest.mark.parametrize("repeat", [{"distribution": "poisson", "mean": 6},
                                    {"distribution": "geometric", "mean": 4},
                                    {"distribution": "logarithmic", "mean": 4},
                                    {"distribution": "truncated_negative_binomial", "mean": 8, "shape": 0.5}])
def test_k_is_drawn_from_its_law(repeat):
    """The draw's mean over many draws is the law's (within 4 standard errors); the law sums to one."""
    law = RepeatLaw(specs.sections.RepeatSpec(**repeat))
    assert sum(law.pmf(k) for k in range(5000)) == pytest.approx(1.0, abs=1e-9)
    mean = sum(k * law.pmf(k) for k in range(5000))
    assert mean == pytest.approx(repeat["mean"], rel=1e-6)
    rng = random.Random(7)
    draws = [law.draw(rng.random) for _ in range(20000)]
    sd = math.sqrt(sum((k - mean) ** 2 * law.pmf(k) for k in range(5000)) / len(draws))
    assert abs(sum(draws) / len(draws) - mean) < 4 * sd
    assert min(draws) == (0 if repeat["distribution"] == "poisson" else 1)


@pytest.mark.parametrize("repeat", [{"distribution": "poisson", "mean": 2},
                                    {"distribution": "truncated_negative_binomial", "mean": 6, "shape": 0.5}])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_the_padded_k_is_the_laws_quantile(repeat, q):
    law = RepeatLaw(specs.sections.RepeatSpec(**repeat))
    k = law.quantile(q)
    assert sum(law.pmf(j) for j in range(k + 1)) >= q > sum(law.pmf(j) for j in range(k))


def test_a_padded_share_lasts_as_long_whatever_its_size_and_keeps_its_best(monkeypatch):
    """tune.pad_to: a share of candidates (the local search's, or a Ray task's) lasts as long as the padded K's
    candidates would, timed by its own; an empty share times a throwaway candidate, never returned; a share past
    the pad is not padded. What an insider reads of time (the Prefect task, the ledger's times) then follows."""
    import time
    from types import SimpleNamespace

    each = 0.2

    def timed(search, setting, data):
        time.sleep(each)
        return SimpleNamespace(setting=setting, score=setting["optimizer.lr"])

    monkeypatch.setattr(candidates, "train_candidate", timed)
    search = SimpleNamespace(tune=SimpleNamespace(score=SimpleNamespace(metric="accuracy"),
                                                  settings=lambda: [{"optimizer.lr": 9.0}]))
    took = {}
    for size in (0, 1, 3, 5):
        share = [{"optimizer.lr": float(i)} for i in range(size)]
        began = time.monotonic()
        best = candidates.best_of_share(search, share, None, pad_to=4)
        took[size] = time.monotonic() - began
        assert (best is None) if size == 0 else best.setting == {"optimizer.lr": size - 1.0}
    assert all(4 * each <= took[size] < 4 * each + each / 2 for size in (0, 1, 3)), took
    assert 5 * each <= took[5] < 5 * each + each / 2, took



def test_a_ray_task_of_a_padded_search_pads_its_share_to_the_public_laws_share(tiny_spec_dict, tmp_path, monkeypatch):
    """Each Ray task of a search with pad_to lasts as long as its share of the padded K (Poisson(2) at 0.99:
    6 candidates over 3 tasks, 2 a task), whatever its own share; run here in-process, as the task runs it."""
    import time
    from types import SimpleNamespace

    each = 0.2
    def timed(search, setting, data):
        time.sleep(each)
        return SimpleNamespace(setting=setting, score=0.5, curve=[],
                               built=SimpleNamespace(loop=SimpleNamespace(state_dict=dict)))

    monkeypatch.setattr(candidates, "train_candidate", timed)
    monkeypatch.setattr(candidates.builders, "read_split", lambda spec, rows: SimpleNamespace(ordered_digest="d"))
    d = _tune_spec(tiny_spec_dict, tmp_path, candidates={"distribution": "poisson", "mean": 2}, pad_to=0.99)
    d["execution"] = {"backend": "ray", "workers": 3}
    search = candidates.in_process(specs.spec_from_dict(d))
    for share in ([], [{"optimizer.lr": 0.02}]):
        began = time.monotonic()
        candidates.share_in_task((search, share), ({}, None, "d"), 1)
        assert 2 * each <= time.monotonic() - began < 2.5 * each


def test_pad_to_is_a_private_searchs_and_its_share_is_the_public_laws(tiny_spec_dict, tmp_path):
    d = _tune_spec(tiny_spec_dict, tmp_path, candidates={"distribution": "poisson", "mean": 2}, pad_to=0.99)
    search = specs.spec_from_dict(d)
    assert candidates.padded_share(search, 1) == 6 and candidates.padded_share(search, 4) == 2
    assert candidates.padded_share(specs.spec_from_dict(_tune_spec(tiny_spec_dict, tmp_path)), 1) is None
    rehearsal = _tune_spec(tiny_spec_dict, tmp_path, rows="public", then="train", pad_to=0.99)
    with pytest.raises(specs.SpecError, match=r"pad_to: only a private search draws K \(rows: private, or then: "
                                              r"search\)"):
        specs.spec_from_dict(rehearsal)
    for bad in (0, 1, 1.5):
        with pytest.raises(specs.SpecError, match="pad_to"):
            specs.spec_from_dict(_tune_spec(tiny_spec_dict, tmp_path, pad_to=bad))


def _prefect_logs(flow_run_id) -> str:
    """Every log line the Prefect server holds of a flow run and its task runs (what the UI shows of them)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read():
        async with get_client() as client:
            return [log.message for log in await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200)]

    return "\n".join(asyncio.run(read()))


def test_a_tune_charges_once_the_epsilon_dp_accounting_gives_and_releases_only_the_winner(
        prefect_server, tiny_spec_dict, tmp_path, monkeypatch, capfd):
    # three candidates of known settings (K and the draws are the OS's otherwise); each one's score recorded
    settings = [{"optimizer.lr": 0.005, "mechanism.clip": 1.0}, {"optimizer.lr": 0.08, "mechanism.clip": 2.0},
                {"optimizer.lr": 0.02, "mechanism.clip": 1.0}]
    monkeypatch.setattr(tune_flow, "draw_candidates", lambda tune, rng: list(settings))
    trained = []
    real = candidates.train_candidate

    def spy(search, setting, data):
        candidate = real(search, setting, data)
        trained.append((setting, candidate.score, [dict(m) for _, m in candidate.curve]))
        return candidate

    monkeypatch.setattr(candidates, "train_candidate", spy)
    d = _tune_spec(tiny_spec_dict, tmp_path)
    state = tune_flow.private_tune(spec=d, return_state=True)
    result = state.result()
    assert len(trained) == 3

    # the epsilon from dp-accounting alone: the best of K ~ geometric(3) runs of 60 Poisson-subsampled steps
    sigma = result["noise_multiplier"]
    delta = 1 / 1385
    one = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        64 / 1385, dp_accounting.GaussianDpEvent(sigma)), 60)  # a step's queries are released as one vector
    independent = RdpAccountant().compose(dp_event.RepeatAndSelectDpEvent(one, 3.0, 1.0)).get_epsilon(delta)
    assert independent == pytest.approx(2.0, rel=1e-6)
    (charge,) = PrivacyLedger(d["budget"]["ledger"]).history("digits-tune")
    assert charge.status == "committed" and charge.run_id == result["run_id"]
    assert PrivacyLedger(d["budget"]["ledger"]).spent("digits-tune") == pytest.approx(independent, rel=1e-9)
    client = mlflow.MlflowClient(d["tracking"]["uri"])
    (version,) = client.search_model_versions("name='tiny-tune'")
    assert float(version.tags[DP_EPSILON]) == pytest.approx(independent, rel=5e-6)
    assert "It includes the hyperparameter selection: the best of K candidates, K ~ geometric (mean 3)" in \
        version.description
    from flows.record.verify import verify

    checked = verify("tiny-tune", version.version, tracking_uri=d["tracking"]["uri"], ledger_url=d["budget"]["ledger"])
    assert checked.passed, checked.first_mismatch  # the winner's journal replays to its weights, its plan the search's

    # only the winner is released: two runs (the search and its winner), nothing of a loser anywhere
    best = max(trained, key=lambda t: t[1])
    assert result["winner"] == best[0]
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert sorted(r.data.tags.get(TUNE) for r in runs) == ["search", "winner"]
    losers = [t for t in trained if t[0] != best[0]]
    loser_values = {v for _, score, curve in losers for v in [score, *[x for m in curve for x in m.values()]]}
    winner_values = {v for m in best[2] for v in m.values()} | {best[1]}
    only_losers = loser_values - winner_values
    assert only_losers
    printed = capfd.readouterr()
    logged = "\n".join([printed.out, printed.err, _prefect_logs(state.state_details.flow_run_id)])
    assert "tune: sigma" in logged  # the flow's own line is there to be read
    for run in runs:
        for key in run.data.metrics:
            history = {m.value for m in client.get_metric_history(run.info.run_id, key)}
            assert not history & only_losers, key
        for key, value in run.data.params.items():
            if not key.startswith("tune."):  # the search's public grid, every setting of it
                assert all(f"{k}: {v}" not in value for s, _, _ in losers for k, v in s.items()), key
        for artifact in _artifact_texts(client, run.info.run_id, tmp_path):
            assert not any(repr(v) in artifact or f"{v:.4f}" in artifact for v in only_losers)
    assert not any(f"{v:.4f}" in logged for v in only_losers)
    assert not (tmp_path / ".privzo").exists() and not list(tmp_path.glob("**/checkpoint.pt"))


def test_a_search_that_fails_after_its_candidates_is_charged_whole_once(prefect_server, tiny_spec_dict, tmp_path,
                                                                        monkeypatch):
    """The search's reservation is settled by its run session: a failure once a candidate may have run (here
    the registry, after the winner's run) commits the search's planned event whole, once; nothing is left
    reserved."""
    monkeypatch.setattr(tune_flow, "draw_candidates", lambda tune, rng: [{"optimizer.lr": 0.02, "mechanism.clip": 1.0}])

    def registry_down(*_args, **_kwargs):
        raise ConnectionError("the model registry is unreachable")

    monkeypatch.setattr(tune_flow, "register", registry_down)
    d = _tune_spec(tiny_spec_dict, tmp_path)
    with pytest.raises(ConnectionError, match="the model registry is unreachable"):
        tune_flow.private_tune(spec=d)
    ledger = PrivacyLedger(d["budget"]["ledger"])
    (charge,) = ledger.history("digits-tune")
    assert charge.status == "committed" and charge.steps_run == charge.steps_planned == 60
    assert ledger.spent("digits-tune") == pytest.approx(2.0, rel=1e-6)  # the search's epsilon, the selection included


def _artifact_texts(client, run_id, tmp_path):
    out = []
    for item in client.list_artifacts(run_id):
        if item.is_dir or not item.path.endswith((".json", ".md", ".yaml", ".txt")):
            continue
        path = client.download_artifacts(run_id, item.path, str(tmp_path / "downloaded"))
        out.append(open(path).read())
    return out


def test_a_search_whose_bound_does_not_hold_is_refused_in_one_line(tiny_spec_dict, tmp_path, capsys):
    """PLD has no repeat-and-select bound; a setting that changes a candidate's event (its steps) makes the
    candidates more than one mechanism; sigma is the search's own; privzo run does not train a search."""
    from components import builders

    d = _tune_spec(tiny_spec_dict, tmp_path)
    d["privacy"]["accountant"] = "pld"
    with pytest.raises(ValueError, match=r"privacy.accountant: a tune's selection is accounted in RDP"):
        specs.spec_from_dict(d)
    d = _tune_spec(tiny_spec_dict, tmp_path)
    d["tune"]["space"] = {"optimizer.steps": [30, 60]}
    with pytest.raises(ValueError, match=r"^tune.space: the setting \{'optimizer.steps': 30\} changes a candidate's "
                                         r"privacy event"):
        builders.resolve_privacy(specs.spec_from_dict(d))
    d["tune"]["space"] = {"mechanism.noise_multiplier": [1.0, 2.0]}
    with pytest.raises(ValueError, match=r"^tune.space.mechanism.noise_multiplier: the search does not vary"):
        builders.resolve_privacy(specs.spec_from_dict(d))
    d["tune"]["space"] = {"optimizer.learning_rate": [1.0]}
    with pytest.raises(ValueError, match=r"^tune.space.optimizer.learning_rate: optimizer has no field "
                                         r"'learning_rate'"):
        builders.resolve_privacy(specs.spec_from_dict(d))
    path = tmp_path / "tune.yaml"
    path.write_text(specs.dump_yaml(specs.spec_from_dict(_tune_spec(tiny_spec_dict, tmp_path))))
    assert main(["run", str(path)]) == 2
    assert "tune: this spec searches its hyperparameters; run it with privzo tune" in capsys.readouterr().err
    assert not (tmp_path / "ledger.db").exists()
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "tune: the best of K candidates over 6 settings of optimizer.lr, mechanism.clip" in out
    assert "the released winner, the selection included, (2, " in out


def test_candidates_run_as_ray_tasks_and_the_winner_is_rebuilt_from_its_state(prefect_server, tiny_spec_dict,
                                                                             tmp_path, monkeypatch):
    """With execution.backend ray the candidates are dealt among execution.workers Ray tasks (as many whatever K),
    each reading the rows itself (none is sent through Ray's object store); the winner's model, rebuilt on the
    driver from the state its task returned, scores what its task scored, and is registered with the search's
    epsilon. Run from a folder of the user's holding folders named like privzo's packages, the tasks import
    privzo's own (Ray puts the driver's working directory first on its workers' path). The search is the flow as
    a deployment's run loads it (its entrypoint file as a module of its own name)."""
    import pickle

    import ray

    settings = [{"optimizer.lr": 0.005, "mechanism.clip": 1.0}, {"optimizer.lr": 0.08, "mechanism.clip": 2.0},
                {"optimizer.lr": 0.02, "mechanism.clip": 1.0}]
    monkeypatch.setattr(tune_flow, "draw_candidates", lambda tune, rng: list(settings))
    d = _tune_spec(tiny_spec_dict, tmp_path)
    d["execution"] = {"backend": "ray", "workers": 2}
    users = tmp_path / "users-folder"
    for package in ("specs", "flows", "components", "reproduce"):
        (users / package).mkdir(parents=True)
        (users / package / "__init__.py").write_text("raise ImportError('a folder of the user, not privzo')\n")
    monkeypatch.chdir(users)
    ray.shutdown()  # started anew from here, the user's folder
    # workers that import privzo from elsewhere than this process are found before any row leaves it, and the
    # search commits nothing for the candidates it never ran
    import os

    import components.runtime.ray_tasks as ray_tasks

    driver, real = os.getpid(), ray_tasks.packages

    def elsewhere():
        return real() if os.getpid() == driver else {**real(), "specs": str(users / "specs")}

    with monkeypatch.context() as patched:
        patched.setattr(ray_tasks, "packages", elsewhere)
        with pytest.raises(RuntimeError, match=r"^execution: Ray's workers import specs from .*users-folder/specs, "
                                               r"this process from .*; nothing was sent to them$"):
            tune_flow.private_tune(spec=d)
    (nothing,) = PrivacyLedger(d["budget"]["ledger"]).history("digits-tune")
    assert nothing.status == "aborted" and nothing.steps_run == 0  # released, as a run refused before its first step
    assert PrivacyLedger(d["budget"]["ledger"]).spent("digits-tune") == 0.0
    submitted = []
    real_each = ray_tasks.each_on_ray

    def spy(fn, items, shared, **kwargs):
        submitted.append((list(items), shared))
        return real_each(fn, items, shared, **kwargs)

    monkeypatch.setattr(ray_tasks, "each_on_ray", spy)
    # the flow as a deployment's run loads it: its entrypoint file by path, as a top-level module of its own
    # name (so nothing a Ray task runs may be defined there: a worker could not import it by that name)
    from prefect.flows import load_flow_from_entrypoint

    deployed = load_flow_from_entrypoint(f"{Path(tune_flow.__file__)}:private_tune")
    assert deployed.fn.__module__ != "flows.tune"
    monkeypatch.setitem(deployed.fn.__globals__, "draw_candidates", lambda tune, rng: list(settings))
    result = deployed(spec=d)  # from privzo's own root, whatever the working directory
    assert result["winner"] in settings
    ((items, shared),) = submitted
    assert len(items) == 2 and sorted(len(share) for _, share in items) == [1, 2]  # 2 tasks for K = 3
    spec_dict, window_rows, digest = shared  # what the tasks are sent: the spec and a digest, no row
    assert window_rows is None and len(digest) == 64 and len(pickle.dumps(shared)) < 20_000
    # Ray's worker logs mark each task it ran: as many of the search's as workers, never one a candidate
    import time

    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    for _ in range(50):
        marks = sum(f.read_text(errors="replace").count(":task_name:share_in_task") for f in logs.glob("worker-*.out"))
        if marks >= 2:
            break
        time.sleep(0.2)
    assert marks == 2
    client = mlflow.MlflowClient(d["tracking"]["uri"])
    run = client.get_run(result["run_id"])
    assert run.data.params["execution.backend"] == "local"  # each candidate ran inside its task
    (version,) = client.search_model_versions("name='tiny-tune'")
    assert float(version.tags[DP_EPSILON]) == pytest.approx(2.0, rel=5e-6)
    model = mlflow.pytorch.load_model(f"models:/tiny-tune/{version.version}")
    from components import builders, models as model_zoo
    import torch

    data = builders.load_data(specs.spec_from_dict(d))
    score = model_zoo.evaluate(model, torch.as_tensor(data.public.features), torch.as_tensor(data.public.labels))
    assert score["accuracy"] == pytest.approx(result["score"], abs=1e-6)


def test_a_search_on_ray_whose_rows_change_before_its_tasks_read_them_is_refused_and_charges_nothing(
        prefect_server, tiny_spec_dict, tmp_path, monkeypatch):
    """A Ray task of the search reads the rows itself. When the source changed after the driver read it, a task
    a worker finds it before the search starts: refused in one line, the reservation released. Rows that change
    after that check, under the candidates' own tasks, are refused too, but the search was started (its other
    tasks drew noise): charged whole, never less."""
    import components.runtime.ray_tasks as ray_tasks
    from tests.conftest import write_digits_file

    path = write_digits_file(tmp_path / "rows.csv", rows=range(1500))
    d = _tune_spec(tiny_spec_dict, tmp_path)
    d["data"] = {"declared_private_rows": 1000, "split": {"kind": "hashed", "public": 0.04, "test": 0.2},
                 "source": {"kind": "file", "path": str(path), "label": "digit", "classes": list(range(10))}}
    d["execution"] = {"backend": "ray", "workers": 2}
    monkeypatch.setattr(tune_flow, "draw_candidates", lambda tune, rng: [{"optimizer.lr": 0.02, "mechanism.clip": 1.0}])
    real_each, when = ray_tasks.each_on_ray, {}

    def rows_change(fn, items, shared, *, ready, **kwargs):
        if when["at"] == "before the check":
            write_digits_file(path, rows=range(1797))  # new rows land after the driver's read
            return real_each(fn, items, shared, ready=ready, **kwargs)

        def then_change(checked):
            ready(checked)
            write_digits_file(path, rows=range(1797))
        return real_each(fn, items, shared, ready=then_change, **kwargs)

    monkeypatch.setattr(ray_tasks, "each_on_ray", rows_change)
    ledger = PrivacyLedger(d["budget"]["ledger"])
    for at, status, spent in (("before the check", "aborted", 0.0), ("after the check", "committed", 2.0)):
        write_digits_file(path, rows=range(1500))
        when["at"] = at
        with pytest.raises(RuntimeError, match=r"^data.source: a Ray task of the search read other rows than the "
                                               r"driver \(the data changed after the driver read it"):
            tune_flow.private_tune(spec=d)
        charge = ledger.history("digits-tune")[-1]
        assert charge.status == status, at
        assert ledger.spent("digits-tune") == pytest.approx(spent, rel=5e-6), at

def test_a_rehearsal_trains_every_setting_on_public_rows_only_and_charges_nothing(prefect_server, tiny_spec_dict,
                                                                                   tmp_path, monkeypatch):
    """tune.rows public: each setting of the grid trains once a fold on public rows (no private row reaches it)
    and is scored on the held-out fold; every score is logged, no model is registered, and the ledger records
    the rehearsal as a NoOpDpEvent that spends nothing."""
    from components import builders

    seen = []
    real = candidates.train_candidate

    def spy(search, setting, data):
        seen.append(set(data.private.fingerprints) | set(data.public.fingerprints))
        return real(search, setting, data)

    monkeypatch.setattr(candidates, "train_candidate", spy)
    d = _tune_spec(tiny_spec_dict, tmp_path, rows="public", folds=2)
    d["tune"]["space"] = {"optimizer.lr": [0.005, 0.08]}
    result = tune_flow.private_tune(spec=d)
    data = builders.load_data(specs.spec_from_dict(d))
    private, public = set(data.private.fingerprints), set(data.public.fingerprints)
    assert len(seen) == 4 and all(rows <= public and not rows & private for rows in seen)
    assert [row["setting"] for row in result["settings"]] == [{"optimizer.lr": 0.005}, {"optimizer.lr": 0.08}]
    assert result["best"] == result["ranked"][0]["setting"] and [row["rank"] for row in result["ranked"]] == [1, 2]
    client = mlflow.MlflowClient(d["tracking"]["uri"])
    runs = client.search_runs([result["experiment_id"]])
    assert len(runs) == 3 and all(r.data.tags[TUNE] == "rehearsal" for r in runs)
    assert all("no private row" in r.data.tags[TUNE_ROWS] for r in runs)
    children = [r for r in runs if r.info.run_id != result["parent_run_id"]]
    assert sorted(r.data.metrics["score/public_accuracy"] for r in children) == \
        sorted(row["scores"]["accuracy"] for row in result["settings"])
    for child in children:  # the score is the folds' mean, each fold's kept
        folds = client.get_metric_history(child.info.run_id, "score/fold_public_loss")
        assert len(folds) == 2 and child.data.metrics["score/public_loss"] == pytest.approx(
            sum(m.value for m in folds) / 2, rel=1e-9)
    assert client.search_model_versions("name='tiny-tune'") == []
    ledger = PrivacyLedger.open(d["budget"]["ledger"])
    (charge,) = ledger.history("digits-tune")
    assert charge.status == "committed" and ledger.spent("digits-tune") == 0.0
    assert isinstance(charge.event, dp_accounting.NoOpDpEvent) and charge.run_id == result["parent_run_id"]


def test_a_rehearsal_longer_than_its_lease_keeps_its_record_while_another_run_settles_dead_ones(
        prefect_server, tiny_spec_dict, tmp_path, monkeypatch):
    """A rehearsal holds its reservation (of nothing) as a run holds one: its run session renews the lease, so
    a rehearsal that outlasts PRIVZO_LEASE_SECONDS while another run on the dataset settles the dead runs' charges
    is not taken for dead; it commits its NoOpDpEvent once, under its parent run."""
    import time

    monkeypatch.setenv("PRIVZO_LEASE_SECONDS", "1")
    real, settled = candidates.train_candidate, []

    def slow(search, setting, data):
        time.sleep(1.6)  # past the lease: only its renewals keep the reservation live
        settled.extend(PrivacyLedger.open(d["budget"]["ledger"]).settle_expired("digits-tune"))
        return real(search, setting, data)

    monkeypatch.setattr(candidates, "train_candidate", slow)
    d = _tune_spec(tiny_spec_dict, tmp_path, rows="public", folds=2)
    d["tune"]["space"] = {"optimizer.lr": [0.005]}
    result = tune_flow.private_tune(spec=d)
    assert settled == []
    (charge,) = PrivacyLedger.open(d["budget"]["ledger"]).history("digits-tune")
    assert charge.status == "committed" and isinstance(charge.event, dp_accounting.NoOpDpEvent)
    assert charge.run_id == result["parent_run_id"]


def test_a_rehearsals_pick_trained_once_is_charged_one_run_and_registered_under_it(prefect_server, tiny_spec_dict,
                                                                                    tmp_path):
    """then: train, the recommended path: the rehearsal (public rows, charged nothing) picks, and its pick trains
    once on the private rows in the same flow run, charged exactly one run's event at the one-run sigma (what
    dp-accounting gives for the spec without a tune section), registered as any run, a child of the rehearsal."""
    from components import builders
    from components.accountants import event_to_json

    d = _tune_spec(tiny_spec_dict, tmp_path, rows="public", folds=2, then="train", score={"metric": "loss"})
    del d["tune"]["candidates"]
    result = tune_flow.private_tune(spec=d)
    then = result["then"]
    assert then["kind"] == "train" and result["best"] == result["ranked"][0]["setting"]
    client = mlflow.MlflowClient(d["tracking"]["uri"])
    run = client.get_run(then["run_id"])
    assert run.data.tags[MLFLOW_PARENT_RUN_ID] == result["parent_run_id"]
    assert {k: float(run.data.params[k]) for k in result["best"]} == result["best"]
    plain = copy.deepcopy(d)
    plain.pop("tune")
    for path, value in result["best"].items():
        section, field = path.split(".")
        plain[section][field] = value
    resolved, _, _ = builders.resolve_privacy(specs.spec_from_dict(plain), 1385)
    sigma = float(resolved.mechanism.noise_multiplier)
    assert then["noise_multiplier"] == pytest.approx(sigma, rel=1e-9)
    ledger = PrivacyLedger.open(d["budget"]["ledger"])
    rehearsal, trained = sorted(ledger.history("digits-tune"), key=lambda c: c.created_at)
    assert isinstance(rehearsal.event, dp_accounting.NoOpDpEvent)
    expected = builders.planned_event(resolved, 1385, sigma)
    assert trained.status == "committed" and event_to_json(trained.event) == event_to_json(expected)
    accountant = RdpAccountant()
    accountant.compose(expected)
    assert ledger.spent("digits-tune") == pytest.approx(accountant.get_epsilon(float(resolved.privacy.delta)),
                                                        rel=1e-6)
    assert client.get_model_version("tiny-tune", then["model_version"]).run_id == then["run_id"]


def test_a_rehearsals_best_few_searched_privately_draw_only_among_them(prefect_server, tiny_spec_dict, tmp_path,
                                                                       monkeypatch):
    """then: search: the private search draws its candidates among the rehearsal's best tune.top settings
    (tune.among), and is charged its repeat-and-select event once."""
    drawn = []
    real = tune_flow.draw_candidates

    def spy(tune, rng=None):
        drawn.append(tune.settings())
        return real(tune, rng)

    monkeypatch.setattr(tune_flow, "draw_candidates", spy)
    d = _tune_spec(tiny_spec_dict, tmp_path, rows="public", folds=2, then="search", top=2)
    result = tune_flow.private_tune(spec=d)
    then = result["then"]
    assert then["kind"] == "search" and drawn == [result["top"]] and len(result["top"]) == 2
    assert result["top"] == [row["setting"] for row in result["ranked"][:2]]
    assert then["winner"] in result["top"]
    ledger = PrivacyLedger.open(d["budget"]["ledger"])
    events = [type(c.event).__name__ for c in sorted(ledger.history("digits-tune"), key=lambda c: c.created_at)]
    assert events == ["NoOpDpEvent", "RepeatAndSelectDpEvent"]


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_tuned_night_on_blocks_charges_the_search_to_every_block_of_its_window(prefect_server, tmp_path,
                                                                               monkeypatch, backend):
    """tune on data.blocks: the search reads one night's window, its RepeatAndSelect event (from dp-accounting
    alone) is charged to every block of the window, admitted as any run's, and the winner is a nightly version
    naming its blocks; on Ray too, where each task reads the window's rows itself, padded (tune.pad_to)."""
    from tests.flows.test_blocks import night, stream_spec, write_stream

    monkeypatch.chdir(tmp_path)
    settings = [{"optimizer.lr": 0.005, "mechanism.clip": 1.0}, {"optimizer.lr": 0.02, "mechanism.clip": 2.0}]
    monkeypatch.setattr(tune_flow, "draw_candidates", lambda tune, rng: list(settings))
    write_stream(tmp_path / "visits.csv", days=4, persons=True)
    d = stream_spec(tmp_path, window=2, persons=True)
    d["tracking"]["uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    d["budget"]["lifetime_epsilon"] = 5.0
    d["tune"] = {"space": SPACE, "candidates": {"distribution": "geometric", "mean": 2}}
    if backend == "ray":
        import ray

        d["execution"] = {"backend": "ray", "workers": 2}
        d["tune"]["pad_to"] = 0.8  # geometric(2): K = 3 at 0.8, 2 a task: each trains its one, then waits one
        try:
            result = tune_flow.private_tune(spec=d, as_of=night(2).isoformat())
        finally:
            ray.shutdown()
    else:
        result = tune_flow.private_tune(spec=d, as_of=night(2).isoformat())
    sigma, spec = result["noise_multiplier"], specs.spec_from_dict(d)
    n = spec.data.blocks.declared_persons * 2  # N: declared persons a block times the window's blocks
    one = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        spec.sampling.expected_batch_size / n, dp_accounting.GaussianDpEvent(sigma)), spec.optimizer.steps)
    search = RdpAccountant().compose(dp_event.RepeatAndSelectDpEvent(one, 2.0, 1.0)).get_epsilon(1e-5)
    ledger = PrivacyLedger(d["budget"]["ledger"])
    blocks = {b.block: b for b in ledger.blocks("visits")}
    assert sorted(blocks) == ["2026-11-01", "2026-11-02"]
    for block in blocks.values():
        assert block.charges == 1 and block.committed_epsilon == pytest.approx(search, rel=1e-9)
    run = mlflow.MlflowClient(d["tracking"]["uri"]).get_run(result["run_id"])
    assert run.data.tags[PRIVZO_BLOCKS] == "2026-11-01,2026-11-02"


def test_the_shipped_tuned_nightly_shares_the_nightlys_blocks_and_its_winner_is_retrained(prefect_server, tmp_path,
                                                                                          monkeypatch):
    """specs/examples/digits_stream_tune.yaml (deployment digits-stream-tune-nightly) on the shipped stream's
    first night: its search is charged to the nightly's 7 blocks at the nightly's price (epsilon 1 for the
    winner, the search included), and the nightly spec then retrains that night from the winner's version on
    the same ledger, each block holding both charges within its lifetime."""
    import yaml

    from flows.private_train import private_train
    from tests.conftest import EXAMPLES

    monkeypatch.chdir(tmp_path)
    stores = {"tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "log_every": 50}}
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    raw = {}
    for name in ("digits_stream_tune", "digits_stream"):
        d = specs.load_spec(EXAMPLES / f"{name}.yaml").model_dump(mode="json", exclude_unset=True)
        d.update(stores)
        d["budget"]["ledger"] = ledger
        raw[name] = d
    first_night = "2026-09-08T02:00:00+00:00"
    searched = tune_flow.private_tune(spec=raw["digits_stream_tune"], as_of=first_night)
    assert set(searched["winner"]) == {"optimizer.lr", "mechanism.clip"}
    blocks = PrivacyLedger(ledger).blocks("digits-stream")
    assert [b.block for b in blocks] == [f"2026-09-0{d}" for d in range(1, 8)]
    assert all(b.charges == 1 and b.committed_epsilon == pytest.approx(1.0, abs=1e-3) for b in blocks)
    retrained = private_train(spec=raw["digits_stream"], as_of=first_night)
    run = mlflow.MlflowClient(stores["tracking"]["uri"]).get_run(retrained["run_id"])
    assert run.data.tags[PRIVZO_INIT] == f"models:/digits-stream/{searched['model_version']}"
    blocks = PrivacyLedger(ledger).blocks("digits-stream")
    assert all(b.charges == 2 and b.committed_epsilon <= yaml.safe_load((EXAMPLES / "digits_stream.yaml").read_text())
               ["budget"]["lifetime_epsilon"] for b in blocks)


def test_a_search_scored_on_the_test_rows_says_its_test_score_is_biased(tiny_spec_dict, tmp_path, monkeypatch, capsys):
    """The winner chosen by the test rows reports a test accuracy biased by that choice: the command says so,
    and how to get one the selection did not see; scored on public rows, it says nothing of the kind."""
    result = {"winner": {"optimizer.lr": 0.02}, "score": 0.9, "eval/accuracy": 0.9, "eval/loss": 0.3,
              "guarantee": "(2, 1e-05)-DP", "noise_multiplier": 9.0, "tracking_uri": f"sqlite:///{tmp_path / 'm.db'}",
              "experiment_id": "1", "run_id": "r", "parent_run_id": "p"}
    monkeypatch.setattr(tune_flow, "private_tune", lambda **_: result)
    for split, said in (("test", True), ("public", False)):
        d = _tune_spec(tiny_spec_dict, tmp_path, score={"metric": "accuracy", "split": split})
        path = tmp_path / f"{split}.yaml"
        path.write_text(specs.dump_yaml(specs.spec_from_dict(d)))
        assert main(["tune", str(path)]) == 0
        out = capsys.readouterr().out
        assert ("note: the candidates were scored on the test rows, so the winner's test accuracy is the best of K "
                "noisy estimates and biased in its favour" in out) == said, out


def test_a_subflow_of_a_deployments_run_is_charged_as_the_deployments_run(prefect_server):
    """A rehearsal's pick trains in a private-train subflow: on a team's worker, the subflow must be the
    deployment's run too (its ledger the worker's). Prefect hands a deployment's id to its nested flows; privzo's
    test of a deployment's run reads it there."""
    import uuid as uuid_module

    from prefect import flow
    from prefect.context import _deployment_id  # what Prefect's engine sets for a deployment's flow run

    from flows.worker_config import deployment_run

    @flow
    def nested() -> bool:
        return deployment_run()

    @flow
    def outer() -> tuple:
        return deployment_run(), nested()

    assert outer() == (False, False)
    token = _deployment_id.set(uuid_module.uuid4())
    try:
        assert outer() == (True, True)
    finally:
        _deployment_id.reset(token)


def test_nothing_a_ray_worker_runs_is_defined_in_a_deployments_entrypoint_file():
    """A deployment's run loads its entrypoint file by path, as a top-level module named after the file (flows/tune.py
    as ``tune``), and Ray pickles a function by its module's name: one defined there reaches a worker as
    ``tune.fn``, which no worker can import. So no function or class an entrypoint file defines is handed to Ray
    (each_on_ray, ray.remote, .remote, or as a Ray backend's assemble)."""
    import ast

    import yaml

    from tests.conftest import ROOT

    entrypoints = {d["entrypoint"].split(":")[0] for d in
                   yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())["deployments"]}
    assert "flows/tune.py" in entrypoints and "flows/private_train.py" in entrypoints
    handed = []
    for path in sorted(entrypoints):
        tree = ast.parse((ROOT / path).read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
            if name not in ("each_on_ray", "remote", "RayBackend"):
                continue
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                handed += [(path, n.id) for n in ast.walk(arg) if isinstance(n, ast.Name) and n.id in defined]
    assert handed == []

"""Runs on blocks (data.blocks with budget.window): the window comes from the schedule and the calendar only,
rows keep the block they were first seen in, a person's rows stay in their first block, and a nightly run
charges only the blocks it reads, so new days bring budget of their own."""
import copy
import datetime as dt

import pandas as pd
import pytest
import torch

import specs
from components.data import load_sklearn
from flows.window import BlockView, Window
from flows.ledger import BudgetExceeded, DatasetTerms, PrivacyLedger, Reservation, WindowRead
from flows.record.tracking_names import DP_EPSILON, DP_MODEL_EPSILON, DP_MODEL_RUNS, PRIVZO_BLOCKS
from tests.conftest import ledger_of

START = dt.date(2026, 11, 1)
PER_DAY = 120


def write_stream(path, days, persons=False, restamp=None):
    """digits as a file that grew by PER_DAY rows a day from START: an ``arrived`` date per row (and a
    ``patient`` per pair of rows, with ``persons``); ``restamp``: row positions written with that date instead."""
    table = load_sklearn("digits")
    n = days * PER_DAY
    frame = pd.DataFrame(table.features[:n], columns=[f"px{i}" for i in range(64)])
    frame["digit"] = table.labels[:n]
    frame["arrived"] = [(START + dt.timedelta(days=i // PER_DAY)).isoformat() for i in range(n)]
    if persons:  # patient k's rows arrive on day k % days and on the last day written
        frame["patient"] = [f"p{i % PER_DAY}" for i in range(n)]
    for row, day in (restamp or {}).items():
        frame.loc[row, "arrived"] = day.isoformat()
    frame.to_csv(path, index=False)
    return path


def stream_spec(tmp_path, window=3, persons=False, lifetime=3.0, epsilon=1.0):
    return {
        "name": "visits", "seed": 5,
        "data": {"source": {"kind": "file", "path": str(tmp_path / "visits.csv"), "label": "digit",
                            "classes": list(range(10))},
                 "split": {"kind": "hashed", "public": 0.05, "test": 0.2},
                 "blocks": {"arrival": "arrived", "period": "day",
                            **({"person": "patient", "declared_persons": 100} if persons
                               else {"declared_private_rows": 100})}},
        "model": {"kind": "linear"},
        "estimator": {"kind": "two_point", "queries": 2, "smoothing": 1e-3},
        "mechanism": {"kind": "gaussian", "clip": 2.0},
        "privacy": {"epsilon": epsilon, "delta": 1e-5, "accountant": "rdp"},
        "sampling": {"kind": "poisson", "expected_batch_size": 32},
        "optimizer": {"kind": "sgd", "lr": 0.02, "steps": 20},
        "tracking": {"log_every": 20},
        "budget": {"dataset": "visits", "lifetime_epsilon": lifetime, "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
                   "window": {"blocks": window}},
    }


def night(day: int) -> dt.datetime:
    return dt.datetime.combine(START + dt.timedelta(days=day), dt.time(2), tzinfo=dt.timezone.utc)


def _table(spec):
    from components.builders import _table

    return _table(spec.data.source, None, None, spec.data.blocks)[0]


def test_the_window_is_the_last_sealed_periods_whatever_the_rows_hold(tmp_path):
    """The window is a function of the spec and the night alone; changing only private rows' contents changes
    neither it nor which rows fall in it."""
    write_stream(tmp_path / "visits.csv", days=6)
    spec = specs.spec_from_dict(stream_spec(tmp_path))
    window = Window.for_spec(spec, night(5))
    assert window.blocks == ("2026-11-03", "2026-11-04", "2026-11-05") and window.next_block == "2026-11-06"
    assert spec.data.declared_private_rows == 300  # N: 100 declared a block, 3 blocks
    chosen = BlockView(spec, window, ledger_of(spec)).select(_table(spec))
    assert list(chosen) == list(range(2 * PER_DAY, 5 * PER_DAY))  # days 3..5 of the file (0-based 2..4)

    frame = pd.read_csv(tmp_path / "visits.csv")
    frame.loc[frame.index[::2], "px10"] += 3.0  # other contents, the same arrivals
    frame.to_csv(tmp_path / "visits.csv", index=False)
    again = BlockView(spec, Window.for_spec(spec, night(5)), ledger_of(spec))
    assert again.window == window and list(again.select(_table(spec))) == list(chosen)
    # by week and by month too: the calendar, not the data
    assert Window.for_spec(specs.spec_from_dict({**stream_spec(tmp_path), "data": {
        **stream_spec(tmp_path)["data"], "blocks": {"arrival": "arrived", "period": "week",
                                                    "declared_private_rows": 500}}}), night(5)).blocks == \
        ("2026-W42", "2026-W43", "2026-W44")


def test_rows_written_again_with_a_new_date_keep_their_block(tmp_path):
    """A run records the block of every row of a sealed period it saw; re-stamping those rows later does not
    move them into a new (unspent) block."""
    write_stream(tmp_path / "visits.csv", days=4)
    spec = specs.spec_from_dict(stream_spec(tmp_path, window=1))
    view = BlockView(spec, Window.for_spec(spec, night(4)), ledger_of(spec))
    chosen = view.select(_table(spec))
    PrivacyLedger(spec.budget.ledger).reserve(Reservation(
        terms=DatasetTerms("visits", 3.0, 1e-5, "rdp", "add_remove"), planned=_event(), steps=20,
        fingerprint="f" * 64, run_name="night 4", window=WindowRead(view.block_terms(), row_blocks=view.seen_rows),
        block_terms=False))
    assert list(chosen) == list(range(3 * PER_DAY, 4 * PER_DAY))
    # the next night, day 4's rows are written again dated day 5, beside day 5's own rows
    write_stream(tmp_path / "visits.csv", days=6, restamp={i: START + dt.timedelta(days=4)
                                                          for i in range(3 * PER_DAY, 4 * PER_DAY)})
    view = BlockView(spec, Window.for_spec(spec, night(5)), ledger_of(spec))
    assert view.window.blocks == ("2026-11-05",)
    assert list(view.select(_table(spec))) == list(range(4 * PER_DAY, 5 * PER_DAY))  # day 5's own rows only


def test_a_persons_later_rows_stay_in_the_block_of_their_first_arrival(tmp_path):
    write_stream(tmp_path / "visits.csv", days=3, persons=True)
    spec = specs.spec_from_dict(stream_spec(tmp_path, window=1, persons=True))
    # every patient first arrived on day 1: day 2's and 3's rows belong to that block
    first = BlockView(spec, Window.for_spec(spec, night(1)), ledger_of(spec))
    assert list(first.select(_table(spec))) == list(range(3 * PER_DAY))
    later = BlockView(spec, Window.for_spec(spec, night(3)), ledger_of(spec))
    assert list(later.select(_table(spec))) == []  # nobody first arrived on day 3
    assert len(set(first.seen_persons.values())) == 1 and len(first.seen_persons) == PER_DAY


def test_a_window_with_budget_passes_over_spent_blocks_reading_no_row(tmp_path):
    """kind with_budget: the newest W sealed days since the stream began that still have room for the run.
    The choice reads the ledger and the calendar only: it is made with the data file absent."""
    from components.builders import planned_before_rows

    raw = stream_spec(tmp_path, window=3)
    raw["budget"]["window"] = {"kind": "with_budget", "blocks": 3, "since": START.isoformat()}
    spec = specs.spec_from_dict(raw)
    assert spec.data.declared_private_rows == 300  # N is declared for W blocks, however many are chosen
    planned = planned_before_rows(spec)  # no file at tmp_path / "visits.csv": no row is read
    assert Window.for_spec(spec, night(5), planned, ledger_of(spec)).blocks == (
        "2026-11-03", "2026-11-04", "2026-11-05")
    ledger = PrivacyLedger(spec.budget.ledger)
    for day in ("2026-11-04", "2026-11-05"):  # spent: a run of epsilon 2.95 (of 3) on each
        ledger.reserve(Reservation(
            terms=DatasetTerms("visits", 3.0, 1e-5, "rdp", "add_remove"), planned=_event(1.2), steps=20,
            fingerprint="f" * 64, run_name="earlier", window=WindowRead(_terms(spec, [day])), block_terms=False))
    window = Window.for_spec(spec, night(5), planned, ledger_of(spec))
    assert window.blocks == ("2026-11-01", "2026-11-02", "2026-11-03") and window.next_block == "2026-11-06"
    only_two_ended = Window.for_spec(spec, night(2), planned, ledger_of(spec))
    assert only_two_ended.blocks == ("2026-11-01", "2026-11-02")
    for day in ("2026-11-01", "2026-11-02", "2026-11-03"):
        ledger.reserve(Reservation(
            terms=DatasetTerms("visits", 3.0, 1e-5, "rdp", "add_remove"), planned=_event(1.2), steps=20,
            fingerprint="f" * 64, run_name="earlier", window=WindowRead(_terms(spec, [day])), block_terms=False))
    with pytest.raises(BudgetExceeded, match=r"^budget.lifetime_epsilon: block '2026-11-05' of dataset 'visits' "
                                             r"cannot take this run .* block '2026-11-06' brings budget of its own"):
        Window.for_spec(spec, night(5), planned, ledger_of(spec))
    assert Window.for_spec(spec, night(7), planned, ledger_of(spec)).blocks == ("2026-11-06", "2026-11-07")


def test_budget_show_with_the_spec_marks_the_next_window_and_the_retired_blocks(tmp_path, capsys):
    import yaml

    from flows.cli import main

    raw = stream_spec(tmp_path, window=2)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    spec = specs.spec_from_dict(raw)
    ledger = PrivacyLedger(spec.budget.ledger)
    for days in (["2026-11-01", "2026-11-02"], ["2026-11-02", "2026-11-03"]):
        ledger.reserve(Reservation(
            terms=DatasetTerms("visits", 3.0, 1e-5, "rdp", "add_remove"), planned=_event(), steps=20,
            fingerprint="f" * 64, run_name="night", window=WindowRead(_terms(spec, days)), block_terms=False))
    assert main(["budget", "show", "visits", "--ledger", spec.budget.ledger, "--spec", str(tmp_path / "spec.yaml"),
                 "--as-of", "2026-11-05T02:00:00+00:00"]) == 0
    out = capsys.readouterr().out
    states = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("2026-11-0")}
    assert states == {"2026-11-01": "retired", "2026-11-02": "retired", "2026-11-03": "next"}
    assert "the next run of visits (as of 2026-11-05T02:00:00+00:00) reads 2 blocks: 2026-11-03, 2026-11-04" in out
    assert main(["budget", "show", "visits", "--ledger", spec.budget.ledger, "--spec", str(tmp_path / "spec.yaml"),
                 "--as-of", "yesterday"]) == 2
    assert capsys.readouterr().out == ""  # a bad flag prints nothing but its one line (on stderr)
    # the spec of runs charged to no ledger (no budget section) says so, as does a dataset the ledger lacks
    from tests.conftest import EXAMPLES

    unbudgeted = EXAMPLES / "digits_dpzero.yaml"
    assert main(["budget", "show", "visits", "--ledger", spec.budget.ledger, "--spec", str(unbudgeted)]) == 2
    assert capsys.readouterr().err.strip() == (f"privzo: error: --spec: {unbudgeted} has no budget section: its runs "
                                               "are not charged to a ledger")
    assert main(["budget", "history", "vistis", "--ledger", spec.budget.ledger]) == 2
    assert capsys.readouterr().err.startswith("privzo: error: DATASET: no dataset 'vistis' in sqlite:///")


def test_a_night_on_blocks_runs_on_ray_workers_as_it_runs_locally(prefect_server, tmp_path, mlflow_db, monkeypatch):
    """With execution.backend ray, a person-level night on blocks: the driver chooses the window's rows from the
    ledger, each worker reads them again (the window's positions, no ledger) and must match their ordered digest;
    the run commits, and the ledger's blocks and charges equal the same night run locally: the same planned and
    executed events, and (with the noise and the sampling drawn from one fixed seed on both sides, the driver's
    generators) the same released weights to 1e-6, the workers summing their shares in another order. A worker
    that reads other rows (the file changed between the driver's read and its own) fails the digest."""
    import ray

    import components.builders as builders
    from components.builders import build_replica, load_data
    from components.randomness import private_generator
    from flows.private_train import private_train
    from flows.record.transcript import load_weights
    from flows.window import BlockView, Window

    monkeypatch.chdir(tmp_path)
    # the tests' fixed private generators on both sides: otherwise each run draws its noise from the OS
    monkeypatch.setattr(builders, "private_generator", lambda seed=None: private_generator(11 if seed is None else seed))
    write_stream(tmp_path / "visits.csv", days=4, persons=True)
    spec = stream_spec(tmp_path, window=2, persons=True)
    spec["tracking"]["uri"] = mlflow_db
    spec["privacy"]["noise"] = "fast"  # a seedable generator (secure noise comes from the OS's CSPRNG)
    local = copy.deepcopy(spec)
    local["budget"]["ledger"] = f"sqlite:///{tmp_path / 'ledger-local.db'}"
    on_ray = copy.deepcopy(spec)
    on_ray["execution"] = {"backend": "ray", "workers": 2}
    try:
        ran = private_train(spec=copy.deepcopy(on_ray), as_of=night(2).isoformat())
        here = private_train(spec=copy.deepcopy(local), as_of=night(2).isoformat())
    finally:
        ray.shutdown()
    assert ran["steps"] == here["steps"] and ran["epsilon"] == pytest.approx(here["epsilon"], rel=1e-12)
    ledgers = [PrivacyLedger.open(d["budget"]["ledger"]) for d in (on_ray, local)]
    assert [[(b.block, b.charges, round(b.committed_epsilon, 12)) for b in g.blocks("visits")] for g in ledgers] == \
        [[(b.block, b.charges, round(b.committed_epsilon, 12)) for b in ledgers[1].blocks("visits")]] * 2
    charges = [ledger.history("visits") for ledger in ledgers]
    assert [(c.status, c.steps_run, c.planned, c.executed, c.blocks) for c in charges[0]] == \
        [(c.status, c.steps_run, c.planned, c.executed, c.blocks) for c in charges[1]]
    weights = [torch.cat([p.detach().flatten() for p in load_weights(f"models:/visits/{r['model_version']}",
                                                                      mlflow_db).parameters()]) for r in (ran, here)]
    assert ran["model_version"] != here["model_version"] and float((weights[0] - weights[1]).abs().max()) <= 1e-6

    resolved = specs.spec_from_dict(copy.deepcopy(on_ray))
    view = BlockView(resolved, Window.for_spec(resolved, night(2)), ledger_of(resolved))
    driver = load_data(resolved, view.select)
    digest, _ = build_replica(resolved.model_dump(mode="json"), driver.window_rows)
    assert digest == driver.ordered_digest  # the worker's read of the window
    frame = pd.read_csv(tmp_path / "visits.csv")
    frame.loc[driver.window_rows.positions[0], "px10"] += 1.0  # the source changed under the run
    frame.to_csv(tmp_path / "visits.csv", index=False)
    assert build_replica(resolved.model_dump(mode="json"), driver.window_rows)[0] != driver.ordered_digest


def test_a_night_on_blocks_whose_rows_change_under_its_ray_workers_fails_before_any_step_and_charges_nothing(
        prefect_server, tmp_path, mlflow_db, monkeypatch):
    """The window's rows change between the driver's read and its Ray workers' (a row of the window rewritten
    in the file): the workers' ordered digest differs, so the night fails in one line before any private
    query, its reservation is aborted (nothing composed on any block), and the next night runs."""
    import ray

    from components.runtime.ray_backend import DataChanged, RayBackend
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    write_stream(tmp_path / "visits.csv", days=4, persons=True)
    spec = stream_spec(tmp_path, window=2, persons=True)
    spec["tracking"]["uri"] = mlflow_db
    spec["execution"] = {"backend": "ray", "workers": 2}
    from components.builders import load_data

    resolved = specs.spec_from_dict(copy.deepcopy(spec))
    window = load_data(resolved, BlockView(resolved, Window.for_spec(resolved, night(2)), ledger_of(resolved)).select)
    real = RayBackend.__init__

    def rows_change_first(self, *args, **kwargs):
        frame = pd.read_csv(tmp_path / "visits.csv")
        frame.loc[list(window.window_rows.positions), "px10"] += 1.0  # the window's rows, after the driver read them
        frame.to_csv(tmp_path / "visits.csv", index=False)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RayBackend, "__init__", rows_change_first)
    try:
        with pytest.raises(DataChanged, match=r"^data\.source: a Ray worker loaded different private or public rows "
                                              r"than the driver \(on node [^\n]*every node must read the same rows$"):
            private_train(spec=copy.deepcopy(spec), as_of=night(2).isoformat())
        ledger = ledger_of(specs.spec_from_dict(copy.deepcopy(spec)))
        (charge,) = ledger.history("visits")
        assert charge.status == "aborted" and charge.steps_run in (0, None)
        assert all(b.charges == 0 and b.committed_epsilon == 0.0 for b in ledger.blocks("visits"))
        monkeypatch.setattr(RayBackend, "__init__", real)
        ran = private_train(spec=copy.deepcopy(spec), as_of=night(2).isoformat())
    finally:
        ray.shutdown()
    assert ran["steps"] > 0 and [c.status for c in ledger.history("visits")].count("committed") == 1


def test_a_partitioned_folder_gives_each_row_its_files_period(tmp_path):
    """A folder of files named by period (visits/2026-11-03.csv ...) falls into the same blocks as one file
    with an arrival column; a file not named by a period is refused in one line."""
    write_stream(tmp_path / "visits.csv", days=5)
    frame = pd.read_csv(tmp_path / "visits.csv")
    (tmp_path / "visits").mkdir()
    for day, rows in frame.groupby("arrived"):
        rows.drop(columns="arrived").to_csv(tmp_path / "visits" / f"{day}.csv", index=False)
    (tmp_path / "visits" / "_SUCCESS").write_text("")  # a writer's mark, passed over
    raw = stream_spec(tmp_path)
    by_column = specs.spec_from_dict(raw)
    raw["data"]["source"]["path"] = str(tmp_path / "visits")
    raw["data"]["blocks"] = {"partitioned": True, "period": "day", "declared_private_rows": 100}
    by_file = specs.spec_from_dict(raw)
    window = Window.for_spec(by_file, night(5))
    assert list(BlockView(by_file, window, ledger_of(by_file)).select(_table(by_file))) == \
        list(BlockView(by_column, window, ledger_of(by_column)).select(_table(by_column))) == \
        list(range(2 * PER_DAY, 5 * PER_DAY))
    (tmp_path / "visits" / "notes.csv").write_text("x\n1\n")
    with pytest.raises(ValueError, match=r"^data.source.path: 'notes.csv' in .* is not named by a day \(e.g. "
                                         r"2026-11-27.csv\); name each file by the day its rows arrived in"):
        _table(by_file)
    with pytest.raises(specs.SpecError, match="arrival: give the arrival column, or partitioned: true"):
        specs.spec_from_dict({**raw, "data": {**raw["data"], "blocks": {"arrival": "arrived", "partitioned": True,
                                                                       "declared_private_rows": 100}}})


def _terms(spec, days):
    from flows.window import _terms as terms

    return terms(spec, days)


def _event(sigma=2.0):
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(sigma)), 20)


def test_nightly_runs_on_a_window_go_on_as_days_arrive(prefect_server, tmp_path, mlflow_db, monkeypatch):
    """Nights 3..8 on a window of 2 days, lifetime room for two runs a block: each night charges its two
    blocks only, every block stays within its lifetime, and the run's rows are those blocks' only. One ledger
    for the whole dataset: the old one (no blocks) would have refused from the third night on."""
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    d = stream_spec(tmp_path, window=2, lifetime=1.6, epsilon=1.0)
    d["tracking"]["uri"] = mlflow_db
    d["optimizer"]["init"] = "latest_registered"  # each night continues the last model
    for day in range(3, 9):
        write_stream(tmp_path / "visits.csv", days=day + 1)  # the day in progress is in the file already
        result = private_train(spec=copy.deepcopy(d), as_of=night(day).isoformat())
        assert result["model_version"] == str(day - 2)
    ledger = PrivacyLedger(d["budget"]["ledger"])
    blocks = {b.block: b for b in ledger.blocks("visits")}
    assert sorted(blocks) == [f"2026-11-{k:02d}" for k in range(2, 9)]
    assert all(b.epsilon <= 1.6 for b in blocks.values())
    assert [blocks[f"2026-11-{k:02d}"].charges for k in range(2, 9)] == [1, 2, 2, 2, 2, 2, 1]
    assert ledger.spent("visits") <= 1.6 and len(ledger.history("visits")) == 6
    # a seventh run on night 8 again: block 11-07 (its third) is full, and the refusal says when budget comes
    with pytest.raises(BudgetExceeded, match=r"^budget.lifetime_epsilon: block '2026-11-07' of dataset 'visits' "
                                             r"cannot take this run .*; runs from 2026-11-10 \(UTC\) on read blocks "
                                             r"after '2026-11-07', the newest block of this window without room"):
        private_train(spec=copy.deepcopy(d), as_of=night(8).isoformat())
    import mlflow

    client = mlflow.MlflowClient(mlflow_db)
    (run,) = client.search_runs([client.get_experiment_by_name("visits").experiment_id],
                                "attributes.status = 'FINISHED'", max_results=1, order_by=["attributes.start_time DESC"])
    assert run.data.params["data.declared_private_rows"] == "200"
    assert float(run.data.tags[DP_EPSILON]) <= 1.0 and run.data.tags[PRIVZO_BLOCKS] == "2026-11-07,2026-11-08"
    # the model of six runs: per block the composition of the runs that read it, the largest block's
    version = client.get_model_version("visits", "6")
    assert float(version.tags[DP_MODEL_EPSILON]) == pytest.approx(ledger.spent("visits"), rel=1e-5)
    assert float(version.tags[DP_MODEL_EPSILON]) <= 1.6 and float(version.tags[DP_MODEL_RUNS]) == 6
    assert "the largest over the 7 blocks of data its 6 runs read" in version.description


def test_a_resumed_run_reads_the_window_it_started_with(prefect_server, tmp_path, mlflow_db, monkeypatch):
    """Killed before its commit and resumed days later (more rows in the file, another calendar): the run reads
    the window its checkpoint was written for, so the same private rows, and finishes its own charge."""
    import sqlalchemy as sa

    from flows.checkpoints import CheckpointStore
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    d = stream_spec(tmp_path, window=2)
    d["tracking"]["uri"] = mlflow_db
    d["checkpoint"] = {"dir": str(tmp_path / "checkpoints"), "keep": True}
    write_stream(tmp_path / "visits.csv", days=5)
    first = private_train(spec=copy.deepcopy(d), as_of=night(4).isoformat())
    store = CheckpointStore(d["checkpoint"]["dir"], d["name"], first["run_key"])
    (store.dir / "finished").unlink()  # as if killed after its last chunk, before the commit
    ledger = PrivacyLedger(d["budget"]["ledger"])
    (charge,) = ledger.history("visits")
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE privzo_charges SET status = 'reserved' WHERE id = :i"), {"i": charge.id})
    assert store.load()["window_as_of"] == night(4).isoformat()
    write_stream(tmp_path / "visits.csv", days=9)  # four more days arrived meanwhile
    resumed = private_train(spec=copy.deepcopy(d), resume=first["run_key"])  # today: no as_of
    assert resumed["run_key"] == first["run_key"]
    assert {b.block for b in ledger.blocks("visits")} == {"2026-11-03", "2026-11-04"}
    (charge,) = ledger.history("visits")
    assert charge.status == "committed"


def test_simulate_plays_nights_of_the_shipped_stream_example(prefect_server, tmp_path, monkeypatch):
    """specs/examples/digits_stream.yaml as `privzo budget simulate` plays it: the stream grows each night, each
    night's run reads its window of 7 days and commits, and the blocks hold one charge per night that read them."""
    from flows.simulate import simulate
    from tests.conftest import EXAMPLES

    monkeypatch.chdir(tmp_path)
    played = simulate(str(EXAMPLES / "digits_stream.yaml"), nights=2, folder=tmp_path / "sim")
    assert [(n.night, n.status, n.window) for n in played["nights"]] == [
        ("2026-09-08", "committed", "2026-09-01 .. 2026-09-07"), ("2026-09-09", "committed", "2026-09-02 .. 2026-09-08")]
    assert played["nights"][0].epsilon <= 1.0 and played["nights"][1].model_epsilon > played["nights"][0].model_epsilon
    charges = {b.block: b.charges for b in played["blocks"]}
    assert charges == {**{f"2026-09-0{d}": 2 for d in range(2, 8)}, "2026-09-01": 1, "2026-09-08": 1}
    assert played["spent"] <= played["lifetime"]
    # everything in its folder: the runs' artifacts too, none in the working directory
    assert not (tmp_path / "mlruns").exists() and len(list((tmp_path / "sim" / "mlruns").glob("*/*/artifacts"))) == 2
    # the example is person level: one patient, whatever their visits, is one Poisson-sampled unit of
    # sensitivity C at rate expected_batch_size / (declared persons x window), so a patient's loss on a block
    # read by k runs is k runs' composition; computed here from dp-accounting alone, from the spec's public
    # figures and the sigma the runs logged
    import dp_accounting
    import mlflow
    import yaml

    raw = yaml.safe_load((EXAMPLES / "digits_stream.yaml").read_text())
    rate = raw["sampling"]["expected_batch_size"] / (raw["data"]["blocks"]["declared_persons"]
                                                     * raw["budget"]["window"]["blocks"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'sim' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    (sigma,) = {float(r.data.params["mechanism.noise_multiplier"]) for r in runs}
    (steps,) = {int(r.data.params["optimizer.steps"]) for r in runs}

    def per_person(k):
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), k * steps)
        return accountant.get_epsilon(raw["privacy"]["delta"])

    for block in played["blocks"]:
        assert block.committed_epsilon == pytest.approx(per_person(block.charges), rel=1e-6), block.block
    assert played["nights"][1].model_epsilon == pytest.approx(per_person(2), rel=1e-6)


def test_the_simulate_command_prints_the_nights_and_the_blocks(prefect_server, tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import EXAMPLES, ROOT

    out = subprocess.run([sys.executable, "-m", "flows.cli", "budget", "simulate", str(EXAMPLES / "digits_stream.yaml"),
                          "--nights", "1", "--out", str(tmp_path / "sim")], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PREFECT_API_URL": prefect_server, "PYTHONPATH": str(ROOT)},
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "| 2026-09-08 | committed | 2026-09-01 .. 2026-09-07 | 1 | 1 |" in out.stdout
    assert "| 2026-09-07 | 1 | 1 | 4 |" in out.stdout
    assert out.stdout.rstrip().endswith("1 of 1 nights committed; the largest block's epsilon 1 of its lifetime 4")
    assert "Downloading artifacts" not in out.stdout + out.stderr
    bad = subprocess.run([sys.executable, "-m", "flows.cli", "budget", "simulate", str(EXAMPLES / "digits_stream.yaml"),
                          "--nights", "0"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "privzo: error: --nights: 0 must be at least 1"

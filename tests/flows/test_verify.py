"""``flows.record.verify``: a registered version checked against the privacy ledger and its run. A fresh run passes every
check; changed weights, a changed dp.epsilon tag, a rewritten description and a version registered by hand each
fail with one line naming what."""
import copy
import os

import mlflow
import numpy as np
import pytest
import torch

from tests.flows.forging import dress_as
from flows.record.tracking_names import DP_EPSILON, PRIVZO_INIT

pytestmark = pytest.mark.e2e

NAME = "tiny-digits"
ROWS = np.zeros((2, 64), dtype="float32")  # what privzo's register_model logs as the input example


def _charged_spec(mlflow_schema, folder, steps: int):
    """The tiny spec at epsilon 1 for ``steps`` steps, tracked in a new MLflow store and charged to a new SQLite
    ledger in ``folder``; (spec, ledger URL)."""
    from tests.conftest import TINY, copy_mlflow_store

    spec = copy.deepcopy(TINY)
    spec["tracking"]["uri"] = copy_mlflow_store(mlflow_schema, folder / "mlflow.db")
    spec["optimizer"]["steps"] = steps
    spec["privacy"]["epsilon"] = 1.0
    ledger = f"sqlite:///{folder / 'ledger.db'}"
    spec["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 5.0, "ledger": ledger}
    return spec, ledger


@pytest.fixture(scope="module")
def trained(prefect_server, mlflow_schema, tmp_path_factory):
    """One tiny run (20 steps) charged to a SQLite ledger, its model registered as version 1; each test adds
    the versions it needs and leaves version 1 as the run registered it."""
    from flows.private_train import private_train

    tmp_path = tmp_path_factory.mktemp("verify")
    spec, ledger = _charged_spec(mlflow_schema, tmp_path, steps=20)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        result = private_train(spec=spec)
    finally:
        os.chdir(cwd)
    assert result["model_version"] == "1"
    return result, spec["tracking"]["uri"], ledger, tmp_path


@pytest.fixture
def client(trained, monkeypatch):
    monkeypatch.chdir(trained[3])
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's registry looks a version's logged model up through the process's tracking URI, not the
    # client's: another test run in this worker since the module's run may have set it elsewhere
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(trained[1])
    yield mlflow.MlflowClient(trained[1])
    mlflow.set_tracking_uri(previous)


def _copy_of_version_1(client) -> str:
    """A new version of the same logged model and run, with version 1's tags and description."""
    first = client.get_model_version(NAME, "1")
    copied = client.create_model_version(NAME, first.source, run_id=first.run_id, tags=first.tags,
                                         description=first.description,
                                         **({"model_id": first.model_id} if getattr(first, "model_id", None) else {}))
    return str(copied.version)


def _continuing(uri: str, ledger: str) -> dict:
    """The tiny spec at epsilon 1 for 20 steps, continuing the latest registered version, on the module's store
    and ledger."""
    from tests.conftest import TINY

    again = copy.deepcopy(TINY)
    again["tracking"]["uri"] = uri
    again["optimizer"].update(steps=20, init="latest_registered")
    again["privacy"]["epsilon"] = 1.0
    again["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 5.0, "ledger": ledger}
    return again


def _statuses(report):
    return {c.name: c.status for c in report.checks}


def test_a_fresh_run_passes_every_check(trained, client):
    from flows.record.verify import CHECKS, verify

    result, uri, ledger, _ = trained
    report = verify(NAME, "1", tracking_uri=uri)
    assert report.passed, str(report)
    assert [c.name for c in report.checks] == list(CHECKS) and set(_statuses(report).values()) == {"ok"}
    assert report.first_mismatch is None and report.run_id == result["run_id"] and report.ledger_url == ledger
    assert report.headline() == f"{NAME} version 1: verified against ledger {ledger} and run {result['run_id']}"
    assert "bit for bit (CPU)" in report.checks[-1].detail
    assert verify(NAME, tracking_uri=uri).version == "1"  # the latest version, by default
    import contextlib
    import io

    from flows.record.verify import verify_command

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert verify_command(NAME, "1", tracking_uri=uri) == 0
    assert printed.getvalue() == str(report) + "\n" and len(printed.getvalue().splitlines()) == 1 + len(CHECKS)
    # the version says how to check it, and the command a user types does it
    assert f"Verify: `privzo verify {NAME} 1 --tracking-uri {uri}`" in client.get_model_version(NAME, "1").description
    from flows.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["verify", NAME, "1", "--tracking-uri", uri]) == 0
    assert printed.getvalue() == str(report) + "\n"


def test_weights_changed_after_registration_fail_the_replay(trained, client):
    """Other weights logged to a new version of the same run, carrying version 1's tags and description."""
    from flows.record.verify import verify

    result, uri, _, _ = trained
    model = mlflow.pytorch.load_model(client.get_model_version_download_uri(NAME, "1"))
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1e-3
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(run_id=result["run_id"]):
        info = mlflow.pytorch.log_model(model, name="model", registered_model_name=NAME, input_example=ROWS)
    version = str(info.registered_model_version)
    dress_as(client, NAME, version, client.get_model_version(NAME, "1"))

    report = verify(NAME, version, tracking_uri=uri)
    assert not report.passed
    statuses = _statuses(report)
    assert statuses.pop("weights") == "failed" and set(statuses.values()) == {"ok"}, str(report)
    assert report.first_mismatch.startswith(f"version {version}'s weights are not the replay of run "
                                            f"{result['run_id']}'s journal from its seeded initialisation")
    assert "differs by up to 0.001" in report.first_mismatch and "bit for bit" in report.first_mismatch
    assert report.headline() == f"{NAME} version {version}: FAILED: {report.first_mismatch}"


def test_a_changed_epsilon_tag_is_named(trained, client):
    from flows.record.verify import verify

    uri = trained[1]
    version = _copy_of_version_1(client)
    assert verify(NAME, version, tracking_uri=uri).passed  # the copy is version 1 again
    client.set_model_version_tag(NAME, version, DP_EPSILON, "2.5")
    report = verify(NAME, version, tracking_uri=uri)
    assert _statuses(report)["model guarantee"] == "failed"
    assert report.first_mismatch == (f"version {version}'s dp.epsilon tag says 2.5, the ledger's committed events of "
                                     "its 1 run compose to 1")
    import contextlib
    import io

    from flows.record.verify import verify_command

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert verify_command(NAME, version, tracking_uri=uri) == 1
    assert printed.getvalue().startswith(f"{NAME} version {version}: FAILED: {report.first_mismatch}\n")


def test_a_rewritten_description_is_named(trained, client):
    from flows.record.reporting import shown
    from flows.record.verify import verify

    uri = trained[1]
    version = _copy_of_version_1(client)
    description = client.get_model_version(NAME, version).description
    delta = shown(float(client.get_run(trained[0]["run_id"]).data.params["privacy.delta"]), 3)
    assert description.startswith(f"**Model guarantee:** (1, {delta})-DP")
    client.update_model_version(NAME, version, description=description.replace(f"(1, {delta})-DP",
                                                                               f"(0.5, {delta})-DP", 1))
    report = verify(NAME, version, tracking_uri=uri)
    assert _statuses(report)["model guarantee"] == "failed"
    assert report.first_mismatch == (f"the description of version {version} says (0.5, {delta})-DP, the ledger's "
                                     "committed events of its 1 run compose to 1")


def test_a_continued_model_is_checked_against_its_whole_lineage(trained, client):
    """A run that continues the latest version (a copy of version 1): its model's guarantee composes both runs'
    committed charges, and its weights replay from that version's."""
    from flows.private_train import private_train
    from flows.record.verify import verify

    result, uri, ledger, _ = trained
    start = _copy_of_version_1(client)
    second = private_train(spec=_continuing(uri, ledger))
    report = verify(NAME, second["model_version"], tracking_uri=uri)
    assert report.passed, str(report)
    assert client.get_run(second["run_id"]).data.tags[PRIVZO_INIT] == f"models:/{NAME}/{start}"
    assert "over 2 runs" in report.checks[3].detail and f"weights of models:/{NAME}/{start}" in report.checks[5].detail


def test_a_version_registered_by_hand_fails_saying_so(trained, client):
    """A model logged and registered with MLflow alone (no privzo run), and a version with no run at all."""
    from components.models import linear
    from flows.record.verify import verify

    uri = trained[1]
    mlflow.set_tracking_uri(uri)
    with mlflow.start_run() as run:
        info = mlflow.pytorch.log_model(linear(64, 10), name="model", registered_model_name="by-hand",
                                        input_example=ROWS)
    report = verify("by-hand", str(info.registered_model_version), tracking_uri=uri)
    assert not report.passed and report.checks[0].status == "failed"
    assert report.first_mismatch == (f"version 1 was registered by hand: its run {run.info.run_id} is not a privzo "
                                     "run (it logged no spec.yaml)")
    assert {c.status for c in report.checks[1:]} == {"not run"}

    client.create_model_version("by-hand", client.get_model_version_download_uri("by-hand", "1"))
    report = verify("by-hand", "2", tracking_uri=uri)
    assert report.first_mismatch.startswith("version 2 was registered by hand: it has no source run")


def test_a_ledger_without_the_charge_fails_naming_it(trained, client, tmp_path):
    from flows.ledger import PrivacyLedger
    from flows.record.verify import verify

    result, uri, _, _ = trained
    missing = f"sqlite:///{tmp_path / 'nowhere.db'}"
    report = verify(NAME, "1", tracking_uri=uri, ledger_url=missing)
    assert report.first_mismatch.startswith(f"ledger {missing} does not exist")
    assert not (tmp_path / "nowhere.db").exists()  # verify never creates a ledger
    other = f"sqlite:///{tmp_path / 'other.db'}"
    PrivacyLedger(other)
    report = verify(NAME, "1", tracking_uri=uri, ledger_url=other)
    assert report.first_mismatch == (f"run {result['run_id']} has no charge in ledger {other} (dataset "
                                     "'digits-patients'): nothing there records what it spent")


def test_an_unknown_version_is_an_error_and_the_hint_names_the_command(trained, client):
    from flows.record.reporting import verify_hint
    from flows.record.verify import verify

    with pytest.raises(ValueError, match="no version 99 of registered model 'tiny-digits'"):
        verify(NAME, "99", tracking_uri=trained[1])
    assert verify_hint(NAME, "3").startswith("Verify: `privzo verify tiny-digits 3` checks")
    assert "--tracking-uri 'sqlite:///a b.db'" in verify_hint(NAME, "3", "sqlite:///a b.db")
    # a version whose run no ledger charged is told what verify cannot pass, and how to load it, not a failing command
    uncharged = verify_hint(NAME, "3", "sqlite:///a b.db", charged=False)
    assert uncharged.startswith("Not charged to a privacy ledger (its spec has no budget section)")
    assert "privzo verify tiny-digits" not in uncharged and "`models:/tiny-digits/3`" in uncharged


def test_an_executed_event_rewritten_with_more_noise_is_caught_against_the_reservation(trained, client, tmp_path):
    """A worker with write access to the committed columns rewrites the executed event with 4x the noise (a far
    smaller epsilon) and the tags to match: the reservation's plan, which the run's params pin, gives it away."""
    import shutil

    import dp_accounting
    import sqlalchemy as sa

    from components.accountants import event_from_json, event_to_json
    from components.accountants.composed import scaled_noise
    from flows.record.verify import verify

    result, uri, ledger, folder = trained
    forged = tmp_path / "forged.db"
    shutil.copy(ledger.removeprefix("sqlite:///"), forged)
    engine = sa.create_engine(f"sqlite:///{forged}")
    with engine.begin() as conn:
        (row_id, executed), = conn.execute(sa.text("SELECT id, executed_event FROM privzo_charges WHERE run_id = :r"),
                                           {"r": result["run_id"]}).all()
        event = event_from_json(executed)
        assert isinstance(event, dp_accounting.SelfComposedDpEvent)
        conn.execute(sa.text("UPDATE privzo_charges SET executed_event = :e WHERE id = :i"),
                     {"e": event_to_json(scaled_noise(event, 4.0)), "i": row_id})
    engine.dispose()
    report = verify(NAME, "1", tracking_uri=uri, ledger_url=f"sqlite:///{forged}")
    assert _statuses(report)["ledger charge"] == "failed"
    assert report.first_mismatch == (f"run {result['run_id']}'s charge {row_id} in sqlite:///{forged} committed an "
                                     "event beyond the one it reserved: its releases are not the planned ones "
                                     "(noise, sampling or clip differ)")


def test_a_block_whose_stored_composition_was_emptied_fails_the_ledger_check(trained, client, tmp_path):
    """Emptying the block's stored composition (what admits later runs) left the charge as it was, so every
    check passed; the block is now recomposed from its charges and the difference named."""
    import shutil

    import sqlalchemy as sa

    from flows.record.verify import verify

    result, uri, ledger, folder = trained
    forged = tmp_path / "emptied.db"
    shutil.copy(ledger.removeprefix("sqlite:///"), forged)
    engine = sa.create_engine(f"sqlite:///{forged}")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE privzo_blocks SET committed_epsilon = 0"))
    engine.dispose()
    report = verify(NAME, "1", tracking_uri=uri, ledger_url=f"sqlite:///{forged}")
    assert _statuses(report)["ledger charge"] == "failed"
    assert report.first_mismatch.startswith("block 'all' of dataset 'digits-patients' stores epsilon 0 (its stored "
                                            "composition: ")
    assert report.first_mismatch.endswith(f"was changed outside privzo (sqlite:///{forged})")


def test_a_version_is_checked_against_the_teams_ledger_not_the_one_its_spec_names(trained, client, tmp_path,
                                                                                   monkeypatch):
    """A run charged to a ledger of its own choosing passes against that ledger, but in a team (its ledger in
    $PRIVZO_LEDGER_URL) verify reads the team's by default, which holds no charge for it."""
    from flows.ledger import PrivacyLedger
    from flows.record.verify import verify

    result, uri, _, _ = trained
    assert verify(NAME, "1", tracking_uri=uri).passed  # the spec's own ledger
    team = f"sqlite:///{tmp_path / 'team.db'}"
    PrivacyLedger(team)
    monkeypatch.setenv("PRIVZO_LEDGER_URL", team)
    report = verify(NAME, "1", tracking_uri=uri)
    assert report.first_mismatch == (f"run {result['run_id']} has no charge in ledger {team} (dataset "
                                     "'digits-patients'): nothing there records what it spent")


@pytest.mark.parametrize("kept", [3, 0])
def test_a_worker_committing_fewer_steps_than_it_ran_is_caught_by_the_journal(prefect_server, mlflow_schema,
                                                                              tmp_path, monkeypatch, kept):
    """A worker commits its own reservation with ``kept`` of the 12 steps it ran (0: "nothing ran"), the event
    cut to match, so the ledger and its blocks agree with each other; the journal still holds every step's
    releases, and verify names the two counts."""
    import dp_accounting

    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train
    from flows.record.verify import verify

    honest = PrivacyLedger.commit

    def commit(self, charge_id, executed, steps_run, run_id=None):
        cut = dp_accounting.NoOpDpEvent() if kept == 0 else dp_accounting.SelfComposedDpEvent(executed.event, kept)
        return honest(self, charge_id, cut, kept, run_id)

    monkeypatch.setattr(PrivacyLedger, "commit", commit)
    monkeypatch.chdir(tmp_path)
    spec, ledger = _charged_spec(mlflow_schema, tmp_path, steps=12)
    result = private_train(spec=spec)
    monkeypatch.setattr(PrivacyLedger, "commit", honest)
    assert PrivacyLedger(ledger).history("digits-patients")[0].steps_run == kept
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    report = verify(NAME, result["model_version"], tracking_uri=spec["tracking"]["uri"], ledger_url=ledger)
    assert not report.passed and _statuses(report)["weights"] == "failed"
    (weights,) = [c.detail for c in report.checks if c.name == "weights"]
    assert weights.startswith(f"run {result['run_id']}'s journal holds 24 entries over 12 steps")
    assert f"counts {kept} steps x 2 releases" in weights


def test_promote_sets_the_verified_alias_only_on_a_version_that_passes_against_the_teams_ledger(trained, client,
                                                                                                  tmp_path, capsys):
    """The owner's ``privzo verify --promote``: version 1 passes and gets ``verified`` (loadable as
    models:/NAME@verified); a forged version fails and does not take it; against a ledger that holds no charge
    for version 1 (another team's), version 1 fails and loses it. Without a ledger, --promote is refused."""
    from flows.ledger import PrivacyLedger
    from flows.record.verify import verify_command

    result, uri, ledger, _ = trained
    with pytest.raises(ValueError, match=r"^--promote: .* give that ledger with --ledger or \$PRIVZO_LEDGER_URL$"):
        verify_command(NAME, "1", tracking_uri=uri, promote=True)
    assert verify_command(NAME, "1", tracking_uri=uri, ledger_url=ledger, promote=True) == 0
    assert f"\npromoted: models:/{NAME}@verified is version 1 (" in capsys.readouterr().out
    assert str(client.get_model_version_by_alias(NAME, "verified").version) == "1"
    assert "@verified`" in client.get_model_version(NAME, "1").description
    forged = _copy_of_version_1(client)
    client.set_model_version_tag(NAME, forged, DP_EPSILON, "0.01")
    assert verify_command(NAME, forged, tracking_uri=uri, ledger_url=ledger, promote=True) == 1
    assert capsys.readouterr().out.endswith(f"not promoted: version {forged} does not get the 'verified' alias (it "
                                            "stays on version 1)\n")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    PrivacyLedger(other)
    assert verify_command(NAME, "1", tracking_uri=uri, ledger_url=other, promote=True) == 1
    assert capsys.readouterr().out.endswith("not promoted: version 1 lost the 'verified' alias "
                                            f"(models:/{NAME}@verified is unset)\n")
    assert "verified" not in client.get_registered_model(NAME).aliases


def test_a_start_named_twice_must_agree_back_to_a_seed_start(trained, client):
    """The weights replay from the version ``privzo.init`` names, the history composes from the run
    ``privzo.init_run_id`` names: a continued run whose two disagree (weights from a version trained outside
    the ledger, history from an honest run) fails the model guarantee check naming both."""
    from flows.private_train import private_train
    from flows.record.verify import verify
    from flows.record.tracking_names import PRIVZO_INIT_RUN_ID

    result, uri, ledger, _ = trained
    _copy_of_version_1(client)
    second = private_train(spec=_continuing(uri, ledger))
    assert verify(NAME, second["model_version"], tracking_uri=uri).passed
    experiment = client.get_run(result["run_id"]).info.experiment_id
    outside = client.create_run(experiment).info.run_id  # a run no ledger charged
    first = client.get_model_version(NAME, "1")
    rogue = client.create_model_version(NAME, first.source, run_id=outside,
                                        **({"model_id": first.model_id} if getattr(first, "model_id", None) else {}))
    client.set_tag(second["run_id"], PRIVZO_INIT, f"models:/{NAME}/{rogue.version}")
    report = verify(NAME, second["model_version"], tracking_uri=uri)
    assert _statuses(report)["model guarantee"] == "failed", str(report)
    assert f"started from models:/{NAME}/{rogue.version} (the weights replayed), whose run is {outside}, but composes " \
           f"its privacy history from run {result['run_id']}" in report.checks[3].detail
    client.set_tag(second["run_id"], PRIVZO_INIT, "seed")
    report = verify(NAME, second["model_version"], tracking_uri=uri)
    assert "says it started from the 'seed' but names start run" in report.checks[3].detail
    client.set_tag(second["run_id"], PRIVZO_INIT, f"models:/{NAME}/{second['model_version']}")
    client.set_tag(second["run_id"], PRIVZO_INIT_RUN_ID, second["run_id"])
    assert "lineage returns to itself" in verify(NAME, second["model_version"], tracking_uri=uri).checks[3].detail


def test_promote_needs_every_check_to_have_run(prefect_server, mlflow_schema, tmp_path, monkeypatch, capsys):
    """adam keeps no journal of its trajectory, so the weights check cannot run: verify reports it (rc 0), but
    --promote gives no ``verified`` alias, saying why."""
    from flows.private_train import private_train
    from flows.record.verify import verify_command

    spec, ledger = _charged_spec(mlflow_schema, tmp_path, steps=10)
    spec["name"] = "tiny-adam"
    spec["optimizer"] = {"kind": "adam", "lr": 0.01, "steps": 10}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    result = private_train(spec=spec)
    uri = spec["tracking"]["uri"]
    assert verify_command("tiny-adam", result["model_version"], tracking_uri=uri, ledger_url=ledger, promote=True) == 0
    out = capsys.readouterr().out
    assert "weights: not applicable" in out or "not applicable" in out
    assert out.rstrip().splitlines()[-1].startswith(f"not promoted: version {result['model_version']} passed what "
                                                    "could be checked, but its weights check could not run")
    assert "verified" not in mlflow.MlflowClient(uri).get_registered_model("tiny-adam").aliases


def test_verified_loads_only_the_bytes_and_the_version_its_owner_promoted(trained, client, capsys):
    """--promote records the version and every file's SHA-256 in the ledger (the owner's table); the consumer's
    loader loads them, and refuses in one line an alias moved outside the promotion or a file overwritten."""
    from flows.record.promotion import NotVerified, load_verified
    from flows.record.verify import verify_command

    result, uri, ledger, _ = trained
    assert verify_command(NAME, "1", tracking_uri=uri, ledger_url=ledger, promote=True) == 0
    capsys.readouterr()
    model = load_verified(NAME, ledger_url=ledger, tracking_uri=uri, flavor="pytorch")
    assert sum(p.numel() for p in model.parameters()) > 0
    moved = _copy_of_version_1(client)
    client.set_registered_model_alias(NAME, "verified", moved)  # as the worker's MLflow rights allow it
    with pytest.raises(NotVerified, match=rf"^models:/{NAME}@verified names version {moved}, but its owner promoted "
                                          r"version 1: the alias was moved outside"):
        load_verified(NAME, ledger_url=ledger, tracking_uri=uri)
    client.set_registered_model_alias(NAME, "verified", "1")
    from mlflow.artifacts import download_artifacts
    from pathlib import Path

    source = client.get_model_version(NAME, "1").source
    local = Path(download_artifacts(artifact_uri=source, tracking_uri=uri))
    stored = Path(mlflow.MlflowClient(uri).get_logged_model(source.removeprefix("models:/")).artifact_location
                  .removeprefix("file://"))
    victim = next(p for p in sorted(stored.rglob("*")) if p.is_file() and p.suffix in (".pt2", ".pth", ".pt"))
    original = victim.read_bytes()
    try:
        victim.write_bytes(original[:-8] + b"\0" * 8)  # other weights in place: the alias stays
        with pytest.raises(NotVerified, match=rf"^models:/{NAME}@verified \(version 1\): .* is not the bytes its owner "
                                              r"verified and promoted \(\d+ files? differ\); not loaded$"):
            load_verified(NAME, ledger_url=ledger, tracking_uri=uri)
    finally:
        victim.write_bytes(original)
        client.delete_registered_model_alias(NAME, "verified")
    assert local.exists()

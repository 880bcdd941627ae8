"""``tracking.register_as: transcript`` (flows/record/transcript.py): a two_point + sgd run registers its spec, journal and
public start in place of its weights; loading replays them to the weights the same spec registers in weights mode,
bit for bit on the CPU; the pyfunc predicts the same; ``privzo verify`` passes on it; it is a small fraction of the
weights; a spec asking for it where the journal is not the whole trajectory is refused in one line."""
import copy
import dataclasses
import json
import os
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from tests.flows.forging import dress_as
from flows.record.tracking_names import JOURNAL_ARTIFACT, PRIVZO_REGISTER, PRIVZO_TRANSCRIPT_BYTES, PRIVZO_WEIGHTS_BYTES

pytestmark = pytest.mark.e2e

NAME = "tiny-digits-transcript"


@pytest.fixture(scope="module")
def runs(prefect_server, mlflow_schema, tmp_path_factory):
    """The same 20-step spec run twice, charged to one ledger: version 1 registers the weights, version 2 the
    transcript. DP noise never repeats across real runs, so both runs draw from the tests' fixed private
    generators (as tests.conftest.fixed_loop): one spec, one trajectory. A 64-128 MLP (9,610 parameters): the
    weights are ~38 kB, which a transcript of 40 journal entries should undercut many times over."""
    from components import builders
    from components.randomness import private_generator
    from flows.private_train import private_train
    from tests.conftest import TINY, copy_mlflow_store

    tmp_path = tmp_path_factory.mktemp("transcript")
    spec = copy.deepcopy(TINY)
    spec["name"] = NAME
    spec["model"] = {"kind": "mlp", "hidden": [128]}
    spec["tracking"]["uri"] = copy_mlflow_store(mlflow_schema, tmp_path / "mlflow.db")
    spec["optimizer"]["steps"] = 20
    spec["privacy"]["epsilon"] = 1.0
    spec["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 5.0,
                      "ledger": f"sqlite:///{tmp_path / 'ledger.db'}"}
    original = builders.build_loop

    def build_loop(resolved, data, **kwargs):  # fresh fixed generators for each run
        return original(resolved, data, noise_generator=private_generator(11), sampling_generator=private_generator(12))

    results = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(builders, "build_loop", build_loop)
            for mode in ("weights", "transcript"):
                spec["tracking"]["register_as"] = mode
                results[mode] = private_train(spec=copy.deepcopy(spec))
    finally:
        os.chdir(cwd)
    assert (results["weights"]["model_version"], results["transcript"]["model_version"]) == ("1", "2")
    return results, spec["tracking"]["uri"], tmp_path


@pytest.fixture
def client(runs, monkeypatch):
    monkeypatch.chdir(runs[2])
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    return mlflow.MlflowClient(runs[1])


def _model_dir(client, version: str, where: Path) -> Path:
    return Path(mlflow.artifacts.download_artifacts(
        artifact_uri=client.get_model_version_download_uri(NAME, version), dst_path=str(where / f"v{version}"),
        tracking_uri=client.tracking_uri))


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_a_transcript_version_holds_no_weights_and_is_a_fraction_of_them(runs, client, tmp_path):
    from flows.record.transcript import TRANSCRIPT_FILE, transcript_in

    results, uri, _ = runs
    weights_dir, transcript_dir = _model_dir(client, "1", tmp_path), _model_dir(client, "2", tmp_path)
    # artifacts/module/: the weights (flows/record/served.py)
    assert (weights_dir / "artifacts" / "module").is_dir() and not (transcript_dir / "artifacts" / "module").exists()
    transcript = transcript_in(transcript_dir)
    assert transcript.run_id == results["transcript"]["run_id"] and transcript.start == "seed"
    assert len(transcript.journal) == 20 * 2 and transcript.directions_stream == "cpu-torch-v2"
    # the journal is the run's own
    logged = json.loads(Path(client.download_artifacts(transcript.run_id, JOURNAL_ARTIFACT,
                                                       str(tmp_path))).read_text())
    assert transcript.entries() == logged

    held = (transcript_dir / "artifacts" / TRANSCRIPT_FILE).stat().st_size
    weights = _bytes(weights_dir / "artifacts" / "module")  # the exported program (model.pt2)
    tags = client.get_model_version(NAME, "2").tags
    assert tags[PRIVZO_REGISTER] == "transcript" and int(tags[PRIVZO_TRANSCRIPT_BYTES]) == held
    assert int(tags[PRIVZO_WEIGHTS_BYTES]) == 9_610 * 4
    assert weights > 9 * held, (weights, held)  # ~38 kB of weights, ~4 kB of transcript
    assert _bytes(weights_dir) > 4 * _bytes(transcript_dir)  # whole model folders, MLmodel and environment files too
    # same dp tags as the weights version's (its own run's values), and a description saying how to load it
    weights_tags = client.get_model_version(NAME, "1").tags
    assert {k for k in tags if k.startswith("dp.")} == {k for k in weights_tags if k.startswith("dp.")}
    description = client.get_model_version(NAME, "2").description
    assert description.startswith("**Model guarantee:** ")
    assert f"**Transcript:** this version holds no weights" in description
    assert f"flows.record.transcript.load_weights('models:/{NAME}/2')" in description
    assert f"`privzo verify {NAME} 2 --tracking-uri {uri}`" in description


def test_loading_replays_the_weights_of_the_same_spec_bit_for_bit(runs, client, tmp_path):
    from components import builders
    from flows.record.transcript import load_weights, transcript_in

    uri = runs[1]
    registered = mlflow.pytorch.load_model(client.get_model_version_download_uri(NAME, "1"), map_location="cpu")
    replayed = load_weights(f"models:/{NAME}/2", tracking_uri=uri)
    mine, theirs = replayed.state_dict(), registered.state_dict()
    assert set(mine) <= set(theirs)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    transcript = transcript_in(_model_dir(client, "2", tmp_path))
    start = builders.build_model(transcript.run_spec(), *transcript.shapes).state_dict()
    assert not all(torch.equal(mine[k], start[k]) for k in mine), "the run moved the weights"
    # a weights version loads through the same door
    assert all(torch.equal(load_weights(f"models:/{NAME}/1", tracking_uri=uri).state_dict()[k], theirs[k])
               for k in mine)


def test_a_transcript_continuing_a_transcript_version_replays_both(runs, client, tmp_path):
    """A start that is itself a transcript (models:/NAME/2) is rebuilt by replay first, through the registry."""
    from components import builders, models
    from components.optimizers import replay
    from components.runtime.loop import JournalEntry
    from flows.record.transcript import load_weights, rebuild, transcript_in, weights_digest

    uri = runs[1]
    transcript = transcript_in(_model_dir(client, "2", tmp_path))
    spec = transcript.run_spec()
    expected = builders.build_model(spec, *transcript.shapes)
    expected.load_state_dict(mlflow.pytorch.load_model(client.get_model_version_download_uri(NAME, "1")).state_dict())
    replay(builders.build_directions(spec, models.trainable_parameters(expected)),
           [JournalEntry(*e) for e in transcript.journal], spec.optimizer.lr)  # the journal once more
    continued = dataclasses.replace(transcript, start=f"models:/{NAME}/2", weights_sha256=weights_digest(expected))
    model, used = rebuild(continued, uri)
    assert used == f"weights of models:/{NAME}/2"
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.state_dict().values()))
    assert weights_digest(load_weights(f"models:/{NAME}/2", tracking_uri=uri)) == transcript.weights_sha256


def test_the_pyfunc_predicts_as_the_weights_version(runs, client):
    """Both take the rows as stored (raw pixels, named columns) and answer the same labels and probabilities."""
    from sklearn.datasets import load_digits

    rows = load_digits(as_frame=True).data[:32]
    weights = mlflow.pyfunc.load_model(client.get_model_version_download_uri(NAME, "1"))
    transcript = mlflow.pyfunc.load_model(f"models:/{NAME}/2")
    answer = transcript.predict(rows)
    assert answer.equals(weights.predict(rows))
    assert list(answer.columns) == ["label"] + [f"probability_{c}" for c in range(10)]


def test_verify_passes_on_a_transcript_and_names_it(runs, client):
    from flows.record.verify import verify

    report = verify(NAME, "2", tracking_uri=runs[1])
    assert report.passed, str(report)
    weights = report.checks[-1]
    assert weights.name == "weights" and weights.status == "ok"
    assert weights.detail.startswith("a transcript, no weights: loading it replays 40 journal entries from the "
                                     "seeded initialisation, equal bit for bit (CPU)")


def test_a_transcript_that_is_not_the_run_s_fails_verify_and_loading(runs, client, tmp_path):
    """A journal edited in a re-logged transcript: verify names it; a digest that is not the replay's is refused."""
    from flows.record.transcript import ReplayError, log_transcript_model, rebuild, replays_to, transcript_in
    from flows.record.verify import verify

    results, uri, _ = runs
    transcript = transcript_in(_model_dir(client, "2", tmp_path))
    journal = [list(e) for e in transcript.journal]
    journal[3][2] += 1e-3
    edited = dataclasses.replace(transcript, journal=journal)
    mlflow.set_tracking_uri(uri)
    rows = np.zeros((2, 64), dtype="float32")
    with mlflow.start_run(run_id=transcript.run_id):
        info = log_transcript_model(edited, rows, np.zeros((2, 10), dtype="float32"), NAME)
    version = str(info.registered_model_version)
    dress_as(client, NAME, version, client.get_model_version(NAME, "2"))
    report = verify(NAME, version, tracking_uri=uri)
    assert [c.status for c in report.checks][-1] == "failed" and report.checks[-1].name == "weights"
    assert report.first_mismatch == (f"version {version} is a transcript whose journal is not run "
                                     f"{transcript.run_id}'s, so it does not replay the run's trajectory")
    with pytest.raises(ReplayError) as refused:
        rebuild(edited, uri)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"the replay of run {transcript.run_id}'s journal from its seeded "
                                                "initialisation is not the weights it registered")
    # what the flow asks before it registers a transcript (else it registers the weights it holds)
    assert replays_to(edited, None, uri) == line and replays_to(transcript, None, uri) is None


@pytest.mark.parametrize("change, found", [
    ({"estimator": {"kind": "pazo_m", "queries": 2, "smoothing": 1e-3}}, "pazo_m with sgd"),
    ({"estimator": {"kind": "first_order"}}, "first_order with sgd"),
    ({"optimizer": {"kind": "adam", "lr": 0.02, "steps": 60}}, "two_point with adam"),
])
def test_a_transcript_of_a_trajectory_the_journal_does_not_hold_is_refused(tiny_spec_dict, change, found):
    import specs

    tiny_spec_dict.update(change)
    tiny_spec_dict["tracking"]["register_as"] = "transcript"
    with pytest.raises(specs.SpecError) as refused:
        specs.spec_from_dict(tiny_spec_dict)
    assert str(refused.value) == (
        "tracking.register_as: transcript rebuilds the weights by replaying the journal of (seed, coefficient) steps, "
        "which is the whole trajectory only for estimator.kind two_point with optimizer.kind sgd (found "
        f"{found}); use register_as: weights")
    tiny_spec_dict["tracking"]["register_as"] = "weights"
    specs.spec_from_dict(tiny_spec_dict)  # the same spec registering its weights is fine

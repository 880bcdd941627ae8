"""A training process killed mid-run resumes from its last checkpoint: one ledger charge, the same model."""
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from flows.record.tracking_names import PRIVZO_RESUMED_FROM_STEP

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _spec(tiny_spec_dict, tmp_path, *, private: bool, tracking_uri=None) -> dict:
    spec = tiny_spec_dict
    spec["optimizer"]["steps"] = 1200
    spec["tracking"] = {"uri": tracking_uri or f"sqlite:///{tmp_path / 'mlflow.db'}", "log_every": 50}
    spec["checkpoint"] = {"dir": str(tmp_path / "checkpoints"), "keep": True}
    if private:
        spec["budget"] = {"dataset": "digits-patients", "lifetime_epsilon": 5.0,
                          "ledger": f"sqlite:///{tmp_path / 'ledger.db'}"}
    else:
        spec["privacy"]["insecure_deterministic"] = True
    return spec


def _env(api_url=None) -> dict:
    """The CLI's environment; with ``api_url`` (the session's prefect_server) its flow runs use that server
    instead of each starting a temporary one (~8 s here; tests/flows/test_cli.py covers that path)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), **({"PREFECT_API_URL": api_url} if api_url else {}))


def _cli(*args: str, cwd: Path, api_url=None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flows.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env(api_url), **kwargs)


def _checkpoint(root: Path, name: str):
    files = list((root / name).glob("*/checkpoint.pt"))
    if not files:
        return None, None
    try:
        return files[0].parent.name, torch.load(files[0], weights_only=True)
    except (EOFError, RuntimeError, FileNotFoundError):
        return files[0].parent.name, None


def _kill_after(spec: dict, spec_path: Path, tmp_path: Path, step: int, api_url: str) -> str:
    """Run the spec in a child process and SIGKILL it (with all it started) once a checkpoint at
    ``step`` or later exists; returns the run key."""
    root, name = Path(spec["checkpoint"]["dir"]), spec["name"]
    proc = _cli("run", str(spec_path), "--no-progress", cwd=tmp_path, api_url=api_url, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            key, state = _checkpoint(root, name)
            if state is not None and state["loop"]["step"] >= step:
                assert state["loop"]["step"] < spec["optimizer"]["steps"], "the run finished before the kill"
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
                return key
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.02)
        raise AssertionError("no checkpoint appeared")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _final(spec: dict, key: str):
    state = torch.load(Path(spec["checkpoint"]["dir"]) / spec["name"] / key / "checkpoint.pt", weights_only=True)
    return state


@pytest.mark.parametrize("private", [True, False], ids=["private-with-budget", "insecure-deterministic"])
def test_killed_run_resumes_with_one_charge_and_the_same_model(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                                monkeypatch, private):
    from components.accountants import event_to_json
    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    spec = _spec(tiny_spec_dict, tmp_path, private=private, tracking_uri=mlflow_db)

    # the uninterrupted run, on its own ledger and checkpoint folder
    reference = yaml.safe_load(yaml.safe_dump(spec))
    reference["checkpoint"]["dir"] = str(tmp_path / "reference-checkpoints")
    if private:
        reference["budget"]["ledger"] = f"sqlite:///{tmp_path / 'reference-ledger.db'}"
    ref = private_train(spec=reference)
    ref_state = _final(reference, ref["run_key"])

    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    key = _kill_after(spec, spec_path, tmp_path, step=150, api_url=prefect_server)
    killed_at = _checkpoint(Path(spec["checkpoint"]["dir"]), spec["name"])[1]["loop"]["step"]
    if private:  # killed: the reservation still counts the planned run, nothing more
        (charge,) = PrivacyLedger(spec["budget"]["ledger"]).history("digits-patients")
        assert charge.status == "reserved"

    resumed = _cli("run", str(spec_path), "--no-progress", "--resume", "latest", cwd=tmp_path, api_url=prefect_server)
    out, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, out[-3000:]
    assert f"resuming {spec['name']} from its checkpoint at step {killed_at}" in out
    # the chunk the process was killed in (50 steps, one log interval) is charged whole, unless the kill
    # fell between a checkpoint and the next chunk's first query
    unrecorded = re.search(r"the killed process may have run up to (\d+) private steps", out)
    unrecorded = int(unrecorded.group(1)) if unrecorded else 0
    assert unrecorded in (0, 50)
    planned = spec["optimizer"]["steps"]
    state = _final(spec, key)
    assert ref_state["loop"]["step"] == ref_state["loop"]["privacy_steps"] == planned
    if private:  # the charged steps come out of the trajectory: the run spends exactly what was planned
        assert state["loop"]["step"] == planned - unrecorded
        assert state["loop"]["privacy_steps"] == planned
    else:  # not private: the trajectory is completed, and the count says what was executed
        assert state["loop"]["step"] == planned
        assert state["loop"]["privacy_steps"] == planned + unrecorded
    if private:
        (charge,) = PrivacyLedger(spec["budget"]["ledger"]).history("digits-patients")
        (ref_charge,) = PrivacyLedger(reference["budget"]["ledger"]).history("digits-patients")
        assert charge.status == ref_charge.status == "committed"
        assert charge.steps_run == ref_charge.steps_run == spec["optimizer"]["steps"]
        assert event_to_json(charge.event) == event_to_json(ref_charge.event)  # the same charge, exactly
        assert charge.run_id == state["run_id"]
        ledger = PrivacyLedger(spec["budget"]["ledger"])
        assert ledger.spent("digits-patients") == pytest.approx(ref["epsilon"], rel=1e-12)
    else:  # same seed-derived streams: the resumed trajectory is the uninterrupted one
        for a, b in zip(state["loop"]["params"], ref_state["loop"]["params"]):
            assert torch.equal(a, b)
        assert state["loop"]["journal"] == ref_state["loop"]["journal"]
    import mlflow

    run = mlflow.MlflowClient(spec["tracking"]["uri"]).get_run(state["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags[PRIVZO_RESUMED_FROM_STEP] == str(killed_at)


def test_resume_refuses_a_changed_spec_and_a_missing_checkpoint(prefect_server, tiny_spec_dict, tmp_path):
    spec = _spec(tiny_spec_dict, tmp_path, private=False)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    proc = _cli("run", str(spec_path), "--no-progress", "--resume", "latest", cwd=tmp_path)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "resume: no checkpoint of tiny-digits" in out

    from components.directions import GENERATOR_VERSION
    from flows.checkpoints import CheckpointStore

    # the refusals below come from inside the flow, the same in this process as in the CLI's (whose exit
    # code and one line the refusal above covers): a new interpreter for each costs ~9 s of imports
    from flows.private_train import private_train

    CheckpointStore(spec["checkpoint"]["dir"], spec["name"], "k1").save(
        {"spec_digest": "0" * 64, "fingerprint": "0" * 64, "charge_id": None, "run_id": "r", "loop": {"step": 0},
         "directions_version": GENERATOR_VERSION})
    with pytest.raises(ValueError, match="resume: the spec changed since checkpoint"):
        private_train(spec_path=str(spec_path), resume="k1")

    done = CheckpointStore(spec["checkpoint"]["dir"], spec["name"], "k2")
    done.save({"spec_digest": "0" * 64, "fingerprint": "0" * 64, "charge_id": None, "run_id": "r", "loop": {"step": 0}})
    done.mark_finished()
    assert CheckpointStore.latest_key(spec["checkpoint"]["dir"], spec["name"]) == "k1"  # finished runs are skipped
    with pytest.raises(ValueError, match="resume: run k2 of tiny-digits finished"):
        private_train(spec_path=str(spec_path), resume="k2")

    # a checkpoint from before direction generator versioning (v1: other chunk size) is refused first:
    # its journal would not replay with this generator
    CheckpointStore(spec["checkpoint"]["dir"], spec["name"], "k0").save(
        {"spec_digest": "0" * 64, "fingerprint": "0" * 64, "charge_id": None, "run_id": "r", "loop": {"step": 0}})
    with pytest.raises(ValueError, match="written by direction generator v1, this privzo draws v2"):
        private_train(spec_path=str(spec_path), resume="k0")


def test_a_running_run_cannot_be_resumed_twice(tmp_path):
    """The run's folder is locked while its process lives: a second resume of it (the same reservation
    spent twice) is refused; the lock goes with the process (here: unlock)."""
    from flows.checkpoints import CheckpointStore

    running = CheckpointStore(str(tmp_path), "tiny-digits", "k1")
    running.lock()
    with pytest.raises(RuntimeError, match="resume: run k1 is still running"):
        CheckpointStore(str(tmp_path), "tiny-digits", "k1").lock()
    running.unlock()
    CheckpointStore(str(tmp_path), "tiny-digits", "k1").lock()


def test_spec_digest_ignores_cadence_and_prefetch_but_not_training(tiny_spec_dict):
    """A run may resume with another checkpoint/log cadence or with prefetching toggled (same values),
    never with anything that changes the trajectory."""
    import copy

    import specs
    from specs.run import spec_digest

    def digest(mutate):
        d = copy.deepcopy(tiny_spec_dict)
        mutate(d)
        return spec_digest(specs.spec_from_dict(d))

    base = digest(lambda d: None)
    assert digest(lambda d: d.update(execution={"prefetch_directions": True})) == base
    assert digest(lambda d: d["tracking"].update(log_every=7)) == base
    assert digest(lambda d: d["optimizer"].update(lr=0.03)) != base
    assert digest(lambda d: d.update(execution={"threads": 1})) != base


def test_resume_refuses_directions_drawn_on_another_kind_of_device(prefect_server, tiny_spec_dict, tmp_path, mlflow_db,
                                                                   monkeypatch):
    """A GPU draws other directions than the CPU for the same seeds: a checkpoint written on one is not
    replayed on the other. The refusal comes before anything is reserved or written; the checkpoint stays."""
    from flows.checkpoints import CheckpointStore
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    spec = _spec(tiny_spec_dict, tmp_path, private=False, tracking_uri=mlflow_db)
    spec["optimizer"]["steps"] = 40
    key = private_train(spec=spec)["run_key"]
    store = CheckpointStore(spec["checkpoint"]["dir"], spec["name"], key)
    (store.dir / "finished").unlink()  # as if killed after its last chunk
    state = store.load()
    assert state["directions_stream"] == "cpu-torch-v2"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))

    store.save({**{k: v for k, v in state.items() if k != "format"}, "directions_stream": "cuda-philox-v1"})
    before = store.path.read_bytes()
    # in this process: the refusal comes from inside the flow, as in the CLI's (~9 s of imports saved)
    with pytest.raises(ValueError, match=re.escape(f"resume: checkpoint {store.path} drew its directions with "
                                                   "cuda-philox-v1, this run would draw cpu-torch-v2")):
        private_train(spec_path=str(spec_path), resume=key)
    assert store.path.read_bytes() == before and not store.finished

    # checkpoints written before streams were recorded came from CPU runs, and resume on the CPU
    store.save({k: v for k, v in state.items() if k not in ("format", "directions_stream")})
    assert private_train(spec_path=str(spec_path), resume=key)["run_key"] == key


def test_a_kill_mid_chunk_is_charged_up_to_the_chunk_end_and_a_recorded_failure_exactly(tmp_path):
    """The intent written before a chunk's first query bounds what a killed process spent; it is stale
    once the chunk's checkpoint is saved, and dropped when a failure records the exact count."""
    from flows.checkpoints import Checkpointer, CheckpointStore

    class Loop:  # the parts of a training loop a Checkpointer touches
        def __init__(self):
            self.step, self.tracker = 20, type("T", (), {"steps": 25})()

        def state_dict(self):
            return {"step": self.step, "privacy_steps": self.tracker.steps}

    store = CheckpointStore(str(tmp_path), "run", "key")
    loop = Loop()
    checkpointer = Checkpointer(store, {"charge_id": None})
    checkpointer.save(loop)
    assert "unrecorded_steps" not in store.load()
    checkpointer.begin(loop, until=40)  # killed somewhere in steps 20..39
    state = store.load()
    assert state["loop"]["privacy_steps"] == 25 + 20 and state["unrecorded_steps"] == 20
    loop.step, loop.tracker.steps = 40, 45
    checkpointer.save(loop)  # the chunk finished: its intent is stale
    assert store.load()["loop"]["privacy_steps"] == 45 and "unrecorded_steps" not in store.load()
    checkpointer.begin(loop, until=60)
    loop.step, loop.tracker.steps = 47, 52  # failed at step 47: the flow records the exact count
    checkpointer.record_spent(loop)
    state = store.load()
    assert state["loop"]["step"] == 40 and state["loop"]["privacy_steps"] == 52
    assert "unrecorded_steps" not in state


def test_a_multi_pass_kill_is_charged_its_chunks_restarts_and_differences(tmp_path):
    """002's multi-pass runs count restarts apart from differences (two noise classes): a kill mid-chunk
    charges the chunk's steps in their own classes (restarts at steps 0 mod period), a recorded failure its
    exact counts."""
    from flows.checkpoints import Checkpointer, CheckpointStore

    class Loop:
        def __init__(self):
            self.step = 22
            self.tracker = type("T", (), {"steps": 22, "starts": 1, "period": 22})()

        def state_dict(self):
            return {"step": self.step, "privacy_steps": self.tracker.steps, "privacy_starts": self.tracker.starts}

    store = CheckpointStore(str(tmp_path), "run", "key")
    loop = Loop()
    checkpointer = Checkpointer(store, {"charge_id": None})
    checkpointer.save(loop)
    checkpointer.begin(loop, until=66)  # killed somewhere in steps 22..65: restarts at 22 and 44
    state = store.load()
    assert (state["loop"]["privacy_steps"], state["loop"]["privacy_starts"]) == (22 + 44, 1 + 2)
    loop.step, loop.tracker.steps, loop.tracker.starts = 30, 30, 2  # failed at step 30: counted exactly
    checkpointer.record_spent(loop)
    state = store.load()
    assert (state["loop"]["step"], state["loop"]["privacy_steps"], state["loop"]["privacy_starts"]) == (22, 30, 2)


def test_a_run_killed_before_its_first_checkpoint_releases_its_reservation(prefect_server, tiny_spec_dict, tmp_path,
                                                                          mlflow_db):
    """Killed after the ledger reserved its run but before the step-0 checkpoint (here in the public warm
    start; every private query comes after that checkpoint), a run made no private query. Its reservation
    would count the planned epsilon for good; the next run under its key (`--resume latest`, or Prefect
    retrying the flow run) releases it and starts over, so the dataset is charged one run."""
    from flows.ledger import PrivacyLedger

    spec = _spec(tiny_spec_dict, tmp_path, private=True, tracking_uri=mlflow_db)
    spec["optimizer"]["steps"] = 60
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    killer = ("import os, signal, sys\nimport flows.private_train as pt\n"  # the process and all it started
              "pt.public_warm_start = lambda spec, built: os.killpg(0, signal.SIGKILL)\n"
              "from flows.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    with open(tmp_path / "killed.log", "w") as log:
        killed = subprocess.run([sys.executable, "-c", killer, "run", str(spec_path), "--no-progress"], cwd=tmp_path,
                                stdout=log, stderr=subprocess.STDOUT, env=_env(prefect_server),
                                timeout=300, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-3000:]
    ledger = PrivacyLedger(spec["budget"]["ledger"])
    (orphan,) = ledger.history("digits-patients")
    assert orphan.status == "reserved" and ledger.spent("digits-patients") == pytest.approx(orphan.planned_epsilon)

    resumed = _cli("run", str(spec_path), "--no-progress", "--resume", "latest", cwd=tmp_path, api_url=prefect_server)
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out[-3000:]
    assert f"its ledger reservation {orphan.id} is released, and the run starts from the beginning" in out
    released, charge = ledger.history("digits-patients")
    assert (released.id, released.status) == (orphan.id, "aborted") and charge.status == "committed"
    assert ledger.spent("digits-patients") == pytest.approx(charge.planned_epsilon)  # one run, not two


def _lease_ends(ledger, charge_id, after):
    """Set a reservation's lease to end ``after`` from now, as its run's last renewal would have."""
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from flows.ledger import ChargeRow
    from flows.ledger.schema import utc_now

    with Session(ledger.engine) as session, session.begin():
        session.execute(update(ChargeRow).where(ChargeRow.id == charge_id).values(lease_until=utc_now() + after))


def test_a_killed_runs_reservation_is_settled_at_its_bound_after_its_lease_and_the_next_run_fits(
        prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    """SIGKILL mid-run, then nothing resumes it (a scheduled run's next night has another key). While its lease
    is live, its reservation holds the planned run and the next run does not fit; once the lease ran out, the
    next run settles it at the bound the killed run recorded, never below what its checkpoint and intent show
    it may have run, and is admitted."""
    from flows.checkpoints import CheckpointStore
    from flows.ledger import BudgetExceeded, PrivacyLedger
    from flows.private_train import private_train

    monkeypatch.setenv("PRIVZO_LEASE_SECONDS", "4")
    monkeypatch.chdir(tmp_path)
    spec = _spec(tiny_spec_dict, tmp_path, private=True, tracking_uri=mlflow_db)
    spec["budget"]["lifetime_epsilon"] = 2.6  # one planned run (epsilon 2) and a cut one, not two planned ones
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    key = _kill_after(spec, spec_path, tmp_path, step=150, api_url=prefect_server)
    may_have_run = CheckpointStore(spec["checkpoint"]["dir"], spec["name"], key).load()["loop"]["privacy_steps"]
    ledger = PrivacyLedger(spec["budget"]["ledger"])
    ((dead, _run, _created, _until, bound, planned),) = ledger.open_reservations("digits-patients")
    assert may_have_run <= bound < planned
    # the lease's end is set, not waited for: a slow machine can spend a 4 s lease before the next run reserves
    _lease_ends(ledger, dead, dt.timedelta(seconds=120))
    with pytest.raises(BudgetExceeded):  # its lease is live: it holds its planned run
        private_train(spec=yaml.safe_load(spec_path.read_text()))
    _lease_ends(ledger, dead, dt.timedelta(seconds=-1))
    out = private_train(spec=yaml.safe_load(spec_path.read_text()))
    settled, charge = ledger.history("digits-patients")  # oldest first; the refused run wrote nothing
    assert (settled.id, settled.status, settled.steps_run) == (dead, "committed", bound)
    assert charge.status == "committed" and charge.run_id == out["run_id"]


def test_a_run_killed_between_registering_and_committing_leaves_its_version_charged_once(
        prefect_server, tiny_spec_dict, tmp_path, mlflow_db, monkeypatch):
    """Nothing lost (docs/reliability.md): SIGKILL after the model version is registered and before the ledger
    commit (bench/faults.py's hook at that stage). Once the lease ran out, the next run on the dataset settles
    the dead reservation, and its flow run's log says so: every registered version's run then holds exactly one committed charge, no run is
    charged twice, and every committed charge names an MLflow run that exists."""
    import mlflow

    from flows.ledger import PrivacyLedger
    from flows.private_train import private_train

    monkeypatch.setenv("PRIVZO_LEASE_SECONDS", "3")
    monkeypatch.chdir(tmp_path)
    spec = _spec(tiny_spec_dict, tmp_path, private=True, tracking_uri=mlflow_db)
    spec["optimizer"]["steps"] = 60
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    control = tmp_path / "control"
    control.mkdir()
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "faults.py"), "child", str(spec_path), "registered",
                             "kill", str(control), "0"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_env(prefect_server), start_new_session=True)
    deadline = time.monotonic() + 240
    while not (control / "arrived").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    client = mlflow.MlflowClient(mlflow_db)
    (killed_version,) = client.search_model_versions(f"name='{spec['name']}'")
    ledger = PrivacyLedger(spec["budget"]["ledger"])
    (dead,) = ledger.history("digits-patients")
    assert dead.status == "reserved" and dead.run_id == killed_version.run_id  # its settlement will name the run

    time.sleep(3.5)  # the lease runs out; the next night settles the dead reservation before reserving
    out = private_train(spec=yaml.safe_load(spec_path.read_text()))
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=30)  # the run's logs reach the server in batches
    with get_client(sync_client=True) as prefect:
        (night,) = prefect.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=1)
        logs = [log.message for log in prefect.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[night.id])))]
    # the night's own Prefect log says what the dead night was charged
    assert any(f"reservation {dead.id} of run" in m and "committed at its bound, 60 steps" in m for m in logs), logs
    charges = ledger.history("digits-patients")
    assert [c.status for c in charges] == ["committed", "committed"]
    assert charges[0].steps_run == 60 and charges[0].run_id == killed_version.run_id  # registered: every step ran
    committed = [c.run_id for c in charges if c.status == "committed"]
    assert len(set(committed)) == len(committed)  # no run charged twice
    for version in client.search_model_versions(f"name='{spec['name']}'"):
        assert committed.count(version.run_id) == 1, version.version
    assert {v.run_id for v in client.search_model_versions(f"name='{spec['name']}'")} == {dead.run_id, out["run_id"]}
    for run_id in committed:
        client.get_run(run_id)  # raises for a run that does not exist

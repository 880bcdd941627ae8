"""Where a run's checkpoints live: a relative ``checkpoint.dir`` from the working directory, or from the folder
a worker names (the team stack's training user's own: the checkout is not its to write)."""
from pathlib import Path

from flows.checkpoints import ROOT_ENV, CheckpointStore, resume_store


def test_a_relative_checkpoint_dir_is_taken_from_the_workers_folder_where_it_names_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(ROOT_ENV, raising=False)
    assert CheckpointStore(".privzo/checkpoints", "spec", "key").dir == Path(".privzo/checkpoints/spec/key")
    worker = tmp_path / "home" / "privzo-train"
    monkeypatch.setenv(ROOT_ENV, str(worker))
    store = CheckpointStore(".privzo/checkpoints", "spec", "key")
    assert store.dir == worker / ".privzo" / "checkpoints" / "spec" / "key"
    assert CheckpointStore(str(tmp_path / "own"), "spec", "key").dir == tmp_path / "own" / "spec" / "key"
    store.lock()  # written where the worker may write, and found there again by a resume
    store.write_reservation("1", "sqlite:///ledger.db")
    assert store.dir.is_dir() and not (tmp_path / ".privzo").exists()
    assert CheckpointStore.latest_key(".privzo/checkpoints", "spec") == "key"
    assert resume_store(".privzo/checkpoints", "spec", "latest").dir == store.dir
    store.unlock()

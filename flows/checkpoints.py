"""Chunk checkpoints of a training run: one folder per spec name and run key, written atomically.

A checkpoint binds a run to its ledger reservation and its MLflow run, so a process killed mid-training
resumes under both (no second reservation, no second MLflow run). It holds the trajectory (parameters,
optimizer state, journal, released noisy values) and the privacy steps spent; never a private row, an
un-noised sum or a private generator's state (from which past noise could be recovered).
"""
from __future__ import annotations

import copy
import fcntl
import json
import os
import shutil
from pathlib import Path

from specs.refusal import RuntimeRefusal
from typing import Callable, Optional, Tuple

import torch

from components.mechanisms.scheduled import starts_in
from components.protocols import CountsStarts, PrivacyFilter

FORMAT = 1
FILE = "checkpoint.pt"
INTENT = "intent.json"  # written before a chunk's first private query: what a kill during it may have spent
# written before the ledger reservation of a new run; the step-0 checkpoint, which precedes every private
# query, supersedes it. A folder holding it and no checkpoint is a run killed before any private query.
RESERVATION = "reservation.json"
# where a relative checkpoint.dir is taken from on a worker that sets it (the team stack's training user's own
# folder: the working directory is the code's, which no role writes), as infra/compose mounts a volume
ROOT_ENV = "PRIVZO_CHECKPOINT_ROOT"


def anchored(root) -> Path:
    """``checkpoint.dir`` as this process keeps it: from $PRIVZO_CHECKPOINT_ROOT when relative and set, else as
    written (from the working directory)."""
    path, base = Path(root), os.environ.get(ROOT_ENV, "").strip()
    return path if path.is_absolute() or not base else Path(base) / path


def resume_store(root: str, name: str, resume: Optional[str]) -> Optional["CheckpointStore"]:
    """The checkpoint store ``resume`` names (a run key or ``latest``), None when not resuming. Refuses in
    one line a ``checkpoint.dir`` that is a file, and a resume with nothing to resume."""
    root = str(anchored(root))
    if Path(root).exists() and not Path(root).is_dir():
        raise ValueError(f"checkpoint.dir: {root} is a file; give a folder")
    if resume is None:
        return None
    key = CheckpointStore.latest_key(root, name) if resume == "latest" else resume
    if key is None:
        raise FileNotFoundError(f"resume: no checkpoint of {name} under {root}; nothing to resume")
    store = CheckpointStore(root, name, key)
    if not store.exists() and store.reservation() is None:
        raise FileNotFoundError(f"resume: no checkpoint {store.path}; see the folders under {root}/{name}")
    return store


class RunLocked(RuntimeRefusal):
    """Another live process holds this run's checkpoint folder."""


class CheckpointStore:
    def __init__(self, root: str, name: str, key: str):
        if not key or any(c in key for c in "/\\") or key in (".", ".."):
            raise ValueError(f"resume: {key!r} is not a run key (the folder name under {root}/{name})")
        self.root = anchored(root)
        self.dir = self.root / name / key
        self.key = key
        self._lock_fd: Optional[int] = None

    def lock(self) -> None:
        """Hold the run's folder for this process's lifetime: a resume of a run that is still going (the
        same reservation spent twice) is refused. The kernel drops the lock when the process dies."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLocked(f"resume: run {self.key} is still running (its checkpoint folder {self.dir} is "
                               f"locked); wait for it or stop it first") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def path(self) -> Path:
        return self.dir / FILE

    def exists(self) -> bool:
        return self.path.is_file()

    def load(self) -> dict:
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        if state.get("format") != FORMAT:
            raise ValueError(f"checkpoint: {self.path} has format {state.get('format')!r}, privzo reads {FORMAT}")
        return self._charge_unrecorded(state)

    def _charge_unrecorded(self, state: dict) -> dict:
        """A process killed during a chunk spent an unknown number of that chunk's steps: charge all of them
        (the chunk's intent bounds them), so a resume never spends a step twice unaccounted. An intent
        from an earlier step is stale: its chunk finished and was saved."""
        try:
            intent = json.loads((self.dir / INTENT).read_text())
        except FileNotFoundError:
            return state
        loop = state["loop"]
        if intent["from_step"] != loop["step"]:
            return state
        bound = int(intent["privacy_steps"]) + int(intent["until"]) - int(intent["from_step"])
        if bound <= loop["privacy_steps"]:
            return state
        charged = {**loop, "privacy_steps": bound}
        if "privacy_spent" in intent:  # a privacy filter: every step of the chunk at its most
            charged["privacy_spent"] = float(intent["privacy_spent"]) + float(intent["step_cost_bound"]) * (
                int(intent["until"]) - int(intent["from_step"]))
        if "privacy_starts" in loop:  # two release classes: the chunk's restarts, by their step numbers
            charged["privacy_starts"] = int(intent["privacy_starts"]) + starts_in(
                int(intent["period"]), int(intent["from_step"]), int(intent["until"]))
        return {**state, "loop": charged, "unrecorded_steps": bound - loop["privacy_steps"]}

    def _write_json(self, name: str, value: dict) -> None:
        tmp = self.dir / f".{name}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(value, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / name)

    def write_intent(self, intent: dict) -> None:
        self._write_json(INTENT, intent)

    def write_reservation(self, charge_id: str, ledger: str) -> None:
        """Before the ledger reserves ``charge_id``: a process killed between the reservation and its step-0
        checkpoint leaves this, and the next run under this key (a resume, a Prefect retry) releases it."""
        self._write_json(RESERVATION, {"charge_id": charge_id, "ledger": ledger})

    def reservation(self) -> Optional[dict]:
        """The reservation of a run killed before its step-0 checkpoint, i.e. before any private query."""
        if self.exists():
            return None
        try:
            return json.loads((self.dir / RESERVATION).read_text())
        except FileNotFoundError:
            return None

    def clear_reservation(self) -> None:
        (self.dir / RESERVATION).unlink(missing_ok=True)

    def clear_intent(self) -> None:
        (self.dir / INTENT).unlink(missing_ok=True)

    def save(self, state: dict) -> None:
        """Write-then-rename, so a kill mid-write leaves the previous checkpoint intact."""
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.dir / f".{FILE}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # model parameters of a private run: the owner's only
        os.replace(tmp, self.path)

    @property
    def finished(self) -> bool:
        return (self.dir / "finished").exists()

    def mark_finished(self) -> None:
        """A kept checkpoint of a run that completed: there is nothing to resume."""
        (self.dir / "finished").touch()

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self.unlock()

    @staticmethod
    def latest_key(root: str, name: str) -> Optional[str]:
        """The run key of the most recently written checkpoint of an unfinished run of ``name``, if any."""
        written = [p for pattern in (FILE, RESERVATION) for p in (anchored(root) / name).glob(f"*/{pattern}")]
        runs = [p for p in written if not (p.parent / "finished").exists()]
        if not runs:
            return None
        return max(runs, key=lambda p: p.stat().st_mtime).parent.name


def charged_through(tracker, from_step: int, until: int) -> Tuple[object, int]:
    """What a run is charged if it dies before step ``until`` of a chunk begun at ``from_step``: the event and
    privacy steps of its tracker with every step of the chunk executed (restarts and a filter's spend as the
    chunk's intent counts them, ``CheckpointStore.load``). Computed on a copy: the tracker is not moved."""
    from components.accountants.accounting import SelectionTracker

    selected = isinstance(tracker, SelectionTracker)  # a search's candidate: released as the best of K such runs
    counted = tracker.inner if selected else tracker
    ahead = copy.copy(counted)
    ahead.steps = counted.steps + max(0, int(until) - int(from_step))
    if isinstance(counted, CountsStarts):
        ahead.starts = counted.starts + starts_in(counted.period, from_step, until)
    return (tracker.select(ahead.event()) if selected else ahead.event()), ahead.steps


class Checkpointer:
    """Saves a loop's trajectory after each chunk and rewinds to it when a chunk is retried. ``bound(event,
    steps)``: called before each chunk's first private query with what a death inside it is charged (the
    run session's lease renewal, ``RunSession.bound``), raising to stop the chunk before it queries."""

    def __init__(self, store: CheckpointStore, binding: dict, last: Optional[dict] = None,
                 bound: Optional[Callable[[object, int], None]] = None):
        self.store = store
        self.binding = binding  # spec digest, data fingerprint, ledger charge, MLflow run
        self.last = last  # the loop state of the last checkpoint written
        self.bound = bound

    def save(self, loop) -> None:
        state = loop.state_dict()
        self.store.save({**self.binding, "loop": state})
        self.last = state

    def begin(self, loop, until: int) -> None:
        """Before a chunk's first private query: a process killed before the chunk's checkpoint is charged
        every step up to ``until`` on resume."""
        intent = {"from_step": loop.step, "privacy_steps": loop.tracker.steps, "until": until}
        if isinstance(loop.tracker, CountsStarts):  # two release classes: the restarts counted apart
            intent.update(privacy_starts=loop.tracker.starts, period=loop.tracker.period)
        if isinstance(loop.tracker, PrivacyFilter):  # a filter: every step of the chunk at its most
            intent.update(privacy_spent=loop.tracker.spent, step_cost_bound=loop.tracker.step_cost_bound)
        self.store.write_intent(intent)
        if self.bound is not None:  # the ledger holds the chunk's bound before its first query, or it stops here
            self.bound(*charged_through(loop.tracker, loop.step, until))

    def rewind(self, loop) -> int:
        """Back to the last checkpoint after a failed attempt; the steps the attempt spent stay charged
        (the exception may have depended on what they released). Returns the steps discarded."""
        if self.last is None:
            return 0
        discarded = loop.step - self.last["step"]
        # reloaded even when no step completed: an update that failed half-applied (the driver's replica
        # moved, a worker's did not) must not stay in the parameters without its journal entry
        loop.load_state_dict(self.last, restore_privacy_steps=False)
        return discarded

    def record_spent(self, loop) -> None:
        """Keep the last trajectory but the privacy steps spent now, so a later resume of a failed run
        still counts the steps it discarded."""
        if self.last is not None:
            self.last = {**self.last, "privacy_steps": loop.tracker.steps,
                         **({"privacy_starts": loop.tracker.starts} if isinstance(loop.tracker, CountsStarts) else {}),
                         **({"privacy_spent": loop.tracker.spent} if isinstance(loop.tracker, PrivacyFilter) else {})}
            self.store.save({**self.binding, "loop": self.last})
            self.store.clear_intent()  # the count is exact now

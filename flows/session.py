"""A run session: the lifecycle of one ``private_train`` run's ledger reservation and checkpoint folder, as one
explicit state machine (docs/design.md, Run sessions).

States::

    reserved         the run holds its checkpoint folder (locked) and, with a budget, its ledger reservation;
                     no private query has been made
    running          private steps may run: whatever the loop spends from here on is charged
    committed        the ledger holds what the run executed (all of it, or the steps before a crash); the
                     folder is removed, or marked finished when ``checkpoint.keep`` asks to keep it
    kept_for_resume  the reservation (the planned run, whole) and the checkpoint stay, the steps spent are
                     recorded in it, and ``--resume`` continues under the same charge
    aborted          nothing private ran: the reservation is released and the folder removed

Transitions (methods; any other call raises ``IllegalTransition``)::

    reserved --reserve(charge_id)--> reserved          a new run with a budget, once
    reserved --start(loop, run_id)--> running
    running  --track(checkpointer, run_id)--> running  once the run's checkpoint exists
    running  --commit()--> committed                   the run completed
    running  --fail(err)--> committed | kept_for_resume
    reserved --fail(err)--> aborted (a new run) | kept_for_resume (a resumed run)
    reserved --abort()--> aborted                      a new run only
    reserved | running --keep_for_resume()--> kept_for_resume

Used as a context manager, the session settles itself however its block is left: returning (from running:
``commit``), raising or interrupted (``fail``). It drives plain objects, so it is tested with fakes:

- ``store``: ``write_reservation(charge_id, ledger_url)``, ``remove()``, ``mark_finished()``, ``unlock()``
  (a locked ``flows.checkpoints.CheckpointStore``);
- ``ledger``: ``url``, ``reserve(charge_id)``, ``abort(charge_id)``, ``commit(charge_id, loop, run_id)``
  returning the dataset's budget left, ``renew(charge_id, bound=None, planned=False, run_id=None)`` (the
  reservation's lease: ``flows.ledger.leases``), raising ``LeaseLost`` once the charge is no longer reserved;
- the ``checkpointer`` given to ``track``: ``record_spent(loop)`` (a ``flows.checkpoints.Checkpointer``).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

RESERVED, RUNNING = "reserved", "running"
COMMITTED, KEPT_FOR_RESUME, ABORTED = "committed", "kept_for_resume", "aborted"
TERMINAL = frozenset({COMMITTED, KEPT_FOR_RESUME, ABORTED})


class IllegalTransition(RuntimeError):
    """A session method called in a state that does not allow it; nothing was done."""


def _never(_err: BaseException) -> bool:
    return False


class _NoFolder:
    """The store of a run that keeps no checkpoint folder (a search: its candidates live in memory, and a
    search killed is not resumed)."""

    def write_reservation(self, charge_id: str, ledger_url: str) -> None:
        pass

    def remove(self) -> None:
        pass

    def mark_finished(self) -> None:
        pass

    def unlock(self) -> None:
        pass


NO_FOLDER = _NoFolder()


class RunSession:
    """One run's reservation and checkpoint folder, from the lock to their settlement.

    Guarantee: whichever way the session ends (completed, an error before the first private query, an error
    after private steps ran, a lost Ray cluster, KeyboardInterrupt), it enters exactly one terminal state and
    settles the ledger at most once: ``commit`` of the steps executed (committed), ``abort`` (aborted, only
    before any private step), or neither (kept_for_resume: the reservation stays for ``--resume``). A run
    that holds a charge and is not kept for resume is settled exactly once, and the folder is unlocked once.
    A state is entered before its effects run, so an effect that raises (an unreachable ledger) propagates
    and nothing is settled a second time; the folder then stays as it is, locked until the process exits.

    While it holds a charge and is not settled, a heartbeat thread renews the reservation's lease every
    ``renew_every`` seconds; ``start`` records the planned run whole as the charge's bound, and ``bound``
    (each chunk, before its first query) what a death inside that chunk is charged. A dead process's lease
    runs out and the next reservation on the dataset settles it at its bound (``flows.ledger.leases``).
    """

    def __init__(self, store: Any, ledger: Any, *, charge_id: Optional[str] = None, resumed: bool = False,
                 keep: bool = False, resumable: Callable[[BaseException], bool] = _never,
                 renew_every: Optional[float] = None):
        """``charge_id``: a resumed run's reservation (a new run's comes from ``reserve``). ``keep``: a completed
        run's folder is marked finished rather than removed. ``resumable(err)``: an error after which the run
        stays resumable under its reservation (``flows.private_train.cluster_lost``)."""
        self.store, self.ledger = store, ledger
        self.charge_id = charge_id
        self.resumed, self.keep, self.resumable = resumed, keep, resumable
        self.state = RESERVED
        self.loop: Any = None
        self.run_id: Optional[str] = None
        self.checkpointer: Any = None
        self.left: Optional[float] = None  # the dataset's budget left, once a charge is committed
        self._entered = False
        if renew_every is None:
            from flows.ledger.leases import lease_seconds

            renew_every = lease_seconds() / 5
        self.renew_every = renew_every
        self.lease_lost: Optional[BaseException] = None  # what the heartbeat's renewal met, once the charge was lost
        self._stop = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None

    # ---------------------------------------------------------------- context manager
    def __enter__(self) -> "RunSession":
        if self._entered or self.state != RESERVED:
            raise IllegalTransition(f"run session: entered in state {self.state}; a session is used once")
        self._entered = True
        if self.charge_id is not None:  # a resumed run's reservation: held from here
            self._beat()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if self.state in TERMINAL:
                return False  # settled inside the block (or by an effect that raised): never twice
            if exc is None and self.state == RUNNING:
                self.commit()
            else:  # an error, an interrupt, or a block left before it started: nothing completed
                self.fail(exc)
            return False  # the error propagates
        finally:
            self._stop.set()

    # ---------------------------------------------------------------- the lease
    def _beat(self) -> None:
        """Renew the lease now and then every ``renew_every`` seconds, until the session is settled."""
        if self._heartbeat is not None:
            return
        charge_id = self.charge_id

        def beat() -> None:
            while not self._stop.wait(self.renew_every):
                if self.state in TERMINAL:
                    return
                try:
                    self.ledger.renew(charge_id)
                except Exception as err:  # noqa: BLE001 - a lost charge ends the beat; a ledger away is retried
                    if self.state in TERMINAL:
                        return
                    if type(err).__name__ == "LeaseLost":
                        self.lease_lost = err
                        return

        self._heartbeat = threading.Thread(target=beat, name=f"privzo-lease-{charge_id}", daemon=True)
        self._heartbeat.start()

    def bound(self, event: Any, steps: int) -> None:
        """Before a chunk's first private query: the ledger records ``event`` over ``steps`` as what this run
        is charged if it dies before its next bound, and renews the lease; raises ``LeaseLost`` (the chunk then
        makes no query) where the charge is no longer reserved."""
        self._require(RUNNING, "bound")
        if self.charge_id is None:
            return
        if self.lease_lost is not None:
            raise self.lease_lost
        self.ledger.renew(self.charge_id, bound=(event, steps))

    # ---------------------------------------------------------------- transitions
    def reserve(self, charge_id: str) -> None:
        """Reserve a new run's planned spend. The folder records ``charge_id`` before the ledger holds it,
        so a process killed in between leaves a reservation the next run under this key releases; the
        session holds the charge from the first write, so a refused reservation is still aborted (a no-op
        in the ledger, which wrote nothing)."""
        self._require(RESERVED, "reserve")
        if self.resumed or self.charge_id is not None:
            raise IllegalTransition(f"run session: reserve: the run already holds charge {self.charge_id}"
                                    if self.charge_id is not None else
                                    "run session: reserve: a resumed run continues under its own reservation")
        self.charge_id = charge_id
        self.store.write_reservation(charge_id, self.ledger.url)
        self.ledger.reserve(charge_id)
        self._beat()

    def start(self, loop: Any, run_id: Optional[str] = None) -> None:
        """From here private steps may run: every exit charges what ``loop`` executed (or keeps the
        reservation for a resume), and the reservation is never released."""
        self._require(RESERVED, "start")
        if self.charge_id is not None:  # until the first chunk's bound: the planned run whole
            self.ledger.renew(self.charge_id, planned=True, run_id=run_id)
        self.state, self.loop, self.run_id = RUNNING, loop, run_id

    def track(self, checkpointer: Any, run_id: Optional[str]) -> None:
        """The run's checkpoint (and MLflow run) exist: a later error may keep them for a resume."""
        self._require(RUNNING, "track")
        if self.checkpointer is not None:
            raise IllegalTransition("run session: track: the run's checkpointer is already set")
        self.checkpointer, self.run_id = checkpointer, run_id
        if self.charge_id is not None and run_id is not None:  # a settlement after a death names the run
            self.ledger.renew(self.charge_id, run_id=run_id)

    def commit(self, *, finished: bool = True) -> Optional[float]:
        """Charge the steps executed; returns the dataset's budget left (None without a charge). ``finished``:
        the run completed (its folder is marked finished when kept, removed otherwise); a crash's folder is
        removed, since a committed charge cannot be resumed."""
        self._require(RUNNING, "commit")
        if not finished and self.charge_id is None:
            raise IllegalTransition("run session: commit: a crashed run without a charge has nothing to commit; "
                                    "it is kept for resume")
        self.state = COMMITTED
        if self.charge_id is not None:
            self.left = self.ledger.commit(self.charge_id, self.loop, self.run_id)
        if finished and self.keep:
            self.store.mark_finished()
        else:
            self.store.remove()
        self.store.unlock()
        return self.left

    def abort(self) -> None:
        """Release the reservation of a new run that made no private query, and remove its folder."""
        self._require(RESERVED, "abort")
        if self.resumed:
            raise IllegalTransition("run session: abort: a resumed run's reservation covers the steps it already "
                                    "ran; it is kept for resume")
        self.state = ABORTED
        if self.charge_id is not None:
            self.ledger.abort(self.charge_id)
        self.store.remove()
        self.store.unlock()

    def keep_for_resume(self) -> None:
        """Keep the reservation and the checkpoint, with the steps spent so far recorded in it, for ``--resume``."""
        self._require((RESERVED, RUNNING), "keep_for_resume")
        if self.state == RESERVED and not self.resumed:
            raise IllegalTransition("run session: keep_for_resume: a new run that never started has no checkpoint "
                                    "to resume; it is aborted")
        if self.state == RUNNING and self.charge_id is not None and self.checkpointer is None:
            raise IllegalTransition("run session: keep_for_resume: the run has no checkpoint yet; its charge is "
                                    "committed")
        self.state = KEPT_FOR_RESUME
        if self.checkpointer is not None:
            self.checkpointer.record_spent(self.loop)  # steps a retry discarded stay counted on resume
        self.store.unlock()

    def fail(self, err: Optional[BaseException]) -> None:
        """Settle after ``err`` (an exception, KeyboardInterrupt included; None: the block was left early).
        Before the first private query, a new run is aborted and a resumed one kept. After it, the steps
        executed are committed, unless the run can go on: a ``resumable`` error (a lost cluster) once its
        checkpoint exists, or a run without a charge, which keeps its checkpoint."""
        self._require((RESERVED, RUNNING), "fail")
        if self.state == RUNNING and self.charge_id is not None and type(err).__name__ == "LeaseLost":
            # the ledger settled the charge at this run's bound after its lease ran out: nothing is left to
            # settle, and a settled charge cannot be resumed
            self.state = COMMITTED
            self.store.remove()
            self.store.unlock()
            return
        if self.state == RESERVED:
            if self.resumed:
                self.keep_for_resume()
            else:
                self.abort()
        elif self.charge_id is None or (self.checkpointer is not None and err is not None and self.resumable(err)):
            self.keep_for_resume()
        else:
            self.commit(finished=False)

    # ---------------------------------------------------------------- helpers
    def _require(self, states, action: str) -> None:
        allowed = (states,) if isinstance(states, str) else tuple(states)
        if self.state not in allowed:
            raise IllegalTransition(f"run session: {action} in state {self.state} (allowed in {', '.join(allowed)})")

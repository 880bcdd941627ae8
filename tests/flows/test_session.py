"""The run session's state machine (flows/session.py) with fake ledger, store and checkpointer objects that
record every call: each way a run can end settles the ledger once, keeps or removes the folder as a resume
needs, and unlocks it once; an illegal transition raises and does nothing. A hypothesis test drives
sequences of events (success, a failure at step k, a lost cluster, an interrupt) through the session and
through a transcription of the flag-based lifecycle ``private_train`` had before the session, and asserts
they make the same calls."""
from types import SimpleNamespace
from typing import List, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.session import (ABORTED, COMMITTED, KEPT_FOR_RESUME, RESERVED, RUNNING, IllegalTransition,
                           RunSession)

LEDGER_URL = "sqlite:///fake-ledger.db"
NEW_CHARGE, OLD_CHARGE = "charge-new", "charge-resumed"
LEFT = 1.25


class ClusterLost(RuntimeError):
    """Stands for components.runtime.ray_backend.ClusterLost."""


class Crash(RuntimeError):
    pass


class Refused(RuntimeError):
    """Stands for BudgetExceeded: the ledger wrote nothing."""


def lost(err: BaseException) -> bool:
    return isinstance(err, ClusterLost)


class World:
    """Fakes sharing one call log, and the run's events: ``ok`` passes the next point of the run (a setup
    stage, or one private step once training), anything else raises there; when the events run out, every
    remaining point passes and the run completes."""

    def __init__(self, events=(), *, refuse: bool = False, commit_fails: bool = False):
        self.log: List[tuple] = []
        self.events = list(events)
        self.refuse, self.commit_fails = refuse, commit_fails
        self.reserved: set = set()
        self.renewals: List[tuple] = []
        self.store, self.ledger = FakeStore(self), FakeLedger(self)
        self.loop = SimpleNamespace(tracker=SimpleNamespace(steps=0))
        self.session: Optional[RunSession] = None

    def point(self) -> None:
        if not self.events:
            return
        event = self.events.pop(0)
        if event == "fail":
            raise Crash("worker lost")
        if event == "lost":
            raise ClusterLost("the Ray cluster is gone")
        if event == "interrupt":
            raise KeyboardInterrupt

    def train(self) -> None:
        while self.events:
            self.point()
            self.loop.tracker.steps += 1

    def calls(self, name: str) -> List[tuple]:
        return [c for c in self.log if c[0] == name]


class FakeStore:
    def __init__(self, world: World):
        self.world = world

    def write_reservation(self, charge_id, ledger):
        self.world.log.append(("write_reservation", charge_id, ledger))

    def remove(self):
        self.world.log.append(("remove",))

    def mark_finished(self):
        self.world.log.append(("mark_finished",))

    def unlock(self):
        self.world.log.append(("unlock",))


class FakeLedger:
    url = LEDGER_URL

    def __init__(self, world: World):
        self.world = world

    def reserve(self, charge_id):
        self.world.point()  # the reservation itself may fail
        if self.world.refuse:
            raise Refused("budget.lifetime_epsilon: no budget left")
        self.world.reserved.add(charge_id)
        self.world.log.append(("reserve", charge_id))

    def abort(self, charge_id):
        self.world.log.append(("abort", charge_id))

    def renew(self, charge_id, bound=None, planned=False, run_id=None):
        self.world.renewals.append((charge_id, bound, planned, run_id))

    def commit(self, charge_id, loop, run_id):
        self.world.log.append(("commit", charge_id, loop.tracker.steps, run_id))
        if self.world.commit_fails:
            raise ConnectionError("ledger unreachable")
        return LEFT


class FakeCheckpointer:
    def __init__(self, world: World):
        self.world = world

    def record_spent(self, loop):
        self.world.log.append(("record_spent", loop.tracker.steps))


def session_of(world: World, *, resumed: bool = False, budget: bool = True, keep: bool = False) -> RunSession:
    return RunSession(world.store, world.ledger, charge_id=OLD_CHARGE if resumed and budget else None,
                      resumed=resumed, keep=keep, resumable=lost)


def run_with_session(world: World, *, resumed: bool, budget: bool, keep: bool) -> RunSession:
    """private_train's lifecycle, as it reads with the session."""
    session = world.session = session_of(world, resumed=resumed, budget=budget, keep=keep)
    with session:
        world.point()  # registered_source
        if not resumed and budget:
            session.reserve(NEW_CHARGE)
        world.point()  # build_loop, _same_stream, initial_weights
        session.start(world.loop, run_id="run-0" if resumed else None)
        world.point()  # reopen_run / open_run
        run_id = "run-0" if resumed else "run-1"
        session.track(FakeCheckpointer(world), run_id)
        world.train()
        session.commit()
    return session


def run_as_before(world: World, *, resumed: bool, budget: bool, keep: bool) -> None:
    """private_train's lifecycle before the session (two try blocks and their flags), transcribed with the
    fakes: the reference the session must reproduce call for call."""
    store, ledger = world.store, world.ledger
    saved = {"charge_id": OLD_CHARGE if budget else None, "run_id": "run-0"} if resumed else None
    charge_id = None
    try:
        world.point()
        if saved:
            charge_id = saved["charge_id"]
        elif budget:
            charge_id = NEW_CHARGE
            store.write_reservation(charge_id, ledger.url)
            ledger.reserve(charge_id)
        world.point()
    except BaseException:
        if saved is None:
            if charge_id is not None:
                ledger.abort(charge_id)
            store.remove()
        store.unlock()
        raise
    run_id = saved["run_id"] if saved else None
    checkpointer = None
    finished = resumable = False
    try:
        world.point()
        run_id = run_id or "run-1"
        checkpointer = FakeCheckpointer(world)
        world.train()
        finished = True
    except BaseException as err:
        resumable = lost(err) and checkpointer is not None
        raise
    finally:
        if charge_id is not None and not resumable:
            ledger.commit(charge_id, world.loop, run_id)
        if finished and keep:
            store.mark_finished()
        elif resumable:
            checkpointer.record_spent(world.loop)
        elif finished or charge_id is not None:
            store.remove()
        elif checkpointer is not None:
            checkpointer.record_spent(world.loop)
        store.unlock()


def outcome(run, world: World, **kwargs) -> Optional[type]:
    try:
        run(world, **kwargs)
    except BaseException as err:  # noqa: B902 - KeyboardInterrupt is one of the outcomes
        return type(err)
    return None


# ---------------------------------------------------------------- each exit path
def test_a_completed_run_commits_its_steps_once_and_removes_its_folder():
    world = World(["ok"] * 4 + ["ok"] * 5)  # source, reserve, build, open; then five private steps
    session = run_with_session(world, resumed=False, budget=True, keep=False)
    assert session.state == COMMITTED and session.left == LEFT
    assert world.log == [("write_reservation", NEW_CHARGE, LEDGER_URL), ("reserve", NEW_CHARGE),
                         ("commit", NEW_CHARGE, 5, "run-1"), ("remove",), ("unlock",)]


def test_a_completed_run_with_checkpoint_keep_marks_its_folder_finished():
    world = World(["ok"] * 6)
    session = run_with_session(world, resumed=False, budget=True, keep=True)
    assert session.state == COMMITTED
    assert world.log[-3:] == [("commit", NEW_CHARGE, 2, "run-1"), ("mark_finished",), ("unlock",)]


def test_an_error_before_the_first_private_query_releases_the_reservation_once():
    world = World(["ok", "ok", "fail"])  # registered_source, reserve, then build_loop fails
    with pytest.raises(Crash):
        run_with_session(world, resumed=False, budget=True, keep=False)
    assert world.log == [("write_reservation", NEW_CHARGE, LEDGER_URL), ("reserve", NEW_CHARGE),
                         ("abort", NEW_CHARGE), ("remove",), ("unlock",)]


def test_a_refused_reservation_is_aborted_in_the_ledger_that_wrote_nothing():
    world = World(refuse=True)
    session = session_of(world)
    with pytest.raises(Refused), session:
        session.reserve(NEW_CHARGE)
    assert session.state == ABORTED and not world.reserved
    # the folder recorded the charge first, so the abort (a no-op in the ledger) settles it all the same
    assert world.log == [("write_reservation", NEW_CHARGE, LEDGER_URL), ("abort", NEW_CHARGE), ("remove",),
                         ("unlock",)]


def test_a_resumed_run_that_fails_before_it_starts_keeps_its_reservation_and_checkpoint():
    world = World(["fail"])
    with pytest.raises(Crash):
        run_with_session(world, resumed=True, budget=True, keep=False)
    assert world.log == [("unlock",)]  # the reservation covers steps an earlier process ran


def test_a_crash_after_private_steps_commits_the_steps_executed_and_removes_the_folder():
    world = World(["ok"] * 4 + ["ok"] * 7 + ["fail"])
    session = None
    with pytest.raises(Crash):
        session = run_with_session(world, resumed=False, budget=True, keep=True)
    assert session is None  # raised through the with block
    assert world.calls("commit") == [("commit", NEW_CHARGE, 7, "run-1")]
    assert world.log[-2:] == [("remove",), ("unlock",)]  # a committed charge cannot be resumed, kept or not
    assert not world.calls("abort") and not world.calls("mark_finished")


def test_a_crash_while_opening_the_mlflow_run_commits_under_no_run_id():
    world = World(["ok", "ok", "ok", "fail"])  # registered_source, reserve, build, then open_run fails
    with pytest.raises(Crash):
        run_with_session(world, resumed=False, budget=True, keep=False)
    assert world.log[-3:] == [("commit", NEW_CHARGE, 0, None), ("remove",), ("unlock",)]


def test_a_lost_cluster_keeps_the_reservation_and_the_checkpoint_for_resume():
    world = World(["ok"] * 4 + ["ok"] * 4 + ["lost"])
    with pytest.raises(ClusterLost):
        run_with_session(world, resumed=False, budget=True, keep=False)
    assert world.log == [("write_reservation", NEW_CHARGE, LEDGER_URL), ("reserve", NEW_CHARGE),
                         ("record_spent", 4), ("unlock",)]
    assert NEW_CHARGE in world.reserved and not world.calls("commit") and not world.calls("abort")


def test_a_lost_cluster_before_the_checkpoint_exists_is_a_crash():
    world = World(["ok", "ok", "ok", "lost"])  # lost while opening the run: nothing to resume from
    with pytest.raises(ClusterLost):
        run_with_session(world, resumed=False, budget=True, keep=False)
    assert world.log[-3:] == [("commit", NEW_CHARGE, 0, None), ("remove",), ("unlock",)]


def test_a_crash_without_a_budget_keeps_its_checkpoint_with_the_steps_spent():
    world = World(["ok"] * 3 + ["ok"] * 3 + ["fail"])  # source, build, open; three steps
    with pytest.raises(Crash):
        run_with_session(world, resumed=False, budget=False, keep=False)
    assert world.log == [("record_spent", 3), ("unlock",)]


@pytest.mark.parametrize("at", [1, 2, 6])
def test_keyboard_interrupt_settles_like_any_error_and_propagates(at):
    """Before the first private query (at 1: during the reservation; 2: building the loop) the reservation
    is released; after it, the steps executed are committed. The interrupt itself goes on to the caller
    (the CLI's exit code 130)."""
    world = World(["ok"] * at + ["interrupt"])
    with pytest.raises(KeyboardInterrupt):
        run_with_session(world, resumed=False, budget=True, keep=False)
    settled = world.calls("commit") + world.calls("abort")
    assert len(settled) == 1 and world.calls("unlock") == [("unlock",)]
    assert settled[0][0] == ("abort" if at < 3 else "commit")


def test_leaving_the_block_before_starting_releases_like_an_error():
    world = World()
    with session_of(world) as session:
        session.reserve(NEW_CHARGE)
    assert session.state == ABORTED and world.log[-3:] == [("abort", NEW_CHARGE), ("remove",), ("unlock",)]


def test_leaving_the_block_while_running_commits_as_completed():
    world = World()
    with session_of(world) as session:
        session.reserve(NEW_CHARGE)
        session.start(world.loop, run_id="run-1")
    assert session.state == COMMITTED and world.calls("commit") == [("commit", NEW_CHARGE, 0, "run-1")]


def test_a_commit_the_ledger_refuses_is_never_retried_by_the_session():
    """The state is entered before its effects: the error propagates, nothing is settled twice, and the
    folder stays as it was (with its checkpoint and reservation) until the process exits."""
    world = World(commit_fails=True)
    session = session_of(world)
    with pytest.raises(ConnectionError), session:
        session.reserve(NEW_CHARGE)
        session.start(world.loop)
        session.track(FakeCheckpointer(world), "run-1")
        session.commit()
    assert session.state == COMMITTED
    assert world.log[-1] == ("commit", NEW_CHARGE, 0, "run-1") and len(world.calls("commit")) == 1


# ---------------------------------------------------------------- illegal transitions
def _reserved(resumed=False, budget=True):
    world = World()
    session = session_of(world, resumed=resumed, budget=budget)
    return world, session


def _running(resumed=False, track=True, budget=True):
    world, session = _reserved(resumed, budget)
    if not resumed and budget:
        session.reserve(NEW_CHARGE)
    session.start(world.loop, run_id="run-1")
    if track:
        session.track(FakeCheckpointer(world), "run-1")
    return world, session


ILLEGAL = {
    "commit before start": (lambda: _reserved(), lambda s: s.commit()),
    "track before start": (lambda: _reserved(), lambda s: s.track(object(), "run-1")),
    "reserve a resumed run": (lambda: _reserved(resumed=True), lambda s: s.reserve(NEW_CHARGE)),
    "reserve twice": (lambda: _running(track=False), lambda s: s.reserve("another")),
    "abort a resumed run": (lambda: _reserved(resumed=True), lambda s: s.abort()),
    "keep a new run that never started": (lambda: _reserved(), lambda s: s.keep_for_resume()),
    "start twice": (lambda: _running(), lambda s: s.start(object())),
    "reserve after start": (lambda: _running(), lambda s: s.reserve("another")),
    "abort after private steps": (lambda: _running(), lambda s: s.abort()),
    "track twice": (lambda: _running(), lambda s: s.track(object(), "run-1")),
    "keep a charged run without a checkpoint": (lambda: _running(track=False), lambda s: s.keep_for_resume()),
    "commit a crash without a charge": (lambda: _running(budget=False), lambda s: s.commit(finished=False)),
}


@pytest.mark.parametrize("name", sorted(ILLEGAL))
def test_an_illegal_transition_raises_and_does_nothing(name):
    make, act = ILLEGAL[name]
    world, session = make()
    state, log = session.state, list(world.log)
    with pytest.raises(IllegalTransition):
        act(session)
    assert session.state == state and world.log == log


@pytest.mark.parametrize("end", ["commit", "abort", "keep_for_resume", "fail"])
def test_a_settled_session_allows_no_further_transition(end):
    world = World()
    session = session_of(world)
    session.reserve(NEW_CHARGE)
    if end in ("commit", "keep_for_resume"):
        session.start(world.loop)
        session.track(FakeCheckpointer(world), "run-1")
    getattr(session, end)(*([Crash()] if end == "fail" else []))
    log = list(world.log)
    for act in (lambda: session.commit(), lambda: session.abort(), lambda: session.keep_for_resume(),
                lambda: session.fail(Crash()), lambda: session.start(world.loop), lambda: session.reserve("x"),
                lambda: session.track(object(), "run-1")):
        with pytest.raises(IllegalTransition):
            act()
    assert world.log == log
    with pytest.raises(IllegalTransition):
        session.__enter__()


def test_states_in_order():
    world, session = _reserved()
    assert session.state == RESERVED
    session.reserve(NEW_CHARGE)
    assert session.state == RESERVED
    session.start(world.loop)
    assert session.state == RUNNING
    session.track(FakeCheckpointer(world), "run-1")
    session.fail(ClusterLost())
    assert session.state == KEPT_FOR_RESUME


# ---------------------------------------------------------------- any sequence of events
EVENTS = st.tuples(st.integers(min_value=0, max_value=10), st.sampled_from([None, "fail", "lost", "interrupt"]))


@settings(max_examples=300, deadline=None)
@given(events=EVENTS, resumed=st.booleans(), budget=st.booleans(), keep=st.booleans(), refuse=st.booleans())
def test_every_sequence_of_events_settles_once_and_as_before(events, resumed, budget, keep, refuse):
    ok, last = events
    sequence = ["ok"] * ok + ([last] if last else [])
    world, before = World(sequence, refuse=refuse), World(sequence, refuse=refuse)
    raised = outcome(run_with_session, world, resumed=resumed, budget=budget, keep=keep)
    assert raised == outcome(run_as_before, before, resumed=resumed, budget=budget, keep=keep)
    assert world.log == before.log  # the same calls, in the same order: no change in behaviour

    session, steps = world.session, world.loop.tracker.steps
    settled = world.calls("commit") + world.calls("abort")
    assert session.state in (COMMITTED, KEPT_FOR_RESUME, ABORTED)
    assert world.calls("unlock") == [("unlock",)]
    if session.state == KEPT_FOR_RESUME or session.charge_id is None:
        assert settled == []  # the reservation (if any) stays for --resume
    else:  # exactly once, and with what was executed
        assert settled == ([("abort", session.charge_id)] if session.state == ABORTED else
                           [("commit", session.charge_id, steps, session.run_id)])
    if session.state == ABORTED:  # released only when nothing private ran, and only for a new run
        assert session.loop is None and not resumed and world.log[-2:] == [("remove",), ("unlock",)]
    if session.state == KEPT_FOR_RESUME:
        assert not world.calls("remove") and not world.calls("mark_finished")
        assert world.calls("record_spent") == ([("record_spent", steps)] if session.checkpointer else [])
    if raised is None:
        assert session.state == COMMITTED
    elif raised is ClusterLost and session.checkpointer is not None:
        assert session.state == KEPT_FOR_RESUME
    elif session.loop is None:  # before the first private query
        assert session.state == (KEPT_FOR_RESUME if resumed else ABORTED)
    else:  # a crash or an interrupt after it: charged, unless there is no charge to commit
        assert session.state == (COMMITTED if session.charge_id is not None else KEPT_FOR_RESUME)

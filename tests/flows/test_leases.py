"""Reservation leases: a dead run's reservation is settled at the bound it recorded once its lease runs out,
never below what it ran, and a run whose charge was settled stops before its next private query."""
import datetime as dt
import time
from types import SimpleNamespace

import dp_accounting
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from components.accountants.accounting import Accountant, PrivacyTracker, ScheduledTracker, SelectionTracker
from flows.checkpoints import charged_through
from flows.ledger import ChargeRow, PrivacyLedger
from flows.ledger.leases import LeaseLost
from flows.ledger.schema import utc_now
from flows.session import COMMITTED, RunSession
from tests.flows.test_ledger import DELTA, _reserve, composed_eps, run_event

STEP = dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.2))


def _lease(ledger, charge_id, **values):
    with Session(ledger.engine) as session, session.begin():
        session.execute(update(ChargeRow).where(ChargeRow.id == charge_id).values(**values))


def test_every_dead_reservation_is_settled_at_its_bound_and_no_live_one(tmp_path, monkeypatch, capsys):
    """Five reservations when the next run reserves: one that recorded no private query (aborted), one that
    started (its planned run whole), one that began a chunk (that chunk's bound), one whose run still renews,
    and one an earlier privzo made without a lease. Only the first three are settled, each never below its
    bound; a renewal of a settled charge raises; budget show names each open one and its command."""
    from flows.cli import main

    url = f"sqlite:///{tmp_path / 'l.db'}"
    ledger = PrivacyLedger(url)
    before, started, in_chunk, live, old = [_reserve(ledger, 100.0) for _ in range(5)]
    ledger.renew(started, planned=True, run_id="run-started")
    ledger.renew(in_chunk, planned=True)
    ledger.renew(in_chunk, bound=(dp_accounting.SelfComposedDpEvent(STEP, 40), 40), run_id="run-in-chunk")
    ledger.renew(live)
    for dead in (before, started, in_chunk):  # their runs stopped renewing a while ago
        _lease(ledger, dead, lease_until=utc_now() - dt.timedelta(seconds=5))
    _lease(ledger, old, lease_until=None)
    assert main(["budget", "show", "patients", "--ledger", url]) == 0
    shown = capsys.readouterr().out
    assert "5 open reservations:" in shown
    assert f"{before} run 'r'" in shown and "released: it recorded no private query" in shown
    assert "committed at its recorded bound, 200 of 200 steps" in shown and "40 of 200 steps" in shown
    assert f"privzo budget settle patients --ledger {url}" in shown and "running, its lease renewed until" in shown
    assert "no lease (reserved by an earlier privzo)" in shown

    nxt = _reserve(ledger, 100.0)  # the next run's reservation settles the dead ones first
    status = {c.id: (c.status, c.steps_run, c.run_id) for c in ledger.history("patients")}
    assert status[before] == ("aborted", 0, None)
    assert status[started] == ("committed", 200, "run-started")
    assert status[in_chunk] == ("committed", 40, "run-in-chunk")
    assert status[live][0] == status[old][0] == status[nxt][0] == "reserved"
    (cut,) = [c for c in ledger.history("patients") if c.id == in_chunk]
    assert cut.event == dp_accounting.SelfComposedDpEvent(STEP, 40)
    # committed: run-started (200), in-chunk (40); reserved: live, old, next (200 each)
    assert ledger.spent("patients") == pytest.approx(composed_eps(
        [run_event(), dp_accounting.SelfComposedDpEvent(STEP, 40), run_event(), run_event(), run_event()]), rel=1e-6)
    with pytest.raises(LeaseLost, match=rf"^ledger: charge {in_chunk} is committed, no longer reserved"):
        ledger.renew(in_chunk, bound=(dp_accounting.SelfComposedDpEvent(STEP, 80), 80))
    assert main(["budget", "settle", "patients", "--ledger", url]) == 0
    assert "no reservation whose lease ran out; 3 open" in capsys.readouterr().out


def test_the_next_run_fits_once_a_dead_runs_reservation_is_settled(tmp_path, monkeypatch):
    """A lifetime that holds one planned run and a cut one but not two planned runs: while a dead run's lease
    is live its reservation refuses the next run; once it ran out, the next run is admitted, the dead one
    charged its 40 steps."""
    from flows.ledger import BudgetExceeded

    monkeypatch.setenv("PRIVZO_LEASE_SECONDS", "2")
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    lifetime = composed_eps([run_event(), dp_accounting.SelfComposedDpEvent(STEP, 40)]) * 1.05
    assert composed_eps([run_event(), run_event()]) > lifetime
    dead = _reserve(ledger, lifetime)
    ledger.renew(dead, bound=(dp_accounting.SelfComposedDpEvent(STEP, 40), 40))
    with pytest.raises(BudgetExceeded):
        _reserve(ledger, lifetime)
    time.sleep(2.2)
    _reserve(ledger, lifetime)
    assert [(c.status, c.steps_run) for c in ledger.history("patients")][0] == ("committed", 40)


def test_a_chunks_bound_covers_every_step_it_may_run_and_moves_no_tracker():
    acc = Accountant("rdp", "add_remove")
    plain = PrivacyTracker(acc, STEP, DELTA)
    plain.steps = 20
    assert charged_through(plain, 20, 50) == (dp_accounting.SelfComposedDpEvent(STEP, 50), 50) and plain.steps == 20
    two = ScheduledTracker(acc, (1.0, 2.0), 10, DELTA)
    two.steps, two.starts = 22, 3  # restarts at 0, 10, 20; a chunk 22..45 adds those at 30 and 40
    event, steps = charged_through(two, 22, 45)
    bounded = ScheduledTracker(acc, (1.0, 2.0), 10, DELTA)
    bounded.steps, bounded.starts = 45, 5
    assert (event, steps) == (bounded.event(), 45) and (two.steps, two.starts) == (22, 3)
    selected = SelectionTracker(PrivacyTracker(acc, STEP, DELTA), lambda e: dp_accounting.ComposedDpEvent([e, e]))
    event, steps = charged_through(selected, 0, 10)
    assert steps == 10 and event == dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(STEP, 10)] * 2)
    assert selected.steps == 0


class _Ledger:
    url = "sqlite://"

    def __init__(self, lost_after: int = 10 ** 9):
        self.renewals, self.commits, self.lost_after = [], [], lost_after

    def reserve(self, charge_id):
        pass

    def renew(self, charge_id, bound=None, planned=False, run_id=None):
        self.renewals.append((bound, planned, run_id))
        if len(self.renewals) > self.lost_after:
            raise LeaseLost(charge_id, "committed")

    def commit(self, charge_id, loop, run_id):
        self.commits.append(charge_id)
        return 1.0


class _Store:
    def __init__(self):
        self.removed = self.unlocked = 0

    def write_reservation(self, charge_id, url):
        pass

    def remove(self):
        self.removed += 1

    def unlock(self):
        self.unlocked += 1


def test_a_session_renews_while_it_lives_and_stops_where_its_charge_was_settled():
    """The heartbeat renews between chunks; start records the planned run whole; a chunk's bound goes to
    the ledger before its queries. A settled charge (LeaseLost) ends the run without a second settlement."""
    ledger, store = _Ledger(), _Store()
    with RunSession(store, ledger, renew_every=0.05) as session:
        session.reserve("c1")
        session.start(SimpleNamespace(), run_id="run-1")
        session.bound("event", 40)
        time.sleep(0.3)
        assert ledger.renewals[0] == (None, True, "run-1") and ledger.renewals[1] == (("event", 40), False, None)
        assert len(ledger.renewals) >= 4  # the heartbeat's, beside them
    assert ledger.commits == ["c1"]
    beats = len(ledger.renewals)
    time.sleep(0.2)
    assert len(ledger.renewals) == beats  # settled: no more renewals

    ledger, store = _Ledger(lost_after=1), _Store()
    with pytest.raises(LeaseLost):
        with RunSession(store, ledger, renew_every=60) as session:
            session.reserve("c2")
            session.start(SimpleNamespace())
            session.bound("event", 40)  # the charge was settled meanwhile: stops before the chunk's queries
    assert session.state == COMMITTED and ledger.commits == [] and (store.removed, store.unlocked) == (1, 1)


@pytest.mark.parametrize("raw", ["0", "-5", "nan", "inf", "ten", "0.5"])
def test_a_lease_length_that_is_not_one_is_refused_in_one_line(monkeypatch, raw):
    from flows.ledger.leases import lease_seconds

    monkeypatch.setenv("PRIVZO_LEASE_SECONDS", raw)
    with pytest.raises(ValueError, match=rf"^PRIVZO_LEASE_SECONDS: '{raw}' is not a lease length; give seconds, at "
                                         r"least 1 \(default 600\)$"):
        lease_seconds()


def test_every_reservation_a_flow_makes_is_held_by_a_run_session():
    """The heartbeat is the run session's, so a reservation made anywhere else would never be renewed and would
    be settled as a dead run's while its run still ran (a tune rehearsal's did): in flows/ and components/ the
    ledger's ``reserve`` is called by the run session alone, through ``RunLedger.reserve`` (reserve_budget's one
    caller)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    callers = set()
    for path in sorted((root / "flows").rglob("*.py")) + sorted((root / "components").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(scope):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                    if name in ("reserve", "reserve_budget"):
                        on = ast.unparse(node.func.value) if isinstance(node.func, ast.Attribute) else ""
                        callers.add((path.relative_to(root).as_posix(), scope.name, f"{on}.{name}".lstrip(".")))
    # a flow reserves through its session; the session through its RunLedger; that through reserve_budget alone
    flows_reserving = {c for c in callers if c[2] == "session.reserve"}
    assert flows_reserving and {c[0] for c in flows_reserving} <= {"flows/private_train.py", "flows/tune.py"}
    assert callers - flows_reserving == {("flows/session.py", "reserve", "self.ledger.reserve"),
                                         ("flows/tasks.py", "reserve", "reserve_budget"),
                                         ("flows/tasks.py", "reserve_budget", "budget.ledger.reserve")}, callers

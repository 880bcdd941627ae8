"""A PostgreSQL ledger rides out its server's outages: a call whose connection dropped, or whose answer was lost
after its COMMIT, is retried whole and writes one charge; an outage longer than the wait is refused in one line;
nothing else is retried."""
import sqlite3
import time

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session

import flows.ledger.outages as outages
from flows.ledger import PrivacyLedger
from flows.ledger.errors import LedgerOutage
from tests.flows.test_ledger import _reserve, composed_eps, run_event


def _wrapped(orig, invalidated=False):
    return sa.exc.OperationalError("SELECT 1", {}, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize("err, retried", [
    (_wrapped(psycopg.OperationalError("connection refused")), True),  # no server answered at all
    (_wrapped(psycopg.errors.AdminShutdown("terminating connection")), True),  # 57P01: a restart, a stop
    (_wrapped(psycopg.errors.CannotConnectNow("the database system is starting up")), True),  # 57P03
    (_wrapped(psycopg.errors.ConnectionFailure("lost")), True),  # class 08
    (_wrapped(psycopg.errors.SerializationFailure("could not serialize")), True),  # 40001
    (_wrapped(psycopg.errors.DeadlockDetected("deadlock")), True),  # 40P01
    (_wrapped(psycopg.errors.UniqueViolation("duplicate key"), invalidated=True), True),  # its connection is gone
    (sa.exc.IntegrityError("INSERT", {}, psycopg.errors.UniqueViolation("duplicate key")), False),
    (sa.exc.ProgrammingError("UPDATE", {}, psycopg.errors.InsufficientPrivilege("permission denied")), False),
    (sa.exc.DataError("INSERT", {}, psycopg.errors.NumericValueOutOfRange("out of range")), False),
    (_wrapped(sqlite3.OperationalError("database is locked")), False),  # SQLite's busy timeout is its own wait
    (ValueError("ledger: charge c is not reserved"), False),
    (ConnectionError("not a database error"), False),
])
def test_only_a_lost_connection_or_a_rolled_back_transaction_is_an_outage(err, retried):
    assert outages.transient(err) is retried


@pytest.mark.parametrize("raw", ["soon", "-1", "inf", "nan"])
def test_a_wait_that_is_not_seconds_is_refused_in_one_line(monkeypatch, raw):
    monkeypatch.setenv(outages.WAIT_ENV, raw)
    with pytest.raises(ValueError, match=rf"^PRIVZO_LEDGER_WAIT_SECONDS: '{raw}' is not a wait; give seconds") as e:
        outages.wait_seconds()
    assert "\n" not in str(e.value)


def _terminate_during(ledger, url, statement):
    """The first time ``statement`` starts on ``ledger``'s connection, the server ends that connection (what a
    restart does to it), so the statement and its transaction fail."""
    admin = sa.create_engine(url.split("?")[0])
    done = []

    @event.listens_for(ledger.engine, "before_cursor_execute")
    def cut(conn, _cursor, sql, *_):
        if not done and sql.lstrip().upper().startswith(statement):
            done.append(sql)
            with admin.begin() as other:
                other.execute(sa.text("SELECT pg_terminate_backend(:p)"),
                              {"p": conn.connection.dbapi_connection.info.backend_pid})
    return done, admin


def _lose_answers():
    """Each time ``armed`` holds an item, the next transaction's COMMIT goes through but its caller hears a
    dropped connection."""
    armed = []

    def after_commit(_session):
        if armed:
            armed.pop()
            raise _wrapped(psycopg.OperationalError("server closed the connection unexpectedly"), invalidated=True)
    event.listen(Session, "after_commit", after_commit)
    return armed, lambda: event.remove(Session, "after_commit", after_commit)


def test_a_reservation_and_a_commit_cut_mid_transaction_or_after_it_are_charged_once(postgres_url):
    ledger = PrivacyLedger(postgres_url)
    cut, admin = _terminate_during(ledger, postgres_url, "INSERT INTO PRIVZO_CHARGES")
    armed, stop = _lose_answers()
    try:
        cut_mid = _reserve(ledger, 100.0, dataset="cut")  # its connection ended mid-transaction: nothing written, retried
        assert cut, "the reservation's INSERT was never cut"
        armed.append("reserve")
        lost_answer = _reserve(ledger, 100.0, dataset="cut")  # written, then retried: the retry finds its charge
        armed.append("commit")
        ledger.commit(lost_answer, run_event(100), 100)
        ledger.commit(cut_mid, run_event(), 200)
        assert not armed
    finally:
        stop()
        admin.dispose()
    charges = {c.id: (c.status, c.steps_run) for c in ledger.history("cut")}
    assert charges == {cut_mid: ("committed", 200), lost_answer: ("committed", 100)}
    assert ledger.spent("cut") == pytest.approx(composed_eps([run_event(), run_event(100)]), rel=1e-6)


def test_an_outage_longer_than_the_wait_is_refused_in_one_line_having_written_nothing(postgres_url, monkeypatch):
    ledger = PrivacyLedger(postgres_url)
    charge = _reserve(ledger, 100.0, dataset="outage")
    spent = ledger.spent("outage")
    monkeypatch.setenv(outages.WAIT_ENV, "1.5")
    real = ledger.engine
    ledger.engine = sa.create_engine("postgresql+psycopg://privzo:privzo@127.0.0.1:1/privzo")  # nothing listens
    began = time.monotonic()
    with pytest.raises(LedgerOutage, match=r"^budget.ledger: the ledger at .* did not answer \(.*; waited 1.5 s\); "
                                           r"a reservation this run holds is settled at its recorded bound") as e:
        ledger.commit(charge, run_event(), 200)
    assert 1.0 <= time.monotonic() - began < 10 and "\n" not in str(e.value)
    ledger.engine.dispose()
    ledger.engine = real  # the server is back: the charge is still reserved at its planned run, as it was
    assert [(c.id, c.status) for c in ledger.history("outage")] == [(charge, "reserved")]
    assert ledger.spent("outage") == pytest.approx(spent, rel=1e-9)


def test_a_sqlite_ledger_is_never_retried(tmp_path, monkeypatch):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    calls = []
    real = PrivacyLedger.spent.__wrapped__

    def flaky(self, *args, **kwargs):
        calls.append(1)
        raise _wrapped(psycopg.OperationalError("as if"), invalidated=True)
    monkeypatch.setattr(PrivacyLedger, "spent", outages._retried(flaky))
    with pytest.raises(sa.exc.OperationalError):
        ledger.spent("outage")
    assert calls == [1]
    assert real(ledger, "patients") == 0.0


def test_every_public_ledger_call_rides_out_an_outage():
    """The class, not a list: every public method of the ledger (and of its bases) is retried, and reserve
    through its one transaction, so a method added later is covered without being named."""
    import inspect

    public = {name for klass in PrivacyLedger.__mro__[:-1] for name, value in vars(klass).items()
              if not name.startswith("_") and inspect.isfunction(value)}
    assert {"reserve", "commit", "renew", "settle_expired", "spent", "grant", "migrate_ids"} <= public
    unretried = {name for name in public if not hasattr(getattr(PrivacyLedger, name), "__wrapped__")}
    assert unretried == {"reserve"} and hasattr(PrivacyLedger._reserve, "__wrapped__")

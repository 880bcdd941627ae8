"""A PostgreSQL ledger outlives its server's restart: every ledger call a run makes is one transaction, retried
whole when the server drops or refuses the connection (a restart, a failover, a stop of a minute) or rolls the
transaction back for a serialization failure or a deadlock, for up to ``PRIVZO_LEDGER_WAIT_SECONDS`` (default
120), then refused in one line (``LedgerOutage``).

Why a retry is exact: a transaction that failed before its COMMIT wrote nothing, and one whose COMMIT went
through but whose answer was lost is found again by the retry, since each retried call is idempotent: a
reservation under its charge id (``PrivacyLedger._reserve`` returns the charge it finds), a commit of the same
steps (``commit``), a renewal, an abort, a settlement (``settle_expired`` settles only what is still open), and
every read. SQLite's own waits (its busy timeout) are not outages and are left alone."""
from __future__ import annotations

import functools
import time
from typing import Iterable

from flows.ledger.errors import LedgerOutage, driver_reason, shown_url
from flows.ledger.leases import env_seconds

WAIT_ENV = "PRIVZO_LEDGER_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 120.0
# what a server restart or stop raises (psycopg's OperationalError family: a connection lost, refused or shut
# down by the administrator) and what a rolled-back transaction may be retried for
TRANSIENT_SQLSTATE_CLASSES = ("08", "57")  # connection exception; operator intervention (admin shutdown)
RETRIED_SQLSTATES = ("40001", "40P01")  # serialization failure, deadlock detected


def wait_seconds() -> float:
    """How long one ledger call waits out an outage: ``PRIVZO_LEDGER_WAIT_SECONDS`` (default 120)."""
    return env_seconds(WAIT_ENV, DEFAULT_WAIT_SECONDS, 0, "a wait")


def transient(err: BaseException) -> bool:
    """A lost or refused connection to a PostgreSQL server, or a transaction it rolled back to be retried."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(err, DBAPIError):
        return False
    if err.connection_invalidated:
        return True
    try:
        import psycopg
    except ImportError:  # pragma: no cover - PostgreSQL ledgers need psycopg
        return False
    orig = err.orig
    if not isinstance(orig, psycopg.Error):
        return False
    state = getattr(orig, "sqlstate", None)
    if state is None:  # no answer from a server at all: refused, reset, shutting down
        return isinstance(orig, psycopg.OperationalError)
    return state.startswith(TRANSIENT_SQLSTATE_CLASSES) or state in RETRIED_SQLSTATES


def ride_out(also: Iterable[str] = (), besides: Iterable[str] = ()):
    """A class decorator: every public method of the class and its bases, and each private one in ``also``, is
    retried whole across a PostgreSQL outage (module docstring); those in ``besides`` are not (a method whose
    transaction is one of ``also``, retried there)."""
    import inspect

    def wrap(cls):
        skipped = set(besides)
        names = {name for klass in cls.__mro__[:-1] for name, value in vars(klass).items()
                 if not name.startswith("_") and inspect.isfunction(value)} | set(also)
        for name in sorted(names - skipped):
            setattr(cls, name, _retried(getattr(cls, name)))
        return cls
    return wrap


def _retried(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if str(self.url).startswith("sqlite"):
            return method(self, *args, **kwargs)
        wait = wait_seconds()
        deadline, delay = time.monotonic() + wait, 0.25
        while True:
            try:
                return method(self, *args, **kwargs)
            except Exception as err:  # noqa: BLE001 - only a transient database error is retried
                if not transient(err):
                    raise
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LedgerOutage(shown_url(self.url), f"{driver_reason(err)}; waited {wait:g} s") from None
            time.sleep(min(delay, left))  # the last try falls on the deadline
            delay = min(2 * delay, 5.0)
    return call

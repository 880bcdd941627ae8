"""Reservation leases (docs/design.md, Leases): a run holds its reservation only while it lives.

A run renews its reservation's lease while its process lives (``RunSession``'s heartbeat) and, before the
first private query of each chunk, records with the renewal what it is charged if it dies inside that
chunk: its bound, the event of every step up to the chunk's end. A reservation whose lease ran out is
settled by the next reservation on its dataset (or by ``privzo budget settle``): committed at its bound, or
aborted when no bound was ever recorded (no private query was made). Why that never under-charges: a run
makes a chunk's queries only after a renewal that (a) found its charge still reserved and (b) recorded that
chunk's bound, in one statement; the settlement reads the bound after locking the charge's row and seeing
its lease expired. So either the renewal came first, and the bound read covers every step the run can make
before its next renewal (which then fails: the charge is no longer reserved), or the settlement came first,
and the renewal fails before the chunk's first query. Clocks only decide when a lease is seen expired: a
settler whose clock runs ahead settles early, never short."""
from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from typing import Optional

from specs.refusal import RuntimeRefusal

LEASE_ENV = "PRIVZO_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 600.0


def lease_seconds() -> float:
    """How long a reservation outlives its run's last renewal: ``PRIVZO_LEASE_SECONDS`` (default 600). A run
    renews every fifth of it, so a stalled ledger connection misses several renewals before the lease ends."""
    return env_seconds(LEASE_ENV, DEFAULT_LEASE_SECONDS, 1, "a lease length")


def env_seconds(name: str, default: float, least: float, what: str) -> float:
    """Seconds from environment variable ``name`` (``default`` when unset), at least ``least``; a ValueError in one
    line naming what it is and what is allowed otherwise."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value >= least and value < float("inf")):
        raise ValueError(f"{name}: {raw!r} is not {what}; give seconds, at least {least:g} (default {default:g})")
    return value


def lease_end(now: dt.datetime) -> dt.datetime:
    return now + dt.timedelta(seconds=lease_seconds())


class LeaseLost(RuntimeRefusal):
    """A run's renewal found its charge no longer reserved: its lease ran out (a ledger unreachable for
    longer than the lease, a process paused) and the charge was settled at its last bound, or it was closed
    otherwise. The run stops before its next private query: what it ran is already charged."""

    def __init__(self, charge_id: str, status: Optional[str]):
        self.charge_id, self.status = charge_id, status
        super().__init__(f"ledger: charge {charge_id} is {status or 'unknown'}, no longer reserved: its lease ran out "
                         f"and it was settled (privzo budget history names what it was charged), or it was closed "
                         f"otherwise; this run stops before its next private query, and a new run starts afresh")


@dataclass(frozen=True)
class Settled:
    """A reservation settled after its lease ran out: ``committed`` at ``steps`` (its bound), or aborted
    (no private query was recorded)."""

    charge_id: str
    dataset: str
    run_name: str
    status: str
    steps: int
    lease_until: dt.datetime

    def line(self) -> str:
        what = (f"committed at its bound, {self.steps} steps" if self.status == "committed"
                else "released (it recorded no private query)")
        return (f"reservation {self.charge_id} of run {self.run_name!r} on dataset {self.dataset!r}: its lease ran out "
                f"at {self.lease_until:%Y-%m-%d %H:%M:%S} UTC; {what}")

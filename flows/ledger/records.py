"""What the ledger's reads return: a block of a dataset, a charge of a run."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Optional, Tuple

import dp_accounting


@dataclass(frozen=True)
class Block:
    """A block as ``blocks`` lists it: its terms, what its committed charges compose to, the epsilon with
    its open reservations, and how many charges it holds."""

    dataset: str
    block: str
    lifetime_epsilon: float
    delta: float
    rows: Optional[int]
    committed_epsilon: float
    epsilon: float
    charges: int
    created_at: dt.datetime


@dataclass(frozen=True)
class Charge:
    id: str
    dataset: str
    fingerprint: str
    run_name: str
    run_id: Optional[str]
    status: str
    steps_planned: int
    steps_run: int
    planned_epsilon: float
    event: dp_accounting.DpEvent  # executed if committed, planned otherwise
    created_at: dt.datetime
    planned: Optional[dp_accounting.DpEvent] = None  # what it reserved
    executed: Optional[dp_accounting.DpEvent] = None  # what it committed (None until then)
    blocks: Tuple[str, ...] = ()  # the blocks it is recorded on, sorted
    ledger: str = ""  # the URL of the ledger that holds it

"""``Reservation``: what a run asks the ledger to reserve (``PrivacyLedger.reserve``), as one value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, List, Mapping, Optional, Sequence

import dp_accounting

from flows.ledger.terms import BlockTerms, DatasetTerms


@dataclass(frozen=True)
class Reservation:
    """A run's planned charge on ``dataset``: ``planned`` (its DpEvent) over ``steps``, under the lifetime
    ``lifetime_epsilon`` at ``delta`` composed with ``accountant`` under ``neighboring``; ``fingerprint``
    (the keyed fingerprint of its private rows) and ``run_name`` are recorded with the charge.

    ``private_rows`` (keyed fingerprints of this run's private rows) are recorded for the dataset, and
    ``exposed_rows`` (its public and test rows) must not be private in any run on any dataset of the
    ledger. Rows are matched by fingerprint, so ``row_layout`` (what fingerprints are computed from) must be
    the dataset's.

    ``terms``: the dataset's terms as the run's spec gives them (``DatasetTerms.of``), registered with a
    new dataset and checked against a registered one's in the reservation's transaction; None (a direct
    caller): only whether the run reads blocks is checked, and a new dataset's block terms stay unset.

    A dataset whose rows were recorded under ``legacy_layout`` (plain hashes, before rows were keyed) is
    re-keyed in the same transaction with ``legacy_rows`` (each of this run's rows: plain -> keyed),
    provided every recorded row is among them; otherwise the run is refused and nothing changes.
    ``ids_legacy_layout``: the layout an earlier privzo recorded for this run's source, whose person and row
    ids were read with type inference (components/data/identity.py): such a ledger is refused with the
    command that migrates it (``PrivacyLedger.migrate_ids``), since its keys cannot be matched as written.
    ``charge_id``: chosen by the caller, who records it before reserving (see flows.checkpoints).

    ``blocks``: the blocks the run reads (its window), each registered with its dataset's terms on first use; the
    run is reserved on every one of them or on none. None: the dataset's one block. ``next_block``: for
    a refusal's message, the block whose arrival brings budget, or ``when``: what to say given every
    block of the window without room (the window's own rule knows when it moves past them).
    ``row_blocks`` / ``person_blocks``: the block of every row (person) the run saw, recorded where none
    is yet; one recorded otherwise since the run read the ledger (a concurrent run saw the row first)
    refuses the run."""

    dataset: str
    fingerprint: str
    run_name: str
    planned: dp_accounting.DpEvent
    steps: int
    lifetime_epsilon: float
    delta: float
    accountant: str
    neighboring: str
    private_rows: Iterable[str] = ()
    exposed_rows: Iterable[str] = ()
    row_layout: str = ""
    legacy_layout: Optional[str] = None
    legacy_rows: Optional[Mapping[str, str]] = None
    ids_legacy_layout: Optional[str] = None
    charge_id: Optional[str] = None
    blocks: Optional[Sequence[BlockTerms]] = None
    next_block: Optional[str] = None
    row_blocks: Optional[Mapping[str, str]] = None
    person_blocks: Optional[Mapping[str, str]] = None
    when: Optional[Callable[[List[str]], str]] = None
    terms: Optional[DatasetTerms] = None

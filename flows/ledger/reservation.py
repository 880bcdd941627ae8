"""``Reservation``: what a run asks the ledger to reserve (``PrivacyLedger.reserve``), as one value: the
dataset's terms once, and the run's claim on them (its planned charge, the rows it reads, its window)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Mapping, Optional, Sequence

import dp_accounting

from flows.ledger.terms import BlockTerms, DatasetTerms


@dataclass(frozen=True)
class RowsRead:
    """The rows a run reads, as the ledger matches them. ``private`` (keyed fingerprints of its private rows)
    are recorded for the dataset, and ``exposed`` (its public and test rows) must not be private in any run on
    any dataset of the ledger. Rows are matched by fingerprint, so ``layout`` (what fingerprints are computed
    from) must be the dataset's.

    A dataset whose rows were recorded under ``legacy_layout`` (plain hashes, before rows were keyed) is
    re-keyed in the same transaction with ``legacy_rows`` (each of this run's rows: plain -> keyed),
    provided every recorded row is among them; otherwise the run is refused and nothing changes.
    ``ids_legacy_layout``: the layout an earlier privzo recorded for this run's source, whose person and row
    ids were read with type inference (components/data/identity.py): such a ledger is refused with the
    command that migrates it (``PrivacyLedger.migrate_ids``), since its keys cannot be matched as written."""

    private: Iterable[str] = ()
    exposed: Iterable[str] = ()
    layout: str = ""
    legacy_layout: Optional[str] = None
    legacy_rows: Optional[Mapping[str, str]] = None
    ids_legacy_layout: Optional[str] = None


@dataclass(frozen=True)
class WindowRead:
    """The blocks a run reads (its window), each registered with its dataset's terms on first use; the run is
    reserved on every one of them or on none. ``next_block``: for a refusal's message, the block whose
    arrival brings budget, or ``when``: what to say given every block of the window without room (the
    window's own rule knows when it moves past them). ``row_blocks`` / ``person_blocks``: the block of every
    row (person) the run saw, recorded where none is yet; one recorded otherwise since the run read the
    ledger (a concurrent run saw the row first) refuses the run."""

    blocks: Optional[Sequence[BlockTerms]]  # None: the dataset's one block (rows and persons still recorded)
    next_block: Optional[str] = None
    row_blocks: Optional[Mapping[str, str]] = None
    person_blocks: Optional[Mapping[str, str]] = None
    when: Optional[Callable[[List[str]], str]] = None


@dataclass(frozen=True)
class Reservation:
    """A run's planned charge: ``planned`` (its DpEvent) over ``steps`` on the dataset of ``terms`` (its
    lifetime at its delta, resolved, composed with its accountant under its neighbouring relation), registered
    with a new dataset and checked against a registered one's in the reservation's transaction;
    ``fingerprint`` (the keyed fingerprint of its private rows) and ``run_name`` are recorded with the charge.
    ``rows``: what it reads (``RowsRead``); ``window``: its blocks (``WindowRead``; None: the dataset's one
    block). ``charge_id``: chosen by the caller, who records it before reserving (see flows.checkpoints).

    ``block_terms`` False (a caller that gives only the dataset's lifetime terms): only whether the run reads
    blocks is checked, and a new dataset's block terms stay unset."""

    terms: DatasetTerms
    planned: dp_accounting.DpEvent
    steps: int
    fingerprint: str
    run_name: str
    rows: RowsRead = field(default_factory=RowsRead)
    window: Optional[WindowRead] = None
    charge_id: Optional[str] = None
    block_terms: bool = True

    def __post_init__(self):
        if self.terms.delta is None:
            raise ValueError("Reservation: the terms' delta must be resolved (a number), not auto")

    @property
    def dataset(self) -> str:
        return self.terms.dataset

    @property
    def given_terms(self) -> Optional[DatasetTerms]:
        """The terms to check and register in full; None where the caller gave no block terms."""
        return self.terms if self.block_terms else None

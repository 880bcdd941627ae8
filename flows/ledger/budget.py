"""``Budget``: one run's handle on its privacy budget, opened once where the run starts and handed to every step
that reads or charges it (its window, its checkpoint's reservation, its reservation and commit, the model it
starts from, its budget table), so that no step opens a ledger by its URL."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Tuple

from flows.ledger.core import PrivacyLedger, ledger_for_spending
from flows.ledger.leases import Settled
from flows.ledger.terms import DatasetTerms

if TYPE_CHECKING:
    import specs


@dataclass(frozen=True)
class Budget:
    """The ledger a run is charged to (``url`` as its spec names it, recorded with a reservation in the run's
    checkpoint folder) and the dataset's terms as the spec gives them, checked against the ledger's once."""

    ledger: PrivacyLedger
    url: str
    terms: DatasetTerms
    settled: Tuple[Settled, ...] = ()  # dead runs' reservations this run's opening settled (the run logs them)

    @property
    def dataset(self) -> str:
        return self.terms.dataset

    @classmethod
    def for_spending(cls, spec: "specs.RunSpec") -> Optional["Budget"]:
        """The budget of a run of ``spec`` (None without a budget section): its ledger signed in, granted what a
        charge writes and holding the dataset under the spec's terms (``ledger_for_spending``), refused in one
        line otherwise. Reservations on the dataset whose lease ran out are settled first (``settle_expired``),
        so the run's window and admission see the budget a dead run no longer holds."""
        if spec.budget is None:
            return None
        from flows.ledger.leases import lease_seconds

        lease_seconds()  # a bad PRIVZO_LEASE_SECONDS is refused here, before any row is read
        terms = DatasetTerms.of(spec)
        ledger = ledger_for_spending(spec.budget.ledger, terms)
        settled = ledger.settle_expired(terms.dataset)
        return cls(ledger, spec.budget.ledger, terms, tuple(settled))

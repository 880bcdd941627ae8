"""The terms a run charges under: a dataset's (``DatasetTerms``, fixed when it is registered) and a block's
(``BlockTerms``), as plain values, and the dataset row's columns that hold them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from flows.ledger.schema import NO_BLOCKS


@dataclass(frozen=True)
class BlockTerms:
    """A block a run reads: its id, and the lifetime it is registered with on first use. ``rows``: its
    declared size, a public fact (never a count of its rows)."""

    block: str
    lifetime_epsilon: float
    delta: float
    rows: Optional[int] = None


@dataclass(frozen=True)
class DatasetTerms:
    """What a dataset is registered with: its lifetime (epsilon, delta), the accountant that composes its
    charges and the neighbouring relation they are accounted under, and its blocks: ``period`` (day, week or
    month; None: no blocks, one lifetime for all its rows), ``person`` (the person column: person level;
    None: event level) and ``declared`` (the persons, or rows at event level, declared per block). Changing
    any of them would let the same rows be charged against a lifetime of their own, so none may change."""

    dataset: str
    lifetime_epsilon: float
    delta: Optional[float]  # None: delta auto with no declared N, known once the private rows are counted
    accountant: str
    neighboring: str
    period: Optional[str] = None
    person: Optional[str] = None
    declared: Optional[int] = None

    @classmethod
    def of(cls, spec) -> "DatasetTerms":
        """The terms a run spec with a budget charges its dataset under."""
        try:  # delta auto is 1/N where N is declared (a public fact); otherwise it waits for the rows
            delta: Optional[float] = spec.delta_for()
        except ValueError:
            delta = None if spec.privacy.delta == "auto" else float(spec.privacy.delta)
        blocks = spec.data.blocks
        return cls(spec.budget.dataset, float(spec.budget.lifetime_epsilon), delta, spec.privacy.accountant,
                   spec.privacy.neighboring, blocks.period if blocks else None, blocks.person if blocks else None,
                   blocks.declared_units if blocks else None)

    def described(self) -> str:
        """The block terms in words, as ``budget init`` prints them."""
        if self.period is None:
            return "no blocks"
        unit = "persons" if self.person else "rows"
        level = f"person level (column {self.person!r})" if self.person else "event level"
        return f"blocks of a {self.period}, {level}, {self.declared} {unit} declared a block"


def term_values(terms: Optional[DatasetTerms]) -> dict:
    """The block terms' columns of a dataset registered with ``terms``; None: left unset (NULL), for its
    next run that gives terms to fix (a caller of ``reserve`` that gives none)."""
    if terms is None:
        return {}
    return {"blocks": terms.period or NO_BLOCKS, "person": terms.person if terms.period else None,
            "declared": terms.declared if terms.period else None}

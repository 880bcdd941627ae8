"""Admission, as pure computation: whether a run's terms are its dataset's, whether a block's composition
has room for the run's planned event, the largest run that would still fit, and whether a run recognises the
rows earlier runs recorded. Nothing here reads or writes the ledger: ``flows.ledger.core`` reads the rows
and states these functions decide on, in its locked transaction, and writes what they admit.

Admission is a privacy filter, sound when a later run's parameters are chosen after seeing earlier
models: under ``rdp`` a block admits a run while at least one of dp-accounting's fixed orders keeps the
composed Renyi divergence within what the lifetime (epsilon, delta) allows there, which is exactly
"dp-accounting's epsilon of the composition is within the lifetime" (the Renyi filter over fixed orders
of Lecuyer's "Practical privacy filters and odometers with Renyi differential privacy", the rule
PrivateKube applies to its blocks); under ``zcdp``, while the composed rho stays within the lifetime's
rho (a zCDP filter). Under ``pld`` the exact composition is a bound only for parameters fixed in advance,
so a block admits a run only if it plans the same event as every run already charged to it, and a
committed run is folded in as planned, whatever it executed: the runs on a block are then copies of one
mechanism whose number the lifetime caps before any of them runs, and what an early stop or a choice to
run again reveals is a function of those copies' outputs (post-processing).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Mapping, Optional, Sequence, Tuple

import dp_accounting

from components.accountants import Accountant, describe_event, event_from_json, event_to_json
from components.accountants.composed import ComposedState, scaled_noise
from flows.ledger.errors import FIXED, BudgetExceeded, RowsUnrecognised
from flows.ledger.schema import NO_BLOCKS, WHOLE
from flows.ledger.terms import BlockTerms, DatasetTerms

if TYPE_CHECKING:
    from flows.ledger.schema import BlockRow, DatasetRow


# ---------------------------------------------------------------- terms
def check_terms(ds: "DatasetRow", lifetime_epsilon: float, accountant: str, neighboring: str) -> None:
    """Refuse (ValueError, one line) a run whose lifetime, neighbouring relation or accountant is not what
    ``ds`` is registered with."""
    if not math.isclose(ds.lifetime_epsilon, lifetime_epsilon):
        raise ValueError(f"budget.lifetime_epsilon: dataset {ds.dataset!r} is registered with "
                         f"{ds.lifetime_epsilon:g}, the spec says {lifetime_epsilon:g}; they must match")
    if ds.neighboring != neighboring:
        raise ValueError(f"privacy.neighboring: dataset {ds.dataset!r} is accounted under {ds.neighboring}, "
                         f"the spec says {neighboring}")
    if ds.accountant != accountant:
        raise ValueError(f"privacy.accountant: dataset {ds.dataset!r} is accounted with {ds.accountant}, the "
                         f"spec says {accountant}; {FIXED}")


def terms_problem(ds: "DatasetRow", terms: DatasetTerms) -> Optional[str]:
    """The first block term of ``terms`` that is not what ``ds`` is registered with, as a refusal's line;
    None if all are (lifetime, accountant and neighbouring are ``check_terms``'s)."""
    return blocks_problem(ds.dataset, ds.blocks, ds.person, ds.declared, terms.period, terms.person,
                          terms.declared)


def blocks_problem(name: str, blocks: Optional[str], person: Optional[str], declared: Optional[int],
                   period: Optional[str], now_person: Optional[str], now_declared: Optional[int]) -> Optional[str]:
    """``blocks``/``person``/``declared``: the registered block terms; the others the run's."""
    if blocks == NO_BLOCKS and period is not None:
        return (f"data.blocks: dataset {name!r} is registered without blocks (one lifetime for all its rows), the "
                f"spec has data.blocks; {FIXED}")
    if blocks != NO_BLOCKS and period is None:
        return (f"data.blocks: dataset {name!r} is registered with blocks of a {blocks} (each with a lifetime of "
                f"its own), the spec has none; {FIXED}")
    if period is None:
        return None
    if blocks != period:
        return (f"data.blocks.period: dataset {name!r} is registered with blocks of a {blocks}, the spec says "
                f"{period}; {FIXED}")
    if person != now_person:
        registered = f"person level (column {person!r})" if person else "event level (no person column)"
        spec = f"says {now_person!r}" if now_person and person else f"has {now_person!r}" if now_person else "has none"
        return f"data.blocks.person: dataset {name!r} is registered {registered}, the spec {spec}; {FIXED}"
    if declared is not None and declared != now_declared:
        field, unit = ("declared_persons", "persons") if person else ("declared_private_rows", "rows")
        return (f"data.blocks.{field}: dataset {name!r} is registered with {declared} {unit} a block, the spec "
                f"says {now_declared}; {FIXED}")
    return None


def check_supported(ds: "DatasetRow", planned: dp_accounting.DpEvent) -> None:
    """Refuse (ValueError) a run whose event the dataset's accountant has no accounting for."""
    if not Accountant(ds.accountant, ds.neighboring).supports(planned):
        raise ValueError(
            f"privacy.accountant: dataset {ds.dataset!r} is accounted with {ds.accountant} (set by its first "
            f"run), which has no accounting for this run's {describe_event(planned)}; use a sampling it "
            "accounts for")


def check_block_terms(dataset: str, registered: "BlockRow | DatasetRow", terms: BlockTerms) -> None:
    """Refuse (ValueError) a block the run reads with another lifetime than ``registered`` (the block's row,
    or its dataset's for a block not registered yet: a new block takes its dataset's terms)."""
    if not (math.isclose(registered.lifetime_epsilon, terms.lifetime_epsilon) and registered.delta == terms.delta):
        raise ValueError(f"budget: block {terms.block!r} of dataset {dataset!r} is registered with "
                         f"lifetime epsilon {registered.lifetime_epsilon:g} at delta {registered.delta:g}, "
                         f"the spec says {terms.lifetime_epsilon:g} at {terms.delta:g}; they must match")


# ---------------------------------------------------------------- the budget filter
def window_terms(blocks: Optional[Sequence[BlockTerms]], ds: "DatasetRow") -> List[BlockTerms]:
    """The blocks a run reads: ``blocks``, or (None) the dataset's one block with its lifetime."""
    return list(blocks) if blocks is not None else [BlockTerms(WHOLE, ds.lifetime_epsilon, ds.delta)]


def planned_increment(ds: "DatasetRow", planned: dp_accounting.DpEvent) -> ComposedState:
    """``planned`` composed once under the dataset's accountant: what a reservation adds to every block."""
    return ComposedState(Accountant(ds.accountant, ds.neighboring)).composed([planned])


@dataclass(frozen=True)
class Full:
    """A block of the window without room for the run: its composition so far (committed charges and open
    reservations), the epsilon the run would take it to, and its lifetime."""

    block: str
    base: ComposedState
    after: float
    lifetime: float
    delta: float


def full_block(block: "BlockRow", base: ComposedState, increment: ComposedState) -> Optional[Full]:
    """``block`` (composed to ``base``) if ``increment`` would take it past its lifetime epsilon, else None;
    a nan or infinite epsilon is past it (the filter fails closed)."""
    after = base.plus(increment).epsilon(block.delta)
    if not after <= block.lifetime_epsilon:  # fails closed on nan / inf
        return Full(block.block, base, after, block.lifetime_epsilon, block.delta)
    return None


class NoRoom(Exception):
    """A run some block of its window has no room for, raised under the dataset's lock before the refusal's
    figures are composed: the ledger turns it into ``BudgetExceeded`` (``refused``) once its transaction has
    rolled back, so the largest-fit bisection (21 compositions) never holds up the other runs waiting on that
    lock. 200 reservations from 16 processes, 196 of them refused, took 184 s in turn when each refusal composed
    them inside it (bench/ledger_load.py)."""

    def __init__(self, *refusal_args) -> None:
        super().__init__("no room")
        self.refusal_args = refusal_args

    def refused(self) -> BudgetExceeded:
        return refusal(*self.refusal_args)


def refusal(dataset: str, accountant: str, planned: dp_accounting.DpEvent, requested: float, full: Sequence[Full],
            next_block: Optional[str] = None, when: Optional[Callable[[List[str]], str]] = None) -> BudgetExceeded:
    """The refusal of a run the blocks ``full`` have no room for: named by its oldest full block; ``when``
    sees every full one."""
    first = full[0]
    probes = 10 if accountant == "pld" else 20  # a PLD composition costs ~1000x an RDP one
    return BudgetExceeded(
        dataset, first.lifetime - first.base.epsilon(first.delta), requested, first.lifetime,
        block=first.block, would_reach=first.after, charges=first.base.count,
        fits=largest_fit([(first.base, first.lifetime, first.delta)], planned, probes),
        next_block=next_block, when=when([f.block for f in full]) if when is not None else None)


def largest_fit(bases: Sequence[Tuple[ComposedState, float, float]], planned: dp_accounting.DpEvent,
                probes: int) -> Optional[float]:
    """The largest epsilon (at each block's delta, floored to 4 significant digits) of ``planned`` with its
    noise scaled up that still composes onto every ``(base, lifetime, delta)`` within its lifetime; None if
    none does. One bisection over all the blocks at once, each probe's event composed once and added to every
    block (``plus``, as a reservation adds it): the same answer as the smallest of one bisection per block,
    since the block needing the most noise decides, at a block's cost of compositions instead of the window's."""
    accountant = bases[0][0].accountant
    planned_json = event_to_json(planned)

    def alone(factor: float) -> ComposedState:
        if accountant.kind == "pld":  # megabytes a state: not kept
            return ComposedState(accountant).composed([scaled_noise(planned, factor)])
        return _scaled_alone(accountant.kind, accountant.neighboring, planned_json, factor)

    def fits(factor: float) -> bool:
        increment = alone(factor)
        return all(base.plus(increment).epsilon(delta) <= lifetime for base, lifetime, delta in bases)

    low, high = 1.0, 1e4
    if not fits(high):
        return None
    for _ in range(probes):  # bisection in log scale: ``high`` always fits
        middle = math.sqrt(low * high)
        low, high = (low, middle) if fits(middle) else (middle, high)
    chosen = alone(high)
    return min(_floored(chosen.epsilon(delta)) for _, _, delta in bases)


@functools.lru_cache(maxsize=128)
def _scaled_alone(kind: str, neighboring: str, planned_json: str, factor: float) -> ComposedState:
    """``planned`` with its noise times ``factor``, composed alone: kept, since a commit's budget line and the
    registered version's budget table probe the same factors (a state is never changed in place), and an
    event sampled without replacement costs a third of a second a composition under RDP."""
    return ComposedState(Accountant(kind, neighboring)).composed([scaled_noise(event_from_json(planned_json), factor)])


def _floored(epsilon: float) -> float:
    digits = 3 - math.floor(math.log10(epsilon)) if epsilon > 0 else 0
    return math.floor(epsilon * 10 ** digits) / 10 ** digits


def another_event(dataset: str, block: str, others: int) -> ValueError:
    """Under pld, a block takes copies of one planned event only (see the module's note on filters): the
    refusal of a run that plans another than the ``others`` runs charged to it."""
    where = f"dataset {dataset!r}" if block == WHOLE else f"block {block!r} of dataset {dataset!r}"
    return ValueError(
        f"privacy.accountant: {where} is accounted with pld, exact only for runs whose parameters were "
        f"fixed in advance, and this run plans another event than {others} run"
        f"{'s' if others != 1 else ''} charged to it (its noise, steps or sampling differ); keep "
        "them as they were (a dataset's accountant is fixed; a dataset of other people's rows may be "
        "accounted with rdp or zcdp, whose admission is a privacy filter for parameters chosen as runs go)")


# ---------------------------------------------------------------- recognised rows
def refuse_unrecognised_rows(dataset: str, known: set, private_rows: set, exposed_rows: set) -> None:
    """Without blocks (one lifetime for all its rows): refuse a run none of whose rows is among the ``known``
    rows earlier runs kept private, which is suspect (re-encoded or replaced rows)."""
    if known and (private_rows or exposed_rows) and not known & (private_rows | exposed_rows):
        raise RowsUnrecognised(dataset, len(known))


def refuse_unrecognised_blocks(dataset: str, row_blocks: Mapping[str, str], person_blocks: Mapping[str, str],
                               recorded: Mapping[str, Mapping[str, str]]) -> None:
    """On blocks: refuse a run with rows in a block where earlier runs recorded rows, none of which (nor
    of whose persons) it recognises: those rows were re-encoded or replaced, and a re-encoded private row
    could land in the public or test split unrecognised. A block nobody recorded yet (a new window, a
    window after a gap) has nothing to recognise, so it passes."""
    rows, persons = recorded["row"], recorded["person"]
    held = set(rows.values()) | set(persons.values())
    known = {b for k, b in row_blocks.items() if rows.get(k) == b}
    known |= {b for k, b in person_blocks.items() if persons.get(k) == b}  # a person's new row is theirs
    for block in sorted(set(row_blocks.values())):
        if block in held and block not in known:
            raise RowsUnrecognised(dataset, sum(1 for b in rows.values() if b == block), block=block)

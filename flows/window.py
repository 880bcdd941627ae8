"""A run on blocks (data.blocks with budget.window): the window it reads, from public facts only (the flow
run's scheduled time, the calendar and the spec), the rows of that window, and what the ledger records of
the blocks its rows fell in.

The window is chosen before any row is read; rows are then placed in blocks by their recorded block, their
person's first arrival or their own arrival period (components/data/blocks.py), and rows outside the window
are left out before the split, so they are in no part of the run at all.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import dp_accounting
import numpy as np

import specs
from components.data.blocks import arrival_periods, next_after, open_period, row_blocks, sealed_periods
from components.data.split import person_keys
from components.data.table import Table
from flows.record.tracking import keyed_rows

if TYPE_CHECKING:
    from flows.ledger import PrivacyLedger, WindowRead


@dataclass(frozen=True)
class Window:
    """The blocks a run reads (oldest first), the moment they were chosen for, and the block in progress then
    (the next one to bring budget)."""

    blocks: Tuple[str, ...]
    as_of: str
    next_block: str

    @classmethod
    def for_spec(cls, spec: specs.RunSpec, as_of: dt.datetime, planned: Optional[dp_accounting.DpEvent] = None,
                 ledger: Optional["PrivacyLedger"] = None) -> "Window":
        """``planned``: with a window with_budget, the run's event (planned before any row is read), which the
        chosen blocks of ``ledger`` (the run's) must have room for."""
        period, window = spec.data.blocks.period, spec.budget.window
        next_block = open_period(as_of, period)
        if window.kind == "last":
            return cls(tuple(sealed_periods(as_of, period, window.blocks)), as_of.isoformat(), next_block)
        if ledger is None:
            raise TypeError("Window.for_spec: a window with_budget is chosen by the run's ledger; pass it")
        first = open_period(dt.datetime.combine(window.since, dt.time(), dt.timezone.utc), period)
        candidates = [b for b in sealed_periods(as_of, period, _periods_since(window.since, as_of, period))
                      if b >= first][::-1]  # newest first
        terms = _terms(spec, candidates)
        chosen = ledger.blocks_with_room(spec.budget.dataset, terms, planned, window.blocks)
        if not chosen and terms:  # none has room: refused here, as the reservation would, before any row is read
            ledger.preview(spec.budget.dataset, planned, terms[:1], next_block)
        if not chosen:
            raise ValueError(f"budget.window.since: no period from {window.since} to {as_of.isoformat()} has ended "
                             "yet; the first run reads the first sealed one")
        return cls(tuple(sorted(chosen)), as_of.isoformat(), next_block)


def _periods_since(since: dt.date, as_of: dt.datetime, period: str) -> int:
    """At least the number of periods from the one holding ``since`` to the one before ``as_of``."""
    days = (as_of.date() - since).days
    return max(0, days if period == "day" else days // 7 + 1 if period == "week" else days // 28 + 1)


def _terms(spec: specs.RunSpec, blocks) -> list:
    from flows.ledger import BlockTerms

    return [BlockTerms(b, spec.budget.lifetime_epsilon, float(spec.privacy.delta),
                       spec.data.blocks.declared_units) for b in blocks]


def as_of_moment(explicit: Optional[str] = None) -> dt.datetime:
    """When the run counts as happening: ``explicit`` (ISO 8601), else the Prefect flow run's scheduled start
    (a retried or late run of the 02:00 schedule reads the blocks of its own night), else now. UTC."""
    if explicit:
        try:
            moment = dt.datetime.fromisoformat(explicit)
        except ValueError:
            raise ValueError(f"as_of: {explicit!r} is not an ISO 8601 date or time (e.g. 2026-11-27T02:00:00+00:00)") \
                from None
        return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)
    try:
        from prefect.runtime import flow_run

        scheduled = flow_run.scheduled_start_time
    except Exception:  # noqa: BLE001 - outside a flow run there is no schedule
        scheduled = None
    if scheduled is not None:
        return dt.datetime.fromisoformat(str(scheduled.isoformat()))
    return dt.datetime.now(dt.timezone.utc)


def _keyed_persons(persons) -> List[str]:
    # a person's id is private data as much as a row: only its keyed hash is stored
    return keyed_rows(person_keys(persons))


@dataclass
class BlockView:
    """The rows of one run's window, and the blocks of every row it saw (for the ledger, at reservation)."""

    spec: specs.RunSpec
    window: Window
    ledger: "PrivacyLedger"  # the run's (its Budget's): the blocks its rows were recorded in
    seen_rows: Dict[str, str] = field(default_factory=dict)
    seen_persons: Dict[str, str] = field(default_factory=dict)

    def select(self, table: Table) -> np.ndarray:
        """Indices of the table's rows whose block is in the window."""
        blocks_spec, budget, ledger = self.spec.data.blocks, self.spec.budget, self.ledger
        periods = arrival_periods(table.arrivals, blocks_spec.period, blocks_spec.arrival, blocks_spec.arrival_format)
        row_keys = keyed_rows(table.row_fingerprints())
        person_keys = _keyed_persons(table.persons) if blocks_spec.person else None
        blocks = row_blocks(
            periods, row_keys, ledger.recorded_blocks(budget.dataset, "row", row_keys), person_keys,
            ledger.recorded_blocks(budget.dataset, "person", person_keys) if person_keys else None)
        # only rows of sealed periods are recorded: a row of the period in progress is seen again tomorrow
        sealed = np.asarray([b < self.window.next_block for b in blocks])
        self.seen_rows = {k: b for k, b, s in zip(row_keys, blocks, sealed) if s}
        if person_keys is not None:
            self.seen_persons = {k: b for k, b, s in zip(person_keys, blocks, sealed) if s}
        chosen = set(self.window.blocks)
        return np.flatnonzero([b in chosen for b in blocks])

    def select_some(self, table: Table) -> np.ndarray:
        """``select``, refusing a window that holds no row as what it is (not as a split that left no private
        row), naming its blocks; the run has reserved nothing yet."""
        kept = self.select(table)
        if not len(kept):
            window = self.window
            raise ValueError(f"data.blocks: the window of {len(window.blocks)} blocks as of {window.as_of}, "
                             f"{window.blocks[0]} .. {window.blocks[-1]}, holds no row of "
                             f"{self.spec.data.source.name}; nothing is charged. A night reads the last sealed periods "
                             "before its scheduled time: run a night whose window has rows (privzo run --as-of TIME)")
        return kept

    def when(self, full: List[str]) -> str:
        """When this spec's window leaves the newest of the ``full`` blocks behind: from that moment its runs
        read only blocks after it."""
        blocks = self.spec.data.blocks
        length = self.spec.budget.window.blocks
        if self.spec.budget.window.kind == "with_budget":
            return (f"block {self.window.next_block!r} brings budget of its own once it is sealed (the window passes "
                    "over blocks without room)")
        newest = max(full)
        moment = next_after(newest, blocks.period, length + 1)
        return (f"runs from {moment} (UTC) on read blocks after {newest!r}, the newest block of this window without "
                f"room: the window of {length} moves past it then")

    def block_terms(self):
        return _terms(self.spec, self.window.blocks)

    def read(self) -> "WindowRead":
        """The window as the run's reservation claims it: its blocks, and the block of every row and person
        it saw."""
        from flows.ledger import WindowRead

        return WindowRead(self.block_terms(), next_block=self.window.next_block, row_blocks=self.seen_rows,
                          person_blocks=self.seen_persons, when=self.when)


def next_window(spec: specs.RunSpec, as_of: dt.datetime, ledger: "PrivacyLedger"):
    """What the next run of ``spec`` at ``as_of`` would read, and the state of each of its dataset's blocks
    for runs like it: (window or None, the refusal's line or None, {block: next | retired | waiting}). A
    block is retired when no later run of this spec can read it: the window ``last`` has moved past it, or,
    with_budget, it has no room for this run (spending only grows). Reads the ledger, never a row."""
    from components.builders import planned_before_rows
    from flows.ledger import BudgetExceeded

    window = spec.budget.window
    planned = planned_before_rows(spec) if window.kind == "with_budget" else None
    try:
        chosen, refusal = Window.for_spec(spec, as_of, planned, ledger), None
    except BudgetExceeded as err:
        chosen, refusal = None, str(err)
    registered = [b.block for b in ledger.blocks(spec.budget.dataset)]
    states = {}
    if window.kind == "last":
        first = sealed_periods(as_of, spec.data.blocks.period, window.blocks)[0]
        for block in registered:
            states[block] = "next" if chosen and block in chosen.blocks else "retired" if block < first else ""
        return chosen, refusal, states
    room = set(ledger.blocks_with_room(spec.budget.dataset, _terms(spec, registered), planned, len(registered)))
    for block in registered:
        states[block] = "next" if chosen and block in chosen.blocks else "waiting" if block in room else "retired"
    return chosen, refusal, states


def over_declared(spec: specs.RunSpec, table: Table) -> List[str]:
    """For whoever holds the data (``privzo calibrate``, ``privzo run``'s preflight on the caller's machine): a
    line per block of the file holding more persons (rows, at event level) than the spec declares. A step
    samples each person at expected_batch_size / the declared N, so such a block's batches are larger than
    planned in proportion (and so is the memory a step needs); the guarantee is unchanged. How many persons
    a block holds is private: it is said here, to the data's holder, and in no log, tag or artifact of a run."""
    blocks = spec.data.blocks
    if blocks is None or table.arrivals is None:
        return []
    periods = arrival_periods(table.arrivals, blocks.period, blocks.arrival or "", blocks.arrival_format)
    if blocks.person is not None:
        first: Dict[str, str] = {}
        for person, period in zip(table.persons, periods):
            first[person] = min(first.get(person, period), period)
        held = list(first.values())
    else:
        held = list(periods)
    counts: Dict[str, int] = {}
    for block in held:
        counts[block] = counts.get(block, 0) + 1
    unit = "persons" if blocks.person is not None else "rows"
    field = "declared_persons" if blocks.person is not None else "declared_private_rows"
    declared = blocks.declared_units
    return [f"note: data.blocks.{field}: block {block} of the file holds {n} {unit}, more than the {declared} declared: "
            f"a step samples each at the declared rate, so its batches there are about {n / declared:.2g}x "
            f"sampling.expected_batch_size, and so is the memory a step needs beyond the model's; the guarantee is "
            f"unchanged. The declared bound is a fixed term of the dataset (the same people under another "
            f"budget.dataset are refused); new people's rows belong under a dataset declared for them"
            for block, n in sorted(counts.items()) if n > declared]

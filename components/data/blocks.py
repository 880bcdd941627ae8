"""Blocks of a growing file: which period each row arrived in, which periods a run may read, and each row's
block once a person's first arrival and the ledger's records are taken into account.

Everything here reads public metadata only (the declared arrival and person columns, the calendar): never a
row's content or how many rows a block holds, so the choice of blocks releases nothing about private rows.
"""
from __future__ import annotations

import datetime as dt
from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np

from components.periods import FORMATS, block_start


ISO_EXAMPLES = "2026-03-10, 2026-03-10T14:30:00, 2026-03-10T14:30:00+01:00"


def arrival_moment(value: str, fmt: Optional[str] = None) -> dt.datetime:
    """One arrival as a UTC moment: ISO 8601 (Python's ``datetime.fromisoformat``), or ``fmt`` (a
    ``strptime`` format the spec declares); a naive one is UTC. ValueError if it is neither: a row's block is
    a privacy fact, so a date is never guessed (03/10/2026 is refused, not read as 10 March or 3 October)."""
    moment = dt.datetime.strptime(value, fmt) if fmt else dt.datetime.fromisoformat(value)
    return moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def arrival_periods(values: Sequence, period: str, column: str, fmt: Optional[str] = None) -> np.ndarray:
    """Each value's period (a UTC day, ISO week or month) as its block id; one line naming the first value
    in neither ISO 8601 nor the declared ``fmt`` (data.blocks.arrival_format). Values already moments in UTC
    (datetime64, from a database's date or time column) are grouped by day first."""
    if isinstance(values, np.ndarray) and np.issubdtype(values.dtype, np.datetime64):
        days, index = np.unique(values.astype("datetime64[D]"), return_inverse=True)
        named = np.asarray([dt.date.fromisoformat(str(d)).strftime(FORMATS[period]) for d in days], dtype=object)
        return named[index.reshape(-1)] if len(values) else np.empty(0, dtype=object)
    out = np.empty(len(values), dtype=object)
    seen: dict = {}
    for i, value in enumerate(values):
        text = str(value)
        if text not in seen:
            try:
                seen[text] = arrival_moment(text, fmt).strftime(FORMATS[period])
            except ValueError:
                form = f"the declared data.blocks.arrival_format {fmt!r}" if fmt else \
                    f"ISO 8601 (e.g. {ISO_EXAMPLES})"
                hint = "" if fmt else "; write arrivals in ISO 8601, or declare their form in data.blocks.arrival_format"
                raise ValueError(f"data.blocks.arrival: column {column!r} holds {text!r} (row {i + 1}), which is not a "
                                 f"date or time in {form}{hint}") from None
        out[i] = seen[text]
    return out


def _period_start(moment: dt.datetime, period: str) -> dt.datetime:
    day = dt.datetime(moment.year, moment.month, moment.day, tzinfo=dt.timezone.utc)
    if period == "day":
        return day
    if period == "week":
        return day - dt.timedelta(days=day.weekday())
    return day.replace(day=1)


def _previous_start(start: dt.datetime, period: str) -> dt.datetime:
    if period == "day":
        return start - dt.timedelta(days=1)
    if period == "week":
        return start - dt.timedelta(days=7)
    return (start - dt.timedelta(days=1)).replace(day=1)


def sealed_periods(as_of: dt.datetime, period: str, count: int) -> List[str]:
    """The ``count`` most recent periods that ended at or before ``as_of`` (UTC), oldest first: a period is
    sealed once it is over, so no row can still arrive in it."""
    as_of = as_of.astimezone(dt.timezone.utc) if as_of.tzinfo else as_of.replace(tzinfo=dt.timezone.utc)
    start = _period_start(as_of, period)
    out = []
    for _ in range(count):
        start = _previous_start(start, period)
        out.append(start.strftime(FORMATS[period]))
    return out[::-1]


def open_period(as_of: dt.datetime, period: str) -> str:
    """The period in progress at ``as_of``: the next block to be sealed."""
    as_of = as_of.astimezone(dt.timezone.utc) if as_of.tzinfo else as_of.replace(tzinfo=dt.timezone.utc)
    return _period_start(as_of, period).strftime(FORMATS[period])


def next_after(block: str, period: str, count: int) -> str:
    """The start (a date) of the period ``count`` periods after ``block``."""
    start = block_start(block, period)
    for _ in range(count):
        start = start + dt.timedelta(days=1 if period == "day" else 7) if period != "month" else \
            (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)
    return start.date().isoformat()


def row_blocks(periods: np.ndarray, row_keys: Sequence[str], recorded_rows: Mapping[str, str],
               person_keys: Optional[Sequence[str]] = None,
               recorded_persons: Optional[Mapping[str, str]] = None) -> np.ndarray:
    """Each row's block. With persons, its person's block and nothing else: the block the ledger recorded
    for the person, else the earliest period among the person's rows, so that all of one person's rows
    fall in one block (a row whose content another person's row also has is still this person's). Without,
    the block the ledger recorded for the row when a run first saw it, else its own arrival period. A row
    written again with a new date keeps its block either way."""
    blocks = np.asarray(periods, dtype=object).copy()
    if person_keys is not None:
        first: dict = dict(recorded_persons or {})
        for person, block in zip(person_keys, periods):
            if person not in (recorded_persons or {}) and (person not in first or block < first[person]):
                first[person] = block
        return np.asarray([first[p] for p in person_keys], dtype=object)
    for i, key in enumerate(row_keys):
        recorded = recorded_rows.get(key)
        if recorded is not None:
            blocks[i] = recorded
    return blocks


def window_bounds(blocks: Sequence[str], period: str) -> Tuple[dt.datetime, dt.datetime]:
    """[start, end) in UTC of the periods ``blocks`` (oldest first): what a run's window may read."""
    start = block_start(blocks[0], period).replace(tzinfo=dt.timezone.utc)  # block_start is naive UTC
    return start, dt.datetime.fromisoformat(next_after(blocks[-1], period, 1)).replace(tzinfo=dt.timezone.utc)

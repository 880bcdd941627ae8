"""Blocks of a growing file: which period each row arrived in, which periods a run may read, and each row's
block once a person's first arrival and the ledger's records are taken into account.

Everything here reads public metadata only (the declared arrival and person columns, the calendar): never a
row's content or how many rows a block holds, so the choice of blocks releases nothing about private rows.
"""
from __future__ import annotations

import datetime as dt
from typing import List, Mapping, Optional, Sequence

import numpy as np

from components.periods import FORMATS, block_start


def arrival_periods(values: Sequence, period: str, column: str) -> np.ndarray:
    """Each value's period (a UTC day, ISO week or month) as its block id; one line naming the first value
    that is not a date."""
    import pandas as pd

    raw = pd.Series(list(values), dtype=object)
    parsed = pd.to_datetime(raw, utc=True, errors="coerce", format="mixed")
    bad = parsed.isna()
    if bad.any():
        first = int(np.flatnonzero(bad.to_numpy())[0])
        raise ValueError(f"data.blocks.arrival: column {column!r} holds {raw.iloc[first]!r} (row {first + 1}), which "
                         "is not a date or time; give every row the date it arrived")
    return parsed.dt.strftime(FORMATS[period]).to_numpy(dtype=object)


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
    """Each row's block: the block the ledger recorded for it when a run first saw it; else, with persons,
    the block of its person's first arrival (recorded, or the earliest period among the person's rows);
    else its own arrival period. A row written again with a new date keeps its recorded block."""
    blocks = np.asarray(periods, dtype=object).copy()
    if person_keys is not None:
        first: dict = dict(recorded_persons or {})
        for person, block in zip(person_keys, periods):
            if person not in (recorded_persons or {}) and (person not in first or block < first[person]):
                first[person] = block
        blocks = np.asarray([first[p] for p in person_keys], dtype=object)
    for i, key in enumerate(row_keys):
        recorded = recorded_rows.get(key)
        if recorded is not None:
            blocks[i] = recorded
    return blocks

"""Periods of arrival (a UTC day, an ISO week, a month) as block ids, and the files of a partitioned source,
each named by the period its rows arrived in. A module of its own so that the data checks and the block
logic share one reading of a period's name."""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import List, Tuple

FORMATS = {"day": "%Y-%m-%d", "week": "%G-W%V", "month": "%Y-%m"}  # strings that sort as their periods do
EXAMPLES = {"day": "2026-11-27", "week": "2026-W48", "month": "2026-11"}


def block_start(block: str, period: str) -> dt.datetime:
    """The first moment (naive, UTC) of the period named ``block``; ValueError if it names none exactly."""
    if period == "week":
        start = dt.datetime.strptime(block + "-1", "%G-W%V-%u")
    elif period == "month":
        start = dt.datetime.strptime(block + "-01", "%Y-%m-%d")
    else:
        start = dt.datetime.strptime(block, "%Y-%m-%d")
    if start.strftime(FORMATS[period]) != block:  # 2026-1-5 parses, but would not sort as a period
        raise ValueError(block)
    return start


def partition_files(folder, period: str) -> List[Tuple[Path, str]]:
    """The files of a partitioned source folder, oldest first, each with the first day (ISO date) of the
    period it is named by: ``2026-11-27.csv`` (day), ``2026-W48.parquet`` (week), ``2026-11.jsonl`` (month).
    Names starting with '.' or '_' (a writer's marks, such as _SUCCESS) are passed over. One line naming the
    first file that is not named by a period."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"data.source.path: {folder} is not a folder (data.blocks.partitioned reads a folder of "
                         "files, one per period)")
    try:
        names = sorted(e.name for e in os.scandir(folder) if not e.name.startswith((".", "_")))
    except OSError as err:
        raise ValueError(f"data.source.path: cannot read {folder} ({err.strerror or err})") from None
    out = []
    for name in names:
        try:
            start = block_start(name.split(".", 1)[0], period)
        except ValueError:
            raise ValueError(f"data.source.path: {name!r} in {folder} is not named by a {period} (e.g. "
                             f"{EXAMPLES[period]}.csv); name each file by the {period} its rows arrived in, or "
                             "move it out") from None
        out.append((folder / name, start.date().isoformat()))
    if not out:
        raise ValueError(f"data.source.path: {folder} holds no file (one per {period}, e.g. {EXAMPLES[period]}.csv)")
    return sorted(out, key=lambda item: item[1])

"""A database table as a source (data.source.kind sql), through SQLAlchemy.

The rows are fetched in ``row_id`` order through a server-side cursor, ``chunk_rows`` at a time, each chunk
turned into float32 features at once, so memory holds the rows read, not the driver's copies of them. With
data.blocks a run hands its window's bounds (from the public calendar, never from the rows): the WHERE on
the arrival column is pushed to the database, and at person level so is the choice of persons (those whose
first arrival falls in the window, a GROUP BY on the person). The exact choice of each row's block (the
ledger's records, a person's first arrival) is then made on these rows as for a file
(flows/window.py); the database's WHERE only keeps every other row where it is.

Everything the database says no to (it cannot be reached, the role is refused, a table or column is missing,
a NULL where a value is needed, a repeated row id, a column that is not a number) is one line naming the
field, raised before any budget is reserved.
"""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from components.data.table import Table, identity_layout


def _engine(source):
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    url = make_url(source.url)
    if source.password_env:
        password = os.environ.get(source.password_env)
        if not password:
            raise ValueError(f"data.source.password_env: ${source.password_env} is not set in this process's "
                             "environment; set it to the reading role's password")
        url = url.set(password=password)
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database in ("", ":memory:") or not Path(database).is_file():
            raise ValueError(f"data.source.url: no SQLite file at {database or '(none)'}; give the path of the "
                             "database file (sqlite:///rows.db is taken from the spec's folder)")
        # read-only: a source never writes, and SQLite would otherwise create what is missing
        return sa.create_engine(f"sqlite:///file:{Path(database).resolve()}?mode=ro&uri=true")
    connect_args = {"connect_timeout": 10} if url.get_backend_name() == "postgresql" else {}
    return sa.create_engine(url, connect_args=connect_args, pool_pre_ping=False)


def _shown(source) -> str:
    from sqlalchemy.engine import make_url

    return make_url(source.url).render_as_string(hide_password=True)


def _reason(err: Exception) -> str:
    """The driver's own first line (e.g. 'password authentication failed for user "reader"')."""
    text = str(getattr(err, "orig", None) or err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _reflected(conn, source):
    import sqlalchemy as sa

    schema, _, name = source.table.rpartition(".")
    try:
        return sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=conn)
    except sa.exc.NoSuchTableError:
        tables = sorted(sa.inspect(conn).get_table_names(schema=schema or None)
                        + sa.inspect(conn).get_view_names(schema=schema or None))
        raise ValueError(f"data.source.table: no table or view {source.table!r} at {_shown(source)}"
                         + (f"; there: {', '.join(tables[:12])}" if tables else "; it has none")) from None


def _numeric(column) -> bool:
    import sqlalchemy as sa

    return isinstance(column.type, (sa.Integer, sa.Numeric, sa.Float)) and not isinstance(column.type, sa.Boolean)


def _column(table, field: str, name: str):
    if name not in table.c:
        raise ValueError(f"{field}: table {table.name!r} has no column {name!r}; its columns: "
                         f"{', '.join(c.name for c in table.columns)}")
    return table.c[name]


def _bound(column, moment: dt.datetime, sqlite: bool):
    """A window bound as the arrival column compares it: a date, a timestamp (UTC; naive where the column is),
    or ISO text (whose order is the calendar's for UTC values; SQLite keeps dates and times as such text, and
    '2026-11-05 00:00:00' sorts after the bound '2026-11-05', not before it)."""
    import sqlalchemy as sa

    if sqlite:
        return moment.date().isoformat()
    if isinstance(column.type, sa.DateTime):
        return moment if getattr(column.type, "timezone", False) else moment.replace(tzinfo=None)
    if isinstance(column.type, sa.Date):
        return moment.date()
    return moment.date().isoformat()


def _as_written(values: np.ndarray, field: str, column: str, need: str) -> np.ndarray:
    """Identity values as one string each, as stored: integers as digits, text as is; NULL, floats and booleans
    refused (a float id could be two rows' after rounding)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise ValueError(f"{field}: column {column!r} is NULL or empty in a row; {need}")
        if isinstance(v, (bool, float)):
            raise ValueError(f"{field}: column {column!r} holds {type(v).__name__} values; give it integers or text")
        out[i] = str(v)
    return out


def _arrival_text(values: np.ndarray, column: str) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        if v is None:
            raise ValueError(f"data.blocks.arrival: column {column!r} is NULL in a row; every row needs its arrival")
        out[i] = v.isoformat() if isinstance(v, (dt.date, dt.datetime)) else str(v)
    return out


def _class_positions(values: np.ndarray, classes: Sequence, column: str) -> np.ndarray:
    position = {str(c): i for i, c in enumerate(classes)}
    out = np.empty(len(values), dtype=np.int64)
    for i, v in enumerate(values):
        if v is None:
            raise ValueError(f"data.source.label: column {column!r} is NULL in a row; every row needs its class")
        key = str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
        if key not in position:
            raise ValueError(f"data.source.classes: column {column!r} holds labels not among classes "
                             f"{[str(c) for c in classes]}; list every class")
        out[i] = position[key]
    return out


def load_sql(source, *, public_flag: Optional[str] = None, blocks=None,
             within: Optional[Tuple[dt.datetime, dt.datetime]] = None) -> Table:
    """The rows of ``source`` (a SqlSource); ``within`` ([start, end) in UTC, with ``blocks``): only the rows
    the window may hold (module docstring)."""
    import sqlalchemy as sa

    engine = _engine(source)
    try:
        with engine.connect() as conn:
            table = _reflected(conn, source)
            arrival = blocks.arrival if blocks is not None else None
            person = blocks.person if blocks is not None else None
            if source.row_id is not None:
                row_id = _column(table, "data.source.row_id", source.row_id)
            else:
                keys = list(table.primary_key.columns)
                if len(keys) != 1:
                    raise ValueError(f"data.source.row_id: table {table.name!r} has no one-column primary key; name "
                                     "the column that identifies each row for good")
                row_id = keys[0]
            label = _column(table, "data.source.label", source.label)
            meta = {c for c in (source.label, row_id.name, arrival, person, public_flag) if c}
            if source.features is not None:
                features = [_column(table, "data.source.features", name) for name in source.features]
                for c in features:
                    if c.name in meta:
                        raise ValueError(f"data.source.features: {c.name!r} is the label, the row id or a block "
                                         "column, never a feature")
                    if not _numeric(c):
                        raise ValueError(f"data.source.features: column {c.name!r} is {c.type} in the database, not "
                                         "a number; encode it as numbers or leave it out of features")
            else:
                features = [c for c in table.columns if c.name not in meta and _numeric(c)]
                if not features:
                    raise ValueError(f"data.source.features: table {table.name!r} has no numeric column besides "
                                     f"the label and identity columns; its columns: "
                                     f"{', '.join(c.name for c in table.columns)}")
            extra = [_column(table, f"data.blocks.{f}", n) for f, n in (("arrival", arrival), ("person", person)) if n]
            flag = [_column(table, "data.split.column", public_flag)] if public_flag else []
            statement = sa.select(row_id, label, *extra, *flag, *features).order_by(row_id)
            if within is not None and arrival is not None:
                sqlite = engine.dialect.name == "sqlite"
                at = sa.type_coerce(table.c[arrival], sa.String) if sqlite else table.c[arrival]
                start, end = _bound(table.c[arrival], within[0], sqlite), _bound(table.c[arrival], within[1], sqlite)
                # a row without an arrival (or, in the window, without a person) is read to be refused, never
                # left out unseen
                in_window = sa.and_(at >= start, at < end)
                if person is None:
                    statement = statement.where(sa.or_(in_window, table.c[arrival].is_(None)))
                else:  # a person's rows are in their first arrival's block: choose persons, then all their rows
                    who = table.c[person]
                    first = sa.func.min(at, type_=at.type)
                    firsts = sa.select(who).where(who.is_not(None)).group_by(who).having(first >= start, first < end)
                    statement = statement.where(sa.or_(who.in_(firsts), table.c[arrival].is_(None),
                                                       sa.and_(who.is_(None), in_window)))
            result = conn.execution_options(stream_results=True, yield_per=source.chunk_rows).execute(statement)
            chunks = [_chunk(np.asarray(part, dtype=object).reshape(len(part), -1), len(extra), len(flag))
                      for part in result.partitions()]
    except sa.exc.OperationalError as err:
        raise ValueError(f"data.source.url: the database at {_shown(source)} refused: {_reason(err)}") from None
    except sa.exc.ProgrammingError as err:  # e.g. permission denied for table
        raise ValueError(f"data.source.table: {source.table!r} at {_shown(source)}: {_reason(err)}") from None
    finally:
        engine.dispose()
    n = sum(len(c[0]) for c in chunks)
    if n == 0 and within is None:
        raise ValueError(f"data.source.table: {source.table!r} at {_shown(source)} has no rows")
    width = len(features)
    ids_raw = np.concatenate([c[0] for c in chunks]) if n else np.empty(0, dtype=object)
    row_ids = _as_written(ids_raw, "data.source.row_id", row_id.name, "every row needs its identifier")
    repeated = n - len(set(row_ids))
    if repeated:
        raise ValueError(f"data.source.row_id: column {row_id.name!r} repeats identifiers ({repeated} rows share "
                         "one); each row needs its own (a primary key)")
    labels = _class_positions(np.concatenate([c[1] for c in chunks]) if n else np.empty(0, dtype=object),
                              source.classes, source.label)
    values = np.concatenate([c[4] for c in chunks]) if n else np.empty((0, width), dtype=np.float32)
    bad = ~np.isfinite(values).all(axis=0)
    if bad.any():
        raise ValueError(f"data.source.features: column {features[int(np.flatnonzero(bad)[0])].name!r} is NULL, "
                         "not finite, or beyond float32's range (3.4e38) in a row; fill, drop or rescale it")
    kept = {}
    if arrival is not None:
        kept["arrivals"] = _arrival_text(np.concatenate([c[2][:, 0] for c in chunks]) if n else
                                         np.empty(0, dtype=object), arrival)
    if person is not None:
        kept["persons"] = _as_written(np.concatenate([c[2][:, -1] for c in chunks]) if n else
                                      np.empty(0, dtype=object), "data.blocks.person", person,
                                      "every row needs its person")
    flags = None
    if public_flag is not None:
        raw = np.concatenate([c[3][:, 0] for c in chunks]) if n else np.empty(0, dtype=object)
        if any(v not in (True, False, 0, 1) for v in raw):  # True == 1: booleans and 0/1 integers alike
            raise ValueError(f"data.split.column: column {public_flag!r} must hold true/false or 1/0 in every row")
        flags = raw.astype(bool)
    names = tuple(c.name for c in features)
    # a row's identity is its row id, computed as a file source with the same row_id column computes it: the
    # same rows moved from a file into a table are the same rows to the ledger
    layout = identity_layout(f"file:row_id={row_id.name}", person is not None, True)
    return Table(source.table, np.ascontiguousarray(values), labels, len(source.classes), None, flags,
                 columns=names, layout=layout, class_names=tuple(str(c) for c in source.classes),
                 row_ids=row_ids, **kept)


def _chunk(rows: np.ndarray, n_extra: int, n_flag: int):
    """One fetched chunk split into (row ids, labels, block columns, flag, float32 features)."""
    start = 2 + n_extra + n_flag
    raw = rows[:, start:]
    if (raw == None).any():  # noqa: E711 - elementwise over an object array
        values = np.full(raw.shape, np.nan, dtype=np.float32)
        present = raw != None  # noqa: E711
        values[present] = raw[present].astype(np.float64)
    else:
        with np.errstate(over="ignore"):
            values = raw.astype(np.float64).astype(np.float32)
    return rows[:, 0], rows[:, 1], rows[:, 2:2 + n_extra], rows[:, 2 + n_extra:start], values


def window_bounds(blocks: Sequence[str], period: str) -> Tuple[dt.datetime, dt.datetime]:
    """[start, end) in UTC of the periods ``blocks`` (oldest first): what a run's window may read."""
    from components.data.blocks import next_after
    from components.periods import block_start

    start = block_start(blocks[0], period).replace(tzinfo=dt.timezone.utc)  # block_start is naive UTC
    return start, dt.datetime.fromisoformat(next_after(blocks[-1], period, 1)).replace(tzinfo=dt.timezone.utc)

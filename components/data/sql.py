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
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from components.data.identity import integral_text
from components.data.table import Table, identity_layout, typed_identity


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


_PG_TYPES = {"int2": "Integer", "int4": "Integer", "int8": "Integer", "float4": "Float", "float8": "Float",
             "numeric": "Numeric", "bool": "Boolean", "date": "Date", "timestamp": "DateTime"}


def _queried(conn, source):
    """A query as a selectable, its columns typed as the database answers them: PostgreSQL's type of each
    result column; SQLite's storage class of each value of the first row (a column with no value there is
    untyped, so a feature must then be named)."""
    import sqlalchemy as sa

    query = source.query.strip().rstrip(";")
    probe = conn.exec_driver_sql(f"SELECT * FROM ({query}) AS privzo_query LIMIT 1")
    names, first = list(probe.keys()), probe.fetchone()
    types = []
    if conn.dialect.name == "postgresql":
        registry = conn.connection.dbapi_connection.adapters.types
        for column in probe.cursor.description:
            known = registry.get(column.type_code)
            name = known.name if known is not None else ""
            types.append(sa.DateTime(timezone=True) if name == "timestamptz" else
                         getattr(sa, _PG_TYPES[name])() if name in _PG_TYPES else sa.String())
    else:
        for value in first if first is not None else [None] * len(names):
            types.append(sa.Boolean() if isinstance(value, bool) else sa.Integer() if isinstance(value, int) else
                         sa.Float() if isinstance(value, float) else sa.String() if isinstance(value, str) else
                         sa.types.NullType())
    probe.close()
    return sa.text(query).columns(*[sa.column(n, t) for n, t in zip(names, types)]).subquery("privzo_query")


def _reflected(conn, source):
    import sqlalchemy as sa

    if source.query is not None:
        return _queried(conn, source)

    schema, _, name = source.table.rpartition(".")
    try:
        return sa.Table(name, sa.MetaData(), schema=schema or None, autoload_with=conn)
    except sa.exc.NoSuchTableError:
        tables = sorted(sa.inspect(conn).get_table_names(schema=schema or None)
                        + sa.inspect(conn).get_view_names(schema=schema or None))
        raise ValueError(f"data.source.table: no table or view {source.table!r} at {_shown(source)}"
                         + (f"; there: {', '.join(tables[:12])}" if tables else "; it has none")) from None


def _numeric(column, named: bool = False) -> bool:
    """A number by the database's type (a named column of a SQLite query whose first row had no value there is
    taken as named: its values are checked as numbers when read)."""
    import sqlalchemy as sa

    if named and isinstance(column.type, sa.types.NullType):
        return True
    return isinstance(column.type, (sa.Integer, sa.Numeric, sa.Float)) and not isinstance(column.type, sa.Boolean)


def _field(source) -> str:
    return "data.source.query" if source.query is not None else "data.source.table"


def _named(source) -> str:
    return "the query" if source.query is not None else repr(source.table)


def _what(table) -> str:
    return "the query" if table.name == "privzo_query" else f"table {table.name!r}"


def _column(table, field: str, name: str):
    if name not in table.c:
        raise ValueError(f"{field}: {_what(table)} has no column {name!r}; its columns: "
                         f"{', '.join(c.name for c in table.columns)}")
    return table.c[name]


def _bound(column, moment: dt.datetime, text: bool):
    """A window bound as the arrival column compares it: a date, a timestamp (UTC; naive where the column is),
    or ISO text (whose order is the calendar's for ISO dates and UTC times, which alone are compared as text:
    '2026-11-05 00:00:00' sorts after the bound '2026-11-05', not before it)."""
    import sqlalchemy as sa

    if text:
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
        if v is None or v != v or (isinstance(v, str) and not v.strip()):  # v != v: pandas' NaN for a NULL
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


def identity_key(column, dialect: str):
    """A column's values as privzo keys them (components/data/identity.py): as text, compared byte for byte,
    whatever collation the database would otherwise compare them under (SQLite keeps a column's collation
    through a CAST, so it is named; PostgreSQL's "C" is byte order)."""
    import sqlalchemy as sa

    return sa.cast(column, sa.Text).collate("C" if dialect == "postgresql" else "BINARY")


def _identity_kind(column, field: str, name: str) -> str:
    """How privzo reads an identity column, by its type in the database: "integer" (its digits) or "text" (as
    written); anything else refused, as a file's floats and booleans are."""
    import sqlalchemy as sa

    kind = column.type
    if isinstance(kind, sa.Integer) and not isinstance(kind, sa.Boolean):
        return "integer"
    if isinstance(kind, (sa.String, sa.types.NullType, sa.Uuid)):
        return "text"
    raise ValueError(f"{field}: column {name!r} is {kind} in the database; an identifier is stored as integers or "
                     "text (a float loses what 0065 was, and 65.0 and 65 would be two keys)")


def _declared(conn, source, table, name: str):
    """The column named ``name`` of what the rows come from, typed as declared: a table's own column; for a
    query, the column of its table it selects as ``name`` (an expression keeps the type the database answers)."""
    import sqlalchemy as sa

    if source.query is None:
        return table.c[name]
    from specs.sql_query import per_row_query

    parsed = per_row_query(source.query, conn.dialect.name)
    base = parsed.source_column(name)
    if base is None:
        return table.c[name]
    schema, _, bare = parsed.table.rpartition(".")
    try:
        reflected = sa.Table(bare, sa.MetaData(), schema=schema or None, autoload_with=conn)
    except sa.exc.NoSuchTableError:
        raise ValueError(f"data.source.query: no table or view {parsed.table!r} at {_shown(source)}") from None
    return reflected.c[base] if base in reflected.c else table.c[name]


@dataclass(frozen=True)
class Schema:
    """What a source's rows are, read from the database's catalogue and answers, before any row: the columns,
    how each identity column is keyed ("integer" or "text", a term of the dataset's row layout), and how a
    window is read: ``pushed`` (the database compares the arrival as time, or as ISO text that sorts as time)
    or the whole table read and the window chosen in privzo exactly as for a file."""

    table: object
    row_id: object
    label: object
    features: list
    extra: list
    flag: list
    kinds: Dict[str, str]
    arrival_mode: Optional[str]  # "time", "text", "whole", or None without an arrival

    @property
    def layout(self) -> str:
        person = "person" in self.kinds
        return typed_identity(identity_layout(f"file:row_id={self.row_id.name}", person, True),
                              [role for role, kind in sorted(self.kinds.items()) if kind == "integer"])


# an arrival whose text order is its time order: an ISO date, or an ISO time in UTC (its date its UTC day)
_SORTABLE = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]00:?00)?)?")


def _arrival_mode(conn, source, table, arrival: str, fmt: Optional[str]) -> str:
    """How a window's bounds reach the arrival column (Schema): PostgreSQL's date and time types compare
    instants; text (SQLite's dates are text) only once every arrival in the table is one ``_SORTABLE`` form,
    which reads the arrival column alone (public metadata); otherwise the whole table."""
    import sqlalchemy as sa

    column = table.c[arrival]
    temporal = conn.dialect.name == "postgresql" and isinstance(_declared(conn, source, table, arrival).type,
                                                                (sa.Date, sa.DateTime))
    if fmt is not None:
        if temporal:
            raise ValueError(f"data.blocks.arrival_format: column {arrival!r} is {column.type} in the database, which "
                             "gives each arrival as a time; remove arrival_format (the form of text arrivals)")
        return "whole"
    if temporal:
        return "time"
    values = conn.execute(sa.select(identity_key(column, conn.dialect.name)).distinct()).scalars()
    for value in values:
        if value is None:
            continue
        if not _SORTABLE.fullmatch(value):
            return "whole"
        try:
            dt.datetime.fromisoformat(value)
        except ValueError:
            return "whole"
    return "text"


def schema(conn, source, *, blocks=None, public_flag: Optional[str] = None) -> Schema:
    """The source's Schema on an open connection (one line naming the field for a missing table or column)."""
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
    meta = {c for c in (source.label, row_id.name, arrival, person, public_flag, source.text) if c}
    if source.text is not None:
        features = []
    elif source.features is not None:
        if len(set(source.features)) != len(source.features):
            raise ValueError("data.source.features: a column is named twice; name each feature once")
        features = [_column(table, "data.source.features", name) for name in source.features]
        for c in features:
            if c.name in meta:
                raise ValueError(f"data.source.features: {c.name!r} is the label, the row id or a block "
                                 "column, never a feature")
            if not _numeric(c, named=True):
                raise ValueError(f"data.source.features: column {c.name!r} is {c.type} in the database, not "
                                 "a number; encode it as numbers or leave it out of features")
    else:
        features = [c for c in table.columns if c.name not in meta and _numeric(c)]
        if not features:
            raise ValueError(f"data.source.features: {_what(table)} has no numeric column besides "
                             f"the label and identity columns; its columns: "
                             f"{', '.join(c.name for c in table.columns)}")
    if row_id.name == source.label:
        raise ValueError("data.source.row_id: the label column names each row's class, not the row; name the column "
                         "that identifies each row")
    extra = [_column(table, f"data.blocks.{f}", n) for f, n in (("arrival", arrival), ("person", person)) if n]
    flag = [_column(table, "data.split.column", public_flag)] if public_flag else []
    flag += [_column(table, "data.source.text", source.text)] if source.text else []  # read as text, as the flag is
    kinds = {"row_id": _identity_kind(_declared(conn, source, table, row_id.name), "data.source.row_id", row_id.name)}
    if person is not None:
        kinds["person"] = _identity_kind(_declared(conn, source, table, person), "data.blocks.person", person)
    mode = _arrival_mode(conn, source, table, arrival, blocks.arrival_format) if arrival is not None else None
    return Schema(table, row_id, label, features, extra, flag, kinds, mode)


def _check_identity(conn, source, sch: Schema, person: Optional[str]) -> None:
    """Identity over every row of the source, not the window's, as privzo keys it: row ids unique by their text
    byte for byte (a database's collation may call two of them equal, or an id restarting each day repeat
    outside the window), and no floating-point id (SQLite keeps 1000.5 in an INTEGER column)."""
    import sqlalchemy as sa

    dialect = conn.dialect.name
    table = sch.table
    key = identity_key(sch.row_id, dialect).label("k")
    keys = sa.select(key).select_from(table).where(sch.row_id.is_not(None)).group_by(key)
    repeated = conn.execute(sa.select(sa.func.count()).select_from(
        keys.having(sa.func.count() > 1).subquery())).scalar_one()
    if repeated:
        raise ValueError(f"data.source.row_id: column {sch.row_id.name!r} repeats identifiers over {_what(table)} "
                         f"({repeated} ids are each held by several rows, compared as text byte for byte); each row "
                         "needs its own for good, across the whole table (a primary key)")
    if dialect != "sqlite":
        return  # PostgreSQL's column types are what _identity_kind checked
    for field, name in (("data.source.row_id", sch.row_id.name), ("data.blocks.person", person)):
        if name is None:
            continue
        stored = sa.func.typeof(table.c[name])
        found = set(conn.execute(sa.select(stored).select_from(table).distinct()).scalars())
        odd = sorted(found - {"integer", "text", "null"})
        if odd:
            raise ValueError(f"{field}: column {name!r} holds {'floating-point numbers' if 'real' in odd else odd[0]} "
                             "in a row; an identifier is stored as integers or text (a float loses what 0065 was, and "
                             "65.0 and 65 would be two keys)")


def identity_layout_of(source, *, blocks=None, public_flag: Optional[str] = None) -> str:
    """The row layout ``source``'s rows would have (its identity columns' kinds among its terms), from the
    database's catalogue alone: no row is read. A run compares it with the ledger's before it reads any."""
    engine = _engine(source)
    try:
        with engine.connect() as conn:
            return schema(conn, source, blocks=blocks, public_flag=public_flag).layout
    except Exception as err:
        _refused(err, source, connected=True)
        raise
    finally:
        engine.dispose()


def describe(source, *, blocks=None, public_flag: Optional[str] = None) -> List[str]:
    """What ``privzo validate`` says of a table source after connecting read-only: what it reads, and how a
    window is read. Reads the catalogue and the public arrival column, never a feature or an id."""
    engine = _engine(source)
    try:
        with engine.connect() as conn:
            sch = schema(conn, source, blocks=blocks, public_flag=public_flag)
    except Exception as err:
        _refused(err, source, connected=True)
        raise
    finally:
        engine.dispose()
    what = ("the query (a per-row filter of one table)" if source.query is not None else f"table {source.table!r}")
    lines = [f"connected read-only to {_shown(source)}: {what}, row id {sch.row_id.name!r} "
             f"({sch.kinds['row_id']}), label {sch.label.name!r}, "
             + (f"text {source.text!r}" if source.text else f"{len(sch.features)} feature columns")]
    if sch.arrival_mode == "time":
        lines.append("a window is read by the database: the arrival column is a date or time type")
    elif sch.arrival_mode == "text":
        lines.append("a window is read by the database: every arrival is an ISO date or a UTC time, whose text "
                     "order is time order")
    elif sch.arrival_mode == "whole":
        lines.append("a window reads the whole table and chooses its rows in privzo, as for a file: the arrivals are "
                     "not all ISO dates or UTC times (store them as a date or timestamp to read only the window)")
    return lines


def _refused(err: Exception, source, connected: bool) -> None:
    """Raise the one line for what the database said no to (module docstring); other errors pass."""
    import sqlalchemy as sa

    if isinstance(err, sa.exc.OperationalError):
        if connected and not _unreachable(err):
            raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)}: {_reason(err)}") from None
        raise ValueError(f"data.source.url: the database at {_shown(source)} refused: {_reason(err)}") from None
    if isinstance(err, sa.exc.ProgrammingError):  # e.g. permission denied for table, or the query's own mistake
        raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)}: {_reason(err)}") from None
    import psycopg

    if isinstance(err, psycopg.Error):  # raised by the COPY, outside SQLAlchemy's wrapping
        raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)}: {_reason(err)}") from None


def _unreachable(err) -> bool:
    """An OperationalError raised by connecting (a server's), not by a statement (SQLite's are)."""
    return getattr(err, "connection_invalidated", False) or "connection" in _reason(err).lower() and \
        "no such" not in _reason(err).lower()


def load_sql(source, *, public_flag: Optional[str] = None, blocks=None,
             within: Optional[Tuple[dt.datetime, dt.datetime]] = None, tokenizer: Optional[str] = None,
             prompt=None) -> Table:
    """The rows of ``source`` (a SqlSource); ``within`` ([start, end) in UTC, with ``blocks``): only the rows
    the window may hold (module docstring). With ``source.text``, that column as ``tokenizer``'s ids (filled
    into a language model's ``prompt``, if any), as a file's text column is."""
    import sqlalchemy as sa

    engine = _engine(source)
    connected = False
    try:
        # one snapshot for the checks, the count and the rows (PostgreSQL's default reads each statement's own)
        isolation = {"isolation_level": "REPEATABLE READ"} if engine.dialect.name == "postgresql" else {}
        with engine.connect().execution_options(**isolation) as conn:
            connected = True
            sch = schema(conn, source, blocks=blocks, public_flag=public_flag)
            table, row_id = sch.table, sch.row_id
            arrival = blocks.arrival if blocks is not None else None
            person = blocks.person if blocks is not None else None
            _check_identity(conn, source, sch, person)
            dialect = conn.dialect.name
            # SQLite's date types parse text on the way out; privzo parses every text arrival itself, as a file's
            extra = [sa.type_coerce(c, sa.String).label(c.name) if c.name == arrival and sch.arrival_mode != "time"
                     else c for c in sch.extra]
            statement = sa.select(row_id, sch.label, *extra, *sch.flag, *sch.features).order_by(row_id)
            if within is not None and arrival is not None and sch.arrival_mode in ("time", "text"):
                text = sch.arrival_mode == "text"
                at = identity_key(table.c[arrival], dialect) if text else table.c[arrival]
                start, end = (_bound(table.c[arrival], moment, text) for moment in within)
                # a row without an arrival (or, in the window, without a person) is read to be refused, never
                # left out unseen
                in_window = sa.and_(at >= start, at < end)
                if person is None:
                    statement = statement.where(sa.or_(in_window, table.c[arrival].is_(None)))
                else:  # a person's rows are in their first arrival's block: choose persons, then all their rows
                    who = identity_key(table.c[person], dialect)  # persons as privzo tells them apart
                    first = sa.func.min(at, type_=at.type)
                    firsts = sa.select(who).where(table.c[person].is_not(None)).group_by(who).having(
                        first >= start, first < end)
                    statement = statement.where(sa.or_(who.in_(firsts), table.c[arrival].is_(None),
                                                       sa.and_(table.c[person].is_(None), in_window)))
            columns = [row_id, sch.label, *extra, *sch.flag]
            count = conn.execute(sa.select(sa.func.count()).select_from(statement.order_by(None).subquery())).scalar_one()
            rows = _Rows(count, columns, sch.features, source, arrival, person, public_flag,
                         temporal=sch.arrival_mode == "time")
            if dialect == "postgresql" and conn.dialect.driver == "psycopg":
                frames = _copied(conn, statement, columns + sch.features, len(sch.features), source.chunk_rows)
            else:
                frames = _fetched(conn, statement, columns + sch.features, source.chunk_rows)
            for frame in frames:
                rows.add(frame)
    except Exception as err:
        _refused(err, source, connected)
        raise
    finally:
        engine.dispose()
    if rows.n == 0 and within is None:
        raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)} has no rows")
    # a row's identity is its row id, computed as a file source with the same row_id column computes it: the
    # same rows moved from a file into a table are the same rows to the ledger; an integer column's kind is
    # a term of the layout, so a migration to text (65 then '0065') is refused, not charged as new persons
    return rows.table(source.name, sch.layout, tokenizer, prompt)


class _Rows:
    """The rows read, chunk by chunk, into arrays sized by the window's count (grown if rows arrive between the
    count and the read): float32 features, class positions, row ids (int64 for an integer key), arrivals
    (datetime64 in UTC for a date or time column, the text as written otherwise), persons and public flags."""

    def __init__(self, count: int, columns, features, source, arrival, person, public_flag, temporal: bool):
        import sqlalchemy as sa

        self.source, self.arrival, self.person, self.flag = source, arrival, person, public_flag
        self.id_column, self.label_column = columns[0].name, columns[1].name
        self.feature_names = [c.name for c in features]
        self.feature_types = tuple("long" if isinstance(c.type, sa.Integer) else "double" for c in features)
        self.integer_ids = isinstance(columns[0].type, sa.Integer)
        self.temporal = arrival is not None and temporal
        self.n = 0
        self.values = np.empty((count, len(features)), dtype=np.float32)
        self.labels = np.empty(count, dtype=np.int64)
        self.ids = np.empty(count, dtype=np.int64 if self.integer_ids else object)
        self.arrivals = None if arrival is None else np.empty(count, dtype="datetime64[s]" if self.temporal else object)
        self.persons = None if person is None else np.empty(count, dtype=object)
        self.flags = None if public_flag is None else np.empty(count, dtype=bool)
        self.text = source.text
        self.texts = None if source.text is None else np.empty(count, dtype=object)
        self.position = {str(c): i for i, c in enumerate(source.classes)}

    def _ids_as_text(self) -> None:
        self.integer_ids = False
        self.ids = np.asarray([str(int(v)) for v in self.ids[:self.n]] + [None] * (len(self.ids) - self.n),
                              dtype=object)

    def _grow(self, need: int) -> None:
        size = max(need, 2 * len(self.labels))
        for name in ("values", "labels", "ids", "arrivals", "persons", "flags", "texts"):
            old = getattr(self, name)
            if old is not None:
                new = np.empty((size, *old.shape[1:]), dtype=old.dtype)
                new[:self.n] = old[:self.n]
                setattr(self, name, new)

    def add(self, frame) -> None:
        import pandas as pd

        m = len(frame)
        if self.n + m > len(self.labels):
            self._grow(self.n + m)
        at = slice(self.n, self.n + m)
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                self.values[at] = frame[self.feature_names].to_numpy(dtype=np.float32)
        except (TypeError, ValueError):
            bad = next(c for c in self.feature_names if pd.to_numeric(frame[c], errors="coerce").isna().any())
            raise ValueError(f"data.source.features: column {bad!r} is NULL or not a number in a row; fill or drop "
                             "it, or leave it out of features") from None
        bad = ~np.isfinite(self.values[at]).all(axis=0)  # a chunk at a time: no copy of all the rows
        if bad.any():
            raise ValueError(f"data.source.features: column {self.feature_names[int(np.flatnonzero(bad)[0])]!r} is "
                             "NULL, not finite, or beyond float32's range (3.4e38) in a row; fill, drop or rescale it")
        ids = frame[self.id_column]
        if ids.isna().any():
            raise ValueError(f"data.source.row_id: column {self.id_column!r} is NULL in a row; every row needs its "
                             "identifier")
        if self.integer_ids and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in ids):
            self.ids[at] = ids.to_numpy(dtype=np.int64)
        else:  # an INTEGER column of SQLite may hold text: every id as written, integers as their digits
            if self.integer_ids:
                self._ids_as_text()
            self.ids[at] = _as_written(ids.to_numpy(dtype=object), "data.source.row_id", self.id_column,
                                       "every row needs its identifier")
        self.labels[at] = self._classes(frame[self.label_column])
        if self.arrival is not None:
            arrived = frame[self.arrival]
            if arrived.isna().any():
                raise ValueError(f"data.blocks.arrival: column {self.arrival!r} is NULL in a row; every row needs "
                                 "its arrival")
            self.arrivals[at] = pd.to_datetime(arrived, utc=True).dt.tz_convert(None).to_numpy(
                dtype="datetime64[s]") if self.temporal else _arrival_text(arrived.to_numpy(dtype=object), self.arrival)
        if self.person is not None:
            self.persons[at] = _as_written(frame[self.person].to_numpy(dtype=object), "data.blocks.person", self.person,
                                           "every row needs its person")
        if self.flag is not None:
            self.flags[at] = self._flags(frame[self.flag])
        if self.text is not None:
            lines = frame[self.text]
            if lines.isna().any() or not lines.map(lambda v: isinstance(v, str) and bool(v.strip())).all():
                raise ValueError(f"data.source.text: column {self.text!r} is NULL, empty or not text in a row; give "
                                 "every row its text")
            self.texts[at] = lines.to_numpy(dtype=object)
        self.n += m

    def _classes(self, raw):
        if raw.isna().any():
            raise ValueError(f"data.source.label: column {self.label_column!r} is NULL in a row; every row needs its "
                             "class")
        text = raw.astype(str)
        positions = text.map(self.position)
        if positions.isna().any():  # 1.0 in a float column is the class 1
            positions = positions.fillna(text.map(lambda v: self.position.get(integral_text(v))))
        if positions.isna().any():
            raise ValueError(f"data.source.classes: column {self.label_column!r} holds labels not among classes "
                             f"{[str(c) for c in self.source.classes]}; list every class")
        return positions.to_numpy(dtype=np.int64)

    def _flags(self, raw) -> np.ndarray:
        words = raw.map(lambda v: str(v).strip().lower())
        if raw.isna().any() or not words.isin(("t", "f", "true", "false", "1", "0")).all():
            raise ValueError(f"data.split.column: column {self.flag!r} must hold true/false or 1/0 in every row")
        return words.isin(("t", "true", "1")).to_numpy()

    def table(self, name: str, layout: str, tokenizer: Optional[str] = None, prompt=None) -> Table:
        n = self.n
        ids = self.ids[:n]
        repeated = n - len(np.unique(ids) if self.integer_ids else set(ids))
        if repeated:
            raise ValueError(f"data.source.row_id: column {self.id_column!r} repeats identifiers ({repeated} rows share "
                             "one); each row needs its own (a primary key)")
        values = self.values[:n]
        kept = {k: v[:n] for k, v in (("arrivals", self.arrivals), ("persons", self.persons)) if v is not None}
        source = self.source
        columns, kinds, text_input = tuple(self.feature_names), self.feature_types, None
        if self.text is not None:  # token ids, as a file's text column gives them
            from components import pretrained
            from components.data.prompts import encode_prompted
            from components.data.text import encode

            lines = list(self.texts[:n])
            values = encode(lines, pretrained.tokenizer(tokenizer), source.max_length) if prompt is None else \
                encode_prompted(lines, pretrained.tokenizer(tokenizer), source.max_length, prompt)
            columns, kinds = None, None
            text_input = None if prompt is not None else (self.text, tokenizer, source.max_length)
        return Table(name, values, self.labels[:n], len(source.classes), None,
                     None if self.flags is None else self.flags[:n], columns=columns, layout=layout,
                     class_names=tuple(str(c) for c in source.classes), row_ids=ids, column_types=kinds,
                     text_input=text_input, **kept)


def _fetched(conn, statement, columns, chunk_rows: int):
    """Chunks of rows through SQLAlchemy (any database): a server-side cursor where the driver has one."""
    import pandas as pd

    names = [c.name for c in columns]
    result = conn.execution_options(stream_results=True, yield_per=chunk_rows).execute(statement)
    for part in result.partitions():
        yield pd.DataFrame.from_records(part, columns=names)


class _CopyStream(io.RawIOBase):
    """A COPY's output as a file to read: pandas' C parser reads the rows as the server sends them. (A thread
    reading ahead was slower here: it contends with the parser for the interpreter.)"""

    def __init__(self, copy):
        self.blocks, self.pending = iter(copy), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            try:
                self.pending = bytes(next(self.blocks))
            except StopIteration:
                return 0
        n = min(len(buffer), len(self.pending))
        buffer[:n], self.pending = self.pending[:n], self.pending[n:]
        return n


def _copied(conn, statement, columns, n_features: int, chunk_rows: int):
    """Chunks of rows from PostgreSQL's COPY of the SELECT as CSV, parsed by pandas' C reader: the driver makes
    no Python object per value (three to five times the rows a second of a fetch). Dates and times are written
    in ISO form in UTC; identity and label columns are read as text, as written."""
    import pandas as pd
    import sqlalchemy as sa

    compiled = statement.compile(dialect=conn.dialect)
    cursor = conn.connection.dbapi_connection.cursor()
    cursor.execute("SET LOCAL DateStyle TO 'ISO'")
    cursor.execute("SET LOCAL TimeZone TO 'UTC'")
    first_feature = len(columns) - n_features
    dtypes = {c.name: np.float32 if i >= first_feature else "Int64" if i == 0 and isinstance(c.type, sa.Integer)
              else str for i, c in enumerate(columns)}
    with cursor.copy(f"COPY ({compiled.string}) TO STDOUT WITH (FORMAT csv)", compiled.params) as copy:
        yield from pd.read_csv(io.BufferedReader(_CopyStream(copy), 1 << 20), header=None,
                               names=[c.name for c in columns], dtype=dtypes, chunksize=chunk_rows,
                               keep_default_na=False, na_values=[""])

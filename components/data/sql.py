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
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np

from components.data.identity import integral_text
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


def load_sql(source, *, public_flag: Optional[str] = None, blocks=None,
             within: Optional[Tuple[dt.datetime, dt.datetime]] = None, tokenizer: Optional[str] = None,
             prompt=None) -> Table:
    """The rows of ``source`` (a SqlSource); ``within`` ([start, end) in UTC, with ``blocks``): only the rows
    the window may hold (module docstring). With ``source.text``, that column as ``tokenizer``'s ids (filled
    into a language model's ``prompt``, if any), as a file's text column is."""
    import sqlalchemy as sa

    engine = _engine(source)
    try:
        # one snapshot for the count and the rows (PostgreSQL's default reads each statement's own)
        isolation = {"isolation_level": "REPEATABLE READ"} if engine.dialect.name == "postgresql" else {}
        connected = False
        with engine.connect().execution_options(**isolation) as conn:
            connected = True  # an OperationalError from here on is the statement's (SQLite's are), not the server's
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
            extra = [_column(table, f"data.blocks.{f}", n) for f, n in (("arrival", arrival), ("person", person)) if n]
            flag = [_column(table, "data.split.column", public_flag)] if public_flag else []
            text = [_column(table, "data.source.text", source.text)] if source.text else []
            flag += text  # read as text, as the flag is
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
            columns = [row_id, label, *extra, *flag]
            count = conn.execute(sa.select(sa.func.count()).select_from(statement.order_by(None).subquery())).scalar_one()
            rows = _Rows(count, columns, features, source, arrival, person, public_flag)
            if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
                frames = _copied(conn, statement, columns + features, len(features), source.chunk_rows)
            else:
                frames = _fetched(conn, statement, columns + features, source.chunk_rows)
            for frame in frames:
                rows.add(frame)
    except sa.exc.OperationalError as err:
        if connected:
            raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)}: {_reason(err)}") from None
        raise ValueError(f"data.source.url: the database at {_shown(source)} refused: {_reason(err)}") from None
    except sa.exc.ProgrammingError as err:  # e.g. permission denied for table, or the query's own mistake
        raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)}: {_reason(err)}") from None
    except Exception as err:
        import psycopg

        if isinstance(err, psycopg.Error):  # raised by the COPY, outside SQLAlchemy's wrapping
            raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)}: {_reason(err)}") from None
        raise
    finally:
        engine.dispose()
    if rows.n == 0 and within is None:
        raise ValueError(f"{_field(source)}: {_named(source)} at {_shown(source)} has no rows")
    # a row's identity is its row id, computed as a file source with the same row_id column computes it: the
    # same rows moved from a file into a table are the same rows to the ledger
    layout = identity_layout(f"file:row_id={row_id.name}", person is not None, True)
    return rows.table(source.name, layout, tokenizer, prompt)


class _Rows:
    """The rows read, chunk by chunk, into arrays sized by the window's count (grown if rows arrive between the
    count and the read): float32 features, class positions, row ids (int64 for an integer key), arrivals
    (datetime64 in UTC for a date or time column, the text as written otherwise), persons and public flags."""

    def __init__(self, count: int, columns, features, source, arrival, person, public_flag):
        import sqlalchemy as sa

        self.source, self.arrival, self.person, self.flag = source, arrival, person, public_flag
        self.id_column, self.label_column = columns[0].name, columns[1].name
        self.feature_names = [c.name for c in features]
        self.integer_ids = isinstance(columns[0].type, sa.Integer)
        self.temporal = arrival is not None and isinstance(
            next(c for c in columns if c.name == arrival).type, (sa.Date, sa.DateTime))
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
        self.ids[at] = ids.to_numpy(dtype=np.int64) if self.integer_ids else _as_written(
            ids.to_numpy(dtype=object), "data.source.row_id", self.id_column, "every row needs its identifier")
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
        columns = tuple(self.feature_names)
        if self.text is not None:  # token ids, as a file's text column gives them
            from components import pretrained
            from components.data.prompts import encode_prompted
            from components.data.text import encode

            lines = list(self.texts[:n])
            values = encode(lines, pretrained.tokenizer(tokenizer), source.max_length) if prompt is None else \
                encode_prompted(lines, pretrained.tokenizer(tokenizer), source.max_length, prompt)
            columns = None
        return Table(name, values, self.labels[:n], len(source.classes), None,
                     None if self.flags is None else self.flags[:n], columns=columns, layout=layout,
                     class_names=tuple(str(c) for c in source.classes), row_ids=ids, **kept)


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


def window_bounds(blocks: Sequence[str], period: str) -> Tuple[dt.datetime, dt.datetime]:
    """[start, end) in UTC of the periods ``blocks`` (oldest first): what a run's window may read."""
    from components.data.blocks import next_after
    from components.periods import block_start

    start = block_start(blocks[0], period).replace(tzinfo=dt.timezone.utc)  # block_start is naive UTC
    return start, dt.datetime.fromisoformat(next_after(blocks[-1], period, 1)).replace(tzinfo=dt.timezone.utc)

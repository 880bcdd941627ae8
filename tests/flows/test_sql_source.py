"""A database table as the source (data.source.kind sql): a nightly run reads its window's rows only, the
ledger records the same rows as for the same data in a file, and everything the database says no to is
refused in one line before anything is charged. SQLite here; PostgreSQL with the test server."""
import copy
import datetime as dt
import sqlite3

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

import specs
from components.data.blocks import window_bounds
from components.data.sql import load_sql
from flows.ledger import PrivacyLedger
from flows.ledger.schema import PrivateRowRow
from tests.flows.test_blocks import night, stream_spec, write_stream

DAYS = 6


def _frame(tmp_path, days=DAYS):
    """The blocks tests' stream with a visit number naming each row, and patients: patient k's rows are 2k,
    on its day, and 2k + 1, two days later (the last two days' later visits are not in yet)."""
    frame = pd.read_csv(write_stream(tmp_path / "visits.csv", days))
    frame.insert(0, "visit", np.arange(1000, 1000 + len(frame)))
    first = pd.to_datetime(frame.arrived)
    later = frame.index % 2 == 1
    frame.loc[later, "arrived"] = (first[later] + pd.Timedelta(days=2)).dt.strftime("%Y-%m-%d")
    frame["patient"] = [f"patient-{i // 2}" for i in range(len(frame))]
    frame = frame[pd.to_datetime(frame.arrived) < pd.Timestamp(night(days - 1).date())].reset_index(drop=True)
    frame.to_csv(tmp_path / "visits.csv", index=False)
    return frame


def _to_sqlite(frame, path, **types):
    with sqlite3.connect(path) as con:
        columns = ", ".join(f"{c} {types.get(c, 'REAL' if c.startswith('px') else 'INTEGER' if c in ('digit', 'visit') else 'TEXT')}"
                            + (" PRIMARY KEY" if c == "visit" else "") for c in frame.columns)
        con.execute(f"CREATE TABLE visits ({columns})")
        con.executemany(f"INSERT INTO visits VALUES ({', '.join('?' * len(frame.columns))})",
                        frame.astype(object).itertuples(index=False, name=None))
    return f"sqlite:///{path}"


def _sql_spec(d, url, **source):
    d = copy.deepcopy(d)
    d["data"]["source"] = {"kind": "sql", "url": url, "table": "visits", "label": "digit",
                           "classes": list(range(10)), **source}
    return d


def _ledger_rows(url, dataset="visits"):
    with sa.orm.Session(PrivacyLedger.open(url).engine) as session:
        return set(session.scalars(sa.select(PrivateRowRow.row).where(PrivateRowRow.dataset == dataset)))


def _window_rows(frame, blocks):
    """The rows a window holds, from the frame alone: those of patients whose first arrival is in it."""
    first = frame.groupby("patient")["arrived"].transform("min")
    return set(frame.loc[first.isin(blocks), "visit"].astype(str))


def test_a_nightly_run_reads_its_windows_rows_and_the_ledger_matches_the_files(prefect_server, tmp_path,
                                                                               mlflow_db, monkeypatch):
    from components.data import sql as sql_module
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    frame = _frame(tmp_path)
    file_spec = stream_spec(tmp_path, window=2, persons=True)
    file_spec["data"]["source"]["row_id"] = "visit"
    file_spec["tracking"]["uri"] = mlflow_db
    table_spec = _sql_spec(file_spec, _to_sqlite(frame, tmp_path / "rows.db"))
    table_spec["budget"]["ledger"] = f"sqlite:///{tmp_path / 'ledger-sql.db'}"
    read = []
    real = sql_module.load_sql

    def counted(source, **kwargs):
        table = real(source, **kwargs)
        read.append({str(i) for i in table.row_ids})
        return table

    monkeypatch.setattr(sql_module, "load_sql", counted)
    as_of = night(DAYS - 1).isoformat()
    private_train(spec=copy.deepcopy(file_spec), as_of=as_of)
    result = private_train(spec=copy.deepcopy(table_spec), as_of=as_of)
    window = ["2026-11-04", "2026-11-05"]
    assert result["blocks"] == window if "blocks" in result else True
    assert read[-1] == _window_rows(frame, window)  # what left the database: the window's rows, no other
    assert len(read[-1]) < len(frame)
    assert _ledger_rows(table_spec["budget"]["ledger"]) == _ledger_rows(file_spec["budget"]["ledger"])
    assert PrivacyLedger.open(table_spec["budget"]["ledger"]).spent("visits") == pytest.approx(
        PrivacyLedger.open(file_spec["budget"]["ledger"]).spent("visits"))


def test_event_level_windows_are_pushed_down_exactly(tmp_path):
    frame = _frame(tmp_path)
    url = _to_sqlite(frame, tmp_path / "rows.db")
    source = specs.sections.SqlSource(kind="sql", url=url, table="visits", label="digit", classes=list(range(10)))
    blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=10)
    table = load_sql(source, blocks=blocks, within=window_bounds(["2026-11-02", "2026-11-03"], "day"))
    assert {str(i) for i in table.row_ids} == set(frame.loc[frame.arrived.isin(["2026-11-02", "2026-11-03"]), "visit"].astype(str))
    assert list(table.row_ids) == sorted(table.row_ids, key=int)  # row_id order
    whole = load_sql(source)  # without blocks: every row, the features the numeric columns
    assert len(whole) == len(frame) and whole.columns == tuple(f"px{i}" for i in range(64))
    np.testing.assert_allclose(whole.features, frame[[f"px{i}" for i in range(64)]].to_numpy(np.float32))


def test_a_query_is_a_source_typed_by_the_databases_answer(tmp_path):
    frame = _frame(tmp_path)
    url = _to_sqlite(frame, tmp_path / "rows.db")
    source = specs.sections.SqlSource(kind="sql", url=url, label="digit", classes=list(range(10)), row_id="visit",
                                      query="SELECT visit, digit, arrived, patient, px10, px20 FROM visits "
                                            "WHERE digit < 5;")
    table = load_sql(source)  # the text columns are no features; the numbers are
    assert table.columns == ("px10", "px20") and len(table) == int((frame.digit < 5).sum())
    blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=10)
    window = load_sql(source, blocks=blocks, within=window_bounds(["2026-11-02"], "day"))
    assert {str(i) for i in window.row_ids} == set(
        frame.loc[(frame.digit < 5) & (frame.arrived == "2026-11-02"), "visit"].astype(str))
    with pytest.raises(ValueError, match=r"^data.source.query: the query at sqlite:///.*: no such table: visitz$"):
        load_sql(source.model_copy(update={"query": "SELECT * FROM visitz"}))
    with pytest.raises(specs.SpecError, match=r"data.source: .*give one of table .* or query"):
        specs.spec_from_dict(_sql_spec(stream_spec(tmp_path), url, query="SELECT visit FROM visits"))


def _refused(tmp_path, match, frame=None, table_types=None, spec_source=None, blocks=None, env=None, monkeypatch=None):
    frame = frame if frame is not None else _frame(tmp_path)
    url = _to_sqlite(frame, tmp_path / f"r{np.random.randint(1e9)}.db", **(table_types or {}))
    fields = {"kind": "sql", "url": url, "table": "visits", "label": "digit", "classes": list(range(10)),
              **(spec_source or {})}
    with pytest.raises(ValueError, match=match):
        load_sql(specs.sections.SqlSource(**fields), blocks=blocks)


def test_what_the_database_says_no_to_is_one_line_naming_the_field(tmp_path, monkeypatch):
    frame = _frame(tmp_path, days=2)
    _refused(tmp_path, r"^data.source.table: no table or view 'visitz' .*; there: visits$", frame,
             spec_source={"table": "visitz"})
    _refused(tmp_path, r"^data.source.features: table 'visits' has no column 'px99'; its columns: visit, ", frame,
             spec_source={"features": ["px1", "px99"]})
    _refused(tmp_path, r"^data.source.features: column 'patient' is TEXT in the database, not a number", frame,
             spec_source={"features": ["px1", "patient"]})
    nulls = frame.astype(object)
    nulls.loc[3, "digit"] = None
    _refused(tmp_path, r"^data.source.label: column 'digit' is NULL in a row", nulls)
    nulls = frame.astype(object)
    nulls.loc[3, "arrived"] = None
    _refused(tmp_path, r"^data.blocks.arrival: column 'arrived' is NULL in a row", nulls,
             blocks=specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=10))
    nulls = frame.astype(object)
    nulls.loc[3, "px5"] = None
    _refused(tmp_path, r"^data.source.features: column 'px5' is NULL, not finite", nulls)
    twice = frame.copy()
    twice["patient_no"] = 7  # a column named as row_id that repeats
    _refused(tmp_path, r"^data.source.row_id: column 'patient_no' repeats identifiers", twice,
             spec_source={"row_id": "patient_no"})
    _refused(tmp_path, r"^data.source.password_env: \$PRIVZO_NO_SUCH_VAR is not set", frame,
             spec_source={"password_env": "PRIVZO_NO_SUCH_VAR"})
    with pytest.raises(ValueError, match=r"^data.source.url: no SQLite file at /nowhere/rows.db"):
        load_sql(specs.sections.SqlSource(kind="sql", url="sqlite:////nowhere/rows.db", table="t", label="y",
                                          classes=[0, 1]))
    with pytest.raises(specs.SpecError, match=r"data.source.url: holds a password; .* data.source.password_env, or "
                                              r"in libpq's ~/.pgpass$") as refused:
        specs.spec_from_dict(_sql_spec(stream_spec(tmp_path), "postgresql+psycopg://reader:s3cret@db/rows"))
    assert "s3cret" not in str(refused.value)


def test_a_refused_source_charges_nothing(prefect_server, tmp_path, mlflow_db, monkeypatch):
    from flows.private_train import private_train

    monkeypatch.chdir(tmp_path)
    frame = _frame(tmp_path).astype(object)
    frame.loc[frame.index[frame.arrived == "2026-11-04"][0], "patient"] = None  # a row of the window
    d = _sql_spec(stream_spec(tmp_path, window=2, persons=True), _to_sqlite(frame, tmp_path / "rows.db"))
    d["tracking"]["uri"] = mlflow_db
    with pytest.raises(ValueError, match=r"^data.blocks.person: column 'patient' is NULL or empty in a row"):
        private_train(spec=d, as_of=night(DAYS - 1).isoformat())
    ledger = PrivacyLedger.open(d["budget"]["ledger"])
    assert ledger.history("visits") == [] and ledger.spent("visits") == 0.0


def test_postgresql_reads_the_window_as_a_select_only_role_and_refuses_what_the_server_refuses(postgres_url,
                                                                                               tmp_path):
    from tests.flows.conftest import as_postgres

    frame = _frame(tmp_path)
    url = sa.engine.make_url(postgres_url)
    engine = sa.create_engine(postgres_url)
    schema = postgres_url.rsplit("%3D", 1)[1]
    types = {c: sa.Float() for c in frame.columns if c.startswith("px")}
    with engine.begin() as conn:
        sa.Table("visits", sa.MetaData(), sa.Column("visit", sa.BigInteger, primary_key=True),
                 *[sa.Column(c, t) for c, t in types.items()], sa.Column("digit", sa.Integer, nullable=False),
                 sa.Column("arrived", sa.DateTime(timezone=True)), sa.Column("patient", sa.Text),
                 schema=schema).create(conn)
        rows = frame.assign(arrived=pd.to_datetime(frame.arrived, utc=True))
        rows.to_sql("visits", conn, schema=schema, if_exists="append", index=False)
    engine.dispose()
    reader = f"reader_{schema}"
    as_postgres(f"CREATE ROLE {reader} LOGIN PASSWORD 'read-only'", f"GRANT USAGE ON SCHEMA {schema} TO {reader}",
                f"GRANT SELECT ON {schema}.visits TO {reader}")
    try:
        def as_reader(port):
            return sa.engine.URL.create(url.drivername, username=reader, host=url.host, port=port,
                                        database=url.database, query=url.query).render_as_string(hide_password=False)

        base = as_reader(url.port)
        source = dict(kind="sql", url=base, table=f"{schema}.visits", label="digit", classes=list(range(10)),
                      password_env="PRIVZO_TEST_READER")
        blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", person="patient", declared_persons=10)
        import os

        os.environ["PRIVZO_TEST_READER"] = "read-only"
        window = ["2026-11-03", "2026-11-04"]
        table = load_sql(specs.sections.SqlSource(**source), blocks=blocks, within=window_bounds(window, "day"))
        assert {str(i) for i in table.row_ids} == _window_rows(frame, window)
        queried = specs.sections.SqlSource(**{**source, "table": None, "row_id": "visit",
                                              "query": f"SELECT * FROM {schema}.visits"})
        assert {str(i) for i in load_sql(queried, blocks=blocks, within=window_bounds(window, "day")).row_ids} == \
            _window_rows(frame, window)
        os.environ["PRIVZO_TEST_READER"] = "wrong"
        with pytest.raises(ValueError, match=r"^data.source.url: the database at .* refused: .*password authentication "
                                             r"failed"):
            load_sql(specs.sections.SqlSource(**source))
        os.environ["PRIVZO_TEST_READER"] = "read-only"
        as_postgres(f"REVOKE SELECT ON {schema}.visits FROM {reader}")
        with pytest.raises(ValueError, match=r"^data.source.table: '.*visits' at .*: permission denied"):
            load_sql(specs.sections.SqlSource(**source))
        closed = as_reader(1)
        with pytest.raises(ValueError, match=r"^data.source.url: the database at .*:1/.* refused: .*(refused|connect)"):
            load_sql(specs.sections.SqlSource(**{**source, "url": closed}))
    finally:
        os.environ.pop("PRIVZO_TEST_READER", None)
        as_postgres(f"REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {reader}",
                    f"REVOKE USAGE ON SCHEMA {schema} FROM {reader}", f"DROP ROLE {reader}")


def test_simulate_plays_the_sql_stream_as_the_files(prefect_server, tmp_path, monkeypatch):
    """specs/examples/digits_stream_sql.yaml as `privzo budget simulate` plays it: the night's rows are inserted
    into a SQLite table, the night's run reads its window from it and commits, one charge on each of its 7
    blocks (the sixty nights of docs/guide/budgets-and-retraining.md print the file example's blocks)."""
    from flows.simulate import simulate, stream_frame
    from tests.conftest import EXAMPLES

    monkeypatch.chdir(tmp_path)
    played = simulate(str(EXAMPLES / "digits_stream_sql.yaml"), nights=1, folder=tmp_path / "sim")
    assert [(n.night, n.status, n.window) for n in played["nights"]] == [
        ("2026-09-08", "committed", "2026-09-01 .. 2026-09-07")]
    assert {b.block: b.charges for b in played["blocks"]} == {f"2026-09-0{d}": 1 for d in range(1, 8)}
    with sqlite3.connect(tmp_path / "sim" / "stream.db") as con:
        (rows,) = con.execute("SELECT COUNT(*) FROM visits").fetchone()
    assert rows == len(stream_frame(night_at(2026, 9, 8)))
    assert played["spent"] <= played["lifetime"]


def night_at(*date):
    return dt.datetime(*date, 2, tzinfo=dt.timezone.utc)


def test_a_text_column_is_tokenised_as_a_files_is(tmp_path):
    """A table's text column gives the same token ids as the same texts in a file (MiniLM's tokenizer)."""
    from components import pretrained

    frame = pd.DataFrame({"ticket": range(40), "body": [f"ticket {i} about {'billing' if i % 2 else 'login'}"
                                                         for i in range(40)],
                          "queue": ["billing" if i % 2 else "login" for i in range(40)]})
    with sqlite3.connect(tmp_path / "t.db") as con:
        con.execute("CREATE TABLE tickets (ticket INTEGER PRIMARY KEY, body TEXT, queue TEXT)")
        con.executemany("INSERT INTO tickets VALUES (?, ?, ?)", frame.astype(object).itertuples(index=False, name=None))
    source = specs.sections.SqlSource(kind="sql", url=f"sqlite:///{tmp_path / 't.db'}", table="tickets", label="queue",
                                      classes=["login", "billing"], text="body", max_length=12)
    table = load_sql(source, tokenizer="minilm")
    expected = pretrained.tokenizer("minilm")("ticket 3 about billing", padding="max_length", max_length=12)["input_ids"]
    assert table.features.shape == (40, 2, 12) and table.features[3, 0].tolist() == expected
    assert table.labels.tolist() == [i % 2 for i in range(40)]
    with pytest.raises(specs.SpecError, match="a text column is the whole input"):
        specs.spec_from_dict(_sql_spec(stream_spec(tmp_path), source.url, table="tickets", text="body", features=["x"]))

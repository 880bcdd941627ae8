"""A table's rows read as the ledger counts them (docs/design.md, "Blocks"): a query is a per-row filter of one
table or refused; a window is pushed to the database only where it compares instants, else chosen in privzo as
for a file; identity is checked over the whole table by privzo's own key; a change of identity is refused
naming the owner's re-keying, which carries the records over. SQLite here; PostgreSQL where the type matters."""
import copy
import sqlite3

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

import specs
from components.data.blocks import arrival_periods
from components.data.blocks import window_bounds
from components.data.sql import load_sql
from flows.ledger import PrivacyLedger, RowsUnmatched
from tests.flows.test_blocks import night, stream_spec
from tests.flows.test_sql_source import DAYS, _frame, _sql_spec, _to_sqlite

WINDOW = ["2026-11-03", "2026-11-04"]

NOT_PER_ROW = {
    "a subquery": "SELECT * FROM visits WHERE px20 > (SELECT AVG(px20) FROM visits)",
    "LIMIT": "SELECT * FROM visits ORDER BY RANDOM() LIMIT 30",
    "LIMIT ": "SELECT * FROM visits LIMIT 30",
    "GROUP BY": "SELECT digit, AVG(px20) AS px20, MIN(visit) AS visit FROM visits GROUP BY digit",
    "an aggregate": "SELECT visit, digit, px20 - AVG(px20) AS px FROM visits",
    "DISTINCT": "SELECT DISTINCT * FROM visits",
    "a window function": "SELECT visit, digit, px20, rank() OVER (ORDER BY px20) AS px FROM visits",
    "a second table (a join)": "SELECT v.* FROM visits v JOIN visits w ON v.patient = w.patient",
    "a second table": "SELECT visits.* FROM visits, visits AS w",
    "a WITH clause": "WITH v AS (SELECT * FROM visits) SELECT * FROM v",
    "a set operation (UNION)": "SELECT * FROM visits UNION SELECT * FROM visits",
    "a set operation (EXCEPT)": "SELECT * FROM visits EXCEPT SELECT * FROM visits WHERE digit = 1",
    "OFFSET": "SELECT * FROM visits OFFSET 5",
    "FETCH": "SELECT * FROM visits FETCH FIRST 30 ROWS ONLY",
    "ORDER BY": "SELECT * FROM visits ORDER BY px20",
    "random()": "SELECT * FROM visits WHERE random() < 0.5",
    "the current": "SELECT * FROM visits WHERE arrived < CURRENT_TIMESTAMP",
    "a subquery (EXISTS)": "SELECT * FROM visits WHERE EXISTS (SELECT 1 FROM visits w WHERE w.px20 > 9)",
    "a subquery ": "SELECT * FROM visits WHERE patient IN (SELECT patient FROM visits WHERE digit = 3)",
    "a subquery  ": "SELECT * FROM (SELECT * FROM visits) AS v",
    "TABLESAMPLE": "SELECT * FROM visits TABLESAMPLE BERNOULLI (50)",
    "2 statements": "SELECT * FROM visits; SELECT * FROM visits",
    "not a SELECT": "DELETE FROM visits",
    "the function": "SELECT * FROM generate_series(1, 3)",
    "HAVING": "SELECT digit, MIN(visit) AS visit FROM visits GROUP BY digit HAVING COUNT(*) > 2",
}


@pytest.mark.parametrize("backend", ["sqlite:///rows.db", "postgresql+psycopg://reader@db/rows"])
@pytest.mark.parametrize("found", sorted(NOT_PER_ROW))
def test_a_query_that_is_not_a_per_row_filter_is_refused_when_the_spec_is_read(tmp_path, backend, found):
    """Every form through which another row, the order or chance decides a row (one line naming the field and
    what was found); checked when the spec is read, so validate, run, a deployment and a Ray worker all refuse it."""
    d = _sql_spec(stream_spec(tmp_path), backend, table=None, query=NOT_PER_ROW[found], row_id="visit")
    with pytest.raises(specs.SpecError) as refused:
        specs.spec_from_dict(d)
    line = str(refused.value)
    assert line.startswith("data.source.query: ") and "\n" not in line
    assert found.strip().split(" (")[0] in line and "per-row filter" in line


def test_a_per_row_query_reads_what_a_file_of_its_rows_would(tmp_path):
    """Admitted: columns, per-row expressions, a WHERE on the row's own values; adding a person whose only row is
    outside the window changes no row the window reads."""
    frame = _frame(tmp_path)
    query = ("SELECT v.visit, v.digit, v.arrived, v.patient, px10 * 2 AS px10, CASE WHEN px20 > 8 THEN 1.0 ELSE 0.0 "
             "END AS high FROM visits AS v WHERE lower(v.patient) LIKE 'patient-%' AND digit IN (1, 3, 5) "
             "AND px30 BETWEEN 0 AND 12")
    source = specs.sections.SqlSource(kind="sql", url=_to_sqlite(frame, tmp_path / "a.db"), label="digit",
                                      classes=list(range(10)), row_id="visit", query=query)
    blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", person="patient", declared_persons=10)
    before = load_sql(source, blocks=blocks, within=window_bounds(WINDOW, "day"))
    extra = frame.iloc[[0]].assign(visit=99_999, patient="patient-x", arrived="2026-11-05", digit=3, px30=1.0)
    grown = pd.concat([frame, extra], ignore_index=True)
    after = load_sql(source.model_copy(update={"url": _to_sqlite(grown, tmp_path / "b.db")}), blocks=blocks,
                     within=window_bounds(WINDOW, "day"))
    assert before.row_ids.tolist() == after.row_ids.tolist() and len(before) > 0
    np.testing.assert_array_equal(before.features, after.features)
    kept = frame[frame.patient.str.lower().str.startswith("patient-") & frame.digit.isin([1, 3, 5])
                 & frame.px30.between(0, 12)]
    first = kept.groupby("patient").arrived.transform("min")
    assert set(before.row_ids.tolist()) == set(kept.loc[first.isin(WINDOW), "visit"])
    assert before.columns == ("px10", "high")


def _window_of_file(frame, blocks_spec, blocks):
    periods = arrival_periods(frame.arrived.astype(str).to_numpy(object), "day", "arrived", blocks_spec.arrival_format)
    return set(frame.visit[np.isin(periods, blocks)])


@pytest.mark.parametrize("form", ["offset", "format", "mixed"])
def test_a_window_on_text_arrivals_reads_the_rows_a_file_read_would(tmp_path, form):
    """SQLite keeps arrivals as text: ISO dates and UTC times are compared as text in the database; ISO times
    with another offset, a declared arrival_format, or a mix are read whole and chosen in privzo, as a file's."""
    frame = _frame(tmp_path)
    moments = pd.to_datetime(frame.arrived) + pd.to_timedelta(frame.index % 24, unit="h")
    if form == "offset":  # 00:30+01:00 is the day before in UTC
        frame["arrived"] = (moments.dt.tz_localize("UTC").dt.tz_convert("Europe/Paris")
                            .map(lambda t: t.isoformat()))
        fmt = None
    elif form == "format":
        frame["arrived"] = moments.dt.strftime("%d/%m/%Y %H:%M")
        fmt = "%d/%m/%Y %H:%M"
    else:
        frame["arrived"] = [t.strftime("%Y-%m-%d") if i % 3 else t.isoformat() + "Z" for i, t in enumerate(moments)]
        fmt = None
    blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=10, arrival_format=fmt)
    source = specs.sections.SqlSource(kind="sql", url=_to_sqlite(frame, tmp_path / "rows.db"), table="visits",
                                      label="digit", classes=list(range(10)))
    table = load_sql(source, blocks=blocks, within=window_bounds(WINDOW, "day"))
    periods = arrival_periods(table.arrivals, "day", "arrived", fmt)
    chosen = set(np.asarray(table.row_ids)[np.isin(periods, WINDOW)].tolist())
    assert chosen == _window_of_file(frame, blocks, WINDOW) and chosen


def test_an_arrival_a_file_read_refuses_is_refused_naming_the_field(tmp_path):
    frame = _frame(tmp_path, days=3)
    frame.loc[5, "arrived"] = "03/11/2026"
    blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=10)
    source = specs.sections.SqlSource(kind="sql", url=_to_sqlite(frame, tmp_path / "rows.db"), table="visits",
                                      label="digit", classes=list(range(10)))
    table = load_sql(source, blocks=blocks, within=window_bounds(["2026-11-02"], "day"))  # read whole
    with pytest.raises(ValueError, match=r"^data.blocks.arrival: column 'arrived' holds '03/11/2026' .*ISO 8601"):
        arrival_periods(table.arrivals, "day", "arrived")


def test_row_ids_are_unique_over_the_table_and_persons_told_apart_byte_for_byte(tmp_path):
    """A row_id restarting each day repeats outside any one window; a NOCASE column's 'Patient-1' and
    'patient-1' are two persons to privzo (as in a file), whatever the database's collation calls them; a
    float id is refused, not truncated."""
    frame = _frame(tmp_path)
    daily = frame.assign(visit=frame.groupby("arrived").cumcount())
    with sqlite3.connect(tmp_path / "daily.db") as con:
        con.execute("CREATE TABLE visits (visit INTEGER, digit INTEGER, arrived TEXT, patient TEXT, "
                    + ", ".join(f"px{i} REAL" for i in range(64)) + ")")
        con.executemany(f"INSERT INTO visits VALUES ({', '.join('?' * (4 + 64))})",
                        daily[["visit", "digit", "arrived", "patient"] + [f"px{i}" for i in range(64)]]
                        .astype(object).itertuples(index=False, name=None))
    blocks = specs.sections.BlocksSpec(arrival="arrived", period="day", declared_private_rows=10)
    source = specs.sections.SqlSource(kind="sql", url=f"sqlite:///{tmp_path / 'daily.db'}", table="visits",
                                      label="digit", classes=list(range(10)), row_id="visit")
    with pytest.raises(ValueError, match=r"^data.source.row_id: column 'visit' repeats identifiers over table 'visits'"):
        load_sql(source, blocks=blocks, within=window_bounds(["2026-11-02"], "day"))

    cased = frame.copy()
    cased.loc[cased.index % 4 == 0, "patient"] = cased.patient.str.upper()
    url = _to_sqlite(cased, tmp_path / "nocase.db", patient="TEXT COLLATE NOCASE")
    persons = specs.sections.BlocksSpec(arrival="arrived", period="day", person="patient", declared_persons=10)
    table = load_sql(specs.sections.SqlSource(kind="sql", url=url, table="visits", label="digit",
                                              classes=list(range(10))), blocks=persons, within=window_bounds(WINDOW, "day"))
    first = cased.groupby("patient").arrived.transform("min")  # pandas compares byte for byte, as privzo does
    assert set(table.row_ids.tolist()) == set(cased.loc[first.isin(WINDOW), "visit"])

    floats = frame.assign(code=frame.visit + 10_000).astype(object)
    floats.loc[7, "code"] = 10_000.5  # in an INTEGER column, SQLite keeps it as a float
    url = _to_sqlite(floats, tmp_path / "f.db", code="INTEGER")
    with pytest.raises(ValueError, match=r"^data.source.row_id: column 'code' holds floating-point numbers"):
        load_sql(specs.sections.SqlSource(kind="sql", url=url, table="visits", label="digit", classes=list(range(10)),
                                          row_id="code", features=["px1", "px2"]))


def _run(d, as_of):
    from flows.private_train import private_train

    return private_train(spec=copy.deepcopy(d), as_of=as_of)


def _spent_by_block(url, dataset="visits"):
    return {b.block: (b.epsilon, b.charges) for b in PrivacyLedger.open(url).blocks(dataset)}


def test_a_person_column_migrated_from_integers_to_text_is_refused_until_the_owner_rekeys(
        prefect_server, tmp_path, mlflow_db, monkeypatch):
    """65 recorded, '0065' written after the column became TEXT: refused before any row is read, naming the
    identity and `privzo budget migrate-ids`, never a new dataset; after it, the person's rows keep their
    block and the ledger's check is clean."""
    from flows.cli.budget.id_migration import migrate

    monkeypatch.chdir(tmp_path)
    frame = _frame(tmp_path)
    frame["patient"] = frame.patient.str.removeprefix("patient-").astype(int) + 1
    d = _sql_spec(stream_spec(tmp_path, window=2, persons=True), _to_sqlite(frame, tmp_path / "int.db",
                                                                            patient="INTEGER"))
    d["tracking"]["uri"] = mlflow_db
    _run(d, night(DAYS - 2).isoformat())
    before = _spent_by_block(d["budget"]["ledger"])
    text = frame.astype({"patient": str})
    late = text.arrived == text.arrived.max()
    text.loc[late, "patient"] = text.loc[late, "patient"].str.zfill(4)  # the returning persons, zero-padded now
    d["data"]["source"]["url"] = _to_sqlite(text, tmp_path / "text.db", patient="TEXT")
    with pytest.raises(RowsUnmatched, match=r"^data.source: dataset 'visits'.s runs .*person and row_id read as integers; this run .*'visit', row_id read as "
                                            r"integers, .*"
                                            r"`privzo budget migrate-ids visits --spec SPEC`") as refused:
        _run(d, night(DAYS - 1).isoformat())
    assert "new dataset" not in str(refused.value)
    assert _spent_by_block(d["budget"]["ledger"]) == before  # refused before anything was reserved
    counts = migrate(specs.spec_from_dict(d), d["budget"]["ledger"])
    assert counts["person"] > 0
    _run(d, night(DAYS - 1).isoformat())
    from flows.ledger import ledger_problems

    assert ledger_problems(PrivacyLedger.open(d["budget"]["ledger"]), "visits") == []
    # every returning person, written 0065 now, keeps the block recorded for 65: one person, one block
    from components.data.split import person_keys
    from flows.record.tracking import keyed_rows

    returning = set(frame.patient[~late]) & set(frame.patient[late])
    padded = sorted(str(p).zfill(4) for p in returning)
    ledger = PrivacyLedger.open(d["budget"]["ledger"])
    now = ledger.recorded_blocks("visits", "person", keyed_rows(person_keys(padded)))
    then = ledger.recorded_blocks("visits", "person", keyed_rows(person_keys([str(int(p)) for p in padded])))
    assert padded and sorted(now.values()) == sorted(then.values()) and len(now) == len(padded)


def _ids_keeping_parts(spec):
    """Row ids under which each row of ``spec``'s file is test exactly when it was by its content (the column
    split hashes a row's identity: other ids would move rows between test and private)."""
    import hashlib

    from components.builders import source_table
    from components.data.split import _row_uniforms

    table = source_table(spec)
    was_test = _row_uniforms(table.row_fingerprints(), spec.seed)[0] < spec.data.split.test
    pool = np.arange(5000, 5000 + 20 * len(table))
    by_id = _row_uniforms([hashlib.sha256(b"row_id:" + str(i).encode()).hexdigest() for i in pool], spec.seed)[0]
    test_ids, other_ids = iter(pool[by_id < spec.data.split.test]), iter(pool[by_id >= spec.data.split.test])
    return [next(test_ids) if t else next(other_ids) for t in was_test]


def test_rows_read_by_content_moving_to_a_keyed_table_are_rekeyed_not_charged_anew(
        prefect_server, tmp_path, mlflow_db, monkeypatch):
    """An event-level dataset read from a CSV without row_id, then from a table with its key: refused naming the
    identity (not advising a new dataset); the owner's migrate-ids maps each recorded content key to its row's
    id, and the next run matches every earlier private row. (The parts come from a column here: a hashed split
    hashes a row's identity, so after such a migration a row once private may be drawn public, and is then
    refused as exposed, never used without noise.)"""
    from flows.cli.budget.id_migration import migrate
    from flows.ledger.schema import PrivateRowRow

    monkeypatch.chdir(tmp_path)
    frame = _frame(tmp_path).drop(columns=["patient"])
    frame["public"] = np.where(frame.visit % 10 == 0, "true", "false")
    d = stream_spec(tmp_path, window=2)
    d["data"]["split"] = {"kind": "column", "column": "public", "test": 0.2}
    d["tracking"]["uri"] = mlflow_db
    frame.drop(columns=["visit"]).to_csv(tmp_path / "visits.csv", index=False)
    frame["visit"] = _ids_keeping_parts(specs.spec_from_dict(d))
    _run(d, night(DAYS - 2).isoformat())
    url = d["budget"]["ledger"]
    with sa.orm.Session(PrivacyLedger.open(url).engine) as session:
        private_before = len(session.scalars(sa.select(PrivateRowRow.row)).all())
    table = _sql_spec(d, _to_sqlite(frame, tmp_path / "rows.db"))
    with pytest.raises(RowsUnmatched, match=r"identified its rows by their content .* by row id column 'visit'.*"
                                            r"migrate-ids visits") as refused:
        _run(table, night(DAYS - 1).isoformat())
    assert "new dataset" not in str(refused.value)
    counts = migrate(specs.spec_from_dict(table), url)
    assert counts["private"] == private_before
    _run(table, night(DAYS - 1).isoformat())
    assert {b.block: b.charges for b in PrivacyLedger.open(url).blocks("visits")}[WINDOW[1]] == 2


def test_validate_connects_to_check_the_table(tmp_path, monkeypatch, capsys):
    """`privzo validate` checks the table where it lives (or says it did not connect and why)."""
    import yaml

    from flows.cli import main

    monkeypatch.chdir(tmp_path)
    frame = _frame(tmp_path)
    d = _sql_spec(stream_spec(tmp_path, window=2, persons=True), _to_sqlite(frame, tmp_path / "rows.db"))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 0
    out = capsys.readouterr().out
    assert "connected read-only to sqlite:///" in out and "row id 'visit' (integer)" in out
    assert "a window is read by the database" in out
    d["data"]["source"]["features"] = ["px1", "px99"]
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 2
    assert "data.source.features: table 'visits' has no column 'px99'" in capsys.readouterr().err
    d["data"]["source"].pop("features")
    d["data"]["source"]["url"] = "postgresql+psycopg://reader@127.0.0.1:1/rows"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    assert main(["validate", str(tmp_path / "s.yaml")]) == 0
    assert "note: did not connect: data.source.url: the database at" in capsys.readouterr().out


def test_an_empty_window_says_which_blocks_it_covers(prefect_server, tmp_path, mlflow_db, monkeypatch):
    """A night whose window holds no row says so, naming its blocks, and charges nothing."""
    monkeypatch.chdir(tmp_path)
    d = _sql_spec(stream_spec(tmp_path, window=2, persons=True), _to_sqlite(_frame(tmp_path), tmp_path / "rows.db"))
    d["tracking"]["uri"] = mlflow_db
    with pytest.raises(ValueError, match=r"^data.blocks: the window of 2 blocks as of 2027-01-10T02:00:00\+00:00, "
                                         r"2027-01-08 .. 2027-01-09, holds no row of visits; nothing is charged"):
        _run(d, "2027-01-10T02:00:00+00:00")
    assert PrivacyLedger.open(d["budget"]["ledger"]).history("visits") == []


def test_postgresql_compares_instants_for_time_types_and_reads_text_arrivals_as_a_file(postgres_url, tmp_path,
                                                                                     monkeypatch):
    """On PostgreSQL a timestamptz window is pushed down; a text column of ISO times with offsets is read whole
    and chosen as a file's (the same rows either way); an identity column's type is a term of the layout; a
    case-insensitive collation does not merge two persons."""
    from components.data.sql import identity_layout_of

    frame = _frame(tmp_path)
    moments = (pd.to_datetime(frame.arrived) + pd.to_timedelta(frame.index % 24, unit="h")).dt.tz_localize("UTC")
    schema = postgres_url.rsplit("%3D", 1)[1]
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:
        ci = conn.execute(sa.text("SELECT count(*) FROM pg_collation WHERE collprovider = 'i'")).scalar() > 0
        if ci:
            conn.execute(sa.text(f"CREATE COLLATION {schema}.ci (provider = icu, locale = 'und-u-ks-level2', "
                                 "deterministic = false)"))
        cased = frame.patient.where(frame.index % 4 != 0, frame.patient.str.upper())
        rows = frame.assign(at=moments, text_at=moments.dt.tz_convert("Asia/Kolkata").map(lambda t: t.isoformat()),
                            patient=cased, num=frame.patient.str.removeprefix("patient-").astype(int))
        rows.drop(columns=["arrived"]).to_sql("visits", conn, schema=schema, index=False)
        conn.execute(sa.text(f"ALTER TABLE {schema}.visits ADD PRIMARY KEY (visit)"))
        if ci:
            conn.execute(sa.text(f'ALTER TABLE {schema}.visits ALTER COLUMN patient TYPE text COLLATE {schema}.ci'))
    engine.dispose()
    url = sa.engine.make_url(postgres_url)
    monkeypatch.setenv("PRIVZO_TEST_PG", url.password or "")
    source = specs.sections.SqlSource(kind="sql", url=url._replace(password=None).render_as_string(hide_password=False),
                                      password_env="PRIVZO_TEST_PG", table=f"{schema}.visits", label="digit",
                                      classes=list(range(10)), features=["px1", "px2"])
    expected = None
    for column in ("at", "text_at"):
        blocks = specs.sections.BlocksSpec(arrival=column, period="day", person="patient", declared_persons=10)
        table = load_sql(source, blocks=blocks, within=window_bounds(WINDOW, "day"))
        periods = arrival_periods(table.arrivals, "day", column)
        first: dict = {}
        for person, period in zip(table.persons, periods):
            first[person] = min(first.get(person, period), period)
        chosen = {i for i, p in zip(table.row_ids.tolist(), table.persons) if first[p] in WINDOW}
        whole = rows.assign(day=rows["at"].dt.strftime("%Y-%m-%d"))
        firsts = whole.groupby("patient").day.transform("min")  # byte for byte, as privzo tells persons apart
        assert chosen == set(whole.visit[firsts.isin(WINDOW)]) and chosen
        expected = chosen if expected is None else expected
        assert chosen == expected
    text_layout = identity_layout_of(source, blocks=specs.sections.BlocksSpec(
        arrival="at", period="day", person="patient", declared_persons=10))
    int_layout = identity_layout_of(source, blocks=specs.sections.BlocksSpec(
        arrival="at", period="day", person="num", declared_persons=10))
    assert text_layout.endswith("integer-ids=row_id") and int_layout.endswith("integer-ids=person,row_id")
    with pytest.raises(ValueError, match=r"^data.blocks.arrival_format: column 'at' is TIMESTAMP"):
        load_sql(source, blocks=specs.sections.BlocksSpec(arrival="at", arrival_format="%Y", period="day",
                                                          declared_private_rows=10), within=window_bounds(WINDOW, "day"))


def test_the_export_never_deletes_a_row_nor_writes_the_future(tmp_path, monkeypatch):
    """The grow deployment's table is the team's: a stale table is continued, never emptied (a person deleted
    and written again would be charged as new); a deployment's run writes as of its scheduled time only, and no
    export writes a moment that has not come."""
    import datetime as dt

    from flows import simulate as sim
    from flows import worker_config

    url = f"sqlite:///{tmp_path / 'team.db'}"
    old = dt.datetime(2026, 9, 8, 2, tzinfo=dt.timezone.utc)
    first = sim.grow_stream_table(url, "visits", old)
    with sqlite3.connect(tmp_path / "team.db") as con:
        before = set(con.execute("SELECT visit, arrived FROM visits").fetchall())
    later = sim.grow_stream_table(url, "visits", old + dt.timedelta(days=20))  # stale by 20 days: continued
    with sqlite3.connect(tmp_path / "team.db") as con:
        after = set(con.execute("SELECT visit, arrived FROM visits").fetchall())
    assert before <= after and later > first
    with pytest.raises(ValueError, match=r"^as_of: 2099-03-01T00:00:00\+00:00 is in the future"):
        sim._written_as_of("2099-03-01")
    monkeypatch.setattr(worker_config, "deployment_run", lambda: True)
    with pytest.raises(ValueError, match=r"^as_of: a deployment's export writes the rows arrived by its scheduled"):
        sim._written_as_of("2026-09-08")

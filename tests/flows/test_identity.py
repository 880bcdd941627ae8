"""A person's and a row's identity read as written (docs/design.md, "What identifies a row"): an id's key never
depends on the other rows of the file, a person's rows all fall in their person's block even where another
person has a row of the same content, and an arrival is ISO 8601 or a declared form, never a guess."""
import datetime as dt
from dataclasses import replace

import dp_accounting
import pandas as pd
import pytest

import specs
import yaml
from components.builders import source_table
from components.data import load_sklearn
from components.data.split import person_keys
from components.data.table import legacy_identity_layout
from flows import cli
from flows.tasks import legacy_ids_layout  # imports Prefect, whose log handlers outlive a test's capture
from flows.ledger import DatasetTerms, PrivacyLedger, Reservation, RowsRead, RowsUnmatched, WindowRead
from flows.record.tracking import KEYED_ROWS, keyed_rows
from flows.window import BlockView, Window
from tests.conftest import ledger_of

START = dt.date(2026, 11, 1)
PIXELS = load_sklearn("digits")


def night(day: int) -> dt.datetime:
    return dt.datetime.combine(START + dt.timedelta(days=day), dt.time(2), tzinfo=dt.timezone.utc)


def write(path, rows, row_id=False):
    """``rows``: (day, person, digits row) triples, written as a CSV of pixels, digit, arrival and person (and
    with ``row_id`` an ``rid`` column: the person's id with an r, so zero padding is kept in it too)."""
    frame = pd.DataFrame(PIXELS.features[[r for _, _, r in rows]], columns=[f"px{i}" for i in range(64)])
    frame["digit"] = PIXELS.labels[[r for _, _, r in rows]]
    frame["arrived"] = [(START + dt.timedelta(days=d)).isoformat() for d, _, _ in rows]
    frame["patient"] = [p for _, p, _ in rows]
    if row_id:
        frame["rid"] = [p for _, p, _ in rows]
    frame.to_csv(path, index=False)


def spec_for(tmp_path, window=3, persons=True, row_id=False, blocks=None):
    return specs.spec_from_dict(spec_dict(tmp_path, window, persons, row_id, blocks))


def spec_dict(tmp_path, window=3, persons=True, row_id=False, blocks=None):
    return {
        "name": "visits", "seed": 5,
        "data": {"source": {"kind": "file", "path": str(tmp_path / "visits.csv"), "label": "digit",
                            "classes": list(range(10)), "features": [f"px{i}" for i in range(64)],
                            **({"row_id": "rid"} if row_id else {})},
                 "split": {"kind": "hashed", "public": 0.05, "test": 0.2},
                 "blocks": {"arrival": "arrived", "period": "day", **(blocks or {}),
                            **({"person": "patient", "declared_persons": 20} if persons
                               else {"declared_private_rows": 20})}},
        "model": {"kind": "linear"},
        "estimator": {"kind": "two_point", "queries": 1, "smoothing": 1e-3},
        "mechanism": {"kind": "gaussian", "clip": 1.0},
        "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp"},
        "sampling": {"kind": "poisson", "expected_batch_size": 8},
        "optimizer": {"kind": "sgd", "lr": 0.02, "steps": 10},
        "budget": {"dataset": "visits", "lifetime_epsilon": 3.0, "ledger": f"sqlite:///{tmp_path / 'ledger.db'}",
                   "window": {"blocks": window}},
    }


def reserve(spec, view, layout=None):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(2.0)), 10)
    PrivacyLedger(spec.budget.ledger).reserve(Reservation(
        terms=DatasetTerms("visits", 3.0, 1e-5, "rdp", "add_remove"), planned=event, steps=10, fingerprint="f" * 64,
        run_name="night", rows=RowsRead(layout=layout or "", ids_legacy_layout=None),
        window=WindowRead(view.block_terms(), row_blocks=view.seen_rows, person_blocks=view.seen_persons),
        block_terms=False))


def selected(spec, day):
    view = BlockView(spec, Window.for_spec(spec, night(day)), ledger_of(spec))
    table = source_table(spec)
    return view, table, view.select(table)


def daily(days, per_day=20):
    """``per_day`` persons first arriving each day, zero-padded numeric ids (day 3's sixth is 0065)."""
    return [(d, f"{d * per_day + j:04d}", d * per_day + j) for d in days for j in range(per_day)]


@pytest.mark.parametrize("row_id", [False, True], ids=["person", "zero-padded row_id"])
def test_an_id_is_keyed_as_written_when_another_row_of_the_file_is_not_a_number(tmp_path, row_id):
    """Night 6 reads days 3-5 and records person (row) 0065 in day 3. Night 9's export holds days 6-8 only, with
    0065 back on day 7 (a new visit; with row_id, the row sent again) and one id that is not a number: 0065 is still the 0065 of day 3, so that row stays
    out of the window of days 6-8 (at c9ca262 the drift made it a new person, read and charged again)."""
    persons = not row_id

    def ids(table):
        return table.row_ids if row_id else table.persons

    write(tmp_path / "visits.csv", daily(range(0, 7)), row_id=row_id)
    spec = spec_for(tmp_path, persons=persons, row_id=row_id)
    view, table, chosen = selected(spec, 6)
    assert view.window.blocks == ("2026-11-04", "2026-11-05", "2026-11-06")
    assert 65 in chosen and len(chosen) == 60  # 0065 is the file's row 65, first seen on day 3
    reserve(spec, view)

    for other in ("0999", "A-7"):  # an export of days 6-8, every id a number, then one that is not
        rows = daily(range(6, 10)) + [(7, "0065", 1500), (8, other, 999)]  # a new visit of 0065's
        write(tmp_path / "visits.csv", rows, row_id=row_id)
        view, table, chosen = selected(spec, 9)
        assert view.window.blocks == ("2026-11-07", "2026-11-08", "2026-11-09")
        assert ids(table)[80] == "0065" and 80 not in chosen, other  # 0065's visit of day 7 is day 3's
        assert len(chosen) == 3 * 20 + 1  # days 6-8's persons and the new id


def test_two_persons_rows_of_equal_content_stay_each_in_their_persons_block(tmp_path):
    """Person B's row on day 7 has the pixels and label of person A's row of day 3: it is B's row, in B's
    block, read with B's other rows; A's row stays in day 3. Neither is dropped, whichever comes first."""
    a_row = 60  # person 0060's row, day 3
    write(tmp_path / "visits.csv", daily(range(0, 5)))
    spec = spec_for(tmp_path, window=1)
    view, _, _ = selected(spec, 4)
    assert view.window.blocks == ("2026-11-04",)
    reserve(spec, view)
    for order in (1, -1):
        rows = (daily(range(0, 9)) + [(7, "B", a_row), (7, "B", 500)])[::order]
        write(tmp_path / "visits.csv", rows)
        view, table, chosen = selected(spec, 8)
        assert len(table) == len(rows)  # no row dropped as a duplicate of another person's
        assert view.window.blocks == ("2026-11-08",)
        b = {i for i in chosen if table.persons[i] == "B"}
        assert len(b) == 2  # both of B's rows, the one equal to A's among them
        assert not {i for i in chosen if table.persons[i] == "0060"}  # A's row stays in A's block, day 3
        keyed = dict(zip(table.persons, keyed_rows(person_keys(table.persons))))
        assert view.seen_persons[keyed["B"]] == "2026-11-08" and view.seen_persons[keyed["0060"]] == "2026-11-04"


def test_an_arrival_not_in_iso_8601_is_refused_naming_the_value_and_the_forms(tmp_path):
    rows = daily(range(0, 2))
    write(tmp_path / "visits.csv", rows)
    frame = pd.read_csv(tmp_path / "visits.csv", dtype=str)
    frame.loc[3, "arrived"] = "03/10/2026"
    frame.to_csv(tmp_path / "visits.csv", index=False)
    spec = spec_for(tmp_path)
    with pytest.raises(ValueError, match=r"^data.blocks.arrival: column 'arrived' holds '03/10/2026' \(row 4\), which "
                                         r"is not a date or time in ISO 8601 \(e.g. 2026-03-10, .*\); write arrivals in "
                                         r"ISO 8601, or declare their form in data.blocks.arrival_format$"):
        selected(spec, 2)
    # declared, the form is read as declared, and every other value must be in it too
    frame["arrived"] = ["03/10/2026"] * len(frame)
    frame.to_csv(tmp_path / "visits.csv", index=False)
    spec = spec_for(tmp_path, window=1, blocks={"arrival_format": "%d/%m/%Y"})
    view = BlockView(spec, Window.for_spec(spec, dt.datetime(2026, 10, 4, 2, tzinfo=dt.timezone.utc)), ledger_of(spec))
    assert view.window.blocks == ("2026-10-03",) and len(view.select(source_table(spec))) == len(frame)
    frame.loc[0, "arrived"] = "2026-10-03"
    frame.to_csv(tmp_path / "visits.csv", index=False)
    with pytest.raises(ValueError, match=r"holds '2026-10-03' \(row 1\), which is not a date or time in the declared "
                                         r"data.blocks.arrival_format '%d/%m/%Y'$"):
        view.select(source_table(spec))


def test_identity_columns_of_typed_files_are_their_text_and_a_float_id_is_refused(tmp_path):
    from components.data import load_file

    frame = pd.DataFrame({"x": [1.0, 2.0, 3.0], "y": [0, 1, 0], "person": ["0065", "A-7", "65"],
                          "when": pd.to_datetime(["2026-11-01", "2026-11-02T05:00", "2026-11-03"], utc=True, format="ISO8601")})
    frame.to_parquet(tmp_path / "rows.parquet")
    table = load_file(tmp_path / "rows.parquet", file_format="parquet", label="y", classes=[0, 1], features=["x"],
                      arrival="when", person="person")
    assert list(table.persons) == ["0065", "A-7", "65"]
    assert list(table.arrivals) == ["2026-11-01T00:00:00+00:00", "2026-11-02T05:00:00+00:00",
                                    "2026-11-03T00:00:00+00:00"]
    (tmp_path / "rows.jsonl").write_text('{"x": 1, "y": 0, "person": "0065"}\n{"x": 2, "y": 1, "person": 65}\n')
    table = load_file(tmp_path / "rows.jsonl", file_format="jsonl", label="y", classes=[0, 1], features=["x"],
                      person="person")
    assert list(table.persons) == ["0065", "65"]
    frame.assign(person=[65.0, 7.0, 1.0]).to_parquet(tmp_path / "floats.parquet")
    with pytest.raises(ValueError, match=r"^data.blocks.person: column 'person' of floats.parquet holds floating-point "
                                         r"numbers \(65.0, row 1\), which do not keep an identifier as written"):
        load_file(tmp_path / "floats.parquet", file_format="parquet", label="y", classes=[0, 1], features=["x"],
                  person="person")


def test_a_ledger_keyed_by_inferred_ids_is_refused_until_its_owner_migrates_it(tmp_path, capsys):
    """A ledger an earlier privzo wrote (person 0065 recorded as 65, all ids numbers then) refuses a run with
    the command that migrates it; migrated, 0065 keeps the block the old key recorded."""
    write(tmp_path / "visits.csv", daily(range(0, 7)))
    spec = spec_for(tmp_path)
    view, table, _ = selected(spec, 6)
    # what the earlier reading recorded: every id as pandas' integer, a row by its content alone
    now = keyed_rows(person_keys(table.persons))
    old = keyed_rows(person_keys([str(int(p)) for p in table.persons]))
    content = keyed_rows(replace(table, persons=None).row_fingerprints())
    view.seen_persons = {o: view.seen_persons[n] for o, n in zip(old, now) if n in view.seen_persons}
    view.seen_rows = {c: view.seen_persons[o] for c, o in zip(content, old) if o in view.seen_persons}
    old_layout = f"{legacy_identity_layout(table.layout)};{KEYED_ROWS}"
    reserve(spec, view, layout=old_layout)
    assert len(view.seen_persons) == 120

    rows = daily(range(6, 10)) + [(7, "0065", 65), (8, "A-7", 999)]
    write(tmp_path / "visits.csv", rows)
    view, table, _ = selected(spec, 9)
    event = dp_accounting.GaussianDpEvent(3.0)
    new_layout = f"{table.layout};{KEYED_ROWS}"
    assert legacy_ids_layout(table.layout) == old_layout
    with pytest.raises(RowsUnmatched, match=r"privzo budget migrate-ids visits --spec SPEC"):
        PrivacyLedger(spec.budget.ledger).reserve(Reservation(
            terms=DatasetTerms("visits", 3.0, 1e-5, "rdp", "add_remove"), planned=event, steps=1,
            fingerprint="f" * 64, run_name="night 9", rows=RowsRead(layout=new_layout, ids_legacy_layout=old_layout),
            window=WindowRead(view.block_terms(), row_blocks=view.seen_rows, person_blocks=view.seen_persons),
            block_terms=False))

    spec_path = tmp_path / "visits.yaml"
    spec_path.write_text(yaml.safe_dump(spec_dict(tmp_path)))
    # the export of days 6-9 lacks the persons of days 0-5: refused, nothing changed
    assert cli.main(["budget", "migrate-ids", "visits", "--spec", str(spec_path), "--ledger", spec.budget.ledger]) == 2
    assert "not in this data" in capsys.readouterr().err
    write(tmp_path / "visits.csv", daily(range(0, 10)) + [(7, "0065", 65), (8, "A-7", 999)])
    assert cli.main(["budget", "migrate-ids", "visits", "--spec", str(spec_path), "--ledger", spec.budget.ledger]) == 0
    assert "120 persons" in capsys.readouterr().out
    view, table, chosen = selected(spec, 9)
    assert "0065" not in set(table.persons[chosen])  # still day 3's
    assert cli.main(["budget", "migrate-ids", "visits", "--spec", str(spec_path), "--ledger", spec.budget.ledger]) == 0
    assert "nothing to migrate" in capsys.readouterr().out


def test_a_block_over_its_declared_persons_is_said_to_the_datas_holder_only(tmp_path, capsys):
    """25 persons first arrive on day 2, 20 are declared: calibrate says so on stderr, with what it does to the
    batches; its stdout (the plan) and every block at or under its bound say nothing."""
    write(tmp_path / "visits.csv", daily(range(0, 2)) + [(2, f"x{j}", 100 + j) for j in range(25)])
    (tmp_path / "visits.yaml").write_text(yaml.safe_dump(spec_dict(tmp_path)))
    assert cli.main(["calibrate", str(tmp_path / "visits.yaml")]) == 0
    out, err = capsys.readouterr()
    (line,) = [e for e in err.splitlines() if e.startswith("note: data.blocks")]
    assert line.startswith("note: data.blocks.declared_persons: block 2026-11-03 of the file holds 25 persons, more "
                           "than the 20 declared: a step samples each at the declared rate, so its batches there are "
                           "about 1.2x sampling.expected_batch_size")
    assert "of the file holds" not in out

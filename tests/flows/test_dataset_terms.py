"""A dataset's terms are fixed when it is registered, and the ledger's row checks look across its datasets
(issue 49): dropping the window or the person column, or another period, declared size or accountant, is
refused before any row is read and again inside the reservation; a split that makes another dataset's
private rows public is refused; persons are matched on their keyed id across datasets; a window that shares
no row with earlier ones runs; and on PostgreSQL two first runs on the same people cannot race past the
checks. Most tests drive ``PrivacyLedger.reserve`` with synthetic fingerprints; one runs two nights of a
stream end to end."""
import copy
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import dp_accounting
import pytest
import yaml

import specs
from flows.ledger import (WHOLE, BlockTerms, DatasetTerms, PrivacyLedger, Reservation, RowsRead, WindowRead, RowsExposed, RowsLaundered,
                          RowsUnrecognised)
from tests.conftest import EXAMPLES
from tests.flows.conftest import as_postgres

DELTA = 1e-5
FIXED = (r"a dataset's terms are fixed when it is registered: keep them \(its rows under another "
         r"budget.dataset are refused: a new dataset is for other people's rows\)$")
WEEK = [f"2026-09-0{d}" for d in range(1, 8)]  # the first window of the shipped stream example


def run_event(sigma=2.0):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(sigma)), 20)


def rows(prefix, n):
    """``n`` synthetic keyed fingerprints, distinct for each prefix."""
    return [f"{prefix}:{i}".encode().hex().ljust(64, "0")[:64] for i in range(n)]


def reserve(ledger, terms=None, *, dataset=None, blocks=None, private=(), exposed=(), row_blocks=None,
            person_blocks=None, lifetime=4.0, accountant="rdp"):
    """A reservation as a run of ``terms`` makes it (None: a caller that gives no terms)."""
    given = terms if terms is not None else DatasetTerms(dataset, lifetime, DELTA, accountant, "add_remove")
    window = None if blocks is None and row_blocks is None and person_blocks is None else WindowRead(
        None if blocks is None else [BlockTerms(b, given.lifetime_epsilon, DELTA, terms.declared if terms else 100)
                                     for b in blocks], row_blocks=row_blocks, person_blocks=person_blocks)
    return ledger.reserve(Reservation(
        terms=given, fingerprint="f" * 64, run_name="r", planned=run_event(), steps=20,
        rows=RowsRead(private=private, exposed=exposed), window=window, block_terms=terms is not None))


def stream(tmp_path):
    """specs/examples/digits_stream.yaml (person level, a window of 7 days) on a ledger of its own, its data a
    file that does not exist: a run refused on its terms reads no row."""
    raw = yaml.safe_load((EXAMPLES / "digits_stream.yaml").read_text())
    raw["data"]["source"]["path"] = str(tmp_path / "absent.csv")
    raw["budget"]["ledger"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    return raw


def refused_before_any_row(raw, line):
    from flows.private_train import _private_train

    with pytest.raises(ValueError, match=line):
        _private_train(None, copy.deepcopy(raw), False, None)


def test_dropping_the_window_does_not_give_the_rows_a_second_lifetime(tmp_path):
    """Item 2: the stream spec without data.blocks and budget.window, on the same dataset and ledger, was
    charged to a new block `all` beside the day blocks, each with a lifetime of its own. Refused now in one
    line, before any row is read and inside the reservation (also for a caller that gives no terms),
    writing nothing; the converse (blocks for a dataset registered without them) too."""
    raw = stream(tmp_path)
    terms = DatasetTerms.of(specs.spec_from_dict(raw))
    ledger = PrivacyLedger(raw["budget"]["ledger"])
    ledger.register(terms)  # as its first run, or privzo budget init --spec, registers it
    flat = copy.deepcopy(raw)
    del flat["data"]["blocks"], flat["budget"]["window"]
    flat["data"]["declared_private_rows"] = 1000
    line = (r"^data.blocks: dataset 'digits-stream' is registered with blocks of a day \(each with a lifetime of "
            rf"its own\), the spec has none; {FIXED}")
    refused_before_any_row(flat, line)
    reserve(ledger, terms, blocks=WEEK)
    with pytest.raises(ValueError, match=line):
        reserve(ledger, dataset="digits-stream")  # a caller that gives no terms
    with pytest.raises(ValueError, match=line):
        reserve(ledger, DatasetTerms.of(specs.spec_from_dict(flat)))
    assert WHOLE not in {b.block for b in ledger.blocks("digits-stream")} and len(ledger.history("digits-stream")) == 1

    flat["budget"]["dataset"] = "digits-flat"
    flat_terms = DatasetTerms.of(specs.spec_from_dict(flat))
    reserve(ledger, flat_terms)
    with pytest.raises(ValueError, match=r"^data.blocks: dataset 'digits-flat' is registered without blocks \(one "
                                         rf"lifetime for all its rows\), the spec has data.blocks; {FIXED}"):
        reserve(ledger, dataclasses.replace(terms, dataset="digits-flat"), blocks=WEEK)
    assert [b.block for b in ledger.blocks("digits-flat")] == [WHOLE]


def test_the_person_column_and_every_other_term_are_fixed_when_the_dataset_is_registered(tmp_path):
    """Item 3: the person-level dataset re-run without data.blocks.person was admitted (its persons' later
    rows then fell in later blocks, with fresh budget). Each term (person column, period, declared size,
    accountant) is refused in one line naming the registered one, before any row is read and inside the
    reservation, writing nothing."""
    raw = stream(tmp_path)
    terms = DatasetTerms.of(specs.spec_from_dict(raw))
    ledger = PrivacyLedger(raw["budget"]["ledger"])
    ledger.register(terms)
    event_level = copy.deepcopy(raw)
    event_level["data"]["blocks"] = {"arrival": "arrived", "period": "day", "declared_private_rows": 25}
    line = (r"^data.blocks.person: dataset 'digits-stream' is registered person level \(column 'patient'\), the "
            rf"spec has none; {FIXED}")
    refused_before_any_row(event_level, line)
    assert (terms.period, terms.person, terms.declared) == ("day", "patient", 13)
    reserve(ledger, terms, blocks=WEEK, person_blocks={k: "2026-09-01" for k in rows("person", 3)})
    with pytest.raises(ValueError, match=line):
        reserve(ledger, DatasetTerms.of(specs.spec_from_dict(event_level)), blocks=["2026-09-08"])
    changed = {
        "period": (dict(period="week"), r"^data.blocks.period: dataset 'digits-stream' is registered with blocks "
                                        rf"of a day, the spec says week; {FIXED}"),
        "person": (dict(person="pid"), r"^data.blocks.person: dataset 'digits-stream' is registered person level "
                                       rf"\(column 'patient'\), the spec says 'pid'; {FIXED}"),
        "declared": (dict(declared=20), r"^data.blocks.declared_persons: dataset 'digits-stream' is registered "
                                        rf"with 13 persons a block, the spec says 20; {FIXED}"),
        "accountant": (dict(accountant="zcdp"), r"^privacy.accountant: dataset 'digits-stream' is accounted with "
                                                rf"rdp, the spec says zcdp; {FIXED}"),
    }
    for change, line in changed.values():
        other = dataclasses.replace(terms, **change)
        with pytest.raises(ValueError, match=line):
            ledger.check_registration(other)
        with pytest.raises(ValueError, match=line):
            reserve(ledger, other, blocks=["2026-09-08"])
    ledger.check_registration(terms)
    assert len(ledger.history("digits-stream")) == 1 and "2026-09-08" not in {b.block for b in ledger.blocks("digits-stream")}


def test_a_ledger_from_before_the_terms_is_migrated_and_its_datasets_adopt_their_next_runs_terms_once(tmp_path):
    """A SQLite ledger without the terms' columns gains them on open; a dataset registered then takes the
    terms of its next run, provided they agree with what the ledger holds (its blocks, their declared size,
    its persons), and from then on they are fixed."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'l.db'}"
    ledger = PrivacyLedger(url)
    reserve(ledger, dataset="visits", blocks=["2026-09-01"], person_blocks={k: "2026-09-01" for k in rows("p", 3)},
            lifetime=4.0)
    with ledger.engine.begin() as conn:  # as an earlier privzo made it
        conn.execute(text("DROP INDEX privzo_private_rows_row"))
        conn.execute(text("DROP INDEX privzo_row_blocks_key"))
        for column in ("blocks", "person", "declared"):
            conn.execute(text(f"ALTER TABLE privzo_datasets DROP COLUMN {column}"))
    ledger.engine.dispose()
    ledger = PrivacyLedger(url)
    assert ledger.dataset("visits").blocks is None
    terms = DatasetTerms("visits", 4.0, DELTA, "rdp", "add_remove", "day", "patient", 100)
    for other, line in [
        (dataclasses.replace(terms, person=None), r"^data.blocks.person: dataset 'visits' has persons recorded in "
                                                  r"the ledger \(person level\), the spec has none"),
        (dataclasses.replace(terms, period=None, person=None, declared=None),
         r"^data.blocks: dataset 'visits' has blocks in the ledger \(2026-09-01 ...\), each with a lifetime of its "
         r"own, the spec has none"),
        (dataclasses.replace(terms, period="week"), r"^data.blocks.period: dataset 'visits' has block '2026-09-01' "
                                                    r"in the ledger, which is not a week"),
        (dataclasses.replace(terms, declared=13), r"^data.blocks.declared_persons: dataset 'visits' has blocks "
                                                  r"declared with 100 persons in the ledger, the spec says 13"),
    ]:
        with pytest.raises(ValueError, match=line):
            reserve(ledger, other, blocks=None if other.period is None else ["2026-09-02"])
    assert ledger.dataset("visits").blocks is None and len(ledger.history("visits")) == 1
    reserve(ledger, terms, blocks=["2026-09-02"])
    registered = ledger.dataset("visits")
    assert (registered.blocks, registered.person, registered.declared) == ("day", "patient", 100)
    with pytest.raises(ValueError, match=r"^data.blocks.person: dataset 'visits' is registered person level"):
        reserve(ledger, dataclasses.replace(terms, person="visitor"), blocks=["2026-09-03"])
    with ledger.engine.connect() as conn:
        indexes = set(conn.execute(text("SELECT name FROM sqlite_master WHERE type = 'index'")).scalars())
    assert {"privzo_private_rows_row", "privzo_row_blocks_key"} <= indexes


def test_a_split_that_makes_another_datasets_private_rows_public_is_refused(tmp_path):
    """Item 4: a new dataset whose split (kind column, say) marks another dataset's private rows public would
    use them without noise; the exposure check looked at the run's own dataset only. Refused now in one line
    naming the other dataset, writing nothing; rows no dataset keeps private stay usable."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    clinic = rows("clinic", 1200)  # more than one statement's worth of parameters
    reserve(ledger, dataset="clinic", private=clinic[:1000], exposed=clinic[1000:])
    with pytest.raises(RowsExposed, match=r"^data.split: 700 public or test rows of this run are private rows of "
                                          r"dataset 'clinic' in this ledger and cannot be used without noise under "
                                          r"'clinic-public'; leave them out"):
        reserve(ledger, dataset="clinic-public", private=rows("new", 10), exposed=clinic[300:1200])
    assert ledger.datasets() == ["clinic"]
    reserve(ledger, dataset="clinic-public", private=rows("new", 10), exposed=clinic[1000:])


def test_the_same_persons_under_a_new_dataset_name_are_refused_however_their_rows_are_written(tmp_path):
    """Item 5: the same file with a constant column added, or its features divided by 16, under a new
    dataset name, has rows of other fingerprints and was admitted. With a person column the persons are
    matched on their keyed id instead: a new dataset with any of another's persons is refused, naming it;
    new persons are not."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    persons = rows("patient", 40)
    reserve(ledger, dataset="visits", blocks=["2026-09-01"], private=rows("row", 80),
            person_blocks={p: "2026-09-01" for p in persons})
    with pytest.raises(RowsLaundered, match=r"^budget.dataset: 30 persons of this run \(data.blocks.person\) are "
                                            r"persons of dataset 'visits' in this ledger; the same people cannot have "
                                            r"a second budget under 'visits-rescaled': charge them to 'visits'$"):
        reserve(ledger, dataset="visits-rescaled", blocks=["2026-09-01"], private=rows("rescaled", 80),
                person_blocks={p: "2026-09-01" for p in persons[10:] + rows("newcomer", 5)})
    assert ledger.datasets() == ["visits"]
    reserve(ledger, dataset="visits-rescaled", blocks=["2026-09-01"], private=rows("rescaled", 80),
            person_blocks={p: "2026-09-01" for p in rows("newcomer", 5)})


def test_a_window_that_shares_no_rows_with_earlier_ones_runs(tmp_path):
    """Item 6: a window of new blocks (the next night's with a window of 1, or after a gap of W nights) shares
    no row with earlier windows and was refused as re-encoded. It runs now; a block whose recorded rows the
    run holds none of (nor any of their persons) is still refused as re-encoded."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    day = {d: rows(d, 20) for d in ("2026-11-01", "2026-11-02", "2026-11-05", "2026-11-06")}

    def night(window, file_days, extra=None):  # the file holds ``file_days``' rows, the run's private are its window's
        seen = {r: d for d in file_days for r in day[d]}
        return reserve(ledger, dataset="visits", blocks=[window], private=day[window][:16],
                       exposed=day[window][16:], row_blocks={**seen, **(extra or {})})

    night("2026-11-01", ["2026-11-01"])
    night("2026-11-02", ["2026-11-01", "2026-11-02"])  # disjoint from night 1's window
    night("2026-11-05", ["2026-11-05"])  # after a gap, from a folder holding the new day's file only
    with pytest.raises(RowsUnrecognised, match=r"^data.source: none of this run's rows in block '2026-11-02' matches "
                                               r"the 20 rows earlier runs on dataset 'visits' recorded in it"):
        night("2026-11-06", ["2026-11-06"], extra={r: "2026-11-02" for r in rows("re-encoded", 20)})
    assert len(ledger.history("visits")) == 3
    # person level: a recorded person's new row in their first block is theirs, not a re-encoded one
    first = rows("first", 4)
    reserve(ledger, dataset="patients", blocks=["2026-11-01"], private=first,
            row_blocks={r: "2026-11-01" for r in first}, person_blocks={"a" * 64: "2026-11-01"})
    reserve(ledger, dataset="patients", blocks=["2026-11-01"], private=rows("second visit", 1),
            row_blocks={r: "2026-11-01" for r in rows("second visit", 1)}, person_blocks={"a" * 64: "2026-11-01"})


def test_nights_on_disjoint_windows_run_and_a_run_without_the_window_is_refused(prefect_server, tmp_path, mlflow_db,
                                                                               monkeypatch):
    """End to end on a growing file (window of 1 day): night 2 reads only day 2's rows, none of which an
    earlier run kept private, and runs (it was refused as re-encoded); the same spec without its window is
    then refused before any row is read."""
    from flows.private_train import _private_train, private_train
    from tests.flows.test_blocks import night, stream_spec, write_stream

    monkeypatch.chdir(tmp_path)
    d = stream_spec(tmp_path, window=1)
    d["tracking"]["uri"] = mlflow_db
    for day in (1, 2):
        write_stream(tmp_path / "visits.csv", days=day + 1)
        private_train(spec=copy.deepcopy(d), as_of=night(day).isoformat())
    ledger = PrivacyLedger(d["budget"]["ledger"])
    assert [b.block for b in ledger.blocks("visits")] == ["2026-11-01", "2026-11-02"]
    assert [c.status for c in ledger.history("visits")] == ["committed", "committed"]
    flat = copy.deepcopy(d)
    del flat["data"]["blocks"], flat["budget"]["window"]
    flat["data"]["declared_private_rows"] = 1000
    with pytest.raises(ValueError, match=r"^data.blocks: dataset 'visits' is registered with blocks of a day"):
        _private_train(None, flat, False, None)
    assert len(ledger.history("visits")) == 2


@pytest.mark.e2e
def test_first_runs_of_new_names_on_the_same_people_cannot_race_past_the_checks(postgres_url):
    """Item 7: on PostgreSQL each dataset took its own lock only, so first runs of several names on the same
    rows, at once, were all admitted (none saw the others' uncommitted rows). A ledger-wide lock around the
    checks across datasets admits exactly one; likewise for the same persons with rows written another way."""
    PrivacyLedger(postgres_url)  # the tables, once

    def race(name, private, persons=lambda i: None, n=8):
        ledgers = [PrivacyLedger(postgres_url) for _ in range(n)]
        start = threading.Barrier(n)

        def attempt(i):
            start.wait()
            try:
                return reserve(ledgers[i], dataset=f"{name}-{i}", private=private(i), blocks=["2026-11-01"],
                               person_blocks=persons(i))
            except RowsLaundered:
                return None
            finally:
                ledgers[i].engine.dispose()

        with ThreadPoolExecutor(max_workers=n) as pool:
            return [r for r in pool.map(attempt, range(n)) if r is not None]

    same = rows("same", 3000)
    assert len(race("rows", lambda i: same)) == 1
    persons = {p: "2026-11-01" for p in rows("person", 500)}
    assert len(race("persons", lambda i: rows(f"written-{i}", 3000), lambda i: persons)) == 1


@pytest.mark.e2e
def test_on_postgresql_only_the_owner_fixes_a_legacy_datasets_terms(postgres_url, tmp_path):
    """A PostgreSQL ledger from before the terms: a worker reads it but cannot spend until its owner has
    opened it (which adds the columns); a dataset registered before the terms is then refused to the worker
    before any row is read until the owner fixes its terms (privzo budget init --spec), which a worker's
    run must then match."""

    import sqlalchemy as sa

    from flows.cli import main
    from flows.ledger import DatasetNotRegistered, LedgerUnavailable, ledger_for_spending

    schema = postgres_url.split("search_path%3D")[1]
    worker = f"worker_{schema}"
    worker_url = postgres_url.replace("privzo:privzo@", f"{worker}:worker-password@")

    as_postgres(f"CREATE ROLE {worker} LOGIN PASSWORD 'worker-password'")
    try:
        owner = PrivacyLedger(postgres_url)
        owner.grant(worker)
        reserve(owner, dataset="legacy", blocks=["2026-11-01"], lifetime=4.0)
        with owner.engine.begin() as conn:  # as an earlier privzo left it
            for column in ("blocks", "person", "declared"):
                conn.execute(sa.text(f"ALTER TABLE privzo_datasets DROP COLUMN {column}"))
        owner.engine.dispose()
        terms = DatasetTerms("legacy", 4.0, DELTA, "rdp", "add_remove", "day", None, 100)
        assert PrivacyLedger(worker_url).blocks("legacy")[0].block == "2026-11-01"  # reading still works
        with pytest.raises(LedgerUnavailable, match=r"its tables predate the dataset terms and reservation leases it "
                                                    r"keeps; its owner adds them by opening it once"):
            ledger_for_spending(worker_url, terms)
        PrivacyLedger(postgres_url).engine.dispose()  # the owner's open migrates
        with pytest.raises(DatasetNotRegistered, match=r"^budget.dataset: 'legacy' has no block terms yet \(it was "
                                                       r"registered before they were kept\) in the ledger .* "
                                                       r"privzo budget init legacy --spec SPEC"):
            ledger_for_spending(worker_url, terms)
        raw = stream(tmp_path)
        raw["budget"].update(dataset="legacy", ledger=postgres_url)
        raw["data"]["blocks"] = {"arrival": "arrived", "period": "day", "declared_private_rows": 100}
        (tmp_path / "legacy.yaml").write_text(yaml.safe_dump(raw))
        assert main(["budget", "init", "legacy", "--spec", str(tmp_path / "legacy.yaml"), "--ledger",
                     postgres_url]) == 0
        ledger = ledger_for_spending(worker_url, terms)
        reserve(ledger, terms, blocks=["2026-11-02"])
        with pytest.raises(ValueError, match=r"^data.blocks.declared_private_rows: dataset 'legacy' is registered "
                                             r"with 100 rows a block, the spec says 50"):
            ledger_for_spending(worker_url, dataclasses.replace(terms, declared=50))
        ledger.engine.dispose()
    finally:
        as_postgres(f"DROP OWNED BY {worker}", f"DROP ROLE {worker}")


def test_validate_says_what_the_ledger_cannot_tell_without_an_identifier(capsys):
    """Without an identifier the ledger matches people by exact row content only (docs/design.md, Blocks:
    Laundering); `privzo validate` says so for a spec with a budget, and not for one with a person column."""
    from flows.cli import main

    assert main(["validate", str(EXAMPLES / "digits_retrain.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: ") and out[1].startswith(
        "note: budget.dataset 'sklearn-digits' has no identifier (data.blocks.person or data.source.row_id), so the "
        "ledger tells its people from other datasets' by exact row content only")
    assert main(["validate", str(EXAMPLES / "digits_stream.yaml")]) == 0
    assert "note:" not in capsys.readouterr().out


def test_a_declared_row_id_matches_rows_however_they_are_written(tmp_path):
    """Item 5 without a person column: with data.source.row_id a row's identity is its identifier, so the same
    file with a constant column added and its features divided by 16, under a new dataset name, is refused
    as laundered; without row_id it is a new set of rows to the ledger (what the docs and validate say)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    from components.data.sources import load_file
    from flows.record.tracking import keyed_rows

    x, y = load_digits(return_X_y=True)
    frame = pd.DataFrame(x[:60], columns=[f"px{i}" for i in range(64)]).assign(digit=y[:60],
                                                                              record=[f"r{i}" for i in range(60)])
    frame.to_csv(tmp_path / "visits.csv", index=False)
    features = [f"px{i}" for i in range(64)]
    recoded = frame.assign(**{c: frame[c] / 16 for c in features}, site=7)
    recoded.to_csv(tmp_path / "recoded.csv", index=False)

    def keys(file, **settings):
        table = load_file(tmp_path / file, file_format="csv", label="digit", classes=list(range(10)), **settings)
        return keyed_rows(table.row_fingerprints())

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    reserve(ledger, dataset="visits", private=keys("visits.csv", row_id="record"))
    with pytest.raises(RowsLaundered, match=r"^budget.dataset: 60 private rows of this run are private rows of "
                                            r"dataset 'visits' in this ledger"):
        reserve(ledger, dataset="visits-rescaled", private=keys("recoded.csv", row_id="record"))
    assert not set(keys("visits.csv", features=features)) & set(keys("recoded.csv", features=features))  # content: not caught
    frame.assign(record="r0").to_csv(tmp_path / "repeated.csv", index=False)
    with pytest.raises(ValueError, match=r"^data.source.row_id: column 'record' repeats identifiers \(59 rows share "
                                         r"one with an earlier row\); each row needs its own, or leave row_id out$"):
        keys("repeated.csv", row_id="record")

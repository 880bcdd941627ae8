"""Privacy ledger: exact composition, atomic reservations, commit of executed steps."""
from concurrent.futures import ThreadPoolExecutor

import dp_accounting
import pytest
from dp_accounting import rdp

from flows.ledger import (ABORTED, COMMITTED, RESERVED, BudgetExceeded, DatasetTerms, PrivacyLedger, Reservation,
                          RowsExposed, RowsRead, WindowRead)
from tests.flows.conftest import as_postgres

DELTA = 1e-5


def run_event(steps=200, sigma=1.2, rate=0.05):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)


def composed_eps(events):
    return rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(DELTA)


def _reserve(ledger, lifetime, event=None, dataset="patients", private=(), exposed=()):
    return ledger.reserve(Reservation(
        terms=DatasetTerms(dataset, lifetime, DELTA, "rdp", "add_remove"), planned=event or run_event(), steps=200,
        fingerprint="f" * 64, run_name="r", rows=RowsRead(private=private, exposed=exposed), block_terms=False))


def test_a_row_once_private_is_never_public_or_test_again(tmp_path):
    """A seed or split change between runs (or new rows that move the split) would hand earlier private
    rows to the public or test split, used without noise: refused, writing nothing."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    rows = [f"{i:064x}" for i in range(6)]
    _reserve(ledger, 100.0, private=rows[:3], exposed=rows[3:])
    spent = ledger.spent("patients")
    with pytest.raises(RowsExposed, match=r"^data.split: 2 public or test rows of this run were private in earlier "
                                          r"runs on dataset 'patients'"):
        _reserve(ledger, 100.0, private=[rows[0], rows[3]], exposed=[rows[1], rows[2], rows[4]])
    assert len(ledger.history("patients")) == 1 and ledger.spent("patients") == spent
    # the same split again, with new rows on both sides, and earlier public rows now private: allowed
    _reserve(ledger, 100.0, private=rows[:4] + ["a" * 64], exposed=[rows[5], "b" * 64])
    with pytest.raises(RowsExposed, match="1 public or test rows"):  # rows[3] and 'a...' are recorded now
        _reserve(ledger, 100.0, private=rows[:3], exposed=["a" * 64])
    # another dataset's private rows are private in this ledger whatever the dataset: refused (test_dataset_terms.py)
    with pytest.raises(RowsExposed, match=r"^data.split: 4 public or test rows of this run are private rows of "
                                          r"dataset 'patients' in this ledger"):
        _reserve(ledger, 100.0, dataset="other", exposed=rows)
    _reserve(ledger, 100.0, dataset="other", exposed=[rows[5], "b" * 64])  # public in 'patients' too: allowed


def test_total_is_the_exact_composition_not_a_sum(tmp_path):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    a, b = run_event(200), run_event(300, sigma=1.5)
    ca = _reserve(ledger, 100.0, a)
    cb = _reserve(ledger, 100.0, b)
    ledger.commit(ca, a, 200)
    ledger.commit(cb, run_event(120, sigma=1.5), 120)  # crashed after 120 of 300 steps
    expected = composed_eps([a, run_event(120, sigma=1.5)])
    assert ledger.spent("patients") == pytest.approx(expected, rel=1e-12)
    assert ledger.spent("patients") < composed_eps([a]) + composed_eps([run_event(120, sigma=1.5)])
    assert [c.status for c in ledger.history("patients")] == [COMMITTED, COMMITTED]


def test_refusal_names_what_still_fits_and_writes_nothing(tmp_path):
    """The refusal says what the run would compose to, the largest epsilon a run of its shape can still have
    (a run with that epsilon is admitted; a little more is not), and that new rows bring no budget to a
    dataset charged as one block."""
    from components.accountants.composed import scaled_noise

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    one, two = composed_eps([run_event()]), composed_eps([run_event(), run_event()])
    lifetime = (one + two) / 2  # admits one run, not two (composition is sub-additive: two < 2 * one)
    _reserve(ledger, lifetime)
    with pytest.raises(BudgetExceeded) as info:
        _reserve(ledger, lifetime)
    refusal = info.value
    assert str(refusal) == (
        f"budget.lifetime_epsilon: dataset 'patients' cannot take this run of epsilon {one:.4g}: composed with the 1 "
        f"charge before it, it would reach {two:.4g} of the lifetime {lifetime:.4g}; a run of epsilon <= "
        f"{refusal.fits:.4g} still fits (lower privacy.epsilon); new rows bring no budget to a dataset charged as one "
        "block (data.blocks with budget.window gives each period's rows a budget of their own)")
    assert refusal.requested == pytest.approx(one) and refusal.would_reach == pytest.approx(two, rel=1e-12)
    assert len(ledger.history("patients")) == 1
    assert 0 < refusal.fits < one

    def noise_for(epsilon):  # the run's shape, its noise raised until it costs ``epsilon`` alone
        low, high = 1.0, 100.0
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if composed_eps([scaled_noise(run_event(), middle)]) > epsilon else (low, middle)
        return high

    with pytest.raises(BudgetExceeded):
        _reserve(ledger, lifetime, scaled_noise(run_event(), noise_for(refusal.fits * 1.01)))
    _reserve(ledger, lifetime, scaled_noise(run_event(), noise_for(refusal.fits)))


def test_abort_releases_a_reservation(tmp_path):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    one = composed_eps([run_event()])
    charge = _reserve(ledger, one * 1.2)
    ledger.abort(charge)
    assert ledger.history("patients")[0].status == ABORTED
    _reserve(ledger, one * 1.2)  # fits again
    assert ledger.history("patients")[1].status == RESERVED


def test_lifetime_must_match_the_registered_dataset(tmp_path):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    _reserve(ledger, 10.0)
    with pytest.raises(ValueError, match="registered with 10"):
        _reserve(ledger, 20.0)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e),
                                     pytest.param("postgresql-repeatable-read", marks=pytest.mark.e2e)])
def test_concurrent_runs_never_overspend(tmp_path, request, backend):
    """12 runs at once on a dataset whose budget admits 5: exactly 5 reserve, 7 are refused; also (after a
    first run) on a
    PostgreSQL whose default isolation is REPEATABLE READ, where a reservation that waited for the lock
    would otherwise read the total from before the run it waited for. On PostgreSQL the 12 engines are the
    ledger's first use: they create its tables at once. (12, not more: on SQLite each waits its turn for the
    write lock within a 60 s busy timeout, which a loaded 2-core machine running 20 had exceeded.)"""
    events = [run_event() for _ in range(6)]
    lifetime = (composed_eps(events[:5]) + composed_eps(events[:6])) / 2
    url = f"sqlite:///{tmp_path / 'l.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    if backend == "postgresql-repeatable-read":
        import uuid

        import sqlalchemy as sa

        schema = f"t{uuid.uuid4().hex[:12]}"
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
        engine.dispose()
        url = (url.split("?")[0] + f"?options=-csearch_path%3D{schema}"
               "%20-cdefault_transaction_isolation%3Drepeatable%5C%20read")
    if backend == "postgresql-repeatable-read":  # the dataset exists: the racing runs only read its total
        first = PrivacyLedger(url)
        _reserve(first, lifetime)
        first.engine.dispose()
    elif backend == "sqlite":  # on PostgreSQL the 12 engines below create the tables at once
        PrivacyLedger(url)

    def attempt(_):
        ledger = PrivacyLedger(url)  # a process of its own would open its own engine too
        try:
            return _reserve(ledger, lifetime)
        except BudgetExceeded:
            return None
        finally:
            ledger.engine.dispose()

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(attempt, range(12)))
    admitted = [r for r in results if r is not None]
    assert len(admitted) == (4 if backend == "postgresql-repeatable-read" else 5)
    ledger = PrivacyLedger(url)
    for charge in admitted:
        ledger.commit(charge, run_event(), 200)
    assert ledger.spent("patients") <= lifetime



def test_rows_fingerprinted_another_way_are_not_matched(tmp_path):
    """Fingerprints match rows across runs only if computed from the same columns; a run that computes
    them otherwise (a column added, another tokenizer) is refused, writing nothing."""
    from flows.ledger import RowsUnmatched

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    reserve = lambda layout: ledger.reserve(Reservation(
        terms=DatasetTerms("patients", 100.0, DELTA, "rdp", "add_remove"), planned=run_event(), steps=200,
        fingerprint="f" * 64, run_name="r", rows=RowsRead(private=["a" * 64], layout=layout), block_terms=False))
    reserve("file:label=y;features=a,b")
    reserve("file:label=y;features=a,b")
    with pytest.raises(RowsUnmatched, match=r"^data.source: this run identifies rows differently from earlier runs "
                                           r"on dataset 'patients' \(feature 'c' added\)"):
        reserve("file:label=y;features=a,b,c")
    with pytest.raises(RowsUnmatched, match=r"\(label 'y' before, 'z' now\)"):
        reserve("file:label=z;features=a,b")
    with pytest.raises(RowsUnmatched, match=r"\(source 'file' before, 'sklearn' now\)"):
        reserve("sklearn:digits")
    assert len(ledger.history("patients")) == 2


def test_runs_a_datasets_accountant_cannot_account_for_are_refused_in_one_line(tmp_path):
    """A dataset is accounted with the accountant of its first run. Under replace_one, a full-batch run
    with pld opens it; a later fixed-size run (sampling without replacement, which only RDP accounts for)
    is refused before anything is written, with what to do, never composed optimistically."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")

    def reserve(event, accountant):
        return ledger.reserve(Reservation(
            terms=DatasetTerms("patients", 50.0, DELTA, accountant, "replace_one"), planned=event, steps=100,
            fingerprint="f" * 64, run_name="r", block_terms=False))

    full = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(20.0), 100)
    fixed = dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(1000, 64, dp_accounting.GaussianDpEvent(3.0)), 100)
    reserve(full, "pld")
    spent = ledger.spent("patients")
    with pytest.raises(ValueError, match=r"^privacy.accountant: dataset 'patients' is accounted with pld \(set by its "
                                         r"first run\), which has no accounting for this run's "
                                         r"SampledWithoutReplacementDpEvent of GaussianDpEvent; use a sampling"):
        reserve(fixed, "pld")
    with pytest.raises(ValueError, match=r"^privacy.accountant: dataset 'patients' is accounted with pld, the spec "
                                         r"says rdp; a dataset's terms are fixed when it is registered"):
        reserve(fixed, "rdp")  # nor is its accountant another for this run
    assert len(ledger.history("patients")) == 1 and ledger.spent("patients") == spent
    reserve(full, "pld")  # what it accounts for still composes
    assert ledger.spent("patients") > spent


def test_rows_that_all_look_new_are_refused_as_re_encoded(tmp_path):
    """Writing the labels another way (codes before, names now) keeps the layout but gives every row a new
    fingerprint: without a check the ledger would take them for new people and a re-encoded private row
    could become public. A run none of whose rows was seen is refused, writing nothing; a run that keeps
    some of the earlier rows (data that grew or shrank) is not."""
    from components.data import load_file
    from flows.ledger import RowsUnrecognised
    from tests.conftest import write_digits_file

    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    codes = load_file(write_digits_file(tmp_path / "codes.csv"), file_format="csv", label="digit",
                      classes=list(range(10)))
    named = load_file(write_digits_file(tmp_path / "named.csv", labels_as=dict(enumerate(names))),
                      file_format="csv", label="digit", classes=names)
    assert codes.layout == named.layout and not set(codes.row_fingerprints()) & set(named.row_fingerprints())
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")

    def reserve(rows, exposed=()):
        return ledger.reserve(Reservation(
            terms=DatasetTerms("clinic", 50.0, DELTA, "rdp", "add_remove"), planned=run_event(), steps=200,
            fingerprint="f" * 64, run_name="r", rows=RowsRead(private=rows, exposed=exposed, layout=codes.layout),
            block_terms=False))

    first = codes.row_fingerprints()
    reserve(first[:1000], first[1000:])
    spent = ledger.spent("clinic")
    with pytest.raises(RowsUnrecognised, match=r"^data.source: none of this run's rows matches the 1000 rows earlier "
                                               r"runs on dataset 'clinic' kept private; if they are the same"):
        reserve(named.row_fingerprints()[:1000], named.row_fingerprints()[1000:])
    assert len(ledger.history("clinic")) == 1 and ledger.spent("clinic") == spent
    reserve(first[500:1000] + named.row_fingerprints()[:10], first[1000:])  # grown and shrunk: some rows kept
    assert len(ledger.history("clinic")) == 2


def test_a_ledger_of_plain_row_hashes_is_re_keyed_only_when_every_recorded_row_is_present(tmp_path, monkeypatch):
    """Ledgers written before rows were keyed hold plain hashes under the source's own layout. A run that
    still has every recorded row re-keys them in its reservation, and they keep protecting those rows;
    a run missing any of them is refused and the ledger is left as it was."""
    from sqlalchemy import text

    from flows.ledger import RowsExposed, RowsUnmatched
    from flows.record.tracking import KEYED_ROWS, keyed_rows

    monkeypatch.setenv("PRIVZO_FINGERPRINT_KEY", "team-key")
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    plain = [f"{i:064x}" for i in range(6)]
    keyed = dict(zip(plain, keyed_rows(plain)))

    def reserve(private, exposed, layout, legacy=None):
        return ledger.reserve(Reservation(
            terms=DatasetTerms("patients", 100.0, DELTA, "rdp", "add_remove"), planned=run_event(), steps=200,
            fingerprint="f" * 64, run_name="r",
            rows=RowsRead(private=private, exposed=exposed, layout=layout,
                          legacy_layout="file:label=y" if legacy is not None else None, legacy_rows=legacy),
            block_terms=False))

    def stored():
        with ledger.engine.connect() as conn:
            return set(conn.execute(text("SELECT row FROM privzo_private_rows")).scalars()), conn.execute(
                text("SELECT layout FROM privzo_row_layouts")).scalar()

    reserve(plain[:4], plain[4:], "file:label=y")  # as an earlier privzo wrote it
    now = f"file:label=y;{KEYED_ROWS}"
    with pytest.raises(RowsUnmatched, match=r"^data.source: dataset 'patients'.s ledger holds plain row hashes written "
                                           r"by an earlier privzo, and some of those rows are not in this run's data"):
        reserve([keyed[r] for r in plain[1:4]], [], now, {r: keyed[r] for r in plain[1:]})
    assert stored() == (set(plain[:4]), "file:label=y") and len(ledger.history("patients")) == 1
    reserve([keyed[r] for r in plain[:4]], [keyed[r] for r in plain[4:]], now, keyed)
    assert stored() == ({keyed[r] for r in plain[:4]}, now) and len(ledger.history("patients")) == 2
    with pytest.raises(RowsExposed):  # the re-keyed rows still keep those people private
        reserve([keyed[r] for r in plain[1:]], [keyed[plain[0]]], now, keyed)


def test_a_retried_commit_that_went_through_is_not_an_error(tmp_path):
    """commit-budget is retried; a retry after a commit that landed (the connection dropped afterwards)
    must not fail a finished run, and a second, different commit is still refused."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    charge = _reserve(ledger, 100.0)
    executed = run_event()
    ledger.commit(charge, executed, 120, "run-1")
    ledger.commit(charge, executed, 120, "run-1")
    with pytest.raises(ValueError, match="is not reserved"):
        ledger.commit(charge, executed, 150, "run-1")
    (row,) = ledger.history("patients")
    assert (row.status, row.steps_run) == ("committed", 120)


def test_a_process_opens_a_ledger_once_and_anew_when_its_file_is_gone(tmp_path):
    """PrivacyLedger.open: one ledger per URL in a process (one engine; the tables made and migrated once),
    shared by a run's steps and threads; a file removed since is opened anew, its tables made again; an
    in-memory URL is never shared (each engine is a database of its own)."""
    from concurrent.futures import ThreadPoolExecutor

    url = f"sqlite:///{tmp_path / 'l.db'}"
    with ThreadPoolExecutor(8) as pool:
        opened = set(map(id, pool.map(lambda _: PrivacyLedger.open(url), range(16))))
    first = PrivacyLedger.open(url)
    assert opened == {id(first)}
    _reserve(first, 100.0)
    assert len(PrivacyLedger.open(url).history("patients")) == 1
    (tmp_path / "l.db").unlink()
    again = PrivacyLedger.open(url)
    assert again is not first and again.history("patients") == [] and PrivacyLedger.open(url) is again
    assert PrivacyLedger.open("sqlite://") is not PrivacyLedger.open("sqlite://")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def test_racing_runs_on_overlapping_windows_never_overspend_a_block(tmp_path, request, backend):
    """12 runs at once, each on a window of two of four daily blocks (d1 d2, d2 d3, d3 d4, ...), each block
    admitting two runs: every block ends within its lifetime however the reservations and the commits that
    fold each run into its blocks' stored states interleave, and each block's state is the composition of
    exactly the charges on it."""
    from flows.ledger import BlockTerms

    url = f"sqlite:///{tmp_path / 'l.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    one, two, three = (composed_eps([run_event()] * k) for k in (1, 2, 3))
    lifetime = (two + three) / 2
    windows = [(f"d{i}", f"d{i + 1}") for i in (1, 2, 3)] * 4
    dataset = f"visits-{backend}"
    PrivacyLedger(url)  # the tables, once

    def attempt(window):
        ledger = PrivacyLedger(url)
        try:
            charge = ledger.reserve(Reservation(
                terms=DatasetTerms(dataset, lifetime, DELTA, "rdp", "add_remove"), planned=run_event(), steps=200,
                fingerprint="f" * 64, run_name="r",
                window=WindowRead([BlockTerms(b, lifetime, DELTA, 100) for b in window]), block_terms=False))
            ledger.commit(charge, run_event(), 200)
            return window
        except BudgetExceeded:
            return None
        finally:
            ledger.engine.dispose()

    with ThreadPoolExecutor(max_workers=12) as pool:
        admitted = [w for w in pool.map(attempt, windows) if w is not None]
    ledger = PrivacyLedger(url)
    on = {b.block: b for b in ledger.blocks(dataset)}
    for block, listed in on.items():
        runs = sum(block in w for w in admitted)
        assert runs <= 2 and listed.charges == runs
        assert listed.committed_epsilon == pytest.approx(composed_eps([run_event()] * runs), rel=1e-12)
        assert listed.committed_epsilon <= lifetime
    # d2 d3 twice leaves no room for the others; d1 d2 and d3 d4 twice each fill all four
    assert 2 <= len(admitted) <= 4 and ledger.spent(dataset) <= lifetime


def test_the_same_people_under_a_new_dataset_name_are_refused(tmp_path):
    """Budget laundering: a new budget.dataset whose private rows are another dataset's private rows would
    give the same people a second budget; refused in one line naming the other dataset, writing nothing."""
    from flows.ledger import RowsLaundered

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    rows = [f"{i:064x}" for i in range(1200)]  # more than one statement's worth of parameters
    _reserve(ledger, 100.0, private=rows[:1000], exposed=rows[1000:])
    with pytest.raises(RowsLaundered, match=r"^budget.dataset: 600 private rows of this run are private rows of "
                                            r"dataset 'patients' in this ledger; the same people cannot have a second "
                                            r"budget under 'patients-v2': charge them to 'patients'$"):
        _reserve(ledger, 100.0, dataset="patients-v2", private=rows[400:1200])
    assert ledger.datasets() == ["patients"]
    _reserve(ledger, 100.0, dataset="patients-v2", private=rows[1000:1200])  # new people: a budget of their own


@pytest.mark.e2e
def test_a_caller_the_ledger_does_not_sign_in_is_refused_before_any_row_is_read(postgres_url, tmp_path):
    """Spending budget is a privileged act: with a wrong password, or a role that may only read the ledger
    (a viewer's), a run is refused in one line before its data is even opened (here it does not exist)."""
    from flows.ledger import LedgerUnavailable, ledger_for_spending
    from flows.private_train import _private_train

    ledger_for_spending(postgres_url)  # the owner: its tables made, and it may write them
    schema = postgres_url.split("search_path%3D")[1]
    role = f"viewer_{schema}"

    as_postgres(f"CREATE ROLE {role} LOGIN PASSWORD 'viewer-password'", f"GRANT USAGE ON SCHEMA {schema} TO {role}",
                f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
    try:
        viewer = postgres_url.replace("privzo:privzo@", f"{role}:viewer-password@")
        with pytest.raises(LedgerUnavailable, match=r"^budget.ledger: cannot spend budget through "
                                                    rf"postgresql\+psycopg://{role}:\*\*\*@127.0.0.1:5432/privzo\?.* "
                                                    r"\(this role may not write privzo_blocks\); a run that spends"):
            ledger_for_spending(viewer)
        spec = {"name": "patients", "seed": 0,
                "data": {"source": {"kind": "file", "path": str(tmp_path / "absent.csv"), "label": "y",
                                    "classes": [0, 1]}, "split": {"kind": "hashed", "public": 0.1, "test": 0.2},
                         "declared_private_rows": 100},
                "model": {"kind": "linear"}, "estimator": {"kind": "two_point"},
                "mechanism": {"kind": "gaussian", "clip": 1.0}, "privacy": {"epsilon": 1.0, "delta": 1e-5},
                "sampling": {"kind": "poisson", "expected_batch_size": 10}, "optimizer": {"kind": "sgd", "lr": 0.1, "steps": 5},
                "budget": {"dataset": "patients", "lifetime_epsilon": 2.0,
                           "ledger": postgres_url.replace("privzo:privzo@", "privzo:wrong-password@")}}
        with pytest.raises(LedgerUnavailable, match=r"password authentication failed for user \"privzo\"\); a run"):
            _private_train(None, spec, False, None)
    finally:
        as_postgres(f"DROP OWNED BY {role}", f"DROP ROLE {role}")


@pytest.mark.e2e
def test_only_the_ledgers_owner_registers_a_lifetime_and_a_worker_only_charges_registered_datasets(
        postgres_url, tmp_path, capsys):
    """A dataset's lifetime is the ledger owner's to set (privzo budget init); a worker role (privzo budget
    grant) charges registered datasets, is refused before any row is read on one nobody registered, and can
    neither register, change a lifetime, give a block other terms, nor delete a charge; a viewer reads."""

    import sqlalchemy as sa

    from flows.cli import main
    from flows.ledger import DatasetNotRegistered, DatasetTerms, LedgerUnavailable, ledger_for_spending
    from flows.private_train import _private_train

    schema = postgres_url.split("search_path%3D")[1]
    worker, viewer = f"worker_{schema}", f"viewer_{schema}"

    owner_url = postgres_url
    worker_url = postgres_url.replace("privzo:privzo@", f"{worker}:worker-password@")
    viewer_url = postgres_url.replace("privzo:privzo@", f"{viewer}:viewer-password@")
    as_postgres(f"CREATE ROLE {worker} LOGIN PASSWORD 'worker-password'",
                f"CREATE ROLE {viewer} LOGIN PASSWORD 'viewer-password'")
    try:
        import yaml

        clinic = {"name": "clinic", "seed": 0,
                  "data": {"source": {"kind": "file", "path": str(tmp_path / "absent.csv"), "label": "y",
                                      "classes": [0, 1]}, "split": {"kind": "hashed", "public": 0.1, "test": 0.2},
                           "blocks": {"arrival": "arrived", "period": "day", "declared_private_rows": 10}},
                  "model": {"kind": "linear"}, "estimator": {"kind": "two_point"},
                  "mechanism": {"kind": "gaussian", "clip": 1.0}, "privacy": {"epsilon": 1.0, "delta": DELTA},
                  "sampling": {"kind": "poisson", "expected_batch_size": 10},
                  "optimizer": {"kind": "sgd", "lr": 0.1, "steps": 5},
                  "budget": {"dataset": "clinic", "lifetime_epsilon": 10.0, "window": {"blocks": 1}}}
        (tmp_path / "clinic.yaml").write_text(yaml.safe_dump(clinic))
        assert main(["budget", "init", "clinic", "--spec", str(tmp_path / "clinic.yaml"), "--ledger", owner_url]) == 0
        assert "clinic: registered in" in capsys.readouterr().out
        assert main(["budget", "grant", worker, "--ledger", owner_url]) == 0
        assert main(["budget", "grant", viewer, "--read-only", "--ledger", owner_url]) == 0
        capsys.readouterr()

        # the worker charges the registered dataset, on blocks it adds with the dataset's terms
        terms = DatasetTerms("clinic", 10.0, DELTA, "rdp", "add_remove", "day", None, 10)
        ledger = ledger_for_spending(worker_url, terms)
        from flows.ledger import BlockTerms

        charge = ledger.reserve(Reservation(
            terms=terms, planned=run_event(), steps=200, fingerprint="f" * 64, run_name="night",
            rows=RowsRead(private=["a" * 64]), window=WindowRead([BlockTerms("2026-11-26", 10.0, DELTA, 10)])))
        ledger.commit(charge, run_event(), 200, run_id="r1")
        assert ledger.status(charge) == COMMITTED

        # ... and is refused, before any row is read, on a dataset nobody registered (its file does not exist)
        with pytest.raises(DatasetNotRegistered, match=r"^budget.dataset: 'other' is not registered in the ledger "
                                                       rf"postgresql\+psycopg://{worker}:\*\*\*@.*privzo budget init"):
            ledger_for_spending(worker_url, DatasetTerms("other", 3.0, DELTA, "rdp", "add_remove"))
        spec = {"name": "other", "seed": 0,
                "data": {"source": {"kind": "file", "path": str(tmp_path / "absent.csv"), "label": "y",
                                    "classes": [0, 1]}, "split": {"kind": "hashed", "public": 0.1, "test": 0.2},
                         "declared_private_rows": 100},
                "model": {"kind": "linear"}, "estimator": {"kind": "two_point"},
                "mechanism": {"kind": "gaussian", "clip": 1.0}, "privacy": {"epsilon": 1.0, "delta": DELTA},
                "sampling": {"kind": "poisson", "expected_batch_size": 10},
                "optimizer": {"kind": "sgd", "lr": 0.1, "steps": 5},
                "budget": {"dataset": "other", "lifetime_epsilon": 2.0, "ledger": worker_url}}
        with pytest.raises(DatasetNotRegistered, match="nothing was read or charged$"):
            _private_train(None, spec, False, None)
        assert main(["budget", "init", "other", "--lifetime-epsilon", "9", "--delta", str(DELTA),
                     "--ledger", worker_url]) == 2
        assert "this role may not register datasets" in capsys.readouterr().err
        assert main(["budget", "grant", viewer, "--ledger", worker_url]) == 2
        assert "only the ledger's owner" in capsys.readouterr().err

        # what privzo never asks of a worker, the database refuses it too
        engine = sa.create_engine(worker_url)
        refused = {
            "UPDATE privzo_datasets SET lifetime_epsilon = 100": "permission denied",
            "INSERT INTO privzo_datasets VALUES ('mine', 100, 0.5, 'rdp', 'add_remove')": "permission denied",
            "UPDATE privzo_blocks SET lifetime_epsilon = 100": "permission denied",
            "DELETE FROM privzo_charges": "permission denied",
            "DELETE FROM privzo_private_rows": "permission denied",
            "INSERT INTO privzo_blocks VALUES ('clinic', '2026-11-27', 100, 1e-5, 10, '{}', 0, now())":
                "violates foreign key constraint",
        }
        for statement, reason in refused.items():
            with pytest.raises(sa.exc.DBAPIError, match=reason), engine.begin() as conn:
                conn.execute(sa.text(statement))
        engine.dispose()

        # the viewer reads the budget and may not spend it
        assert main(["budget", "show", "clinic", "--ledger", viewer_url]) == 0
        assert "clinic: epsilon" in capsys.readouterr().out
        with pytest.raises(LedgerUnavailable, match=r"this role may not write privzo_blocks"):
            ledger_for_spending(viewer_url)
    finally:
        as_postgres(f"DROP OWNED BY {worker}", f"DROP ROLE {worker}", f"DROP OWNED BY {viewer}", f"DROP ROLE {viewer}")

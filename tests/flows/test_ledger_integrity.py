"""The ledger's record against a role that may write it (issue 51, item 2): on PostgreSQL the owner's rules
refuse a worker's SQL that privzo never sends (a settled charge changed, a committed charge inserted, a
block's composition moved outside a commit); what they cannot judge, a composition written in a commit's
own transaction, ``privzo budget show --check`` and ``privzo verify``'s recomposition name."""

import dp_accounting
import pytest
import sqlalchemy as sa

from components.accountants import event_to_json
from flows.cli import main
from flows.ledger import (BlockTerms, DatasetTerms, PrivacyLedger, Reservation, WindowRead, ledger_for_spending,
                          ledger_problems)
from tests.flows.conftest import as_postgres

DELTA = 1e-5


def run_event(sigma=2.0, steps=20):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(sigma)), steps)


def reserve(ledger, terms, block):
    return ledger.reserve(Reservation(
        terms=terms, planned=run_event(), steps=20, fingerprint="f" * 64, run_name="night",
        window=WindowRead([BlockTerms(block, terms.lifetime_epsilon, DELTA, 10)])))


def test_budget_show_check_names_a_block_whose_stored_composition_is_not_its_charges(tmp_path, capsys):
    """Emptying a block's stored composition made `budget show` say "epsilon 0 spent" while the history held
    the charge, and later runs were admitted from zero; --check recomposes and names it."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    terms = DatasetTerms("clinic", 10.0, DELTA, "rdp", "add_remove", "day", None, 10)
    ledger = PrivacyLedger(url)
    for block in ("2026-11-26", "2026-11-27"):
        ledger.commit(reserve(ledger, terms, block), run_event(), 20, run_id=f"run-{block}")
    assert main(["budget", "show", "clinic", "--check", "--ledger", url]) == 0
    assert "check: every committed charge of clinic executed its plan" in capsys.readouterr().out
    # a charge committed with no step run and no MLflow run is named, and adds nothing
    unrun = reserve(ledger, terms, "2026-11-27")
    ledger.commit(unrun, dp_accounting.NoOpDpEvent(), 0)
    assert main(["budget", "show", "clinic", "--check", "--ledger", url]) == 0
    assert (f"check: note: charge {unrun} (run 'night') was committed with 0 of its 20 steps run and no MLflow run"
            in capsys.readouterr().out)
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE privzo_blocks SET committed_epsilon = 0 WHERE block = '2026-11-27'"))
        conn.execute(sa.text("UPDATE privzo_charges SET executed_event = :e WHERE run_id = 'run-2026-11-26'"),
                     {"e": event_to_json(run_event(sigma=8.0))})
    assert main(["budget", "show", "clinic", "--check", "--ledger", url]) == 1
    err = capsys.readouterr().err.splitlines()
    # the weakened charge is named, and so is its block, whose stored composition its event no longer makes
    assert len(err) == 3 and err[0].startswith("check: charge ") and "beyond the one it reserved" in err[0]
    assert err[1].startswith("check: block '2026-11-26' of dataset 'clinic' stores epsilon 1.22711 (its stored "
                             "composition: 1.22711), but its 1 committed charge compose to 0.")
    recomposed = ledger.recomposed("clinic")[1][3]
    assert err[2] == (f"check: block '2026-11-27' of dataset 'clinic' stores epsilon 0 (its stored composition: "
                      f"{recomposed:.6g}), but its 2 committed charges compose to {recomposed:.6g}: the ledger's "
                      "record of this block was changed outside privzo")


def test_admission_refuses_a_block_whose_stored_composition_is_not_its_charges(tmp_path):
    """A composition written inside a commit's own transaction (here by hand: an empty state and epsilon 0) was
    read by admission as it stood, so a reservation of the whole lifetime went through; admission now
    recomposes the window's blocks from their committed charges and refuses, naming the block and both."""
    from components.accountants import Accountant
    from components.accountants.composed import ComposedState
    from flows.ledger import BudgetExceeded
    from flows.ledger.errors import BlockRecordChanged

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    terms = DatasetTerms("clinic", 1.5, DELTA, "rdp", "add_remove", "day", None, 10)
    ledger = PrivacyLedger(url)
    ledger.commit(reserve(ledger, terms, "2026-11-26"), run_event(), 20, run_id="run-1")
    with pytest.raises(BudgetExceeded):  # the lifetime has room for one such run, not two
        reserve(ledger, terms, "2026-11-26")
    empty = ComposedState(Accountant("rdp", "add_remove")).to_json()
    with ledger.engine.begin() as conn:
        conn.execute(sa.text("UPDATE privzo_blocks SET committed = :c, committed_epsilon = 0"), {"c": empty})
    with pytest.raises(BlockRecordChanged, match=r"^ledger: block '2026-11-26' of dataset 'clinic' stores epsilon 0, "
                                                  r"but its 1 committed charge compose to 1\.227.*privzo budget show "
                                                  r"clinic --check`$"):
        reserve(ledger, terms, "2026-11-26")
    assert [c.status for c in ledger.history("clinic")] == ["committed"]  # nothing reserved


@pytest.mark.e2e
def test_a_worker_cannot_rewrite_what_the_ledger_recorded(postgres_url):
    """As the worker role, with its own grants: what privzo's own reserve, commit and abort do still goes
    through; rewriting a committed charge, inserting a committed one, changing what a charge reserved, and
    moving a block's composition outside a commit are refused by the database; a composition written inside
    a commit's own transaction is named by the recomposition check."""
    schema = postgres_url.split("search_path%3D")[1]
    worker = f"worker_{schema}"

    as_postgres(f"CREATE ROLE {worker} LOGIN PASSWORD 'worker-password'")
    try:
        owner = PrivacyLedger(postgres_url)
        terms = DatasetTerms("ward", 10.0, DELTA, "rdp", "add_remove", "day", None, 10)
        owner.register(terms)
        owner.grant(worker)
        worker_url = postgres_url.replace("privzo:privzo@", f"{worker}:worker-password@")
        ledger = ledger_for_spending(worker_url, terms)
        first = reserve(ledger, terms, "2026-11-26")
        ledger.commit(first, run_event(), 20, run_id="r1")
        ledger.abort(reserve(ledger, terms, "2026-11-26"))
        open_charge = reserve(ledger, terms, "2026-11-27")

        engine = sa.create_engine(worker_url)
        weaker = event_to_json(run_event(sigma=8.0))
        refused = {
            f"UPDATE privzo_charges SET executed_event = '{weaker}' WHERE id = '{first}'": "a settled charge never changes",
            f"UPDATE privzo_charges SET planned_event = '{weaker}' WHERE id = '{open_charge}'": "permission denied",  # the grants
            f"UPDATE privzo_charges SET status = 'committed', executed_event = '{weaker}', steps_run = 500 "
            f"WHERE id = '{open_charge}'": "at most its 20 planned steps",
            "INSERT INTO privzo_charges VALUES ('x', 'ward', 'f', 'n', NULL, 'committed', '{}', '{}', 20, 20, 1, "
            "now(), now())": "must be inserted reserved",
            "UPDATE privzo_blocks SET committed_epsilon = 0": "only with a charge on it committed in the same",
        }
        for statement, reason in refused.items():
            with pytest.raises(sa.exc.DBAPIError, match=reason), engine.begin() as conn:
                conn.execute(sa.text(statement))
        assert ledger_problems(ledger, "ward") == []

        # in the transaction that commits a charge the rules let its block move: the arithmetic is checked after
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE privzo_charges SET status = 'committed', executed_event = :e, steps_run = 20 "
                                 f"WHERE id = '{open_charge}'"), {"e": event_to_json(run_event())})
            conn.execute(sa.text("UPDATE privzo_blocks SET committed_epsilon = 0 WHERE block = '2026-11-27'"))
        engine.dispose()
        problems = ledger_problems(owner, "ward")
        assert len(problems) == 1 and problems[0].startswith("block '2026-11-27' of dataset 'ward' stores epsilon 0")
    finally:
        as_postgres(f"DROP OWNED BY {worker}", f"DROP ROLE {worker}")

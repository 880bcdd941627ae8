"""The ledger's blocks: each keeps the exact composition of its charges as a stored accountant state, a run is
reserved on every block it reads or on none, a dataset's guarantee is the largest over its blocks, and a
dataset charged before blocks becomes one block with the same total."""
import dp_accounting
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from components.accountants import Accountant
from components.accountants.composed import ComposedState, scaled_noise
from flows.ledger import WHOLE, BlockTerms, BudgetExceeded, DatasetTerms, PrivacyLedger, Reservation, WindowRead

DELTA = 1e-5


def run_event(steps=100, sigma=1.2, rate=0.05):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)


def recomposed(events, kind="rdp"):
    return Accountant(kind, "add_remove").epsilon(dp_accounting.ComposedDpEvent(list(events)), DELTA)


def _reserve(ledger, event, blocks=None, lifetime=100.0, accountant="rdp", dataset="visits"):
    return ledger.reserve(Reservation(
        terms=DatasetTerms(dataset, lifetime, DELTA, accountant, "add_remove"), planned=event, steps=100,
        fingerprint="f" * 64, run_name="r", window=WindowRead(blocks), block_terms=False))


def days(*names, lifetime=100.0):
    return [BlockTerms(n, lifetime, DELTA, 200) for n in names]


@pytest.mark.parametrize("kind", ["rdp", "pld", "zcdp"])
def test_a_stored_state_restores_and_composes_as_the_whole_history_does(kind):
    event = run_event() if kind != "zcdp" else dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(4.0), 30)
    state = ComposedState(Accountant(kind, "add_remove"))
    for _ in range(3):
        state = ComposedState.from_json(state.composed([event]).to_json())
    # the same arithmetic as one accountant composing the sequence: PLD's sums may come in another order
    assert state.epsilon(DELTA) == pytest.approx(recomposed([event] * 3, kind), rel=1e-12)
    once = ComposedState(Accountant(kind, "add_remove")).composed([event])
    assert state.plus(once).epsilon(DELTA) == pytest.approx(recomposed([event] * 4, kind), rel=1e-12)
    assert state.count == 3 and ComposedState(Accountant(kind, "add_remove")).epsilon(DELTA) == 0.0


@settings(max_examples=8, deadline=None)
@given(st.lists(st.tuples(st.floats(0.8, 3.0), st.integers(10, 200), st.booleans()), min_size=1, max_size=6))
def test_each_blocks_total_is_the_composition_of_the_charges_on_it(tmp_path_factory, runs):
    """Charges committed (some with fewer steps than planned) on overlapping windows of three blocks: each
    block's stored state gives what recomposing its own charges gives, and the dataset's total is the
    largest block's."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path_factory.mktemp('l') / 'l.db'}")
    on = {"d1": [], "d2": [], "d3": []}
    for i, (sigma, steps, crashed) in enumerate(runs):
        window = [["d1", "d2"], ["d2", "d3"], ["d3"]][i % 3]
        charge = _reserve(ledger, run_event(200, sigma), days(*window))
        executed = run_event(steps if crashed else 200, sigma)
        ledger.commit(charge, executed, steps if crashed else 200)
        for block in window:
            on[block].append(executed)
    listed = {b.block: b for b in ledger.blocks("visits")}
    for block, events in on.items():
        if events:
            assert listed[block].epsilon == pytest.approx(recomposed(events), rel=1e-12)
            assert listed[block].charges == len(events)
    assert ledger.spent("visits") == pytest.approx(max(recomposed(e) for e in on.values() if e), rel=1e-12)


def test_a_run_is_reserved_on_every_block_of_its_window_or_on_none(tmp_path):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    one, two = recomposed([run_event()]), recomposed([run_event()] * 2)
    lifetime = (one + two) / 2  # one run a block (two compose to less than twice one)
    _reserve(ledger, run_event(), days("d2", lifetime=lifetime), lifetime)
    with pytest.raises(BudgetExceeded) as refused:
        _reserve(ledger, run_event(), days("d1", "d2", "d3", lifetime=lifetime), lifetime)
    assert refused.value.block == "d2"
    assert str(refused.value).startswith(f"budget.lifetime_epsilon: block 'd2' of dataset 'visits' cannot take this "
                                         f"run of epsilon {one:.4g}: composed with the 1 charge before it")
    # nothing was written on d1 or d3: they are not even registered
    assert [b.block for b in ledger.blocks("visits")] == ["d2"] and len(ledger.history("visits")) == 1
    _reserve(ledger, run_event(), days("d1", "d3", lifetime=lifetime), lifetime)  # the blocks with budget left
    assert {b.block: b.charges for b in ledger.blocks("visits")} == {"d1": 1, "d2": 1, "d3": 1}
    # new blocks bring budget of their own: the window that moved on is admitted
    _reserve(ledger, run_event(), days("d4", "d5", lifetime=lifetime), lifetime)
    assert ledger.spent("visits") == pytest.approx(one, rel=1e-12)  # the largest block, not a sum over blocks


def test_a_block_is_registered_once_with_its_terms(tmp_path):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    _reserve(ledger, run_event(), days("d1"))
    with pytest.raises(ValueError, match=r"^budget: block 'd1' of dataset 'visits' is registered with lifetime "
                                         r"epsilon 100 at delta 1e-05, the spec says 50 at 1e-05; they must match$"):
        _reserve(ledger, run_event(), days("d1", lifetime=50.0))


def test_a_dataset_charged_before_blocks_becomes_one_block_with_the_same_total(tmp_path):
    """A ledger written before blocks existed (charges only): the next reservation writes its one block from
    the committed charges (open ones stay open on it), and the total is unchanged."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    ledger = PrivacyLedger(url)
    a, b, c = run_event(100, 1.1), run_event(150, 1.4), run_event(80, 2.0)
    first, second = _reserve(ledger, a), _reserve(ledger, b)
    ledger.commit(first, a, 100)
    ledger.commit(second, run_event(60, 1.4), 60)
    still_open = _reserve(ledger, c)
    engine = create_engine(url)
    with engine.begin() as conn:  # as the earlier privzo left it: no block rows
        conn.execute(text("DELETE FROM privzo_charge_blocks"))
        conn.execute(text("DELETE FROM privzo_blocks"))
    before = recomposed([a, run_event(60, 1.4), c])
    assert ledger.spent("visits") == pytest.approx(before, rel=1e-12)
    assert [(x.block, x.charges) for x in ledger.blocks("visits")] == [(WHOLE, 3)]
    _reserve(ledger, a)
    ledger.commit(still_open, c, 80)
    (whole,) = ledger.blocks("visits")
    assert whole.block == WHOLE and whole.charges == 4
    assert whole.epsilon == pytest.approx(recomposed([a, run_event(60, 1.4), c, a]), rel=1e-12)
    assert whole.committed_epsilon == pytest.approx(recomposed([a, run_event(60, 1.4), c]), rel=1e-12)


def test_an_adaptive_sequence_of_different_sigmas_stays_within_the_filter(tmp_path):
    """Each run's noise is chosen after seeing how the ledger stands (as a user who looks at the earlier models
    would): the Renyi filter at fixed orders admits a run only while some order keeps the composed divergence
    within what the lifetime allows there, so whatever the choices, the admitted runs compose to at most the
    lifetime, and a refused run changes nothing."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    lifetime, admitted, refused = 6.0, [], 0
    sigma = 0.9
    for _ in range(12):
        event = run_event(150, sigma)
        try:
            ledger.commit(_reserve(ledger, event, days("d1", lifetime=lifetime), lifetime), event, 150)
            admitted.append(event)
        except BudgetExceeded as err:
            refused += 1
            sigma = sigma * 2.0 if err.fits is not None else sigma
            continue
        # adapt: the more spent, the more noise the next run asks for
        sigma = 0.9 + 2.0 * ledger.spent("visits") / lifetime
    assert refused and len(admitted) >= 2
    total = recomposed(admitted)
    assert total <= lifetime and ledger.spent("visits") == pytest.approx(total, rel=1e-12)
    # the filter's rule, order by order: some order has room for everything admitted
    orders = rdp.DEFAULT_RDP_ORDERS
    acc = dp_accounting.rdp.RdpAccountant(orders)
    for event in admitted:
        acc.compose(event)
    room = [r + rdp.compute_epsilon([o], [0.0], DELTA)[0] for o, r in zip(orders, acc._rdp)]
    assert min(room) <= lifetime + 1e-9


def test_under_pld_a_block_takes_copies_of_one_planned_event_and_counts_them_as_planned(tmp_path):
    """PLD's exact composition is a bound for parameters fixed in advance: a block accounted with pld admits
    only the event its earlier runs planned (a run with other noise is refused in one line, writing nothing),
    and a run stopped early counts as planned, so the number of runs is capped before any of them runs."""
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    planned, other = run_event(50, 1.2), run_event(50, 2.0)
    charge = _reserve(ledger, planned, days("d1"), accountant="pld")
    ledger.commit(charge, run_event(20, 1.2), 20)  # stopped at step 20 (a divergence, say): counted as planned
    assert ledger.spent("visits") == pytest.approx(recomposed([planned], "pld"), rel=1e-9)
    with pytest.raises(ValueError, match=r"^privacy.accountant: block 'd1' of dataset 'visits' is accounted with "
                                         r"pld, exact only for runs whose parameters were fixed in advance, and this "
                                         r"run plans another event than 1 run charged to it") as refused:
        _reserve(ledger, other, days("d1", "d2"), accountant="pld")
    assert "\n" not in str(refused.value) and len(ledger.history("visits")) == 1
    assert [b.block for b in ledger.blocks("visits")] == ["d1"]
    ledger.commit(_reserve(ledger, planned, days("d1", "d2"), accountant="pld"), planned, 50)
    _reserve(ledger, other, days("d3"), accountant="pld")  # a block nobody charged yet takes any event
    listed = {b.block: b for b in ledger.blocks("visits")}
    assert listed["d1"].committed_epsilon == pytest.approx(recomposed([planned] * 2, "pld"), rel=1e-9)


def test_the_refusal_names_the_block_that_brings_budget(tmp_path):
    ledger = PrivacyLedger(f"sqlite:///{tmp_path / 'l.db'}")
    lifetime = (recomposed([run_event()]) + recomposed([run_event()] * 2)) / 2
    _reserve(ledger, run_event(), days("2026-11-20", lifetime=lifetime), lifetime)
    with pytest.raises(BudgetExceeded, match=r"; block '2026-11-21' brings budget of its own when it arrives$"):
        ledger.reserve(Reservation(
            terms=DatasetTerms("visits", lifetime, DELTA, "rdp", "add_remove"), planned=run_event(), steps=100,
            fingerprint="f" * 64, run_name="r",
            window=WindowRead(days("2026-11-20", lifetime=lifetime), next_block="2026-11-21"), block_terms=False))


def test_scaled_noise_keeps_the_runs_shape():
    event = dp_accounting.ComposedDpEvent([run_event(10, 1.0), dp_accounting.SelfComposedDpEvent(
        dp_accounting.SampledWithoutReplacementDpEvent(1000, 50, dp_accounting.GaussianDpEvent(2.0)), 5)])
    scaled = scaled_noise(event, 3.0)
    assert scaled.events[0].count == 10 and scaled.events[0].event.sampling_probability == 0.05
    assert scaled.events[0].event.event.noise_multiplier == 3.0
    assert scaled.events[1].event.sample_size == 50 and scaled.events[1].event.event.noise_multiplier == 6.0


def test_the_largest_fit_over_a_window_is_the_smallest_of_its_blocks_fits():
    """One bisection over every block (each probe's event composed once, added with ``plus``) gives what one
    bisection per block gives at its smallest: the block needing the most noise decides; a full block, None."""
    from flows.ledger.admission import largest_fit

    accountant = Accountant("rdp", "add_remove")
    planned = run_event(steps=50)
    bases = [(ComposedState(accountant).composed([run_event(steps=50)] * charges), lifetime, 1e-5)
             for charges, lifetime in ((0, 4.0), (1, 4.0), (3, 4.0), (2, 3.0), (1, 2.5))]
    alone = [largest_fit([base], planned, 20) for base in bases]
    assert largest_fit(bases, planned, 20) == min(alone)
    assert largest_fit(bases + [(bases[2][0], 0.5, 1e-5)], planned, 20) is None

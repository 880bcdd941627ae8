"""The privacy audit: its statistics against hand-computed values and known properties, the white-box
view against what privzo's loop releases, and the audit itself on correct and broken mechanisms.

The audits run with seeded generators (inclusion, noise, batches), so each test is deterministic; the
margins they are asserted with were measured with other seeds too (docs/audit.md). For a correct
mechanism the one-run theorem bounds the chance that the bound exceeds the claimed epsilon by
1 - confidence whatever the seed."""
import copy
import math

import numpy as np
import pytest
import torch

import specs
from components import builders, models
from components.audit import (
    audit,
    audit_many,
    clopper_pearson,
    default_runs,
    many_runs_ceiling,
    many_runs_epsilon,
    one_run_ceiling,
    one_run_epsilon,
)
from components.audit.bounds import one_run_p_value, one_run_p_values
from components.audit.canaries import Probe, draw_canaries, scaled
from components.audit.guessing import choose_guess_count, count_correct, guesses, split_guess
from components.audit.many_runs import split_threshold, threshold_guess
from components.audit.run import NoiseOff, _audit_data

# ------------------------------------------------------------------------------------------- statistics


def test_one_run_bound_without_delta_is_the_closed_form():
    # every one of r guesses right, delta = 0: p = q^r, so the bound is logit(beta^(1/r))
    for r, confidence in ((100, 0.95), (30, 0.99), (1000, 0.9)):
        q = (1 - confidence) ** (1 / r)
        assert one_run_epsilon(r, r, r, 0.0, confidence) == pytest.approx(math.log(q / (1 - q)), abs=1e-6)


def test_one_run_p_value_includes_the_delta_term_as_stated():
    # m = 10, r = v = 2. eps = 0 (q = 1/2): P[W >= 2] = 1/4; alpha = max(P[W = 1] / 1, P[W <= 1] / 2) = 1/2
    assert one_run_p_value(10, 2, 2, 0.0, 0.01) == pytest.approx(0.25 + 2 * 10 * 0.01 * 0.5, abs=1e-12)
    # eps = log 3 (q = 3/4): P[W >= 2] = 9/16; alpha = max(6/16, (7/16) / 2) = 6/16
    assert one_run_p_value(10, 2, 2, math.log(3), 0.01) == pytest.approx(9 / 16 + 2 * 10 * 0.01 * 6 / 16, abs=1e-12)
    assert one_run_p_value(10, 2, 0, 1.0, 0.5) == 1.0  # no correct guess: nothing is rejected


@pytest.mark.parametrize("m, r, v, delta", [(100, 100, 90, 1e-5), (1000, 200, 150, 1 / 1384), (50, 50, 50, 0.01)])
def test_one_run_p_value_grows_with_epsilon(m, r, v, delta):
    p = one_run_p_values(m, r, v, np.linspace(0, 8, 400), delta)
    assert np.all(np.diff(p) >= -1e-12)


def test_one_run_bound_moves_the_right_way():
    base = one_run_epsilon(1000, 200, 170, 1e-5, 0.95)
    assert 0 < base
    assert one_run_epsilon(1000, 200, 180, 1e-5, 0.95) > base  # more correct guesses
    assert one_run_epsilon(1000, 200, 170, 1e-5, 0.99) < base  # more confidence
    assert one_run_epsilon(1000, 200, 170, 1e-3, 0.95) < base  # a larger delta explains more
    assert one_run_epsilon(1000, 200, 100, 1e-5, 0.95) == 0.0  # chance level rejects nothing
    assert one_run_ceiling(1000, 1e-5, 0.95) >= one_run_epsilon(1000, 1000, 1000, 1e-5, 0.95) - 1e-9


def test_one_run_bound_is_sound_on_an_exactly_dp_mechanism():
    # randomized response is exactly (eps, 0)-DP in each canary: each guess is right with probability
    # e^eps / (1 + e^eps). The bound exceeds eps exactly when the p-value at eps is below 1 - confidence,
    # which the theorem allows in at most 5% of runs: at most 25 of 200 fails with probability < 1e-4
    # (binomial tail), and the seed makes it deterministic.
    rng = np.random.default_rng(7)
    eps, m = 1.0, 500
    q = math.exp(eps) / (1 + math.exp(eps))
    above = sum(one_run_p_value(m, m, int(rng.binomial(m, q)), eps, 1e-6) < 0.05 for _ in range(200))
    assert above <= 25


def test_clopper_pearson_against_closed_forms():
    n, beta = 40, 0.05
    lower, upper = clopper_pearson(0, n, 0.95)
    assert lower == 0.0 and upper == pytest.approx(1 - beta ** (1 / n), rel=1e-9)
    lower, upper = clopper_pearson(n, n, 0.95)
    assert upper == 1.0 and lower == pytest.approx(beta ** (1 / n), rel=1e-9)
    lo, up = clopper_pearson(5, 10, 0.95)
    assert lo == pytest.approx(1 - up, abs=1e-12) and lo < 0.5 < up


def test_many_runs_bound_against_hand_computed_value():
    # no error in 1000 + 1000 runs: both rates' upper bounds are 1 - 0.025^(1/1000) at 97.5% each
    up = 1 - 0.025 ** (1 / 1000)
    expected = math.log((1 - 1e-5 - up) / up)
    assert many_runs_epsilon(0, 1000, 0, 1000, 1e-5, 0.95) == pytest.approx(expected, abs=1e-9)
    assert many_runs_epsilon(20, 1000, 0, 1000, 1e-5, 0.95) < expected
    assert many_runs_epsilon(500, 1000, 500, 1000, 1e-5, 0.95) == 0.0


def test_a_fixed_threshold_over_many_runs_is_clopper_pearson_on_its_errors():
    scores = np.array([2.0, 1.5, -0.5, 0.3, -1.0, -2.0, 0.7, -0.1])
    included = np.array([True, True, True, False, False, False, True, False])
    r = threshold_guess("white_box", scores, included, 0.0, 1e-5, 0.95)
    # in above 0: runs 0, 1, 3 (out: a false positive) and 6; run 2 (in, -0.5) is a false negative
    assert (r.guesses, r.correct) == (8, 6)
    assert r.epsilon_lower == many_runs_epsilon(1, 4, 1, 4, 1e-5, 0.95)
    assert many_runs_ceiling(200, 1e-5, 0.95) == many_runs_epsilon(0, 100, 0, 100, 1e-5, 0.95)


def test_a_threshold_picked_on_one_half_of_the_runs_is_bounded_on_the_other():
    rng = np.random.default_rng(1)
    included = rng.permutation(400) < 200
    scores = rng.standard_normal(400) + np.where(included, 3.0, 0.0)  # the threshold to find sits near 1.5
    r = split_threshold("black_box", scores, included, 1e-5, 0.95, seed=2)
    assert r.canaries_bounded == r.guesses == 200 and r.correct >= 170 and r.epsilon_lower > 1.0
    blind = split_threshold("black_box", rng.standard_normal(400), included, 1e-5, 0.95, seed=2)
    assert blind.epsilon_lower == 0.0  # scores that say nothing about the truth


@pytest.mark.parametrize("call, field", [
    (lambda: one_run_epsilon(10, 5, 3, 1e-5, 1.5), "confidence"),
    (lambda: one_run_epsilon(10, 5, 6, 1e-5, 0.95), "one-run audit"),
    (lambda: one_run_p_value(10, 5, 3, 1.0, 2.0), "delta"),
    (lambda: clopper_pearson(3, 2, 0.95), "clopper_pearson"),
])
def test_bad_input_is_one_line_naming_the_field(call, field):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------------- guessing


def test_guesses_take_the_extremes_and_abstain_on_the_rest():
    scores = np.array([0.3, -2.0, 5.0, 0.1, 4.0, -1.0])
    g = guesses(scores, 3)
    assert g.tolist() == [0, -1, 1, 0, 1, 0]
    included = np.array([False, False, True, True, True, False])
    assert count_correct(g, included) == 3
    assert count_correct(guesses(scores, 6), included) == 4  # 0.1 (in) and 0.3 (out) are on the wrong sides


def test_the_guess_count_is_chosen_without_the_truth():
    rng = np.random.default_rng(0)
    included = rng.random(400) < 0.5
    scores = rng.standard_normal(400) + np.where(included, 1.5, -1.5)
    r = choose_guess_count(scores, 1e-5, 0.95)  # a function of the scores alone
    assert 2 <= r <= 400
    used, r2, v, eps = split_guess(scores, included, 1e-5, 0.95, seed=3)
    assert used == 200 and v <= r2 <= used and eps == one_run_epsilon(200, r2, v, 1e-5, 0.95)


# ------------------------------------------------------------------------------------- the audited run

BASE = {
    "name": "audit-tiny", "seed": 5,
    "data": {"source": {"kind": "sklearn", "name": "digits"},
             "split": {"kind": "fraction", "public": 0.04, "test": 0.2}, "declared_private_rows": 64},
    "model": {"kind": "linear"},
    "estimator": {"kind": "two_point", "queries": 4, "smoothing": 1e-3},
    # sigma given, so the plan is one accounting pass instead of a calibration (eps 0.9993 at these settings)
    "mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 28.7},
    "privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "rdp"},
    "sampling": {"kind": "poisson", "expected_batch_size": 32},
    "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 200},
    "execution": {"backend": "local"},
}
DP_SGD = {"estimator": {"kind": "first_order"}, "mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 20.4},
          "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 100}}  # eps 0.9964


def _spec(**changes):
    data = copy.deepcopy(BASE)
    data.update(copy.deepcopy(changes))
    return specs.RunSpec.model_validate(data)


@pytest.fixture(scope="module")
def digits():
    return builders.load_data(_spec())


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # the audit's forwards are tiny: on a busy 2-core machine one thread runs them 3-10x faster than two
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _audit(spec, data, noise_scale=1.0, seed=0, canaries=100):
    gen = [torch.Generator().manual_seed(1000 * seed + k) for k in range(3)]
    return audit(spec, data, canaries=canaries, noise_scale=noise_scale, inclusion_generator=gen[0],
                 noise_generator=gen[1], sampling_generator=gen[2])


@pytest.mark.parametrize("changes", [{}, DP_SGD], ids=["dpzero", "dp-sgd"])
def test_a_correct_mechanism_is_not_refuted(digits, changes):
    result = _audit(_spec(**changes), digits)
    assert result.claimed_epsilon <= 1.0
    assert result.white_box.epsilon_lower <= result.claimed_epsilon
    assert result.black_box.epsilon_lower <= result.claimed_epsilon
    assert not result.exceeds_claim
    assert result.share_at_clip > 0.8  # the canaries were worst-case: their values sat at the clip


@pytest.mark.parametrize("changes, noise_scale", [({}, 0.0), ({}, 0.1), (DP_SGD, 0.0), (DP_SGD, 0.1)],
                         ids=["dpzero-noise-off", "dpzero-sigma/10", "dp-sgd-noise-off", "dp-sgd-sigma/10"])
def test_a_broken_mechanism_is_caught_by_the_same_audit(digits, changes, noise_scale):
    # the accountant still claims the epsilon calibrated for sigma; the noise is off, or sigma / 10
    result = _audit(_spec(**changes), digits, noise_scale=noise_scale)
    assert result.exceeds_claim
    assert result.white_box.epsilon_lower > result.claimed_epsilon  # over seeds 0-9: 1.33 to 3.38 (claim 1.0)


@pytest.mark.parametrize("estimator", [
    {"kind": "two_point", "queries": 2}, {"kind": "pazo_s", "public_batches": 2, "public_batch_size": 8},
    {"kind": "first_order"}, {"kind": "dpgd_0th", "queries": 2},
    {"kind": "gep", "anchors": 8, "public_batch_size": 16}, {"kind": "dope_sgd", "public_batch_size": 8},
], ids=lambda e: e["kind"])
def test_the_white_box_view_is_exactly_what_the_run_releases(digits, estimator):
    # every row in every step (rate 1) and no noise: the releases are the sums of the included canaries'
    # contributions, so the auditor's scores must be A (z - 1/2) exactly, A its own overlap matrix
    spec = _spec(estimator=estimator, data=dict(BASE["data"], declared_private_rows=32),
                 optimizer={"kind": "sgd", "lr": 0.05, "steps": 4},
                 mechanism={"kind": "gaussian", "clip": 1.0, "noise_multiplier": 5.0},
                 privacy={"epsilon": 100.0, "delta": 1e-5, "accountant": "rdp"})
    resolved, rate, _ = builders.resolve_privacy(spec, None)
    assert rate == 1.0
    slots = scaled(draw_canaries(12, digits.n_features, digits.n_classes, seed=1), 30.0)
    included = np.arange(12) % 3 != 0
    data = _audit_data(digits, slots.features[included], slots.labels[included])
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(0),
                                sampling_generator=torch.Generator().manual_seed(0))
    built.loop.mechanism = NoiseOff(built.loop.mechanism)
    empty = torch.zeros(0, digits.n_features)
    probe = Probe(slots, empty, torch.zeros(0, dtype=torch.int64), rate, models.per_example_loss, built.device)
    probe.attach(built.loop)
    built.loop.run(4)
    expected = probe.overlap @ (included - 0.5)  # rate 1: A is the overlap itself
    scale = np.abs(probe.overlap).max()
    assert probe.releases >= 4 and scale > 0
    assert np.allclose(probe.scores, expected, atol=1e-4 * scale * 12)


@pytest.mark.parametrize("changes", [
    {"estimator": {"kind": "pazo_m", "queries": 2, "public_batch_size": 8}},
    {"estimator": {"kind": "pazo_p", "queries": 2, "public_batches": 2, "public_batch_size": 8}},
    {"privacy": {"epsilon": 100.0, "delta": 1e-5, "accountant": "rdp", "neighboring": "replace_one"},
     "sampling": {"kind": "fixed_size", "batch_size": 8}, "data": dict(BASE["data"], declared_private_rows=None)},
], ids=["pazo_m", "pazo_p", "replace_one"])
def test_every_estimator_and_neighbouring_relation_can_be_audited(digits, changes):
    base = {"mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 5.0},
            "privacy": {"epsilon": 100.0, "delta": 1e-5, "accountant": "rdp"},
            "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 10}}
    base.update(changes)
    result = _audit(_spec(**base), digits, canaries=20)
    assert result.white_box.guesses >= 1 and 0.0 <= result.epsilon_lower <= result.claimed_epsilon
    assert result.white_box.canaries_bounded == 20 and result.black_box.canaries_bounded == 10


@pytest.mark.parametrize("kwargs, field", [
    ({"canaries": 2}, "--canaries"), ({"confidence": 1.0}, "--confidence"), ({"background": "all"}, "--background"),
    ({"noise_scale": -1.0}, "--noise-scale"),
])
def test_bad_audit_arguments_are_one_line(digits, kwargs, field):
    with pytest.raises(ValueError) as err:
        audit(_spec(), digits, **kwargs)
    assert str(err.value).startswith(field) and "\n" not in str(err.value)


def test_a_run_without_a_mechanism_has_nothing_to_audit(digits):
    with pytest.raises(ValueError, match="^mechanism.kind: none"):
        audit(_spec(mechanism={"kind": "none"}, privacy=None), digits)


# ------------------------------------------------------------------- PAZO-S: many runs of one canary each

# every private row sampled at every step (rate 1), so a run holds the canary at every step or never
PAZO_S = {"estimator": {"kind": "pazo_s", "public_batches": 2, "public_batch_size": 8},
          "data": dict(BASE["data"], declared_private_rows=32),
          "mechanism": {"kind": "gaussian", "clip": 1.0, "noise_multiplier": 12.8},  # eps 0.9994 at 10 steps
          "optimizer": {"kind": "sgd", "lr": 0.05, "steps": 10}}


def test_pazo_s_is_audited_by_many_runs_because_one_run_cannot_tell_its_canaries_apart(digits):
    # every canary at the clip adds the same C to each of PAZO-S's releases: one run's scores are equal
    # (but for the odd canary whose loss left the clip for a step)
    result = _audit(_spec(**PAZO_S), digits, noise_scale=0.0, canaries=20)
    scores = result.white_box_scores
    assert np.mean(np.isclose(scores, np.median(scores), rtol=1e-9)) >= 0.8
    assert result.white_box.epsilon_lower == 0.0  # no power, even with the noise off
    assert default_runs(_spec(**PAZO_S)) == 100 and default_runs(_spec()) == 1


def _audit_many(spec, data, noise_scale, runs):
    gen = [torch.Generator().manual_seed(k) for k in range(3)]
    return audit_many(spec, data, runs=runs, noise_scale=noise_scale, inclusion_generator=gen[0],
                      noise_generator=gen[1], sampling_generator=gen[2])


@pytest.mark.parametrize("noise_scale, runs", [(1.0, 60), (0.0, 60), (0.1, 200)],
                         ids=["as-claimed", "noise-off", "sigma/10"])
def test_many_runs_audit_of_pazo_s_refutes_only_a_broken_mechanism(digits, noise_scale, runs):
    result = _audit_many(_spec(**PAZO_S), digits, noise_scale, runs)
    assert result.claimed_epsilon <= 1.0 and result.method == "many-runs" and result.runs == runs
    assert int(result.included.sum()) == runs // 2 and result.share_at_clip > 0.99
    if noise_scale == 1.0:
        assert not result.exceeds_claim
    else:  # noise off: every guess right (2.03 with 60 runs); sigma / 10: 1.37 and 1.48 over two seeds
        assert result.white_box.epsilon_lower > result.claimed_epsilon


def test_a_lone_canary_is_the_most_extreme_of_a_public_pool(digits):
    # one random canary is as likely as not already classified right (loss and gradient 0, useless to
    # every audit); the many-runs audit picks, at the public x_0, the one of a pool furthest past the clip
    from components.audit.canaries import gradient_norms
    from components.audit.run import SINGLE_CANARY_POOL, audit_setup

    spec = _spec(**dict(PAZO_S, model={"kind": "mlp", "hidden": [16]}))
    setup = audit_setup(spec, digits, 1, "none", None)
    pool = audit_setup(spec, digits, SINGLE_CANARY_POOL, "none", None)
    built = builders.build_loop(setup.resolved, digits, noise_generator=torch.Generator().manual_seed(0),
                                sampling_generator=torch.Generator().manual_seed(0))
    params = built.loop.backend.directions.params

    def norms(slots):
        return gradient_norms(built.model, params, models.per_example_loss, slots.features, slots.labels, built.device)

    assert len(setup.slots) == 1 and setup.scale == pool.scale
    assert norms(setup.slots)[0] == pytest.approx(norms(pool.slots).max(), rel=1e-6)
    loss = models.per_example_loss(built.model, torch.as_tensor(setup.slots.features), torch.as_tensor(setup.slots.labels))
    assert float(loss.detach()[0]) >= spec.mechanism.clip  # its PAZO-S value sits at the clip


# ------------------------------------------------------------------------------------- person level

@pytest.fixture(scope="module")
def visits(tmp_path_factory):
    """digits as a one-day file of visits, one patient a row (the audit reads only shapes and public rows)."""
    import pandas as pd

    from components.data.sources import load_sklearn

    table = load_sklearn("digits")
    frame = pd.DataFrame(table.features, columns=[f"px{i}" for i in range(64)])
    frame["digit"], frame["arrived"] = table.labels, "2026-11-01"
    frame["patient"] = [f"p{i}" for i in range(len(frame))]
    path = tmp_path_factory.mktemp("visits") / "visits.csv"
    frame.to_csv(path, index=False)
    return path


def _person_spec(path, **changes):
    data = copy.deepcopy(BASE)
    data.update(copy.deepcopy(changes))
    data["data"] = {"source": {"kind": "file", "path": str(path), "label": "digit", "classes": list(range(10))},
                    "split": {"kind": "hashed", "public": 0.04, "test": 0.2},
                    "blocks": {"arrival": "arrived", "period": "day", "person": "patient", "declared_persons": 64}}
    data["budget"] = {"dataset": "visits", "lifetime_epsilon": 4.0, "window": {"blocks": 1}}
    return specs.RunSpec.model_validate(data)


@pytest.mark.parametrize("changes", [{}, DP_SGD], ids=["dpzero", "dp-sgd"])
def test_canary_persons_of_two_rows_are_audited_at_or_under_the_person_level_claim(visits, changes):
    spec = _person_spec(visits, **changes)
    data = builders.load_data(spec, every_block=True)
    gen = [torch.Generator().manual_seed(k) for k in range(3)]
    result = audit(spec, data, canaries=100, inclusion_generator=gen[0], noise_generator=gen[1],
                   sampling_generator=gen[2])
    assert result.person_rows == 2 and "over persons" in result.sampling
    assert result.claimed_epsilon <= 1.0 and not result.exceeds_claim
    assert result.share_at_clip > 0.8


def test_clipping_each_row_alone_is_refuted_by_canary_persons(visits):
    """The same person-level run with each row clipped alone (event level's clipping): a canary person of 8
    rows moves each release by 8 clips, and the audit's lower bound passes the claim (seeds 0-2: 2.41, 2.19,
    1.96 against 1.0, docs/audit.md); 2 rows are sigma / 2, which one run of this audit cannot tell apart."""
    spec = _person_spec(visits, **DP_SGD)
    data = builders.load_data(spec, every_block=True)
    gen = [torch.Generator().manual_seed(k) for k in range(3)]
    result = audit(spec, data, canaries=1000, inclusion_generator=gen[0], noise_generator=gen[1],
                   sampling_generator=gen[2], person_rows=8, clip_rows_alone=True)
    assert result.exceeds_claim and result.white_box.epsilon_lower > result.claimed_epsilon

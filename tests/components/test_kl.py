"""Paper 003's algorithms: exact accounting (the planned events, the filter, the selection), sensitivities on
neighbouring datasets, and the door's refusals."""
from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specs
from components import builders
from components.families.kl import plan as kl
from components.accountants import Accountant, FilterTracker, PrivacyFilterError
from components.accountants.accounting import event_rho, gaussian_equivalent
from components.queries.clipped_sums import exact_gradient_sums
from components.queries import PerExampleGradientAt
from components.mechanisms.full_batch import FullBatchGaussian
from components.families.kl.problems import KlObjective, kl_rows

EXAMPLES = Path(__file__).parents[2] / "specs" / "examples"


def _spec(name: str, rows: int, **changes) -> specs.RunSpec:
    data = specs.load_spec(str(EXAMPLES / f"{name}.yaml")).model_dump(mode="json")
    data["data"]["source"]["rows"] = rows
    for section, values in changes.items():
        data[section] = {**(data.get(section) or {}), **values}
    return specs.spec_from_dict(data)


def _built(spec: specs.RunSpec, seed: int = 0):
    data = builders.load_data(spec)
    resolved, _, eps = builders.plan(spec, data)
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(seed))
    return resolved, built, eps


def _recording(mechanism: FullBatchGaussian):
    """Every release's (clip, std) as the door asks the mechanism for it: the spend recomputed apart."""
    seen = []
    vector, norm = mechanism.release_mean, mechanism.release_norm

    def recorded(method):
        def call(sums, std):
            seen.append(std)
            return method(sums, std)
        return call

    mechanism.release_mean, mechanism.release_norm = recorded(vector), recorded(norm)
    return seen


# ------------------------------------------------------------------ KL-Spider and PPM: the plan is exactly rho
@settings(max_examples=60, deadline=None)
@given(n=st.integers(200, 10 ** 6), d=st.integers(1, 300), kappa=st.floats(1.0, 2.0), gamma=st.floats(0.2, 5.0),
       lipschitz=st.floats(0.5, 5.0), smoothness=st.floats(0.2, 10.0), gap=st.floats(0.05, 3.0),
       rho=st.floats(0.01, 4.0), clip_ratio=st.floats(0.3, 3.0), shape=st.booleans())
def test_kl_spider_planned_event_has_rho_exactly(n, d, kappa, gamma, lipschitz, smoothness, gap, rho, clip_ratio, shape):
    a = kl.KlAssumptions(lipschitz, smoothness, None, gap, gamma, kappa, 0.1, None)
    constants = (1.0, 1.0) if shape else (64.0, 32.0)
    try:
        plan = kl.plan_kl_spider(n, d, rho, a, clip_ratio * lipschitz, *constants)
    except ValueError as err:  # too few rows for the preset: refused in one line, naming n
        assert str(err).startswith("data: n = ")
        return
    event = kl.plan_event(plan)
    assert event_rho(event) == pytest.approx(rho, rel=1e-10)  # summation order of many releases
    # the run is charged the one Gaussian its releases compose to (mu^2 adds over Gaussians)
    assert gaussian_equivalent(event).noise_multiplier == pytest.approx(1 / math.sqrt(2 * rho), rel=1e-10)
    assert Accountant("zcdp", "replace_one").rho(event) == pytest.approx(rho, rel=1e-10)
    assert plan.releases == plan.phases + sum(t - 1 for t in plan.lengths)  # no dead difference after a phase
    # the paper's printed stds (one factor c = 1) cost 2 rho (C0 / L0)^2 for the full gradients and
    # rho / (8 K T_k) a difference: the factor is the square root of that over rho, never above sqrt(17/8)
    # at the paper's clip L0
    paper = 2 * rho * clip_ratio ** 2 + rho / (8 * plan.phases) * sum((t - 1) / t for t in plan.lengths)
    assert plan.noise_scale ** 2 * rho == pytest.approx(paper, rel=1e-9)
    if clip_ratio <= 1:
        assert plan.noise_scale <= math.sqrt(17 / 8) * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(50, 4000), d=st.integers(1, 50), kappa=st.floats(2.0, 4.0), rho=st.floats(0.05, 2.0),
       weak=st.floats(0.2, 5.0))
def test_proximal_point_planned_event_has_rho_exactly(n, d, kappa, rho, weak):
    a = kl.KlAssumptions(1.5, None, weak, 0.5, 2.0, kappa, 0.1, None)
    try:
        plan = kl.plan_proximal_point(n, d, rho, a, 1.5, c_T=1.0, log_factor=False)
    except ValueError:
        return
    (count, z), = plan.multipliers()
    assert count == plan.outer * (plan.inner - 1)
    assert event_rho(kl.plan_event(plan)) == pytest.approx(rho, rel=1e-10)  # summation order of many releases


def test_zcdp_accountant_matches_the_closed_forms():
    """rho of a Gaussian of multiplier z is 1 / (2 z^2), compositions add, a ZCDpEvent is its rho; epsilon at
    delta never exceeds Bun and Steinke's rho + 2 sqrt(rho log(1 / delta)) and is at least the exact Gaussian's."""
    from statistics import NormalDist

    acc = Accountant("zcdp", "replace_one")
    event = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), 7),
                                           dp_accounting.GaussianDpEvent(0.5), dp_accounting.ZCDpEvent(0.25)])
    rho = 7 / 18 + 2.0 + 0.25
    assert acc.rho(event) == pytest.approx(rho, rel=1e-15)
    delta = 1e-6
    eps = acc.epsilon(event, delta)
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))
    mu = math.sqrt(2 * rho)
    cdf = NormalDist().cdf
    exact = cdf(-eps / mu + mu / 2) - math.exp(eps) * cdf(-eps / mu - mu / 2)
    assert exact <= delta  # a Gaussian of that rho meets (eps, delta): zcdp is never below the truth


# ------------------------------------------------------------------ adaptive GD: the filter
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=st.sampled_from(["mean_pl", "logistic_nonconvex", "pl_sine"]), rows=st.integers(30, 400),
       d=st.integers(2, 12), multiplier=st.floats(0.3, 4.0), clip=st.floats(0.05, 6.0), start=st.floats(-3.0, 3.0),
       beta=st.floats(0.01, 0.5), filter=st.sampled_from(["gdp", "zcdp"]), select=st.sampled_from(["last", "exponential"]),
       seed=st.integers(0, 2 ** 31))
def test_adaptive_spend_never_passes_rho(problem, rows, d, multiplier, clip, start, beta, filter, select, seed):
    """On every run the realised spend, recomputed from the stds the releases used, is at most the budget
    rho = 1 / (2 z^2), and the run is charged exactly that budget (the filter's event, plus the selection)."""
    spec = _spec("q5_adaptive_select", rows, mechanism={"filter": filter, "clip": clip, "noise_multiplier": multiplier},
                 optimizer={"select": select}, assumptions={"failure_probability": beta}, privacy={"epsilon": 1000.0},
                 data={"source": {"kind": "synthetic", "problem": problem, "dimension": d, "rows": rows,
                                  "start": start}})
    try:
        resolved, built, eps = _built(spec, seed)
    except ValueError as err:  # one step could cost more than the budget: refused before anything runs
        assert "too few for adaptive_noisy_gd" in str(err)
        return
    loop = built.loop
    stds = _recording(loop.mechanism)
    loop.run(resolved.optimizer.steps)
    assert loop.finished
    rho = kl.rho_of(multiplier)
    plan = loop.backend.optimizer.plan
    delta = 2 * clip / rows
    spent = sum(delta ** 2 / (2 * s ** 2) for s in stds) + (plan.selection_rho if select == "exponential" else 0.0)
    assert spent <= rho * (1 + 1e-12)
    assert loop.tracker.spent == pytest.approx(spent, rel=1e-10)  # summation order of many releases
    charged = loop.tracker.event()
    assert charged == kl.charged_event(resolved, multiplier)
    assert event_rho(charged) == pytest.approx(rho, rel=1e-10)  # summation order of many releases
    assert eps <= resolved.privacy.epsilon


def test_filter_refuses_a_release_past_its_budget_and_a_planned_run_ends_there():
    tracker = FilterTracker(Accountant("zcdp", "replace_one"), dp_accounting.GaussianDpEvent(1.0), 0.5, 1e-6)
    tracker.charge(0.3)
    with pytest.raises(PrivacyFilterError, match="past the budget"):
        tracker.charge(0.25)
    assert tracker.spent == 0.3 and tracker.event() == dp_accounting.NoOpDpEvent()  # no step recorded yet
    # a KL-Spider run that (after a retry) cannot pay for its next release stops instead of releasing it
    resolved, built, _ = _built(_spec("q1_kl_spider", 600))
    loop = built.loop
    loop.run(3)
    loop.tracker.spent = loop.tracker.budget - 1e-9
    assert loop.finished
    before = loop.step
    loop.run(resolved.optimizer.steps)
    assert loop.step == before


# ------------------------------------------------------------------ sensitivity on neighbouring datasets
@pytest.mark.parametrize("kind", ["gradient", "gradient_difference", "shifted_gradient"])
def test_each_release_moves_at_most_its_sensitivity(kind):
    """Replace one row at random (by far-out rows, so the clips bind): the released mean moves by at most
    2 C / n and its norm (adaptive GD's first release, the selection's score) by at most as much."""
    rng = np.random.default_rng(0)
    d, n = 6, 40
    for trial in range(25):
        rows = 4.0 * kl_rows("mean_pl", d, n, trial)
        other = rows.copy()
        other[rng.integers(n)] = rng.normal(scale=30.0, size=d)
        model = KlObjective("mean_pl", torch.as_tensor(rng.normal(size=d)))
        params = [model.x]
        clip = float(rng.uniform(0.1, 3.0))
        offset = (torch.as_tensor(rng.normal(size=d)),)
        query = PerExampleGradientAt.at("gradient_difference" if kind == "gradient_difference" else "gradient", clip,
                                        None if kind == "gradient" else offset)
        labels = torch.zeros(n, dtype=torch.long)

        def mean(x):
            (total,) = exact_gradient_sums(model, params, lambda m, f, y: m(f), torch.as_tensor(x), labels, query)
            return total / n

        moved = mean(rows) - mean(other)
        bound = FullBatchGaussian(clip, n, 1.0, torch.Generator()).sensitivity(clip)
        assert bound == pytest.approx(2 * clip / n)
        assert float(torch.linalg.vector_norm(moved)) <= bound * (1 + 1e-12)
        assert abs(float(torch.linalg.vector_norm(mean(rows)) - torch.linalg.vector_norm(mean(other)))) <= bound * (
            1 + 1e-12)


def test_selection_draws_by_the_exponential_mechanism():
    """Gumbel-max picks t with probability proportional to exp(-lambda s_t)."""
    mechanism = FullBatchGaussian(1.0, 10, 1.0, torch.Generator().manual_seed(3))
    scores, scale = [0.0, 0.5, 1.0], 2.0
    draws = np.bincount([mechanism.release_choice(scores, scale) for _ in range(6000)], minlength=3) / 6000
    weights = np.exp(-scale * np.array(scores))
    expected = weights / weights.sum()
    assert np.all(np.abs(draws - expected) <= 4 * np.sqrt(expected * (1 - expected) / 6000))


def test_a_killed_chunk_is_charged_at_its_most_on_resume(tmp_path):
    """A process killed mid-chunk may have released every step of it: the resumed filter starts from the
    spend at the chunk's start plus the most a step costs, times the chunk's steps."""
    from flows.checkpoints import Checkpointer, CheckpointStore

    resolved, built, _ = _built(_spec("q4_proximal_point", 120))
    loop = built.loop
    store = CheckpointStore(str(tmp_path), "kl", "key")
    store.lock()
    checkpointer = Checkpointer(store, {"spec_digest": "x"})
    loop.run(5)
    checkpointer.save(loop)
    checkpointer.begin(loop, 25)
    loop.run(12)  # killed here: the checkpoint is at step 5
    saved = store.load()["loop"]
    bound = loop.tracker.step_cost_bound
    assert saved["privacy_spent"] == pytest.approx(5 * bound + 20 * bound, rel=1e-10)  # summation order of many releases
    assert saved["privacy_steps"] == 25
    store.unlock()


@pytest.mark.parametrize("name, rows", [("q1_kl_spider", 600), ("q4_proximal_point", 120),
                                        ("q5_adaptive_select", 4000)])
def test_a_run_resumed_from_its_checkpoint_continues_its_plan(name, rows):
    """Every KL-family state is public and checkpointed anywhere: a new process loading a mid-run checkpoint
    continues the same plan (same phase, inner step or iterates, and the filter's spend), draws with the
    same generator what the run would have drawn, and ends where the uninterrupted run ends."""
    resolved, whole, _ = _built(_spec(name, rows), seed=5)
    whole.loop.run(resolved.optimizer.steps)
    middle = whole.loop.step // 2
    assert middle >= 1
    _, first, _ = _built(_spec(name, rows), seed=5)
    first.loop.run(middle)
    state = first.loop.state_dict()
    _, second, _ = _built(_spec(name, rows), seed=99)
    second.loop.load_state_dict(state, restore_privacy_steps=True)
    second.loop.mechanism.use_generator(first.loop.mechanism._generator)  # the noise the run would have drawn
    assert second.loop.tracker.spent == first.loop.tracker.spent and second.loop.step == middle
    second.loop.run(resolved.optimizer.steps)
    assert second.loop.finished and second.loop.step == whole.loop.step
    assert torch.allclose(second.model.x, whole.model.x, rtol=0, atol=1e-12)
    assert second.loop.tracker.spent == pytest.approx(whole.loop.tracker.spent, rel=1e-10)  # summation order of many releases

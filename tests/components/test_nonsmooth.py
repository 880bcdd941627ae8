"""The private nonsmooth algorithms (the two nonsmooth papers (Zhang et al.; Kornowski et al.)): oracles, door, sampler, presets and spec rules."""
import dataclasses
import math
import re

import pytest
import torch
from torch import nn

import specs
from components import builders
from components.families.nonsmooth import presets
from components.queries.clipped_sums import ball_sums, sphere_sums
from components.queries import PerExampleBall, PerExampleSphere
from components.models import per_example_loss
from components.families.nonsmooth.problems import WLinear, smoothed_gradient
from components.runtime.loop import PrivacyBudgetError

EXAMPLES = "specs/examples"


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double()


def _queries(d, offset):
    return [PerExampleSphere("central", d, 11, 0.05 / math.sqrt(d), "scalar", 0.7),
            PerExampleSphere("one_sided_difference", d, 12, 0.05 / math.sqrt(d), "scalar", 0.3, offset),
            PerExampleSphere("central", 9, 13, 0.05 / math.sqrt(d), "vector", 0.5),
            PerExampleSphere("central_difference", 9, 14, 0.05 / math.sqrt(d), "vector", 0.2, offset),
            PerExampleSphere("independent_difference", 9, 17, 0.05 / math.sqrt(d), "vector", 0.2, offset),
            PerExampleBall("gradient", 1, 15, 0.05, "vector", 0.6),
            PerExampleBall("gradient_difference", 7, 16, 0.05, "vector", 0.1, offset)]


def _sums(model, params, x, y, query):
    evaluate = ball_sums if isinstance(query, PerExampleBall) else sphere_sums
    return torch.cat([t.flatten() for t in evaluate(model, params, per_example_loss, x, y, query)])


@pytest.mark.parametrize("problem", ["w_linear", "mlp"])
def test_each_oracles_release_moves_at_most_its_sensitivity_on_neighbouring_datasets(problem):
    gen = torch.Generator().manual_seed(1)
    if problem == "w_linear":
        model = WLinear(torch.full((4,), 0.2, dtype=torch.float64))
        make = lambda b: (torch.randn(b, 4, generator=gen, dtype=torch.float64) * 3, torch.zeros(b, dtype=torch.long))
    else:
        model = _mlp()
        make = lambda b: (torch.randn(b, 3, generator=gen, dtype=torch.float64) * 5, torch.randint(0, 2, (b,), generator=gen))
    params = list(model.parameters())
    d = sum(p.numel() for p in params)
    offset = tuple(0.01 * torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params)
    exceeded = []  # the slot-keyed queries whose sum one removed row moved by more than one bound
    for query in _queries(d, offset):
        keyed = dataclasses.replace(query, keyed_by_row=True)
        shifted = 0.0
        for _ in range(10):
            x, y = make(6)
            x2, y2 = x.clone(), y.clone()
            i = int(torch.randint(0, 5, (1,), generator=gen))
            x2[i], y2[i] = make(1)[0][0] * 10, make(1)[1][0]  # replace one row by a far one
            a, b = _sums(model, params, x, y, query), _sums(model, params, x2, y2, query)
            assert float((a - b).norm()) <= 2 * query.vector_bound(d) * (1 + 1e-12)
            # add/remove (Poisson batches): one row less moves the sum by one bound when directions follow
            # the rows; by their place in the batch, the rows after it change theirs
            kept = torch.arange(6) != i
            a, c = _sums(model, params, x, y, keyed), _sums(model, params, x[kept], y[kept], keyed)
            assert float((a - c).norm()) <= query.vector_bound(d) * (1 + 1e-12)
            shifted = max(shifted, float((_sums(model, params, x, y, query)
                                          - _sums(model, params, x[kept], y[kept], query)).norm()))
        exceeded.append(shifted > query.vector_bound(d))
    assert any(exceeded)


def _p1_batch():
    """P1 at a point with a coordinate on a kink and one near it, and 400 rows on the sphere of radius 0.5."""
    model = WLinear(torch.tensor([0.3, -0.5, 1.02, 0.0], dtype=torch.float64))
    rows = torch.randn(400, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    rows = 0.5 * rows / rows.norm(dim=1, keepdim=True)
    return model, list(model.parameters()), rows, torch.zeros(400, dtype=torch.long)


def test_the_lipschitz_clip_never_binds_on_p1_and_the_estimate_is_unbiased():
    model, params, rows, y = _p1_batch()
    r, lipschitz = 0.05, 1.5
    clipped = PerExampleSphere("central", 4, 3, r / 2, "scalar", lipschitz * 2)
    free = PerExampleSphere("central", 4, 3, r / 2, "scalar", math.inf)
    a = sphere_sums(model, params, per_example_loss, rows, y, clipped)[0]
    b = sphere_sums(model, params, per_example_loss, rows, y, free)[0]
    assert torch.allclose(a, b, rtol=0, atol=1e-12)
    # the batch mean estimates grad F_r (F = h: the rows average out): within 4 standard errors
    exact = torch.from_numpy(smoothed_gradient(model.x.detach().numpy(), r))
    assert float((a / 400 - exact).norm()) < 4 * lipschitz * 4 / math.sqrt(400)


def test_the_first_order_oracle_never_clips_on_p1_and_estimates_the_smoothed_gradient():
    """002's start estimate: one gradient per row at a point of the alpha-ball, clipped to L (P1's rows have
    |grad f| <= 1 + r_xi = L: never binds); the batch mean estimates grad F_alpha. A difference averages m
    independent ball points at each end: at two points on one side of every kink it is exactly 0."""
    model, params, rows, y = _p1_batch()
    r, lipschitz = 0.05, 1.5
    a = ball_sums(model, params, per_example_loss, rows, y, PerExampleBall("gradient", 1, 3, r, "vector", lipschitz))[0]
    b = ball_sums(model, params, per_example_loss, rows, y, PerExampleBall("gradient", 1, 3, r, "vector", math.inf))[0]
    assert torch.allclose(a, b, rtol=0, atol=1e-12)
    exact = torch.from_numpy(smoothed_gradient(model.x.detach().numpy(), r))
    assert float((a / 400 - exact).norm()) < 4 * lipschitz / math.sqrt(400)
    far = WLinear(torch.tensor([0.3, -0.5, 1.2, 0.6], dtype=torch.float64))  # every coordinate > r from a kink
    offset = (torch.full((4,), 0.01, dtype=torch.float64),)
    diff = ball_sums(far, list(far.parameters()), per_example_loss, rows[:5], y[:5],
                     PerExampleBall("gradient_difference", 50, 4, r, "vector", math.inf, offset))[0]
    assert float(diff.abs().max()) == 0.0


def _resolved(name, rows=600, **changes):
    spec = specs.load_spec(f"{EXAMPLES}/{name}.yaml")
    data = spec.model_dump(mode="json")
    data["data"]["source"]["rows"] = rows
    for section, values in changes.items():
        data[section] = values if values is None or "kind" in values else {**(data.get(section) or {}), **values}
    spec = specs.spec_from_dict(data)
    loaded = builders.load_data(spec)
    resolved, _, eps = builders.plan(spec, loaded)
    return resolved, loaded, eps


@pytest.mark.parametrize("name", ["p1_o2nc_001", "p1_o2nc_001_naive", "p1_o2nc_002", "p1_o2nc_002_fo"])
def test_a_single_pass_reads_every_row_at_most_once_and_burns_a_period_cut_short(name):
    resolved, data, eps = _resolved(name)
    assert eps <= 1.0
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(0))
    loop, seen = built.loop, []
    sample_at = loop.sampler.sample_at
    loop.sampler.sample_at = lambda step, spent: seen.append(sample_at(step, spent)) or seen[-1]
    period = loop.sampler.period
    loop.run(period)
    state = loop.state_dict()
    loop.run(period + max(1, period // 2))  # a retry cuts the second period short ...
    loop.load_state_dict(state, restore_privacy_steps=False)  # ... and rewinds to its start
    loop.run(min(resolved.optimizer.steps, 3 * period))
    rows = torch.cat(seen)
    assert len(rows) == len(set(rows.tolist()))  # never a row twice, the cut period's rows included
    assert loop.tracker.epsilon() <= resolved.privacy.epsilon * (1 + 1e-9)


def test_the_door_refuses_a_query_above_the_trees_sensitivity():
    resolved, data, _ = _resolved("p1_o2nc_001")
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(0))
    period = built.loop.sampler.period
    built.loop.run(period)  # a whole period at the clips the noise was calibrated for
    # 001's node sensitivity is the difference step's 4dL/T; a period start's bound dL fits it (T+1)/2 times
    # over; three times the Lipschitz clip no longer does
    built.loop.estimator.start_clip *= 3
    with pytest.raises(PrivacyBudgetError, match="above"):
        built.loop.run(period + 1)


def test_the_twin_without_noise_and_the_private_run_share_the_schedule():
    private, _, _ = _resolved("p1_o2nc_001", rows=5000)
    twin, _, eps = _resolved("p1_o2nc_001", rows=5000, mechanism={"kind": "none"}, privacy=None)
    assert math.isinf(eps) and twin.optimizer.step_bound >= private.optimizer.step_bound
    # the run's event is J Gaussian node releases: the tree's depth over the period (an epoch of T steps)
    event = builders.planned_event(private, 4000, float(private.mechanism.noise_multiplier))
    assert event.count == private.sampling.period.bit_length()


@pytest.mark.parametrize("changes, message", [
    ({"sampling": {"kind": "poisson", "expected_batch_size": 8}}, "several leaves of one tree"),
    ({"sampling": {"kind": "fixed_size", "batch_size": 8}}, "several leaves of one tree"),
    ({"privacy": {"epsilon": 1.0, "neighboring": "add_remove", "accountant": "pld"}}, "fixed partition"),
    ({"optimizer": {"kind": "sgd", "lr": 0.1, "steps": 10}}, "o2nc and the estimators"),
    ({"mechanism": {"kind": "gaussian", "clip": 1.0}}, "released by tree_aggregation"),
    ({"optimizer": {"kind": "o2nc", "preset": "manual"}}, "preset: manual takes every setting"),
    ({"privacy": {"epsilon": 1.0, "delta": 1e-6, "neighboring": "replace_one", "noise": "secure"}}, "secure"),
    ({"estimator": {"coupling": "independent"}}, "Zhang et al. a difference evaluates both points on the same"),
])
def test_spec_rules_refuse_in_one_line(changes, message):
    data = specs.load_spec(f"{EXAMPLES}/p1_o2nc_001.yaml").model_dump(mode="json")
    for section, values in changes.items():
        data[section] = values if "kind" in values or section == "privacy" else {**data[section], **values}
    with pytest.raises(specs.SpecError) as refused:
        specs.spec_from_dict(data)
    # a spec that breaks several rules: its one line shows those that fit, every one is in problems
    assert any(re.search(message, problem) for problem in refused.value.problems), refused.value.problems


def test_too_few_rows_or_an_unreachable_target_names_the_rows_needed():
    with pytest.raises(ValueError, match=r"8 private rows are too few .*: \d+ rows\)"):
        _resolved("p1_o2nc_001", rows=10)
    with pytest.raises(ValueError, match=r"target_stationarity: 0.1 needs about \d+ private rows"):
        _resolved("p1_o2nc_001", rows=2000, optimizer={"target_stationarity": 0.1})
    # the multi-pass algorithm plans its schedule for the target; Theorem 4.1 then needs sqrt(Phi) L d^(3/4) /
    # (epsilon alpha^(1/2) beta^(3/2)) rows: 17 at beta = 0.5 on the example, 132 at beta = 0.125
    assert presets.multi_pass_rows_needed(2, 1.5, 1.6, 0.3, 0.125, 1.0) == 132
    with pytest.raises(ValueError, match=r"target_stationarity: 0.125 needs about 132 private rows by Theorem 4.1; "
                                         r"100 are too few"):
        _resolved("p1_o2nc_002_fo_multipass", rows=125, optimizer={"target_stationarity": 0.125})


def test_the_preset_matches_the_build_studys_worked_example():
    mu = presets.gdp_mu(1.0, 1e-6)
    assert abs(mu - 0.2367) < 1e-4
    s = presets.preset_001(10_000, 4, 1.5, 1.6, 0.05, mu)
    assert (s.window, s.steps // s.window, presets.tree_depth(s.period)) == (92, 54, 7)
    assert presets.node_sensitivity(s, 4) * math.sqrt(7) / mu == pytest.approx(2.92, abs=0.01)
    t = presets.preset_002(100_000, 4, 1.5, 1.6, 0.05, 1.0, 5e-7, coupled=True)
    assert (t.period, t.window, t.start_directions, t.directions) == (148, 55, 368, 288)
    # the paper's independent directions (Lemma 3.5): the study's m = 9.9e6 per row, and 5.8e5 at n = 10^4
    paper = presets.preset_002(100_000, 4, 1.5, 1.6, 0.05, 1.0, 5e-7, coupled=False)
    assert (paper.start_directions, paper.directions, paper.coupled) == (9_852_548, 9_852_548, False)
    assert presets.preset_002(10_000, 4, 1.5, 1.6, 0.05, 1.0, 5e-7, coupled=False).directions == 580_204
    # the first-order oracle (Theorem 6.1): the same schedule, m = log(8d/delta_0) alpha^2 / (D^2 d) ball points
    # at each point of a difference; the reference code's 1206 and 10308 at n = 2000 and 10^4 (study §3.5)
    for n, steps, period, m, clip in ((2000, 1000, 15, 1206, 0.7326), (10_000, 4994, 38, 10308, 0.2505)):
        f = presets.preset_002(n, 4, 1.5, 1.6, 0.05, 1.0, 5e-7, first_order=True)
        assert (f.steps, f.period, f.start_directions, f.directions) == (steps, period, 1, m)
        assert (f.start_clip, round(f.difference_clip, 4)) == (1.5, clip)


def test_theory_shape_sets_the_constants_the_theorems_hide():
    """preset theory_shape with no constants is preset theory; c_D and c_Sigma scale D and Sigma (T is then
    refitted to the pass), c_h and c_s the clips; the noise is calibrated on the clips they set."""
    theory, _, _ = _resolved("p1_o2nc_002", rows=2_500)
    same, _, _ = _resolved("p1_o2nc_002", rows=2_500, optimizer={"preset": "theory_shape"})
    assert same.model_dump(exclude={"optimizer": {"preset"}}) == theory.model_dump(exclude={"optimizer": {"preset"}})
    shaped, _, eps = _resolved("p1_o2nc_002", rows=2_500, optimizer={"preset": "theory_shape", "constants": {
        "c_D": 2.0, "c_Sigma": 0.5, "c_s": 0.5}})
    steps, d = shaped.optimizer.steps, 4
    bound = presets._002_step_bound(theory.optimizer.steps, d, 1.5, 1.6, 0.05, 1.0)
    assert theory.optimizer.step_bound == pytest.approx(bound)
    assert shaped.optimizer.step_bound > 1.5 * theory.optimizer.step_bound
    assert shaped.mechanism.difference_clip == pytest.approx(
        0.5 * math.sqrt(d) * 1.5 * 2 * shaped.optimizer.step_bound / 0.05 * 2)
    assert shaped.sampling.period < theory.sampling.period and eps <= 1.0 * (1 + 1e-9)
    multi, _, _ = _resolved("p1_o2nc_002_multipass", rows=300, optimizer={"preset": "theory_shape", "constants": {
        "c_T": 0.5}})
    assert multi.optimizer.steps < 300  # T = c_T Phi L^2 / (alpha^2 beta^3), cut to whole windows


@pytest.mark.parametrize("example, optimizer, message", [
    ("p1_o2nc_002", {"preset": "theory", "constants": {"c_D": 2.0}}, "only with preset theory_shape"),
    ("p1_o2nc_002", {"preset": "theory_shape", "constants": {"c_x": 2.0}}, "unknown 'c_x'"),
    ("p1_o2nc_002", {"preset": "theory_shape", "constants": {"c_T": 2.0}}, "allowed: c_D, c_Sigma, c_h, c_s"),
    ("p1_o2nc_002_multipass", {"preset": "theory_shape", "constants": {"c_Sigma": 2.0}}, "allowed: c_T, c_D"),
    ("p1_o2nc_001", {"preset": "theory_shape", "constants": {"c_D": 2.0}}, "the original algorithm's presets, which hide none"),
])
def test_theory_shape_refuses_constants_its_preset_does_not_have(example, optimizer, message):
    data = specs.load_spec(f"{EXAMPLES}/{example}.yaml").model_dump(mode="json")
    data["optimizer"] = {**data["optimizer"], **optimizer}
    with pytest.raises(specs.SpecError) as refused:
        specs.spec_from_dict(data)
    # a spec that breaks several rules: its one line shows those that fit, every one is in problems
    assert any(re.search(message, problem) for problem in refused.value.problems), refused.value.problems


@pytest.mark.parametrize("name", ["p1_o2nc_002_multipass", "p1_o2nc_002_fo_multipass"])
def test_the_multi_pass_run_is_accounted_as_its_restarts_and_differences(name):
    """002's multi-pass algorithm: every row in every step; ceil(T / Sigma) restart releases and the rest
    differences, two Gaussian classes whose stds keep the paper's ratio D sqrt(d Sigma) / alpha; the run's
    executed event is the planned one, and its PLD epsilon is the analytic Gaussian curve of the composition
    (mu^2 = P / z_1^2 + (T - P) / z_2^2, the replace-one multiplier being std over 2 clip / n)."""
    import dp_accounting
    from statistics import NormalDist

    resolved, data, eps = _resolved(name, rows=300)
    est, mech, opt = resolved.estimator, resolved.mechanism, resolved.optimizer
    n = len(data.private)
    assert est.period == math.ceil(0.3 / (opt.step_bound * math.sqrt(2))) and opt.window == int(0.3 / opt.step_bound)
    z1, z2 = float(mech.noise_multiplier), float(mech.difference_noise_multiplier)
    stds = (z1 * 2 * mech.clip / n, z2 * 2 * mech.difference_clip / n)
    assert stds[1] / stds[0] == pytest.approx(opt.step_bound * math.sqrt(2 * est.period) / 0.3, rel=1e-9)
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(0))
    built.loop.run(opt.steps)
    starts = -(-opt.steps // est.period)
    assert (built.loop.tracker.starts, built.loop.tracker.steps) == (starts, opt.steps)
    executed = built.loop.tracker.event()
    assert executed == builders.planned_event(resolved, n, z1)
    mu = math.sqrt(starts / z1 ** 2 + (opt.steps - starts) / z2 ** 2)
    cdf = NormalDist().cdf
    delta = cdf(-eps / mu + mu / 2) - math.exp(eps) * cdf(-eps / mu - mu / 2)
    assert delta == pytest.approx(float(resolved.privacy.delta), rel=1e-3)
    assert eps <= 1.0 and built.loop.tracker.epsilon() == pytest.approx(eps, rel=1e-9)
    # the release door checks each step's queries against its own class's sensitivity
    assert built.loop.mechanism.sensitivities == pytest.approx((2 * mech.clip / n, 2 * mech.difference_clip / n))


def test_the_poisson_multi_pass_run_is_accounted_as_subsampled_restarts_and_differences():
    """002's footnote 2: a Poisson batch a step, normalised by its expected size b, add/remove neighbours (one
    row moves a release by clip / b). Each restart and each difference is a Poisson-subsampled Gaussian of
    its own multiplier, the stds in the paper's ratio; the executed event is the composition of what ran,
    a whole run's is the planned one, and its RDP epsilon is what dp-accounting gives that composition."""
    import dp_accounting
    from dp_accounting import rdp

    resolved, data, eps = _resolved("p1_o2nc_002_poisson", rows=300, data={"declared_private_rows": 240},
                                    sampling={"kind": "poisson", "expected_batch_size": 30})
    est, mech, opt = resolved.estimator, resolved.mechanism, resolved.optimizer
    assert eps <= 1.0 and resolved.privacy.neighboring == "add_remove"
    z1, z2 = float(mech.noise_multiplier), float(mech.difference_noise_multiplier)
    stds = (z1 * mech.clip / 30, z2 * mech.difference_clip / 30)
    assert stds[1] / stds[0] == pytest.approx(opt.step_bound * math.sqrt(2 * est.period) / 0.3, rel=1e-9)
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(0),
                                sampling_generator=torch.Generator().manual_seed(1))
    assert built.loop.mechanism.sensitivities == pytest.approx((mech.clip / 30, mech.difference_clip / 30))
    steps = 2 * est.period + 3
    built.loop.run(steps)
    assert (built.loop.tracker.starts, built.loop.tracker.steps) == (3, steps)

    def subsampled(z, count):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(30 / 240, dp_accounting.GaussianDpEvent(z)), count)

    def parts(event):
        return [(e.count, e.event.sampling_probability, pytest.approx(e.event.event.noise_multiplier, rel=1e-12))
                for e in event.events]

    assert built.loop.tracker.event() == dp_accounting.ComposedDpEvent([subsampled(z1, 3), subsampled(z2, steps - 3)])
    starts = -(-opt.steps // est.period)
    planned = dp_accounting.ComposedDpEvent([subsampled(z1, starts), subsampled(z2, opt.steps - starts)])
    assert parts(planned) == parts(builders.planned_event(resolved, 240, z1))
    by_hand = rdp.RdpAccountant().compose(planned).get_epsilon(float(resolved.privacy.delta))
    assert eps == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize("changes, message", [
    ({"sampling": {"kind": "single_pass"}}, "scheduled_gaussian is the improved algorithm's multi-pass release"),
    ({"sampling": {"kind": "poisson", "expected_batch_size": 50}}, "replace_one is not accounted for poisson"),
    ({"mechanism": {"kind": "tree_aggregation"}}, "several leaves of one tree"),
    ({"optimizer": {"kind": "o2nc", "preset": "theory"}}, "planned for a target beta"),
    ({"mechanism": {"kind": "scheduled_gaussian", "noise_multiplier": 3.0}}, "give both multipliers"),
])
def test_multi_pass_spec_rules_refuse_in_one_line(changes, message):
    data = specs.load_spec(f"{EXAMPLES}/p1_o2nc_002_multipass.yaml").model_dump(mode="json")
    for section, values in changes.items():
        data[section] = values
    with pytest.raises(specs.SpecError) as refused:
        specs.spec_from_dict(data)
    # a spec that breaks several rules: its one line shows those that fit, every one is in problems
    assert any(re.search(message, problem) for problem in refused.value.problems), refused.value.problems

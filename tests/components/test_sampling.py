"""The three samplers (docs/design.md, "Privacy invariants" 3): each draws what its accounting assumes, from private
randomness, and the loop's accountant accounts for the sampler the loop draws from."""
import math

import dp_accounting
import pytest
import torch
from dp_accounting import pld, rdp
from scipy import stats

import specs
from components import builders
from components.data import FixedSizeSampler, FullBatchSampler, PoissonSampler, build_sampler
from components.randomness import private_generator

GAUSS = dp_accounting.GaussianDpEvent(1.3)


def test_fixed_size_sampler_draws_exactly_b_distinct_rows_uniformly():
    n, b, draws = 50, 10, 4000
    sampler = FixedSizeSampler(n, b, private_generator(7))
    counts = torch.zeros(n)
    pair = 0  # how often rows 0 and 1 are in the same batch
    for _ in range(draws):
        batch = sampler.sample()
        assert len(batch) == b and len(set(batch.tolist())) == b
        assert 0 <= int(batch.min()) and int(batch.max()) < n
        assert torch.equal(batch, batch.sort().values)
        counts[batch] += 1
        pair += int(0 in batch and 1 in batch)
    p = b / n
    # each row's inclusion count is Binomial(draws, p); their sum is fixed, hence n - 1 degrees of freedom
    chi2 = float(((counts - draws * p) ** 2).sum() / (draws * p * (1 - p)))
    assert stats.chi2.sf(chi2, n - 1) > 1e-4
    # without replacement, a pair is together with probability b(b-1)/(n(n-1)), not p^2
    together = b * (b - 1) / (n * (n - 1))
    assert abs(pair - draws * together) < 5 * math.sqrt(draws * together * (1 - together))


def test_fixed_size_selection_is_private_and_never_uses_the_global_generator():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    a, b = FixedSizeSampler(1000, 20, private_generator()), FixedSizeSampler(1000, 20, private_generator())
    assert not torch.equal(a.sample(), b.sample())  # OS entropy: two samplers differ
    c, d = FixedSizeSampler(1000, 20, private_generator(9)), FixedSizeSampler(1000, 20, private_generator(9))
    assert torch.equal(c.sample(), d.sample())  # an injected seed repeats (tests only)
    assert torch.equal(torch.get_rng_state(), before)
    for planning_only in (FixedSizeSampler(10, 3, None), PoissonSampler(10, 3, 10, None)):
        with pytest.raises(RuntimeError, match="without a private generator"):
            planning_only.sample()


def test_full_batch_takes_every_row_and_claims_no_amplification():
    sampler = FullBatchSampler(37)
    assert torch.equal(sampler.sample(), torch.arange(37))
    assert sampler.wrap(GAUSS) is GAUSS and sampler.rate == 1.0 and sampler.expected_batch_size == 37


def test_each_sampler_wraps_the_step_in_its_own_event():
    assert PoissonSampler(100, 10, 100, None).wrap(GAUSS) == dp_accounting.PoissonSampledDpEvent(0.1, GAUSS)
    assert FixedSizeSampler(100, 10, None).wrap(GAUSS) == dp_accounting.SampledWithoutReplacementDpEvent(100, 10, GAUSS)
    # all n of n rows is the full batch: no sampling event, whose bound would be looser than none
    assert FixedSizeSampler(100, 100, None).wrap(GAUSS) is GAUSS


@pytest.mark.parametrize("section,message", [
    ({"kind": "fixed_size", "batch_size": 11}, "sampling.batch_size: 11 must be between 1 and the 10 private rows"),
    ({"kind": "poisson", "expected_batch_size": 11}, "sampling.expected_batch_size: 11 must be between 1"),
])
def test_batch_sizes_are_checked_against_the_rows(section, message):
    neighboring = "replace_one" if section["kind"] == "fixed_size" else "add_remove"
    spec = specs.spec_from_dict(_spec(neighboring, section))
    with pytest.raises(ValueError, match=message):
        build_sampler(spec.sampling, 10)


def _spec(neighboring, sampling=None, accountant="rdp", **over):
    from tests.conftest import TINY
    import copy

    d = copy.deepcopy(TINY)
    d["privacy"].update(neighboring=neighboring, accountant=accountant)
    d["sampling"] = sampling or {"kind": "poisson", "expected_batch_size": 64}
    if neighboring == "replace_one":  # these specs are planned for made-up private counts, public under replace-one
        d["data"].pop("declared_private_rows")
    d.update(over)
    return d


def test_spec_rules_for_sampling_and_neighbouring():
    with pytest.raises(ValueError, match="privacy.neighboring: sampling.kind fixed_size is accounted under "
                                         "replace_one only"):
        specs.spec_from_dict(_spec("add_remove", {"kind": "fixed_size", "batch_size": 64}))
    with pytest.raises(ValueError, match="privacy.accountant: pld has no accounting for sampling without replacement"):
        specs.spec_from_dict(_spec("replace_one", {"kind": "fixed_size", "batch_size": 64}, accountant="pld"))
    with pytest.raises(ValueError, match="replace_one is not accounted for poisson sampling"):
        specs.spec_from_dict(_spec("replace_one"))
    for accountant in ("rdp", "pld"):
        specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, accountant))
    # add/remove changes the number of rows a full-batch step divides by: refused
    with pytest.raises(ValueError, match="privacy.neighboring: sampling.kind full_batch divides by the number of "
                                         "private rows"):
        specs.spec_from_dict(_spec("add_remove", {"kind": "full_batch"}))
    with pytest.raises(specs.SpecError, match="sampling.kind: unknown kind 'shuffle'; allowed: 'poisson', "
                                              "'fixed_size', 'full_batch'"):
        specs.spec_from_dict(_spec("add_remove", {"kind": "shuffle"}))
    with pytest.raises(specs.SpecError, match="sampling.batch_size: unknown key; allowed keys here: kind"):
        specs.spec_from_dict(_spec("add_remove", {"kind": "full_batch", "batch_size": 3}))


def test_planned_steps_follow_the_rows_per_step():
    epochs = {"kind": "sgd", "lr": 0.1, "epochs": 3}
    full = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, optimizer=epochs))
    fixed = specs.spec_from_dict(_spec("replace_one", {"kind": "fixed_size", "batch_size": 64}, optimizer=epochs))
    assert full.planned_steps(1383) == 3
    assert fixed.planned_steps(1383) == math.ceil(3 * 1383 / 64)


def _analytic_gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of a Gaussian mechanism with sensitivity / std = mu (Balle and Wang 2018, Theorem 8)."""
    phi = stats.norm.cdf
    return float(phi(-eps / mu + mu / 2) - math.exp(eps) * phi(-eps / mu - mu / 2))


def test_full_batch_epsilon_is_that_of_one_gaussian_of_sigma_over_root_t():
    """T full-batch Gaussian steps of multiplier sigma are exactly one Gaussian of multiplier sigma/sqrt(T);
    PLD's epsilon must match the analytic Gaussian mechanism's, which is computed here independently."""
    sigma, steps, delta = 8.0, 25, 1e-5
    spec = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, accountant="pld",
                                      optimizer={"kind": "sgd", "lr": 0.1, "steps": steps}))
    eps = builders.accountant(spec).epsilon(builders.planned_event(spec, 1000, sigma), delta)
    mu = math.sqrt(steps) / sigma
    assert _analytic_gaussian_delta(eps, mu) == pytest.approx(delta, rel=0.02)
    # RDP is an upper bound on the exact value
    rdp_spec = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"},
                                          optimizer={"kind": "sgd", "lr": 0.1, "steps": steps}))
    assert builders.accountant(rdp_spec).epsilon(builders.planned_event(rdp_spec, 1000, sigma), delta) >= eps


def test_fixed_size_epsilon_and_calibration_equal_independent_dp_accounting():
    d = _spec("replace_one", {"kind": "fixed_size", "batch_size": 64}, optimizer={"kind": "sgd", "lr": 0.1, "steps": 300})
    spec = specs.spec_from_dict(d)
    n = 1383
    resolved, rate, eps = builders.resolve_privacy(spec, n)
    sigma = float(resolved.mechanism.noise_multiplier)
    independent = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE).compose(
        dp_accounting.SampledWithoutReplacementDpEvent(n, 64, dp_accounting.GaussianDpEvent(sigma)), 300
    ).get_epsilon(1 / n)
    assert rate == 64 / n
    assert eps == pytest.approx(independent, rel=1e-12) and eps <= 2.0
    assert independent > 2.0 * 0.97  # calibrated tightly, not just below
    with pytest.raises(Exception):  # PLD has no sampling without replacement: never silently accounted
        pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE).compose(
            dp_accounting.SampledWithoutReplacementDpEvent(n, 64, GAUSS))


@pytest.mark.parametrize("sampling,neighboring", [
    ({"kind": "fixed_size", "batch_size": 40}, "replace_one"),
    ({"kind": "full_batch"}, "replace_one"),
    ({"kind": "poisson", "expected_batch_size": 40}, "add_remove"),
])
def test_the_loop_draws_what_its_accountant_accounts_for(tiny_spec_dict, sampling, neighboring):
    tiny_spec_dict["sampling"] = sampling
    tiny_spec_dict["privacy"]["neighboring"] = neighboring
    tiny_spec_dict["optimizer"]["steps"] = 6
    spec = specs.spec_from_dict(tiny_spec_dict)
    data = builders.load_data(spec)
    n = len(data.private)
    resolved, _, planned = builders.resolve_privacy(spec, n)
    built = builders.build_loop(resolved, data, noise_generator=private_generator(1),
                                sampling_generator=private_generator(2))
    loop = built.loop
    sizes, normalisers = [], []
    query = loop.backend.query

    def recording(q, indices, clip):
        sizes.append(len(indices))
        return query(q, indices, clip)

    loop.backend.query = recording
    step = loop.estimator.step

    def seeing(ctx):
        normalisers.append(ctx.batch_normaliser)
        return step(ctx)

    loop.estimator.step = seeing
    loop.run(6)
    expected_rows = {"fixed_size": 40, "full_batch": n}.get(sampling["kind"])
    if expected_rows is not None:
        assert set(sizes) == {expected_rows}
    assert set(normalisers) == {float(resolved.batch_size(n))}
    assert type(loop.sampler) is type(build_sampler(resolved.sampling, n))
    sigma = float(resolved.mechanism.noise_multiplier)
    assert loop.tracker.step_event == loop.sampler.wrap(dp_accounting.GaussianDpEvent(sigma))
    # the executed run is the planned one
    assert loop.tracker.event() == builders.planned_event(resolved, n, sigma)
    assert loop.tracker.epsilon() == pytest.approx(planned, rel=1e-12)
    assert loop.mechanism.sensitivity == resolved.mechanism.clip * (2 if neighboring == "replace_one" else 1)


def test_pld_under_replace_one_counts_privzos_noise_in_full():
    """privzo's multiplier is std / (2C) under replace-one. dp-accounting's PLD measures REPLACE_ONE noise
    against C; the accountant translates, so a full-batch Gaussian costs the same epsilon under either
    relation (its sensitivity is already in the multiplier), exactly as RDP says it does."""
    from components.accountants import Accountant

    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(3.0), 40)
    replace, add = Accountant("pld", "replace_one"), Accountant("pld", "add_remove")
    assert replace.epsilon(event, 1e-6) == pytest.approx(add.epsilon(event, 1e-6), rel=1e-9)
    assert _analytic_gaussian_delta(replace.epsilon(event, 1e-6), math.sqrt(40) / 3.0) == pytest.approx(1e-6, rel=0.02)
    assert replace.epsilon(event, 1e-6) <= Accountant("rdp", "replace_one").epsilon(event, 1e-6)
    sigma = replace.calibrate(lambda s: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), 40),
                              1.0, 1e-6)
    assert 0.97 < replace.epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), 40),
                                  1e-6) <= 1.0
    poisson = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
    assert not replace.supports(poisson)  # no exact translation: refused, never under-counted
    with pytest.raises(ValueError, match="pld accountant under replace_one: no exact accounting for "
                                         "PoissonSampledDpEvent; use accountant: rdp"):
        replace.epsilon(poisson, 1e-6)


def test_the_report_says_what_was_drawn():
    """A full-batch run draws no batches: its report does not claim a secret selection."""
    from flows.record.reporting import privacy_report, summarize

    for sampling, neighboring, said in (
            ({"kind": "full_batch"}, "replace_one", "Every private row is in every step"),
            ({"kind": "poisson", "expected_batch_size": 64}, "add_remove", "DP noise and batch membership were")):
        spec = specs.spec_from_dict(_spec(neighboring, sampling))
        resolved, _, eps = builders.resolve_privacy(spec, 1000)
        sampler = builders.spec_sampler(resolved, 1000)
        report = privacy_report(summarize(resolved, eps, 60, sampler, 2), {})
        assert said in report and sampler.describe() in report

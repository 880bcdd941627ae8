"""The zcdp accountant: rho composes by addition, epsilon is a valid and tight-enough conversion, and
events without an exact zCDP bound are refused, never approximated."""
import math

import dp_accounting
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import specs
from components import builders
from components.accountants import Accountant, PrivacyTracker, ZCdpAccountant
from flows.record.reporting import privacy_report, shown, summarize
from flows.record.tracking import dp_tags
from scipy import stats

from tests.components.test_sampling import _spec
from flows.record.tracking_names import DP_ZCDP_RHO

G = dp_accounting.GaussianDpEvent


def _analytic_gaussian_delta(eps: float, mu: float) -> float:
    """delta(eps) of a Gaussian mechanism with sensitivity / std = mu (Balle and Wang 2018, Theorem 8), the
    second term in log space so that large eps does not overflow."""
    return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps + stats.norm.logcdf(-eps / mu - mu / 2)))


def test_rho_of_gaussian_steps_adds_up_under_composition():
    zcdp = Accountant("zcdp", "replace_one")
    assert zcdp.rho(dp_accounting.SelfComposedDpEvent(G(8.0), 25)) == pytest.approx(25 / (2 * 64))
    mixed = dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(G(2.0), 3), G(4.0), dp_accounting.ZCDpEvent(0.05),
        dp_accounting.NoOpDpEvent()])
    assert zcdp.rho(mixed) == pytest.approx(3 / 8 + 1 / 32 + 0.05)
    acc = ZCdpAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE).compose(G(2.0), 3).compose(G(4.0))
    assert acc.rho == pytest.approx(3 / 8 + 1 / 32)
    assert zcdp.rho(dp_accounting.NonPrivateDpEvent()) == math.inf
    assert zcdp.epsilon(dp_accounting.NonPrivateDpEvent(), 1e-5) == math.inf
    assert zcdp.epsilon(dp_accounting.NoOpDpEvent(), 1e-5) == 0.0
    assert Accountant("rdp", "replace_one").rho(G(1.0)) is None  # only the zcdp accountant reports rho
    assert zcdp.epsilon(G(1e-170), 1e-5) == math.inf  # sigma^2 underflows: no noise, not a crash


@settings(max_examples=40, deadline=None)
@given(sigma=st.floats(0.5, 60.0), steps=st.integers(1, 2000), delta=st.floats(1e-9, 1e-3),
       relation=st.sampled_from(["add_remove", "replace_one"]))
def test_epsilon_lies_between_the_exact_gaussian_and_the_bun_steinke_bound(sigma, steps, delta, relation):
    """T unsampled Gaussian steps of multiplier sigma are exactly one Gaussian of multiplier sigma/sqrt(T)
    and rho = T/(2 sigma^2). The reported epsilon must be valid (the exact mechanism's delta at it is at
    most the target, from Balle and Wang's formula computed here), no looser than Bun and Steinke's
    rho + 2 sqrt(rho ln(1/delta)), and no looser than the rdp accountant's for the same steps."""
    rho = steps / (2 * sigma ** 2)
    assume(rho <= 100)  # epsilon up to about 150: beyond any budget a run would be given
    event = dp_accounting.SelfComposedDpEvent(G(sigma), steps)
    zcdp = Accountant("zcdp", relation)
    eps = zcdp.epsilon(event, delta)
    assert zcdp.rho(event) == pytest.approx(rho, rel=1e-12)
    assert _analytic_gaussian_delta(eps, math.sqrt(steps) / sigma) <= delta * (1 + 1e-6)
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-9
    rdp_eps = Accountant("rdp", relation).epsilon(event, delta)
    assert eps <= rdp_eps * (1 + 1e-12)


@pytest.mark.parametrize("event", [
    dp_accounting.PoissonSampledDpEvent(0.05, G(1.0)),
    dp_accounting.SampledWithoutReplacementDpEvent(1000, 64, G(3.0)),
    dp_accounting.SingleEpochTreeAggregationDpEvent(2.0, 16),
    dp_accounting.ComposedDpEvent([G(1.0), dp_accounting.PoissonSampledDpEvent(0.05, G(1.0))]),
    dp_accounting.ComposedDpEvent([G(1.0), dp_accounting.ZCDpEvent(-0.5)]),  # would cancel the Gaussian's rho
    dp_accounting.ZCDpEvent(float("nan")),
])
def test_events_without_an_exact_zcdp_bound_are_refused(event):
    zcdp = Accountant("zcdp", "replace_one")
    assert not zcdp.supports(event)
    with pytest.raises(ValueError, match=r"^zcdp accountant cannot account for .*DpEvent"):
        zcdp.epsilon(event, 1e-5)
    with pytest.raises(ValueError, match=r"^zcdp accountant cannot account for"):
        zcdp.rho(event)


def test_spec_takes_zcdp_for_full_batch_only():
    full = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, accountant="zcdp"))
    assert full.privacy.accountant == "zcdp"
    with pytest.raises(specs.SpecError, match=r"^privacy.accountant: zcdp has no bound for Poisson-subsampled steps; "
                                              r"use rdp or pld, or sampling.kind: full_batch"):
        specs.spec_from_dict(_spec("add_remove", {"kind": "poisson", "expected_batch_size": 64}, accountant="zcdp"))
    with pytest.raises(specs.SpecError, match=r"privacy.accountant: zcdp has no accounting for sampling without "
                                              r"replacement \(sampling.kind fixed_size\); use accountant: rdp"):
        specs.spec_from_dict(_spec("replace_one", {"kind": "fixed_size", "batch_size": 64}, accountant="zcdp"))
    with pytest.raises(specs.SpecError, match=r"privacy.accountant: unknown value 'gdp'|privacy.accountant: .*'zcdp'"):
        specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, accountant="gdp"))


def test_calibration_meets_the_target_and_matches_rdp_for_full_batch():
    """For unsampled Gaussian steps the RDP curve is exactly linear (zCDP), so both calibrate alike (zcdp's
    finer grid of orders can only lower sigma)."""
    steps_spec = {"kind": "sgd", "lr": 0.1, "steps": 100}
    zspec = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, accountant="zcdp", optimizer=steps_spec))
    rspec = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, optimizer=steps_spec))
    sigma = builders.calibrate_noise(zspec, 1383)
    assert builders.calibrate_noise(rspec, 1383) * 0.97 <= sigma <= builders.calibrate_noise(rspec, 1383)
    delta = zspec.delta_for(1383)
    assert builders.accountant(zspec).epsilon(builders.planned_event(zspec, 1383, sigma), delta) <= zspec.privacy.epsilon


def test_report_and_tags_state_rho_for_a_zcdp_run():
    spec = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"}, accountant="zcdp",
                                      optimizer={"kind": "sgd", "lr": 0.1, "steps": 30}))
    resolved, _, _ = builders.resolve_privacy(spec, 1000)
    sigma = float(resolved.mechanism.noise_multiplier)
    tracker = PrivacyTracker(builders.accountant(resolved), G(sigma), float(resolved.privacy.delta))
    for _ in range(30):
        tracker.record_step()
    rho = tracker.rho()
    assert rho == pytest.approx(30 / (2 * sigma ** 2))
    sampler = builders.spec_sampler(resolved, 1000)
    summary = summarize(resolved, tracker.epsilon(), 30, sampler, 2, rho=rho)
    report = privacy_report(summary, {})
    assert f"| zCDP rho spent | {shown(rho, 6)} |" in report and float(shown(rho, 6)) >= rho  # never understated
    assert (f"-DP for replacement of one example of digits; the number of private rows (1000) is the same for "
            f"every such neighbour, and the run uses and releases it. It is {shown(rho)}-zCDP, which implies that.") in report
    assert dp_tags(summary, "ab" * 32)[DP_ZCDP_RHO] == shown(rho, 6)
    # other accountants carry no rho
    rdp_spec = specs.spec_from_dict(_spec("replace_one", {"kind": "full_batch"},
                                          optimizer={"kind": "sgd", "lr": 0.1, "steps": 30}))
    plain = summarize(builders.resolve_privacy(rdp_spec, 1000)[0], 1.0, 30, sampler, 2)
    assert "zCDP" not in privacy_report(plain, {}) and DP_ZCDP_RHO not in dp_tags(plain, "ab" * 32)

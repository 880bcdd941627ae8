"""The nonsmooth family: O2NC with zeroth- or first-order oracles (Zhang et al., "Private Zeroth-Order
Nonsmooth Nonconvex Optimization"; Kornowski et al., "Improved Sample Complexity for Private Nonsmooth
Nonconvex Optimization"). One pass released by tree aggregation (or one Gaussian per row), or the improved
algorithm's multi-pass schedule released by scheduled Gaussians; its presets plan every setting from the
theorems."""
from __future__ import annotations

import math
from typing import List, Optional

from components.families.nonsmooth import plan
from components.accountants import ScheduledTracker, TreeTracker
from components.mechanisms.scheduled import ScheduledGaussian
from components.mechanisms.tree import TreeAggregation
from components.estimators.spider import FoSpiderEstimator, ZoNaiveEstimator, ZoSpiderEstimator
from components.registry import ESTIMATORS, MECHANISMS, Assembly, mark_seeded


class NonsmoothFamily:
    name = "nonsmooth"
    needs_dimension = True

    def resolve(self, spec, n_private: Optional[int], dimension: Optional[int]):
        return plan.resolve_o2nc(spec, n_private, dimension)

    def planned_event(self, spec, n_private: Optional[int], sigma: float):
        return plan.planned_event(spec, n_private, sigma)

    def describe_plan(self, resolved, n: int, dimension: Optional[int] = None) -> List[str]:
        """What the preset derived: O2NC's schedule, the oracle's directions, the batches (``privzo calibrate``)."""
        opt, sampling, est, mech = resolved.optimizer, resolved.sampling, resolved.estimator, resolved.mechanism
        lines = [f"o2nc ({opt.preset}):             {opt.steps} steps, windows of {opt.window}, step bound D = "
                 f"{opt.step_bound:.6g}, lr = {opt.lr:.6g}, restart {opt.restart}"]
        if est.kind == "zo_spider" and est.variant == "improved":
            lines.append(f"directions:               {est.start_directions} per row at a start, {est.directions} at "
                         "each " + ("point of a difference, shared by both (coupled: a deviation from the paper, "
                                    "which draws them independently)" if est.coupling == "coupled" else
                                    "of a difference's two points, independent (Kornowski et al.)"))
        if sampling.kind == "single_pass":
            lines.append(f"single pass:              {sampling.start_batch} rows at the start of each period of "
                         f"{sampling.period} steps, {sampling.step_batch} at the others")
        else:
            rows = ("every row in every step" if sampling.kind == "full_batch" else
                    f"a Poisson batch of {sampling.expected_batch_size} rows expected each step")
            noise = (f" (noise multipliers {float(mech.noise_multiplier):.6g} at a restart, "
                     f"{float(mech.difference_noise_multiplier):.6g} for a difference)"
                     if mech.kind == "scheduled_gaussian" else "")
            lines.append(f"{sampling.kind.replace('_', ' ')}, multi-pass:".ljust(26)
                         + f"{rows}, a restart every {est.period} steps{noise}")
        return lines


FAMILY = NonsmoothFamily()


@MECHANISMS.register("tree_aggregation")
def _tree_aggregation(spec, parts: Assembly):
    """One pass: the SPIDER increments' running sums released by tree aggregation, a tree per period."""
    z = float(spec.mechanism.noise_multiplier)
    mechanism = TreeAggregation(spec.sampling.period, z, plan.node_sensitivity(spec, parts.directions.dim),
                                parts.noise_generator)
    mark_seeded(mechanism, parts)
    return mechanism, TreeTracker(parts.accountant, z, spec.sampling.period, parts.delta)


@MECHANISMS.register("scheduled_gaussian")
def _scheduled_gaussian(spec, parts: Assembly):
    """Multi-pass: a restart's and a difference's Gaussians, each on its own batch, on the estimator's period."""
    mech, period = spec.mechanism, parts.estimator.period
    mechanism = ScheduledGaussian(period, (float(mech.noise_multiplier), float(mech.difference_noise_multiplier)),
                                  plan.scheduled_sensitivities(spec, parts.n_private), parts.noise_generator,
                                  plan.neighbour_factor(spec))
    mark_seeded(mechanism, parts)
    tracker = ScheduledTracker(parts.accountant, mechanism.multipliers, period, parts.delta, parts.sampler.wrap)
    tracker.is_start = lambda: mechanism.at_boundary
    return mechanism, tracker


@ESTIMATORS.register("zo_spider", "fo_spider")
def _spider(spec, dimension: Optional[int] = None):
    """O2NC's SPIDER oracles; their clips bound the released increments (the non-private twin takes none:
    the preset's clips then only bound the coefficient of the original algorithm's difference)."""
    est, mech = spec.estimator, spec.mechanism
    if mech.kind in ("tree_aggregation", "scheduled_gaussian"):
        clip, difference_clip = mech.clip, mech.difference_clip
    else:
        clip = difference_clip = math.inf
    keyed = spec.sampling.kind == "poisson"  # add/remove: an added row may shift no other row's directions
    if est.kind == "fo_spider":
        return FoSpiderEstimator(est.radius, dimension, plan.spider_period(spec), est.perturbations, clip,
                                 difference_clip, spec.optimizer.step_bound, est.start_perturbations, keyed)
    return ZoSpiderEstimator(est.variant, est.radius, dimension, plan.spider_period(spec), est.start_directions,
                             est.directions, clip, difference_clip, spec.optimizer.step_bound, keyed,
                             est.coupling == "coupled")


@ESTIMATORS.register("zo_naive")
def _zo_naive(spec, dimension: Optional[int] = None):
    clip = spec.mechanism.clip if spec.mechanism.kind == "gaussian" else math.inf
    return ZoNaiveEstimator(spec.estimator.radius, dimension, spec.estimator.directions, clip)

"""The KL family (Menart et al., "Differentially Private Non-Convex Optimization under the KL Condition
with Optimal Rates"): full-batch first order, its releases planned from the budget by a preset (plan.py),
released by planned or filtered Gaussians, on the paper's problems (problems.py) with its optimizers
(optimizers.py)."""
from __future__ import annotations

from typing import List, Optional

from components.families.kl import optimizers  # noqa: F401 (registers the KL optimizers' builder)
from components.accountants import FilterTracker
from components.families.kl import plan
from components.mechanisms.full_batch import FullBatchGaussian
from components.registry import MECHANISMS, Assembly, mark_seeded


class KlFamily:
    name = "kl"
    needs_dimension = True

    def resolve(self, spec, n_private: Optional[int], dimension: Optional[int]):
        return plan.resolve_kl(spec, n_private, dimension)

    def planned_event(self, spec, n_private: Optional[int], sigma: float):
        """Its plan's, or its filter's budget (sigma: the one Gaussian it equals)."""
        return plan.planned_event(spec, spec.public_rows(n_private), sigma)

    def describe_plan(self, resolved, n: int, dimension: int) -> List[str]:
        """What the preset derived, and what the run is charged whatever it executes (``privzo calibrate``)."""
        z = float(resolved.mechanism.noise_multiplier)
        run_plan = plan.plan_for(resolved, n, dimension, z)
        rho = plan.rho_of(z)
        if isinstance(run_plan, plan.KlSpiderPlan):
            return [f"kl_spider ({resolved.optimizer.preset}): {run_plan.phases} phases, at most {run_plan.releases} "
                    f"releases ({run_plan.phases} full gradients, {run_plan.releases - run_plan.phases} differences), "
                    f"up to {max(run_plan.lengths)} steps a phase; target floor {run_plan.floor:.4g} (the predicted "
                    "excess risk)",
                    f"noise:                    the paper's stds x {run_plan.noise_scale:.6g} (its printed stds cost "
                    f"{run_plan.noise_scale ** 2:.4g} rho): the plan costs exactly rho = {rho:.6g}, charged whether or "
                    "not phases stop early"]
        if isinstance(run_plan, plan.ProximalPlan):
            return [f"proximal_point ({resolved.optimizer.preset}): {run_plan.outer} outer steps x "
                    f"{run_plan.inner - 1} inner noisy GD steps = {run_plan.releases} releases, projection radius "
                    f"{run_plan.radius:.4g}; predicted excess {run_plan.predicted:.4g}",
                    f"noise:                    std {run_plan.std:.6g} a release: the plan costs exactly rho = {rho:.6g}"]
        return [f"adaptive_noisy_gd:        eta {run_plan.lr:.6g}, at most {run_plan.max_steps} steps; a step starts "
                f"while the realised spend is <= {run_plan.threshold:.6g} of the filter's {run_plan.budget:.6g}"
                + (f"; the selection takes {run_plan.selection_rho:.6g}" if run_plan.selection_rho else ""),
                f"charged:                  the filter's budget, rho = {rho:.6g}, whatever the run spends"]


FAMILY = KlFamily()


@MECHANISMS.register("planned_gaussian", "adaptive_gaussian")
def _kl_gaussian(spec, parts: Assembly):
    """Full-batch Gaussians under a privacy filter over the optimizer's plan: the run is charged the plan's
    (or the filter's) budget, whatever it releases."""
    z = float(spec.mechanism.noise_multiplier)
    run_plan = parts.optimizer.plan
    adaptive = isinstance(run_plan, plan.AdaptivePlan)
    mechanism = FullBatchGaussian(float(spec.mechanism.clip), spec.public_rows(parts.n_private), z,
                                  parts.noise_generator)
    mark_seeded(mechanism, parts)
    budget = run_plan.budget + run_plan.selection_rho if adaptive else plan.rho_of(z)
    tracker = FilterTracker(parts.accountant, plan.charged_event(spec, z), budget, parts.delta,
                            threshold=run_plan.threshold if adaptive else None,
                            step_cost_bound=plan.step_cost_bound(run_plan))
    return mechanism, tracker

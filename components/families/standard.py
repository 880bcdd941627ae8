"""The standard family: the private loop's mini-batch estimators (DPZero, PAZO-M/P/S, DP-SGD, GEP, DOPE-SGD,
PDA-DPMD) with sgd or adam; one Gaussian release a step, amplified by the sampler, composed over the
planned steps, sigma calibrated by dp-accounting."""
from __future__ import annotations

import math
from typing import List, Optional

import dp_accounting

from components.families.common import accountant, calibrate_sigma, spec_sampler


class StandardFamily:
    name = "standard"
    needs_dimension = False

    def describe_plan(self, resolved, n: int, dimension=None) -> List[str]:
        """Nothing beyond the common lines (sigma, steps, rate, epsilon): no preset derives its settings."""
        return []

    def planned_event(self, spec, n_private: Optional[int], sigma: float):
        """The sampler's event of Gaussian(sigma), composed over the planned steps."""
        step = spec_sampler(spec, n_private).wrap(dp_accounting.GaussianDpEvent(sigma))
        return dp_accounting.SelfComposedDpEvent(step, spec.planned_steps(n_private))

    def resolve(self, spec, n_private: Optional[int] = None, dimension: Optional[int] = None):
        """sigma 'auto' is calibrated; an explicit sigma must meet the target epsilon; mechanism none
        resolves to a non-private run (epsilon = inf)."""
        rate = spec_sampler(spec, n_private).rate  # also checks the batch size against the rows
        if spec.mechanism.kind == "none":
            return spec.resolved(n_private=n_private, noise_multiplier=None), rate, math.inf
        sigma = spec.mechanism.noise_multiplier
        sigma = calibrate_sigma(spec, n_private, self.planned_event) if sigma == "auto" else float(sigma)
        resolved = spec.resolved(n_private=n_private, noise_multiplier=sigma)
        eps = accountant(resolved).epsilon(self.planned_event(resolved, n_private, sigma),
                                           float(resolved.privacy.delta))
        if eps > resolved.privacy.epsilon * (1 + 1e-9):
            raise ValueError(f"mechanism.noise_multiplier: {sigma} gives epsilon {eps:.4g} > privacy.epsilon "
                             f"{resolved.privacy.epsilon}; use noise_multiplier: auto or raise it")
        return resolved, rate, eps


FAMILY = StandardFamily()


class TunedFamily(StandardFamily):
    """A private search (``tune``, on the private rows): each candidate planned as the standard family plans
    it, at one sigma for all; the whole the best of K of them (components/tuning.py), calibrated so that the
    released winner, the selection included, meets privacy.epsilon."""

    def candidate_event(self, spec, n_private: Optional[int], sigma: float):
        return StandardFamily.planned_event(self, spec, n_private, sigma)

    def planned_event(self, spec, n_private: Optional[int], sigma: float):
        from components.tuning import selection_event

        return selection_event(spec.tune, self.candidate_event(spec, n_private, sigma))

    def resolve(self, spec, n_private: Optional[int] = None, dimension: Optional[int] = None):
        from components.tuning import same_event_problem

        problem = same_event_problem(spec, self.candidate_event, n_private)
        if problem:
            raise ValueError(problem)
        return super().resolve(spec, n_private, dimension)

    def describe_plan(self, resolved, n: int, dimension=None) -> List[str]:
        from components.tuning import plan_lines

        sigma, delta = float(resolved.mechanism.noise_multiplier), float(resolved.privacy.delta)
        one = accountant(resolved).epsilon(self.candidate_event(resolved, n, sigma), delta)
        total = accountant(resolved).epsilon(self.planned_event(resolved, n, sigma), delta)
        return plan_lines(resolved.tune, one, total, delta)


TUNED = TunedFamily()

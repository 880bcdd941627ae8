"""DPZero's two-point zeroth-order estimator (DPZero, Algorithm 2, mini-batch form of §B.2).

Per step and per query j, with a public direction u_j (from the run's seed):
    a_ij = (f(x + lambda u_j; xi_i) - f(x - lambda u_j; xi_i)) / (2 lambda)    per private example i
    s_j  = sum_i clip_C(a_ij)                                                  (on the worker)
    s~_j = s_j + N(0, q sigma^2 Delta^2)                                        (mechanism, on the driver)
    update = -lr * (1/q) sum_j (s~_j / b) u_j                                   (b = expected batch size)
With mechanism noise 0 and no clipping this is MeZO. The only private output per step is s~.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

import torch
from torch import nn

from components.estimators.directions import Directions, perturbed
from components.randomness import STREAM_DIRECTION, public_seed


@dataclass(frozen=True)
class StepPlan:
    """The public part of a step: which directions are queried."""

    step: int
    seeds: Tuple[int, ...]


@dataclass(frozen=True)
class ZoUpdate:
    """A zeroth-order update: x <- x - lr * sum_k coefficient_k * u(seed_k)."""

    terms: Tuple[Tuple[int, float], ...]


LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class TwoPointEstimator:
    def __init__(self, queries: int = 1, smoothing: float = 1e-3):
        if queries < 1 or smoothing <= 0:
            raise ValueError("two_point: queries must be >= 1 and smoothing > 0")
        self.queries = queries
        self.smoothing = smoothing

    @property
    def queries_per_step(self) -> int:
        return self.queries

    def plan(self, step: int, seed: int) -> StepPlan:
        return StepPlan(step, tuple(public_seed(seed, STREAM_DIRECTION, step, j) for j in range(self.queries)))

    @torch.inference_mode()
    def private_values(
        self, model: nn.Module, directions: Directions, loss: LossFn, x: torch.Tensor, y: torch.Tensor, plan: StepPlan
    ) -> torch.Tensor:
        """Per-example finite differences a_ij, shape [q, b]. Runs where the private rows are."""
        rows = []
        lam = self.smoothing
        for seed in plan.seeds:
            with perturbed(model, directions, seed, +lam):
                plus = loss(model, x, y)
            with perturbed(model, directions, seed, -lam):
                minus = loss(model, x, y)
            rows.append((plus.double() - minus.double()) / (2 * lam))
        if not rows:
            return torch.zeros(0, len(y), dtype=torch.float64)
        return torch.stack(rows)

    def combine(self, noisy_sums: torch.Tensor, plan: StepPlan, batch_normaliser: float) -> ZoUpdate:
        """Post-processing of the released sums into the update (no private data here)."""
        coeffs = noisy_sums.double() / (batch_normaliser * self.queries)
        return ZoUpdate(tuple((seed, float(c)) for seed, c in zip(plan.seeds, coeffs)))

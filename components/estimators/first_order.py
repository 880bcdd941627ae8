"""DP-SGD (Abadi et al. 2016), the first-order baseline the zeroth-order estimators are measured against.

Per step, on one Poisson batch:
    g_i = grad f(x; xi_i)                                   per private example i (backprop)
    s~  = sum_i g_i * min(1, C / ||g_i||) + N(0, sigma^2 Delta^2 I_d)      (released, d-dimensional)
    update = s~ / b                                         (b = expected batch size)
One Gaussian query of L2 sensitivity Delta per step, so the step's event is the same Poisson-sampled
Gaussian as every other estimator's and the accounting is shared.
"""
from __future__ import annotations

from typing import Tuple

from components.queries import PerExampleGradients, Update
from components.registry import ESTIMATORS


class FirstOrderEstimator:
    name = "first_order"

    @property
    def queries_per_step(self) -> int:
        return 1

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return ()  # no random directions

    def step(self, ctx) -> Update:
        noisy = ctx.release(PerExampleGradients())
        return Update(dense=((tuple(noisy), 1.0 / ctx.batch_normaliser),))


@ESTIMATORS.register("first_order")
def _first_order(spec, dimension=None):
    return FirstOrderEstimator()

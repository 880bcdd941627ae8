"""Two first-order baselines guided by public data, from the PAZO paper's FO+PUB rows (beside GEP).

Both take one public gradient a step, p = the mean loss gradient of b' public rows (backprop; drawn afresh
each step from the run's public seed), and release exactly DP-SGD's query: one clipped per-example
gradient sum with d-dimensional Gaussian noise, sensitivity C (2C under replace-one). What they do with p
is post-processing of a public value and a released one, so their accounting is DP-SGD's.

DOPE-SGD (Nasr, Mahloujifar, Tang, Mittal and Houmansadr, ICLR 2023), its gradient step: the clip ball is
moved from the origin to the public gradient,

    s~     = sum_i clip(g_i - p, C) + N(0, sigma^2 Delta^2 I_d)
    update = s~ / b + p

so a private gradient close to the public one is clipped little. The paper's other two parts (synthetic
data from generative models trained on the public rows, and averaging intermediate models) are training
recipes around the step, not the step, and are not part of this estimator.

PDA-DPMD (Amid, Ganesh, Mathews, Ramaswamy, Song, Steinke, Suriyakumar, Thakkar and Thakurta, ICML
2022), its first-order approximation for deep models (mirror map = the public loss): a DP-SGD step and the
public gradient, mixed with a weight that moves from the private gradient to the public one over the
run's T planned steps,

    a_t    = cos(pi t / (2 T))                     t = 0 .. T-1: 1 at the start, near 0 at the end
    update = a_t * s~ / b + (1 - a_t) * p          s~ = sum_i clip(g_i, C) + N(0, sigma^2 Delta^2 I_d)

T is the spec's planned steps (public), so the schedule is fixed before any private data is read.
"""
from __future__ import annotations

import math
from typing import Tuple

from components.estimators.first_order import dp_sgd_memory
from components.memory_plan import Settings, Sizes, holds
from components.queries import PerExampleGradients, Update
from components.registry import ESTIMATORS


class _PublicGradientEstimator:

    def __init__(self, public_batch_size: int):
        if public_batch_size < 1:
            raise ValueError("estimator.public_batch_size: must be at least 1")
        self.public_batch_size = public_batch_size

    @property
    def queries_per_step(self) -> int:
        return 1

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return ()  # no random directions

    def public_gradient(self, ctx):
        (batch,) = ctx.public.batches(ctx.step, 1, self.public_batch_size)
        return ctx.public.gradient(batch)


class DopeSgdEstimator(_PublicGradientEstimator):
    name = "dope_sgd"

    def step(self, ctx) -> Update:
        center = self.public_gradient(ctx)
        noisy = ctx.release(PerExampleGradients(center=tuple(center)))
        return Update(dense=((tuple(noisy), 1.0 / ctx.batch_normaliser), (tuple(center), 1.0)))


class PdaDpmdEstimator(_PublicGradientEstimator):
    name = "pda_dpmd"

    def __init__(self, public_batch_size: int, total_steps: int):
        super().__init__(public_batch_size)
        if total_steps < 1:
            raise ValueError("estimator pda_dpmd: needs the run's planned steps (optimizer.steps) to be at least 1")
        self.total_steps = total_steps

    def private_weight(self, step: int) -> float:
        """a_t: the private gradient's weight at ``step`` (past the plan, the public gradient alone)."""
        return math.cos(math.pi * min(step, self.total_steps) / (2 * self.total_steps))

    def step(self, ctx) -> Update:
        public = self.public_gradient(ctx)
        weight = self.private_weight(ctx.step)
        # released at every planned step, however small its weight: the noise was calibrated for T releases
        noisy = ctx.release(PerExampleGradients())
        return Update(dense=((tuple(noisy), weight / ctx.batch_normaliser), (tuple(public), 1.0 - weight)))


@ESTIMATORS.register("dope_sgd")
def _dope_sgd(spec, dimension=None):
    return DopeSgdEstimator(spec.estimator.public_batch_size)


@holds("dope_sgd", public_gradients=1)
def _dope_sgd_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """DP-SGD's step beside the public gradient, each chunk's per-example gradients with their centred copy."""
    return dp_sgd_memory(s, st, centred=True)


@ESTIMATORS.register("pda_dpmd")
def _pda_dpmd(spec, dimension=None):
    if not isinstance(spec.optimizer.steps, int):
        raise ValueError("estimator pda_dpmd: its schedule needs the planned steps; resolve the spec first")
    return PdaDpmdEstimator(spec.estimator.public_batch_size, spec.optimizer.steps)


@holds("pda_dpmd", public_gradients=1)
def _pda_dpmd_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """DP-SGD's step beside the public gradient (mixed into the update, never into the per-example gradients)."""
    return dp_sgd_memory(s, st)

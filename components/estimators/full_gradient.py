"""Menart et al. (KL)'s oracle: full-batch clipped gradients, gradient differences and the selection, in the order the
optimizer plans them (``ctx.request``); it only turns a request into releases through the door."""
from __future__ import annotations

from typing import Tuple

from components.memory_plan import Settings, Sizes, float64_vectors, holds
from components.queries import Update
from components.registry import ESTIMATORS


class FullGradientEstimator:

    def __init__(self, adaptive: bool = False):
        self.name = "full_gradient"
        # adaptive noisy GD releases a norm then a vector each step; the others one vector
        self.queries_per_step = 2 if adaptive else 1

    def direction_seeds(self, step: int, seed: int):
        return ()

    def step(self, ctx) -> Update:
        request = ctx.request()
        if request is None:
            raise ValueError(f"{self.name}: step {ctx.step} has nothing left to release (the optimizer is done)")
        if request.kind == "select":
            return Update(info=(("selected", float(ctx.release_selection(request))),))
        _, released = ctx.release_full_batch(request)
        return Update(dense=((tuple(released), 1.0),))


@ESTIMATORS.register("full_gradient")
def _full_gradient(spec, dimension=None):
    return FullGradientEstimator(adaptive=spec.optimizer.kind == "adaptive_noisy_gd")


@holds("full_gradient")
def _full_gradient_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """The forward beside a few float64 d-vectors."""
    return float64_vectors(s, st)

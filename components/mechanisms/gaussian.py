"""Gaussian mechanism on sums of per-example clipped scalars."""
from __future__ import annotations

import math

import dp_accounting
import torch


def clip_sum(values: torch.Tensor, clip: float) -> torch.Tensor:
    """Clamp each per-example value to [-clip, clip] and sum over examples: [q, b] -> [q] (float64).

    One example changes each of the q sums by at most ``clip`` (add/remove), so the q-vector moves by at
    most sqrt(q) * clip in L2.
    """
    return values.double().clamp(-clip, clip).sum(dim=1)


class GaussianMechanism:
    """Adds N(0, (sqrt(q) * sigma * Delta)^2) to each of q query sums.

    Delta = clip for add/remove neighbours and 2 * clip for replace-one. Releasing q sums of one batch
    with per-coordinate std sqrt(q) sigma Delta is a single Gaussian mechanism of multiplier sigma on a
    vector of L2 sensitivity sqrt(q) Delta, so a step's DpEvent is GaussianDpEvent(sigma) for any q.
    Noise comes from the generator handed in (OS entropy unless a test injects one).
    """

    def __init__(self, clip: float, noise_multiplier: float, queries_per_step: int, neighboring: str,
                 generator: torch.Generator):
        if clip <= 0 or noise_multiplier <= 0 or queries_per_step < 1:
            raise ValueError("gaussian mechanism: clip and noise_multiplier must be > 0, queries >= 1")
        if neighboring not in ("add_remove", "replace_one"):
            raise ValueError(f"privacy.neighboring: unknown {neighboring!r}; allowed: add_remove, replace_one")
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.queries = queries_per_step
        self.sensitivity = clip * (2.0 if neighboring == "replace_one" else 1.0)
        self.std = math.sqrt(queries_per_step) * noise_multiplier * self.sensitivity
        self._generator = generator

    def release(self, sums: torch.Tensor) -> torch.Tensor:
        if sums.shape != (self.queries,):
            raise ValueError(f"release: expected {self.queries} query sums, got shape {tuple(sums.shape)}")
        noise = torch.randn(self.queries, generator=self._generator, dtype=torch.float64)
        return sums.double() + self.std * noise

    def step_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.GaussianDpEvent(self.noise_multiplier)

"""Noisy running sums restarted every period, each step a fresh Gaussian release: Kornowski et al.'s multi-pass
full-batch ERM algorithm (its Algorithm 4, Theorem 4.1) and its Poisson-subsampled variant
(the paper's footnote 2).

Step p = 1..period of a period releases
    g_1 = v_1 + N(0, std_1^2 I)            (a restart: the batch mean of per-example clipped estimates)
    g_p = g_(p-1) + v_p + N(0, std_2^2 I)  (p > 1: the batch mean of clipped differences)
so each release is a Gaussian mechanism on one increment, built on the previous *released* (public) sum:
the noise accumulates within a period. Every row is in every step (full batch), so a run of P restarts and
S differences is exactly the composition of P Gaussian mechanisms of multiplier std_1 / Delta_1 and S of
std_2 / Delta_2, Delta = 2 x (per-example clip) / n under replace-one: ``scheduled_event``. The two
multipliers keep the paper's ratio of stds; one scale is calibrated on that event.

The footnote's variant draws a Poisson batch of rate q every step and normalises by its expected size b = qN
(public): under add/remove one row moves a release by at most (per-example clip) / b, and each release is a
Poisson-subsampled Gaussian, so every part of the composition is wrapped in the sampler's event.
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import dp_accounting
import torch


def scheduled_event(start_multiplier: float, difference_multiplier: float, starts: int, differences: int,
                    wrap: Callable[[dp_accounting.DpEvent], dp_accounting.DpEvent] = lambda event: event
                    ) -> dp_accounting.DpEvent:
    """``starts`` Gaussian releases of ``start_multiplier`` composed with ``differences`` of
    ``difference_multiplier``, each on one batch: ``wrap`` is the sampler's (identity for a full batch,
    PoissonSampledDpEvent for Poisson)."""
    if not (start_multiplier > 0 and difference_multiplier > 0):
        raise ValueError("scheduled gaussian: noise multipliers must be > 0")
    parts = [dp_accounting.SelfComposedDpEvent(wrap(dp_accounting.GaussianDpEvent(z)), count)
             for z, count in ((start_multiplier, starts), (difference_multiplier, differences)) if count > 0]
    if not parts:
        return dp_accounting.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def starts_in(period: int, first: int, until: int) -> int:
    """How many steps t in [first, until) restart a period (t mod period == 0)."""
    return max(0, -(-until // period) - -(-first // period))


class ScheduledGaussian:
    """The mechanism of the module docstring, a RunningSumReleases and Periodic mechanism
    (components/protocols.py): the only door through which a multi-pass run's increments leave
    (docs/design.md, "One private step"). ``release_running_sum(increment)`` takes step p's
    batch-normalised increment and returns the released g_p; ``sensitivity`` is the L2 sensitivity of the
    next release, and ``neighbour_factor`` times the per-example bound over the batch it is (2 under
    replace-one, 1 under add/remove): the door checks a query's per-example bound against it. Between
    periods nothing is held (``at_boundary``): the run checkpoints there, as a tree run does."""

    private = True
    clip = 1.0  # the queries carry their own clips, checked at the door against ``sensitivity``
    noise_source = "fast"

    def __init__(self, period: int, multipliers: Sequence[float], sensitivities: Sequence[float],
                 generator: torch.Generator, neighbour_factor: float = 2.0):
        if period < 1:
            raise ValueError(f"scheduled gaussian: period {period} must be >= 1")
        if not all(z > 0 for z in multipliers) or not all(s > 0 for s in sensitivities):
            raise ValueError("scheduled gaussian: noise multipliers and sensitivities must be > 0")
        if not isinstance(generator, torch.Generator):
            raise ValueError("privacy.noise: secure is not available with scheduled_gaussian yet; use fast")
        if neighbour_factor not in (1.0, 2.0):
            raise ValueError(f"scheduled gaussian: neighbour factor {neighbour_factor} is 2 (replace-one) or 1 "
                             "(add/remove)")
        self.period = int(period)
        self.neighbour_factor = float(neighbour_factor)
        self.multipliers = tuple(float(z) for z in multipliers)
        self.sensitivities = tuple(float(s) for s in sensitivities)
        self.stds = tuple(z * s for z, s in zip(self.multipliers, self.sensitivities))
        self.noise_multiplier = self.multipliers[0]
        self._generator = generator
        self._position = 0
        self._released: Optional[List[torch.Tensor]] = None

    @property
    def std(self) -> float:
        return self.stds[0]

    @property
    def sensitivity(self) -> float:
        return self.sensitivities[0 if self._position == 0 else 1]

    @property
    def position(self) -> int:
        return self._position

    @property
    def at_boundary(self) -> bool:
        return self._position == 0

    def release_running_sum(self, increment: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        increment = [t.detach().to(torch.float64) for t in increment]
        start = self._position == 0
        std = self.stds[0 if start else 1]
        noisy = [t + std * torch.randn(t.shape, generator=self._generator, dtype=torch.float64).to(t.device)
                 for t in increment]
        released = noisy if start else [g + t for g, t in zip(self._released, noisy)]
        self._position += 1
        self._released = released
        if self._position == self.period:
            self._position, self._released = 0, None
        return [t.clone() for t in released]

    def reset(self) -> None:
        """A run rewound to a period boundary restarts its sum there."""
        self._position, self._released = 0, None

    def use_generator(self, generator: torch.Generator) -> None:
        self._generator = generator
        self.noise_source = "seeded"

    def event(self, starts: int, differences: int) -> dp_accounting.DpEvent:
        return scheduled_event(self.multipliers[0], self.multipliers[1], starts, differences)


def noise_ratio(start_clip: float, difference_clip: float, std_ratio: float) -> float:
    """z_2 / z_1 for stds in the ratio ``std_ratio`` = std_2 / std_1 and clips C_G, C_Delta (Delta ~ clip)."""
    if not (start_clip > 0 and difference_clip > 0 and std_ratio > 0 and math.isfinite(std_ratio)):
        raise ValueError("scheduled gaussian: clips and the std ratio must be finite and > 0")
    return std_ratio * start_clip / difference_clip

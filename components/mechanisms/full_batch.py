"""The releases of the KL paper's algorithms: means over every private row of per-example clipped vectors, with
Gaussian noise of a std the optimizer's public plan sets, and the exponential-mechanism choice of an iterate.

Under replace-one neighbours one row moves such a mean by at most 2C / n (C its clip), and the norm of the
mean by as much (|‖a‖ - ‖b‖| <= ‖a - b‖); the door charges each release's exact cost (2C / n)^2 / (2 std^2)
to the run's privacy filter before it exists. The exponential mechanism picks t with probability
proportional to exp(-lambda s_t), s_t the norm of the clipped mean gradient at iterate t (sensitivity
Delta_u = 2C / n): it is epsilon = 2 lambda Delta_u bounded-range, so epsilon^2 / 8-zCDP (Cesar and Rogers
2021), drawn as a Gumbel-max with the private generator. The scores never leave the door.
"""
from __future__ import annotations

import math
from typing import List, Sequence

import torch


class FullBatchGaussian:
    """A FullBatchReleases mechanism (components/protocols.py): the only door through which the KL paper's
    full-batch values leave (docs/design.md, "One private step"). ``release_mean`` and ``release_norm`` add
    Gaussian noise of the std the optimizer's plan asks for; ``release_choice`` is the exponential
    mechanism's draw; ``cost`` is what the door charges the filter first."""

    private = True
    noise_source = "fast"

    def __init__(self, clip: float, rows: int, noise_multiplier: float, generator: torch.Generator,
                 neighbour_factor: float = 2.0):
        if not (clip > 0 and math.isfinite(clip)) or rows < 1:
            raise ValueError("full-batch gaussian: the clip must be finite and > 0, with at least one row")
        if not isinstance(generator, torch.Generator):
            raise ValueError("privacy.noise: secure is not available with the KL paper's optimizers yet; use fast")
        self.clip = float(clip)  # C0: the door's default clip for the backend
        self.rows = int(rows)
        self.neighbour_factor = float(neighbour_factor)
        self.noise_multiplier = float(noise_multiplier)  # of the one Gaussian the run's charge equals
        self._generator = generator

    def sensitivity(self, clip: float) -> float:
        """The most one row moves the mean of vectors clipped at ``clip`` (or that mean's norm)."""
        return self.neighbour_factor * float(clip) / self.rows

    def cost(self, clip: float, std: float) -> float:
        """zCDP rho of one Gaussian release of std ``std`` on that mean."""
        if not std > 0:
            raise ValueError("full-batch gaussian: a private release needs a std > 0")
        return self.sensitivity(clip) ** 2 / (2.0 * std ** 2)

    def _normal(self, shape) -> torch.Tensor:
        return torch.randn(shape, generator=self._generator, dtype=torch.float64)

    def unnoised_mean(self, sums: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """The mean of the clipped vectors, without noise: private, for scores the door computes and hands
        straight to ``release_choice`` (never released itself)."""
        return [t.detach().to(torch.float64) / self.rows for t in sums]

    def release_mean(self, sums: Sequence[torch.Tensor], std: float) -> List[torch.Tensor]:
        """That mean plus N(0, std^2 I)."""
        return [t + std * self._normal(t.shape).to(t.device) for t in self.unnoised_mean(sums)]

    def release_norm(self, sums: Sequence[torch.Tensor], std: float) -> float:
        """The mean's L2 norm plus N(0, std^2)."""
        value = math.sqrt(sum(float(t.pow(2).sum()) for t in self.unnoised_mean(sums)))
        return value + std * float(self._normal(()))

    def release_choice(self, scores: Sequence[float], scale: float) -> int:
        """argmax_t (-scale s_t + Gumbel_t): a draw with P(t) ~ exp(-scale s_t)."""
        u = torch.rand(len(scores), generator=self._generator, dtype=torch.float64).clamp_min(1e-300)
        gumbel = -torch.log(-torch.log(u))
        return int(torch.argmax(-scale * torch.as_tensor(scores, dtype=torch.float64) + gumbel))

    def use_generator(self, generator: torch.Generator) -> None:
        self._generator = generator
        self.noise_source = "seeded"

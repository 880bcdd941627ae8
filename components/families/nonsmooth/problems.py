"""P1 ``w_linear``: a stochastic nonsmooth nonconvex problem whose population objective is known exactly.

    h(x) = d^(-1/2) sum_j psi(x_j),   psi(u) = min(|u - 1|, |u + 1|)     (kinks at -1, 0, +1; concave at 0)
    f(x; xi) = h(x) + <xi, x>,        xi ~ uniform on the sphere of radius r_xi

So F = E f = h (E xi = 0), inf F = 0 on {-1, +1}^d, every f(.; xi) is L = 1 + r_xi Lipschitz and |grad F| = 1
almost everywhere: no point is stationary in the classical sense, and Goldstein stationarity at radius r
is what can be certified. The gradient of the ball smoothing F_r(z) = E_{v ~ U(ball)} F(z + r v) is exact:
with V the first coordinate of a uniform point of the d-ball (V = 2B - 1, B ~ Beta((d+1)/2, (d+1)/2)),

    d/dz_j F_r(z) = d^(-1/2) [1 - 2 P(V < (-1 - z_j)/r) + 2 P(V < -z_j/r) - 2 P(V < (1 - z_j)/r)].

The rows (the xi) are simulated private data: drawn from ``data_seed``, a run's evaluation of F, F_r and
the window certificate reads none of them.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch
from torch import nn


def _psi(u: torch.Tensor) -> torch.Tensor:
    return torch.minimum((u - 1).abs(), (u + 1).abs())


class WLinear(nn.Module):
    """The parameter vector x of P1 (float64) and its per-example loss: ``forward(rows)`` is f(x; xi_i) for
    each row xi_i, shape [b]. ``objective`` marks models whose per-example loss is their own output."""

    objective = "w_linear"

    def __init__(self, start: torch.Tensor):
        super().__init__()
        self.x = nn.Parameter(start.detach().to(torch.float64).clone())

    @property
    def dimension(self) -> int:
        return self.x.numel()

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        x = self.x
        h = _psi(x).sum() / math.sqrt(x.numel())
        return h + rows.to(x.dtype) @ x

    @torch.no_grad()
    def population_value(self) -> float:
        """F(x) - inf F = h(x) (inf F = 0)."""
        x = self.x.detach().cpu()
        return float(_psi(x).sum()) / math.sqrt(x.numel())


def load_w_linear(dimension: int, rows: int, noise_radius: float, data_seed: int) -> np.ndarray:
    """``rows`` simulated rows xi_i, uniform on the sphere of radius ``noise_radius`` in R^dimension, float64."""
    rng = np.random.default_rng(data_seed)
    g = rng.standard_normal((rows, dimension))
    return noise_radius * g / np.linalg.norm(g, axis=1, keepdims=True)


def smoothed_gradient(z: np.ndarray, radius: float) -> np.ndarray:
    """grad F_r at each point of ``z`` ([..., d]), exact (regularised incomplete beta)."""
    from scipy.special import betainc

    z = np.asarray(z, dtype=np.float64)
    d = z.shape[-1]
    a = (d + 1) / 2

    def below(v):  # P(V < v), V the first coordinate of a uniform point of the unit d-ball
        return betainc(a, a, np.clip((v + 1) / 2, 0.0, 1.0))

    g = 1 - 2 * below((-1 - z) / radius) + 2 * below(-z / radius) - 2 * below((1 - z) / radius)
    return g / math.sqrt(d)


def window_certificate(points: Sequence[np.ndarray], radius: float) -> float:
    """Gamma = |mean over a window's query points of grad F_r|: an upper bound on the Goldstein
    (2r)-subgradient norm of F at the window's average when the window lies within r of it."""
    return float(np.linalg.norm(smoothed_gradient(np.asarray(points), radius).mean(axis=0)))

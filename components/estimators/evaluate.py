"""Backend side of a query: per-example values at the queried points, clipped, summed.

This runs where the private rows are. Only the clipped sums it returns leave; per-example values never do.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from components.estimators.directions import Directions, perturbed
from components.estimators.queries import FiniteDifferences, LossValues, Query, VectorFiniteDifferences


@torch.inference_mode()
def per_example_values(model: nn.Module, directions: Directions, loss, x: torch.Tensor, y: torch.Tensor,
                       query: Query) -> torch.Tensor:
    """Shape [m, b] in float64: one row per direction (finite differences) or point (loss values)."""
    rows = []
    if isinstance(query, (FiniteDifferences, VectorFiniteDifferences)):
        lam = query.smoothing
        for direction in query.directions:
            with perturbed(model, directions, direction, +lam):
                plus = loss(model, x, y).double()
            with perturbed(model, directions, direction, -lam):
                minus = loss(model, x, y).double()
            rows.append((plus - minus) / (2 * lam))
    elif isinstance(query, LossValues):
        for direction, scale in query.points:
            with perturbed(model, directions, direction, scale):
                rows.append(loss(model, x, y).double())
    else:
        raise TypeError(f"unknown query type {type(query).__name__}")
    if not rows:
        return torch.zeros(0, len(y), dtype=torch.float64)
    return torch.stack(rows)


def clip_sum(values: torch.Tensor, clip: float) -> torch.Tensor:
    """Clamp each per-example value to [-clip, clip] and sum over examples: [m, b] -> [m] (float64).

    One example changes each of the m sums by at most ``clip`` (add/remove), so the m-vector moves by at
    most sqrt(m) * clip in L2. A NaN value (a diverged loss) counts as 0: clamping leaves NaN as NaN, and
    one NaN would turn the released sum into NaN whatever the noise, telling exactly whether that
    example was sampled. Infinite values clamp to +-clip.
    """
    return torch.nan_to_num(values.double(), nan=0.0).clamp(-clip, clip).sum(dim=1)


def gram(directions: Directions, query: VectorFiniteDifferences) -> torch.Tensor:
    """G_jk = <u_j, u_k> over all parameters, float64 [q, q]."""
    q = len(query.directions)
    g = torch.zeros(q, q, dtype=torch.float64, device=directions.params[0].device)
    for i in range(len(directions.params)):
        us = torch.stack([directions.tensor(d.seed, i).double().flatten() for d in query.directions])
        g += us @ us.T
    return g


def vector_clip_coefficients(values: torch.Tensor, gram_matrix: torch.Tensor, clip: float) -> torch.Tensor:
    """DPGD-0th per-example L2 clipping of g_i = (1/q) sum_j a_ij u_j, summed: returns w with
    sum_i clip(g_i) = sum_j w_j u_j. ||g_i||^2 = a_i^T G a_i / q^2 is computed from the Gram matrix, so no
    d-sized per-example vector is ever formed."""
    q = values.shape[0]
    a = values.double().T / q  # [b, q]
    # an example with a non-finite value contributes nothing (bounded by any clip), not a NaN sum
    a = torch.where(torch.isfinite(a).all(dim=1, keepdim=True), a, torch.zeros((), dtype=a.dtype))
    norms = torch.sqrt(torch.clamp(torch.einsum("bj,jk,bk->b", a, gram_matrix, a), min=0.0))
    factors = torch.clamp(clip / torch.clamp(norms, min=1e-300), max=1.0)
    return (a * factors[:, None]).sum(dim=0)


def evaluate_query(model: nn.Module, directions: Directions, loss, x: torch.Tensor, y: torch.Tensor, query: Query,
                   clip: float) -> torch.Tensor:
    """The only thing a backend returns for a query: clipped per-example sums (or clipped-vector
    coefficients for DPGD-0th). ``clip = inf`` means no clipping (MeZO)."""
    values = per_example_values(model, directions, loss, x, y, query)
    if isinstance(query, VectorFiniteDifferences):
        if math.isinf(clip):
            return values.sum(dim=1) / values.shape[0]
        return vector_clip_coefficients(values, gram(directions, query), clip)
    return values.sum(dim=1) if math.isinf(clip) else clip_sum(values, clip)

"""Backend side of a query: per-example values at the queried points, clipped, summed.

This runs where the private rows are. Only the clipped sums it returns leave; per-example values never do.

Non-finite per-example values (a loss that is NaN or overflows at a perturbed point, or a gradient that
does) are bounded like every other value, so they never change the sensitivity: in a scalar query NaN
counts as 0 and +-inf as +-clip; an example whose vector (DPGD-0th's, DP-SGD's gradient, GEP's
embedding or residual) is not finite contributes nothing. How many such examples a batch held is a
private statistic: it is never counted, returned or logged. ``NON_FINITE_HANDLING`` says this in the
privacy report. Without clipping (``clip = inf``, a non-private run) a non-finite value passes through,
and the loop stops on the non-finite release.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import List, Optional, Tuple

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from components.directions.engine import Directions
from components.directions.perturbation import perturbed
from components.queries.query import (
    EmbeddedGradients,
    FiniteDifferences,
    LossValues,
    PerExampleBall,
    PerExampleGradientAt,
    PerExampleGradients,
    PerExampleSphere,
    Query,
    VectorFiniteDifferences,
)
from components.randomness import public_seed


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


def group_sums(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """[m, b] per-row values -> [m, persons]: each person's rows summed (``groups``: the person of each row,
    any integer ids). A person-level run bounds this sum, a person's whole contribution, not each row's."""
    _, inverse = torch.unique(groups.to(values.device), return_inverse=True)
    persons = int(inverse.max()) + 1 if len(inverse) else 0
    out = torch.zeros(values.shape[0], persons, dtype=values.dtype, device=values.device)
    return out.index_add_(1, inverse, values)


def clip_sum(values: torch.Tensor, clip: float) -> torch.Tensor:
    """Clamp each per-example value to [-clip, clip] and sum over examples: [m, b] -> [m] (float64).

    One example changes each of the m sums by at most ``clip`` (add/remove), so the m-vector moves by at
    most sqrt(m) * clip in L2. A NaN value (a diverged loss) counts as 0: clamping leaves NaN as NaN, and
    one NaN would turn the released sum into NaN whatever the noise, telling exactly whether that
    example was sampled. Infinite values clamp to +-clip (the finite difference of a loss that overflows
    on one side only points away from that side). Either way the example moves each sum by at most clip.
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


# the privacy report's sentence on the handling above (flows/record/reporting.py shows it)
NON_FINITE_HANDLING = (
    "A per-example value that is not finite (a loss or gradient that is NaN or overflows at a queried point) "
    "is bounded before the sum like any other: in a scalar query NaN counts as 0 and +-inf as +-C, and an "
    "example whose vector (gradient, embedding or residual) is not finite contributes nothing, so one example "
    "still moves a release by at most its sensitivity. How many examples were non-finite is never counted or "
    "released. A run whose released values or parameters become non-finite stops with an error.")


# per-example gradients are computed for this many bytes of them at a time (rows per vectorised pass)
PER_EXAMPLE_GRADIENT_BYTES = 256 * 2**20


class _LossOf(nn.Module):
    """loss(model, x, y) as a module, so torch.func.functional_call can swap the model's parameters."""

    def __init__(self, model: nn.Module, loss):
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, x, y):
        return self.loss(self.model, x, y)


def _per_example_gradients(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor, share: int = 1):
    """Per-example gradients over ``params`` (the trainable ones, in order) from torch.func (vmap of grad),
    a chunk of rows at a time: yields one [rows, numel] tensor per parameter. A chunk holds about
    PER_EXAMPLE_GRADIENT_BYTES / ``share`` of them (a caller that makes copies asks for smaller chunks)."""
    wrapped = _LossOf(model, loss)
    names = {id(p): f"model.{n}" for n, p in model.named_parameters()}
    keys = [names[id(p)] for p in params]
    detached = {k: p.detach() for k, p in zip(keys, params)}

    def example_loss(weights, xi, yi):
        return functional_call(wrapped, weights, (xi.unsqueeze(0), yi.unsqueeze(0))).sum()

    per_example = vmap(grad(example_loss), in_dims=(None, 0, 0))
    row_bytes = sum(p.numel() * p.element_size() for p in params)
    chunk = max(1, PER_EXAMPLE_GRADIENT_BYTES // max(1, row_bytes * share))
    with torch.enable_grad():
        for start in range(0, len(y), chunk):
            grads = per_example(detached, x[start:start + chunk], y[start:start + chunk])
            yield [grads[k].flatten(1) for k in keys]


def _summed_gradient(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The plain gradient of the summed loss, float64 (a non-private run: nothing is clipped)."""
    with torch.enable_grad():
        total = _LossOf(model, loss)(x, y).sum()
        grads = torch.autograd.grad(total, params, allow_unused=True)
    return tuple(torch.zeros_like(p, dtype=torch.float64) if g is None else g.detach().double()
                 for p, g in zip(params, grads))


def _clip_factors(norms: torch.Tensor, clip: float) -> torch.Tensor:
    """min(1, clip / norm) per row, and 0 for a row whose norm is not finite (it contributes nothing)."""
    finite = torch.isfinite(norms)
    return torch.where(finite, torch.clamp(clip / torch.clamp(norms, min=1e-300), max=1.0),
                       torch.zeros((), dtype=torch.float64, device=norms.device))


def _finite_rows(t: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """``t`` with the rows of zero factor zeroed: 0 * inf would be NaN in the weighted sum."""
    return torch.where((factors > 0)[:, None], t, torch.zeros((), dtype=t.dtype, device=t.device))


def clipped_gradient_sum(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor,
                         clip: float, center=None) -> Tuple[torch.Tensor, ...]:
    """DP-SGD's clipped sum: sum_i g_i * min(1, clip / ||g_i||) with g_i the gradient of example i's loss
    over ``params`` (the trainable ones, in order). Per-example gradients come from torch.func (vmap of
    grad), a chunk of rows at a time; an example whose gradient is not finite contributes nothing, as in
    the scalar queries. ``center`` (DOPE-SGD; public, one tensor per parameter): g_i is replaced by
    g_i - center before clipping. ``clip = inf``: the plain gradient of the summed loss, less the center once
    per row (a non-private run). Sums are float64, like the scalar queries', so that how rows are split
    across chunks or workers barely matters."""
    if math.isinf(clip):
        summed = _summed_gradient(model, params, loss, x, y)
        if center is None:
            return summed
        return tuple(s - len(y) * c.to(device=s.device, dtype=torch.float64) for s, c in zip(summed, center))
    sums = [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in params]
    flat_center = None if center is None else [
        c.detach().to(device=p.device, dtype=p.dtype).reshape(1, -1) for c, p in zip(center, params)]
    for g in _per_example_gradients(model, params, loss, x, y):
        if flat_center is not None:
            g = [t - c for t, c in zip(g, flat_center)]
        # per-tensor norms in the parameters' precision, combined in float64
        norms = torch.sqrt(sum(torch.linalg.vector_norm(t, dim=1).double().pow(2) for t in g))
        factors = _clip_factors(norms, clip)
        all_finite = bool(torch.isfinite(norms).all())
        for total, t in zip(sums, g):
            if not all_finite:
                t = _finite_rows(t, factors)
            total += (factors.to(t.dtype) @ t).double().view_as(total)  # one matrix-vector product
    return tuple(sums)


def per_example_gradient_matrix(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[rows, d]: each row one example's gradient over ``params``, flattened in their order (public rows:
    GEP's anchor gradients)."""
    # each chunk is written into its place: joining the chunks (and each chunk's parameters) held the
    # matrix twice (on MiniLM with every parameter trainable, 32 rows are 2.7 GiB)
    out = torch.empty(len(y), sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
    start = 0
    for parts in _per_example_gradients(model, params, loss, x, y):
        rows, offset = parts[0].shape[0], 0
        for part in parts:
            out[start:start + rows, offset:offset + part.shape[1]].copy_(part)
            offset += part.shape[1]
        start += rows
    return out


def embedded_gradient_sums(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor, basis: torch.Tensor,
                           clip: float, residual_clip: float) -> Tuple[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """GEP's clipped sums: with B = ``basis`` [k, d] (orthonormal rows), w_i = B g_i and r_i = g_i - B^T w_i;
    returns (sum_i w_i min(1, clip/||w_i||) as float64 [k], sum_i r_i min(1, residual_clip/||r_i||) per
    parameter, float64). An example whose w_i or r_i is not finite contributes to neither sum. ``clip =
    inf``: nothing is clipped (a non-private run), the two sums then add up to the plain gradient sum."""
    k = basis.shape[0]
    w_sum = torch.zeros(k, dtype=torch.float64, device=basis.device)
    r_sum = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64, device=basis.device)
    if math.isinf(clip):
        g = torch.cat([t.flatten() for t in _summed_gradient(model, params, loss, x, y)])
        w = basis.double() @ g
        w_sum, r_sum = w_sum + w, r_sum + (g - basis.double().T @ w)
    else:
        for parts in _per_example_gradients(model, params, loss, x, y, share=3):  # g, r and the product
            # in the parameters' precision, as clipped_gradient_sum: norms and factors in float64
            g = torch.cat(parts, dim=1)
            b = basis.to(g.dtype)
            w = g @ b.T  # [rows, k]
            r = g - w @ b
            wf = _clip_factors(torch.linalg.vector_norm(w.double(), dim=1), clip)
            rf = _clip_factors(torch.linalg.vector_norm(r, dim=1).double(), residual_clip)
            keep = (wf > 0) & (rf > 0)  # one non-finite part drops the whole example
            if not bool(keep.all()):  # 0 * inf would be NaN in the products below
                wf, rf = torch.where(keep, wf, 0.0), torch.where(keep, rf, 0.0)
                w, r = _finite_rows(w, wf), _finite_rows(r, rf)
            # added as each chunk is made: keeping the chunks' d-sized partial sums to add at the end held
            # one float64 copy of d per chunk (on MiniLM a chunk is one row: 32 x 173 MiB)
            w_sum += wf @ w.double()
            r_sum += (rf.to(r.dtype) @ r).double()
    out, start = [], 0
    for p in params:
        out.append(r_sum[start:start + p.numel()].view(p.shape))
        start += p.numel()
    return w_sum, tuple(out)


def example_directions(seed: int, slot: int, count: int, dimension: int) -> torch.Tensor:
    """[count, dimension] float64 directions uniform on the sphere of radius sqrt(dimension), the ones of
    the example in ``slot`` of a step's batch: drawn on the CPU from public_seed(seed, slot), so every
    device and every worker draws the same ones."""
    gen = torch.Generator().manual_seed(public_seed(seed, slot))
    g = torch.randn(count, dimension, generator=gen, dtype=torch.float64)
    return g * (math.sqrt(dimension) / torch.linalg.vector_norm(g, dim=1, keepdim=True))


def example_slots(query: PerExampleSphere, x: torch.Tensor, y: torch.Tensor) -> List[int]:
    """What each example's directions are drawn from: its place in the step's batch, or (``keyed_by_row``)
    a digest of its own features and label, keyed by the query's public seed. The digests stay here: they
    only seed directions, are never returned, logged or sent."""
    if not query.keyed_by_row:
        return list(range(query.first_slot, query.first_slot + len(y)))
    if len(y) == 0:
        return []
    key = query.seed.to_bytes(8, "little")
    # the raw bytes of each row (any dtype, bfloat16 included)
    xs = x.detach().cpu().contiguous().reshape(len(y), -1).view(torch.uint8).numpy()
    ys = y.detach().cpu().contiguous().reshape(len(y), -1).view(torch.uint8).numpy()
    return [int.from_bytes(hashlib.blake2b(xs[i].tobytes() + ys[i].tobytes(), digest_size=8, key=key,
                                           person=b"privzo-row").digest(), "little") >> 1 for i in range(len(y))]


# a sphere query evaluates its points for about this many bytes of them at a time
SPHERE_POINT_BYTES = 64 * 2**20


def _flat_loss(model: nn.Module, params, loss, query: PerExampleSphere):
    """What a per-example query evaluates on: the parameters flattened (p), the query's other point
    (p + offset, or None), and one example's loss at a flat point (a functional call, no model copy)."""
    wrapped = _LossOf(model, loss)
    names = {id(p): f"model.{n}" for n, p in model.named_parameters()}
    keys = [names[id(p)] for p in params]
    shapes = [p.shape for p in params]
    sizes = [p.numel() for p in params]
    dtype, device = params[0].dtype, params[0].device
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    other = None if query.offset is None else flat + torch.cat(
        [t.detach().reshape(-1).to(device=device, dtype=dtype) for t in query.offset])

    def loss_at(point, xi, yi):
        weights = {k: t.view(s) for k, t, s in zip(keys, torch.split(point, sizes), shapes)}
        return functional_call(wrapped, weights, (xi.unsqueeze(0), yi.unsqueeze(0))).sum()

    return flat, other, loss_at, sizes, shapes


def _sphere_rows(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor, query: PerExampleSphere,
                 slots: List[int], shares: bool):
    """A PerExampleSphere query's clipped per-example vectors g_i, a chunk of rows at a time: yields
    ([rows, d] float64, the share of each row's clip reached or None). Each example's loss is evaluated at
    its own perturbed points through torch.func (vmap over examples and directions of a functional call),
    so no model copy is made; clipping follows the query's mode, a non-finite coefficient counting as 0 in
    scalar mode and a non-finite g_i as nothing in vector mode. ``shares``: per row, the fraction of its
    coefficients at the clip (scalar mode), or 1 when its vector was clipped (vector mode)."""
    flat, other, loss_at, sizes, shapes = _flat_loss(model, params, loss, query)
    dtype, device = flat.dtype, flat.device
    d = sum(sizes)
    m = query.directions
    lam = query.smoothing
    values = vmap(vmap(loss_at, in_dims=(0, None, None)), in_dims=(0, 0, 0))
    independent = query.kind == "independent_difference"
    drawn = 2 * m if independent else m  # an independent difference has m more directions at its other point
    points = 2 if query.kind in ("central", "one_sided_difference") else 4
    chunk = max(1, SPHERE_POINT_BYTES // max(1, points * m * d * flat.element_size()))
    for start in range(0, len(y), chunk):
        xs, ys = x[start:start + chunk], y[start:start + chunk]
        u = torch.stack([example_directions(query.seed, slot, drawn, d)
                         for slot in slots[start:start + chunk]]).to(device)  # [b, m (x2), d] float64
        scaled = (lam * u).to(dtype)

        def at(base, sign=1.0, half=slice(0, m)):
            return values(base + sign * scaled[:, half], xs, ys).double()

        with torch.inference_mode():
            if query.kind == "central":
                c = (at(flat) - at(flat, -1.0)) / (2 * lam)
            elif query.kind == "one_sided_difference":
                c = (at(flat) - at(other)) / lam
            elif query.kind == "central_difference":
                c = ((at(flat) - at(flat, -1.0)) - (at(other) - at(other, -1.0))) / (2 * lam)
            else:  # the central estimate at q on the second m directions, entering with a minus sign
                second = slice(m, 2 * m)
                c = torch.cat([at(flat) - at(flat, -1.0), at(other, 1.0, second) - at(other, -1.0, second)],
                              dim=1) / (2 * lam)
                c[:, m:] *= -1.0
        share = None
        if query.clip_mode == "scalar" and not math.isinf(query.clip):
            c = torch.nan_to_num(c, nan=0.0)
            if shares:
                share = (c.abs() >= query.clip).double().mean(dim=1)
            c = c.clamp(-query.clip, query.clip)
        g = torch.einsum("bm,bmd->bd", c, u) / m
        if query.clip_mode == "vector" and not math.isinf(query.clip):
            factors = _clip_factors(torch.linalg.vector_norm(g, dim=1), query.clip)
            g = _finite_rows(g, factors) * factors[:, None]
            share = (factors < 1).double() if shares else None
        yield g, share


def sphere_sums(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor,
                query: PerExampleSphere) -> Tuple[torch.Tensor, ...]:
    """sum_i clip(g_i) of a PerExampleSphere query, one float64 tensor per parameter (``_sphere_rows``)."""
    return _summed(params, _sphere_rows(model, params, loss, x, y, query, example_slots(query, x, y), False))


def example_ball_points(seed: int, slot: int, count: int, dimension: int) -> torch.Tensor:
    """[count, dimension] float64 points uniform in the unit ball, the ones of the example in ``slot`` of a
    step's batch (a direction uniform on the sphere, scaled by U^(1/d)), drawn on the CPU from
    public_seed(seed, slot) like its sphere directions."""
    gen = torch.Generator().manual_seed(public_seed(seed, slot))
    g = torch.randn(count, dimension, generator=gen, dtype=torch.float64)
    radii = torch.rand(count, generator=gen, dtype=torch.float64) ** (1.0 / dimension)
    return g * (radii[:, None] / torch.linalg.vector_norm(g, dim=1, keepdim=True))


def _ball_rows(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor, query: PerExampleBall,
               slots: List[int], shares: bool):
    """A PerExampleBall query's clipped per-example vectors, a chunk of rows at a time (as ``_sphere_rows``):
    per-example gradients at every example's own perturbed points through torch.func (vmap over examples
    and points of grad of a functional call), a bounded number of points at a time; a non-finite g_i
    counts as nothing."""
    flat, other, loss_at, sizes, shapes = _flat_loss(model, params, loss, query)
    dtype, device = flat.dtype, flat.device
    d = sum(sizes)
    m = query.directions
    centres = [flat] if other is None else [flat, other]
    gradients = vmap(vmap(grad(loss_at), in_dims=(0, None, None)), in_dims=(0, 0, 0))
    per_point = 4 * d * flat.element_size()  # the point, its gradient and the float64 sum's share
    points = max(1, min(m, SPHERE_POINT_BYTES // per_point))  # perturbations of one example at a time
    rows = max(1, SPHERE_POINT_BYTES // (per_point * points))
    for start in range(0, len(y), rows):
        xs, ys = x[start:start + rows], y[start:start + rows]
        ball = torch.stack([example_ball_points(query.seed, slot, m * len(centres), d)
                            for slot in slots[start:start + rows]]).to(device)  # [b, m (x2), d] float64
        g = torch.zeros(len(ys), d, dtype=torch.float64, device=device)
        with torch.enable_grad():
            for c, centre in enumerate(centres):
                sign = 1.0 if c == 0 else -1.0
                for lo in range(0, m, points):
                    step = (query.smoothing * ball[:, c * m + lo:c * m + min(m, lo + points)]).to(dtype)
                    g += sign * gradients(centre + step, xs, ys).detach().double().sum(dim=1)
        g /= m
        share = None
        if not math.isinf(query.clip):
            factors = _clip_factors(torch.linalg.vector_norm(g, dim=1), query.clip)
            g = _finite_rows(g, factors) * factors[:, None]
            share = (factors < 1).double() if shares else None
        yield g, share


def ball_sums(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor,
              query: PerExampleBall) -> Tuple[torch.Tensor, ...]:
    """sum_i clip(g_i) of a PerExampleBall query, one float64 tensor per parameter (``_ball_rows``)."""
    return _summed(params, _ball_rows(model, params, loss, x, y, query, example_slots(query, x, y), False))


def _exact_gradient_rows(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor,
                         query: PerExampleGradientAt, shares: bool):
    """A PerExampleGradientAt query's clipped per-example gradients, a bounded number of rows at a time
    (per-example gradients through torch.func; a non-finite g_i counts as nothing)."""
    flat, other, loss_at, sizes, shapes = _flat_loss(model, params, loss, query)
    d = sum(sizes)
    gradients = vmap(grad(loss_at), in_dims=(None, 0, 0))
    rows = max(1, SPHERE_POINT_BYTES // (4 * d * flat.element_size()))
    for start in range(0, len(y), rows):
        xs, ys = x[start:start + rows], y[start:start + rows]
        with torch.enable_grad():
            if query.kind == "gradient":
                g = gradients(flat if other is None else other, xs, ys).detach().double()
            else:
                g = (gradients(flat, xs, ys).detach().double() - gradients(other, xs, ys).detach().double())
        share = None
        if not math.isinf(query.clip):
            factors = _clip_factors(torch.linalg.vector_norm(g, dim=1), query.clip)
            g = _finite_rows(g, factors) * factors[:, None]
            share = (factors < 1).double() if shares else None
        yield g, share


def exact_gradient_sums(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor,
                        query: PerExampleGradientAt) -> Tuple[torch.Tensor, ...]:
    """sum_i clip(g_i) of a PerExampleGradientAt query, one float64 tensor per parameter
    (``_exact_gradient_rows``)."""
    return _summed(params, _exact_gradient_rows(model, params, loss, x, y, query, False))


def _summed(params, rows) -> Tuple[torch.Tensor, ...]:
    """The sum of per-example rows (chunks of [b, d] float64 vectors, as the ``_*_rows`` generators yield
    them), split into one float64 tensor per parameter."""
    sizes, shapes = [p.numel() for p in params], [p.shape for p in params]
    total = torch.zeros(sum(sizes), dtype=torch.float64, device=params[0].device)
    for g, _ in rows:
        total += g.sum(dim=0)
    return tuple(t.view(s) for t, s in zip(torch.split(total, sizes), shapes))


def per_example_vectors(model: nn.Module, directions: Directions, loss, x: torch.Tensor, y: torch.Tensor,
                        query: PerExampleSphere, slots: Optional[List[int]] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Each row's clipped vector of a per-example query (sphere, ball or exact gradient), [rows, d] float64
    flattened in the parameters' order, and the share of its clip it reached: what the row adds to the
    backend's sum, computed by the same code. For the audit's canaries (rows it writes), never for private
    rows. ``slots``: the rows' places in their step's batch, which their directions are drawn from
    (default: first_slot onward; a keyed query draws from the rows' content whatever is given)."""
    params = directions.params
    d = sum(p.numel() for p in params)
    if len(y) == 0:
        return (torch.zeros(0, d, dtype=torch.float64, device=params[0].device),
                torch.zeros(0, dtype=torch.float64, device=params[0].device))
    if query.keyed_by_row or slots is None:
        slots = example_slots(query, x, y)
    if isinstance(query, PerExampleGradientAt):
        parts = _exact_gradient_rows(model, params, loss, x, y, query, True)
    elif isinstance(query, PerExampleBall):
        parts = _ball_rows(model, params, loss, x, y, query, list(slots), True)
    else:
        parts = _sphere_rows(model, params, loss, x, y, query, list(slots), True)
    vectors, shares = zip(*parts)
    share = torch.cat([torch.zeros(len(g), dtype=torch.float64, device=g.device) if s is None else s
                       for g, s in zip(vectors, shares)])
    return torch.cat(vectors), share


def evaluate_query(model: nn.Module, directions: Directions, loss, x: torch.Tensor, y: torch.Tensor, query: Query,
                   clip: float, groups: Optional[torch.Tensor] = None):
    """The only thing a backend returns for a query: clipped per-example sums (or clipped-vector
    coefficients for DPGD-0th, or DP-SGD's clipped gradient sum, one tensor per parameter).
    ``clip = inf`` means no clipping (MeZO). ``groups`` (a person-level run): each row's person; the rows of
    one person are summed first and that sum is clipped, so one person moves each sum by at most ``clip``."""
    if groups is not None and not math.isinf(clip) and len(y):
        return _evaluate_by_person(model, directions, loss, x, y, query, clip, groups)
    if len(y) == 0:  # an empty Poisson batch: every sum is zero (some models cannot run on no rows)
        zeros = tuple(torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in directions.params)
        if isinstance(query, (PerExampleGradients, PerExampleSphere)):
            return zeros
        if isinstance(query, EmbeddedGradients):
            return torch.zeros(query.basis.shape[0], dtype=torch.float64, device=query.basis.device), zeros
        return torch.zeros(query.size, dtype=torch.float64, device=directions.params[0].device)
    if isinstance(query, PerExampleGradients):
        return clipped_gradient_sum(model, directions.params, loss, x, y, clip, query.center)
    if isinstance(query, PerExampleSphere):
        if math.isinf(clip):  # no mechanism (a non-private twin): nothing is clipped
            query = dataclasses.replace(query, clip=math.inf)
        if isinstance(query, PerExampleBall):
            return ball_sums(model, directions.params, loss, x, y, query)
        if isinstance(query, PerExampleGradientAt):
            return exact_gradient_sums(model, directions.params, loss, x, y, query)
        return sphere_sums(model, directions.params, loss, x, y, query)
    if isinstance(query, EmbeddedGradients):
        return embedded_gradient_sums(model, directions.params, loss, x, y, query.basis, clip, query.residual_clip)
    values = per_example_values(model, directions, loss, x, y, query)
    if isinstance(query, VectorFiniteDifferences):
        if math.isinf(clip):
            return values.sum(dim=1) / values.shape[0]
        return vector_clip_coefficients(values, gram(directions, query), clip)
    return values.sum(dim=1) if math.isinf(clip) else clip_sum(values, clip)


def _evaluate_by_person(model: nn.Module, directions: Directions, loss, x: torch.Tensor, y: torch.Tensor, query: Query,
                        clip: float, groups: torch.Tensor):
    """``evaluate_query`` at person level: a person's contribution is the sum over their rows of what a row
    contributes at event level (finite differences, loss values, gradients), and that sum is clipped. Rows
    whose values are not finite count as at event level (NaN as 0; a non-finite vector as nothing) before
    the sum, and a sum that is still not finite is bounded the same way."""
    if isinstance(query, PerExampleGradients):
        return _person_gradient_sums(model, directions.params, loss, x, y, clip, groups, query.center)
    if isinstance(query, (FiniteDifferences, VectorFiniteDifferences, LossValues)):
        values = per_example_values(model, directions, loss, x, y, query)
        if isinstance(query, VectorFiniteDifferences):
            # a row with any non-finite value contributes nothing; coefficients are linear in the row's values
            values = torch.where(torch.isfinite(values).all(dim=0, keepdim=True), values, torch.zeros((), dtype=values.dtype))
            return vector_clip_coefficients(group_sums(values, groups), gram(directions, query), clip)
        return clip_sum(group_sums(torch.nan_to_num(values, nan=0.0), groups), clip)
    raise TypeError(f"{type(query).__name__} has no person-level clipping (the rules refuse its estimator at person level)")


def _person_gradient_sums(model: nn.Module, params, loss, x: torch.Tensor, y: torch.Tensor, clip: float,
                          groups: torch.Tensor, center=None) -> Tuple[torch.Tensor, ...]:
    """DP-SGD at person level: sum_p G_p min(1, clip / ||G_p||), G_p the sum of person p's rows' gradients
    (less ``center`` once per row, DOPE-SGD). Whole persons are taken a slice at a time, each slice about
    one chunk of per-example gradients, so a person's sum is formed in one place."""
    _, inverse = torch.unique(groups.to(y.device), return_inverse=True)
    order = torch.argsort(inverse, stable=True)
    inverse = inverse[order]
    x, y = x[order], y[order]
    counts = torch.bincount(inverse).tolist()
    row_bytes = sum(p.numel() * p.element_size() for p in params)
    chunk = max(1, PER_EXAMPLE_GRADIENT_BYTES // max(1, row_bytes))
    flat_center = None if center is None else [
        c.detach().to(device=p.device, dtype=p.dtype).reshape(1, -1) for c, p in zip(center, params)]
    sums = [torch.zeros(p.shape, dtype=torch.float64, device=p.device) for p in params]
    start, person = 0, 0
    while person < len(counts):
        last, rows = person, 0
        while last < len(counts) and (rows == 0 or rows + counts[last] <= chunk):
            rows += counts[last]
            last += 1
        local = inverse[start:start + rows] - person
        totals = [torch.zeros(last - person, p.numel(), dtype=torch.float64, device=p.device) for p in params]
        at = 0
        for g in _per_example_gradients(model, params, loss, x[start:start + rows], y[start:start + rows]):
            n = len(g[0])
            finite = torch.ones(n, dtype=torch.bool, device=y.device)
            for t in g:
                finite &= torch.isfinite(t).all(dim=1)
            for total, t, c in zip(totals, g, flat_center or [None] * len(g)):
                t = t.double() if c is None else (t - c).double()
                total.index_add_(0, local[at:at + n], torch.where(finite[:, None], t, torch.zeros((), dtype=t.dtype)))
            at += n
        norms = torch.sqrt(sum(t.pow(2).sum(dim=1) for t in totals))
        factors = _clip_factors(norms, clip)
        for total, t in zip(sums, totals):
            total += (factors @ _finite_rows(t, factors)).view_as(total)
        start += rows
        person = last
    return tuple(sums)

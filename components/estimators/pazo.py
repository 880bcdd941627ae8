"""Public-data-assisted zeroth-order estimators (PAZO, Gong & Li): PAZO-M, PAZO-P, PAZO-S.

Private rows are only ever touched through per-example clipped scalar queries released by the
mechanism; public rows give ordinary backprop gradients, which need no privatisation.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

from components.directions import Directions
from components.memory_plan import QR_COPIES, Settings, Sizes, holds
from components.queries import Dense, FiniteDifferences, LossValues, Seeded, Update
from components.estimators.two_point import TwoPointEstimator, zeroth_order_memory
from components.randomness import public_seed
from components.registry import ESTIMATORS

STREAM_SUBSPACE = 6
STREAM_CANDIDATE = 7


class PazoMEstimator(TwoPointEstimator):
    """PAZO-M (Algorithm 1): update = alpha * g_pub + (1 - alpha) * (1/q) sum_j (s~_j / b) u_j, with u_j on
    the sphere of radius d^(1/4) so that E||g~||^2 matches ||grad f||^2 (§A.1)."""

    name = "pazo_m"

    def __init__(self, queries: int, smoothing: float, mix: float, public_batch_size: int):
        super().__init__(queries, smoothing)
        if not 0.0 <= mix <= 1.0:
            raise ValueError("estimator.mix: must be in [0, 1]")
        self.mix = mix
        self.public_batch_size = public_batch_size

    def step(self, ctx) -> Update:
        (batch,) = ctx.public.batches(ctx.step, 1, self.public_batch_size)
        g_pub = ctx.public.gradient(batch)  # at x_t, before any private query of this step
        seeds = self.direction_seeds(ctx.step, ctx.seed)
        noisy = ctx.release(FiniteDifferences(tuple(Seeded(s) for s in seeds), self.smoothing))
        coeffs = (1.0 - self.mix) * noisy / (ctx.batch_normaliser * self.queries)
        return Update(terms=tuple((s, float(c)) for s, c in zip(seeds, coeffs)), dense=((g_pub, self.mix),))


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten(vector: torch.Tensor, like: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
    out, offset = [], 0
    for t in like:
        out.append(vector[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return tuple(out)


def subspace_basis(grads: List[Tuple[torch.Tensor, ...]], basis: str) -> torch.Tensor:
    """G in R^{d x k}: orthonormalised (QR) or column-normalised public gradients, in float32 at least: QR has
    no bf16 / fp16 kernel, and a basis rounded to bf16 would be orthonormal only to about 1e-2 (a language
    model's gradients come in the weights' precision)."""
    like = grads[0]
    dtype = torch.promote_types(like[0].dtype, torch.float32)
    rows = torch.empty(len(grads), sum(t.numel() for t in like), dtype=dtype, device=like[0].device)
    for row, gradient in zip(rows, grads):  # each tensor copied once, into its place: no stacked copy beside G
        offset = 0
        for t in gradient:
            row[offset:offset + t.numel()].copy_(t.reshape(-1))
            offset += t.numel()
    g = rows.T  # [d, k], column-major: the layout LAPACK's QR reads
    if basis == "orthonormal":
        q, _ = torch.linalg.qr(g, mode="reduced")
        return q
    if basis == "normalized":
        return g / torch.clamp(g.norm(dim=0, keepdim=True), min=1e-30)
    raise ValueError(f"estimator.basis: unknown {basis!r}; allowed: orthonormal, normalized")


class PazoPEstimator:
    """PAZO-P (Algorithm 2): u_j on sqrt(k) S^{k-1}, perturbation lambda * G u_j, update (1/q) sum_j
    (s~_j / b) G u_j. With orthonormal G the expected update is Proj_G grad f."""

    name = "pazo_p"

    def __init__(self, queries: int, smoothing: float, public_batches: int, public_batch_size: int, basis: str):
        if queries < 1 or smoothing <= 0 or public_batches < 1:
            raise ValueError("estimator: queries, public_batches must be >= 1 and smoothing > 0")
        self.queries = queries
        self.smoothing = smoothing
        self.k = public_batches
        self.public_batch_size = public_batch_size
        self.basis = basis

    @property
    def queries_per_step(self) -> int:
        return self.queries

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return ()  # directions are dense combinations of public gradients, nothing to cache

    def coefficients(self, step: int, seed: int) -> np.ndarray:
        """u_1..u_q on the sphere of radius sqrt(k) in R^k (public, from the run's seed)."""
        rng = np.random.default_rng(public_seed(seed, STREAM_SUBSPACE, step))
        z = rng.standard_normal((self.queries, self.k))
        return math.sqrt(self.k) * z / np.linalg.norm(z, axis=1, keepdims=True)

    def step(self, ctx) -> Update:
        # the k gradients are freed once G holds them: the private forwards run beside G and the q directions only
        g = subspace_basis([ctx.public.gradient(b) for b in ctx.public.batches(ctx.step, self.k,
                                                                                 self.public_batch_size)], self.basis)
        us = torch.as_tensor(self.coefficients(ctx.step, ctx.seed), dtype=g.dtype, device=g.device)
        like = ctx.public.params  # the gradients' shapes and dtypes, in their order
        # a query's direction in each parameter's own dtype, as a seeded one is drawn (a bf16 model's forward
        # reads it); the update stays in G's precision, for the optimizer's float32 master copies
        directions = [Dense(tuple(t.to(p.dtype) for t, p in zip(_unflatten(g @ u, like), like))) for u in us]
        noisy = ctx.release(FiniteDifferences(tuple(directions), self.smoothing))
        weights = (noisy / (ctx.batch_normaliser * self.queries)).to(dtype=g.dtype, device=g.device)
        update = g @ (us.T @ weights)  # sum_j w_j G u_j
        return Update(dense=((_unflatten(update, like), 1.0),))


class PazoSEstimator:
    """PAZO-S (Algorithm 3): score x - eta g_j for k public gradients from k disjoint public batches by the
    privatised mean clipped private loss, add one candidate g_best + N(0, candidate_noise^2 I), score it,
    step along the argmin. k + 1 noisy queries per step (two adaptive rounds on the same batch).

    The candidate perturbation is exploration, not privacy noise: it is drawn from the public seed."""

    name = "pazo_s"

    def __init__(self, public_batches: int, public_batch_size: int, candidate_noise: float, lr: float):
        if public_batches < 1 or lr <= 0 or candidate_noise < 0:
            raise ValueError("estimator: public_batches >= 1, candidate_noise >= 0 and optimizer.lr > 0")
        self.k = public_batches
        self.public_batch_size = public_batch_size
        self.candidate_noise = candidate_noise
        self.lr = lr  # eta: the same step size scores the candidates and takes the step
        self.last_candidates: List[Tuple[torch.Tensor, ...]] = []

    @property
    def queries_per_step(self) -> int:
        return self.k + 1

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return ()

    def step(self, ctx) -> Update:
        self.last_candidates = []  # the last step's (kept for inspection) are not held beside this step's
        grads = [ctx.public.gradient(b) for b in ctx.public.batches(ctx.step, self.k, self.public_batch_size)]
        scores = ctx.release(LossValues(tuple((Dense(g), -self.lr) for g in grads))) / ctx.batch_normaliser
        best = int(torch.argmin(scores))
        if self.candidate_noise > 0:
            noise = Directions(list(grads[best]), "gaussian")
            seed = public_seed(ctx.seed, STREAM_CANDIDATE, ctx.step)
            extra = tuple(g + self.candidate_noise * noise.tensor(seed, i) for i, g in enumerate(grads[best]))
        else:
            extra = grads[best]
        extra_score = ctx.release(LossValues(((Dense(extra), -self.lr),))) / ctx.batch_normaliser
        candidates = grads + [extra]
        self.last_candidates = candidates
        chosen = int(torch.argmin(torch.cat([scores, extra_score])))
        return Update(dense=((candidates[chosen], 1.0),))


@ESTIMATORS.register("pazo_m")
def _pazo_m(spec, dimension=None):
    est = spec.estimator
    return PazoMEstimator(est.queries, est.smoothing, est.mix, est.public_batch_size)


@ESTIMATORS.register("pazo_p")
def _pazo_p(spec, dimension=None):
    est = spec.estimator
    return PazoPEstimator(est.queries, est.smoothing, est.public_batches, est.public_batch_size, est.basis)


@ESTIMATORS.register("pazo_s")
def _pazo_s(spec, dimension=None):
    est = spec.estimator
    return PazoSEstimator(est.public_batches, est.public_batch_size, est.candidate_noise, spec.optimizer.lr)


# What the private queries run beside, over DPZero's step (two_point.zeroth_order_memory): k public gradients
# from the spec (public_batches; PAZO-M: one). PAZO-P's and PAZO-S's directions are not seeded: never cached.
@holds("pazo_m", public_gradients=1)
def _pazo_m_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """The public gradient beside the private forwards."""
    return zeroth_order_memory(s, st, held=s.trainable_bytes)


@holds("pazo_p")
def _pazo_p_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """The float32 (at least) basis G of the k public gradients and the q dense query directions beside the
    private forwards; while G is formed, the k gradients beside it and its basis (QR's copies, or normalised
    columns)."""
    k, d, T, f = st.public_gradients, s.trainable, s.trainable_bytes, max(s.element, 4)
    basis = k * T + int((1 + (QR_COPIES if st.basis == "orthonormal" else 1)) * f * k * d)
    return zeroth_order_memory(s, st, held=f * k * d + st.queries * T, public_peak=basis)


@holds("pazo_s")
def _pazo_s_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """The k + 2 candidates (the public gradients, the extra one and its noise) beside the private forwards."""
    return zeroth_order_memory(s, st, held=(st.public_gradients + 2) * s.trainable_bytes)

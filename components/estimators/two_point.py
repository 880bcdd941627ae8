"""Zeroth-order estimators on random directions: DPZero's two-point (and MeZO) and DPGD-0th.

DPZero (Algorithm 2, mini-batch form of §B.2), per step with public directions u_j (from the run's seed):
    a_ij = (f(x + lambda u_j; xi_i) - f(x - lambda u_j; xi_i)) / (2 lambda)    per private example i
    s~_j = sum_i clip_C(a_ij) + N(0, q sigma^2 Delta^2)                          (released)
    update = (1/q) sum_j (s~_j / b) u_j                                          (b = expected batch size)
DPGD-0th (Algorithm 1) instead clips the d-dimensional g_i = (1/q) sum_j a_ij u_j in L2 norm and adds
d-dimensional noise.
"""
from __future__ import annotations

from typing import Tuple

from components.memory_plan import Settings, Sizes, forward, holds, public_phase
from components.queries import FiniteDifferences, Seeded, Update, VectorFiniteDifferences
from components.randomness import STREAM_DIRECTION, public_seed
from components.registry import ESTIMATORS


class TwoPointEstimator:
    name = "two_point"

    def __init__(self, queries: int = 1, smoothing: float = 1e-3):
        if queries < 1 or smoothing <= 0:
            raise ValueError("estimator: queries must be >= 1 and smoothing > 0")
        self.queries = queries
        self.smoothing = smoothing

    @property
    def queries_per_step(self) -> int:
        return self.queries

    def direction_seeds(self, step: int, seed: int) -> Tuple[int, ...]:
        return tuple(public_seed(seed, STREAM_DIRECTION, step, j) for j in range(self.queries))

    def step(self, ctx) -> Update:
        seeds = self.direction_seeds(ctx.step, ctx.seed)
        noisy = ctx.release(FiniteDifferences(tuple(Seeded(s) for s in seeds), self.smoothing))
        coeffs = noisy / (ctx.batch_normaliser * self.queries)
        return Update(terms=tuple((s, float(c)) for s, c in zip(seeds, coeffs)))


class DpgdZerothEstimator(TwoPointEstimator):
    name = "dpgd_0th"

    @property
    def queries_per_step(self) -> int:
        return 1  # one d-dimensional release per step

    def step(self, ctx) -> Update:
        seeds = self.direction_seeds(ctx.step, ctx.seed)
        noisy_vector = ctx.release(VectorFiniteDifferences(tuple(Seeded(s) for s in seeds), self.smoothing))
        return Update(dense=((tuple(noisy_vector), 1.0 / ctx.batch_normaliser),))


@ESTIMATORS.register("two_point")
def _two_point(spec, dimension=None):
    return TwoPointEstimator(spec.estimator.queries, spec.estimator.smoothing)


@ESTIMATORS.register("dpgd_0th")
def _dpgd_0th(spec, dimension=None):
    return DpgdZerothEstimator(spec.estimator.queries, spec.estimator.smoothing)


@holds("two_point")
def zeroth_order_memory(s: Sizes, st: Settings, held: int = 0, public_peak: int = 0) -> Tuple[int, str]:
    """What a zeroth-order step holds above the weights: what the perturbations keep across the step (and the
    next), beside the larger of the public gradients' phase (or ``public_peak``, a larger one of the
    estimator's own) and the private forwards with what they run beside (``held``)."""
    b, d = st.batch, s.trainable
    if st.cache:  # the cached directions (the next step's too with prefetching) and the perturbed copy
        kept = st.queries * (2 if st.prefetch else 1) * s.trainable_bytes + s.swapped
        why = f"{st.estimator} (cache): {st.queries} cached direction(s) and a perturbed copy of {d:,} parameters"
    else:  # the scratch stack of one module's perturbed parameters
        kept = s.scratch
        why = f"{st.estimator} (regenerate): the forward on {b} rows and one module's perturbed parameters"
    public, public_why = public_phase(s, st)
    public = max(public, public_peak)
    private = forward(s, st, b) + held
    if public > private:
        return kept + public, public_why
    return kept + private, why


@holds("dpgd_0th")
def _dpgd_0th_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """DPZero's, the private forwards beside float64 d-vectors (the d-dimensional release)."""
    return zeroth_order_memory(s, st, held=4 * 8 * s.trainable)

"""The nonsmooth algorithms' zeroth-order oracles (the two nonsmooth papers (Zhang et al.; Kornowski et al.)), feeding O2NC.

``ZoSpiderEstimator`` is a SPIDER-like variance-reduced oracle. At the first step of each tree period
(position 1) it estimates the smoothed gradient at the query point z_t from ``start_batch`` rows; at
every other position it estimates the difference of smoothed gradients between z_t and the previous
query point z_(t-1) from ``step_batch`` fresh rows. The increments (batch means of per-example clipped
estimates) go to the tree-aggregation mechanism, which releases their running sum plus tree noise: that
noisy sum is the gradient O2NC steps with. Every row gets its own directions on the sphere of radius
sqrt(d) (a shared set would stop the variance falling with the batch), and lambda = r / sqrt(d) makes
each term the papers' (d / 2r)(f(x + r y) - f(x - r y)) y with y on the unit sphere.

- variant original (Zhang et al., Algorithms 1-2): d directions per row; central differences at a period start,
  the coupled one-sided difference (f(z_t + lambda u) - f(z_(t-1) + lambda u)) / lambda after; every
  coefficient clipped to +-C_s at a start and +-C_s |z_t - z_(t-1)| / r after (C_s = L sqrt(d): the
  Lipschitz bound, so the clip never binds on an L-Lipschitz loss and privacy never rests on it).
- variant improved (Kornowski et al., Algorithm 3): m directions per row at a start; after, central estimates at z_t
  and z_(t-1) on independent directions (the paper's) or on the same m_D (coupled: privzo's
  deviation [DEV]); the per-example vectors clipped in L2 to C_G and C_Delta.

``FoSpiderEstimator`` is Kornowski et al.'s first-order oracle on the same tree (Algorithm 5): gradients at
points of the ball of radius r, one per row at a period start, m independent ones at each point of a
difference.

``ZoNaiveEstimator`` is Zhang et al.'s Appendix E baseline: one row and one direction a step, the central
estimate clipped per coefficient and released with plain d-dimensional Gaussian noise.
"""
from __future__ import annotations

import math
from typing import Tuple

from components.memory_plan import Settings, Sizes, float64_vectors, holds
from components.queries import PerExampleBall, PerExampleSphere, Update
from components.randomness import STREAM_EXAMPLE_DIRECTION, public_seed


class ZoSpiderEstimator:
    queries_per_step = 1  # one d-dimensional increment a step

    def __init__(self, variant: str, radius: float, dimension: int, period: int, start_directions: int,
                 directions: int, start_clip: float, difference_clip: float, step_bound: float,
                 keyed_by_row: bool = False, coupled: bool = True):
        if variant not in ("original", "improved"):
            raise ValueError(f"estimator.variant: {variant!r}; allowed: original, improved")
        if not (radius > 0 and start_clip > 0 and difference_clip > 0 and step_bound > 0):
            raise ValueError("zo_spider: radius, clips and step bound must be > 0")
        self.name = "zo_spider"
        self.variant = variant
        self.radius = float(radius)
        self.dimension = int(dimension)
        self.smoothing = self.radius / math.sqrt(self.dimension)
        self.period = int(period)
        self.start_directions = int(start_directions)
        self.directions = int(directions)
        self.start_clip = float(start_clip)
        self.difference_clip = float(difference_clip)
        self.step_bound = float(step_bound)
        self.clip_mode = "scalar" if variant == "original" else "vector"
        # Poisson batches under add/remove: a row's directions from its content, not its place in the batch
        self.keyed_by_row = bool(keyed_by_row)
        # improved: a difference's two points on the same directions (privzo's deviation) or on independent ones (the paper's)
        self.coupled = bool(coupled)

    def direction_seeds(self, step: int, seed: int):
        return ()  # per-example directions, drawn where the rows are

    def query(self, step: int, seed: int, offset=None) -> PerExampleSphere:
        """Step ``step``'s query: the start estimate at a period's first position, else the difference to the
        previous query point (``offset`` = z_(t-1) - z_t, public)."""
        base = public_seed(seed, STREAM_EXAMPLE_DIRECTION, step)
        if step % self.period == 0:
            return PerExampleSphere("central", self.start_directions, base, self.smoothing, self.clip_mode,
                                    self.start_clip, keyed_by_row=self.keyed_by_row)
        if offset is None:
            raise ValueError("zo_spider: a difference step needs the previous query point")
        if self.variant == "original":
            moved = math.sqrt(sum(float(t.double().pow(2).sum()) for t in offset))
            # the clip follows the move, never past the a-priori 2D the noise was calibrated for
            clip = self.difference_clip * min(moved, 2 * self.step_bound) / self.radius
            return PerExampleSphere("one_sided_difference", self.directions, base, self.smoothing, "scalar",
                                    clip, tuple(offset), keyed_by_row=self.keyed_by_row)
        return PerExampleSphere("central_difference" if self.coupled else "independent_difference", self.directions,
                                base, self.smoothing, "vector", self.difference_clip, tuple(offset),
                                keyed_by_row=self.keyed_by_row)

    def step(self, ctx) -> Update:
        offset = None if ctx.step % self.period == 0 else ctx.offset_to_previous()
        released = ctx.release_increment(self.query(ctx.step, ctx.seed, offset))
        return Update(dense=((tuple(released), 1.0),))


class FoSpiderEstimator(ZoSpiderEstimator):
    """Kornowski, Liu and Talwar's first-order oracle (Algorithm 5, Theorem 6.1) with the same tree, schedule and O2NC: at a
    period's first step each of the start_batch rows gives its gradient at one point uniform in the ball of
    radius r around z_t (clipped to the Lipschitz bound, which an L-Lipschitz loss never exceeds); after,
    each row gives the difference of its gradients averaged over m independent ball points around z_t and
    m around z_(t-1), clipped in L2 to C_Delta."""

    def __init__(self, radius: float, dimension: int, period: int, directions: int, start_clip: float,
                 difference_clip: float, step_bound: float, start_directions: int = 1, keyed_by_row: bool = False):
        super().__init__("improved", radius, dimension, period, start_directions, directions, start_clip,
                         difference_clip, step_bound, keyed_by_row)
        self.name = "fo_spider"
        self.smoothing = self.radius  # ball points are drawn in the unit ball and scaled by r

    def query(self, step: int, seed: int, offset=None) -> PerExampleBall:
        base = public_seed(seed, STREAM_EXAMPLE_DIRECTION, step)
        if step % self.period == 0:
            return PerExampleBall("gradient", self.start_directions, base, self.smoothing, "vector", self.start_clip,
                                  keyed_by_row=self.keyed_by_row)
        if offset is None:
            raise ValueError("fo_spider: a difference step needs the previous query point")
        return PerExampleBall("gradient_difference", self.directions, base, self.smoothing, "vector",
                              self.difference_clip, tuple(offset), keyed_by_row=self.keyed_by_row)


class ZoNaiveEstimator:
    """001's Appendix E: g_t = (1/B) sum_i (d / 2r)(f(z + r u_i) - f(z - r u_i)) u_i + N(0, sigma^2 I)."""

    queries_per_step = 1

    def __init__(self, radius: float, dimension: int, directions: int, clip: float):
        if not (radius > 0 and clip > 0 and directions >= 1):
            raise ValueError("zo_naive: radius and clip must be > 0, directions >= 1")
        self.name = "zo_naive"
        self.radius = float(radius)
        self.dimension = int(dimension)
        self.smoothing = self.radius / math.sqrt(self.dimension)
        self.directions = int(directions)
        self.clip = float(clip)

    def direction_seeds(self, step: int, seed: int):
        return ()

    def step(self, ctx) -> Update:
        query = PerExampleSphere("central", self.directions, public_seed(ctx.seed, STREAM_EXAMPLE_DIRECTION, ctx.step),
                                 self.smoothing, "scalar", self.clip)
        released = ctx.release(query)
        return Update(dense=((tuple(released), 1.0 / ctx.batch_normaliser),))


@holds("zo_spider", "fo_spider", "zo_naive")
def _oracle_memory(s: Sizes, st: Settings) -> Tuple[int, str]:
    """The forward beside a few float64 d-vectors."""
    return float64_vectors(s, st)

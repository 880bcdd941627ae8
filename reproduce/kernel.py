"""A vectorised numpy reference kernel of privzo's nonsmooth runs on P1, for rate sweeps.

One step of privzo's O2NC runs (zo_spider Zhang et al. / Kornowski et al. with tree aggregation, or Zhang et al.'s zo_naive baseline) costs
milliseconds of Python and torch dispatch on a problem of dimension 4; the papers' rates need runs of up to
10^6 rows. This kernel computes the same formulas, the same order of operations where it matters, for R runs
at once (seeds as a batch dimension), so a sweep takes minutes.

It is evidence about privzo only because it is checked against privzo: ``Kernel.run`` with ``PrivzoStreams``
reads every random input the way a privzo run does (the public seed's row order, per-example directions and
query-point fractions; the noise from the generator a test injects), and
``tests/reproduce/test_kernels.py`` and the reproduction command compare its query points and window
certificates with privzo's own loop (estimator, door, mechanism, sampler, optimizer) to 1e-9. Sweeps then
use ``FastStreams``: the same distributions drawn in batches (fresh rows and noise per seed).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch

from components.families.nonsmooth.problems import load_w_linear, smoothed_gradient
from components.protocols import ScheduledBatches


@dataclass(frozen=True)
class KernelPlan:
    """The numbers a resolved nonsmooth spec runs with (``from_spec``)."""

    algorithm: str  # original (Zhang et al.) | improved (Kornowski et al.) | improved_fo (Kornowski et al. first order) | original_naive (Zhang et al.'s baseline)
    dimension: int
    radius: float
    steps: int
    window: int
    period: int
    start_batch: int
    step_batch: int
    start_directions: int
    directions: int
    start_clip: float  # inf: a twin without a mechanism clips nothing
    difference_clip: float
    step_bound: float
    lr: float
    restart: bool
    noise_std: float  # the tree's node std (Zhang et al., Kornowski et al.) or the Gaussian's std (naive); 0 without a mechanism
    start: float
    seed: int
    # Kornowski et al.'s multi-pass algorithm: every row in every step, a restart every ``period`` steps; a restart's
    # release carries noise_std, a difference's difference_noise_std
    multi_pass: bool = False
    difference_noise_std: float = 0.0
    # Kornowski et al. zeroth-order: a difference's two points on the same m directions (privzo's deviation from the paper) or on 2m
    coupled: bool = True

    @property
    def first_order(self) -> bool:
        return self.algorithm == "improved_fo"

    @property
    def smoothing(self) -> float:
        """lambda: sphere directions have norm sqrt(d); ball points lie in the unit ball, scaled by r."""
        return self.radius if self.first_order else self.radius / math.sqrt(self.dimension)

    @property
    def windows(self) -> int:
        return self.steps // self.window

    @classmethod
    def from_spec(cls, spec, n: Optional[int] = None) -> "KernelPlan":
        """``n``: the private rows, which a multi-pass plan's noise (2 clip / n per release) needs."""
        from components.families.nonsmooth.plan import coupled_directions, node_sensitivity

        est, mech, sampling, opt = spec.estimator, spec.mechanism, spec.sampling, spec.optimizer
        d = spec.data.source.dimension
        private = mech.kind != "none"
        naive = est.kind == "zo_naive"
        if naive:
            clip = float(mech.clip) if private else math.inf
            std = float(mech.noise_multiplier) * 2.0 * clip * math.sqrt(d) if private else 0.0
            return cls("original_naive", d, float(est.radius), int(opt.steps), int(opt.window), 1, sampling.step_batch,
                       sampling.step_batch, est.directions, est.directions, clip, clip, float(opt.step_bound),
                       float(opt.lr), bool(opt.restart), std, spec.data.source.start, spec.seed)
        if sampling.kind == "poisson":  # its batches come from a private generator, which no kernel replays
            raise ValueError("reproduction kernel: a Poisson multi-pass run's batches are secret; the kernel replays "
                             "full batches and single passes")
        if sampling.kind == "full_batch":  # Kornowski et al.'s multi-pass algorithm (scheduled_gaussian, or its twin)
            n = spec.public_rows(n)
            stds = ((float(mech.noise_multiplier) * 2.0 * float(mech.clip) / n,
                     float(mech.difference_noise_multiplier) * 2.0 * float(mech.difference_clip) / n)
                    if private else (0.0, 0.0))
            return cls(est.variant, d, float(est.radius), int(opt.steps), int(opt.window), int(est.period), n, n,
                       int(est.start_directions), int(est.directions), float(mech.clip) if private else math.inf,
                       float(mech.difference_clip) if private else math.inf, float(opt.step_bound), float(opt.lr),
                       bool(opt.restart), stds[0], spec.data.source.start, spec.seed, True, stds[1],
                       coupled_directions(spec))
        std = float(mech.noise_multiplier) * node_sensitivity(spec, d) if private else 0.0
        return cls(est.variant, d, float(est.radius), int(opt.steps), int(opt.window), sampling.period,
                   sampling.start_batch, sampling.step_batch, est.start_directions, est.directions,
                   float(mech.clip) if private else math.inf, float(mech.difference_clip) if private else math.inf,
                   float(opt.step_bound), float(opt.lr), bool(opt.restart), std, spec.data.source.start, spec.seed,
                   coupled=est.variant == "original" or coupled_directions(spec))


class PrivzoStreams:
    """Every random input of one privzo run (R = 1), drawn as privzo draws it: the single pass's order from
    the public seed (``sampler``, the run's own SinglePassSampler), per-example directions from
    public_seed(seed, STREAM_EXAMPLE_DIRECTION, step) and the slot, the O2NC fractions and output window from
    the seed, and the noise from ``noise_generator`` (the generator injected into the privzo run)."""

    runs = 1

    def __init__(self, plan: KernelPlan, rows: np.ndarray, sampler, noise_generator: Optional[torch.Generator]):
        self.plan, self._rows, self._sampler, self._generator = plan, rows, sampler, noise_generator

    def rows(self, step: int, size: int) -> np.ndarray:
        scheduled = isinstance(self._sampler, ScheduledBatches)
        idx = (self._sampler.sample_at(step, step) if scheduled else self._sampler.sample()).numpy()
        return self._rows[idx][None]

    def row_mean(self) -> np.ndarray:
        return self._rows.mean(axis=0)[None]

    def directions(self, step: int, first: int, count: int, m: int) -> np.ndarray:
        from components.queries.clipped_sums import example_directions
        from components.randomness import STREAM_EXAMPLE_DIRECTION, public_seed

        base = public_seed(self.plan.seed, STREAM_EXAMPLE_DIRECTION, step)
        return np.stack([example_directions(base, i, m, self.plan.dimension).numpy()
                         for i in range(first, first + count)])[None]

    def ball_points(self, step: int, first: int, count: int, m: int) -> np.ndarray:
        from components.queries.clipped_sums import example_ball_points
        from components.randomness import STREAM_EXAMPLE_DIRECTION, public_seed

        base = public_seed(self.plan.seed, STREAM_EXAMPLE_DIRECTION, step)
        return np.stack([example_ball_points(base, i, m, self.plan.dimension).numpy()
                         for i in range(first, first + count)])[None]

    def fraction(self, t: int) -> np.ndarray:
        return np.array([np.random.default_rng([self.plan.seed, t]).random()])

    def output_window(self) -> np.ndarray:
        return np.array([np.random.default_rng(self.plan.seed).integers(1, self.plan.windows + 1)])

    def noise(self) -> np.ndarray:
        return torch.randn(self.plan.dimension, generator=self._generator, dtype=torch.float64).numpy()[None]


class FastStreams:
    """The same distributions for R = len(seeds) runs at once: rows of P1 fresh per seed (uniform on the
    sphere of radius ``noise_radius``; i.i.d., so read in order), directions uniform on the sphere of radius
    sqrt(d), fractions U[0, 1], the output window uniform, standard normal noise."""

    def __init__(self, plan: KernelPlan, seeds: Sequence[int], n: int, noise_radius: float):
        self.plan = plan
        self.runs = len(seeds)
        self._data = np.stack([load_w_linear(plan.dimension, n, noise_radius, 10_000 + s) for s in seeds])
        self._rng = np.random.default_rng([20_261_124, *seeds, n])
        self._next = 0
        self._buffers = {}  # draws are made in blocks: one numpy call per block, not per step

    def _draw(self, key, shape, draw) -> np.ndarray:
        block, used = self._buffers.get(key, (None, 0))
        if block is None or used == len(block):
            count = max(1, 2 ** 16 // max(1, int(np.prod(shape))))
            block, used = draw((count, *shape)), 0
        self._buffers[key] = (block, used + 1)
        return block[used]

    def row_mean(self) -> np.ndarray:
        """[R, d]: the mean of each run's rows (xi-bar, the linear term of P1's empirical objective)."""
        return self._data.mean(axis=1)

    def rows(self, step: int, size: int) -> np.ndarray:
        if self.plan.multi_pass:  # every row in every step
            return self._data
        start, self._next = self._next, self._next + size
        if self._next > self._data.shape[1]:
            raise RuntimeError(f"kernel: the pass needs more than {self._data.shape[1]} rows")
        return self._data[:, start:self._next]

    def directions(self, step: int, first: int, count: int, m: int) -> np.ndarray:
        def draw(shape):
            g = self._rng.standard_normal(shape)
            return g * (math.sqrt(self.plan.dimension) / np.linalg.norm(g, axis=-1, keepdims=True))

        return self._draw(("directions", count, m), (self.runs, count, m, self.plan.dimension), draw)

    def ball_points(self, step: int, first: int, count: int, m: int) -> np.ndarray:
        d = self.plan.dimension

        def draw(shape):
            g = self._rng.standard_normal(shape)
            radii = self._rng.random(shape[:-1]) ** (1.0 / d)
            return g * (radii / np.linalg.norm(g, axis=-1))[..., None]

        return self._draw(("ball", count, m), (self.runs, count, m, d), draw)

    def fraction(self, t: int) -> np.ndarray:
        return self._draw("fraction", (self.runs,), self._rng.random)

    def output_window(self) -> np.ndarray:
        return self._rng.integers(1, self.plan.windows + 1, size=self.runs)

    def noise(self) -> np.ndarray:
        return self._draw("noise", (self.runs, self.plan.dimension), self._rng.standard_normal)


def h_of(points: np.ndarray) -> np.ndarray:
    """h over the last axis: d^(-1/2) sum_j min(|x_j - 1|, |x_j + 1|) (= ||x_j| - 1|)."""
    return np.abs(np.abs(points) - 1).sum(axis=-1) / math.sqrt(points.shape[-1])


def _h_central(a: np.ndarray, shift: np.ndarray, reach: float) -> np.ndarray:
    """h(a + shift) - h(a - shift) for points a [R, d] and shifts [R, b, m, d] with |shift_j| <= reach.
    psi is linear between its kinks (-1, 0, 1): a coordinate further than ``reach`` from every kink in every
    run contributes exactly 2 psi'(a_j) shift_j (one einsum); only the others are evaluated point by point.
    Equal to the direct evaluation up to rounding (the match against privzo checks it)."""
    distance = np.abs(np.abs(np.abs(a) - 0.5) - 0.5)  # to the nearest of -1, 0, 1
    near = np.any(distance <= reach * (1 + 1e-9), axis=0)
    far = ~near
    out = 0.0
    if far.any():
        slope = _slope(a[:, far])
        out = 2.0 * np.einsum("rbmd,rd->rbm", shift[..., far], slope)
    if near.any():
        centre = a[:, None, None, near]
        out = out + (np.abs(np.abs(centre + shift[..., near]) - 1)
                     - np.abs(np.abs(centre - shift[..., near]) - 1)).sum(axis=-1)
    return out / math.sqrt(a.shape[-1])


def _slope(points: np.ndarray) -> np.ndarray:
    """psi'(x) elementwise: +1 on (-1, 0) and (1, inf), -1 on (-inf, -1) and (0, 1)."""
    return np.sign(np.abs(points) - 1) * np.sign(points)


def _loss(points: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """f(point; xi) for points [R, b, m, d] and rows [R, b, d]: [R, b, m]."""
    return h_of(points) + np.einsum("rbmd,rbd->rbm", points, rows)


def _norms(a: np.ndarray) -> np.ndarray:
    """L2 norms of the rows of [R, d] (one einsum: cheaper than linalg.norm on tiny arrays)."""
    return np.sqrt(np.einsum("rd,rd->r", a, a))


@dataclass
class KernelResult:
    certificates: np.ndarray  # [R, windows]: Gamma_k of every window
    output: np.ndarray  # [R, d]: the output window's average
    query_points: Optional[np.ndarray]  # [R, steps + 1, d] when recorded
    # [R, windows]: the same on the rows' empirical objective h + <xi-bar, x> (Kornowski et al.'s multi-pass guarantee)
    empirical_certificates: Optional[np.ndarray] = None

    @property
    def certificate(self) -> np.ndarray:
        """Gamma-bar per run: the mean over windows (the expectation over the output window k*)."""
        return self.certificates.mean(axis=1)


class Kernel:
    def __init__(self, plan: KernelPlan):
        self.plan = plan
        self._clipped = math.isfinite(plan.start_clip)

    # rows are evaluated about this many points of R x rows x directions x d at a time
    CHUNK_VALUES = 2 ** 20

    def _estimate(self, step: int, z: np.ndarray, previous: Optional[np.ndarray], streams) -> np.ndarray:
        """The step's increment, [R, d]: the batch mean of per-example clipped estimates."""
        p = self.plan
        start = p.algorithm == "original_naive" or step % p.period == 0
        if p.first_order:
            return self._fo_estimate(step, start, z, previous, streams)
        size = p.start_batch if start else p.step_batch
        m = p.start_directions if start else p.directions
        drawn = m if start or p.coupled else 2 * m  # an independent difference: m more at its other point
        rows = streams.rows(step, size)
        chunk = max(1, self.CHUNK_VALUES // (streams.runs * drawn * p.dimension))
        total = 0.0
        for first in range(0, size, chunk):
            count = min(chunk, size - first)
            total = total + self._sums(step, start, z, previous, rows[:, first:first + count],
                                       streams.directions(step, first, count, drawn))
        return total / size

    def _fo_estimate(self, step: int, start: bool, z: np.ndarray, previous: Optional[np.ndarray], streams) -> np.ndarray:
        """Kornowski et al.'s first-order increment, [R, d]. On P1 grad f(x; xi) = d^(-1/2) psi'(x) + xi, and psi' is
        constant between its kinks: a coordinate further than r from every kink at both points (in every
        run) has the same gradient at every ball point, so its difference is exactly 0 (its start estimate
        exactly d^(-1/2) psi'(z_j) + xi_j); ball points are drawn only when some coordinate is near a kink."""
        p = self.plan
        size = p.start_batch if start else p.step_batch
        rows = streams.rows(step, size)
        centres = [z] if start else [z, z + (previous - z)]
        m = p.start_directions if start else p.directions
        near = np.zeros(p.dimension, dtype=bool)
        for centre in centres:
            near |= np.any(np.abs(np.abs(np.abs(centre) - 0.5) - 0.5) <= p.radius * (1 + 1e-9), axis=0)
        scale = 1.0 / math.sqrt(p.dimension)
        if start:
            g = np.broadcast_to(scale * _slope(z)[:, None, :], rows.shape[:2] + (p.dimension,)).copy()
        else:
            g = np.zeros((streams.runs, size, p.dimension))
        if near.any():
            chunk = max(1, self.CHUNK_VALUES // (streams.runs * m * len(centres) * p.dimension))
            for first in range(0, size, chunk):
                count = min(chunk, size - first)
                y = p.radius * streams.ball_points(step, first, count, m * len(centres))  # [R, b, m (x2), d]
                part = 0.0
                for c, centre in enumerate(centres):
                    points = centre[:, None, None, near] + y[:, :, c * m:(c + 1) * m, near]
                    part = part + (1.0 if c == 0 else -1.0) * _slope(points).sum(axis=2)
                g[:, first:first + count, near] = scale * part / m
        if start:
            g = g + rows
        if self._clipped:
            clip = p.start_clip if start else p.difference_clip
            norms = np.sqrt(np.einsum("rbd,rbd->rb", g, g))[:, :, None]
            g = g * np.minimum(clip / np.maximum(norms, 1e-300), 1.0)
        return g.sum(axis=1) / size

    def _sums(self, step, start, z, previous, xi, u) -> np.ndarray:
        """sum over the rows of xi of their clipped estimates g_i, [R, d]."""
        p = self.plan
        m = u.shape[2] if start or p.coupled else u.shape[2] // 2
        lam = p.smoothing
        shift = lam * u
        here = z[:, None, None, :]
        reach = lam * math.sqrt(p.dimension)  # |lambda u_j| <= lambda sqrt(d) = r
        if start:
            # f(z + s; xi) - f(z - s; xi) = h(z + s) - h(z - s) + 2 <xi, s> on P1
            c = (_h_central(z, shift, reach) + 2.0 * np.einsum("rbmd,rbd->rbm", shift, xi)) / (2 * lam)
            clip = p.start_clip
        else:
            other = (z + (previous - z))[:, None, None, :]  # z_t + (z_(t-1) - z_t), as privzo forms it
            if p.algorithm == "original":
                c = (_loss(here + shift, xi) - _loss(other + shift, xi)) / lam
                moved = _norms(previous - z)
                clip = p.difference_clip * np.minimum(moved, 2 * p.step_bound) / p.radius
            elif p.coupled:
                # the rows' linear terms cancel between the two central differences
                c = (_h_central(z, shift, reach) - _h_central(z + (previous - z), shift, reach)) / (2 * lam)
                clip = p.difference_clip
            else:  # central estimates at z_t on the first m directions and at z_(t-1) on the other m
                mine, theirs = shift[:, :, :m], shift[:, :, m:]
                c = np.concatenate([
                    _h_central(z, mine, reach) + 2.0 * np.einsum("rbmd,rbd->rbm", mine, xi),
                    -(_h_central(z + (previous - z), theirs, reach) + 2.0 * np.einsum("rbmd,rbd->rbm", theirs, xi))],
                    axis=2) / (2 * lam)
                clip = p.difference_clip
        scalar = p.algorithm not in ("improved", "improved_fo")
        if scalar and self._clipped:
            bound = clip[:, None, None] if isinstance(clip, np.ndarray) else clip
            c = np.clip(c, -bound, bound)
        g = np.einsum("rbm,rbmd->rbd", c, u) / m
        if not scalar and self._clipped:
            norms = np.sqrt(np.einsum("rbd,rbd->rb", g, g))[:, :, None]
            g = g * np.minimum(clip / np.maximum(norms, 1e-300), 1.0)
        return g.sum(axis=1)

    def run(self, streams, record: bool = False) -> KernelResult:
        p = self.plan
        runs, d, w = streams.runs, p.dimension, p.window
        x = np.full((runs, d), float(p.start))
        delta = np.zeros((runs, d))
        z, previous = x.copy(), None
        k_star = streams.output_window()
        out_sum = np.zeros((runs, d))
        window_points: List[np.ndarray] = []
        certificates: List[np.ndarray] = []
        empirical: List[np.ndarray] = []
        row_mean = streams.row_mean() if p.multi_pass else None
        points = [z.copy()] if record else None
        total = noise_sum = None
        prefix = {}  # position -> the noise of the chain of that position (Fenwick: chain(b - lowbit b) + xi_b)

        def add_query_point(t: int, point: np.ndarray) -> None:
            if t > p.windows * w:
                return
            k = (t - 1) // w + 1
            hit = k_star == k
            if hit.any():
                out_sum[hit] += point[hit]
            window_points.append(point.copy())
            if t % w == 0:
                grads = smoothed_gradient(np.stack(window_points), p.radius)  # [W, R, d]
                certificates.append(np.linalg.norm(grads.mean(axis=0), axis=1))
                if row_mean is not None:
                    empirical.append(np.linalg.norm(grads.mean(axis=0) + row_mean, axis=1))
                window_points.clear()

        add_query_point(1, z)
        for step in range(p.steps):
            increment = self._estimate(step, z, previous, streams)
            if p.algorithm == "original_naive":
                released = increment + (p.noise_std * streams.noise() / p.start_batch if p.noise_std else 0.0)
            elif p.multi_pass:  # each step a fresh Gaussian on its increment, added to the previous release
                restart = step % p.period == 0
                std = p.noise_std if restart else p.difference_noise_std
                noisy = increment + (std * streams.noise() if std else 0.0)
                total = noisy if restart else total + noisy
                released = total
            else:
                pos = step % p.period + 1
                total = increment if pos == 1 else total + increment
                released = total
                if p.noise_std:
                    if pos == 1:
                        prefix = {0: 0.0}
                    low = pos & -pos
                    noise_sum = prefix[pos - low] + p.noise_std * streams.noise()
                    prefix[pos] = noise_sum
                    released = total + noise_sum
            t = step + 2
            if p.restart and (t - 1) % w == 0:
                moved = np.zeros_like(delta)
            else:
                moved = delta - p.lr * released
            norm = _norms(moved)[:, None]
            delta = moved * np.where(norm <= p.step_bound, 1.0, p.step_bound / np.maximum(norm, 1e-300))
            previous = z
            z = x + streams.fraction(t)[:, None] * delta
            if record:
                points.append(z.copy())
            add_query_point(t, z)
            x = x + delta
        return KernelResult(np.stack(certificates, axis=1) if certificates else np.zeros((runs, 0)),
                            out_sum / w, np.stack(points, axis=1) if record else None,
                            np.stack(empirical, axis=1) if empirical else None)

"""DPZero's Figure 1 (§5.1): the gradient norm reached by DPZero, DPGD-0th and DP-GD on the
synthetic quadratic against the dimension d, for three Hessian spectra, each method's best over a grid.

    F(x) = (1/2n) sum_i (x - x_i)^T A (x - x_i),   x_i ~ N(1, I_d),   x_0 = 0,   A diagonal with
    identity: A = I (Tr A = d),   inverse_sqrt: A = diag(1/sqrt(j)) (Tr A ~ 2 sqrt(d)),   inverse: A = diag(1/j)
    (Tr A ~ log d); ||A|| = 1, so the effective rank r is Tr A.

The three algorithms are privzo's: two_point (DPZero, Algorithm 2: one Gaussian direction a step, per-example
scalar finite differences clipped to [-C, C], one scalar of noise), dpgd_0th (Algorithm 1: the d-dimensional
a_i u clipped in L2, d-dimensional noise) and first_order (DP-GD: per-example gradients clipped in L2), each with
privzo's Gaussian mechanism and plain SGD, every row in every step (full batch, as Algorithms 1 and 2 are
stated) under replace-one neighbours (the paper's, and the one under which a full-batch mean divides by a public
n): the noise std on the clipped sum is sigma * 2C, sigma calibrated by privzo's accountant (RDP, dp-accounting)
for the run's T releases at (epsilon, delta) = (2, 1e-6).

The kernel runs a whole grid at once for one (d, spectrum), in float64. For the quadratic the central finite
difference is exact, (f(x + lam u; x_i) - f(x - lam u; x_i)) / (2 lam) = u^T A (x - x_i) = c - v_i with
c = (Au)^T x and v = X (Au): the directions are public and drawn ahead of the data, so v comes for a block of steps
from one matrix product, and the clipped sum over the n rows of every run in one sort of v (prefix sums: where
c - v_i leaves [-b, b] it counts +-b). DPGD-0th's clip of a_i u in L2 is the scalar clip of a_i at C / |u|. DP-GD
takes the per-example gradient norms |A(x - x_i)| from one product with the rows, and skips it when no row can
reach the clip (|A(x - mean)| + max_i |A(x_i - mean)| <= C: the plain sum n A(x - mean)). The runs of one
(d, spectrum) share their rows, their directions and their standard normal noise draws, each run scaling the draws
by its own std (common random numbers): each run alone has its algorithm's exact distribution.

``match`` checks the kernel against privzo itself: privzo's loop (PrivateLoop over a LocalBackend, the estimator,
GaussianMechanism, FullBatchSampler, the privacy tracker, Sgd; assembled as builders.build_loop assembles a
full-batch Gaussian run, with the quadratic as the model, since the quadratic is no spec'd data source) runs one
grid point with an injected noise generator, its per-example values from forward passes at x +- lam u; the kernel,
reading privzo's directions and the same generator, must give every iterate to 1e-9.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from reproduce.agreement import Agreement

EPSILON = 2.0
DELTA = 1e-6
ACCOUNTANT = "rdp"
NEIGHBORING = "replace_one"
SMOOTHING = 1e-4  # the paper's lambda (Table 6)
SPECTRA = ("identity", "inverse_sqrt", "inverse")
SPECTRUM_LABELS = {"identity": "A = I (r = d)", "inverse_sqrt": "A = diag(1/√j) (r ≈ 2√d)",
                   "inverse": "A = diag(1/j) (r ≈ log d)"}
METHODS = ("dpzero", "dpgd_0th", "dp_gd")
METHOD_LABELS = {"dpzero": "DPZero", "dpgd_0th": "DPGD-0th", "dp_gd": "DP-GD"}

# the paper's Table 6
PAPER_DIMS = (20, 50, 100, 200, 500, 1000, 2000)
PAPER_STEPS = (10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120)
PAPER_LRS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
PAPER_CLIPS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
PAPER_ROWS = 10_000
ROWS = 2_000  # the reproduction's n (train and test each)


def hessian_diagonal(spectrum: str, d: int) -> np.ndarray:
    """The diagonal of A (its largest entry 1)."""
    j = np.arange(1, d + 1, dtype=np.float64)
    if spectrum == "identity":
        return np.ones(d)
    if spectrum == "inverse_sqrt":
        return 1.0 / np.sqrt(j)
    if spectrum == "inverse":
        return 1.0 / j
    raise ValueError(f"reproduce dpzero: unknown spectrum {spectrum!r}; allowed: {', '.join(SPECTRA)}")


def effective_rank(spectrum: str, d: int) -> float:
    """r = Tr(A) / ||A|| (Assumption 3.5 of the paper; ||A|| = 1 here)."""
    return float(hessian_diagonal(spectrum, d).sum())


def spectra_of(experiments: Sequence[str]) -> List[str]:
    unknown = [e for e in experiments if e not in SPECTRA]
    if unknown:
        raise ValueError(f"reproduce dpzero: unknown experiment {unknown[0]!r}; allowed: {', '.join(SPECTRA)} "
                         "(the Hessian spectra of Figure 1's panels)")
    return list(experiments)


# ------------------------------------------------------------------ the grid
@dataclass(frozen=True)
class Grid:
    """The dimensions, rows and per-method hyperparameter grids of a reproduction."""

    rows: int
    dims: Tuple[int, ...]
    steps: Dict[str, Tuple[int, ...]]
    lrs: Dict[str, Tuple[float, ...]]
    clips: Dict[str, Tuple[float, ...]]

    def runs(self, method: str) -> List[Tuple[int, float, float]]:
        """(T, lr, C) of every grid point of ``method``."""
        return [(t, lr, c) for t in self.steps[method] for lr in self.lrs[method] for c in self.clips[method]]


def grid_of(quick: bool = False) -> Grid:
    """The paper's grid for the zeroth-order methods (their kernel's cost per step does not grow with runs times
    rows); DP-GD's per-example gradient norms cost n d per run and step, so its grid keeps the paper's three
    largest step sizes (GD on an ||A|| = 1 quadratic) and T <= 640, and every grid has n = 2,000 rows, not
    10,000, to hold the command to minutes on 2 cores (``docs/results/dpzero_fig1.md``). ``quick``: tiny grids
    through the same code."""
    if quick:
        zo = {"steps": (10, 40), "lrs": (1e-3, 1e-2, 0.1), "clips": (1.0, 10.0)}
        gd = {"steps": (10, 40), "lrs": (0.3, 1.0), "clips": (1.0, 10.0)}
        rows, dims = 1_000, (20, 50)
    else:
        zo = {"steps": PAPER_STEPS, "lrs": PAPER_LRS, "clips": PAPER_CLIPS}
        gd = {"steps": PAPER_STEPS[:7], "lrs": PAPER_LRS[-3:], "clips": PAPER_CLIPS}
        rows, dims = ROWS, PAPER_DIMS
    per = {"dpzero": zo, "dpgd_0th": zo, "dp_gd": gd}
    return Grid(rows, dims, {m: per[m]["steps"] for m in METHODS}, {m: per[m]["lrs"] for m in METHODS},
                {m: per[m]["clips"] for m in METHODS})


def paper_grid(rows: int, dims: Tuple[int, ...] = PAPER_DIMS) -> Grid:
    """The paper's Table 6 grid for every method, at ``rows`` rows (the reproduction runs DP-GD on it at the
    smallest d, to measure what DP-GD's reduced grid costs)."""
    return Grid(rows, dims, {m: PAPER_STEPS for m in METHODS}, {m: PAPER_LRS for m in METHODS},
                {m: PAPER_CLIPS for m in METHODS})


# ------------------------------------------------------------------ privacy: privzo's planner
@functools.lru_cache(maxsize=None)
def noise_multiplier(steps: int, rows: int) -> float:
    """sigma (std / sensitivity) for ``steps`` full-batch Gaussian releases at (EPSILON, DELTA), replace-one: the
    event privzo's planner builds for such a run (builders.planned_event: the sampler's wrap of the Gaussian,
    self-composed over the planned steps), calibrated by privzo's accountant (dp-accounting's
    calibrate_dp_mechanism, never less privacy than asked)."""
    from components.accountants import Accountant

    return Accountant(ACCOUNTANT, NEIGHBORING).calibrate(lambda sigma: run_event(steps, rows, sigma), EPSILON, DELTA)


def run_event(steps: int, rows: int, sigma: float):
    import dp_accounting

    from components.data.sampling import FullBatchSampler

    return dp_accounting.SelfComposedDpEvent(FullBatchSampler(rows).wrap(dp_accounting.GaussianDpEvent(sigma)),
                                             steps)


def planned_epsilon(steps: int, rows: int) -> float:
    """epsilon at DELTA of a run of ``steps`` releases at its calibrated sigma (privzo's accountant)."""
    from components.accountants import Accountant

    return Accountant(ACCOUNTANT, NEIGHBORING).epsilon(run_event(steps, rows, noise_multiplier(steps, rows)), DELTA)


# ------------------------------------------------------------------ the problem
def data(seed: int, d: int, n: int) -> Tuple[np.ndarray, np.ndarray]:
    """(train, test) rows, each n x d with x_i ~ N(1, I_d), float64."""
    rng = np.random.default_rng([seed, d, n, 4004])
    return 1.0 + rng.standard_normal((n, d)), 1.0 + rng.standard_normal((n, d))


class Quadratic(nn.Module):
    """The parameter vector x (float64) and its per-example loss f(x; x_i) = 1/2 (x - x_i)^T A (x - x_i),
    ``forward(rows)`` of shape [b]. ``objective`` marks a model whose output is its per-example loss."""

    objective = "dpzero_quadratic"

    def __init__(self, diagonal: np.ndarray, start: np.ndarray):
        super().__init__()
        self.register_buffer("diagonal", torch.as_tensor(np.asarray(diagonal, dtype=np.float64)))
        self.x = nn.Parameter(torch.as_tensor(np.asarray(start, dtype=np.float64)).clone())

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        r = self.x - rows.to(self.x.dtype)
        return 0.5 * (r * r * self.diagonal).sum(dim=-1)


def gradient_norms(diagonal: np.ndarray, x: np.ndarray, rows_mean: np.ndarray) -> np.ndarray:
    """|grad F(x)| = |A (x - mean of the rows)| for each row of ``x`` (non-finite: inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        norms = np.linalg.norm(diagonal * (x - rows_mean), axis=-1)
    return np.where(np.isfinite(norms), norms, np.inf)


# ------------------------------------------------------------------ random inputs
class FastStreams:
    """A sweep's random inputs for one (seed, d): Gaussian directions, and standard normal noise (one scalar a step
    for DPZero, one d-vector a step for each d-dimensional method), each stream its own generator, drawn in blocks."""

    def __init__(self, seed: int, d: int):
        self.d = d
        self._directions = np.random.default_rng([seed, d, 1])
        self._noise = {kind: np.random.default_rng([seed, d, 2, i]) for i, kind in enumerate(METHODS)}
        self._blocks: Dict[str, Tuple[np.ndarray, int]] = {}

    def directions(self, start: int, stop: int) -> np.ndarray:
        """u_t for start <= t < stop, [stop - start, d] (asked in order)."""
        return self._directions.standard_normal((stop - start, self.d))

    def _next(self, kind: str, shape: Tuple[int, ...]) -> np.ndarray:
        block, used = self._blocks.get(kind, (None, 0))
        if block is None or used == len(block):
            block, used = self._noise[kind].standard_normal((max(1, 2 ** 16 // max(1, int(np.prod(shape)))), *shape)), 0
        self._blocks[kind] = (block, used + 1)
        return block[used]

    def scalar(self, method: str) -> float:
        return float(self._next(method, ()))

    def vector(self, method: str) -> np.ndarray:
        return self._next(method, (self.d,))


class PrivzoStreams:
    """One privzo run's random inputs, drawn as privzo draws them: the directions of its estimator's seeds from
    its Directions, and the noise from the generator injected into its mechanism, in the mechanism's order (one
    float64 normal per scalar release, d per dense one)."""

    def __init__(self, directions, estimator, seed: int, generator: torch.Generator, d: int):
        self._directions, self._estimator, self._seed = directions, estimator, seed
        self._generator, self.d = generator, d

    def directions(self, start: int, stop: int) -> np.ndarray:
        return np.stack([self._directions.tensor(self._estimator.direction_seeds(t, self._seed)[0], 0).numpy()
                         for t in range(start, stop)])

    def scalar(self, method: str) -> float:
        return float(torch.randn(1, generator=self._generator, dtype=torch.float64)[0])

    def vector(self, method: str) -> np.ndarray:
        return torch.randn(self.d, generator=self._generator, dtype=torch.float64).numpy()


# ------------------------------------------------------------------ the kernel
@dataclass
class Runs:
    """K runs of one method on one (d, spectrum): T, step size, clip and noise multiplier each."""

    method: str
    steps: np.ndarray  # int [K]
    lr: np.ndarray
    clip: np.ndarray
    multiplier: np.ndarray

    @classmethod
    def of(cls, method: str, points: Sequence[Tuple[int, float, float]], rows: int) -> "Runs":
        steps = np.array([p[0] for p in points], dtype=np.int64)
        return cls(method, steps, np.array([p[1] for p in points], dtype=np.float64),
                   np.array([p[2] for p in points], dtype=np.float64),
                   np.array([noise_multiplier(int(t), rows) for t in steps], dtype=np.float64))

    @property
    def std(self) -> np.ndarray:
        """The noise std on the clipped sum: sigma times the replace-one sensitivity 2C."""
        return self.multiplier * 2.0 * self.clip

    def by_steps(self) -> np.ndarray:
        """Indices ordering the runs by T, longest first: the runs still going at step t are a prefix."""
        return np.argsort(-self.steps, kind="stable")


@dataclass
class KernelResult:
    output: np.ndarray  # [K, d], the last iterate of each run, in the order given
    # with record: the first run's iterate after every step, and its share of clipped rows at every step
    trajectory: Optional[List[np.ndarray]] = None
    clipped: Optional[List[float]] = None


def _clipped_sums(sorted_v: np.ndarray, prefix: np.ndarray, c: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """sum_i clip(c_k - v_i, -b_k, b_k) for each run k, from v sorted and its prefix sums: rows with v_i < c - b
    give +b, rows with v_i > c + b give -b, the others c - v_i."""
    n = len(sorted_v)
    lo = np.searchsorted(sorted_v, c - bound, side="left")
    hi = np.searchsorted(sorted_v, c + bound, side="right")
    return bound * (lo - (n - hi)) + c * (hi - lo) - (prefix[hi] - prefix[lo])


def zeroth_order(diagonal: np.ndarray, rows: np.ndarray, start: np.ndarray, runs: Sequence[Runs], streams,
                 record: bool = False, block: Optional[int] = None) -> List[KernelResult]:
    """DPZero and DPGD-0th runs in lockstep on one set of directions: per step, the per-example finite
    differences a_ik = c_k - v_i of every run, clipped and summed, plus noise, then the SGD step.

    The iterates move only at the end of a block of steps, by one matrix product: inside a block a run's
    x(t) = x(t0) - sum_{t0 <= s < t} beta(s) u_s (- gamma N(t) for DPGD-0th, N(t) the sum of the shared noise
    vectors so far and gamma = lr std / n), so c(t) = (Au_t)^T x(t) is (Au_t)^T x(t0) corrected by the block's
    Gram matrix (Au_t)^T u_s. ``record``: run 0's iterate and its share of clipped rows at every step."""
    n, d = rows.shape
    block = block or int(np.clip(d // 4, 16, 256))
    states = []
    for r in runs:
        if r.method not in ("dpzero", "dpgd_0th"):
            raise ValueError(f"zeroth_order: {r.method!r} is not a zeroth-order method")
        order = r.by_steps()
        states.append({"runs": r, "order": order, "x": np.tile(start, (len(order), 1)), "steps": r.steps[order],
                       "lr": r.lr[order], "clip": r.clip[order], "std": r.std[order]})
    walk = np.zeros(d)  # N(t): DPGD-0th's noise vectors so far (shared by its runs, each scaling them by gamma)
    walks: Dict[int, np.ndarray] = {}  # N(T) at every T that ends a DPGD-0th run
    ends = {int(t) for st in states if st["runs"].method == "dpgd_0th" for t in st["steps"]}
    horizon = int(max(r.steps.max() for r in runs))
    trajectory = [start.copy()] if record else None
    clipped: Optional[List[float]] = [] if record else None
    tracked = start.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for first in range(0, horizon, block):
            last = min(horizon, first + block)
            directions = streams.directions(first, last)
            scaled = directions * diagonal  # A u
            values = scaled @ rows.T  # [b, n]: v_i = x_i^T A u, a step per row
            ordered = np.sort(values, axis=1)
            prefixes = np.hstack([np.zeros((last - first, 1)), np.cumsum(ordered, axis=1)])
            gram = scaled @ directions.T  # [b, b]: (A u_j)^T u_s
            for st in states:
                st["live"] = int(np.searchsorted(-st["steps"], -first, side="left"))  # runs with steps > first
                st["c"] = st["x"][:st["live"]] @ scaled.T  # [live, b]: (A u_j)^T x(first)
                st["beta"] = np.zeros((st["live"], last - first))
            for j, t in enumerate(range(first, last)):
                u = directions[j]
                sorted_v, prefix = ordered[j], prefixes[j]
                length = math.sqrt(float(u @ u))
                for st in states:
                    live = int(np.searchsorted(-st["steps"], -t, side="left"))
                    if live == 0:
                        continue
                    method, lr, clip, std = st["runs"].method, st["lr"][:live], st["clip"][:live], st["std"][:live]
                    c = st["c"][:live, j]
                    if method == "dpgd_0th":
                        gamma = lr * std / n
                        c = c - gamma * float(scaled[j] @ walk)
                    # DPGD-0th clips the vector a_i u in L2: the scalar a_i at C / |u|
                    bound = clip if method == "dpzero" else clip / length
                    sums = _clipped_sums(sorted_v, prefix, c, bound)
                    if method == "dpzero":
                        beta = lr * (sums + std * streams.scalar("dpzero")) / n
                    else:
                        beta = lr * sums / n
                        z = streams.vector("dpgd_0th")
                    st["beta"][:live, j] = beta
                    if j + 1 < last - first:
                        st["c"][:live, j + 1:] -= np.outer(beta, gram[j + 1:, j])
                    if record and st is states[0]:
                        clipped.append(float(np.mean(np.abs(c[0] - values[j]) > bound[0])))
                        tracked = tracked - beta[0] * u - (gamma[0] * z if method == "dpgd_0th" else 0.0)
                        trajectory.append(tracked.copy())
                    if method == "dpgd_0th":
                        walk = walk + z
                        if t + 1 in ends:
                            walks[t + 1] = walk.copy()
            for st in states:
                st["x"][:st["live"]] -= st["beta"] @ directions
    results = []
    for st in states:
        x = st["x"]
        if st["runs"].method == "dpgd_0th":
            gamma = st["lr"] * st["std"] / n
            x = x - gamma[:, None] * np.stack([walks[int(t)] for t in st["steps"]])
        output = np.empty_like(x)
        output[st["order"]] = x
        results.append(KernelResult(output, trajectory, clipped))
    return results


def dp_gd(diagonal: np.ndarray, rows: np.ndarray, start: np.ndarray, runs: Runs, streams,
          record: bool = False) -> KernelResult:
    """DP-GD runs in lockstep: per step, every run's per-example gradients A(x - x_i) clipped in L2 and summed,
    plus d-dimensional noise, then the SGD step."""
    n, d = rows.shape
    order = runs.by_steps()
    x = np.tile(start, (len(order), 1))
    steps, lr, clip, std = runs.steps[order], runs.lr[order], runs.clip[order], runs.std[order]
    square = diagonal * diagonal
    mean = rows.mean(axis=0)
    row_norms = ((rows * diagonal) ** 2).sum(axis=1)  # |A x_i|^2
    spread = float(np.linalg.norm((rows - mean) * diagonal, axis=1).max())  # max_i |A(x_i - mean)|
    trajectory = [start.copy()] if record else None
    clipped: Optional[List[float]] = [] if record else None
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(int(steps.max())):
            live = int(np.searchsorted(-steps, -t, side="left"))
            xs = x[:live]
            sums = np.empty_like(xs)
            # a run whose every row's gradient is within its clip: the plain sum
            free = clip[:live] >= np.linalg.norm(diagonal * (xs - mean), axis=1) + spread
            if free.any():
                sums[free] = n * diagonal * (xs[free] - mean)
            bound = ~free
            if bound.any():
                xb = xs[bound]
                # |A(x - x_i)|^2 = |Ax|^2 - 2 (A^2 x)^T x_i + |A x_i|^2
                squares = ((diagonal * xb) ** 2).sum(axis=1)[None, :] - 2.0 * (rows @ (square * xb).T) + row_norms[:, None]
                norms = np.sqrt(np.maximum(squares, 0.0))
                factors = np.minimum(1.0, clip[:live][bound] / np.maximum(norms, 1e-300))
                sums[bound] = diagonal * (xb * factors.sum(axis=0)[:, None] - factors.T @ rows)
                if record:
                    clipped.append(float(np.mean(factors[:, 0] < 1.0)) if bound[0] else 0.0)
            elif record:
                clipped.append(0.0)
            z = streams.vector("dp_gd")
            xs -= (lr[:live] / n)[:, None] * (sums + std[:live, None] * z)
            if record:
                trajectory.append(x[0].copy())
    output = np.empty_like(x)
    output[order] = x
    return KernelResult(output, trajectory, clipped)


# ------------------------------------------------------------------ a cell of the figure
@dataclass
class GridRun:
    """One grid point of one method on one (spectrum, d): the gradient norms of its last iterate, one per seed."""

    method: str
    steps: int
    lr: float
    clip: float
    multiplier: float
    train: List[float]
    test: List[float]

    @property
    def train_median(self) -> float:
        return float(np.median(self.train))

    @property
    def test_median(self) -> float:
        return float(np.median(self.test))


@dataclass
class Cell:
    spectrum: str
    d: int
    rank: float
    start_norm: List[float]  # |grad F(x_0)| on train, per seed
    runs: List[GridRun]
    seconds: Dict[str, float] = field(default_factory=dict)

    def of(self, method: str) -> List[GridRun]:
        return [r for r in self.runs if r.method == method]

    def best(self, method: str, split: str = "train") -> GridRun:
        """The grid point of lowest median gradient norm over the seeds (the paper's best over the grid)."""
        key = (lambda r: r.train_median) if split == "train" else (lambda r: r.test_median)
        return min(self.of(method), key=key)


def run_cell(spectrum: str, d: int, seeds: Sequence[int], grid: Grid, methods: Sequence[str] = METHODS) -> Cell:
    """Every grid point of every method on one (spectrum, d), for each seed (fresh rows, directions, noise), on one
    BLAS thread: its matrix products are a few milliseconds each, and on a busy 2-core machine a second thread
    mostly waits for the first (DP-GD at d = 100 ran 10x slower on two)."""
    from threadpoolctl import threadpool_limits  # comes with scikit-learn

    with threadpool_limits(limits=1, user_api="blas"):
        return _run_cell(spectrum, d, seeds, grid, methods)


def _run_cell(spectrum: str, d: int, seeds: Sequence[int], grid: Grid, methods: Sequence[str]) -> Cell:
    diagonal = hessian_diagonal(spectrum, d)
    start = np.zeros(d)
    found: Dict[Tuple, Tuple[List[float], List[float]]] = {}
    seconds = {m: 0.0 for m in methods}
    start_norms = []
    for seed in seeds:
        train, test = data(seed, d, grid.rows)
        train_mean, test_mean = train.mean(axis=0), test.mean(axis=0)
        start_norms.append(float(gradient_norms(diagonal, start, train_mean)))
        streams = FastStreams(seed, d)
        zo = [Runs.of(m, grid.runs(m), grid.rows) for m in methods if m != "dp_gd"]
        outputs = []
        if zo:
            began = time.perf_counter()
            outputs += list(zip(zo, zeroth_order(diagonal, train, start, zo, streams)))
            for r in zo:
                seconds[r.method] += (time.perf_counter() - began) / len(zo)
        if "dp_gd" in methods:
            began = time.perf_counter()
            r = Runs.of("dp_gd", grid.runs("dp_gd"), grid.rows)
            outputs.append((r, dp_gd(diagonal, train, start, r, streams)))
            seconds["dp_gd"] += time.perf_counter() - began
        for r, result in outputs:
            tr, te = gradient_norms(diagonal, result.output, train_mean), gradient_norms(diagonal, result.output, test_mean)
            for k in range(len(r.steps)):
                key = (r.method, int(r.steps[k]), float(r.lr[k]), float(r.clip[k]), float(r.multiplier[k]))
                a, b = found.setdefault(key, ([], []))
                a.append(float(tr[k]))
                b.append(float(te[k]))
    runs = [GridRun(m, t, lr, c, z, tr, te) for (m, t, lr, c, z), (tr, te) in found.items()]
    return Cell(spectrum, d, effective_rank(spectrum, d), start_norms, runs, seconds)


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


# ------------------------------------------------------------------ privzo's own loop against the kernel
@dataclass(frozen=True)
class MatchPoint:
    method: str
    spectrum: str
    d: int
    rows: int
    steps: int
    lr: float
    clip: float


def match_points(grid: Grid) -> List[MatchPoint]:
    """One point per method, at the smallest d and the sweep's n, each on another spectrum, with a clip that binds
    for part of the rows (the table shows the share)."""
    d = grid.dims[0]
    return [MatchPoint("dpzero", "identity", d, grid.rows, 40, 0.01, 3.0),
            MatchPoint("dpgd_0th", "inverse_sqrt", d, grid.rows, 40, 0.003, 3.0),
            MatchPoint("dp_gd", "inverse", d, grid.rows, 40, 0.3, 1.0)]


@dataclass
class Match(Agreement):
    point: MatchPoint
    iterates: float  # max |privzo - kernel| over every iterate's coordinates
    output: float  # max |privzo - kernel| over the last iterate's (the kernel's block updates, not its record)
    clipped: float  # the kernel's mean share of clipped rows over the steps
    epsilon: float  # privzo's tracker after the run
    privzo_seconds: float
    kernel_seconds: float

    compared = ("iterates", "output")


def privzo_trajectory(point: MatchPoint, seed: int = 0, noise_seed: int = 7, threads: int = 1):
    """privzo's loop on one grid point with an injected noise generator: (the loop, its model's iterate after every
    step, seconds). Composed as builders.build_loop composes a full-batch Gaussian run."""
    from components.accountants import Accountant, PrivacyTracker
    from components.data.sampling import FullBatchSampler
    from components.directions import Directions
    from components.estimators import DpgdZerothEstimator, FirstOrderEstimator, TwoPointEstimator
    from components.mechanisms import GaussianMechanism
    from components.optimizers import Sgd
    from components.runtime import LocalBackend, PrivateLoop

    torch.set_num_threads(threads)
    train, _ = data(seed, point.d, point.rows)
    model = Quadratic(hessian_diagonal(point.spectrum, point.d), np.zeros(point.d))
    directions = Directions([model.x], "gaussian")
    estimator = {"dpzero": lambda: TwoPointEstimator(1, SMOOTHING), "dpgd_0th": lambda: DpgdZerothEstimator(1, SMOOTHING),
                 "dp_gd": FirstOrderEstimator}[point.method]()
    optimizer = Sgd(directions, point.lr)
    backend = LocalBackend(model, directions, optimizer, torch.as_tensor(train),
                           torch.zeros(point.rows, dtype=torch.int64))
    sampler = FullBatchSampler(point.rows)
    mechanism = GaussianMechanism(point.clip, noise_multiplier(point.steps, point.rows), estimator.queries_per_step,
                                  NEIGHBORING, torch.Generator().manual_seed(noise_seed))
    mechanism.noise_source = "seeded"
    tracker = PrivacyTracker(Accountant(ACCOUNTANT, NEIGHBORING), sampler.wrap(mechanism.step_event()), DELTA)
    loop = PrivateLoop(backend, sampler, estimator, mechanism, tracker, seed)
    points = [model.x.detach().numpy().copy()]
    apply = optimizer.apply

    def recorded(update):
        apply(update)
        points.append(model.x.detach().numpy().copy())

    optimizer.apply = recorded
    started = time.perf_counter()
    loop.run(point.steps)
    return loop, directions, estimator, train, points, time.perf_counter() - started


def match(point: MatchPoint, seed: int = 0, noise_seed: int = 7, threads: int = 1) -> Match:
    """privzo's loop against the kernel on one grid point: the same rows, privzo's directions and the same noise
    generator; the largest difference of any iterate's coordinate (a different number of steps is infinite) and of
    the output."""
    loop, directions, estimator, train, points, privzo_seconds = privzo_trajectory(point, seed, noise_seed, threads)
    streams = PrivzoStreams(directions, estimator, seed, torch.Generator().manual_seed(noise_seed), point.d)
    runs = Runs.of(point.method, [(point.steps, point.lr, point.clip)], point.rows)
    diagonal = hessian_diagonal(point.spectrum, point.d)
    started = time.perf_counter()
    if point.method == "dp_gd":
        result = dp_gd(diagonal, train, np.zeros(point.d), runs, streams, record=True)
    else:
        result = zeroth_order(diagonal, train, np.zeros(point.d), [runs], streams, record=True)[0]
    kernel_seconds = time.perf_counter() - started
    ours, theirs = np.stack(result.trajectory), np.stack(points)
    gap = float(np.abs(ours - theirs).max()) if ours.shape == theirs.shape else math.inf
    return Match(point, gap, float(np.abs(result.output[0] - theirs[-1]).max()), float(np.mean(result.clipped)),
                 loop.tracker.epsilon(), privzo_seconds, kernel_seconds)

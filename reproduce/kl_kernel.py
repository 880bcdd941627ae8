"""The rate experiments E6 to E9 for the KL paper (Menart et al.), and a vectorised reference kernel.

Every point of a sweep is a privzo spec (an example of specs/examples/ with its rows, dimension and budget
changed) resolved by privzo's planner (``components.families.kl.plan``: the preset's schedule, the noise scaled so the plan
costs exactly rho). The kernel runs that plan in numpy for several seeds at once (fresh rows and noise per
seed), with the clipped full-batch sums in closed form where the problem allows (one-hot designs: rows of a
coordinate share their gradient; mean_pl: a clip that cannot bind is skipped, checked per step). At the first
point of each series privzo's own loop (``builders.build_loop``: estimator, release door, mechanism, filter,
optimizer) runs the same spec with an injected noise generator and the kernel, reading the same rows and the
same generator in the same order, must reproduce its iterates and output to 1e-9 (``match``).

- E6: KL-Spider (theory_shape, c_K = c_floor = 1) on Q1 (mean_pl, kappa 2) and Q2 (quartic_balanced,
  kappa 4/3), d = 10, rho = 0.5.
- E7: the proximal point method (c_T = 1, no log^2) on Q1 (L~1 = 1) and Q4 (abs_three_halves, kappa 3), d = 10,
  rho = 0.5.
- E8: adaptive noisy GD on Q1 with d = 256, rho = 0.02.
- E9: adaptive noisy GD with the exponential-mechanism selection on Q5 (logistic_nonconvex, d = 20,
  rho = 0.5): ||grad F(w_t*; S)||.
Beside E6, E8 and E9, on the same problems and budget: adaptive noisy GD (E6) and privzo's DP-GD (full batch,
first_order + gaussian + sgd, eta = 1 / (2 L1)) at a few fixed step counts T: what needing no T buys (Q4 of E7 is
not smooth: neither applies).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from reproduce.agreement import Agreement

EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"
DELTA = 1e-6


# ------------------------------------------------------------------ series
@dataclass(frozen=True)
class KlSeries:
    experiment: str
    label: str
    example: str  # specs/examples/<example>.yaml
    problem: str
    dimension: int
    rho: float
    grid: tuple
    optimizer: Dict = field(default_factory=dict, hash=False)  # changes to the example's optimizer section
    mechanism: Dict = field(default_factory=dict, hash=False)
    radius: Optional[float] = None  # assumptions.radius (the one-hot designs: 0.6)
    dp_gd_steps: Optional[int] = None  # a DP-GD baseline with this many steps
    metric: str = "excess risk"  # or "gradient norm"
    axis: str = "n"
    max_seeds: Optional[int] = None

    def seeds(self, seeds: Sequence[int]) -> List[int]:
        return list(seeds[:self.max_seeds] if self.max_seeds else seeds)



def series_of(experiments: Sequence[str], quick: bool = False) -> List[KlSeries]:
    g6a = (1000, 2000) if quick else (1000, 2000, 4000, 8000, 16000)
    g6b = (64000, 128000) if quick else (64000, 128000, 256000, 512000)
    g7 = (100, 200) if quick else (250, 500, 1000, 2000)
    g8 = (512, 1024) if quick else (512, 1024, 2048, 4096, 8192)
    g9 = (500, 1000) if quick else (1000, 2000, 4000, 8000, 16000)
    shape = {"preset": "theory_shape"}
    # c_K = 8, not 1: a phase's T_k normalised steps remove at most (7/32) Phi^(2/kappa) / (gamma^2 L1)
    # each (noise-free), so the phases may shrink by c = 1 + F0^((2-kappa)/kappa) / (c_K gamma^2 L1) only with
    # c_K >= 32/7; at c_K = 1 the targets outrun the steps and the run stalls (docs/results/kl_rates.md)
    spider = {**shape, "constants": {"c_K": 8, "c_floor": 1}}
    ppm = {**shape, "constants": {"c_T": 1}, "log_factor": False}

    def beside(experiment, problem, d, rho, grid, steps, metric="excess risk"):
        out = [KlSeries(experiment, f"adaptive noisy GD ({problem})", "q1_adaptive_noisy_gd", problem, d, rho, grid,
                        metric=metric)]
        out += [KlSeries(experiment, f"DP-GD T={t} ({problem})", "q1_adaptive_noisy_gd", problem, d, rho, grid,
                         dp_gd_steps=t, metric=metric) for t in steps]
        return out

    table = {
        "E6": [KlSeries("E6", "KL-Spider Q1 (mean_pl)", "q1_kl_spider", "mean_pl", 10, 0.5, g6a, spider),
               KlSeries("E6", "KL-Spider Q2 (quartic_balanced)", "q1_kl_spider", "quartic_balanced", 10, 0.5, g6b,
                        spider)]
        + beside("E6", "mean_pl", 10, 0.5, g6a, (8, 64)) + beside("E6", "quartic_balanced", 10, 0.5, g6b, (64, 512, 4096)),
        "E7": [KlSeries("E7", "PPM Q1 (mean_pl)", "q4_proximal_point", "mean_pl", 10, 0.5, g7, ppm),
               KlSeries("E7", "PPM Q4 (abs_three_halves)", "q4_proximal_point", "abs_three_halves", 10, 0.5, g7, ppm)],
        "E8": [KlSeries("E8", "adaptive noisy GD Q1 (d=256)", "q1_adaptive_noisy_gd", "mean_pl", 256, 0.02, g8)]
        + [KlSeries("E8", f"DP-GD T={t} (mean_pl)", "q1_adaptive_noisy_gd", "mean_pl", 256, 0.02, g8, dp_gd_steps=t)
           for t in (2, 8, 32)],
        "E9": [KlSeries("E9", "adaptive noisy GD + selection Q5", "q5_adaptive_select", "logistic_nonconvex", 20, 0.5,
                        g9, metric="gradient norm")]
        + [KlSeries("E9", f"DP-GD T={t} (logistic_nonconvex)", "q5_adaptive_select", "logistic_nonconvex", 20, 0.5,
                    g9, dp_gd_steps=t, metric="gradient norm") for t in (16, 128)],
    }
    unknown = [e for e in experiments if e not in table]
    if unknown:
        raise ValueError(f"reproduce: unknown experiment {unknown[0]!r}; allowed: {', '.join(table)}")
    return [s for e in experiments for s in table[e]]


# the one-hot designs' constants hold where every coordinate is within 0.6 of the start (the ball where they hold: the
# residual |w_j - w*_j| <= 1.1); the path to w* = +-0.5 per coordinate stays there
ONE_HOT_RADIUS = 0.6


def multiplier(rho: float) -> float:
    return 1.0 / math.sqrt(2.0 * rho)


def spec_dict(series: KlSeries, n: int, seed: int = 0) -> dict:
    """One point's spec: the example with n simulated rows of the series' problem and the budget rho (the
    noise multiplier 1 / sqrt(2 rho), epsilon the one it gives at delta 1e-6)."""
    import specs
    from components.accountants import Accountant
    import dp_accounting

    data = specs.load_spec(EXAMPLES / f"{series.example}.yaml").model_dump(mode="json")
    data["seed"] = seed
    data["data"]["source"].update(problem=series.problem, dimension=series.dimension, rows=n, data_seed=seed,
                                  start=0.0)
    z = multiplier(series.rho)
    eps = Accountant("zcdp", "replace_one").epsilon(dp_accounting.GaussianDpEvent(z), DELTA)
    data["privacy"] = {"epsilon": eps * (1 + 1e-9), "delta": DELTA, "accountant": "zcdp", "neighboring": "replace_one"}
    data["mechanism"] = {**data["mechanism"], **series.mechanism, "noise_multiplier": z}
    data["optimizer"] = {**data["optimizer"], **series.optimizer}
    radius = series.radius if series.radius is not None else (
        ONE_HOT_RADIUS if series.problem in ("quartic_balanced", "abs_three_halves") else None)
    if radius is not None:
        data["assumptions"] = {**(data.get("assumptions") or {}), "radius": radius}
    data["name"] = f"{series.example}-{series.problem}-n{n}"
    return data


def dp_gd_spec(series: KlSeries, n: int, seed: int = 0) -> dict:
    """privzo's full-batch DP-GD on the same problem and budget: first_order + gaussian (clip L0, multiplier
    sqrt(T / (2 rho)): T releases cost rho) + sgd at eta = 1 / (2 L1) for T steps."""
    import specs
    from components.families.kl import plan as kl

    data = spec_dict(series, n, seed)
    a = kl.kl_assumptions(specs.spec_from_dict(data))
    steps = series.dp_gd_steps
    data["estimator"] = {"kind": "first_order"}
    data["mechanism"] = {"kind": "gaussian", "clip": a.lipschitz, "noise_multiplier": math.sqrt(steps / (2 * series.rho))}
    data["optimizer"] = {"kind": "sgd", "lr": 1 / (2 * a.smoothness), "steps": steps}
    data["name"] = f"dp-gd-{series.problem}-n{n}-t{steps}"
    return data


def resolve(series: KlSeries, n: int, seed: int = 0):
    """(resolved spec, plan) of a point, from its public numbers only."""
    import specs
    from components.families.kl import plan as kl

    spec = specs.spec_from_dict(spec_dict(series, n, seed))
    resolved, _, _ = kl.resolve_kl(spec, n, series.dimension)
    return resolved, kl.plan_for(resolved, n, series.dimension, float(resolved.mechanism.noise_multiplier))


# ------------------------------------------------------------------ the problems, vectorised over seeds
class Rows:
    """A seed batch of one problem's rows and what its clipped sums need."""

    def __init__(self, problem: str, rows: np.ndarray, dimension: int):
        self.problem, self.d = problem, dimension
        self.rows = rows  # [S, n, width]
        self.n = rows.shape[1]
        if problem in ("quartic_balanced", "abs_three_halves"):
            a = rows[:, :, :dimension]
            self.counts = a.sum(axis=1)  # [S, d]: rows of each coordinate (their gradients are equal)
            self.target = np.einsum("snd,sn->sd", a, rows[:, :, dimension]) / np.maximum(self.counts, 1)
        if problem == "mean_pl":
            self.mean = rows.mean(axis=1)
            self.spread = np.linalg.norm(rows - self.mean[:, None, :], axis=2).max(axis=1)

    def _phi(self, v):
        if self.problem == "quartic_balanced":
            return v ** 3
        return 1.5 * np.sqrt(np.abs(v)) * np.sign(v)

    def clipped_sum(self, w: np.ndarray, clip) -> np.ndarray:
        """sum_i clip(grad f(w; x_i)) for each seed: [S, d]; ``clip`` a number or one per seed."""
        clip = np.broadcast_to(np.asarray(clip, dtype=np.float64), (w.shape[0],))
        if self.problem in ("quartic_balanced", "abs_three_halves"):
            g = self._phi(w - self.target)
            return self.counts * np.clip(g, -clip[:, None], clip[:, None])
        if self.problem == "mean_pl":
            far = np.linalg.norm(w - self.mean, axis=1) + self.spread
            if np.all(far <= clip):  # no row's gradient reaches the clip: the plain sum
                return self.n * (w - self.mean)
            g = w[:, None, :] - self.rows
        else:  # logistic_nonconvex
            d = self.d
            a, y = self.rows[:, :, :d], self.rows[:, :, d]
            margin = y * np.einsum("snd,sd->sn", a, w)
            g = (-y * 0.5 * (1 - np.tanh(margin / 2)))[:, :, None] * a + (0.2 * w / (1 + w ** 2) ** 2)[:, None, :]
        norms = np.linalg.norm(g, axis=2)
        factor = np.minimum(1.0, clip[:, None] / np.maximum(norms, 1e-300))
        return np.einsum("sn,snd->sd", factor, g)

    def clipped_difference_sum(self, w, previous, clip) -> np.ndarray:
        """sum_i clip(grad f(w; x_i) - grad f(previous; x_i)): [S, d]."""
        clip = np.broadcast_to(np.asarray(clip, dtype=np.float64), (w.shape[0],))
        if self.problem in ("quartic_balanced", "abs_three_halves"):
            g = self._phi(w - self.target) - self._phi(previous - self.target)
            return self.counts * np.clip(g, -clip[:, None], clip[:, None])
        if self.problem == "mean_pl":  # w - previous for every row
            g = w - previous
            norm = np.linalg.norm(g, axis=1)
            return self.n * g * np.minimum(1.0, clip / np.maximum(norm, 1e-300))[:, None]
        raise ValueError(f"kernel: no gradient differences for {self.problem}")

    def metric(self, w: np.ndarray, metric: str) -> np.ndarray:
        from components.families.kl.problems import excess_risk_np, gradient_np

        out = []
        for s in range(w.shape[0]):
            if metric == "gradient norm":
                out.append(float(np.linalg.norm(gradient_np(self.problem, w[s], self.rows[s]))))
            else:
                out.append(float(excess_risk_np(self.problem, w[s], self.rows[s])))
        return np.asarray(out)


# ------------------------------------------------------------------ noise: numpy per seed, or privzo's generator
class SeedNoise:
    def __init__(self, seeds: Sequence[int]):
        self.generators = [np.random.default_rng([int(s), 3003]) for s in seeds]

    def normal(self, shape=()) -> np.ndarray:
        return np.stack([g.standard_normal(shape) for g in self.generators])

    def uniform(self, count: int) -> np.ndarray:
        return np.stack([g.random(count) for g in self.generators])


class TorchNoise:
    """privzo's mechanism's draws (one seed): torch.randn in float64 per release, torch.rand for Gumbel."""

    def __init__(self, generator):
        self.generator = generator

    def normal(self, shape=()) -> np.ndarray:
        import torch

        return torch.randn(shape, generator=self.generator, dtype=torch.float64).numpy()[None]

    def uniform(self, count: int) -> np.ndarray:
        import torch

        return torch.rand(count, generator=self.generator, dtype=torch.float64).numpy()[None]


# ------------------------------------------------------------------ the algorithms
@dataclass
class KernelResult:
    output: np.ndarray  # [S, d]
    releases: np.ndarray  # [S]
    trajectory: Optional[List[np.ndarray]] = None  # seed 0's iterate after every release (match)


def kl_spider(plan, rows: Rows, w0: np.ndarray, noise, record: bool = False) -> KernelResult:
    S, d, n = w0.shape[0], rows.d, rows.n
    K = plan.phases
    lengths, thresholds = np.asarray(plan.lengths), np.asarray(plan.thresholds)
    steps, clips = np.asarray(plan.step_lengths), np.asarray(plan.difference_clips)
    stds = np.asarray(plan.difference_stds)
    w, previous = w0.copy(), w0.copy()
    estimate = np.zeros((S, d))
    phase, t = np.zeros(S, int), np.zeros(S, int)
    releases = np.zeros(S, int)
    trajectory = [w[0].copy()] if record else None
    while np.any(phase < K):
        live = phase < K
        k = np.minimum(phase, K - 1)
        start = t == 0
        released = np.zeros((S, d))
        if np.any(start & live):
            released = np.where(start[:, None], rows.clipped_sum(w, plan.start_clip) / n, released)
        if np.any(~start & live):
            released = np.where(start[:, None], released,
                                rows.clipped_difference_sum(w, previous, clips[k]) / n)
        std = np.where(start, plan.start_std, stds[k])
        released = released + std[:, None] * noise.normal((d,))
        estimate = np.where(live[:, None], np.where(start[:, None], released, estimate + released), estimate)
        releases += live
        norm = np.linalg.norm(estimate, axis=1)
        move = live & (t < lengths[k]) & (norm >= thresholds[k])
        previous = np.where(move[:, None], w, previous)
        w = np.where(move[:, None], w - (steps[k] / np.maximum(norm, 1e-300))[:, None] * estimate, w)
        t = np.where(move, t + 1, t)
        end = live & (~move | (t >= lengths[k]))
        phase, t = np.where(end, phase + 1, phase), np.where(end, 0, t)
        if record:
            trajectory.append(w[0].copy())
    return KernelResult(w, releases, trajectory)


def proximal_point(plan, rows: Rows, w0: np.ndarray, noise, record: bool = False) -> KernelResult:
    S, d, n = w0.shape[0], rows.d, rows.n
    lw = plan.weak_convexity
    w, centre = w0.copy(), w0.copy()
    trajectory = [w[0].copy()] if record else None
    for _ in range(plan.outer):
        weighted = centre.copy()
        for s in range(1, plan.inner):
            gradient = rows.clipped_sum(w, plan.clip) / n + plan.std * noise.normal((d,)) + 2 * lw * (w - centre)
            moved = w - gradient / (lw * s) - centre
            norm = np.linalg.norm(moved, axis=1)
            moved = moved * np.where(norm > plan.radius, plan.radius / np.maximum(norm, 1e-300), 1.0)[:, None]
            w = centre + moved
            weighted = weighted + (s + 1) * w
            if record and s < plan.inner - 1:
                trajectory.append(w[0].copy())
        w = weighted * (2.0 / (plan.inner * (plan.inner + 1)))
        centre = w.copy()
        if record:
            trajectory.append(w[0].copy())
    return KernelResult(w, np.full(S, plan.releases), trajectory)


def adaptive(plan, rows: Rows, w0: np.ndarray, noise, select: str = "last", record: bool = False) -> KernelResult:
    S, d, n = w0.shape[0], rows.d, rows.n
    delta = 2 * plan.clip / n
    w = w0.copy()
    spent = np.zeros(S)
    iterates, scores = [w.copy()], []
    releases = np.zeros(S, int)
    live = np.ones(S, bool)
    trajectory = [w[0].copy()] if record else None
    while True:
        live = live & (spent <= plan.threshold * (1 + 1e-12))
        if not live.any():
            break
        mean = rows.clipped_sum(w, plan.clip) / n
        length = np.linalg.norm(mean, axis=1)
        norm = length + plan.norm_std * noise.normal(())
        std = np.maximum(norm / plan.divisor, plan.floor)
        released = mean + std[:, None] * noise.normal((d,))
        spent = spent + live * (delta ** 2 / (2 * plan.norm_std ** 2) + delta ** 2 / (2 * std ** 2))
        scores.append(np.where(live, length, np.nan))
        w = np.where(live[:, None], w - plan.lr * released, w)
        releases += live
        iterates.append(w.copy())
        if record:
            trajectory.append(w[0].copy())
    stack = np.stack(iterates, axis=1)  # [S, steps + 1, d]
    last = releases  # w_m is the final iterate; the output candidates are w_0 .. w_(m - 1)
    if select == "last":
        out = stack[np.arange(S), np.maximum(last - 1, 0)]
    else:
        out = np.zeros((S, d))
        score = np.stack(scores, axis=1)  # [S, steps]: |clipped mean gradient| at w_t
        for s in range(S):
            candidates = score[s, :max(last[s], 1)]
            u = np.maximum(noise.uniform(len(candidates))[0 if noise_is_single(noise) else s], 1e-300)
            out[s] = stack[s, int(np.argmax(-plan.selection_scale * candidates - np.log(-np.log(u))))]
    return KernelResult(out, releases, trajectory)


def noise_is_single(noise) -> bool:
    return isinstance(noise, TorchNoise)


def dp_gd(rows: Rows, w0: np.ndarray, noise, steps: int, rho: float, clip: float, lr: float,
          record: bool = False) -> KernelResult:
    """Full-batch DP-GD: T Gaussian releases of the clipped gradient sum (std z 2C, z = sqrt(T / (2 rho)):
    each costs rho / T), the step lr times the released sum over n."""
    S, d, n = w0.shape[0], rows.d, rows.n
    std = math.sqrt(steps / (2 * rho)) * 2 * clip
    w = w0.copy()
    trajectory = [w[0].copy()] if record else None
    for _ in range(steps):
        w = w - lr * ((rows.clipped_sum(w, clip) + std * noise.normal((d,))) / n)
        if record:
            trajectory.append(w[0].copy())
    return KernelResult(w, np.full(S, steps), trajectory)


# ------------------------------------------------------------------ a point of a sweep
def predicted(series: KlSeries, plan, resolved, n: int, steps: float) -> float:
    """The theorem's bound at this point, constants 1, with its log factors."""
    from components.families.kl import plan as kl

    a = kl.kl_assumptions(resolved)
    d, rho = series.dimension, series.rho
    if isinstance(plan, kl.KlSpiderPlan):
        return plan.floor
    if isinstance(plan, kl.ProximalPlan):
        beta_p = a.beta / plan.outer
        log = math.log(n * n * math.log(1 / beta_p) ** 2 / (d * beta_p))
        return (a.gamma * a.lipschitz * math.sqrt(plan.outer * d * log) / (n * math.sqrt(rho))) ** a.kappa
    lg = math.log(n * math.sqrt(rho) / a.beta)
    L0, L1, F0 = a.lipschitz, a.smoothness, a.initial_gap
    if series.metric == "gradient norm":  # Theorem 5
        first = min(math.sqrt(F0 * L1 / max(steps, 1)), (L0 * math.sqrt(F0 * L1 * d) / (n * math.sqrt(rho))) ** 0.5)
        return first + L0 * math.sqrt(lg) / (math.sqrt(n) * rho ** 0.25)
    gamma, kappa = a.gamma, a.kappa  # Theorem 4
    p_max = (1 + 8 * gamma ** 2 * L1) * (math.log(F0) + (2 * kappa / (4 - kappa)) * math.log(
        n * math.sqrt(rho) / (gamma * L0)))
    term1 = (gamma * L0 * math.sqrt(d * lg * p_max) / (n * math.sqrt(rho))) ** (2 * kappa / (4 - kappa))
    term2 = (max(gamma ** 2, 1) * L0 ** 2 * lg / (min(L1, 1) * n * math.sqrt(rho))) ** (kappa / 2)
    ratio = p_max / (n * math.sqrt(rho))
    term3 = 0.0 if kappa >= 2 and ratio < 1 else ratio ** (kappa / (2 - kappa)) if kappa < 2 else math.inf
    return term1 + term2 + term3


@dataclass
class KlPoint:
    series: KlSeries
    x: int
    values: List[float]  # the metric per seed
    predicted: float
    steps: float  # median releases
    epsilon: float
    seconds: float
    settings: Dict[str, float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.x

    @property
    def median(self) -> float:
        return float(np.median(self.values))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.values, 90))

    @property
    def certificates(self) -> List[float]:  # what the shared plot reads
        return self.values


def _rows(series: KlSeries, n: int, seeds: Sequence[int]) -> Rows:
    from components.families.kl.problems import kl_rows

    return Rows(series.problem, np.stack([kl_rows(series.problem, series.dimension, n, s) for s in seeds]),
                series.dimension)


def run(series: KlSeries, plan, rows: Rows, w0: np.ndarray, noise, resolved, record: bool = False) -> KernelResult:
    from components.families.kl import plan as kl

    if series.dp_gd_steps is not None:
        a = kl.kl_assumptions(resolved)
        return dp_gd(rows, w0, noise, series.dp_gd_steps, series.rho, a.lipschitz, 1 / (2 * a.smoothness), record)
    if isinstance(plan, kl.KlSpiderPlan):
        return kl_spider(plan, rows, w0, noise, record)
    if isinstance(plan, kl.ProximalPlan):
        return proximal_point(plan, rows, w0, noise, record)
    return adaptive(plan, rows, w0, noise, resolved.optimizer.select, record)


def run_point(series: KlSeries, n: int, seeds: Sequence[int]) -> KlPoint:
    started = time.perf_counter()
    resolved, plan = resolve(series, n)
    rows = _rows(series, n, seeds)
    w0 = np.zeros((len(seeds), series.dimension))
    result = run(series, plan, rows, w0, SeedNoise(seeds), resolved)
    values = rows.metric(result.output, series.metric)
    steps = float(np.median(result.releases))
    settings = {"releases_median": steps, "noise_multiplier": float(resolved.mechanism.noise_multiplier)}
    for name in ("phases", "outer", "inner", "max_steps", "floor"):
        if hasattr(plan, name) and series.dp_gd_steps is None:
            settings[name] = getattr(plan, name)
    bound = predicted(series, plan, resolved, n, steps) if series.dp_gd_steps is None else math.nan
    from components.accountants import Accountant

    eps = Accountant("zcdp", "replace_one").epsilon(
        __import__("dp_accounting").GaussianDpEvent(multiplier(series.rho)), DELTA)
    return KlPoint(series, n, [float(v) for v in values], bound, steps, eps, time.perf_counter() - started, settings)


# ------------------------------------------------------------------ privzo's own loop against the kernel
@dataclass
class KlMatch(Agreement):
    series: str
    x: int
    steps: int
    iterates: float  # max |privzo - kernel| over every iterate's coordinates
    output: float
    privzo_seconds: float
    kernel_seconds: float

    compared = ("iterates", "output")


def match(series: KlSeries, n: int, noise_seed: int = 7, threads: int = 1) -> KlMatch:
    """privzo's own loop on one point's spec (an injected noise generator) against the kernel on the same rows
    and the same generator: the largest differences of the iterates, release by release, and of the output
    (a different number of releases is an infinite difference)."""
    import torch

    import specs
    from reproduce.experiments import privzo_trajectory

    spec = specs.spec_from_dict(spec_dict(series, n) if series.dp_gd_steps is None else dp_gd_spec(series, n))
    resolved, data, built, points, privzo_seconds = privzo_trajectory(spec, noise_seed, threads)
    optimizer = built.loop.backend.optimizer
    rows = Rows(series.problem, np.asarray(data.private.features, dtype=np.float64)[None], series.dimension)
    started = time.perf_counter()
    result = run(series, getattr(optimizer, "plan", None), rows, points[0][None].copy(),
                 TorchNoise(torch.Generator().manual_seed(noise_seed)), resolved, record=True)
    kernel_seconds = time.perf_counter() - started
    kernel_points = np.stack(result.trajectory)
    privzo_points = np.stack(points)
    steps = min(len(kernel_points), len(privzo_points))
    gap = float(np.abs(kernel_points[:steps] - privzo_points[:steps]).max())
    if len(kernel_points) != len(privzo_points):
        gap = math.inf
    return KlMatch(series.label, n, int(result.releases[0]), gap,
                   float(np.abs(result.output[0] - built.model.x.detach().numpy()).max()), privzo_seconds,
                   kernel_seconds)


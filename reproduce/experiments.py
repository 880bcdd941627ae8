"""The rate experiments E1 to E5 for the two nonsmooth papers (Zhang et al.; Kornowski et al.), on privzo's own specs.

Every point of a sweep is a privzo spec (an example of specs/examples/ with its rows, dimension or privacy
changed) resolved by privzo's planner (`components.families.nonsmooth.plan.resolve_o2nc`: the theory preset, the node
multiplier calibrated by dp-accounting on the run's event, eta from the calibrated std). The vectorised
kernel runs the resolved numbers for several seeds at once. At the first point of each series, privzo's
own loop (``builders.build_loop``: estimator, release door, mechanism, sampler, O2NC) runs the same spec
with an injected noise generator, and the kernel, reading the same random inputs, must reproduce its
query points, window certificates and output to 1e-9 (``match``).

- E1: Zhang et al.'s private algorithm, its non-private twin (no mechanism: the schedule of mu = inf) and
  the Appendix E baseline, against n, on P1 (d = 4, r = 0.05, epsilon = 1, delta = 1e-6).
- E2: Kornowski et al.'s single-pass zeroth-order algorithm with coupled directions (privzo's deviation from the paper), against
  n; beside it at n = 1,000 the paper's own, independent directions (m = 36,415 per row).
- E3: Kornowski et al.'s single-pass first-order algorithm (gradients at ball points), against n, beside the
  zeroth-order one at the same n.
- E4: Kornowski et al.'s multi-pass full-batch algorithm (first-order; zeroth-order at the two smallest n) on a
  schedule fixed for beta = 0.5, d = 2, alpha = 0.3: the empirical certificate's privacy excess over the
  non-private twin against n.
- E5: 001 against 002 at n = 10^5 against d, with x_0 = 1 - 0.8 / sqrt(d) in every coordinate, so
  Phi = 0.8 at every d (002 to d = 8: its cost grows with d^2 directions per start row).
The metric is Gamma-bar, the mean over windows of |average of grad F_r over the window's query points|:
the expectation over the output window of the Goldstein certificate at 2r, exact on P1 (betainc).
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from reproduce.agreement import Agreement
from components.protocols import Finalizing

EXAMPLES = Path(__file__).resolve().parents[1] / "specs" / "examples"


@dataclass(frozen=True)
class Series:
    experiment: str
    label: str
    example: str  # specs/examples/<example>.yaml
    axis: str  # "n" or "d"
    grid: tuple
    private: bool = True
    fixed_n: int = 100_000  # the rows when the axis is d
    fixed_d: int = 4  # the dimension when the axis is n
    # "population": Gamma-bar on F; "empirical excess": on the rows' empirical objective, the private run's
    # minus its non-private twin's (the same schedule without noise or clips, on the same rows)
    metric: str = "population"
    coupling: Optional[str] = None  # zo_spider 002: overrides the example's estimator.coupling
    max_seeds: Optional[int] = None  # the first this many of the command's seeds (a series too costly for all)

    def seeds(self, seeds: Sequence[int]) -> List[int]:
        return list(seeds[:self.max_seeds] if self.max_seeds else seeds)

    def point(self, x: int) -> Dict[str, int]:
        return {"n": x, "d": self.fixed_d} if self.axis == "n" else {"n": self.fixed_n, "d": x}


def series_of(experiments: Sequence[str], quick: bool = False) -> List[Series]:
    """The series of the chosen experiments. ``quick``: tiny grids with the same code paths (tests)."""
    n1 = (2_000, 4_000) if quick else (10_000, 30_000, 100_000, 300_000, 1_000_000)
    n2 = (2_000, 4_000) if quick else (10_000, 30_000, 100_000, 300_000)
    n3 = (2_000, 4_000) if quick else (2_000, 5_000, 10_000, 20_000)
    n2_paper = (300,) if quick else (1_000,)
    n4 = (125, 250) if quick else (125, 250, 500, 1_000)  # 2,000: 3 min more (n m ball points a step)
    dims = (2, 4) if quick else (2, 4, 8, 16)
    # 002's start estimate takes m_G = d^2 log(8 d Sigma / delta_0) directions from each of Sigma rows: at d = 16
    # (m_G = 6,272, Sigma = 170) one seed alone outlasts the command's 15-minute budget on 2 cores
    dims_002 = (2, 4) if quick else (2, 4, 8)
    fixed_n = 4_000 if quick else 100_000
    table = {
        "E1": [Series("E1", "001 private", "p1_o2nc_001", "n", n1),
               Series("E1", "001 non-private twin", "p1_o2nc_001", "n", n1, private=False),
               Series("E1", "001 naive (App. E)", "p1_o2nc_001_naive", "n", n1)],
        "E2": [Series("E2", "002 private (coupled)", "p1_o2nc_002", "n", n2),
               # the paper's independent directions: m = 5.8e5 per row at n = 10^4 (1.7e10 evaluations a seed), so
               # at n = 1,000 (m = 36,415; 1e8 evaluations), one seed: 2,000 (m = 83,998) adds 30 s and the
               # command's 15 minutes do not hold it
               Series("E2", "002 private (paper, independent)", "p1_o2nc_002", "n", n2_paper, coupling="independent",
                      max_seeds=1),
               Series("E2", "002 private (coupled), same n", "p1_o2nc_002", "n", n2_paper)],
        "E3": [Series("E3", "002 first-order", "p1_o2nc_002_fo", "n", n3),
               Series("E3", "002 zeroth-order (coupled), same n", "p1_o2nc_002", "n", n3)],
        "E4": [Series("E4", "002 multi-pass first-order", "p1_o2nc_002_fo_multipass", "n", n4, fixed_d=2,
                      metric="empirical excess"),
               Series("E4", "002 multi-pass zeroth-order", "p1_o2nc_002_multipass", "n", n4[:2], fixed_d=2,
                      metric="empirical excess")],
        "E5": [Series("E5", "001 private", "p1_o2nc_001", "d", dims, fixed_n=fixed_n),
               Series("E5", "002 private (coupled)", "p1_o2nc_002", "d", dims_002, fixed_n=fixed_n)],
    }
    unknown = [e for e in experiments if e not in table]
    if unknown:
        raise ValueError(f"reproduce: unknown experiment {unknown[0]!r}; allowed: {', '.join(table)} (E6-E9, "
                         "the KL paper's, are privzo reproduce kl)")
    return [s for e in experiments for s in table[e]]


def spec_dict(series: Series, x: int, seed: int = 0) -> dict:
    """The spec of one point: the example with n private rows (the split keeps 1/5 for test), dimension d
    and, on the d axis, x_0 = 1 - 0.8/sqrt(d) (Phi = 0.8 at every d)."""
    import specs

    point = series.point(x)
    data = specs.load_spec(EXAMPLES / f"{series.example}.yaml").model_dump(mode="json")
    data["seed"] = seed
    source = data["data"]["source"]
    source.update(rows=point["n"] * 5 // 4, dimension=point["d"], data_seed=seed)
    if series.axis == "d":
        source["start"] = 1 - 0.8 / math.sqrt(point["d"])
    if not series.private:
        data["mechanism"], data["privacy"] = {"kind": "none"}, None
    if series.coupling is not None:
        data["estimator"]["coupling"] = series.coupling
    data["name"] = f"{series.example}-{series.axis}{x}"
    return data


def resolve(series: Series, x: int, seed: int = 0):
    """The resolved spec of a point, planned from its public numbers only (n, d): no rows are needed."""
    import specs
    from components.families.nonsmooth.plan import resolve_o2nc

    point = series.point(x)
    spec = specs.spec_from_dict(spec_dict(series, x, seed))
    resolved, _, eps = resolve_o2nc(spec, point["n"], point["d"])
    return resolved, eps


def predicted(resolved, n: int, d: int) -> float:
    """The theorem's bound (constants 1, its log factors) for n private rows, dimension d and the resolved
    spec's privacy."""
    from components.families.nonsmooth import presets
    from components.families.nonsmooth.plan import theory_preset

    eps = float(resolved.privacy.epsilon) if resolved.privacy is not None else math.inf
    delta = float(resolved.privacy.delta) if resolved.privacy is not None else None
    mu = presets.gdp_mu(eps, delta) if resolved.privacy is not None else math.inf
    return theory_preset(resolved, n, d, eps, mu, delta).predicted


@dataclass
class PointResult:
    series: Series
    x: int
    n: int
    d: int
    certificates: List[float]  # Gamma-bar per seed
    values: List[float]  # F(output) - inf F per seed
    predicted: float
    steps: int
    epsilon: float
    seconds: float
    settings: Dict[str, float] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return float(np.median(self.certificates))

    @property
    def p90(self) -> float:
        return float(np.percentile(self.certificates, 90))


def run_point(series: Series, x: int, seeds: Sequence[int]) -> PointResult:
    """One point of a sweep: the kernel on the resolved spec, a run per seed (fresh rows and noise)."""
    from reproduce.kernel import FastStreams, Kernel, KernelPlan, h_of

    started = time.perf_counter()
    resolved, eps = resolve(series, x)
    point = series.point(x)
    plan = KernelPlan.from_spec(resolved, point["n"])
    result = Kernel(plan).run(FastStreams(plan, seeds, point["n"], resolved.data.source.noise_radius))
    certificates = result.certificate
    if series.metric == "empirical excess":
        twin = dataclasses.replace(plan, start_clip=math.inf, difference_clip=math.inf, noise_std=0.0,
                                   difference_noise_std=0.0)
        reference = Kernel(twin).run(FastStreams(twin, seeds, point["n"], resolved.data.source.noise_radius))
        certificates = result.empirical_certificates.mean(axis=1) - reference.empirical_certificates.mean(axis=1)
    settings = {"steps": plan.steps, "window": plan.window, "period": plan.period, "start_batch": plan.start_batch,
                "start_directions": plan.start_directions, "directions": plan.directions,
                "step_bound": plan.step_bound, "lr": plan.lr, "noise_std": plan.noise_std,
                "noise_multiplier": float(resolved.mechanism.noise_multiplier) if series.private else 0.0}
    return PointResult(series, x, point["n"], point["d"], [float(c) for c in certificates],
                       [float(v) for v in h_of(result.output)], predicted(resolved, point["n"], point["d"]), plan.steps,
                       eps, time.perf_counter() - started, settings)


@dataclass
class Match(Agreement):
    series: str
    x: int
    steps: int
    query_points: float  # max |privzo - kernel| over every query point's coordinates
    certificates: float  # max over windows
    output: float
    privzo_seconds: float
    kernel_seconds: float

    compared = ("query_points", "certificates", "output")


def match(series: Series, x: int, noise_seed: int = 7, threads: int = 1, start: Optional[float] = None) -> Match:
    """privzo's own loop against the kernel on one point's spec (``start``: another x_0), the same public seed
    and an injected noise generator: the largest differences of the trajectories (query points), window
    certificates and outputs."""
    import torch

    import specs
    from components import builders
    from reproduce.kernel import Kernel, KernelPlan, PrivzoStreams

    data = spec_dict(series, x)
    if start is not None:
        data["data"]["source"]["start"] = start
    resolved, data, built, points, privzo_seconds = privzo_trajectory(specs.spec_from_dict(data), noise_seed, threads)
    optimizer = built.loop.backend.optimizer
    plan = KernelPlan.from_spec(resolved, len(data.private))
    streams = PrivzoStreams(plan, np.asarray(data.private.features, dtype=np.float64), built.loop.sampler,
                            torch.Generator().manual_seed(noise_seed))
    started = time.perf_counter()
    result = Kernel(plan).run(streams, record=True)
    kernel_seconds = time.perf_counter() - started
    return Match(series.label, x, plan.steps,
                 float(np.abs(result.query_points[0] - np.stack(points)).max()),
                 float(np.abs(result.certificates[0] - np.asarray(optimizer.certificates)).max()),
                 float(np.abs(result.output[0] - built.model.x.detach().numpy()).max()),
                 privzo_seconds, kernel_seconds)


def privzo_trajectory(spec, noise_seed: int, threads: int = 1):
    """privzo's own loop on ``spec`` (resolved by its planner) with an injected noise generator: (resolved spec,
    its data, the built loop, the parameters after every update, seconds). An update that carries only
    public information (the KL paper's selection) moves the parameters to the output: it is not a step."""
    import torch

    from components import builders

    torch.set_num_threads(threads)
    data = builders.load_data(spec)
    resolved, _, _ = builders.plan(spec, data)
    built = builders.build_loop(resolved, data, noise_generator=torch.Generator().manual_seed(noise_seed))
    optimizer = built.loop.backend.optimizer
    points = [built.model.x.detach().numpy().copy()]
    apply = optimizer.apply

    def recorded(update):
        apply(update)
        if not dict(getattr(update, "info", ())):
            points.append(built.model.x.detach().numpy().copy())

    optimizer.apply = recorded
    started = time.perf_counter()
    built.loop.run(resolved.optimizer.steps)
    if isinstance(optimizer, Finalizing):
        optimizer.finalize()
    return resolved, data, built, points, time.perf_counter() - started


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The slope of log y against log x by least squares."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


def local_slopes(xs: Sequence[float], ys: Sequence[float]) -> List[float]:
    """log-log slopes between consecutive points."""
    return [math.log(ys[i + 1] / ys[i]) / math.log(xs[i + 1] / xs[i]) for i in range(len(xs) - 1)]

"""Q1-Q5: ERM problems for the private algorithms under the (gamma, kappa)-KL* condition (Menart et al.,
"Differentially Private Non-Convex Optimization under the KL Condition with Optimal Rates"), each with exact evaluation on its simulated rows S = {x_1..x_n}:

    F(w; S) = (1/n) sum_i f(w; x_i),      KL*:  F(w) - F* <= gamma^kappa ||grad F(w)||^kappa.

    mean_pl             kappa = 2    f = 1/2 ||w - x||^2,                 x = c + zeta, zeta ~ U(unit d-ball)
    quartic_balanced    kappa = 4/3  f = 1/4 (<a, w> - b)^4,              a = e_{i mod d}, b = w*_{i mod d} = +-1/2
    pl_sine             kappa = 2    f = ||w - x||^2 + 3 sum_j sin^2(w_j - c_j), rows recentred so x-bar = c
    abs_three_halves    kappa = 3    f = |<a, w> - b|^(3/2),              rows as quartic_balanced
    logistic_nonconvex  no KL        f = log(1 + exp(-y <a, w>)) + 0.1 sum_j w_j^2 / (1 + w_j^2)

with c = 1/sqrt(d) (||c|| = 1). The rows are simulated private data drawn from a public ``data_seed``; their
empirical objective is what the paper's guarantees are about, so evaluating it exactly on them is the metric
(excess empirical risk, or ||grad F(w; S)|| for logistic_nonconvex, which has no minimiser in closed form).

KL constants for any row counts n_j of the two one-hot designs (p_j = n_j / n over the coordinates that occur;
the others do not enter F), both attained, so no smaller gamma is valid:
  quartic: with u_j = p_j v_j^3 (the gradient), F = 1/4 sum_j p_j^(-1/3) |u_j|^(4/3); Hoelder with exponents
           (3, 3/2) on sum_j p_j^(-1/3) (u_j^2)^(2/3) gives F <= 1/4 (sum_j 1/p_j)^(1/3) ||u||^(4/3), hence
           gamma = (sum_j 1/p_j)^(1/4) / 2^(3/2)   (balanced: sqrt(d) / 2^(3/2), privzo's choice).
  abs:     with u_j = 3/2 p_j |v_j|^(1/2), F = 8/27 sum_j u_j^3 / p_j^2 <= 8/27 max_j p_j^-2 ||u||_3^3
           <= 8/27 p_min^-2 ||u||^3, hence gamma = 2/3 p_min^(-2/3)   (balanced: 2 d^(2/3) / 3, privzo's choice).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from specs.traits import KL_PROBLEMS  # noqa: E402 (the problems and their family are listed once, in the traits)

# problems whose row is [a (d entries), label] rather than a point of R^d
_LABELLED = ("quartic_balanced", "abs_three_halves", "logistic_nonconvex")
_ONE_HOT = ("quartic_balanced", "abs_three_halves")
_REGULARISER = 0.1  # logistic_nonconvex's weight on sum_j w_j^2 / (1 + w_j^2)
_FLIP = 0.1  # logistic_nonconvex's label noise
_SINE = 3.0  # pl_sine's weight on sum_j sin^2(w_j - c_j)


def _check_problem(problem: str) -> None:
    if problem not in KL_PROBLEMS:
        raise ValueError(f"unknown KL problem {problem!r}; expected one of {KL_PROBLEMS}")


def row_width(problem: str, dimension: int) -> int:
    """Columns of a row: d, or d + 1 where the row carries a label (b or y)."""
    _check_problem(problem)
    return dimension + 1 if problem in _LABELLED else dimension


def _centre(dimension: int) -> np.ndarray:
    return np.full(dimension, 1.0 / math.sqrt(dimension))


def _unit_ball(rng: np.random.Generator, rows: int, dimension: int) -> np.ndarray:
    g = rng.standard_normal((rows, dimension))
    radius = rng.random(rows) ** (1.0 / dimension)  # P(||zeta|| <= r) = r^d
    return g / np.linalg.norm(g, axis=1, keepdims=True) * radius[:, None]


def kl_rows(problem: str, dimension: int, rows: int, data_seed: int) -> np.ndarray:
    """``rows`` simulated rows of ``problem`` in R^dimension, [rows, row_width] float64, a function of
    ``data_seed`` only (quartic_balanced and abs_three_halves share their rows)."""
    _check_problem(problem)
    if dimension < 1 or rows < 1:
        raise ValueError(f"dimension and rows must be positive, got {dimension} and {rows}")
    rng = np.random.default_rng(data_seed)
    d = dimension
    if problem == "mean_pl":
        return _centre(d) + _unit_ball(rng, rows, d)
    if problem == "pl_sine":
        zeta = _unit_ball(rng, rows, d)
        # recentred over all n rows, so the minimiser is c whatever the draw (up to rounding)
        return _centre(d) + (zeta - zeta.mean(axis=0))
    if problem in _ONE_HOT:
        target = 0.5 * (2 * rng.integers(0, 2, d) - 1)
        j = np.arange(rows) % d
        out = np.zeros((rows, d + 1))
        out[np.arange(rows), j] = 1.0
        out[:, d] = target[j]
        return out
    teacher = rng.standard_normal(d)
    teacher /= np.linalg.norm(teacher)
    g = rng.standard_normal((rows, d))
    a = g / np.linalg.norm(g, axis=1, keepdims=True)
    y = np.where(a @ teacher >= 0, 1.0, -1.0)
    y = np.where(rng.random(rows) < _FLIP, -y, y)
    return np.concatenate([a, y[:, None]], axis=1)


@dataclass(frozen=True, eq=False)
class _Data:
    """The rows and the summaries of S that the closed forms read."""

    problem: str
    dimension: int
    rows: np.ndarray
    mean: Optional[np.ndarray] = None  # x-bar (mean_pl, pl_sine)
    weights: Optional[np.ndarray] = None  # p_j = n_j / n (one-hot designs)
    target: Optional[np.ndarray] = None  # w* (one-hot designs; 0 where a coordinate never occurs)


def _data(problem: str, rows: np.ndarray, dimension: Optional[int] = None) -> _Data:
    _check_problem(problem)
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or len(rows) == 0:
        raise ValueError(f"rows must be a non-empty [n, width] array, got shape {rows.shape}")
    d = rows.shape[1] - (1 if problem in _LABELLED else 0)
    if dimension is not None and d != dimension:
        raise ValueError(f"{problem} rows of width {rows.shape[1]} are not of dimension {dimension}")
    if d < 1:
        raise ValueError(f"{problem} rows of width {rows.shape[1]} have no coordinates")
    if problem in ("mean_pl", "pl_sine"):
        return _Data(problem, d, rows, mean=rows.mean(axis=0))
    if problem in _ONE_HOT:
        a, b = rows[:, :d], rows[:, d]
        if not (np.all((a == 0) | (a == 1)) and np.all(a.sum(axis=1) == 1)):
            raise ValueError(f"{problem} rows must start with a one-hot vector")
        j = a.argmax(axis=1)
        target = np.zeros(d)
        target[j] = b
        if not np.array_equal(target[j], b):
            # the closed forms assume F* = 0 (every row of coordinate j has the same b)
            raise ValueError(f"{problem} rows are not realisable: two rows of one coordinate differ in b")
        return _Data(problem, d, rows, weights=np.bincount(j, minlength=d) / len(rows), target=target)
    return _Data(problem, d, rows)


def _check_point(data: _Data, w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.shape[-1:] != (data.dimension,):
        raise ValueError(f"points of shape {w.shape} are not of dimension {data.dimension}")
    return w


def _sine_excess(u: np.ndarray) -> np.ndarray:
    return (u**2 + _SINE * np.sin(u) ** 2).sum(axis=-1)


def _excess(data: _Data, w: np.ndarray) -> np.ndarray:
    w = _check_point(data, w)
    if data.problem == "mean_pl":
        return 0.5 * ((w - data.mean) ** 2).sum(axis=-1)
    if data.problem == "pl_sine":
        return _sine_excess(w - _centre(data.dimension))
    if data.problem == "quartic_balanced":
        return (data.weights * 0.25 * (w - data.target) ** 4).sum(axis=-1)
    if data.problem == "abs_three_halves":
        return (data.weights * np.abs(w - data.target) ** 1.5).sum(axis=-1)
    return np.full(w.shape[:-1], np.nan)


def _expit(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function without overflow in exp


def _regulariser_gradient(w: np.ndarray) -> np.ndarray:
    return _REGULARISER * 2 * w / (1 + w**2) ** 2


def _per_example(data: _Data, w: np.ndarray) -> np.ndarray:
    w = _check_point(data, w)
    d, rows = data.dimension, data.rows
    if data.problem == "mean_pl":
        return w - rows
    if data.problem == "pl_sine":
        return 2 * (w - rows) + _SINE * np.sin(2 * (w - _centre(d)))
    a, label = rows[:, :d], rows[:, d]
    if data.problem == "logistic_nonconvex":
        return (-label * _expit(-label * (a @ w)))[:, None] * a + _regulariser_gradient(w)
    r = a @ w - label
    if data.problem == "quartic_balanced":
        return (r**3)[:, None] * a
    return (1.5 * np.sign(r) * np.sqrt(np.abs(r)))[:, None] * a


def _gradient(data: _Data, w: np.ndarray) -> np.ndarray:
    w = _check_point(data, w)
    if data.problem == "mean_pl":
        return w - data.mean
    if data.problem == "pl_sine":
        return 2 * (w - data.mean) + _SINE * np.sin(2 * (w - _centre(data.dimension)))
    if data.problem == "quartic_balanced":
        return data.weights * (w - data.target) ** 3
    if data.problem == "abs_three_halves":
        v = w - data.target
        return data.weights * 1.5 * np.sign(v) * np.sqrt(np.abs(v))
    a, y = data.rows[:, : data.dimension], data.rows[:, data.dimension]
    margins = w @ a.T  # [..., n]
    coefficient = -y * _expit(-y * margins)
    return coefficient @ a / len(y) + _regulariser_gradient(w)


def _minimiser(data: _Data) -> Optional[np.ndarray]:
    if data.problem == "mean_pl":
        return data.mean.copy()
    if data.problem == "pl_sine":
        return _centre(data.dimension)
    if data.problem in _ONE_HOT:
        return data.target.copy()
    return None


def empirical_minimiser(problem: str, rows: np.ndarray, dimension: int) -> Optional[np.ndarray]:
    """A minimiser of F(.; S) in closed form: x-bar (mean_pl), w* (quartic_balanced, abs_three_halves; any
    value is one on a coordinate no row names, 0 is returned there), c (pl_sine); None for
    logistic_nonconvex, which has none in closed form."""
    return _minimiser(_data(problem, rows, dimension))


def excess_risk_np(problem: str, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """F(w; S) - min F(.; S) at each point of ``w`` ([..., d] -> [...]), in closed form; nan for
    logistic_nonconvex. pl_sine measures from c, which x-bar equals up to rounding (~1e-16)."""
    return _excess(_data(problem, rows), w)


def per_example_gradients_np(problem: str, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """grad f(w; x_i) for every row, [n, d], at one point ``w`` [d]."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 1:
        raise ValueError(f"one point [d] is expected, got shape {w.shape}")
    return _per_example(_data(problem, rows), w)


def gradient_np(problem: str, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """grad F(w; S), [d] (or [..., d] for points [..., d])."""
    return _gradient(_data(problem, rows), w)


@dataclass(frozen=True)
class KlConstants:
    """What the paper-003 presets take: (gamma, kappa) of KL* (None where it does not hold), the Lipschitz
    and smoothness constants L0, L1 of every f(.; x_i) on the ball B_radius(w0) (L1 None: not smooth), the
    weak-convexity constant (any positive value for a convex problem) and F0 = F(w0; S) - F*."""

    gamma: Optional[float]
    kappa: Optional[float]
    lipschitz: float
    smoothness: Optional[float]
    weak_convexity: float
    initial_gap: float


def kl_constants(problem: str, dimension: int, start: float, radius: float, rows: np.ndarray) -> KlConstants:
    """The constants of ``problem`` on its rows, for w0 = ``start`` in every coordinate and the ball
    B_radius(w0). Where a Lipschitz constant is the exact supremum over the ball it says so; for
    logistic_nonconvex the gap is F(w0; S) - 0 (both terms of f are nonnegative, so 0 <= inf F) and its
    constants hold on all of R^d."""
    if radius < 0:
        raise ValueError(f"radius must be nonnegative, got {radius}")
    data = _data(problem, rows, dimension)
    d = dimension
    w0 = np.full(d, float(start))
    gap = float(_excess(data, w0))
    if problem == "mean_pl":
        # sup over the ball of ||w - x_i||, attained where w0 - x_i points
        lipschitz = radius + float(np.linalg.norm(w0 - data.rows, axis=1).max())
        return KlConstants(1 / math.sqrt(2), 2.0, lipschitz, 1.0, 1.0, gap)
    if problem == "pl_sine":
        # ||2 (w - x) + 3 sin(2 (w - c))|| with |sin 2u| <= min(2|u|, 1) per coordinate
        far = radius + float(np.linalg.norm(w0 - data.rows, axis=1).max())
        sine = min(2 * (radius + float(np.linalg.norm(w0 - _centre(d)))), math.sqrt(d))
        # PL with mu = 1/32 (Karimi, Nutini, Schmidt 2016): g <= 16 g'^2; f'' = 2 + 6 cos 2u in [-4, 8]
        return KlConstants(4.0, 2.0, 2 * far + _SINE * sine, 8.0, 4.0, gap)
    if problem == "logistic_nonconvex":
        # |w/(1 + w^2)^2| <= 3 sqrt(3)/16 and (2 - 6w^2)/(1 + w^2)^3 in [-1/2, 2]; the logistic part has
        # gradient <= ||a|| = 1 and curvature <= 1/4
        lipschitz = 1 + _REGULARISER * (3 * math.sqrt(3) / 8) * math.sqrt(d)
        value = float(np.logaddexp(0.0, -data.rows[:, d] * (data.rows[:, :d] @ w0)).mean()
                      + _REGULARISER * (w0**2 / (1 + w0**2)).sum())
        return KlConstants(None, None, lipschitz, 0.25 + 2 * _REGULARISER, 0.5 * _REGULARISER, value)
    present = data.weights > 0
    # sup over the ball of the residual |w_j - w*_j| of a coordinate that occurs
    residual = radius + float(np.abs(w0 - data.target)[present].max())
    p = data.weights[present]
    if problem == "quartic_balanced":
        gamma = float((1 / p).sum()) ** 0.25 / 2**1.5
        return KlConstants(gamma, 4 / 3, residual**3, 3 * residual**2, 1.0, gap)
    gamma = 2 / 3 * float(p.min()) ** (-2 / 3)
    return KlConstants(gamma, 3.0, 1.5 * math.sqrt(residual), None, 1.0, gap)


class KlObjective(nn.Module):
    """The parameter vector w of a KL problem (float64) and its per-example loss: ``forward(rows)`` is
    f(w; x_i) for each row, shape [b]. Given the dataset S (``rows``), the excess empirical risk and
    ||grad F(w; S)|| are exact; the rows are held as numpy, outside the module's state, so checkpoints and
    torch.func's parameter swaps never carry the private data."""

    def __init__(self, problem: str, start: torch.Tensor, rows: Optional[np.ndarray] = None):
        super().__init__()
        _check_problem(problem)
        self.objective = problem
        self.x = nn.Parameter(start.detach().to(torch.float64).clone())
        self._data = None if rows is None else _data(problem, rows, self.x.numel())

    @property
    def dimension(self) -> int:
        return self.x.numel()

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        x = self.x
        d = x.numel()
        if rows.shape[-1] != row_width(self.objective, d):
            raise ValueError(f"{self.objective} rows of width {rows.shape[-1]} are not of dimension {d}")
        rows = rows.to(x.dtype)
        if self.objective == "mean_pl":
            return 0.5 * ((x - rows) ** 2).sum(dim=-1)
        if self.objective == "pl_sine":
            c = torch.full_like(x, 1.0 / math.sqrt(d))
            return ((x - rows) ** 2).sum(dim=-1) + _SINE * (torch.sin(x - c) ** 2).sum()
        a, label = rows[:, :d], rows[:, d]
        if self.objective == "logistic_nonconvex":
            margin = -label * (a @ x)
            # log(1 + e^m) as logaddexp(0, m): no overflow, and its gradient is the exact sigmoid
            return torch.logaddexp(torch.zeros_like(margin), margin) + _REGULARISER * (x**2 / (1 + x**2)).sum()
        r = a @ x - label
        if self.objective == "quartic_balanced":
            return 0.25 * r**4
        return r.abs() ** 1.5

    def _rows(self) -> _Data:
        if self._data is None:
            raise ValueError(f"{self.objective}: exact evaluation needs the dataset (rows=...)")
        return self._data

    def _point(self) -> np.ndarray:
        return self.x.detach().cpu().numpy().astype(np.float64)

    def excess_risk(self) -> float:
        """F(w; S) - min F(.; S), exact (nan for logistic_nonconvex)."""
        return float(_excess(self._rows(), self._point()))

    def gradient_norm(self) -> float:
        """||grad F(w; S)||, exact."""
        return float(np.linalg.norm(_gradient(self._rows(), self._point())))

    def population_value(self) -> float:
        """The metric of the paper's guarantee on S: the excess empirical risk, or ||grad F(w; S)|| for
        logistic_nonconvex (Theorem 5)."""
        if self.objective == "logistic_nonconvex":
            return self.gradient_norm()
        return self.excess_risk()

    def exact_metrics(self) -> dict:
        """What privzo logs for it (models.evaluate): the excess empirical risk and the gradient norm, exact."""
        out = {"grad_norm": self.gradient_norm()}
        if self.objective != "logistic_nonconvex":
            out["excess_risk"] = self.excess_risk()
        return out

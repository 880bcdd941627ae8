"""From membership guesses to a lower bound on epsilon, at a stated confidence.

Two tests, both sound whatever produced the guesses:

* ``one_run_epsilon``: one training run with m canaries, each included independently with probability
  1/2 (Steinke, Nasr and Jagielski 2023, "Privacy auditing with one (1) training run", Corollary 5.4).
  If the algorithm is (eps, delta)-DP in each canary and the auditor makes r guesses (abstaining on the
  other m - r canaries), the number V of correct guesses satisfies, for every v,

      P[V >= v] <= P[W >= v] + 2 m delta * max_{1 <= i <= v} P[v - i <= W < v] / i,   W ~ Binomial(r, q),

  with q = e^eps / (1 + e^eps), the accuracy of eps-DP randomized response. That right-hand side is the
  p-value of the observed v under the hypothesis "(eps, delta)-DP"; the lower bound is the smallest eps
  the observation fails to reject at level beta = 1 - confidence (so every eps below it is rejected).
* ``many_runs_epsilon``: the classic test of many runs with and without one canary: Clopper-Pearson upper
  bounds on the false positive and false negative rates (each at beta / 2, a union bound) give
  eps >= log((1 - delta - FNR_up) / FPR_up), and the same with the roles swapped.
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple

import numpy as np
from scipy import special, stats


def _check_counts(m: int, r: int, v: int) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"one-run audit: need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")


def _check_level(confidence: float) -> float:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence: {confidence} must be strictly between 0 and 1 (e.g. 0.95)")
    return 1.0 - confidence


def _at_least(k, n: int, q) -> np.ndarray:
    """P[Binomial(n, q) >= k], elementwise (1 for k <= 0)."""
    k = np.asarray(k)
    return np.where(k <= 0, 1.0, special.bdtrc(np.maximum(k - 1, 0), n, q))


def one_run_p_values(m: int, r: int, v: int, epsilons: Sequence[float], delta: float) -> np.ndarray:
    """The p-value of ``v`` correct guesses out of ``r`` (``m`` canaries) under (eps, delta)-DP, for each
    eps in ``epsilons`` (vectorised over eps)."""
    _check_counts(m, r, v)
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta: {delta} must be in [0, 1]")
    eps = np.atleast_1d(np.asarray(epsilons, dtype=np.float64))
    if np.any(eps < 0) or not np.all(np.isfinite(eps)):
        raise ValueError("epsilon: must be finite and >= 0")
    q = special.expit(eps)[:, None]  # e^eps / (1 + e^eps), stable for large eps
    tail = _at_least(v, r, q)[:, 0]  # P[W >= v]
    if delta == 0.0 or v == 0:
        return np.minimum(tail, 1.0)
    i = np.arange(1, v + 1)[None, :]
    # P[v - i <= W < v] = P[W >= v - i] - P[W >= v]
    window = _at_least(v - i, r, q) - tail[:, None]
    alpha = np.max(np.maximum(window, 0.0) / i, axis=1)
    return np.minimum(tail + 2.0 * m * delta * alpha, 1.0)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    return float(one_run_p_values(m, r, v, [epsilon], delta)[0])


# eps is scanned on this grid before the last cell is bisected: the p-value is a smooth function of eps,
# and the bound is the first eps it fails to reject, so the scan never steps over a non-rejected region
# wider than a grid cell.
_GRID_STEP = 0.005


def one_run_epsilon(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """The one-run lower bound: the smallest eps >= 0 whose (eps, delta)-DP hypothesis the observed ``v``
    correct guesses out of ``r`` (``m`` canaries) does not reject at level 1 - ``confidence``. With
    probability at least ``confidence`` it is at most the algorithm's true eps at this delta. 0 when even
    eps = 0 is not rejected."""
    beta = _check_level(confidence)
    _check_counts(m, r, v)
    if one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    hi = 1.0
    while one_run_p_value(m, r, v, hi, delta) < beta:  # rejected up to ~ log(r) at most: q^r > beta
        hi *= 2.0
        if hi > 1e4:
            raise ValueError(f"one-run audit: no epsilon up to 1e4 survives (m={m}, r={r}, v={v}, delta={delta})")
    grid = np.arange(0.0, hi + _GRID_STEP, _GRID_STEP)
    p = one_run_p_values(m, r, v, grid, delta)
    first = int(np.argmax(p >= beta))  # the first grid point not rejected (exists: p(hi) >= beta)
    return _last_rejected(m, r, v, delta, beta, float(grid[first - 1]), float(grid[first]), 40)


def _last_rejected(m: int, r: int, v: int, delta: float, beta: float, lo: float, up: float, rounds: int) -> float:
    """Bisection between a rejected ``lo`` and a surviving ``up``; keeps p(lo) < beta."""
    for _ in range(rounds):
        mid = 0.5 * (lo + up)
        if one_run_p_value(m, r, v, mid, delta) < beta:
            lo = mid
        else:
            up = mid
    return lo


def one_run_epsilon_estimate(m: int, r: int, v: int, delta: float, confidence: float) -> float:
    """``one_run_epsilon`` by bisection alone (a crossing of the p-value, not necessarily the first):
    cheap, for comparing guess counts; never reported as a bound."""
    beta = _check_level(confidence)
    if one_run_p_value(m, r, v, 0.0, delta) >= beta:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < beta and hi < 1e4:
        lo, hi = hi, hi * 2.0
    return _last_rejected(m, r, v, delta, beta, lo, hi, 30)


def one_run_ceiling(m: int, delta: float, confidence: float) -> float:
    """The largest bound ``m`` canaries can give at all: every one of r guesses right, r chosen best. A
    one-run audit cannot refute a claim above it, whatever the mechanism does."""
    counts = sorted({int(x) for x in np.unique(np.round(np.geomspace(1, m, 60)))} | {m})
    best = max(counts, key=lambda r: one_run_epsilon_estimate(m, r, r, delta, confidence))
    return one_run_epsilon(m, best, best, delta, confidence)


def clopper_pearson(successes: int, trials: int, confidence: float) -> Tuple[float, float]:
    """Exact one-sided Clopper-Pearson bounds on a binomial proportion: (lower, upper), each holding with
    probability at least ``confidence``."""
    beta = _check_level(confidence)
    if not (0 <= successes <= trials) or trials < 1:
        raise ValueError(f"clopper_pearson: need 0 <= successes ({successes}) <= trials ({trials}), trials >= 1")
    lower = 0.0 if successes == 0 else float(stats.beta.ppf(beta, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(stats.beta.ppf(1.0 - beta, successes + 1, trials - successes))
    return lower, upper


def many_runs_epsilon(false_positives: int, negatives: int, false_negatives: int, positives: int, delta: float,
                      confidence: float) -> float:
    """The classic many-runs lower bound: ``negatives`` runs without the canary (``false_positives`` of them
    guessed "in") and ``positives`` runs with it (``false_negatives`` guessed "out"). With probability at
    least ``confidence`` (both Clopper-Pearson bounds at 1 - beta/2) no (eps, delta)-DP algorithm with eps
    below the result produces such counts."""
    beta = _check_level(confidence)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta: {delta} must be in [0, 1)")
    _, fpr = clopper_pearson(false_positives, negatives, 1.0 - beta / 2.0)
    _, fnr = clopper_pearson(false_negatives, positives, 1.0 - beta / 2.0)
    best = 0.0
    for num, den in ((1.0 - delta - fnr, fpr), (1.0 - delta - fpr, fnr)):
        if num > 0.0 and den > 0.0:
            best = max(best, math.log(num / den))
        elif num > 0.0:  # an upper bound of 0 needs infinitely many runs; never reached by Clopper-Pearson
            best = math.inf
    return best


def many_runs_ceiling(runs: int, delta: float, confidence: float) -> float:
    """The largest many-runs bound ``runs`` runs can give: every guess right, half of the runs with the canary."""
    return many_runs_epsilon(0, runs // 2, 0, runs - runs // 2, delta, confidence)

"""From canary scores to membership guesses, and how many guesses to make.

The one-run bound counts only the guesses made, so abstaining on canaries the scores say little about
raises it. How many to guess is decided without the inclusion of the canaries the bound is computed on,
so the choice costs no confidence (one made by looking at those outcomes would need a correction for
every count tried). Two ways:

* ``mixture``: from the scores alone, through a two-Gaussian model of them. For white-box scores, sums
  over thousands of releases and close to Gaussian.
* ``probit``: from the scores alone, when they are already standardized posterior estimates (the theory
  families' ``VectorProbe.standardized_scores``): P(in) = Phi(score).
* ``split``: a public half of the canaries, whose inclusion is then looked at, picks the share of guesses
  that bounds best on it; the bound is computed on the other half only. Conditioned on the first half's
  inclusion those canaries are fixed rows of the dataset, so the theorem applies to the second half as it
  stands. For black-box scores (final-model losses), whose tails no simple model fits; it costs half the
  canaries.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from components.audit.bounds import one_run_epsilon, one_run_epsilon_estimate


def guesses(scores: np.ndarray, r: int) -> np.ndarray:
    """+1 (in) for the r/2 highest scores, -1 (out) for the r/2 lowest (the odd one goes to "in"), 0 for
    the rest (abstain). Ties are broken by position, which the scores do not depend on."""
    m = len(scores)
    if not 0 <= r <= m:
        raise ValueError(f"guesses: {r} must be between 0 and the {m} canaries")
    order = np.argsort(scores, kind="stable")
    out = np.zeros(m, dtype=np.int64)
    n_in = (r + 1) // 2
    n_out = r - n_in
    if n_in:
        out[order[m - n_in:]] = 1
    if n_out:
        out[order[:n_out]] = -1
    return out


def count_correct(guess: np.ndarray, included: np.ndarray) -> int:
    truth = np.where(np.asarray(included, dtype=bool), 1, -1)
    return int(np.sum((guess != 0) & (guess == truth)))


def posterior_in(scores: np.ndarray, iterations: int = 200) -> np.ndarray:
    """P(in | score) under a two-Gaussian mixture fitted to the scores by EM: equal weights (each canary is
    in with probability exactly 1/2), a shared variance, the "in" component the one with the higher mean
    at the start. A model for choosing how many guesses to make; the bound never relies on it."""
    s = np.asarray(scores, dtype=np.float64)
    if len(s) < 2 or not np.all(np.isfinite(s)) or np.ptp(s) == 0:
        return np.full(len(s), 0.5)
    s = (s - s.mean()) / s.std()
    hi, lo = 0.5, -0.5
    var = 1.0
    w = np.full(len(s), 0.5)
    for _ in range(iterations):
        z = np.clip((s - 0.5 * (hi + lo)) * (hi - lo) / var, -700, 700)
        w = 1.0 / (1.0 + np.exp(-z))
        hi = float(np.sum(w * s) / max(np.sum(w), 1e-12))
        lo = float(np.sum((1 - w) * s) / max(np.sum(1 - w), 1e-12))
        var = max(float(np.mean(w * (s - hi) ** 2 + (1 - w) * (s - lo) ** 2)), 1e-6)
    return w


def choose_guess_count(scores: np.ndarray, delta: float, confidence: float,
                       posterior: Optional[np.ndarray] = None) -> int:
    """The number of guesses whose bound the model expects to be largest: for each candidate r, the
    expected number of correct guesses among the r/2 highest and r/2 lowest scores under ``posterior``
    (P(in) per canary; default the fitted mixture's ``posterior_in``), and the one-run bound that count
    would give. A function of the scores only."""
    m = len(scores)
    if m < 2:
        return m
    w = (posterior_in(scores) if posterior is None else np.asarray(posterior))[np.argsort(scores, kind="stable")]
    high = np.cumsum(w[::-1])  # expected "in" among the k highest
    low = np.cumsum(1.0 - w)  # expected "out" among the k lowest
    best, best_r = -1.0, m
    for r in sorted({int(x) for x in np.unique(np.round(np.geomspace(2, m, 40)))} | {m}):
        n_in, n_out = (r + 1) // 2, r // 2
        expected = (high[n_in - 1] if n_in else 0.0) + (low[n_out - 1] if n_out else 0.0)
        v = int(math.floor(min(expected, r)))
        eps = one_run_epsilon_estimate(m, r, v, delta, confidence)
        if eps > best + 1e-9:
            best, best_r = eps, r
    return best_r


def pick_guess_count(scores: np.ndarray, delta: float, confidence: float, fixed: Optional[int],
                     posterior: Optional[np.ndarray] = None) -> int:
    if fixed is None:
        return choose_guess_count(scores, delta, confidence, posterior)
    if not 1 <= fixed <= len(scores):
        raise ValueError(f"--guesses: {fixed} must be between 1 and the {len(scores)} canaries")
    return fixed


def split_guess(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float,
                seed: int) -> Tuple[int, int, int, float]:
    """``split`` (module docstring): (canaries bounded on, guesses, correct, bound). The halves come from
    ``seed`` (public, drawn before the run)."""
    m = len(scores)
    if m < 4:
        raise ValueError(f"--canaries: {m} are too few to split; use at least 4")
    order = np.random.default_rng(seed).permutation(m)
    choose, bound_on = order[: m // 2], order[m // 2:]
    s1, z1 = scores[choose], np.asarray(included, dtype=bool)[choose]
    best, share = -1.0, 1.0
    for f in np.unique(np.geomspace(2.0 / len(s1), 1.0, 30)):
        r = max(1, int(round(f * len(s1))))
        eps = one_run_epsilon_estimate(len(s1), r, count_correct(guesses(s1, r), z1), delta, confidence)
        if eps > best + 1e-9:
            best, share = eps, float(f)
    s2, z2 = scores[bound_on], np.asarray(included, dtype=bool)[bound_on]
    r = max(1, int(round(share * len(s2))))
    v = count_correct(guesses(s2, r), z2)
    return len(s2), r, v, one_run_epsilon(len(s2), r, v, delta, confidence)

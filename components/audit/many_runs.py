"""The classic audit: many training runs with one canary each, half of them with it, and a bound from
Clopper-Pearson on the guesses' errors (Jagielski, Ullman and Oprea 2020). It costs a training run per
guess, and is the default only where one run has no power (``default_runs``). Each run is the spec's own,
set up and trained as one audited run is (``components.audit.run``).
"""
from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np
import torch

from components.audit.bounds import many_runs_epsilon
from components.audit.run import (AuditResult, ThreatModelResult, check_arguments, person_rows_of, audit_result, audit_setup,
                                  train_with_canaries, separation)
from components.data.split import SplitData
from components.randomness import private_generator, public_seed

# estimators whose one run cannot tell canaries apart (releases of losses at the clip: see default_runs), and
# the training runs their audit makes by default
SELECTION_ESTIMATORS = ("pazo_s",)
# the KL paper's full-batch gradients: a canary far past the clip adds the same clipped vector (its own
# direction) to every release, so one run's releases hold at most d directions' worth of canaries and
# cannot tell many apart; many runs of one canary each can
REPEATING_ESTIMATORS = ("full_gradient",)
MANY_RUNS_DEFAULT = 100


def default_runs(spec) -> int:
    """Training runs per audit by default: one (the one-run audit) except where a single run cannot tell
    canaries apart. PAZO-S releases sums of clipped losses at its candidate points; every canary at the
    clip adds the same C to each of them, so one run shows how many canaries were sampled but not which,
    and its one-run bound is 0 whatever the noise. The KL paper's full-batch gradients put each canary's
    same clipped vector in every release (REPEATING_ESTIMATORS). There, many runs with one canary each
    (Clopper-Pearson on the errors) have power: 100 runs bound at most about 2.6 at delta ~1e-3 and
    confidence 0.95."""
    many = SELECTION_ESTIMATORS + REPEATING_ESTIMATORS
    return MANY_RUNS_DEFAULT if spec.estimator.kind in many else 1


def runs_problem(runs: int, canaries: Optional[int], guesses: Optional[int]) -> Optional[str]:
    """Why this number of runs (with these other arguments) cannot be audited, in one line, or None."""
    if runs != 1 and runs < 10:
        return f"--runs: {runs} must be 1 (one-run audit) or at least 10 (many runs of one canary each)"
    if runs > 1 and canaries is not None:
        return f"--canaries: a many-runs audit (--runs {runs}) puts one canary in each run; drop --canaries"
    if runs > 1 and guesses is not None:
        return f"--guesses: a many-runs audit (--runs {runs}) guesses once per run; drop --guesses"
    return None


def threshold_guess(threat: str, scores: np.ndarray, included: np.ndarray, threshold: float, delta: float,
                    confidence: float) -> ThreatModelResult:
    """Guess "in" for every run whose canary score is above ``threshold`` (fixed before looking at the
    runs' inclusion) and bound epsilon by Clopper-Pearson on the errors."""
    inc = np.asarray(included, dtype=bool)
    guess_in = np.asarray(scores) > threshold
    fp, fn = int(np.sum(guess_in & ~inc)), int(np.sum(~guess_in & inc))
    eps = many_runs_epsilon(fp, int(np.sum(~inc)), fn, int(np.sum(inc)), delta, confidence)
    return ThreatModelResult(threat, eps, len(inc), len(inc) - fp - fn, separation(scores, inc), len(inc))


def split_threshold(threat: str, scores: np.ndarray, included: np.ndarray, delta: float, confidence: float,
                    seed: int) -> ThreatModelResult:
    """Many runs, with a threshold no model fixes in advance (black-box loss drops): a public half of the
    runs, whose inclusion is then looked at, picks the threshold that bounds best on it; the bound is
    computed on the other half only (the runs are independent, so the choice costs no confidence there)."""
    k = len(scores)
    order = np.random.default_rng(seed).permutation(k)
    choose, bound_on = order[: k // 2], order[k // 2:]
    s1, z1 = np.asarray(scores)[choose], np.asarray(included, dtype=bool)[choose]
    if z1.all() or not z1.any():
        threshold = float(np.median(s1))
    else:
        cuts = np.unique(s1)
        cuts = np.concatenate([[cuts[0] - 1.0], 0.5 * (cuts[1:] + cuts[:-1])]) if len(cuts) > 1 else cuts
        threshold = max(cuts, key=lambda c: _many_runs_estimate(s1, z1, c))
    s2, z2 = np.asarray(scores)[bound_on], np.asarray(included, dtype=bool)[bound_on]
    if z2.all() or not z2.any():  # too few runs to have both kinds in the half bounded on
        return ThreatModelResult(threat, 0.0, 0, 0, separation(scores, included), len(s2))
    return threshold_guess(threat, s2, z2, threshold, delta, confidence)


def _many_runs_estimate(scores: np.ndarray, included: np.ndarray, threshold: float) -> float:
    # the plug-in log-odds of the error rates (with a half count added): for choosing a threshold only
    guess_in = scores > threshold
    fpr = (np.sum(guess_in & ~included) + 0.5) / (np.sum(~included) + 1.0)
    fnr = (np.sum(~guess_in & included) + 0.5) / (np.sum(included) + 1.0)
    return max(math.log((1 - fnr) / fpr), math.log((1 - fpr) / fnr))


def audit_many(spec, data: SplitData, *, runs: int, confidence: float = 0.95, background: str = "none",
               noise_scale: float = 1.0, seed: Optional[int] = None,
               inclusion_generator: Optional[torch.Generator] = None,
               noise_generator: Optional[torch.Generator] = None,
               sampling_generator: Optional[torch.Generator] = None,
               on_run=None, person_rows: Optional[int] = None) -> AuditResult:
    """Audit ``spec`` by ``runs`` independent training runs, each on one canary slot (the same slot every
    run) that half of the runs include, in a random order. The classic test (Jagielski, Ullman and Oprea
    2020; Nasr et al. 2021): the bound is Clopper-Pearson on the false positive and false negative rates.

    White-box: each run's matched score of the canary against the releases, centred on the expectation of
    a release when the canary is in with probability 1/2, so 0 is the midpoint between the expected scores
    in and out, fixed before any run: "in" when the score is above 0. Black-box: each run's loss drop of the
    canary, with a threshold picked on a public half of the runs (``split_threshold``).
    ``on_run(done, runs)`` after each run. Arguments otherwise as ``audit``."""
    check_arguments(spec, None, confidence, background, noise_scale)
    if runs < 10:
        raise ValueError(f"--runs: {runs} must be at least 10 for a many-runs audit (1 is the one-run audit)")
    start = time.perf_counter()
    setup = audit_setup(spec, data, 1, background, seed)
    setup.person_rows = person_rows_of(spec, person_rows)
    gen = inclusion_generator if inclusion_generator is not None else private_generator()
    # exactly half of the runs hold the canary: the two error rates are then measured on fixed run counts
    order = torch.randperm(runs, generator=gen).numpy()
    included = order < (runs + 1) // 2
    white = np.zeros(runs)
    black = np.zeros(runs)
    share = 0.0
    trained = None
    for k in range(runs):
        trained = train_with_canaries(setup, data, included[k:k + 1], noise_scale, noise_generator, sampling_generator)
        white[k], black[k] = trained.white_scores[0], trained.black_scores[0]
        share += trained.share_at_clip / runs
        if on_run is not None:
            on_run(k + 1, runs)
    delta = float(setup.resolved.privacy.delta)
    white_result = threshold_guess("white_box", white, included, 0.0, delta, confidence)
    black_result = split_threshold("black_box", black, included, delta, confidence,
                                   public_seed(setup.canary_seed, 1))
    return audit_result(setup, trained, canaries=1, confidence=confidence, background=background,
                   noise_scale=noise_scale, white=white_result, black=black_result,
                   seconds=time.perf_counter() - start, included=included, white_scores=white, black_scores=black,
                   method="many-runs", runs=runs, share_at_clip=share)
